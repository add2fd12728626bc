//! The safety properties, checked after every step from the target models' own state and the
//! log of what reached them, never from what the engine believes.
//!
//! - P1: after a fence of V was reported successful, no write from V is admitted on any of its
//!   LUs until V is explicitly unfenced (but those it reported not fenced, out of its node's
//!   reach, under `unreachable=report`). A write admitted *before* the preemption whose data
//!   lands after the fence returned is LIO's documented in-flight case: counted, not a violation.
//! - P2: never two nodes that have each reported the other fenced; at the end, never the LUs of
//!   a mutual fence (both registered on every LU when it began) split between the two (each
//!   present where the other is gone), unless a
//!   third node's fence of one of them left the split: one that reported failure (it is rerun
//!   until it converges, P4), or one that succeeded reporting the LU where the victim stayed
//!   out of its reach (`unreachable=report`).
//! - P3: a key removed by a successful fence is never registered again on any of its LUs until
//!   its node is explicitly unfenced (the REGISTER that brings it back is named). A rejoin
//!   (fence_pr's `on` again in the same boot) lifts it only when it overlapped the fence: one
//!   that starts after the fence succeeded must not bring the key back.
//! - P4: fencing a node that is already fenced succeeds and changes nothing on the target.
//! - P5: nothing here reads a clock; the nodes' clocks run at different rates in the scenarios.
//!
//! A power cycle without APTPL wipes an LU's reservations: the fences' promises on that LU end
//! there (the target forgot them), which the trace says; except that a rejoin (the node
//! remembers it registered in this boot) must still not register a key fenced before it began.

use prfence_engine::pr::Key;

use crate::world::{Op, Outcome, SimEvent, World};

/// A broken property, with where in the log it broke.
#[derive(Debug, Clone)]
pub struct Violation {
    pub property: &'static str,
    pub message: String,
    /// Index of the event that showed it (`None`: the state at the end).
    pub at: Option<usize>,
}

/// A fence reported successful, and what it promises from then on.
#[derive(Debug, Clone)]
struct Fenced {
    by: usize,
    victim: usize,
    key: Key,
    /// Log index of its OpEnd.
    at: usize,
    /// Per LU: the promise still holds (no power cycle since).
    lus: Vec<bool>,
    /// The victim was explicitly unfenced since.
    lifted: bool,
    /// The victim's key had been registered before (in this boot): false for a booting node
    /// fenced before its first `on` registered, whose first registration lifts the fence (the
    /// fence removed nothing, so nothing the node held is behind it).
    removed: bool,
}

/// The label of operation `id` (node `node` running `op`) and of every thread it starts, as the
/// log names their commands. The id tells apart two of one node's operations alike (two fences
/// of one victim at once), whose commands the checker must not mix up.
pub fn op_label(node: usize, id: usize, op: Op) -> String {
    format!("n{node} {op} #{id}")
}

#[derive(Debug, Clone, Copy)]
struct Started {
    node: usize,
    op: Op,
    at: usize,
}

pub struct Checker {
    seen: usize,
    fenced: Vec<Fenced>,
    started: Vec<Option<Started>>,
    /// (fence A→B, fence B→A) pairs that overlapped, with the log index where the first of
    /// them started.
    mutual: Vec<(usize, usize, usize)>,
    /// Per fence start (log index): whether its node and its victim were both registered on
    /// every LU then.
    shared_at_start: Vec<(usize, bool)>,
    /// Every unfence: (node, log index of its start).
    unfences: Vec<(usize, usize)>,
    /// Every rejoin: (node, log index of its start).
    rejoins: Vec<(usize, usize)>,
    /// Keys seen registered on some LU so far (a fence of a key never registered in this boot
    /// removed nothing, so its node's first `on` may register).
    registered: Vec<Key>,
    /// LUs whose PR state a power cycle wiped, and the log index when.
    forgot: Vec<(usize, usize)>,
    /// Key state of every LU when each refence started, to compare at its end.
    refence_before: Vec<(usize, Vec<Vec<Key>>)>,
    pub violations: Vec<Violation>,
    /// Writes admitted before a fence's preemption that landed after it succeeded.
    pub in_flight_landings: usize,
    /// How many admitted writes the run saw (a run that never writes proves little about P1).
    pub writes_admitted: usize,
    pub writes_refused: usize,
}

