//! `agen hub verify` and `agen hub repair`: whether the Hub's store still holds everything it
//! acknowledged (a stopped Hub's from its files, a running one's through the admin call
//! `VerifyStore`), and making a damaged one servable again; and what `agen hub` does when it
//! refuses a damaged store (exit 65, the cause in systemd's `STATUS=`).

use std::path::Path;

use agen_hub::store::integrity::{Report, EXIT_STORE_DAMAGED};
use anyhow::Context;

use crate::client::{ClientArgs, Output};
use crate::exit::code;

/// `agen hub` found its store damaged: says why and what to do, tells systemd, returns 65.
pub fn refuse(report: &Report) -> i32 {
    let cause = format!(
        "refusing to start: the hub store in {} lost acknowledged data ({} problems, {} tasks touched); run agen hub verify --data-dir {}",
        report.dir.display(),
        report.problems.len(),
        report.affected().len(),
        report.dir.parent().unwrap_or(&report.dir).display()
    );
    tracing::error!("{}", report.refusal());
    agen_shared::systemd::status(&cause);
    eprintln!("error: cannot start the Hub: {}", report.refusal());
    EXIT_STORE_DAMAGED
}

/// `agen hub migrate [--check]`: the PostgreSQL store's schema brought to (or compared with)
/// this build's version.
pub async fn migrate(store: Option<&str>, check: bool) -> anyhow::Result<i32> {
    let Some(url) = store.map(str::to_owned) else {
        eprintln!(
            "error: agen hub migrate needs --store postgres://user@host/db (or AGEN_HUB_STORE)"
        );
        return Ok(64);
    };
    use agen_hub::store::pg::{self, migrate::MigrateError};
    let shown = pg::shown(&url);
    let done = tokio::task::spawn_blocking(move || pg::migrate_url(&url, !check))
        .await
        .context("the migrate task failed")?;
    let latest = pg::migrate::latest();
    match done {
        Ok(m) if check => {
            println!(
                "{shown}: schema version {}, this build's is {latest}",
                m.from
            );
            Ok(if m.from == latest { 0 } else { 1 })
        }
        Ok(m) if m.from == m.to => {
            println!("{shown}: schema version {} is current", m.to);
            Ok(0)
        }
        Ok(m) => {
            println!(
                "{shown}: schema migrated from version {} to {}",
                m.from, m.to
            );
            Ok(0)
        }
        Err(e @ MigrateError::Newer { .. }) => {
            eprintln!("error: {e}");
            Ok(2)
        }
        Err(e) => Err(anyhow::Error::new(e).context("cannot migrate the hub store")),
    }
}

/// `agen hub status`: the leader lease of several Hubs on one PostgreSQL store.
pub async fn status(store: Option<&str>) -> anyhow::Result<i32> {
    let Some(url) = store.map(str::to_owned) else {
        eprintln!(
            "error: agen hub status needs --store postgres://user@host/db (or AGEN_HUB_STORE)"
        );
        return Ok(64);
    };
    let shown = agen_hub::store::pg::shown(&url);
    let row = tokio::task::spawn_blocking(move || {
        let (store, _) = agen_hub::store::PgStore::open_with(&url, false)?;
        store.leader().map_err(anyhow::Error::msg)
    })
    .await
    .context("the status task failed")?
    .with_context(|| format!("cannot read the leader lease in {shown}"))?;
    if row.epoch == 0 {
        println!("{shown}: no Hub has led yet (start agen hub with --identity-key-file)");
        return Ok(1);
    }
    if row.expires_in_ms >= 0 {
        println!(
            "{shown}: leader {} (epoch {}, lease {} ms left, holder {})",
            row.url, row.epoch, row.expires_in_ms, row.holder
        );
        Ok(0)
    } else {
        println!(
            "{shown}: no leader: the lease of {} (epoch {}) expired {} ms ago; a follower takes it next",
            row.url,
            row.epoch,
            row.expires_in_ms.saturating_neg()
        );
        Ok(1)
    }
}

/// `agen hub migrate --from A --to B`: a stopped Hub's store copied into another, each a data
/// dir or a postgres:// URL; prints every table's counts.
pub async fn copy(from: &str, to: &str) -> anyhow::Result<i32> {
    use agen_hub::store::{pg, PgStore, SledStore, Store};
    use std::sync::Arc;
    /// A postgres:// URL, or a data dir (its store in `db/`; a source's must exist).
    fn open(place: &str, source: bool) -> anyhow::Result<Arc<dyn Store>> {
        if pg::is_url(place) {
            return Ok(Arc::new(PgStore::open(place)?));
        }
        let dir = Path::new(place).join("db");
        anyhow::ensure!(
            !source || dir.exists(),
            "{place} holds no hub store (no db/ in it): give the --data-dir of the stopped Hub"
        );
        Ok(Arc::new(SledStore::open(&dir)?))
    }
    let shown = |p: &str| {
        if pg::is_url(p) {
            pg::shown(p)
        } else {
            p.to_owned()
        }
    };
    let (a, b) = (from.to_owned(), to.to_owned());
    let (source, destination) = tokio::task::spawn_blocking(move || {
        Ok::<_, anyhow::Error>((
            open(&a, true)
                .with_context(|| format!("cannot open the source store {}", shown(&a)))?,
            open(&b, false)
                .with_context(|| format!("cannot open the destination store {}", shown(&b)))?,
        ))
    })
    .await
    .context("the open task failed")??;
    let copied = agen_hub::store::copy::copy_all(source.as_ref(), destination.as_ref())
        .await
        .context("cannot copy the hub store")?;
    for c in &copied {
        println!(
            "{:<20} {:>8} copied, {:>8} in the destination",
            c.table, c.source, c.destination
        );
    }
    println!(
        "copied {} into {}: every table's counts agree",
        shown(from),
        shown(to)
    );
    destination.close();
    source.close();
    Ok(0)
}

