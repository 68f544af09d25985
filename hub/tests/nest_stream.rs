//! A Nest stream carrying a message that does not decode, hand-built below the typed client:
//! the Hub ends that link with `INVALID_ARGUMENT` saying why (tonic cannot resync a stream
//! whose framing a bad message broke), and the Nest reconnects at once.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use prost::Message;
use support::*;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Identity;

/// `NestMessage` on the wire, with its oneof fields as raw bytes (so a test can send a
/// `heartbeat` that is not a `Heartbeat`).
#[derive(Clone, PartialEq, prost::Message)]
struct RawNestMessage {
    #[prost(bytes = "vec", tag = "1")]
    register: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    heartbeat: Vec<u8>,
}

#[tokio::test]
async fn an_undecodable_nest_message_ends_the_link_with_the_reason_and_the_nest_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(10)).await;
    let (cert, key) = hub.join("nest-x").await;
    let channel = hub.channel_with(Some(Identity::from_pem(cert, key))).await;
    let mut grpc = tonic::client::Grpc::new(InterceptedService::new(
        channel,
        Bearer::new(&hub.join_token),
    ));
    grpc.ready().await.expect("channel ready");

    let (tx, rx) = tokio::sync::mpsc::channel::<RawNestMessage>(8);
    let register = pb::Register {
        nest_id: "nest-x".into(),
        name: "nest-x-name".into(),
        version: "test".into(),
        protocol_version: agen_shared::version::Protocol::CURRENT.to_string(),
        ..Default::default()
    };
    tx.send(RawNestMessage {
        register: register.encode_to_vec(),
        heartbeat: Vec::new(),
    })
    .await
    .unwrap();
    let mut inbound = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            PathAndQuery::from_static("/agen.v1.NestService/Connect"),
            tonic_prost::ProstCodec::<RawNestMessage, pb::HubMessage>::default(),
        )
        .await
        .expect("connect")
        .into_inner();
    let first = inbound.message().await.expect("registered").expect("open");
    assert!(
        matches!(first.msg, Some(pb::hub_message::Msg::Registered(_))),
        "{first:?}"
    );

    // A heartbeat whose body is not a Heartbeat (field 1 says 5 bytes follow, none do).
    tx.send(RawNestMessage {
        register: Vec::new(),
        heartbeat: vec![0x0a, 0x05],
    })
    .await
    .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match inbound.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the hub ended the link without saying why"),
                Err(s) => return s,
            }
        }
    })
    .await
    .expect("the hub answers the bad message within 10s");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("not a valid protobuf message")
            && status.message().contains("reconnect"),
        "{}",
        status.message()
    );

    // The Nest reconnects at once and is ready again.
    let (_nest, registered) = FakeNest::connect(&hub, "nest-x", &[], vec![]).await;
    assert_eq!(registered.nest_id, "nest-x");
    let api = hub.client().await;
    let nests = eventually("nest-x ready again", Duration::from_secs(5), || {
        let mut api = api.clone();
        async move {
            let nests = api
                .list_nests(pb::ListNestsRequest::default())
                .await
                .ok()?
                .into_inner()
                .nests;
            nests
                .iter()
                .any(|n| n.nest_id == "nest-x" && n.state == pb::NestState::Ready as i32)
                .then_some(nests)
        }
    })
    .await;
    assert_eq!(nests.len(), 1);
}
