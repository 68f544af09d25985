//! The Nest socket: each instance connects, proves who it is (see `identity`), gets its
//! placement and streams reports and run events, relayed only for runs handed to it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::model::{InstanceState, ServerProblem};
use crate::socket::{self, HostState, ToInstance, ToNest};
use children::ChildRecord;

use super::runs::send_or_queue;
use super::*;

impl Supervisor {
    /// Accepts instance connections on the Nest socket until shutdown.
    pub async fn serve(self: Arc<Self>, listener: UnixListener) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = self.shutdown.cancelled() => return,
            };
            match accepted {
                Ok((stream, _)) => {
                    let me = self.clone();
                    self.tracker
                        .spawn(async move { me.connection(stream).await });
                }
                Err(e) => {
                    tracing::warn!("nest socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    pub(super) async fn connection(self: Arc<Self>, stream: UnixStream) {
        // The kernel's word for who is on the other end, not the pid the hello claims.
        let peer = stream
            .peer_cred()
            .map(|c| identity::Peer {
                pid: c.pid(),
                uid: Some(c.uid()),
            })
            .unwrap_or_default();
        let (mut reader, mut writer) = socket::split::<ToNest, ToInstance>(stream);
        let hello = tokio::time::timeout(HELLO_TIMEOUT, reader.next()).await;
        let (id, pid, secret) = match hello {
            Ok(Ok(Some(ToNest::Hello {
                instance_id,
                pid,
                secret,
            }))) => (instance_id, pid, secret),
            Ok(Ok(Some(other))) => {
                tracing::warn!("nest socket: expected hello first, got {other:?}");
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!("{e}");
                return;
            }
            Ok(Ok(None)) | Err(_) => return,
        };
        let found = {
            let mut st = self.lock();
            match st.instances.get_mut(&id) {
                None => Err(identity::HelloRefusal::NotPlaced { id: id.clone() }),
                Some(e) => identity::check(&id, e.cred.as_mut(), &secret, peer)
                    .map(|()| (e.place.clone(), e.bundle_dir.clone())),
            }
        };
        let (place, bundle_dir) = match found {
            Ok((place, Some(dir))) => (place, dir),
            Ok((_, None)) => {
                // Cannot happen (an instance is spawned only once its bundle is here).
                return;
            }
            Err(refusal) => {
                tracing::warn!(instance = %id, claimed_pid = pid, "nest socket: {refusal}");
                // One answer for every refusal: the peer learns nothing of which instance ids
                // exist, are connected or run (the Nest's log has the reason).
                let _ = writer
                    .send(&ToInstance::Refused {
                        reason: identity::PEER_REFUSAL.into(),
                    })
                    .await;
                return;
            }
        };
        let opts = self.opts.clone();
        let placement =
            tokio::task::spawn_blocking(move || build_placement(&place, &bundle_dir, &opts)).await;
        let Ok(placement) = placement else { return };
        if writer
            .send(&ToInstance::Placement(placement))
            .await
            .is_err()
        {
            return;
        }
        let conn_id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = mpsc::unbounded_channel();
        {
            let mut st = self.lock();
            let Some(e) = st.instances.get_mut(&id) else {
                return;
            };
            for m in e.queued.drain(..) {
                let _ = tx.send(m);
            }
            e.conn = Some((conn_id, tx));
        }
        tracing::debug!(instance = %id, pid, "instance connected");
        loop {
            tokio::select! {
                m = reader.next() => match m {
                    Ok(Some(msg)) => self.on_message(&id, msg),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(instance = %id, "{e}");
                        break;
                    }
                },
                out = rx.recv() => match out {
                    Some(m) => if let Err(e) = writer.send_queued(m, &mut rx).await {
                        tracing::warn!(instance = %id, "{e}");
                        break;
                    },
                    None => break,
                },
                // Closing the socket makes the instance exit by itself.
                _ = self.shutdown.cancelled() => break,
            }
        }
        let mut st = self.lock();
        if let Some(e) = st.instances.get_mut(&id) {
            if matches!(e.conn, Some((c, _)) if c == conn_id) {
                e.conn = None;
            }
        }
    }

    /// An instance's status: its report updated; a tool server it says was killed by SIGKILL
    /// has the OOM watch look at once (see `resources`).
    fn on_status(&self, id: &str, s: crate::socket::InstanceStatus) {
        let mut died = Vec::new();
        self.update(id, |r| {
            if r.state == InstanceState::Stopping {
                return;
            }
            r.state = match s.state {
                HostState::Starting => InstanceState::Starting,
                HostState::Running => InstanceState::Running,
                HostState::Unhealthy => InstanceState::Unhealthy,
            };
            r.healthy = s.state == HostState::Running;
            r.tools_loaded = s.tools_loaded;
            died = s
                .servers_not_connected
                .into_iter()
                .map(|(server, reason)| ServerProblem { server, reason })
                .collect();
            r.servers_not_connected = died.clone();
            r.tools = s.tools;
            r.resources = s.resources;
            r.message = s.message;
            r.active_runs = s.active_runs;
            for (server, pid) in &s.server_pids {
                if let Ok(pgid) = i32::try_from(*pid) {
                    self.children.record(
                        &format!("{id}/{server}"),
                        ChildRecord {
                            what: format!("tool server {server} of instance {id}"),
                            pgid,
                        },
                    );
                }
            }
        });
        self.server_killed(id, &died);
    }

    pub(super) fn on_message(&self, id: &str, msg: ToNest) {
        match msg {
            ToNest::Hello { .. } => {}
            ToNest::Status(s) => {
                self.on_status(id, s);
            }
            ToNest::Event(e) => {
                {
                    let mut st = self.lock();
                    match st
                        .runs
                        .get_mut(&e.run_id)
                        .filter(|t| t.instance == id && t.attempt == e.attempt)
                    {
                        Some(t) => t.last_seq = t.last_seq.max(e.seq),
                        None => {
                            // Not a run this instance holds (fenced, replaced, or never
                            // handed to it): dropped, and the instance is told to stop.
                            tracing::debug!(instance = %id, run = %e.run_id, attempt = e.attempt, "dropping an event of a run the instance does not hold");
                            if let Some(entry) = st.instances.get(id) {
                                if let Some((_, tx)) = &entry.conn {
                                    let _ = tx.send(ToInstance::Ack {
                                        run_id: e.run_id.clone(),
                                        attempt: e.attempt,
                                        acked_seq: 0,
                                        fenced: true,
                                    });
                                }
                            }
                            return;
                        }
                    }
                }
                self.outbox.push(id, e);
            }
            ToNest::Delta(d) => {
                // Only a run this instance holds, at this attempt; never acked.
                let holds = self.lock().runs.get(&d.run_id).is_some_and(|t| {
                    t.instance == id && t.attempt == d.delta.attempt && t.task_id == d.task_id
                });
                if holds {
                    self.outbox.deltas.push(d);
                }
            }
            msg @ (ToNest::PutArtifact { .. } | ToNest::ReadArtifact { .. }) => {
                // Artifacts go over their own RPCs (see `artifact_relay`), in the namespace
                // of the instance's placement.
                let target = {
                    let st = self.lock();
                    st.instances.get(id).and_then(|e| {
                        e.conn
                            .as_ref()
                            .map(|(_, tx)| (e.place.namespace.clone(), tx.clone()))
                    })
                };
                if let Some((namespace, tx)) = target {
                    crate::artifact_relay::relay(self.bundles.clone(), namespace, tx, msg);
                }
            }
            ToNest::Child(call) => {
                // Only for a run this instance holds, at this attempt.
                let target = {
                    let st = self.lock();
                    let holds = st
                        .runs
                        .get(&call.run_id)
                        .is_some_and(|t| t.instance == id && t.attempt == call.attempt);
                    st.instances
                        .get(id)
                        .and_then(|e| e.conn.as_ref().map(|(_, tx)| tx.clone()))
                        .map(|tx| (holds, tx))
                };
                match target {
                    Some((true, tx)) => {
                        crate::child_relay::relay(self.bundles.clone(), id.to_string(), tx, call)
                    }
                    Some((false, tx)) => {
                        let _ = tx.send(ToInstance::ChildReply(crate::socket::ChildReply {
                            req: call.req,
                            error: Some(format!(
                                "run {} attempt {} is not held by this instance",
                                call.run_id, call.attempt
                            )),
                            ..Default::default()
                        }));
                    }
                    None => {}
                }
            }
            ToNest::RunDone { run_id, attempt } => {
                let mut st = self.lock();
                if st
                    .runs
                    .get(&run_id)
                    .is_some_and(|t| t.instance == id && t.attempt == attempt)
                {
                    st.runs.remove(&run_id);
                }
                if let Some(e) = st.instances.get_mut(id) {
                    e.report.active_runs.retain(|r| *r != run_id);
                }
                let newer = st
                    .runs
                    .get(&run_id)
                    .is_some_and(|t| t.instance == id && t.attempt > attempt);
                if newer {
                    if let Some(msg) = st.deferred.remove(&run_id) {
                        if let Some(e) = st.instances.get_mut(id) {
                            e.report.active_runs.push(run_id.clone());
                            send_or_queue(e, msg);
                        }
                    }
                }
                self.report(&st, id);
            }
        }
    }
}