impl Checker {
    pub fn new() -> Self {
        Checker {
            seen: 0,
            fenced: Vec::new(),
            started: Vec::new(),
            mutual: Vec::new(),
            shared_at_start: Vec::new(),
            unfences: Vec::new(),
            rejoins: Vec::new(),
            registered: Vec::new(),
            forgot: Vec::new(),
            refence_before: Vec::new(),
            violations: Vec::new(),
            in_flight_landings: 0,
            writes_admitted: 0,
            writes_refused: 0,
        }
    }

    fn violate(&mut self, property: &'static str, message: String, at: Option<usize>) {
        self.violations.push(Violation {
            property,
            message,
            at,
        });
    }

    fn active(&self, victim_key: Key, lu: usize, before: usize) -> Option<&Fenced> {
        self.fenced.iter().find(|f| {
            !f.lifted && f.key == victim_key && f.at < before && f.lus.get(lu) == Some(&true)
        })
    }

    /// A successful fence of `node`'s `key` (not lifted) that ended before the rejoin of `node`
    /// that sent this command started. A power cycle ends the target's part of the fence's
    /// promise, not the node's: the node registered in this boot and remembers it, so its rejoin
    /// must not bring the key back on any LU, one that lost its PR state included.
    fn rejoin_after_fence(
        &self,
        world: &World,
        node: usize,
        label: &str,
        key: Key,
        before: usize,
    ) -> Option<&Fenced> {
        if !label.starts_with(&format!("n{node} {} #", Op::Rejoin)) {
            return None;
        }
        let started = self
            .rejoins
            .iter()
            .filter(|&&(n, at)| n == node && at < before && !self.ended_before(world, at, before))
            .map(|&(_, at)| at)
            .max()?;
        self.fenced
            .iter()
            .find(|f| !f.lifted && f.victim == node && f.key == key && f.at < started)
    }

    /// A promise that `node` may not write on `lu`, made before log index `before`.
    fn fenced_node(&self, node: usize, lu: usize, before: usize) -> Option<&Fenced> {
        self.fenced.iter().find(|f| {
            !f.lifted && f.victim == node && f.at < before && f.lus.get(lu) == Some(&true)
        })
    }

    /// Reads the events logged since the last call, then the state; returns whether a property
    /// is broken.
    pub fn step(&mut self, world: &World) -> bool {
        let events: Vec<SimEvent> = world.log()[self.seen..].to_vec();
        let first = self.seen;
        self.seen += events.len();
        for (offset, event) in events.into_iter().enumerate() {
            self.event(world, first + offset, event);
        }
        self.state(world);
        for message in world.sim.lock().panics.drain(..) {
            self.violate(
                "no panic",
                format!("the engine panicked on a simulated thread: {message}"),
                None,
            );
        }
        !self.violations.is_empty()
    }

