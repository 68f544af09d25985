//! `agen hub snapshot|restore|verify-snapshot|snapshot-key`: backups of the local store, sealed
//! with a snapshot key the operator holds (never one inside the snapshot or the data dir).
//! `snapshot` streams `SnapshotStore` from the running Hub and seals it here; `restore` and
//! `verify-snapshot` work offline on the file. A snapshot without a key is refused; an old
//! unencrypted one is read only with `--allow-unencrypted` (and a warning).

use std::path::{Path, PathBuf};

use anyhow::Context;

use agen_hub::store::sealed::SnapshotKey;
use agen_hub::store::snapshot::Opening;

/// The snapshot key, for the commands that read or write a snapshot.
#[derive(Debug, clap::Args)]
pub struct KeyArgs {
    /// The snapshot key (32 random bytes, made by `agen hub snapshot-key new FILE`)
    #[arg(long, value_name = "PATH", env = "AGEN_SNAPSHOT_KEY_FILE")]
    pub snapshot_key_file: Option<PathBuf>,
    /// Read a snapshot written before snapshots were encrypted (it cannot be authenticated)
    #[arg(long)]
    pub allow_unencrypted: bool,
}

/// `agen hub snapshot-key …`.
#[derive(Debug, clap::Subcommand)]
pub enum KeyAction {
    /// Make a new snapshot key: 32 random bytes written to FILE (0600, never over an existing
    /// file) [default: $AGEN_SNAPSHOT_KEY_FILE]
    New { file: Option<PathBuf> },
}

impl KeyArgs {
    fn load(&self) -> anyhow::Result<Option<SnapshotKey>> {
        self.snapshot_key_file
            .as_deref()
            .map(SnapshotKey::load)
            .transpose()
            .map_err(anyhow::Error::from)
    }
}

pub(super) fn new_key(file: Option<PathBuf>) -> anyhow::Result<i32> {
    let file = file
        .or_else(|| std::env::var_os("AGEN_SNAPSHOT_KEY_FILE").map(PathBuf::from))
        .context("say where the key goes: agen hub snapshot-key new FILE")?;
    SnapshotKey::create(&file)?;
    eprintln!(
        "agen hub: snapshot key written to {} (0600); keep a copy apart from the snapshots: without it they cannot be restored",
        file.display()
    );
    Ok(0)
}

/// `agen hub snapshot FILE`: streams `SnapshotStore` and seals it into FILE (written 0600
/// beside it, then renamed, so a failed copy never leaves a half file under that name).
pub(super) async fn snapshot(
    file: &Path,
    key: &KeyArgs,
    client: &crate::client::ClientArgs,
) -> anyhow::Result<i32> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(sealing) = key.load()? else {
        eprintln!("error: agen hub snapshot needs the snapshot key: --snapshot-key-file PATH or AGEN_SNAPSHOT_KEY_FILE (make one with `agen hub snapshot-key new FILE`)");
        return Ok(64);
    };
    let mut hub = client.connect()?;
    let mut stream = hub
        .client
        .snapshot_store(agen_proto::v1::SnapshotStoreRequest {})
        .await
        .map_err(|s| crate::client::status_error(&hub, s))?
        .into_inner();
    let partial = file.with_extension("partial");
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut sealed =
        agen_hub::store::sealed::SealWriter::new(std::io::BufWriter::new(out), &sealing)?;
    let mut bytes = 0u64;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|s| crate::client::status_error(&hub, s))?
    {
        sealed
            .write_all(&chunk.data)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        bytes += chunk.data.len() as u64;
    }
    let out = sealed
        .finish()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .with_context(|| format!("cannot write {}", partial.display()))?;
    out.sync_all()
        .with_context(|| format!("cannot sync {}", partial.display()))?;
    std::fs::rename(&partial, file)
        .with_context(|| format!("cannot move the snapshot to {}", file.display()))?;
    eprintln!(
        "agen hub: snapshot of {} written to {} ({bytes} bytes, sealed with {})",
        hub.url,
        file.display(),
        key.snapshot_key_file
            .as_deref()
            .unwrap_or(Path::new("the snapshot key"))
            .display()
    );
    Ok(0)
}

/// `agen hub verify-snapshot FILE`: exit 0 when FILE can be restored, 1 when not.
pub(super) async fn verify(file: &Path, key: &KeyArgs) -> anyhow::Result<i32> {
    let sealing = key.load()?;
    let input =
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let allow = key.allow_unencrypted;
    let checked = tokio::task::spawn_blocking(move || {
        let how = Opening {
            key: sealing.as_ref(),
            allow_unencrypted: allow,
        };
        agen_hub::store::snapshot::verify(std::io::BufReader::new(input), how)
    })
    .await
    .context("the verify task failed")?;
    match checked {
        Ok(counts) => {
            println!(
                "{}: ok ({} records, {} key files)",
                file.display(),
                counts.records,
                counts.files
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!("{}: refused: {e}", file.display());
            Ok(1)
        }
    }
}

/// `agen hub --data-dir D restore FILE`: offline, into the data dir of a stopped Hub.
pub(super) async fn restore(file: &Path, key: &KeyArgs, data_dir: &Path) -> anyhow::Result<i32> {
    agen_shared::private::restrict_umask();
    let sealing = key.load()?;
    agen_shared::private::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let input =
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let dir = data_dir.to_path_buf();
    let allow = key.allow_unencrypted;
    if allow {
        eprintln!("warning: --allow-unencrypted: an unencrypted snapshot cannot be authenticated; restore only one you trust");
    }
    let counts = tokio::task::spawn_blocking(move || {
        let how = Opening {
            key: sealing.as_ref(),
            allow_unencrypted: allow,
        };
        agen_hub::store::snapshot::restore(std::io::BufReader::new(input), &dir, how)
    })
    .await
    .context("the restore task failed")?
    .with_context(|| {
        format!(
            "cannot restore {} into {}",
            file.display(),
            data_dir.display()
        )
    })?;
    eprintln!(
        "agen hub: restored {} records and {} key files into {}; start the Hub with --data-dir {} (a new store epoch: the runs in flight at the snapshot resume, their interrupted side-effecting calls reported effect_unknown)",
        counts.records,
        counts.files,
        data_dir.display(),
        data_dir.display()
    );
    Ok(0)
}
