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
        resources: None,
    }
}

fn sel(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn check(nests: &[NestView], selector: &[(&str, &str)], expected: Result<&str, NoPlacement>) {
    let got = pick_nest(nests, &sel(selector), Need::default()).map(|n| n.nest_id.as_str());
    assert_eq!(got, expected);
}

/// A Nest with `cpu` thousandths and `mem` MiB, of which `rcpu` and `rmem` are reserved.
fn sized(id: &str, cpu: u64, mem: u64, rcpu: u64, rmem: u64) -> NestView {
    NestView {
        resources: Some(NestResources {
            cpu_millis: cpu,
            memory_bytes: mem << 20,
            reserved_cpu_millis: rcpu,
            reserved_memory_bytes: rmem << 20,
        }),
        ..nest(id, &[], 32, 0, 0)
    }
}

#[test]
fn placement_reserves_cpu_and_memory() {
    let need = |cpu: u64, mem: u64| Need {
        cpu_millis: cpu,
        memory_bytes: mem << 20,
    };
    let pick = |nests: &[NestView], n: Need| {
        pick_nest(nests, &BTreeMap::new(), n).map(|n| n.nest_id.clone())
    };
    // a is full on memory, b has room.
    let nests = [
        sized("a", 2000, 1024, 100, 900),
        sized("b", 2000, 1024, 1500, 0),
    ];
    assert_eq!(pick(&nests, need(500, 512)), Ok("b".to_string()));
    // b is full on CPU now: nothing fits though each is big enough.
    let nests = [
        sized("a", 2000, 1024, 100, 900),
        sized("b", 2000, 1024, 1600, 0),
    ];
    assert_eq!(
        pick(&nests, need(500, 512)),
        Err(NoPlacement::NoRoom {
            need: need(500, 512)
        })
    );
    // Bigger than any Nest, even empty: said with the largest one.
    let err = pick(&nests, need(500, 4096)).unwrap_err();
    assert_eq!(
        err,
        NoPlacement::TooBig {
            need: need(500, 4096),
            largest: need(2000, 1024)
        }
    );
    assert_eq!(
        err.describe(&BTreeMap::new()),
        "no nest is big enough: the instance reserves cpu 0.5, memory 4Gi and the largest matching nest has cpu 2, memory 1Gi; lower `resources` in x-agen/config.json (or agen deploy --cpu/--memory) or add a bigger nest"
    );
    // A Nest that advertises nothing is placed on by count only.
    let nests = [sized("a", 2000, 1024, 0, 0), nest("old", &[], 32, 0, 0)];
    assert_eq!(pick(&nests, need(500, 4096)), Ok("old".to_string()));
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

/// One failure after another, each `(slot, at_ms)`; returns when each slot's replacement may
/// be placed, in order (the slots' counts carried by their instances as `reconcile` does).
#[track_caller]
fn check_slots(failures: &[(usize, i64)], expected_not_before: &[i64]) {
    let mut counts = [0u32; 4];
    let mut got = Vec::new();
    for &(slot, at) in failures {
        let vacancy = slots::Vacancy::after_failure(counts[slot], "tool server died", at);
        let filled = slots::fill(vec![vacancy], 1);
        let v = filled[0].clone().expect("the failed slot is refilled");
        counts[slot] = v.failures;
        got.push(v.not_before_ms);
    }
    assert_eq!(got, expected_not_before);
}

#[test]
fn back_off_is_counted_per_slot() {
    // One slot crashing again and again backs off 1 s, 2 s, 4 s …
    check_slots(
        &[(0, 0), (0, 10_000), (0, 20_000)],
        &[1_000, 12_000, 24_000],
    );
    // … while another slot's first failure, even right after, waits 1 s only.
    check_slots(
        &[(0, 0), (0, 10_000), (0, 20_000), (1, 21_000)],
        &[1_000, 12_000, 24_000, 22_000],
    );
    // Two slots failing alternately each keep their own count.
    check_slots(
        &[(0, 0), (1, 500), (0, 5_000), (1, 5_500)],
        &[1_000, 1_500, 7_000, 7_500],
    );
    // The cap holds.
    let v = slots::Vacancy::after_failure(40, "x", 0);
    assert_eq!((v.failures, v.not_before_ms), (41, 60_000));
}

#[test]
fn new_replicas_take_the_soonest_vacancies_then_fresh_slots() {
    let v = |failures: u32, at: i64| slots::Vacancy {
        failures,
        not_before_ms: at,
        reason: "r".into(),
    };
    let got = slots::fill(vec![v(3, 8_000), v(1, 1_000)], 3);
    assert_eq!(got, vec![Some(v(1, 1_000)), Some(v(3, 8_000)), None]);
    // Fewer replicas wanted than vacancies: the longest wait is dropped.
    assert_eq!(
        slots::fill(vec![v(3, 8_000), v(1, 1_000)], 1),
        vec![Some(v(1, 1_000))]
    );
    assert_eq!(slots::fill(Vec::new(), 2), vec![None, None]);
}

#[test]
fn a_slot_healthy_for_the_stable_time_is_no_longer_failing() {
    assert_eq!(slots::settled(3, 1_000, 31_000, 30_000), 0);
    assert_eq!(slots::settled(3, 1_000, 30_999, 30_000), 3);
    assert_eq!(slots::settled(3, 0, 99_000, 30_000), 3);
}
