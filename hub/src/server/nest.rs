//! `agen.v1.NestService`: one `Connect` stream per Nest (register first, then heartbeats,
//! instance reports and run events in; placements, stops, runs and acks out) and
//! `FetchBundle` (bundles by digest, in chunks, never inside the stream), `PutArtifact` /
//! `ReadArtifact` (agents' artifacts, relayed by the Nest, also in chunks), `FetchRunContext`
//! (a run's history and replay, in chunks: `run_context`), and `Join`, which signs a Nest's
//! CSR with the Hub's CA.
//!
//! Invariants: on a TLS Hub every call but `Join` needs a client certificate the CA verified
//! whose key is the one its nest id is bound to, and a Nest is who its certificate says
//! (`Register.nest_id` must match it); a revoked Nest is refused and its stream ended at once;
//! `Join` needs a live join token (one use spent) to bind a new id, never takes over an id bound
//! to another key, and renews a bound id's certificate for the same key (with the Nest's
//! certificate or a join token); a plaintext (loopback) Hub has no certificates and trusts a
//! live join token alone.

use std::pin::Pin;
use std::sync::Arc;

use agen_proto::v1 as pb;
use agen_proto::v1::nest_service_server::NestService;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::{convert, malformed};
use crate::error::HubError;
use crate::tokens::nests::JoinGrant;

/// Bundle bytes per `FetchBundle` chunk.
const CHUNK: usize = 1024 * 1024;

use super::nest_api::peer_nest;
pub use super::nest_api::NestApi;

/// Refuses a Nest whose protocol version is outside this Hub's window (its minor and the one
/// before, same major), naming both versions and the fix.
fn check_protocol(reg: &crate::model::Registration) -> Result<(), Status> {
    use agen_shared::version::Protocol;
    let hub = Protocol::spoken();
    let nest = Protocol::parse(&reg.protocol_version);
    if nest.is_some_and(|n| hub.accepts(n)) {
        return Ok(());
    }
    let spoken = match nest {
        Some(n) => format!("protocol {n}"),
        None => "no protocol version (a build from before protocol versions)".into(),
    };
    let build = match reg.commit.as_str() {
        "" => format!("agen {}", reg.version),
        c => format!("agen {}, commit {c}", reg.version),
    };
    tracing::warn!(nest_id = %reg.nest_id, name = %reg.name, nest_protocol = %reg.protocol_version, hub_protocol = %hub, "refused a nest outside the protocol window");
    Err(Status::failed_precondition(format!(
        "nest {} ({build}) speaks {spoken}; this hub (agen {}) speaks protocol {hub} and accepts nests of protocol {}; upgrade the nest to a build of this hub's release (agen version shows the protocol)",
        reg.name,
        agen_shared::version::CRATE_VERSION,
        hub.window()
    )))
}

