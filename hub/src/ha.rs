//! Several Hubs on one PostgreSQL database (`--store postgres://… --identity-key-file PATH`):
//! the identity they share and the leader lease.
//!
//! Identity: the CA (certificate and key), the admin token, the join token and the secret
//! store's key live in the database as one blob sealed with the identity key file (the same
//! file on every Hub). The first Hub on an empty database stores the identity its data dir has
//! (or a new one) if none is stored yet, atomically; every Hub then writes the stored one into
//! its data dir, where the rest of the Hub reads it as a single Hub's.
//!
//! Leader lease ([`crate::store::pg::lease`]): a Hub serves only while it holds the lease; until
//! then it is a follower that waits for the lease to expire, serving its port meanwhile
//! ([`crate::follower`]: clients' calls forwarded to the leader, Nests told where it is). The leader renews every third of the lease;
//! once the database says another Hub took it over, it stops (exit [`EXIT_DEPOSED`]) and every
//! write it still attempts is refused by the database (fencing), so a deposed leader (paused
//! past its lease, then resumed) changes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agen_shared::tls::{self, JoinToken};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::error::{HubError, Result};
use crate::secrets::{Sealed, SecretKey};
use crate::store::PgStore;

/// The default `--leader-lease`.
pub const DEFAULT_LEADER_LEASE: Duration = Duration::from_secs(5);
/// The default `--nest-lease` (the Nest's own default).
pub const DEFAULT_NEST_LEASE: Duration = Duration::from_secs(30);
/// How long Nests take to reach a Hub that came back (their reconnect back-off, at most 2 s,
/// through each of their Hubs, and the new leader's start): `--nest-lease` must exceed the
/// leader lease plus this.
pub const RECONNECT_TIME: Duration = Duration::from_secs(5);
/// Exit status of `agen hub` when it stopped because another Hub took its lease over (a
/// service manager restarts it, and it waits as a follower).
pub const EXIT_DEPOSED: i32 = 75;

/// `--identity-key-file`, `--leader-lease`, `--advertise-url`.
#[derive(Debug, Clone)]
pub struct HaOptions {
    pub identity_key_file: PathBuf,
    pub leader_lease: Duration,
    /// The URL this Hub is reached at, shown as the leader's (default: its listen address).
    pub advertise_url: Option<String>,
}

/// The associated data of the sealed identity.
const AAD: &str = "agen hub identity v1";

/// What the Hubs share, as stored (sealed) in `agen_identity`.
#[derive(Serialize, Deserialize, PartialEq, Eq)]
struct Identity {
    ca_pem: String,
    ca_key_pem: String,
    admin_token: String,
    join_token: String,
    /// The secret store's key, hex.
    secret_key: String,
}

fn db_err<'a>(store: &'a str, what: &'a str) -> impl Fn(String) -> HubError + 'a {
    move |e| HubError::Config(format!("{store}: cannot {what}: {e}"))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(HubError::io(path, "cannot read"))
}

/// The identity the data dir holds, created first where missing.
fn local_identity(data_dir: &Path, extra_names: &[String]) -> Result<Identity> {
    let admin = super::load_or_create_token(&data_dir.join("admin-token"), tls::random_secret)?;
    let hub_tls = tls::load_or_create_hub_tls(&data_dir.join("tls"), extra_names)?;
    let join = super::load_or_create_token(&data_dir.join("join-token"), || {
        JoinToken::generate(&hub_tls.ca_sha256).to_string()
    })?;
    let key_path = data_dir.join("secret.key");
    SecretKey::load_or_create(&key_path)?;
    let key = std::fs::read(&key_path).map_err(HubError::io(&key_path, "cannot read"))?;
    Ok(Identity {
        ca_pem: read(&data_dir.join("tls/ca.pem"))?,
        ca_key_pem: read(&data_dir.join("tls/ca.key"))?,
        admin_token: admin,
        join_token: join,
        secret_key: hex::encode(key),
    })
}

/// Writes `contents` to `path` (0600) unless it holds them already.
fn put(path: &Path, contents: &[u8]) -> Result<bool> {
    if std::fs::read(path).is_ok_and(|c| c == contents) {
        return Ok(false);
    }
    tls::write_private(path, contents)?;
    Ok(true)
}

/// Makes the data dir hold the identity stored in the database (storing this data dir's first
/// when the database has none). Blocks: call it off the async threads.
pub fn sync_identity(
    store: &PgStore,
    shown: &str,
    key_file: &Path,
    data_dir: &Path,
    extra_names: &[String],
) -> Result<()> {
    let key = SecretKey::load_or_create(key_file)?;
    if store
        .identity()
        .map_err(db_err(shown, "read the Hubs' identity"))?
        .is_none()
    {
        let mine = local_identity(data_dir, extra_names)?;
        let plain = serde_json::to_vec(&mine).map_err(|e| HubError::Serve(e.to_string()))?;
        let sealed = serde_json::to_vec(&key.seal(AAD, &plain))
            .map_err(|e| HubError::Serve(e.to_string()))?;
        store
            .insert_identity(sealed)
            .map_err(db_err(shown, "store the Hubs' identity"))?;
    }
    let stored = store
        .identity()
        .map_err(db_err(shown, "read the Hubs' identity"))?
        .ok_or_else(|| HubError::Config(format!("{shown}: the Hubs' identity vanished")))?;
    let unreadable = || {
        HubError::Config(format!(
            "{shown}: the Hubs' identity there is not sealed with --identity-key-file {}: give every Hub the same identity key file (copy it from the Hub that started first)",
            key_file.display()
        ))
    };
    let sealed: Sealed = serde_json::from_slice(&stored).map_err(|_| unreadable())?;
    let plain = key.open(AAD, &sealed).ok_or_else(unreadable)?;
    let id: Identity = serde_json::from_slice(&plain).map_err(|_| unreadable())?;
    let secret_key = hex::decode(&id.secret_key).map_err(|_| unreadable())?;
    std::fs::create_dir_all(data_dir.join("tls"))
        .map_err(HubError::io(&data_dir.join("tls"), "cannot create"))?;
    let mut changed = false;
    changed |= put(&data_dir.join("tls/ca.pem"), id.ca_pem.as_bytes())?;
    changed |= put(&data_dir.join("tls/ca.key"), id.ca_key_pem.as_bytes())?;
    changed |= put(
        &data_dir.join("admin-token"),
        format!("{}\n", id.admin_token).as_bytes(),
    )?;
    changed |= put(
        &data_dir.join("join-token"),
        format!("{}\n", id.join_token).as_bytes(),
    )?;
    changed |= put(&data_dir.join("secret.key"), &secret_key)?;
    if changed {
        tracing::info!(store = %shown, "hub identity (CA, tokens, secret key) taken from the database");
    }
    Ok(())
}

