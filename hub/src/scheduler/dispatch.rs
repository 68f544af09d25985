//! Which instance runs a queued task now: a pure choice over what the core knows (no IO, no
//! lock), so that every rule is one row of a table test.
//!
//! Rules, in order: a resumed run (pinned to the bundle digest it started on) runs only on an
//! instance of that digest, and is gone when no live instance has it and the deployment moved
//! on; a new run prefers the deployed digest when an instance of it is ready (old versions
//! drain); an instance is eligible when it is running, healthy, its Nest connected, and below
//! the deployment's concurrency; a retry avoids the instance that just failed it when another is
//! eligible; among the eligible, one that is not being moved away first, then the current
//! generation, then the fewest active runs, then the lowest id (deterministic).

/// An instance of the task's deployment as dispatch sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotView<'a> {
    pub instance_id: &'a str,
    pub bundle_digest: &'a str,
    pub generation: u64,
    /// Running and healthy.
    pub ready: bool,
    /// Its Nest has a live link.
    pub connected: bool,
    /// Neither lost nor stopping (a pinned run may still get it).
    pub alive: bool,
    /// Runs it has now (running or waiting).
    pub active_runs: u32,
    /// Being moved to another Nest (replicas spread again): it takes runs only when no other
    /// instance can.
    pub leaving: bool,
}

/// The deployment now and what the task asks.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask<'a> {
    /// The deployment's current bundle digest and generation.
    pub digest: &'a str,
    pub generation: u64,
    pub concurrency: u32,
    /// The digest a resumed run started on (`None` for a new run).
    pub pinned: Option<&'a str>,
    /// The instance that just failed this task (a retry avoids it when it can).
    pub avoid: &'a str,
}

/// What dispatch does with the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice<'a> {
    /// Assign it to this instance.
    Run(&'a str),
    /// Leave it queued (no free slot now).
    Wait,
    /// The run's version is gone: no live instance has its digest and the deployment moved on.
    VersionGone,
}

/// Chooses where a queued task runs now.
pub fn choose<'a>(ask: &Ask<'_>, slots: &[SlotView<'a>]) -> Choice<'a> {
    if let Some(digest) = ask.pinned {
        let any_left = slots.iter().any(|s| s.bundle_digest == digest && s.alive);
        if !any_left && ask.digest != digest {
            return Choice::VersionGone;
        }
    }
    let current_ready = slots
        .iter()
        .any(|s| s.bundle_digest == ask.digest && s.ready);
    let eligible: Vec<&SlotView<'a>> = slots
        .iter()
        .filter(|s| match ask.pinned {
            Some(p) => s.bundle_digest == p,
            None => !current_ready || s.bundle_digest == ask.digest,
        })
        .filter(|s| s.ready && s.connected && s.active_runs < ask.concurrency)
        .collect();
    let others = eligible.iter().any(|s| s.instance_id != ask.avoid);
    eligible
        .into_iter()
        .filter(|s| !others || s.instance_id != ask.avoid)
        .min_by_key(|s| {
            (
                s.leaving,
                s.generation != ask.generation,
                s.active_runs,
                s.instance_id,
            )
        })
        .map_or(Choice::Wait, |s| Choice::Run(s.instance_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(
        id: &'static str,
        digest: &'static str,
        generation: u64,
        active: u32,
    ) -> SlotView<'static> {
        SlotView {
            instance_id: id,
            bundle_digest: digest,
            generation,
            ready: true,
            connected: true,
            alive: true,
            active_runs: active,
            leaving: false,
        }
    }

    fn ask(pinned: Option<&'static str>, avoid: &'static str) -> Ask<'static> {
        Ask {
            digest: "new",
            generation: 2,
            concurrency: 2,
            pinned,
            avoid,
        }
    }

    #[test]
    fn the_table_of_dispatch_choices() {
        let down = |mut s: SlotView<'static>| {
            s.ready = false;
            s
        };
        let cut_off = |mut s: SlotView<'static>| {
            s.connected = false;
            s
        };
        let moving = |mut s: SlotView<'static>| {
            s.leaving = true;
            s
        };
        let gone = |mut s: SlotView<'static>| {
            s.ready = false;
            s.alive = false;
            s
        };
        let rows: Vec<(&str, Ask<'static>, Vec<SlotView<'static>>, Choice<'static>)> = vec![
            ("no instance: wait", ask(None, ""), vec![], Choice::Wait),
            (
                "the fewest active runs",
                ask(None, ""),
                vec![slot("a", "new", 2, 1), slot("b", "new", 2, 0)],
                Choice::Run("b"),
            ),
            (
                "ties go to the lowest id",
                ask(None, ""),
                vec![slot("b", "new", 2, 0), slot("a", "new", 2, 0)],
                Choice::Run("a"),
            ),
            (
                "full instances wait",
                ask(None, ""),
                vec![slot("a", "new", 2, 2)],
                Choice::Wait,
            ),
            (
                "not healthy is not eligible",
                ask(None, ""),
                vec![down(slot("a", "new", 2, 0))],
                Choice::Wait,
            ),
            (
                "a disconnected Nest is not eligible",
                ask(None, ""),
                vec![cut_off(slot("a", "new", 2, 0))],
                Choice::Wait,
            ),
            (
                "the current generation first",
                ask(None, ""),
                vec![slot("a", "new", 1, 0), slot("b", "new", 2, 1)],
                Choice::Run("b"),
            ),
            (
                "a new run drains the old version",
                ask(None, ""),
                vec![slot("a", "old", 1, 0), slot("b", "new", 2, 1)],
                Choice::Run("b"),
            ),
            (
                "an old version serves while no new one is ready",
                ask(None, ""),
                vec![slot("a", "old", 1, 0), down(slot("b", "new", 2, 0))],
                Choice::Run("a"),
            ),
            (
                "a resumed run stays on its version",
                ask(Some("old"), ""),
                vec![slot("a", "old", 1, 1), slot("b", "new", 2, 0)],
                Choice::Run("a"),
            ),
            (
                "its version busy: it waits",
                ask(Some("old"), ""),
                vec![slot("a", "old", 1, 2), slot("b", "new", 2, 0)],
                Choice::Wait,
            ),
            (
                "its version gone: it cannot run",
                ask(Some("old"), ""),
                vec![gone(slot("a", "old", 1, 0)), slot("b", "new", 2, 0)],
                Choice::VersionGone,
            ),
            (
                "pinned to the deployed version, none alive: wait",
                ask(Some("new"), ""),
                vec![gone(slot("a", "new", 2, 0))],
                Choice::Wait,
            ),
            (
                "a retry avoids the instance that failed it",
                ask(None, "a"),
                vec![slot("a", "new", 2, 0), slot("b", "new", 2, 1)],
                Choice::Run("b"),
            ),
            (
                "but takes it when it is the only one",
                ask(None, "a"),
                vec![slot("a", "new", 2, 0)],
                Choice::Run("a"),
            ),
            (
                "an instance being moved away gets no new run while another can take it",
                ask(None, ""),
                vec![moving(slot("a", "new", 2, 0)), slot("b", "new", 2, 1)],
                Choice::Run("b"),
            ),
            (
                "but still does when it is the only one with a slot",
                ask(None, ""),
                vec![moving(slot("a", "new", 2, 0)), slot("b", "new", 2, 2)],
                Choice::Run("a"),
            ),
        ];
        for (name, ask, slots, want) in rows {
            assert_eq!(choose(&ask, &slots), want, "{name}");
        }
    }
}
