//! Standard output of client commands. A closed pipe (`agen tasks | head -1`) is not an
//! error: the reader has what it wanted, so the process ends quietly with exit 0.

use std::io::Write;

/// Writes `text` and a newline to stdout; on a closed pipe exits 0 at once. Control and format
/// characters in it (from a model, a tool, a bundle or another user) are shown as escapes,
/// never sent raw: only [`raw`] writes terminal control sequences (the CLI's own redraws).
pub fn line(text: &str) {
    write(&agen_shared::text::escape_controls(text, true), true)
}

/// Writes `text` with no newline, its control and format characters escaped as [`line`] does
/// (a streamed answer's pieces: each character is escaped alone, so a piece boundary inside
/// an escape sequence changes nothing).
pub fn text(text: &str) {
    write(&agen_shared::text::escape_controls(text, true), false)
}

/// Writes `text` as it is (no newline; terminal control sequences); a closed pipe as [`line`].
pub fn raw(text: &str) {
    write(text, false)
}

fn write(text: &str, newline: bool) {
    let mut out = std::io::stdout().lock();
    let result = out
        .write_all(text.as_bytes())
        .and_then(|()| {
            if newline {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| out.flush());
    if let Err(e) = result {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        // Anything else (a full disk behind a redirect) is reported once and ends the command.
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(crate::exit::code::FAILED);
    }
}

/// `println!` for command output: a closed pipe ends the process with exit 0.
#[macro_export]
macro_rules! outln {
    () => { $crate::out::line("") };
    ($($arg:tt)*) => { $crate::out::line(&format!($($arg)*)) };
}
