//! Scheduler behaviour: selector, spread, capacity, roll-over, replacement back-off.

use pretty_assertions::assert_eq;

use super::*;

fn nest(
    id: &str,
    labels: &[(&str, &str)],
    capacity: u32,
    total: u32,
    of_deployment: u32,
) -> NestView {
    NestView {
        nest_id: id.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        capacity,
        ready: true,
        total,
        of_deployment,
    }
}

fn sel(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn check(nests: &[NestView], selector: &[(&str, &str)], expected: Result<&str, NoPlacement>) {
    let got = pick_nest(nests, &sel(selector)).map(|n| n.nest_id.as_str());
    assert_eq!(got, expected);
}

#[test]
fn selector_requires_every_pair() {
    let nests = [
        nest("a", &[("gpu", "yes"), ("zone", "x")], 32, 0, 0),
        nest("b", &[("zone", "x")], 32, 0, 0),
    ];
    check(&nests, &[("gpu", "yes")], Ok("a"));
    check(&nests, &[("gpu", "yes"), ("zone", "x")], Ok("a"));
    check(&nests, &[("gpu", "no")], Err(NoPlacement::NoMatch));
    check(&nests, &[], Ok("a"));
}

#[test]
fn spreads_by_deployment_then_total() {
    let nests = [nest("a", &[], 32, 1, 1), nest("b", &[], 32, 5, 0)];
    check(&nests, &[], Ok("b"));
    let nests = [nest("a", &[], 32, 3, 1), nest("b", &[], 32, 2, 1)];
    check(&nests, &[], Ok("b"));
}

#[test]
fn full_and_unready_nests_are_skipped() {
    let mut lost = nest("c", &[], 32, 0, 0);
    lost.ready = false;
    check(
        &[nest("a", &[], 2, 2, 0), lost.clone()],
        &[],
        Err(NoPlacement::NoCapacity),
    );
    check(
        &[nest("a", &[], 3, 2, 2), nest("b", &[], 1, 1, 0)],
        &[],
        Ok("a"),
    );
    check(&[lost], &[], Err(NoPlacement::NoNests));
    check(&[], &[], Err(NoPlacement::NoNests));
}

#[test]
fn replacement_backoff_doubles_up_to_a_minute() {
    let got: Vec<u64> = (0..10).map(|f| backoff(f).as_secs()).collect();
    assert_eq!(got, vec![0, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
}

fn inst(id: &str, generation: u64, state: InstanceState, created: i64) -> InstView {
    InstView {
        instance_id: id.into(),
        generation,
        state,
        healthy: state == InstanceState::Running,
        created_at_ms: created,
        leaving: false,
    }
}

#[test]
fn plan_keeps_the_replica_count() {
    use InstanceState::*;
    assert_eq!(
        plan(2, 1, &[]),
        Plan {
            create: 2,
            ..Plan::default()
        }
    );
    assert_eq!(
        plan(
            1,
            1,
            &[
                inst("a", 1, Running, 1),
                inst("b", 1, Pending, 2),
                inst("c", 1, Lost, 0)
            ]
        ),
        Plan {
            stop: vec!["b".into()],
            ..Plan::default()
        }
    );
    assert_eq!(
        plan(
            2,
            1,
            &[inst("a", 1, Running, 1), inst("b", 1, Unhealthy, 2)]
        ),
        Plan {
            create: 1,
            replace: vec!["b".into()],
            ..Plan::default()
        }
    );
}

#[test]
fn plan_rolls_old_generation_over_once_new_instances_run() {
    use InstanceState::*;
    // New generation not running yet: old ones stay.
    assert_eq!(
        plan(
            2,
            2,
            &[
                inst("o1", 1, Running, 1),
                inst("o2", 1, Running, 2),
                inst("n1", 2, Starting, 3)
            ]
        ),
        Plan {
            create: 1,
            ..Plan::default()
        }
    );
    // One new instance runs: one old one goes.
    assert_eq!(
        plan(
            2,
            2,
            &[
                inst("o1", 1, Running, 1),
                inst("o2", 1, Running, 2),
                inst("n1", 2, Running, 3),
                inst("n2", 2, Starting, 4)
            ]
        ),
        Plan {
            stop: vec!["o1".into()],
            ..Plan::default()
        }
    );
    // Old placements that never started go at once.
    assert_eq!(
        plan(
            1,
            2,
            &[inst("o1", 1, Pending, 1), inst("o2", 1, Running, 2)]
        ),
        Plan {
            create: 1,
            stop: vec!["o1".into()],
            ..Plan::default()
        }
    );
    // All new instances run: every old one goes.
    assert_eq!(
        plan(
            1,
            2,
            &[inst("o1", 1, Running, 1), inst("n1", 2, Running, 3)]
        ),
        Plan {
            stop: vec!["o1".into()],
            ..Plan::default()
        }
    );
}

#[test]
fn plan_keeps_a_leaving_instance_until_its_replacement_runs() {
    use InstanceState::*;
    let leaving = |id: &str, created| InstView {
        leaving: true,
        ..inst(id, 1, Running, created)
    };
    // Just marked: a replacement is created, the leaving one stays.
    assert_eq!(
        plan(2, 1, &[inst("a", 1, Running, 1), leaving("b", 2)]),
        Plan {
            create: 1,
            ..Plan::default()
        }
    );
    // Replacement starting: nothing to do yet.
    assert_eq!(
        plan(
            2,
            1,
            &[
                inst("a", 1, Running, 1),
                leaving("b", 2),
                inst("c", 1, Starting, 3)
            ]
        ),
        Plan::default()
    );
    // Replacement running and healthy: the leaving one stops.
    assert_eq!(
        plan(
            2,
            1,
            &[
                inst("a", 1, Running, 1),
                leaving("b", 2),
                inst("c", 1, Running, 3)
            ]
        ),
        Plan {
            stop: vec!["b".into()],
            ..Plan::default()
        }
    );
}
