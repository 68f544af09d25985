//! An assignment the Nest cannot use as sent (a key field missing, a history or replay that is
//! not a JSON array): the run is failed with the reason (`run.finished` failed, from the
//! instance it was assigned to) instead of running it on half its data, and the link stays up.
//! Running with a dropped replay would send its side-effecting calls a second time.

use agen_contract::run::{RunEventBody, RunFinished, RunState};

use crate::model::{AssignedRun, RunEvent};

/// Why `a` cannot be run, if it cannot.
pub fn unusable(a: &AssignedRun) -> Option<String> {
    let missing = [
        ("run_id", a.run_id.is_empty()),
        ("task_id", a.task_id.is_empty()),
        ("instance_id", a.instance_id.is_empty()),
        ("attempt", a.attempt.0 == 0),
    ];
    if let Some((field, _)) = missing.iter().find(|(_, m)| *m) {
        return Some(format!(
            "assignment refused by the nest: field {field} is missing; the hub must send it (a hub/nest version mismatch?)"
        ));
    }
    for (field, text) in [
        ("history_json", &a.history_json),
        ("replay_json", &a.replay_json),
    ] {
        if text.trim().is_empty() {
            continue;
        }
        if !matches!(
            serde_json::from_str::<serde_json::Value>(text),
            Ok(serde_json::Value::Array(_))
        ) {
            return Some(format!(
                "assignment refused by the nest: {field} is not a JSON array ({} bytes); the run is not started without it",
                text.len()
            ));
        }
    }
    None
}

/// The event that fails run `a` with `why`; `None` when the run cannot even be named (no run
/// id or task id: nothing to fail, the Hub's start deadline re-dispatches it).
pub fn failed_event(a: &AssignedRun, why: &str) -> Option<RunEvent> {
    if a.run_id.is_empty() || a.task_id.is_empty() || a.instance_id.is_empty() {
        return None;
    }
    Some(RunEvent {
        run_id: a.run_id.0.clone(),
        attempt: a.attempt.0,
        seq: 1,
        task_id: a.task_id.0.clone(),
        at_ms: chrono::Utc::now().timestamp_millis(),
        body: RunEventBody::RunFinished(RunFinished {
            state: RunState::Failed,
            result: why.to_string(),
            response_type: Default::default(),
            messages: Vec::new(),
        }),
        sync: true,
    })
}

/// Fails a run whose assignment cannot be used: logged, and its `run.finished` (failed, with
/// the reason) queued from the instance it was assigned to.
pub fn refuse(outbox: &crate::outbox::Outbox, a: &AssignedRun, why: &str) {
    tracing::warn!(run = %a.run_id, task = %a.task_id, "{why}; the run fails, the link stays up");
    if let Some(e) = failed_event(a, why) {
        outbox.push(a.instance_id.as_str(), e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agen_contract::run::kind;

    fn good() -> AssignedRun {
        AssignedRun {
            run_id: "r1".into(),
            task_id: "t1".into(),
            instance_id: "i1".into(),
            attempt: 1.into(),
            history_json: "[]".into(),
            replay_json: String::new(),
            ..AssignedRun::default()
        }
    }

    #[test]
    fn a_usable_assignment_passes_and_broken_ones_name_the_field() {
        assert_eq!(unusable(&good()), None);
        let cases: Vec<(AssignedRun, &str)> = vec![
            (
                AssignedRun {
                    attempt: 0.into(),
                    ..good()
                },
                "field attempt",
            ),
            (
                AssignedRun {
                    run_id: String::new().into(),
                    ..good()
                },
                "field run_id",
            ),
            (
                AssignedRun {
                    history_json: "{not json".into(),
                    ..good()
                },
                "history_json",
            ),
            (
                AssignedRun {
                    replay_json: "{\"kind\":1}".into(),
                    ..good()
                },
                "replay_json",
            ),
        ];
        for (a, field) in cases {
            let why = unusable(&a).expect("refused");
            assert!(why.contains(field), "{why}");
        }
    }

    #[test]
    fn the_refused_run_finishes_failed_with_the_reason() {
        let a = AssignedRun {
            replay_json: "oops".into(),
            ..good()
        };
        let why = unusable(&a).expect("refused");
        let e = failed_event(&a, &why).expect("an event");
        assert_eq!(
            (e.run_id.as_str(), e.attempt, e.seq, e.body.kind(), e.sync),
            ("r1", 1, 1, kind::RUN_FINISHED, true)
        );
        match e.body {
            RunEventBody::RunFinished(f) => {
                assert_eq!(f.state, RunState::Failed);
                assert_eq!(f.result, why);
            }
            other => panic!("not a failed run.finished: {other:?}"),
        }
        assert_eq!(
            failed_event(
                &AssignedRun {
                    task_id: String::new().into(),
                    ..a
                },
                &why
            ),
            None
        );
    }
}
