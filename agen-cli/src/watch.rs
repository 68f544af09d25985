//! `-w`/`--watch` of the list commands (`ps`, `tasks`, `nests`): the list is printed again
//! every time it changes, redrawn in place on a terminal and as a new table (after a blank
//! line) when stdout is a pipe. Changes come from a Hub watch stream (`WatchNests`,
//! `WatchDeployments`) or, for lists without one (tasks, instances), from polling once a
//! second. Ctrl-C ends it with exit 0, as a closed pipe does ([`crate::out`]).
//!
//! With `-o json` every change is one JSON document on one line (JSON Lines, for `jq` and
//! line-reading scripts); with `-o yaml` one YAML document after a `---` line. Neither clears
//! the screen.

use std::io::IsTerminal;
use std::time::Duration;

use futures::{Stream, StreamExt};

use crate::client::Output;

/// How often lists without a Hub watch stream are fetched again.
pub const POLL: Duration = Duration::from_secs(1);

/// Prints each item of `lists` that differs from the one before, until the stream ends
/// (the Hub stopped: exit 6 as for an unreachable Hub), fails, or Ctrl-C (exit 0).
pub async fn follow<T, S>(lists: S, output: Output, print: impl Fn(&T)) -> anyhow::Result<i32>
where
    T: PartialEq,
    S: Stream<Item = anyhow::Result<T>>,
{
    let tty = std::io::stdout().is_terminal();
    let mut lists = std::pin::pin!(lists);
    let mut last: Option<T> = None;
    loop {
        let next = tokio::select! {
            n = lists.next() => n,
            _ = tokio::signal::ctrl_c() => return Ok(0),
        };
        let list = match next {
            Some(l) => l?,
            None => {
                return Err(crate::exit::coded(
                    crate::exit::code::UNAVAILABLE,
                    "the Hub ended the watch (it is stopping)",
                ))
            }
        };
        if last.as_ref() == Some(&list) {
            continue;
        }
        match output {
            Output::Json => {
                crate::view::one_line(|| print(&list));
            }
            Output::Yaml => {
                crate::outln!("---");
                print(&list);
            }
            Output::Table => {
                if tty {
                    // Home and clear, then the new table.
                    crate::out::raw("\x1b[H\x1b[2J");
                } else if last.is_some() {
                    crate::outln!();
                }
                print(&list);
            }
        }
        last = Some(list);
    }
}

/// A stream that fetches with `fetch(state)` now and then every [`POLL`].
pub fn poll<St, T, F, Fut>(state: St, fetch: F) -> impl Stream<Item = anyhow::Result<T>>
where
    F: Fn(St) -> Fut + Clone,
    Fut: std::future::Future<Output = (anyhow::Result<T>, St)>,
{
    futures::stream::unfold((state, true), move |(state, first)| {
        let fetch = fetch.clone();
        async move {
            if !first {
                tokio::time::sleep(POLL).await;
            }
            let (item, state) = fetch(state).await;
            Some((item, (state, false)))
        }
    })
}
