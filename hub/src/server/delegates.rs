//! `NestService` `StartChild` / `WaitChild` / `CancelChild`: the gRPC edge of delegate calls
//! (protobuf ⇄ [`crate::core::delegates`]). The calling Nest is named by its certificate; the core
//! checks that it holds the parent run's lease.

use std::time::Duration;

use agen_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::convert;
use super::nest_api::NestApi;
use crate::core::delegates::{ChildSpec, Parent};
use crate::error::HubError;
use crate::limits::{self, check_id};

fn parent(p: Option<pb::ChildParent>, nest_id: Option<String>) -> Result<Parent, Status> {
    let p = p.ok_or_else(|| {
        HubError::invalid("parent: expected the calling run (task, run, attempt, instance)")
    })?;
    check_id("parent.task_id", &p.task_id)?;
    check_id("parent.run_id", &p.run_id)?;
    check_id("parent.instance_id", &p.instance_id)?;
    Ok(Parent {
        task_id: p.task_id,
        run_id: p.run_id,
        attempt: p.attempt,
        instance_id: p.instance_id,
        nest_id,
    })
}

pub(super) async fn start_child(
    api: &NestApi,
    request: Request<pb::StartChildRequest>,
) -> Result<Response<pb::StartChildResponse>, Status> {
    let nest_id = api.cert_nest_id(&request)?;
    let r = request.into_inner();
    let p = parent(r.parent, nest_id)?;
    if !r.namespace.is_empty() {
        limits::validate_name("namespace", &r.namespace)?;
    }
    limits::validate_name("deployment", &r.deployment)?;
    api.core.opts.limits.check_input(&r.input)?;
    api.core
        .opts
        .limits
        .check_conversation_key(&r.conversation_key)?;
    limits::check_bytes("parent_span_id", &r.parent_span_id, 64)?;
    limits::check_bytes(
        "idempotency_key",
        &r.idempotency_key,
        crate::core::tasks::MAX_CLIENT_REQUEST_ID_BYTES,
    )?;
    let child = api
        .core
        .start_child(
            &p,
            ChildSpec {
                namespace: r.namespace,
                deployment: r.deployment,
                input: r.input,
                conversation_key: r.conversation_key,
                idempotency_key: r.idempotency_key,
                parent_span_id: r.parent_span_id,
            },
        )
        .await?;
    Ok(Response::new(pb::StartChildResponse {
        task_id: child.task_id,
        namespace: child.namespace,
    }))
}

pub(super) async fn wait_child(
    api: &NestApi,
    request: Request<pb::WaitChildRequest>,
) -> Result<Response<pb::WaitChildResponse>, Status> {
    let nest_id = api.cert_nest_id(&request)?;
    let r = request.into_inner();
    let p = parent(r.parent, nest_id)?;
    check_id("child_task_id", &r.child_task_id)?;
    let end = api
        .core
        .wait_child(&p, &r.child_task_id, Duration::from_millis(r.wait_ms))
        .await?;
    Ok(Response::new(pb::WaitChildResponse {
        done: end.done,
        state: convert::task_state(end.state) as i32,
        result: end.result,
        response_type: end.response_type,
        artifacts: end.artifacts,
    }))
}

pub(super) async fn cancel_child(
    api: &NestApi,
    request: Request<pb::CancelChildRequest>,
) -> Result<Response<pb::CancelChildResponse>, Status> {
    let nest_id = api.cert_nest_id(&request)?;
    let r = request.into_inner();
    let p = parent(r.parent, nest_id)?;
    check_id("child_task_id", &r.child_task_id)?;
    limits::check_bytes("reason", &r.reason, 4096)?;
    api.core
        .cancel_child(&p, &r.child_task_id, &r.reason)
        .await?;
    Ok(Response::new(pb::CancelChildResponse {}))
}
