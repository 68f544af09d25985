//! The gRPC edge: `AgenService` (admin token), `NestService` (join token; on a TLS Hub every
//! call but `Join` also needs the Nest's client certificate), health and reflection (no token).
//! Only this module knows protobuf.

mod agen;
pub mod auth;
mod convert;
mod lifecycle;
mod nest;

use std::sync::Arc;

use agen_proto::v1::agen_service_server::AgenServiceServer;
use agen_proto::v1::nest_service_server::NestServiceServer;
use tonic::service::Routes;

use crate::error::{HubError, Result};
use crate::fleet::Core;

/// Largest gRPC message accepted (bundle chunks are far smaller).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Builds every service of the Hub.
pub async fn routes(
    core: Arc<Core>,
    admin_token: String,
    join_tokens: Vec<String>,
    tls: Option<Arc<agen_shared::tls::HubTls>>,
) -> Result<Routes> {
    let admin = auth::BearerAuth::new(vec![admin_token], "admin token");
    let join = auth::BearerAuth::new(join_tokens, "join token");
    let agen_api = AgenServiceServer::new(agen::AgenApi { core: core.clone() })
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        .send_compressed(tonic::codec::CompressionEncoding::Gzip)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let nest_api = NestServiceServer::new(nest::NestApi { core, tls })
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);

    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<AgenServiceServer<agen::AgenApi>>()
        .await;
    health_reporter
        .set_serving::<NestServiceServer<nest::NestApi>>()
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(agen_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| HubError::Serve(format!("reflection: {e}")))?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(agen_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| HubError::Serve(format!("reflection: {e}")))?;

    let mut routes = Routes::builder();
    routes
        .add_service(tonic::service::interceptor::InterceptedService::new(
            agen_api,
            move |r| admin.check(r),
        ))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            nest_api,
            move |r| join.check(r),
        ))
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    Ok(routes.routes())
}
