//! `NestService` `FetchRunContext`: the gRPC edge of [`crate::core::run_context`]. The calling
//! Nest is named by its certificate; the core checks that it holds the run's lease. The
//! history's JSON text, then the replay's, go out in chunks of at most [`CHUNK`] bytes of data,
//! the first announcing both totals.

use agen_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::nest_api::NestApi;
use crate::core::run_context::{ContextAsk, RunContext};
use crate::limits::check_id;

/// Data bytes (history + replay) per `RunContextChunk` at most.
pub const CHUNK: usize = 1024 * 1024;

pub(super) async fn fetch_run_context(
    api: &NestApi,
    request: Request<pb::FetchRunContextRequest>,
) -> Result<Response<Vec<pb::RunContextChunk>>, Status> {
    let nest_id = api.cert_nest_id(&request)?;
    let r = request.into_inner();
    check_id("task_id", &r.task_id)?;
    check_id("run_id", &r.run_id)?;
    check_id("instance_id", &r.instance_id)?;
    let ask = ContextAsk {
        task_id: r.task_id,
        run_id: r.run_id,
        attempt: r.attempt,
        instance_id: r.instance_id,
        nest_id,
    };
    let context = api.core.run_context(&ask).await?;
    Ok(Response::new(chunks(context)))
}

/// The context in chunks: history parts first, then replay parts, each chunk at most
/// [`CHUNK`] bytes of data; always at least one chunk (it carries the totals).
pub fn chunks(c: RunContext) -> Vec<pb::RunContextChunk> {
    let mut out: Vec<pb::RunContextChunk> = c
        .history_json
        .chunks(CHUNK)
        .map(|h| pb::RunContextChunk {
            history: h.to_vec(),
            ..Default::default()
        })
        .chain(c.replay_json.chunks(CHUNK).map(|r| pb::RunContextChunk {
            replay: r.to_vec(),
            ..Default::default()
        }))
        .collect();
    if out.is_empty() {
        out.push(pb::RunContextChunk::default());
    }
    if let Some(first) = out.first_mut() {
        first.history_size = c.history_json.len() as u64;
        first.replay_size = c.replay_json.len() as u64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_stay_under_the_limit_and_add_up() {
        let c = RunContext {
            history_json: vec![b'h'; 2 * CHUNK + 5],
            replay_json: vec![b'r'; CHUNK + 1],
        };
        let out = chunks(c.clone());
        assert_eq!(out.len(), 5);
        assert!(out
            .iter()
            .all(|k| k.history.len() + k.replay.len() <= CHUNK));
        assert_eq!(
            (out[0].history_size, out[0].replay_size),
            (2 * CHUNK as u64 + 5, CHUNK as u64 + 1)
        );
        assert!(out[1..]
            .iter()
            .all(|k| k.history_size == 0 && k.replay_size == 0));
        let history: Vec<u8> = out.iter().flat_map(|k| k.history.clone()).collect();
        let replay: Vec<u8> = out.iter().flat_map(|k| k.replay.clone()).collect();
        assert_eq!((history, replay), (c.history_json, c.replay_json));
        assert_eq!(chunks(RunContext::default()).len(), 1);
    }
}
