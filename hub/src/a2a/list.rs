//! `ListTasks`: the tasks of one deployment in the namespace of the URL (the caller's token may
//! submit there, so it sees that namespace's tasks and no other's), most recently updated first,
//! filtered by `contextId`, `status` and `statusTimestampAfter`, a page of `pageSize` (1 to
//! [`MAX_PAGE_SIZE`], default [`DEFAULT_PAGE_SIZE`]) that also ends once its tasks reach about
//! [`MAX_PAGE_BYTES`]; `historyLength` cuts each task's history, artifacts only with
//! `includeArtifacts`. The page token is opaque to the client: the update time and id of the
//! page's last task (base64url), so the next page starts after it.

use base64::Engine;

use super::methods::{history_length, invalid, Call};
use super::types::*;
use super::view;
use crate::model::{TaskRec, TaskState as AgenState};

/// Tasks per page unless the request says otherwise.
pub const DEFAULT_PAGE_SIZE: i64 = 50;
/// The most tasks a page holds (and the largest `pageSize` accepted).
pub const MAX_PAGE_SIZE: i64 = 100;
/// A page also ends once its tasks (inputs, status texts, artifacts) reach about this many
/// bytes; the rest come on the next page.
pub const MAX_PAGE_BYTES: usize = 16 * 1024 * 1024;
/// What a page token starts with (its format's version).
const TOKEN_PREFIX: &str = "v1:";

/// What a `status` filter keeps.
enum StateFilter {
    Any,
    Only(AgenState),
    /// A valid A2A state no Agen task is ever in (rejected, auth required).
    Nothing,
}

fn state_filter(v: &EnumValue) -> Result<StateFilter, RpcError> {
    let name = match v {
        EnumValue::Name(n) => n.as_str(),
        EnumValue::Number(n) => match n {
            0 => "TASK_STATE_UNSPECIFIED",
            1 => "TASK_STATE_SUBMITTED",
            2 => "TASK_STATE_WORKING",
            3 => "TASK_STATE_COMPLETED",
            4 => "TASK_STATE_FAILED",
            5 => "TASK_STATE_CANCELED",
            6 => "TASK_STATE_INPUT_REQUIRED",
            7 => "TASK_STATE_REJECTED",
            8 => "TASK_STATE_AUTH_REQUIRED",
            _ => "unknown",
        },
    };
    Ok(match name {
        "" | "TASK_STATE_UNSPECIFIED" => StateFilter::Any,
        "TASK_STATE_SUBMITTED" => StateFilter::Only(AgenState::Queued),
        "TASK_STATE_WORKING" => StateFilter::Only(AgenState::Running),
        "TASK_STATE_INPUT_REQUIRED" => StateFilter::Only(AgenState::Waiting),
        "TASK_STATE_COMPLETED" => StateFilter::Only(AgenState::Succeeded),
        "TASK_STATE_FAILED" => StateFilter::Only(AgenState::Failed),
        "TASK_STATE_CANCELED" => StateFilter::Only(AgenState::Cancelled),
        "TASK_STATE_REJECTED" | "TASK_STATE_AUTH_REQUIRED" => StateFilter::Nothing,
        other => {
            let shown = match v {
                EnumValue::Name(_) => crate::limits::cut(other, crate::limits::ECHO_BYTES),
                EnumValue::Number(n) => n.to_string(),
            };
            return Err(invalid(format!(
                "status: {shown:?} is not a task state; expected one of TASK_STATE_SUBMITTED, TASK_STATE_WORKING, TASK_STATE_INPUT_REQUIRED, TASK_STATE_COMPLETED, TASK_STATE_FAILED, TASK_STATE_CANCELED, TASK_STATE_REJECTED, TASK_STATE_AUTH_REQUIRED"
            )));
        }
    })
}

/// The page token after the task updated at `ms` with id `id`.
fn token_after(ms: i64, id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{TOKEN_PREFIX}{ms}:{id}"))
}

/// The update time and task id a page token carries.
fn read_token(token: &str) -> Result<(i64, String), RpcError> {
    let bad = || {
        invalid(format!(
            "pageToken {:?} is not a page token of this agent; send the nextPageToken of the previous page, or none for the first page",
            crate::limits::cut(token, crate::limits::ECHO_BYTES)
        ))
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let (ms, id) = text
        .strip_prefix(TOKEN_PREFIX)
        .and_then(|r| r.split_once(':'))
        .ok_or_else(bad)?;
    let ms: i64 = ms.parse().map_err(|_| bad())?;
    if id.is_empty() || id.len() > crate::limits::MAX_ID_BYTES {
        return Err(bad());
    }
    Ok((ms, id.to_string()))
}

/// An RFC 3339 time as Unix milliseconds.
fn read_time(field: &str, s: &str) -> Result<i64, RpcError> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            invalid(format!(
                "{field}: {:?} is not an RFC 3339 time such as 2026-01-31T10:00:00Z: {e}",
                crate::limits::cut(s, crate::limits::ECHO_BYTES)
            ))
        })
}

