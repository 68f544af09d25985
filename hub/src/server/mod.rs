//! The gRPC edge: `AgenService` (API tokens resolved to a principal, one authorization check
//! per handler, an audit record per mutating call), `NestService` (a join token for `Join`; on
//! a TLS Hub every other call needs the Nest's client certificate instead), health and
//! reflection (no token). Only this module knows protobuf.

mod agen;
mod agen_api;
mod approvals;
mod artifacts;
pub mod auth;
mod auth_table;
mod console;
mod convert;
mod delegates;
mod lifecycle;
mod logs;
mod malformed;
mod nest;
mod nest_api;
mod ops;
mod run_context;
mod secrets;
mod task_lists;
mod tokens;
mod triggers;
mod watch_deltas;

pub use malformed::layer as malformed_request_layer;

use std::sync::Arc;

use agen_proto::v1::agen_service_server::AgenServiceServer;
use agen_proto::v1::nest_service_server::NestServiceServer;
use tonic::service::Routes;

use crate::core::Core;
use crate::error::{HubError, Result};

/// Largest gRPC message accepted and sent (above every field limit of the limit table).
const MAX_MESSAGE: usize = crate::limits::MAX_MESSAGE_BYTES;

/// `AgenService` as the Hub serves it: the audit record around the token check around the
/// handlers. The web console calls this same stack in process.
pub(crate) type ApiStack = auth::Audited<
    tonic::service::interceptor::InterceptedService<
        AgenServiceServer<agen::AgenApi>,
        auth::ApiAuth,
    >,
>;

/// Builds every service of the Hub (the web console under `/ui/` included).
#[allow(clippy::too_many_arguments)]
pub async fn routes(
    core: Arc<Core>,
    tokens: Arc<crate::tokens::Tokens>,
    gate: Arc<crate::conn_gate::ConnGate>,
    nests: Arc<crate::tokens::nests::NestIdentities>,
    tls: Option<Arc<crate::tls_live::LiveTls>>,
    live_tls: Arc<crate::tls_live::LiveTls>,
    public_url: String,
    role: Arc<crate::role::Role>,
) -> Result<Routes> {
    let api_auth = auth::ApiAuth {
        tokens: tokens.clone(),
        gate: gate.clone(),
    };
    let access = Arc::new(tokens::AccessApi {
        core: core.clone(),
        tokens: tokens.clone(),
        nests: nests.clone(),
        tls: live_tls,
    });
    let log_requests = crate::logs::LogRequests::new();
    let agen_api = AgenServiceServer::new(agen::AgenApi {
        core: core.clone(),
        access,
        logs: log_requests.clone(),
        public_url,
    })
    .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
    .send_compressed(tonic::codec::CompressionEncoding::Gzip)
    .max_decoding_message_size(MAX_MESSAGE)
    .max_encoding_message_size(MAX_MESSAGE);
    let db = core.db.clone();
    let nest_api_of = || nest::NestApi {
        core: core.clone(),
        tls: tls.clone(),
        tokens: tokens.clone(),
        nests: nests.clone(),
        logs: log_requests.clone(),
        gate: gate.clone(),
    };
    // `Join` comes before authentication: its own instance, with the small message limit.
    let nest_join = NestServiceServer::new(nest_api_of())
        .max_decoding_message_size(crate::conn_gate::PRE_AUTH_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE);
    // Every other call needs the Nest certificate on a TLS Hub: refused before its message is
    // read (the handlers then check the certificate's id, key and revocation).
    let tls_hub = tls.is_some();
    let nest_api = tonic::service::interceptor::InterceptedService::new(
        NestServiceServer::new(nest_api_of())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE),
        move |r: tonic::Request<()>| {
            if tls_hub && r.peer_certs().is_none() {
                return Err(tonic::Status::unauthenticated(
                    "nest calls need the certificate from Join; restart the nest to re-join",
                ));
            }
            Ok(r)
        },
    );

    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AgenServiceServer<agen::AgenApi>>()
        .await;
    health_reporter
        .set_serving::<NestServiceServer<nest::NestApi>>()
        .await;
    // Health follows the store and the reconcile loop: NOT_SERVING while the store cannot
    // write or the loop has not finished a pass for a while (checked each second).
    let mut store_ok = core.store_ok.subscribe();
    let health_core = core.clone();
    tokio::spawn(async move {
        let mut was = true;
        loop {
            tokio::select! {
                changed = store_ok.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                _ = health_core.stopping.cancelled() => return,
            }
            let ok = crate::core::reconcile::serving(
                *store_ok.borrow_and_update(),
                health_core
                    .reconciled_at_ms
                    .load(std::sync::atomic::Ordering::Relaxed),
                crate::model::now_ms(),
            );
            if ok == was {
                continue;
            }
            was = ok;
            if !ok {
                tracing::warn!(
                    "health: NOT_SERVING (the store cannot write or the reconcile loop is stalled)"
                );
            }
            let status = if ok {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            for service in [
                "",
                <AgenServiceServer<agen::AgenApi> as tonic::server::NamedService>::NAME,
                <NestServiceServer<nest::NestApi> as tonic::server::NamedService>::NAME,
            ] {
                health_reporter.set_service_status(service, status).await;
            }
        }
    });
    // Reflection lists the public API, health and reflection itself; the internal
    // NestService is not advertised (Nests know it; callers have no use for it).
    let advertised = [
        <AgenServiceServer<agen::AgenApi> as tonic::server::NamedService>::NAME,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    let reflection = || {
        advertised.iter().fold(
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(agen_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |b, name| b.with_service_name(*name),
        )
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| HubError::Serve(format!("reflection: {e}")))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| HubError::Serve(format!("reflection: {e}")))?;

    let api: ApiStack = auth::Audited {
        inner: tonic::service::interceptor::InterceptedService::new(agen_api, api_auth),
        db,
        refusals: core.refusals.clone(),
    };
    let console = console::router(core.clone(), tokens.clone(), gate, api.clone());
    let mut routes = Routes::builder();
    routes
        .add_service(api)
        .add_service(nest_api)
        .add_service(
            reflection_v1.max_decoding_message_size(crate::conn_gate::PRE_AUTH_MESSAGE_BYTES),
        )
        .add_service(
            reflection_v1alpha.max_decoding_message_size(crate::conn_gate::PRE_AUTH_MESSAGE_BYTES),
        );
    let join = tower::ServiceExt::map_request(nest_join, |r: http::Request<axum::body::Body>| {
        r.map(tonic::body::Body::new)
    });
    // Health answers carry the role (leader, epoch) in their metadata.
    let router = crate::role::health_route(
        routes.routes().into_axum_router(),
        health.max_decoding_message_size(crate::conn_gate::PRE_AUTH_MESSAGE_BYTES),
        role,
    )
    .route_service("/agen.v1.NestService/Join", join)
    .merge(console);
    Ok(Routes::from(router))
}
