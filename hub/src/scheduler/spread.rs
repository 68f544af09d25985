//! Spreading replicas again (after a lost Nest returns, or a new one joins): a pure choice of
//! the ONE instance to move, so that every rule is one row of a table test.
//!
//! Rules: nothing moves while the deployment is not settled (every instance of the current
//! generation running and healthy, exactly `replicas` of them, none already leaving): so at most
//! one move is in flight per deployment. A move is due when the most crowded Nest holds at least
//! 2 more instances of the deployment than a placeable Nest (ready, matching, capacity and the
//! instance's CPU and memory left); with replicas that fit one per Nest this is also the "one
//! per Nest" rule (a Nest with 2 implies an empty one). The instance moved is on the most crowded Nest, with the fewest active runs, then
//! the newest, then the lowest id (deterministic).

use std::collections::BTreeMap;

use crate::model::InstanceState;

/// A Nest as the spread sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpreadNest<'a> {
    pub nest_id: &'a str,
    /// Ready, connected, not cordoned, matching the selector, with capacity left and the CPU
    /// and memory one more instance of the deployment reserves free.
    pub placeable: bool,
}

/// An instance of the deployment as the spread sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpreadInst<'a> {
    pub instance_id: &'a str,
    pub nest_id: &'a str,
    pub generation: u64,
    pub state: InstanceState,
    pub healthy: bool,
    pub leaving: bool,
    pub active_runs: u32,
    pub created_at_ms: i64,
}

/// The instance to move now, if any.
pub fn pick_move<'a>(
    replicas: u32,
    generation: u64,
    nests: &[SpreadNest<'_>],
    instances: &[SpreadInst<'a>],
) -> Option<&'a str> {
    let live: Vec<&SpreadInst<'a>> = instances
        .iter()
        .filter(|i| !matches!(i.state, InstanceState::Lost | InstanceState::Stopped))
        .collect();
    let settled = live.len() == replicas as usize
        && live.iter().all(|i| {
            i.state == InstanceState::Running
                && i.healthy
                && !i.leaving
                && i.generation == generation
        });
    if !settled {
        return None;
    }
    let mut count: BTreeMap<&str, u32> = BTreeMap::new();
    for i in &live {
        *count.entry(i.nest_id).or_default() += 1;
    }
    let emptiest = nests
        .iter()
        .filter(|n| n.placeable)
        .map(|n| count.get(n.nest_id).copied().unwrap_or(0))
        .min()?;
    let (crowded, most) = count
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(n, c)| (*n, *c))?;
    if most < emptiest + 2 {
        return None;
    }
    live.into_iter()
        .filter(|i| i.nest_id == crowded)
        .min_by(|a, b| {
            a.active_runs
                .cmp(&b.active_runs)
                .then(b.created_at_ms.cmp(&a.created_at_ms))
                .then(a.instance_id.cmp(b.instance_id))
        })
        .map(|i| i.instance_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use InstanceState::*;

    fn n(id: &str, placeable: bool) -> SpreadNest<'_> {
        SpreadNest {
            nest_id: id,
            placeable,
        }
    }

    fn i<'a>(id: &'a str, nest: &'a str, runs: u32, created: i64) -> SpreadInst<'a> {
        SpreadInst {
            instance_id: id,
            nest_id: nest,
            generation: 1,
            state: Running,
            healthy: true,
            leaving: false,
            active_runs: runs,
            created_at_ms: created,
        }
    }

    #[test]
    fn moves_one_instance_off_the_crowded_nest_only_when_settled() {
        let ab = [n("a", true), n("b", true)];
        let both_on_a = [i("x", "a", 1, 1), i("y", "a", 0, 2)];
        // 2+0: the idle one moves.
        assert_eq!(pick_move(2, 1, &ab, &both_on_a), Some("y"));
        // Both idle: the newest moves; equal age: the lowest id.
        assert_eq!(
            pick_move(2, 1, &ab, &[i("x", "a", 0, 1), i("y", "a", 0, 2)]),
            Some("y")
        );
        assert_eq!(
            pick_move(2, 1, &ab, &[i("x", "a", 0, 1), i("w", "a", 0, 1)]),
            Some("w")
        );
        // Busy everywhere: still one moves (its runs finish or are handed over).
        assert_eq!(
            pick_move(2, 1, &ab, &[i("x", "a", 2, 1), i("y", "a", 1, 1)]),
            Some("y")
        );
        // Already spread: nothing.
        assert_eq!(
            pick_move(2, 1, &ab, &[i("x", "a", 0, 1), i("y", "b", 0, 2)]),
            None
        );
        // 3 replicas on 2 nests: 2+1 is as even as it gets.
        assert_eq!(
            pick_move(
                3,
                1,
                &ab,
                &[i("x", "a", 0, 1), i("y", "a", 0, 2), i("z", "b", 0, 3)]
            ),
            None
        );
        // 3+1 on 2 nests: one moves.
        assert_eq!(
            pick_move(
                4,
                1,
                &ab,
                &[
                    i("x", "a", 0, 1),
                    i("y", "a", 0, 2),
                    i("z", "a", 0, 3),
                    i("v", "b", 0, 4)
                ]
            ),
            Some("z")
        );
        // The empty nest is not placeable (not ready, cordoned, full, no match): nothing.
        assert_eq!(
            pick_move(2, 1, &[n("a", true), n("b", false)], &both_on_a),
            None
        );
        // One nest only: nothing.
        assert_eq!(pick_move(2, 1, &[n("a", true)], &both_on_a), None);
    }

    #[test]
    fn at_most_one_move_in_flight_and_none_while_unsettled() {
        let ab = [n("a", true), n("b", true)];
        let leaving = SpreadInst {
            leaving: true,
            ..i("y", "a", 0, 2)
        };
        // A move in flight (one leaving, its replacement starting).
        let starting = SpreadInst {
            state: Starting,
            healthy: false,
            ..i("z", "b", 0, 3)
        };
        assert_eq!(
            pick_move(2, 1, &ab, &[i("x", "a", 0, 1), leaving.clone()]),
            None
        );
        assert_eq!(
            pick_move(2, 1, &ab, &[i("x", "a", 0, 1), leaving, starting.clone()]),
            None
        );
        // A replica still starting, unhealthy, or of an old generation: wait.
        let unhealthy = SpreadInst {
            healthy: false,
            ..i("y", "a", 0, 2)
        };
        assert_eq!(pick_move(2, 1, &ab, &[i("x", "a", 0, 1), unhealthy]), None);
        let old = SpreadInst {
            generation: 0,
            ..i("y", "a", 0, 2)
        };
        assert_eq!(pick_move(2, 1, &ab, &[i("x", "a", 0, 1), old]), None);
        // Fewer or more than the replica count: plan() acts first.
        assert_eq!(
            pick_move(3, 1, &ab, &[i("x", "a", 0, 1), i("y", "a", 0, 2)]),
            None
        );
        // Lost and stopped records do not count.
        let lost = SpreadInst {
            state: Lost,
            healthy: false,
            ..i("l", "b", 0, 0)
        };
        assert_eq!(
            pick_move(2, 1, &ab, &[i("x", "a", 0, 1), i("y", "a", 0, 2), lost]),
            Some("y")
        );
    }
}