    fn event(&mut self, world: &World, index: usize, event: SimEvent) {
        match event {
            SimEvent::OpStart { node, id, op, .. } => {
                if self.started.len() <= id {
                    self.started.resize(id + 1, None);
                }
                self.started[id] = Some(Started {
                    node,
                    op,
                    at: index,
                });
                match op {
                    Op::Unfence => {
                        for f in self.fenced.iter_mut().filter(|f| f.victim == node) {
                            f.lifted = true;
                        }
                        self.unfences.push((node, index));
                    }
                    // Unlike an unfence, no fence that already succeeded is lifted.
                    Op::Rejoin => self.rejoins.push((node, index)),
                    Op::Fence { victim } => {
                        let (ours, theirs) = (world.key(node), world.key(victim));
                        let shared = {
                            let cluster = world.cluster();
                            (0..cluster.lus.len())
                                .all(|l| cluster.has(l, ours) && cluster.has(l, theirs))
                        };
                        self.shared_at_start.push((index, shared));
                        // A fence of us by our victim that is still running: a mutual fence. P2's
                        // end-state rule is about nodes fencing each other over the same LUs:
                        // both registered on every LU when the first of the two started (not so
                        // after an unfence that failed part-way, which says to rerun it).
                        let other = self.started.iter().flatten().find(|s| {
                            s.node == victim
                                && s.op == Op::Fence { victim: node }
                                && !self.ended(world, s.at)
                        });
                        if let Some(other) = other
                            && self
                                .shared_at_start
                                .iter()
                                .any(|&(at, shared)| at == other.at && shared)
                        {
                            self.mutual
                                .push((node.min(victim), node.max(victim), other.at));
                        }
                    }
                    Op::Refence { .. } => {
                        let cluster = world.cluster();
                        let keys = (0..cluster.lus.len()).map(|l| cluster.keys(l)).collect();
                        self.refence_before.push((id, keys));
                    }
                    Op::Status | Op::Heal | Op::Register | Op::Lease | Op::Watch => {}
                }
            }
            SimEvent::OpEnd {
                node,
                id,
                op,
                outcome,
                summary,
                unfenced,
                ..
            } => self.op_end(world, index, node, id, op, outcome, &summary, &unfenced),
            SimEvent::Command {
                node,
                lu,
                added,
                label,
                what,
                ..
            } => {
                for key in added {
                    if !self.registered.contains(&key) {
                        self.registered.push(key);
                        for f in self
                            .fenced
                            .iter_mut()
                            .filter(|f| f.key == key && !f.removed)
                        {
                            f.lifted = true;
                        }
                    }
                    let rejoin = self.rejoin_after_fence(world, node, &label, key, index);
                    if let Some(f) = self.active(key, lu, index).or(rejoin) {
                        let lost = if f.lus.get(lu) == Some(&true) {
                            ""
                        } else {
                            " (the LU lost its PR state since, and the node's record did not)"
                        };
                        let message = format!(
                            "{key} (node n{}) registered again on LU{lu} by `{what}` from \
                             [{label}], after n{}'s fence of n{} was reported successful \
                             (event {}) and without an unfence of n{}{lost}",
                            f.victim, f.by, f.victim, f.at, f.victim
                        );
                        self.violate("P3", message, Some(index));
                    }
                }
            }
            SimEvent::Write {
                node,
                lu,
                admitted,
                landing_of,
                path,
                ..
            } => match landing_of {
                None if admitted => {
                    self.writes_admitted += 1;
                    if let Some(f) = self.fenced_node(node, lu, index) {
                        let message = format!(
                            "a write from n{node} (path {path}) was admitted on LU{lu} after \
                             n{}'s fence of n{node} was reported successful (event {})",
                            f.by, f.at
                        );
                        self.violate("P1", message, Some(index));
                    }
                }
                None => self.writes_refused += 1,
                Some(admission) => {
                    if self
                        .fenced_node(node, lu, index)
                        .is_some_and(|f| f.at > admission)
                    {
                        self.in_flight_landings += 1;
                    }
                }
            },
            SimEvent::LeasePreempted {
                node, lu, victim, ..
            } => {
                // A lease taken over: the old holder's key on that LU is gone for good, if the
                // target removed it (a PREEMPT answered NOT READY counts as applied when a
                // re-read shows the victim gone, which a renew of the holder also does).
                let label = format!("n{node} lease LU{lu}");
                let removed = world.log()[..index].iter().rev().any(|e| {
                    matches!(e, SimEvent::Command { label: l, what, removed, .. }
                        if **l == *label
                            && (what.starts_with("PREEMPT") || what.starts_with("IOC_PR_PREEMPT"))
                            && removed.contains(&victim))
                });
                if !removed {
                    return;
                }
                let lus = world.cluster().lus.len();
                let mut promised = vec![false; lus];
                if let Some(slot) = promised.get_mut(lu) {
                    *slot = true;
                }
                // P3 only: that epoch's key never comes back. Writes are judged by who holds the
                // lease (state): the old holder's node may hold other, newer keys of its own.
                self.fenced.push(Fenced {
                    by: node,
                    victim: usize::MAX,
                    key: victim,
                    at: index,
                    lus: promised,
                    lifted: false,
                    removed: true,
                });
            }
            SimEvent::LeaseRole { .. } | SimEvent::SelfFenced { .. } => {}
            SimEvent::Injected { what, .. } => {
                if let crate::world::Happening::PowerCycle { lu } = what {
                    self.forgot.push((lu, index));
                    for f in &mut self.fenced {
                        if let Some(slot) = f.lus.get_mut(lu) {
                            *slot = false;
                        }
                    }
                }
            }
        }
    }