/// Refuses a Nest whose instances run without uid separation when this Hub requires it
/// (`--require-uid-separation`), naming what it reported and the fix.
fn check_separation(reg: &crate::model::Registration, required: bool) -> Result<(), Status> {
    let separated = !reg.separation.is_empty() && !reg.separation.starts_with("off");
    if !required || separated {
        return Ok(());
    }
    let has = match reg.separation.as_str() {
        "" => "does not say (a build from before uid separation)",
        s => s,
    };
    tracing::warn!(nest_id = %reg.nest_id, name = %reg.name, separation = %reg.separation, "refused a nest without uid separation");
    Err(Status::failed_precondition(format!(
        "nest {} lacks uid separation, which this hub requires (--require-uid-separation): its instances run as its own user (separation: {has}); run the nest as root without --run-as-self (instances then run as uids of --run-uids), or start the hub without --require-uid-separation",
        reg.name
    )))
}

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl NestService for NestApi {
    type ConnectStream = Stream_<pb::HubMessage>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::NestMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let cert_id = self.cert_nest_id(&request)?;
        let mut incoming = request.into_inner();
        let first = malformed::next(&mut incoming)
            .await?
            .ok_or_else(|| HubError::invalid("connect: the stream ended before Register"))?;
        let Some(pb::nest_message::Msg::Register(register)) = first.msg else {
            return Err(HubError::invalid("connect: the first message must be Register").into());
        };
        if let Some(cert_id) = cert_id {
            if register.nest_id != cert_id {
                return Err(Status::permission_denied(format!(
                    "connect: Register names nest `{}` but the client certificate was issued to nest `{cert_id}`; a nest registers only as itself",
                    register.nest_id
                )));
            }
        }
        let reg = convert::registration(&register);
        check_protocol(&reg)?;
        check_separation(&reg, self.core.opts.require_uid_separation)?;
        crate::limits::check_id("register.nest_id", &reg.nest_id)?;
        crate::limits::check_bytes("register.name", &reg.name, 255)?;
        self.core
            .opts
            .limits
            .check_labels("register.labels", &reg.labels)?;
        let nest_id = reg.nest_id.clone();
        let (tx, rx) = crate::nodes::nest_queue(self.core.opts.limits.nest_queue_bytes);
        let overflow = rx.overflow.clone();
        let conn_id = self.core.register(reg, tx.clone()).await?;
        // Pings keep the Nest's lease (how long it keeps its runs without a Hub) from running
        // out while the link is up.
        // They stop with the link, so that a dropped link ends the outbound stream.
        let every = self.core.opts.nest_disconnect_grace / 6;
        let (pinger, ping_nest) = (self.core.clone(), nest_id.clone());
        let ping_tls = self.tls.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = pinger.stopping.cancelled() => return,
                }
                let ca_sha256 = ping_tls
                    .as_ref()
                    .map(|t| t.hub().ca_sha256.clone())
                    .unwrap_or_default();
                if !pinger.link_is_current(&ping_nest, conn_id)
                    || tx.send(crate::nodes::ToNest::Ping { ca_sha256 }).is_err()
                {
                    return;
                }
            }
        });

        let core = self.core.clone();
        let mut revocations = self.nests.revocations();
        let identities = self.nests.clone();
        let ended = tokio_util::sync::CancellationToken::new();
        let end_stream = ended.clone();
        // Bound at connect time (TLS Hubs); a forgotten identity ends the stream too.
        let bound = self.nests.get(&nest_id).is_some();
        let stop_reading = overflow.clone();
        // Why the Hub ended the link, sent to the Nest as the stream's last status.
        let ended_why: Arc<std::sync::Mutex<Option<Status>>> = Arc::default();
        let why_in = ended_why.clone();
        tokio::spawn(async move {
            let end = end_stream.drop_guard();
            let mut hub_stopping = false;
            loop {
                let next = tokio::select! {
                    biased;
                    // The Nest stopped reading: its link is ended, so is this half.
                    _ = stop_reading.cancelled() => break,
                    // The Hub is stopping: this half ends too (dropping the Nest's request
                    // stream), or the connection would outlive the server and keep a Nest
                    // talking to a stopped Hub instead of reconnecting.
                    _ = core.stopping.cancelled() => {
                        hub_stopping = true;
                        break;
                    }
                    n = malformed::next(&mut incoming) => n,
                    changed = revocations.changed() => {
                        let gone = bound && identities.get(&nest_id).is_none();
                        if changed.is_ok() && !identities.is_revoked(&nest_id) && !gone {
                            continue;
                        }
                        tracing::warn!(nest_id = %nest_id, "nest revoked or forgotten: ending its stream");
                        break;
                    }
                };
                let msg = match next {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(e) => {
                        // tonic cannot resync a stream after a message that does not decode
                        // (its framing is lost), so the link ends, saying why: the Nest
                        // logs it and reconnects at once (its runs are re-adopted).
                        if e.code() == tonic::Code::InvalidArgument {
                            tracing::warn!(nest_id = %nest_id, error = %e.message(), "a nest message does not decode; ending its stream so that it reconnects");
                            if let Ok(mut why) = why_in.lock() {
                                *why = Some(Status::invalid_argument(format!(
                                    "nest stream: {}; the hub ended the stream, reconnect (check that nest and hub versions match)",
                                    e.message()
                                )));
                            }
                        } else {
                            tracing::info!(nest_id = %nest_id, error = %e, "nest stream failed");
                        }
                        break;
                    }
                };
                let result = match msg.msg {
                    Some(pb::nest_message::Msg::Heartbeat(h)) => {
                        let reports: Vec<_> =
                            h.instances.iter().map(convert::instance_report).collect();
                        core.heartbeat(&nest_id, conn_id, &reports)
                    }
                    Some(pb::nest_message::Msg::Instance(r)) => {
                        core.instance_report(&nest_id, conn_id, &convert::instance_report(&r))
                    }
                    Some(pb::nest_message::Msg::RunEvents(batch)) => {
                        let events = batch.events.iter().map(convert::run_event).collect();
                        // Stored now; its acks leave once a flush covers it, while this
                        // loop reads on (group commit across batches and Nests).
                        match core.run_events(&nest_id, &batch.instance_id, events) {
                            Ok(()) => Ok(()),
                            Err(e) if core.keep_link_while_store_broken(&nest_id) => {
                                // Not acked: resent once the store heals (it cuts this link).
                                tracing::warn!(nest_id = %nest_id, error = %e, "run events not stored while the hub store cannot write; the nest resends them once it heals");
                                Ok(())
                            }
                            Err(e) => {
                                // Not stored, not acked: end the stream so that the Nest
                                // reconnects and resends them once the store can write.
                                tracing::warn!(nest_id = %nest_id, error = %e, "run events not stored; closing the nest stream so that it resends them");
                                break;
                            }
                        }
                    }
                    Some(pb::nest_message::Msg::RunDeltas(batch)) => {
                        core.relay_deltas(&nest_id, convert::run_deltas(batch));
                        Ok(())
                    }
                    Some(pb::nest_message::Msg::Settings(s)) => {
                        core.nest_settings(
                            &nest_id,
                            conn_id,
                            s.labels.into_iter().collect(),
                            s.cordon,
                        )
                        .await
                    }
                    Some(pb::nest_message::Msg::Draining(d)) => {
                        core.nest_draining(&nest_id, conn_id, d.grace_ms).await
                    }
                    Some(pb::nest_message::Msg::Leaving(l)) => {
                        if let Err(e) = core.nest_leaving(&nest_id, conn_id, &l.reason).await {
                            tracing::error!(nest_id = %nest_id, error = %e, "cannot record a nest leaving");
                        }
                        break;
                    }
                    Some(pb::nest_message::Msg::Register(_)) => {
                        tracing::warn!(nest_id = %nest_id, "ignoring a second Register on one stream; reconnect to re-register");
                        Ok(())
                    }
                    None => Ok(()),
                };
                if let Err(e) = result {
                    tracing::error!(nest_id = %nest_id, error = %e, "cannot handle a nest message");
                }
            }
            core.disconnect(&nest_id, conn_id);
            if hub_stopping {
                // What is queued for the Nest still leaves (a run dispatched just before the
                // stop reaches it, instead of being lost and given another attempt by the
                // next leader): the outbound half ends once its queue is empty (every sender
                // is gone with the link), or after a second at most.
                let end = end.disarm();
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    end.cancel();
                });
            }
        });

        // Messages leave the queue only as fast as the Nest reads them (HTTP/2 flow control);
        // an overflowed queue ends the stream with a status saying why.
        let out = futures::stream::unfold(Some(rx), move |state| {
            let overflow = overflow.clone();
            async move {
                let mut rx = state?;
                match rx.recv().await {
                    Some(m) => Some((Ok(convert::to_nest(m)), Some(rx))),
                    None if overflow.is_cancelled() && rx.cut_why().is_some() => Some((
                        Err(Status::unavailable(format!(
                            "nest stream: {}",
                            rx.cut_why().unwrap_or_default()
                        ))),
                        None,
                    )),
                    None if overflow.is_cancelled() => Some((
                        Err(Status::resource_exhausted(
                            "nest queue: the nest stopped reading its stream and was disconnected; its runs were handed over",
                        )),
                        None,
                    )),
                    None => None,
                }
            }
        })
        .take_until(ended.cancelled_owned())
        .map(Some)
        .chain(futures::stream::once(async move {
            ended_why
                .lock()
                .ok()
                .and_then(|mut w| w.take())
                .map(Err)
        }))
        .filter_map(|item| async move { item });
        Ok(Response::new(Box::pin(out)))
    }

    async fn put_artifact(
        &self,
        request: Request<Streaming<pb::ArtifactChunk>>,
    ) -> Result<Response<pb::Artifact>, Status> {
        let nest_id = self.cert_nest_id(&request)?;
        let mut stream = request.into_inner();
        let first = malformed::next(&mut stream).await?.ok_or_else(|| {
            HubError::invalid("put_artifact: expected at least one chunk carrying the artifact")
        })?;
        let meta = first.artifact.clone().ok_or_else(|| {
            HubError::invalid("put_artifact: the first chunk must carry `artifact` (namespace, artifact_id, name, size)")
        })?;
        self.core
            .check_nest_artifact_put(nest_id.as_deref(), &meta.namespace, &meta.task_id)?;
        let max = crate::core::artifacts::MAX_ARTIFACT_BYTES;
        if meta.size > max {
            return Err(HubError::ResourceExhausted(format!(
                "artifact {} is {} bytes, more than the limit of 25 MB per artifact; save it in smaller parts",
                meta.name, meta.size
            ))
            .into());
        }
        let mut bytes = first.data;
        while let Some(chunk) = malformed::next(&mut stream).await? {
            if (bytes.len() + chunk.data.len()) as u64 > max.min(meta.size) {
                return Err(HubError::invalid(format!(
                    "put_artifact: artifact {} sent more than its announced {} bytes (limit 25 MB)",
                    meta.name, meta.size
                ))
                .into());
            }
            bytes.extend_from_slice(&chunk.data);
        }
        if bytes.len() as u64 != meta.size {
            return Err(HubError::invalid(format!(
                "put_artifact: artifact {} announced {} bytes but sent {}; send it again",
                meta.name,
                meta.size,
                bytes.len()
            ))
            .into());
        }
        let rec = crate::core::artifacts::ArtifactRec {
            namespace: meta.namespace,
            id: meta.artifact_id,
            name: meta.name,
            media_type: meta.media_type,
            size: meta.size,
            task_id: meta.task_id,
            created_at_ms: 0,
        };
        let stored = self.core.put_artifact(rec, bytes).await?;
        Ok(Response::new(convert::artifact(&stored)))
    }

    type ReadArtifactStream = Stream_<pb::ArtifactChunk>;

    async fn read_artifact(
        &self,
        request: Request<pb::GetArtifactRequest>,
    ) -> Result<Response<Self::ReadArtifactStream>, Status> {
        let nest_id = self.cert_nest_id(&request)?;
        let r = request.into_inner();
        self.core
            .check_nest_artifact_read(nest_id.as_deref(), &r.namespace)?;
        let (rec, bytes) = self.core.artifact(&r.namespace, &r.artifact_id)?;
        let chunks = convert::artifact_chunks(&rec, &bytes);
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    type FetchBundleStream = Stream_<pb::BundleChunk>;

    async fn fetch_bundle(
        &self,
        request: Request<pb::FetchBundleRequest>,
    ) -> Result<Response<Self::FetchBundleStream>, Status> {
        self.cert_nest_id(&request)?;
        let digest = request.into_inner().digest;
        if digest.is_empty() {
            return Err(HubError::invalid("digest: expected sha256:<hex> of a bundle").into());
        }
        let bytes = self
            .core
            .bundle_bytes(&digest)?
            .ok_or_else(|| HubError::not_found(format!("bundle {digest} not found on the hub")))?;
        let total = bytes.len() as u64;
        let mut chunks: Vec<pb::BundleChunk> = bytes
            .chunks(CHUNK)
            .map(|c| pb::BundleChunk {
                digest: String::new(),
                total_size: 0,
                data: c.to_vec(),
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(pb::BundleChunk::default());
        }
        if let Some(first) = chunks.first_mut() {
            first.digest = digest;
            first.total_size = total;
        }
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    async fn send_logs(
        &self,
        request: Request<Streaming<pb::LogChunk>>,
    ) -> Result<Response<pb::SendLogsResponse>, Status> {
        let nest_id = self.cert_nest_id(&request)?;
        let mut stream = request.into_inner();
        super::logs::answer(&self.logs, nest_id.as_deref(), &mut stream).await?;
        Ok(Response::new(pb::SendLogsResponse {}))
    }

    async fn join(
        &self,
        request: Request<pb::JoinRequest>,
    ) -> Result<Response<pb::JoinResponse>, Status> {
        let Some(tls) = self.tls.as_ref().map(|t| t.hub()) else {
            return Err(Status::failed_precondition(
                "join: a plaintext hub issues no certificates; connect with the join token alone",
            ));
        };
        let key = agen_shared::tls::csr_key_sha256(&request.get_ref().csr_pem)
            .map_err(|e| HubError::invalid(format!("join: {e}")))?;
        let r = request.get_ref();
        let grant = self.nests.join_grant(&r.nest_id, &key)?;
        // A Nest that joined before ids were bound is bound on its first call; until then it
        // is known by its live link, which a Join never takes over either.
        if grant == JoinGrant::Bind && self.core.nest_connected(&r.nest_id) {
            return Err(Status::permission_denied(format!(
                "join: nest id {} is connected to this hub right now; a join cannot take over a live nest",
                r.nest_id
            )));
        }
        // Renewal with the Nest's own certificate needs no join token; anything else does.
        let renewing_itself = grant == JoinGrant::Renew
            && peer_nest(&request)?.is_some_and(|(id, k)| id == r.nest_id && k == key);
        let join_token = if renewing_itself {
            None
        } else {
            Some(self.join_token(&request, "Join")?)
        };
        let r = request.into_inner();
        let cert_pem = tls
            .sign_nest_csr(&r.csr_pem, &r.nest_id)
            .map_err(|e| HubError::invalid(format!("join: {e}")))?;
        if let Some(t) = &join_token {
            self.tokens.use_join(&t.id)?;
        }
        if grant == JoinGrant::Bind {
            self.nests.bind(&r.nest_id, &r.name, &key)?;
        }
        self.core.db.flush().await.map_err(HubError::from)?;
        tracing::info!(
            nest_id = %r.nest_id,
            name = %r.name,
            renewal = grant == JoinGrant::Renew,
            join_token = join_token.as_ref().map(|t| t.id.as_str()).unwrap_or("-"),
            "issued a nest certificate"
        );
        Ok(Response::new(pb::JoinResponse {
            cert_pem,
            // The CAs to trust, the signer first (both during a CA rotation).
            ca_pem: tls.trust_pem.clone(),
        }))
    }

    async fn start_child(
        &self,
        request: Request<pb::StartChildRequest>,
    ) -> Result<Response<pb::StartChildResponse>, Status> {
        super::delegates::start_child(self, request).await
    }

    async fn wait_child(
        &self,
        request: Request<pb::WaitChildRequest>,
    ) -> Result<Response<pb::WaitChildResponse>, Status> {
        super::delegates::wait_child(self, request).await
    }

    async fn cancel_child(
        &self,
        request: Request<pb::CancelChildRequest>,
    ) -> Result<Response<pb::CancelChildResponse>, Status> {
        super::delegates::cancel_child(self, request).await
    }

    type FetchRunContextStream = Stream_<pb::RunContextChunk>;

    async fn fetch_run_context(
        &self,
        request: Request<pb::FetchRunContextRequest>,
    ) -> Result<Response<Self::FetchRunContextStream>, Status> {
        let chunks = super::run_context::fetch_run_context(self, request)
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }
}