/// About how many bytes a task takes in a page.
fn task_bytes(t: &Task) -> usize {
    let parts = |ps: &[Part]| -> usize {
        ps.iter()
            .map(|p| {
                p.text.as_ref().map_or(0, String::len)
                    + p.raw.as_ref().map_or(0, String::len)
                    + p.url.as_ref().map_or(0, String::len)
                    + 64
            })
            .sum()
    };
    512 + t.history.iter().map(|m| parts(&m.parts)).sum::<usize>()
        + t.status.message.as_ref().map_or(0, |m| parts(&m.parts))
        + t.artifacts.iter().map(|a| parts(&a.parts)).sum::<usize>()
}

impl Call {
    /// `ListTasks`.
    pub fn list_tasks(self, req: ListTasksRequest) -> Result<ListTasksResponse, RpcError> {
        let page_size = match req.page_size {
            None => DEFAULT_PAGE_SIZE,
            Some(n) if (1..=MAX_PAGE_SIZE).contains(&n) => n,
            Some(n) => {
                return Err(invalid(format!(
                    "pageSize: expected 1 to {MAX_PAGE_SIZE} tasks, got {n}"
                )))
            }
        };
        let shape = view::Shape {
            history_length: history_length(req.history_length)?,
            artifacts: req.include_artifacts.unwrap_or(false),
        };
        let state = match &req.status {
            None => StateFilter::Any,
            Some(v) => state_filter(v)?,
        };
        let since = match req
            .status_timestamp_after
            .as_deref()
            .filter(|s| !s.is_empty())
        {
            Some(s) => Some(read_time("statusTimestampAfter", s)?),
            None => None,
        };
        let after = match req.page_token.as_deref().filter(|s| !s.is_empty()) {
            Some(t) => Some(read_token(t)?),
            None => None,
        };
        let context = req.context_id.filter(|c| !c.is_empty());
        let only = match state {
            StateFilter::Nothing => {
                return Ok(ListTasksResponse {
                    tasks: Vec::new(),
                    next_page_token: String::new(),
                    page_size: 0,
                    total_size: 0,
                })
            }
            StateFilter::Any => None,
            StateFilter::Only(s) => Some(s),
        };
        let keep = |t: &TaskRec| {
            only.is_none_or(|s| t.state == s)
                && since.is_none_or(|ms| t.updated_at_ms >= ms)
                && context.as_deref().is_none_or(|c| view::context_id(t) == c)
        };
        let page = self.a.core.recent_tasks(
            &self.namespace,
            &self.deployment,
            keep,
            after.as_ref().map(|(ms, id)| (*ms, id.as_str())),
            usize::try_from(page_size).unwrap_or(usize::MAX),
        );
        let mut tasks = Vec::new();
        let mut bytes = 0usize;
        let mut cut_short = false;
        let mut last: Option<&TaskRec> = None;
        for t in &page.tasks {
            let v = view::shaped(&self.a.core, t, shape)
                .map_err(|e| super::rpc_error(e, codes::TASK_NOT_FOUND))?;
            bytes += task_bytes(&v);
            if !tasks.is_empty() && bytes > MAX_PAGE_BYTES {
                cut_short = true;
                break;
            }
            tasks.push(v);
            last = Some(t);
        }
        let next_page_token = match last {
            Some(t) if page.more || cut_short => token_after(t.updated_at_ms, &t.task_id),
            _ => String::new(),
        };
        Ok(ListTasksResponse {
            page_size: i32::try_from(tasks.len()).unwrap_or(i32::MAX),
            total_size: i32::try_from(page.total).unwrap_or(i32::MAX),
            tasks,
            next_page_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_reads_back_and_a_made_up_one_is_refused() {
        assert_eq!(
            read_token(&token_after(1234, "t-1")).ok(),
            Some((1234, "t-1".into()))
        );
        for bad in ["invalid-token-xyz", "", "djE6", "djE6eDp5"] {
            let e = read_token(bad).err().map(|e| e.code);
            assert_eq!(e, Some(codes::INVALID_PARAMS), "{bad}");
        }
    }

    #[test]
    fn a_state_filter_takes_names_and_numbers_and_refuses_the_rest() {
        assert!(matches!(
            state_filter(&EnumValue::Name("TASK_STATE_WORKING".into())),
            Ok(StateFilter::Only(AgenState::Running))
        ));
        assert!(matches!(
            state_filter(&EnumValue::Number(3)),
            Ok(StateFilter::Only(AgenState::Succeeded))
        ));
        assert!(matches!(
            state_filter(&EnumValue::Name("TASK_STATE_REJECTED".into())),
            Ok(StateFilter::Nothing)
        ));
        for bad in [
            EnumValue::Name("INVALID_STATUS".into()),
            EnumValue::Name("TASK_STATE_RUNNING".into()),
            EnumValue::Number(42),
        ] {
            assert_eq!(
                state_filter(&bad).err().map(|e| e.code),
                Some(codes::INVALID_PARAMS)
            );
        }
    }
}