    /// Whether a node other than the two of `pair` removed `victim`'s key from `removed_on`, at or
    /// after log index `since` (the pair's race began), in a fence of `victim` that left the rest
    /// for later: one that ended without success (it is rerun until it converges, P4), or one
    /// that succeeded reporting `kept_on` not fenced (`unreachable=report`: the victim's key
    /// stays there by the admin's choice until that fence is rerun; meanwhile the victim, fenced
    /// on the coordinators, may still act there). The removal must be that very fence's command.
    fn left_by_a_third_nodes_fence(
        &self,
        world: &World,
        pair: (usize, usize),
        victim: usize,
        (removed_on, kept_on): (usize, usize),
        since: usize,
    ) -> bool {
        let log = world.log();
        let key = world.key(victim);
        log.iter().enumerate().any(|(end, e)| {
            let SimEvent::OpEnd {
                node,
                id,
                op: Op::Fence { victim: v } | Op::Refence { victim: v },
                outcome,
                unfenced,
                ..
            } = e
            else {
                return false;
            };
            let left_for_later = *outcome != Outcome::Success || unfenced.contains(&kept_on);
            if *v != victim || pair.0 == *node || pair.1 == *node || !left_for_later {
                return false;
            }
            let Some(start) = self.started.get(*id).copied().flatten() else {
                return false;
            };
            let label = op_label(*node, *id, start.op);
            log[start.at.max(since)..end].iter().any(|c| {
                matches!(c, SimEvent::Command { label: l, lu, removed, .. }
                    if **l == *label && *lu == removed_on && removed.contains(&key))
            })
        })
    }

    /// Whether `node` ran an unfence that was still running at log index `since`, or started
    /// after it.
    fn unfenced_since(&self, world: &World, node: usize, since: usize) -> bool {
        self.ran_since(world, &self.unfences, node, since)
    }

    /// Whether `node` ran a rejoin that was still running at log index `since`, or started after
    /// it.
    fn rejoined_since(&self, world: &World, node: usize, since: usize) -> bool {
        self.ran_since(world, &self.rejoins, node, since)
    }

    fn ran_since(&self, world: &World, ops: &[(usize, usize)], node: usize, since: usize) -> bool {
        ops.iter().any(|&(n, start)| {
            n == node && (start > since || !self.ended_before(world, start, since))
        })
    }

    /// Whether the op that started at log index `start` ended before log index `at`.
    fn ended_before(&self, world: &World, start: usize, at: usize) -> bool {
        let log = world.log();
        let Some(SimEvent::OpStart { id, .. }) = log.get(start) else {
            return true;
        };
        let id = *id;
        log[start..at.min(log.len())]
            .iter()
            .any(|e| matches!(e, SimEvent::OpEnd { id: i, .. } if *i == id))
    }

    /// Whether the op that started at log index `start` has ended.
    fn ended(&self, world: &World, start: usize) -> bool {
        self.ended_before(world, start, usize::MAX)
    }

