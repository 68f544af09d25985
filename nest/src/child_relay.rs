//! The Nest's delegate relay: a run's `call_agent` / `start_agent` (socket message
//! [`ToNest::Child`]) becomes the Hub's `NestService/StartChild`, `WaitChild` or `CancelChild`
//! (unary calls beside the `Connect` stream, so a long wait never delays a heartbeat).
//!
//! Invariants: only a run the asking instance holds, at its current attempt, may ask
//! (checked by the supervisor before the relay; the Hub checks the lease again); the instance
//! id is the Nest's own record, never the instance's word; every request is answered with
//! exactly one [`ChildReply`].
//!
//! [`ToNest::Child`]: crate::socket::ToNest::Child

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::bundles::BundleCache;
use crate::model::RunLease;
use crate::socket::{ChildCall, ChildOp, ChildReply, ToInstance};

/// Serves one child request of instance `instance_id` in the background; the answer goes to
/// `reply` (the instance's connection).
pub fn relay(
    bundles: Arc<BundleCache>,
    instance_id: String,
    reply: mpsc::UnboundedSender<ToInstance>,
    call: ChildCall,
) {
    tokio::spawn(async move {
        let req = call.req;
        let answer = match ask(&bundles, &instance_id, call).await {
            Ok(r) => r,
            Err(error) => {
                tracing::info!(instance = %instance_id, "child request failed: {error}");
                ChildReply {
                    req,
                    error: Some(error),
                    ..Default::default()
                }
            }
        };
        let _ = reply.send(ToInstance::ChildReply(answer));
    });
}

async fn ask(
    bundles: &BundleCache,
    instance_id: &str,
    call: ChildCall,
) -> Result<ChildReply, String> {
    let mut client = bundles.hub_client().await.map_err(|e| e.to_string())?;
    let parent = RunLease {
        task_id: call.task_id.into(),
        run_id: call.run_id.into(),
        attempt: call.attempt.into(),
        instance_id: instance_id.into(),
    };
    let status = |e: crate::hub_client::CallError| format!("the hub refused: {}", e.message);
    let mut out = ChildReply {
        req: call.req,
        ..Default::default()
    };
    match call.op {
        ChildOp::Start(c) => {
            out.task_id = Some(client.start_child(&parent, c).await.map_err(status)?);
        }
        ChildOp::Wait {
            child_task_id,
            wait_ms,
        } => {
            out.end = client
                .wait_child(&parent, child_task_id, wait_ms)
                .await
                .map_err(status)?;
        }
        ChildOp::Cancel {
            child_task_id,
            reason,
        } => {
            client
                .cancel_child(&parent, child_task_id, reason)
                .await
                .map_err(status)?;
        }
    }
    Ok(out)
}
