//! Per-Nest certificates (mTLS) on the Nest↔Hub link: `Join` signs a CSR with the Hub's CA,
//! every other `NestService` call needs that certificate, a Nest registers only as the nest its
//! certificate names, and a plaintext (loopback) Hub keeps trusting the join token alone.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use agen_shared::tls;
use pretty_assertions::assert_eq;
use support::*;
use tonic::transport::Identity;

const TTL: Duration = Duration::from_secs(10);

fn register(nest_id: &str) -> pb::NestMessage {
    msg(pb::nest_message::Msg::Register(pb::Register {
        nest_id: nest_id.into(),
        name: format!("{nest_id}-name"),
        labels: Default::default(),
        capacity: 0,
        version: "test".into(),
        instances: vec![],
        fallback_name: String::new(),
        separation: String::new(),
        network: String::new(),
        protocol_version: agen_shared::version::Protocol::CURRENT.to_string(),
        commit: String::new(),
        cpu_millis: 0,
        memory_bytes: 0,
        resources: String::new(),
    }))
}

/// Opens `Connect` with `client`, sends Register for `nest_id`; returns the first answer.
async fn connect_as(
    client: &mut NestApi,
    nest_id: &str,
) -> Result<pb::hub_message::Msg, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(register(nest_id)).await.expect("queue register");
    let mut stream = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an answer within 10s")?;
    Ok(first.and_then(|m| m.msg).expect("the hub answers Register"))
}

#[tokio::test]
async fn join_signs_a_csr_for_the_nest_with_the_hub_ca() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(dir.path(), TTL).await;
    let (key, csr_pem) = tls::nest_key_and_csr("nest-a").unwrap();
    let response = hub
        .nest_client()
        .await
        .join(pb::JoinRequest {
            nest_id: "nest-a".into(),
            name: "a".into(),
            csr_pem,
        })
        .await
        .unwrap()
        .into_inner();
    let ca_pem = std::fs::read_to_string(&hub.ca_file).unwrap();
    assert_eq!(response.ca_pem.trim(), ca_pem.trim());
    assert!(tls::nest_cert_is_current(
        &response.cert_pem,
        &ca_pem,
        "nest-a"
    ));
    let der = tls::pem_certs(&response.cert_pem).remove(0);
    assert_eq!(tls::nest_id_of_cert(&der).unwrap(), "nest-a");

    // The issued certificate and key are accepted for the nest's own registration.
    let channel = hub
        .channel_with(Some(Identity::from_pem(&response.cert_pem, key)))
        .await;
    let mut client = agen_proto::v1::nest_service_client::NestServiceClient::with_interceptor(
        channel,
        Bearer::new(&hub.join_token),
    );
    let first = connect_as(&mut client, "nest-a").await.unwrap();
    assert!(
        matches!(first, pb::hub_message::Msg::Registered(_)),
        "{first:?}"
    );
}

#[tokio::test]
async fn join_needs_the_join_token_and_a_valid_csr() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(dir.path(), TTL).await;
    let (_, csr_pem) = tls::nest_key_and_csr("nest-a").unwrap();
    let mut admin = agen_proto::v1::nest_service_client::NestServiceClient::with_interceptor(
        hub.channel().await,
        Bearer::new(&hub.admin_token),
    );
    let err = admin
        .join(pb::JoinRequest {
            nest_id: "nest-a".into(),
            name: "a".into(),
            csr_pem,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");

    let err = hub
        .nest_client()
        .await
        .join(pb::JoinRequest {
            nest_id: "nest-a".into(),
            name: "a".into(),
            csr_pem: "not a csr".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    assert!(
        err.message().contains("certificate signing request"),
        "{err}"
    );
}

#[tokio::test]
async fn nest_calls_without_a_client_certificate_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(dir.path(), TTL).await;
    let mut client = hub.nest_client().await;
    let err = connect_as(&mut client, "nest-a").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    assert!(
        err.message()
            .contains("nest calls need the certificate from Join"),
        "{err}"
    );
    let err = client
        .fetch_bundle(pb::FetchBundleRequest {
            digest: "sha256:00".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
    let err = client
        .read_artifact(pb::GetArtifactRequest {
            namespace: "default".into(),
            artifact_id: "sha256:00".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err}");
}

#[tokio::test]
async fn a_certificate_for_nest_a_cannot_register_as_nest_b() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(dir.path(), TTL).await;
    let mut client = hub.nest_client_as("nest-a").await;
    let err = connect_as(&mut client, "nest-b").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    assert!(err.message().contains("issued to nest `nest-a`"), "{err}");

    let mut api = hub.client().await;
    let nests = api
        .list_nests(pb::ListNestsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nests;
    assert_eq!(nests, vec![]);
}

#[tokio::test]
async fn a_plaintext_hub_keeps_the_join_token_alone_and_issues_no_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path(), TTL);
    opts.insecure_plaintext = true;
    let hub = TestHub::start_with(opts).await;
    let channel = tonic::transport::Endpoint::from_shared(hub.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = agen_proto::v1::nest_service_client::NestServiceClient::with_interceptor(
        channel,
        Bearer::new(&hub.join_token),
    );
    let first = connect_as(&mut client, "nest-a").await.unwrap();
    assert!(
        matches!(first, pb::hub_message::Msg::Registered(_)),
        "{first:?}"
    );
    let (_, csr_pem) = tls::nest_key_and_csr("nest-a").unwrap();
    let err = client
        .join(pb::JoinRequest {
            nest_id: "nest-a".into(),
            name: "a".into(),
            csr_pem,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
}
