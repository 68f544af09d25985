//! `agen tasks webhooks TASK`: a task's webhook deliveries and how their attempts went.

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::{status_error, ClientArgs, Output};
use crate::view;

pub async fn run(task: String, client: ClientArgs) -> anyhow::Result<i32> {
    let mut hub = client.connect()?;
    let deliveries = hub
        .client
        .list_task_webhooks(pb::ListTaskWebhooksRequest {
            namespace: hub.namespace.clone(),
            task_id: task.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner()
        .deliveries;
    match client.output {
        Output::Json | Output::Yaml => view::print_value(
            client.output,
            &Value::Array(deliveries.iter().map(delivery_json).collect()),
        ),
        Output::Table => {
            let mut t = view::table(&[
                "DELIVERY", "EVENT", "URL", "STATE", "ATTEMPTS", "LAST", "NEXT",
            ]);
            for d in &deliveries {
                let last = match (d.last_status, d.last_error.as_str()) {
                    (0, "") => "-".to_string(),
                    (s, "") => format!("HTTP {s}"),
                    (_, e) => e.to_string(),
                };
                t.add_row(vec![
                    d.delivery_id.clone(),
                    d.event.clone(),
                    d.url.clone(),
                    d.state.clone(),
                    d.attempts.to_string(),
                    last,
                    if d.state == "pending" {
                        view::time(d.next_attempt_at_ms)
                            .as_str()
                            .unwrap_or("-")
                            .to_string()
                    } else {
                        "-".into()
                    },
                ]);
            }
            if deliveries.is_empty() {
                crate::outln!("no webhook deliveries for task {task}");
            } else {
                crate::outln!("{t}");
            }
        }
    }
    Ok(0)
}

/// A delivery as `-o json` shows it (the Python SDK reads the same).
pub fn delivery_json(d: &pb::WebhookDelivery) -> Value {
    json!({
        "delivery_id": d.delivery_id,
        "url": d.url,
        "event": d.event,
        "state": d.state,
        "attempts": d.attempts,
        "created_at": view::time(d.created_at_ms),
        "next_attempt_at": view::time(d.next_attempt_at_ms),
        "last_status": d.last_status,
        "last_error": d.last_error,
        "delivered_at": view::time(d.delivered_at_ms),
    })
}