    #[allow(clippy::too_many_arguments)]
    fn op_end(
        &mut self,
        world: &World,
        index: usize,
        node: usize,
        id: usize,
        op: Op,
        outcome: Outcome,
        summary: &str,
        unfenced: &[usize],
    ) {
        let (Op::Fence { victim } | Op::Refence { victim }) = op else {
            return;
        };
        // P4: a repeat of a fence (scenarios run it once every fault is over) succeeds; when an
        // earlier fence of the victim succeeded (and still holds) it changes nothing either.
        if let Op::Refence { .. } = op {
            let already = self
                .fenced
                .iter()
                .any(|f| !f.lifted && f.victim == victim && f.lus.iter().all(|on| *on));
            self.refence_end(world, index, node, id, outcome, summary, already);
        }
        if outcome != Outcome::Success {
            return;
        }
        if let Some(other) = self
            .fenced
            .iter()
            .find(|f| !f.lifted && f.by == victim && f.victim == node)
        {
            let message = format!(
                "n{node} reported n{victim} fenced although n{victim} had reported n{node} \
                 fenced (event {}): two survivors",
                other.at
            );
            self.violate("P2", message, Some(index));
        }
        // What a fence promises is on the data LUs: the coordinators a loser won keep the
        // victim's key (the winner's is gone there), which decides nothing once the winner holds
        // the majority (issue 47).
        let lus = world.data_lus();
        // An explicit unfence of the victim that ran at the same time as this fence (a cluster
        // or an admin unfencing the node while another fences it: two explicit orders that
        // contradict each other) wins: P3 ends with an explicit unfence.
        // So does a rejoin that ran at the same time (its look at the LU may precede the
        // preemption); one that starts later must be refused.
        let fence_started = self.started.get(id).copied().flatten().map_or(0, |s| s.at);
        let lifted = self.unfenced_since(world, victim, fence_started)
            || self.rejoined_since(world, victim, fence_started);
        // A power cycle while the fence ran wiped what it had verified on that LU.
        let mut promised = vec![true; lus];
        for &(lu, at) in &self.forgot {
            if at > fence_started
                && let Some(slot) = promised.get_mut(lu)
            {
                *slot = false;
            }
        }
        // `unreachable=report`: the data LUs the fence reported not fenced are out of its
        // promise. The engine may leave out only an LU whose paths each stopped answering: the
        // last command of this fence on each was cut off or timed out. One the target last
        // answered, even with an error or a lost response, may still hold the victim's key
        // where the fence could have removed it (P1). A timeout cannot tell a healthy LU from
        // a lost array: the admin's opt-in asserts the array is down.
        let label = self
            .started
            .get(id)
            .copied()
            .flatten()
            .map(|start| (start.at, op_label(node, id, start.op)));
        for &lu in unfenced {
            let answered = label.as_ref().is_some_and(|(start, label)| {
                let mut last: Vec<(usize, bool)> = Vec::new();
                for e in world.log()[*start..index].iter().rev() {
                    if let SimEvent::Command {
                        label: l,
                        lu: on,
                        path,
                        outcome,
                        ..
                    } = e
                        && **l == **label
                        && *on == lu
                        && !last.iter().any(|(p, _)| p == path)
                    {
                        let silent =
                            outcome.starts_with("timed out") || outcome.starts_with("unreachable");
                        last.push((*path, !silent));
                    }
                }
                last.iter().any(|(_, answered)| *answered)
            });
            if answered {
                let message = format!(
                    "n{node}'s fence of n{victim} reported LU{lu} unreachable and not fenced, \
                     though the target answered it there"
                );
                self.violate("P1", message, Some(index));
            }
            if let Some(slot) = promised.get_mut(lu) {
                *slot = false;
            }
        }
        self.fenced.push(Fenced {
            by: node,
            victim,
            key: world.key(victim),
            at: index,
            lus: promised,
            lifted,
            removed: self.registered.contains(&world.key(victim)),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn refence_end(
        &mut self,
        world: &World,
        index: usize,
        node: usize,
        id: usize,
        outcome: Outcome,
        summary: &str,
        already: bool,
    ) {
        if outcome != Outcome::Success {
            self.violate(
                "P4",
                format!(
                    "repeating a fence once the faults were over did not succeed ({outcome:?}: \
                     {summary})"
                ),
                Some(index),
            );
        }
        if !already {
            return;
        }
        let Some(start) = self.started.get(id).copied().flatten() else {
            return;
        };
        let label = op_label(node, id, start.op);
        let changed: Vec<String> = world.log()[start.at..index]
            .iter()
            .filter_map(|e| match e {
                SimEvent::Command { label: l, what, .. }
                    if **l == *label && changes_target(what) =>
                {
                    Some(what.clone())
                }
                _ => None,
            })
            .collect();
        if !changed.is_empty() {
            self.violate(
                "P4",
                format!(
                    "fencing an already fenced node again sent commands that change the target: \
                     {}",
                    changed.join("; ")
                ),
                Some(index),
            );
        }
        if let Some(position) = self.refence_before.iter().position(|(i, _)| *i == id) {
            let (_, before) = self.refence_before.remove(position);
            let cluster = world.cluster();
            let after: Vec<Vec<Key>> = (0..cluster.lus.len()).map(|l| cluster.keys(l)).collect();
            if after != before {
                self.violate(
                    "P4",
                    format!(
                        "fencing an already fenced node again changed the registrations: \
                         {before:?} → {after:?}"
                    ),
                    Some(index),
                );
            }
        }
    }

    /// The state now: every promise of a successful fence still kept.
    fn state(&mut self, world: &World) {
        let cluster = world.cluster();
        for lu in 0..cluster.lus.len() {
            for key in cluster.keys(lu) {
                if !self.registered.contains(&key) {
                    self.registered.push(key);
                }
            }
        }
        let mut broken = Vec::new();
        for f in self.fenced.iter().filter(|f| !f.lifted) {
            for (lu, _) in f.lus.iter().enumerate().filter(|(_, on)| **on) {
                if cluster.has(lu, f.key) {
                    broken.push(format!(
                        "{} (node n{}) is registered on LU{lu} although n{}'s fence of it was \
                         reported successful (event {})",
                        f.key, f.victim, f.by, f.at
                    ));
                }
            }
        }
        // Lease mode: never two nodes whose machines hold an LU and can both write there.
        let holders = world.holders.lock().unwrap().clone();
        for lu in 0..cluster.lus.len() {
            let writers: Vec<usize> = holders
                .iter()
                .enumerate()
                .filter(|(node, held)| {
                    held.get(lu) == Some(&true)
                        && cluster.ports[lu]
                            .get(*node)
                            .is_some_and(|ports| ports.iter().any(|&p| cluster.may_write(lu, p)))
                })
                .map(|(node, _)| node)
                .collect();
            if writers.len() > 1 {
                broken.push(format!(
                    "two lease holders can write on LU{lu} at once: nodes {writers:?}"
                ));
            }
        }
        drop(cluster);
        for message in broken {
            let property = if message.starts_with("two lease") {
                "P2"
            } else {
                "P3"
            };
            self.violate(property, message, None);
        }
    }

    /// At the end of the run: the LUs of a mutual fence are not split between the two nodes.
    pub fn finish(&mut self, world: &World) {
        let cluster = world.cluster();
        let mut broken = Vec::new();
        for &(a, b, since) in &self.mutual {
            // A node unfenced explicitly during or after the fences is back by an admin's or
            // the cluster's decision; so may be one whose rejoin overlapped them (a later one
            // is refused, which the P3 check after every step holds it to).
            if [a, b].iter().any(|&n| {
                self.unfenced_since(world, n, since) || self.rejoined_since(world, n, since)
            }) {
                continue;
            }
            let (ka, kb) = (world.key(a), world.key(b));
            let kept = |l: &usize| !self.forgot.iter().any(|(lu, _)| lu == l);
            // The data LUs: coordinators are split by design after a race (issue 47).
            let a_only = (0..world.data_lus())
                .filter(kept)
                .find(|&l| cluster.has(l, ka) && !cluster.has(l, kb));
            let b_only = (0..world.data_lus())
                .filter(kept)
                .find(|&l| cluster.has(l, kb) && !cluster.has(l, ka));
            if let (Some(la), Some(lb)) = (a_only, b_only) {
                // A third node's fence of one of them that did not succeed may have removed it
                // from some LUs only: that fence reported failure and is rerun until it converges
                // (P4). One that succeeded reporting an LU out of its reach left the victim there
                // by the admin's choice, and the victim may have acted there since. The split is
                // then that fence's unfinished or declared work, not the pair's.
                if self.left_by_a_third_nodes_fence(world, (a, b), a, (lb, la), since)
                    || self.left_by_a_third_nodes_fence(world, (a, b), b, (la, lb), since)
                {
                    continue;
                }
                broken.push(format!(
                    "n{a} and n{b} fenced each other and both survived on different LUs: n{a} \
                     alone on LU{la}, n{b} alone on LU{lb}"
                ));
            }
        }
        drop(cluster);
        for message in broken {
            self.violate("P2", message, None);
        }
    }
}

/// Whether a command (as the trace names it) can change the target's reservation state: every PR
/// OUT, and NVMe's Register, Acquire and Release.
pub fn changes_target(what: &str) -> bool {
    const PREFIXES: [&str; 10] = [
        "REGISTER",
        "RESERVE key",
        "RELEASE key",
        "CLEAR key",
        "PREEMPT",
        "IOC_PR_REGISTER",
        "IOC_PR_RESERVE",
        "IOC_PR_RELEASE",
        "IOC_PR_PREEMPT",
        "IOC_PR_CLEAR",
    ];
    PREFIXES.iter().any(|p| what.starts_with(p))
        || ["opcode 0x0d", "opcode 0x11", "opcode 0x15"]
            .iter()
            .any(|o| what.contains(o))
}

impl Default for Checker {
    fn default() -> Self {
        Self::new()
    }
}
