//! The state every `NestService` handler shares ([`NestApi`]) and the check that names the
//! calling Nest from its certificate ([`NestApi::cert_nest_id`]), below the handler files
//! (`nest.rs`, `delegates.rs`, `run_context.rs`) so none of them imports another to reach it.

use std::sync::Arc;

use tonic::{Request, Status};

use crate::core::Core;
use crate::tokens::nests::NestIdentities;
use crate::tokens::Tokens;

/// The `NestService` handlers' state.
pub struct NestApi {
    pub core: Arc<Core>,
    /// The Hub's TLS material (signs Nest certificates); `None` on a plaintext Hub.
    pub tls: Option<Arc<crate::tls_live::LiveTls>>,
    /// Join tokens.
    pub tokens: Arc<Tokens>,
    /// Which key each nest id is bound to; revoked Nests.
    pub nests: Arc<NestIdentities>,
    /// Log requests waiting for a Nest's `SendLogs`.
    pub logs: Arc<crate::logs::LogRequests>,
    /// Told when a plaintext Nest's call passed its join-token check.
    pub gate: Arc<crate::conn_gate::ConnGate>,
}

/// The nest id and key sha256 of a request's verified client certificate, if it has one.
pub(super) fn peer_nest<T>(request: &Request<T>) -> Result<Option<(String, String)>, Status> {
    let certs = request.peer_certs();
    let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else {
        return Ok(None);
    };
    let id = agen_shared::tls::nest_id_of_cert(leaf.as_ref())
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    let key = agen_shared::tls::cert_key_sha256(leaf.as_ref())
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    Ok(Some((id, key)))
}

impl NestApi {
    /// The request's join token, checked; a refusal goes to the audit log, rate-limited.
    pub(super) fn join_token<T>(
        &self,
        request: &Request<T>,
        call: &str,
    ) -> Result<crate::tokens::TokenRec, Status> {
        self.tokens
            .check_join(super::auth::bearer(request).as_deref())
            .map_err(|e| {
                self.core.refusals.note(
                    request.remote_addr(),
                    crate::tokens::refusals::Kind::GrpcUnauthenticated,
                    crate::tokens::refusals::Refusal {
                        call: call.to_string(),
                        message: e.to_string(),
                        ..Default::default()
                    },
                );
                Status::from(e)
            })
    }

    /// The nest id named by the caller's verified client certificate, checked against the key
    /// its id is bound to and against revocation; `None` on a plaintext Hub, which checks the
    /// join token instead (no certificates there).
    pub(super) fn cert_nest_id<T>(&self, request: &Request<T>) -> Result<Option<String>, Status> {
        if self.tls.is_none() {
            self.join_token(request, "NestService")?;
            self.gate.authenticated(request.remote_addr());
            return Ok(None);
        }
        let Some((id, key)) = peer_nest(request)? else {
            return Err(Status::unauthenticated(
                "nest calls need the certificate from Join; restart the nest to re-join",
            ));
        };
        self.nests.check_caller(&id, &key)?;
        Ok(Some(id))
    }
}
