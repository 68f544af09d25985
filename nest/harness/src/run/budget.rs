//! A task's token budget (`agen submit --max-tokens`, bundle `limits.maxTokens`): model input +
//! output tokens over every turn of every attempt; the run stops before a turn that would
//! exceed it.
//!
//! Invariants: the tokens of earlier attempts are counted from their `model.answered` events in
//! the replay (a resumed run does not get a fresh budget); a turn is not asked once the tokens
//! used reach the budget, nor when the next turn would pass it: a turn re-sends the whole
//! context, so it takes at least the last turn's input and output tokens as its input.

use std::sync::Mutex;

use agen_contract::run::Usage;

use super::{lock, RunAssignment, RunEventBody};

/// Tokens used so far against the budget of one run.
pub(super) struct TokenBudget {
    /// `None`: no budget (usage is still counted).
    max: Option<u64>,
    spent: Mutex<Spent>,
}

#[derive(Default)]
struct Spent {
    /// Input + output tokens of every turn so far, earlier attempts included.
    used: u64,
    /// Input + output tokens of the last turn of the run's own loop (not a Keen flow agent).
    last_turn: u64,
}

impl TokenBudget {
    /// The budget of `req` (its own, else the bundle's `limits.maxTokens`), with the tokens its
    /// earlier attempts used.
    pub(super) fn new(req: &RunAssignment, bundle_max: Option<u64>) -> TokenBudget {
        let mut spent = Spent::default();
        for e in &req.replay {
            if let RunEventBody::ModelAnswered(a) = e {
                spent.add(a.usage, !a.flow_agent);
            }
        }
        TokenBudget {
            max: req.max_tokens.filter(|n| *n > 0).or(bundle_max),
            spent: Mutex::new(spent),
        }
    }

    /// Before a model request: `Err` with the run's result when the budget does not allow it.
    /// `turn` is a turn of the run's loop (its context holds the last turn's tokens).
    pub(super) fn check(&self, turn: bool) -> Result<(), String> {
        let Some(max) = self.max else {
            return Ok(());
        };
        let spent = lock(&self.spent);
        if spent.used >= max {
            return Err(format!(
                "token budget exceeded: {} of max {max} tokens used (agen submit --max-tokens or limits.maxTokens in x-agen/harness.json)",
                spent.used
            ));
        }
        let next = if turn { spent.last_turn } else { 0 };
        if spent.used.saturating_add(next) > max {
            return Err(format!(
                "token budget exceeded: {} of max {max} tokens used, and the next turn would take at least {next} more (agen submit --max-tokens or limits.maxTokens in x-agen/harness.json)",
                spent.used
            ));
        }
        Ok(())
    }

    /// Counts one answered request.
    pub(super) fn record(&self, usage: Option<Usage>, turn: bool) {
        lock(&self.spent).add(usage, turn);
    }
}

impl Spent {
    /// Counts one answered request (`turn`: of the run's own loop, not a Keen flow agent).
    fn add(&mut self, usage: Option<Usage>, turn: bool) {
        let tokens = usage.map_or(0, |u| u.input_tokens.saturating_add(u.output_tokens));
        self.used = self.used.saturating_add(tokens);
        if turn {
            self.last_turn = tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agen_contract::run::ModelAnswered;
    use pretty_assertions::assert_eq;

    fn answered(input: u64, output: u64) -> RunEventBody {
        RunEventBody::ModelAnswered(ModelAnswered {
            turn: Some(1),
            flow_agent: false,
            message: None,
            usage: Some(Usage {
                input_tokens: input,
                output_tokens: output,
            }),
            stop_reason: None,
            response_id: None,
            response_model: None,
            error: None,
        })
    }

    #[test]
    fn no_budget_allows_every_turn() {
        let b = TokenBudget::new(&RunAssignment::default(), None);
        b.record(
            Some(Usage {
                input_tokens: 1_000_000,
                output_tokens: 1,
            }),
            true,
        );
        assert_eq!(b.check(true), Ok(()));
    }

    #[test]
    fn a_turn_that_would_pass_the_budget_is_not_asked() {
        let req = RunAssignment {
            max_tokens: Some(1000),
            ..Default::default()
        };
        let b = TokenBudget::new(&req, Some(10));
        assert_eq!(
            b.check(true),
            Ok(()),
            "the task's own budget wins over the bundle's"
        );
        b.record(
            Some(Usage {
                input_tokens: 300,
                output_tokens: 100,
            }),
            true,
        );
        assert_eq!(b.check(true), Ok(()));
        b.record(
            Some(Usage {
                input_tokens: 500,
                output_tokens: 100,
            }),
            true,
        );
        let err = b
            .check(true)
            .expect_err("1000 used + 600 more is over 1000");
        assert!(
            err.starts_with("token budget exceeded: 1000 of max 1000 tokens used"),
            "{err}"
        );
    }

    #[test]
    fn a_resumed_run_counts_the_tokens_of_its_replayed_turns() {
        let req = RunAssignment {
            max_tokens: Some(1000),
            replay: vec![answered(400, 100), answered(600, 100)],
            ..Default::default()
        };
        let err = TokenBudget::new(&req, None)
            .check(true)
            .expect_err("1200 used");
        assert!(
            err.starts_with("token budget exceeded: 1200 of max 1000 tokens used"),
            "{err}"
        );
    }

    #[test]
    fn the_bundle_budget_applies_when_the_task_has_none() {
        let b = TokenBudget::new(&RunAssignment::default(), Some(50));
        b.record(
            Some(Usage {
                input_tokens: 40,
                output_tokens: 20,
            }),
            false,
        );
        assert!(b.check(false).is_err());
    }
}
