//! Who may say hello as an instance: the per-spawn credential the Nest keeps for each instance
//! process it started, and the check a hello must pass before it gets a placement.
//!
//! Invariants: a hello is believed only when it carries the secret of the current spawn, comes
//! from the pid the Nest spawned and runs under the uid the Nest gave it (`SO_PEERCRED`, not
//! what the message claims), and is the first hello of that spawn; the check never changes anything but the spawn's `used` mark.

use crate::socket::SpawnSecret;

/// The credential of one spawn of an instance process.
#[derive(Debug, Clone)]
pub struct SpawnCred {
    pub secret: SpawnSecret,
    /// The pid the Nest spawned.
    pub pid: i32,
    /// The uid it runs as (the instance's own, or the Nest's when separation is off).
    pub uid: u32,
    /// A hello of this spawn was already accepted.
    pub used: bool,
}

/// What a refused peer is told, whatever the reason ([`HelloRefusal`] goes to the Nest's log).
pub const PEER_REFUSAL: &str = "hello refused: this connection is not an instance this nest started and is waiting for (the nest's log says why)";

/// Why a hello was refused (logged by the Nest, never sent to the peer; never contains a
/// secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloRefusal {
    #[error("instance {id} is not placed on this nest")]
    NotPlaced { id: String },
    #[error("instance {id} has no running process on this nest")]
    NotSpawned { id: String },
    #[error("hello as instance {id} refused: the peer process ({peer}) is not the one the nest started for it")]
    WrongPeer { id: String, peer: String },
    #[error("hello as instance {id} refused: the peer runs as uid {peer_uid}, not the uid {uid} the nest gave that instance")]
    WrongUid {
        id: String,
        peer_uid: String,
        uid: u32,
    },
    #[error("hello as instance {id} refused: wrong spawn secret (peer pid {peer})")]
    WrongSecret { id: String, peer: i32 },
    #[error("hello as instance {id} refused: that instance already said hello (peer pid {peer}); its connection stays")]
    Repeated { id: String, peer: i32 },
}

/// The kernel's word about the peer of a socket connection (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peer {
    pub pid: Option<i32>,
    pub uid: Option<u32>,
}

/// Checks a hello for instance `id` carrying `secret` from `peer`, against the spawn's
/// credential; on success marks the spawn used.
pub fn check(
    id: &str,
    cred: Option<&mut SpawnCred>,
    secret: &SpawnSecret,
    who: Peer,
) -> Result<(), HelloRefusal> {
    let peer_pid = who.pid;
    let Some(cred) = cred else {
        return Err(HelloRefusal::NotSpawned { id: id.into() });
    };
    let Some(peer) = peer_pid.filter(|p| *p == cred.pid) else {
        return Err(HelloRefusal::WrongPeer {
            id: id.into(),
            peer: peer_pid.map_or_else(|| "pid unknown".into(), |p| format!("pid {p}")),
        });
    };
    if who.uid != Some(cred.uid) {
        return Err(HelloRefusal::WrongUid {
            id: id.into(),
            peer_uid: who.uid.map_or_else(|| "unknown".into(), |u| u.to_string()),
            uid: cred.uid,
        });
    }
    if !cred.secret.matches(secret) {
        return Err(HelloRefusal::WrongSecret {
            id: id.into(),
            peer,
        });
    }
    if cred.used {
        return Err(HelloRefusal::Repeated {
            id: id.into(),
            peer,
        });
    }
    cred.used = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[track_caller]
    fn check_one(
        cred: Option<SpawnCred>,
        secret: &str,
        peer: Option<i32>,
        expected: Result<(), HelloRefusal>,
    ) {
        let mut cred = cred;
        let peer = Peer {
            pid: peer,
            uid: Some(61000),
        };
        let got = check("i-1", cred.as_mut(), &SpawnSecret::from_test(secret), peer);
        assert_eq!(got, expected);
        if let Some(msg) = got.err().map(|e| e.to_string()) {
            assert!(!msg.contains("s3cret"), "{msg}");
        }
    }

    fn cred(used: bool) -> Option<SpawnCred> {
        Some(SpawnCred {
            secret: SpawnSecret::from_test("s3cret"),
            pid: 100,
            uid: 61000,
            used,
        })
    }

    #[test]
    fn only_the_first_hello_of_the_spawned_pid_with_its_secret_passes() {
        check_one(cred(false), "s3cret", Some(100), Ok(()));
        check_one(
            cred(true),
            "s3cret",
            Some(100),
            Err(HelloRefusal::Repeated {
                id: "i-1".into(),
                peer: 100,
            }),
        );
        check_one(
            cred(false),
            "guess",
            Some(100),
            Err(HelloRefusal::WrongSecret {
                id: "i-1".into(),
                peer: 100,
            }),
        );
        check_one(
            cred(false),
            "s3cret",
            Some(101),
            Err(HelloRefusal::WrongPeer {
                id: "i-1".into(),
                peer: "pid 101".into(),
            }),
        );
        check_one(
            cred(false),
            "s3cret",
            None,
            Err(HelloRefusal::WrongPeer {
                id: "i-1".into(),
                peer: "pid unknown".into(),
            }),
        );
        check_one(
            None,
            "s3cret",
            Some(100),
            Err(HelloRefusal::NotSpawned { id: "i-1".into() }),
        );
    }

    #[test]
    fn a_hello_from_another_uid_is_refused_even_with_the_right_pid_and_secret() {
        let mut c = cred(false);
        let s = SpawnSecret::from_test("s3cret");
        for uid in [Some(0), Some(61001), None] {
            let peer = Peer {
                pid: Some(100),
                uid,
            };
            assert!(
                matches!(
                    check("i-1", c.as_mut(), &s, peer),
                    Err(HelloRefusal::WrongUid { .. })
                ),
                "{uid:?}"
            );
        }
        assert!(!c.expect("cred").used);
    }

    #[test]
    fn a_passed_check_marks_the_spawn_used() {
        let mut c = cred(false);
        let s = SpawnSecret::from_test("s3cret");
        let peer = Peer {
            pid: Some(100),
            uid: Some(61000),
        };
        assert_eq!(check("i-1", c.as_mut(), &s, peer), Ok(()));
        assert!(matches!(
            check("i-1", c.as_mut(), &s, peer),
            Err(HelloRefusal::Repeated { .. })
        ));
    }
}
