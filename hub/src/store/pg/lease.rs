//! The leader lease and the shared identity of several Hubs on one database: one row,
//! `agen_leader` (epoch, holder, advertised URL, expiry by the database's clock), and one sealed
//! blob, `agen_identity`.
//!
//! Invariants: taking the lease bumps the epoch, and only when the lease expired (or the taker
//! held it already); renewing keeps the epoch and works only while the row still has the
//! renewer's epoch and holder, so a deposed Hub can never renew; expiry is judged by the
//! database's `now()`, so Hubs need no common clock. The identity is inserted only if absent:
//! of Hubs starting together on an empty database one writes it and all read that one.

use std::time::Duration;

/// A lease (or identity) operation.
pub enum LeaseOp {
    /// Take the lease for `holder` (advertising `url`) for `ms` if it expired or `holder` has it.
    Take {
        holder: String,
        url: String,
        ms: i64,
    },
    /// Extend the lease held at `epoch` by `holder` for `ms`.
    Renew { holder: String, epoch: i64, ms: i64 },
    /// Give the lease held at `epoch` up (a leader that stops): a follower takes it at once.
    Release { holder: String, epoch: i64 },
    /// Read the lease row.
    Read,
    /// Read the sealed identity.
    IdentityGet,
    /// Insert the sealed identity if there is none.
    IdentityInsert(Vec<u8>),
}

/// What a lease operation answered.
pub enum LeaseOut {
    /// The epoch taken or renewed (`None`: not taken, or not renewed: deposed).
    Epoch(Option<i64>),
    Row(Leader),
    Identity(Option<Vec<u8>>),
}

/// The lease row as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    pub epoch: u64,
    pub holder: String,
    pub url: String,
    /// Milliseconds until it expires by the database's clock (negative: expired).
    pub expires_in_ms: i64,
}

const TAKE: &str = "UPDATE agen_leader SET epoch = epoch + 1, holder = $1, url = $2, \
    expires_at = now() + $3 * interval '1 millisecond' \
    WHERE id = 1 AND (expires_at < now() OR holder = $1) RETURNING epoch";
const RENEW: &str = "UPDATE agen_leader SET expires_at = now() + $3 * interval '1 millisecond' \
    WHERE id = 1 AND epoch = $2 AND holder = $1 RETURNING epoch";
const RELEASE: &str = "UPDATE agen_leader SET expires_at = '-infinity' \
    WHERE id = 1 AND epoch = $2 AND holder = $1 RETURNING epoch";
const READ: &str = "SELECT epoch, holder, url, CASE WHEN isfinite(expires_at) \
    THEN (extract(epoch FROM (expires_at - now())) * 1000)::bigint END FROM agen_leader WHERE id = 1";
const IDENTITY_GET: &str = "SELECT sealed FROM agen_identity WHERE id = 1";
const IDENTITY_INSERT: &str =
    "INSERT INTO agen_identity (id, sealed) VALUES (1, $1) ON CONFLICT (id) DO NOTHING";

/// A duration as the milliseconds a lease statement takes.
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub async fn exec(
    c: &mut tokio_postgres::Client,
    op: LeaseOp,
) -> Result<LeaseOut, tokio_postgres::Error> {
    match op {
        LeaseOp::Take { holder, url, ms } => {
            let row = c.query_opt(TAKE, &[&holder, &url, &(ms as f64)]).await?;
            Ok(LeaseOut::Epoch(row.map(|r| r.get(0))))
        }
        LeaseOp::Renew { holder, epoch, ms } => {
            let row = c.query_opt(RENEW, &[&holder, &epoch, &(ms as f64)]).await?;
            Ok(LeaseOut::Epoch(row.map(|r| r.get(0))))
        }
        LeaseOp::Release { holder, epoch } => {
            let row = c.query_opt(RELEASE, &[&holder, &epoch]).await?;
            Ok(LeaseOut::Epoch(row.map(|r| r.get(0))))
        }
        LeaseOp::Read => {
            let r = c.query_one(READ, &[]).await?;
            let (epoch, holder, url, left): (i64, String, String, Option<i64>) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            Ok(LeaseOut::Row(Leader {
                epoch: u64::try_from(epoch).unwrap_or(0),
                holder,
                url,
                expires_in_ms: left.unwrap_or(i64::MIN),
            }))
        }
        LeaseOp::IdentityGet => {
            let row = c.query_opt(IDENTITY_GET, &[]).await?;
            Ok(LeaseOut::Identity(row.map(|r| r.get(0))))
        }
        LeaseOp::IdentityInsert(sealed) => {
            c.execute(IDENTITY_INSERT, &[&sealed]).await?;
            Ok(LeaseOut::Epoch(None))
        }
    }
}