/// `agen hub verify`: from the files when no Hub holds the store, else through the Hub.
pub async fn verify(data_dir: &Path, client: &ClientArgs) -> anyhow::Result<i32> {
    let dir = data_dir.to_path_buf();
    let checked =
        tokio::task::spawn_blocking(move || agen_hub::store::integrity::verify_stopped(&dir))
            .await
            .context("the verify task failed")?;
    let report = match checked {
        Ok(report) => report,
        Err(agen_hub::store::StoreError::Held(_)) => return verify_running(client).await,
        Err(e) => return Err(anyhow::Error::new(e).context("cannot verify the hub store")),
    };
    match client.output {
        Output::Table => print!("{}", report.render()),
        other => crate::view::print_value(
            other,
            &serde_json::to_value(&report).context("cannot encode the report")?,
        ),
    }
    Ok(if report.intact() {
        code::OK
    } else {
        code::FAILED
    })
}

/// `agen hub verify` of a running Hub: the admin call `VerifyStore`.
async fn verify_running(client: &ClientArgs) -> anyhow::Result<i32> {
    let mut hub = client.connect()?;
    let answer = hub
        .client
        .verify_store(agen_proto::v1::VerifyStoreRequest {})
        .await
        .map_err(|s| crate::client::status_error(&hub, s))?
        .into_inner();
    eprintln!(
        "agen hub: a running Hub holds the store; verified through it ({})",
        hub.url
    );
    match client.output {
        Output::Table => print!("{}", answer.report),
        other => crate::view::print_value(
            other,
            &serde_json::from_str(&answer.report_json)
                .context("the Hub's verify report is not JSON")?,
        ),
    }
    Ok(if answer.intact {
        code::OK
    } else {
        code::FAILED
    })
}

/// `agen hub repair`: offline, on the data dir of a stopped Hub.
pub async fn repair(data_dir: &Path) -> anyhow::Result<i32> {
    agen_shared::private::restrict_umask();
    let repaired = agen_hub::repair::repair(data_dir)
        .await
        .with_context(|| format!("cannot repair the hub store in {}", data_dir.display()))?;
    print!("{}", agen_hub::repair::render(&repaired));
    eprintln!(
        "agen hub: repaired {}: {} tasks kept, {} ended failed (history_lost), {} lost; report in {}",
        data_dir.display(),
        repaired.kept,
        repaired.failed.len(),
        repaired.lost.len(),
        repaired.report_file.display()
    );
    Ok(code::OK)
}

/// `agen hub seed-tasks COUNT`: succeeded tasks written into a stopped Hub's store (its data
/// dir's, or the PostgreSQL store of `--store`), made durable; prints how long it took.
pub async fn seed(
    store: Option<&str>,
    data_dir: &Path,
    spec: agen_hub::core::tasks::seed::SeedSpec,
) -> anyhow::Result<i32> {
    use agen_hub::store::{Db, PgStore, SledStore, Store};
    use std::sync::Arc;
    // What it writes is private to its user, as the Hub's own files are.
    agen_shared::private::restrict_umask();
    let started = std::time::Instant::now();
    let (url, dir) = (store.map(str::to_owned), data_dir.join("db"));
    let raw: Arc<dyn Store> =
        tokio::task::spawn_blocking(move || -> anyhow::Result<Arc<dyn Store>> {
            Ok(match url {
                Some(url) => {
                    Arc::new(PgStore::open(&url).context("cannot open the PostgreSQL store")?)
                }
                None => Arc::new(SledStore::open(&dir).with_context(|| {
                    format!(
                        "cannot open the hub store in {} (is the Hub stopped?)",
                        dir.display()
                    )
                })?),
            })
        })
        .await
        .context("the open task failed")??;
    let db = Db::new(raw);
    let count = spec.count;
    let writer = db.clone();
    tokio::task::spawn_blocking(move || {
        agen_hub::core::tasks::seed::seed_finished_tasks(&writer, &spec)
    })
    .await
    .context("the seeding task failed")?
    .context("cannot seed the tasks")?;
    db.flush()
        .await
        .context("cannot make the seeded tasks durable")?;
    db.close();
    let took = started.elapsed();
    println!(
        "seeded {count} succeeded tasks in {:.1} s ({:.0} tasks/s)",
        took.as_secs_f64(),
        count as f64 / took.as_secs_f64().max(1e-9)
    );
    Ok(0)
}