/// A name for this Hub process in the lease row.
pub fn holder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    format!(
        "{host}/{}/{}",
        std::process::id(),
        &tls::random_secret()[..8]
    )
}

/// How often a follower tries to take the lease, and the leader renews it.
fn try_every(lease: Duration) -> Duration {
    (lease / 20).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// Waits as a follower until this Hub takes the lease; returns its epoch (`None`: stopped
/// first).
pub async fn campaign(
    store: Arc<PgStore>,
    holder: &str,
    url: &str,
    lease: Duration,
    role: &crate::role::Role,
    shutdown: &CancellationToken,
) -> Result<Option<u64>> {
    let mut told = None;
    // A follower is a serving process too: systemd's watchdog is fed while it follows.
    let watchdog = agen_shared::systemd::Watchdog::from_env();
    loop {
        watchdog.pet();
        let (s, h, u) = (store.clone(), holder.to_owned(), url.to_owned());
        let taken = tokio::task::spawn_blocking(move || {
            let taken = s.take_lease(&h, &u, lease)?;
            let row = if taken.is_none() {
                s.leader().ok()
            } else {
                None
            };
            Ok::<_, String>((taken, row))
        })
        .await
        .map_err(|e| HubError::Serve(format!("taking the leader lease: {e}")))?;
        match taken {
            Ok((Some(epoch), _)) => {
                role.set(crate::role::RoleNow {
                    leader: true,
                    epoch,
                    leader_url: url.to_owned(),
                    db_ok: true,
                });
                tracing::info!(epoch, %url, "hub leads (took the leader lease)");
                agen_shared::systemd::status(&format!("leader, epoch {epoch}"));
                return Ok(Some(epoch));
            }
            Ok((None, Some(row))) => {
                // An expired lease names no leader: a follower then hints nowhere (a Nest
                // sent to a dead leader would only come back later).
                role.set(crate::role::RoleNow {
                    leader: false,
                    epoch: row.epoch,
                    leader_url: if row.expires_in_ms > 0 {
                        row.url.clone()
                    } else {
                        String::new()
                    },
                    db_ok: true,
                });
                if told.as_ref() != Some(&(row.epoch, row.url.clone())) {
                    tracing::info!(leader = %row.url, epoch = row.epoch, "hub follows: another Hub leads; waiting for its lease to expire");
                    agen_shared::systemd::status(&format!(
                        "follower of {} (epoch {})",
                        row.url, row.epoch
                    ));
                    told = Some((row.epoch, row.url));
                }
            }
            Ok((None, None)) => {}
            Err(e) => {
                role.set(crate::role::RoleNow {
                    db_ok: false,
                    ..role.now()
                });
                tracing::warn!("hub follower: cannot reach the lease: {e}")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(try_every(lease)) => {}
            _ = shutdown.cancelled() => return Ok(None),
        }
    }
}

/// Renews the lease every third of it until `shutdown`; when another Hub took it, marks the
/// Hub deposed and cancels `shutdown` (the Hub stops; its writes are refused meanwhile).
pub fn keep(
    store: Arc<PgStore>,
    holder: String,
    epoch: u64,
    lease: Duration,
    shutdown: CancellationToken,
    deposed: Arc<std::sync::atomic::AtomicBool>,
    role: Arc<crate::role::Role>,
) {
    let depose = move || {
        deposed.store(true, std::sync::atomic::Ordering::SeqCst);
        role.set(crate::role::RoleNow {
            leader: false,
            ..role.now()
        });
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(lease / 3) => {}
                _ = shutdown.cancelled() => return,
            }
            let (s, h) = (store.clone(), holder.clone());
            let renewed =
                tokio::task::spawn_blocking(move || s.renew_lease(&h, epoch, lease)).await;
            match renewed {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tracing::error!(epoch, "hub deposed: another Hub took the leader lease over; stopping (a service manager restarts this Hub as a follower)");
                    depose();
                    shutdown.cancel();
                    return;
                }
                Ok(Err(e)) => tracing::warn!(epoch, "cannot renew the leader lease: {e}"),
                Err(e) => tracing::warn!(epoch, "cannot renew the leader lease: {e}"),
            }
            if store.deposed() {
                tracing::error!(
                    epoch,
                    "hub deposed: a write found another Hub's epoch; stopping"
                );
                depose();
                shutdown.cancel();
                return;
            }
        }
    });
}
