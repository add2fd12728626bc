//! The engine against SPC-model LUs through the real codec and execution policy
//! (`ScsiPr<ModelDevice>`), with LIO's quirks unless a test says otherwise.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::exec::ScsiPr;
use crate::pr::{PrOut, PrOutAction};
use crate::spc_model::{
    CommandFilter, Injected, Injection, ModelDevice, ModelLu, Nexus, Quirks, Timing,
};
use crate::testing::{Cluster, Medium, MemoryRecord, Port, TargetModel};
use crate::transport::{CommandError, Policy, PrRequest, Reply};

type ModelPath = ScsiPr<ModelDevice>;

const A: Key = Key::new(0xa);
const B: Key = Key::new(0xb);
const C: Key = Key::new(0xc);

/// Fast NOT READY backoff for tests (every ops test and doctor's).
pub(in crate::ops) fn quick() -> Policy {
    Policy {
        not_ready_backoff: Duration::from_millis(1),
        ..Policy::default()
    }
}

/// For a test with a LU hung past the deadline: a 2 s deadline (the engine leaves the hung
/// thread behind, as the CLI and fence_pr do).
fn hung_lu_limits() -> Limits {
    Limits {
        deadline: Duration::from_secs(2),
        tie_break: TieBreak::Off,
    }
}

/// No tie-break wait: the race tests interleave the two nodes' commands themselves.
fn limits() -> Limits {
    Limits {
        deadline: Duration::from_secs(20),
        tie_break: TieBreak::Off,
    }
}

fn limits_with_tie_break(tie_break: Duration) -> Limits {
    Limits {
        tie_break: TieBreak::Fixed(tie_break),
        ..limits()
    }
}

/// Several LUs, several nodes, each node with its own paths (I_T nexuses) to every LU: a
/// [`Cluster`] over the SPC model, each path a `ScsiPr` with the quick policy.
struct Fixture {
    cluster: Cluster,
}

fn lu_id(lu: usize) -> String {
    Cluster::lu_id(lu)
}

impl Fixture {
    fn new(lus: usize, paths_per_node: &[usize], quirks: Quirks) -> Self {
        Fixture {
            cluster: Cluster::new(TargetModel::Scsi(quirks), lus, paths_per_node),
        }
    }

    fn model(&self, lu: usize) -> &Arc<Mutex<ModelLu>> {
        self.cluster.scsi_lu(lu).expect("an SPC fixture")
    }

    /// The I_T nexus of a path now.
    fn nexus(&self, lu: usize, node: usize, path: usize) -> Nexus {
        self.cluster.nexus(lu, node, path).expect("an SPC fixture")
    }

    /// The path's device now reaches the LU through `nexus` (after a re-login).
    fn set_nexus(&mut self, lu: usize, node: usize, path: usize, nexus: Nexus) {
        self.cluster.ports[lu][node][path] = Port::Nexus(nexus);
    }

    /// Node `node`'s view, handed over in reverse LU order (the engine must sort).
    fn targets(&self, node: usize) -> Vec<LuTarget<ModelPath>> {
        self.cluster.targets(node, |p| match (p.medium, p.port) {
            (Medium::Scsi(lu), Port::Nexus(nexus)) => {
                ScsiPr::new(ModelDevice::new(lu, nexus, p.device), quick())
            }
            _ => unreachable!("an SPC fixture"),
        })
    }

    fn keys(&self, lu: usize) -> Vec<Key> {
        self.cluster.keys(lu)
    }

    fn has(&self, lu: usize, key: Key) -> bool {
        self.cluster.has(lu, key)
    }

    fn key_of(&self, lu: usize, node: usize, path: usize) -> Option<Key> {
        self.cluster.key_of(lu, node, path)
    }

    fn reserved(&self, lu: usize) -> bool {
        self.cluster.reservation(lu).is_some()
    }

    /// One PR OUT from node `node`'s first path to LU `lu`, as an admin's sg_persist would send.
    fn pr_out(&self, node: usize, lu: usize, out: &PrOut) {
        self.targets(node)
            .into_iter()
            .find(|t| t.id == lu_id(lu))
            .unwrap()
            .paths[0]
            .pr_out(out)
            .unwrap();
    }

    fn with_lu<R>(&self, lu: usize, f: impl FnOnce(&mut ModelLu) -> R) -> R {
        f(&mut self.model(lu).lock().unwrap())
    }

    fn unfence(&self, node: usize, key: Key) -> Report {
        unfence(self.targets(node), key, limits()).unwrap()
    }

    fn fence(&self, node: usize, own: Key, victim: Key) -> Report {
        fence(self.targets(node), own, victim, limits()).unwrap()
    }

    fn status(&self, node: usize, key: Key) -> Report {
        status(self.targets(node), key, limits()).unwrap()
    }

    fn heal(&self, node: usize, key: Key) -> Report {
        heal(self.targets(node), key, limits()).unwrap()
    }

    fn snapshot(&self) -> Vec<(Vec<Key>, bool)> {
        (0..self.cluster.lus.len())
            .map(|lu| (self.keys(lu), self.reserved(lu)))
            .collect()
    }
}

fn two_nodes(lus: usize, paths: usize) -> Fixture {
    let f = Fixture::new(lus, &[paths, paths], Quirks::lio());
    assert_eq!(f.unfence(0, A).outcome, Outcome::Success);
    assert_eq!(f.unfence(1, B).outcome, Outcome::Success);
    f
}

fn ids(report: &Report) -> Vec<&str> {
    report.lus.iter().map(|r| r.lu.as_str()).collect()
}

// ----- unfence -----

#[test]
fn unfence_registers_every_path_reserves_and_verifies() {
    let f = Fixture::new(3, &[2, 2], Quirks::lio());
    let report = f.unfence(0, A);
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    assert_eq!(ids(&report), [lu_id(0), lu_id(1), lu_id(2)]);
    for lu in 0..3 {
        assert_eq!(f.key_of(lu, 0, 0), Some(A));
        assert_eq!(f.key_of(lu, 0, 1), Some(A));
        assert!(f.reserved(lu));
        let r = &report.lus[lu];
        assert!(r.ok && r.verdict == Verdict::Unfenced);
        assert_eq!(r.keys.as_deref(), Some(&[A, A][..]));
        assert_eq!(
            r.reservation.map(|v| (v.key, v.rtype)),
            Some((A, FENCING_TYPE))
        );
        assert!(r.paths.iter().all(|p| p.state == PathUse::Ok));
    }
}

#[test]
fn unfence_is_idempotent_and_keeps_another_nodes_reservation() {
    let f = two_nodes(2, 2);
    let before = f.snapshot();
    let again = f.unfence(1, B);
    assert_eq!(again.outcome, Outcome::Success);
    assert_eq!(f.snapshot(), before, "a rerun changes nothing");
    // Node 0 reserved first; node 1's unfence keeps that reservation.
    for lu in 0..2 {
        let r = &again.lus[lu];
        assert_eq!(r.reservation.map(|v| v.key), Some(A));
    }
}

/// Node `node`'s record holding the LUs numbered `lus`.
fn record_of(f: &Fixture, node: usize, lus: &[usize]) -> Arc<MemoryRecord> {
    Arc::new(MemoryRecord::of(
        f.targets(node)
            .into_iter()
            .map(|lu| lu.id)
            .filter(|id| lus.iter().any(|&n| *id == lu_id(n))),
    ))
}

/// Node `node`'s `on` with its record of this boot (fence_pr's rejoin).
fn rejoin_with(f: &Fixture, node: usize, key: Key, record: &Arc<MemoryRecord>) -> Report {
    let record: Arc<dyn BootRecord> = record.clone();
    unfence_observed(
        f.targets(node),
        key,
        UnfenceBy::Rejoin(record),
        &[],
        limits(),
        &mut |_| {},
    )
    .unwrap()
}

/// Node `node`'s `on`, told it registered on the LUs numbered `before` earlier in this boot.
fn rejoin(f: &Fixture, node: usize, key: Key, before: &[usize]) -> Report {
    rejoin_with(f, node, key, &record_of(f, node, before))
}

/// P3 against Pacemaker unfencing a node it has just fenced (fence-reaction=stop): once its key
/// is gone from an LU it registered on before, it registers nowhere, not even on an LU it never
/// registered on; an explicit unfence (no record) registers.
#[test]
fn unfence_after_a_fence_refuses_the_lus_registered_before() {
    let f = two_nodes(3, 2);
    assert_eq!(f.fence(0, A, B).outcome, Outcome::Success);
    let refused = rejoin(&f, 1, B, &[0, 1]);
    assert_eq!(refused.outcome, Outcome::ThisNodeFenced, "{refused:#?}");
    assert!(
        refused.summary.contains(&lu_id(0))
            && refused.summary.contains(&lu_id(1))
            && refused.summary.contains("not registered on any LU"),
        "{}",
        refused.summary
    );
    for lu in 0..2 {
        let r = &refused.lus[lu];
        assert_eq!(r.verdict, Verdict::ThisNodeFenced, "{r:#?}");
        assert!(!r.ok);
        assert_eq!(f.keys(lu), [A, A], "LU {lu}: B must not be back");
        assert!(
            r.error
                .as_ref()
                .unwrap()
                .to_string()
                .contains("preempted since")
        );
        // The report shows who holds the LU now.
        assert_eq!(r.reservation.map(|v| v.key), Some(A));
    }
    assert_eq!(refused.lus[2].verdict, Verdict::Skipped, "{refused:#?}");
    assert_eq!(
        f.keys(2),
        [A, A],
        "B must not come back on an LU it never registered on"
    );
    // The refusal holds however often it is asked.
    assert_eq!(rejoin(&f, 1, B, &[0, 1]).outcome, Outcome::ThisNodeFenced);
    assert!((0..3).all(|lu| !f.has(lu, B)));
    // The explicit way back.
    assert_eq!(f.unfence(1, B).outcome, Outcome::Success);
    assert!((0..3).all(|lu| f.has(lu, B)));
}

/// An `on` that stopped after its REGISTER landed (here: the reply lost) has the LU in its record
/// already, so after a fence its rerun is refused (the simulation's boot seed 63: the record was
/// written after the `on`, only for the LUs that succeeded, and the rerun brought the key back).
/// An LU the `on` could not even read is not recorded: a rerun registers there.
#[test]
fn a_rejoin_records_each_lu_before_registering_there() {
    let f = Fixture::new(2, &[1, 1], Quirks::lio());
    f.unfence(0, A);
    // Node 1's REGISTER on LU 0 is applied and its reply lost; its first command to LU 1 (the
    // READ KEYS) times out unsent.
    let register = CommandFilter::Only(crate::spc_model::ModelCommand::PrOut(
        PrOutAction::RegisterAndIgnoreExistingKey,
    ));
    for (lu, timing, filter) in [
        (0, Timing::AfterExecuting, register),
        (1, Timing::InsteadOfExecuting, CommandFilter::Any),
    ] {
        let nexus = f.nexus(lu, 1, 0);
        let timeout = Injection {
            fault: Injected::Timeout,
            timing,
            filter,
            count: 1,
        };
        f.with_lu(lu, |l| l.inject(nexus, timeout));
    }
    let record = Arc::new(MemoryRecord::default());
    let first = rejoin_with(&f, 1, B, &record);
    assert_eq!(first.outcome, Outcome::Failure, "{first:#?}");
    assert!(f.has(0, B), "the REGISTER landed, its reply was lost");
    assert!(!f.has(1, B));
    assert!(record.has(&lu_id(0)));
    assert!(!record.has(&lu_id(1)), "never read: not recorded");
    assert_eq!(f.fence(0, A, B).outcome, Outcome::Success);
    let refused = rejoin_with(&f, 1, B, &record);
    assert_eq!(refused.outcome, Outcome::ThisNodeFenced, "{refused:#?}");
    assert!(!f.has(0, B) && !f.has(1, B), "B must not be back");
    // Without the fence, a rerun of the first `on` finishes the job where it could not read.
    let g = Fixture::new(2, &[1, 1], Quirks::lio());
    g.unfence(0, A);
    let record = record_of(&g, 1, &[0]);
    g.pr_out(1, 0, &PrOut::register_ignore(B));
    let rerun = rejoin_with(&g, 1, B, &record);
    assert_eq!(rerun.outcome, Outcome::Success, "{rerun:#?}");
    assert!(g.has(0, B) && g.has(1, B));
    assert!(record.has(&lu_id(1)));
}

/// An explicit unfence records the LUs too: a node the admin unfenced, then fenced, is refused
/// by its rejoin like one that ran `on` (the simulation found that gap: the admin's unfence
/// kept no record, so fence_pr's `on` after the fence brought the key back). The explicit
/// unfence itself registers after the fence: it is the way back.
#[test]
fn an_explicit_unfence_is_recorded_for_the_rejoins_after_it() {
    let f = Fixture::new(2, &[1, 1], Quirks::lio());
    f.unfence(0, A);
    let record = Arc::new(MemoryRecord::default());
    let admin = |record: &Arc<MemoryRecord>| {
        let record: Arc<dyn BootRecord> = record.clone();
        unfence_observed(
            f.targets(1),
            B,
            UnfenceBy::Admin(record),
            &[],
            limits(),
            &mut |_| {},
        )
        .unwrap()
    };
    assert_eq!(admin(&record).outcome, Outcome::Success);
    assert!(record.has(&lu_id(0)) && record.has(&lu_id(1)));
    assert_eq!(f.fence(0, A, B).outcome, Outcome::Success);
    assert_eq!(
        rejoin_with(&f, 1, B, &record).outcome,
        Outcome::ThisNodeFenced
    );
    assert!(!f.has(0, B) && !f.has(1, B));
    assert_eq!(admin(&record).outcome, Outcome::Success);
    assert!(f.has(0, B) && f.has(1, B));
}

/// The record does not stand in the way of an ordinary rerun: where the key is still registered
/// (on any path) unfence registers the other paths.
#[test]
fn unfence_registered_before_reruns_where_the_key_is_present() {
    let mut f = two_nodes(2, 2);
    let snapshot = f.snapshot();
    let rerun = rejoin(&f, 1, B, &[0, 1]);
    assert_eq!(rerun.outcome, Outcome::Success, "{rerun:#?}");
    assert_eq!(f.snapshot(), snapshot);
    // Node 1's second path is a new iSCSI session without a registration; the key is still there.
    let old = f.nexus(0, 1, 1);
    f.set_nexus(0, 1, 1, f.with_lu(0, |l| l.relogin(old, "23d0000ee")));
    assert_eq!(f.key_of(0, 1, 1), None);
    assert_eq!(rejoin(&f, 1, B, &[0, 1]).outcome, Outcome::Success);
    assert_eq!(f.key_of(0, 1, 1), Some(B));
}

/// An LU that lost every key (a CLEAR, or a power cycle without APTPL) also lost the evidence of
/// any fence before: a node that registered there in this boot is not registered again, since
/// it cannot tell that it was not fenced first (the simulation's seed 98449: B fenced, the LU
/// power-cycled, B's rejoin registered and B then fenced A, the survivor), nor anywhere else;
/// the explicit unfence registers as usual.
#[test]
fn unfence_registered_before_refuses_an_lu_that_lost_every_key() {
    let f = two_nodes(3, 2);
    assert_eq!(f.fence(0, A, B).outcome, Outcome::Success);
    f.pr_out(0, 1, &PrOut::clear(A));
    assert!(f.keys(1).is_empty());
    let refused = rejoin(&f, 1, B, &[0, 1]);
    assert_eq!(refused.outcome, Outcome::ThisNodeFenced, "{refused:#?}");
    let lu = &refused.lus[1];
    assert_eq!(lu.verdict, Verdict::ThisNodeFenced, "{lu:#?}");
    assert!(
        lu.error
            .as_ref()
            .unwrap()
            .to_string()
            .contains("neither is any other key"),
        "{lu:#?}"
    );
    assert!(f.keys(1).is_empty(), "B must not be back on the cleared LU");
    assert_eq!(f.keys(0), [A, A]);
    assert!(
        refused.summary.contains("lost every key"),
        "{}",
        refused.summary
    );
    assert!(!f.has(2, B), "nor on the LU never registered on");
    assert_eq!(f.unfence(1, B).outcome, Outcome::Success);
    assert_eq!(f.keys(1), [B, B]);
}

#[test]
fn the_json_shape_is_one_object_per_lu_with_its_evidence() {
    let f = two_nodes(2, 1);
    let report = f.fence(0, A, B);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["command"], "fence");
    assert_eq!(json["outcome"], "success");
    let lu = &json["lus"][0];
    assert_eq!(lu["lu"], lu_id(0).as_str());
    assert_eq!(lu["ok"], true);
    assert_eq!(lu["verdict"], "victim_removed");
    assert_eq!(lu["paths"][0]["device"], "/dev/n0l0p0");
    assert_eq!(lu["paths"][0]["state"], "ok");
    assert_eq!(lu["keys"], serde_json::json!(["0x000000000000000a"]));
    assert_eq!(lu["reservation"]["key"], "0x000000000000000a");
    assert_eq!(lu["reservation"]["type"], "wero");
    assert!(lu["generation"].is_u64());
    assert!(lu.get("error").is_none());
}

// ----- status -----

#[test]
fn status_reports_all_none_or_which() {
    let f = Fixture::new(3, &[1], Quirks::lio());
    let none = f.status(0, A);
    assert_eq!(none.outcome, Outcome::Off);
    // Register on LU 1 only.
    f.pr_out(0, 1, &PrOut::register_ignore(A));
    let partial = f.status(0, A);
    assert_eq!(partial.outcome, Outcome::Partial);
    assert!(partial.summary.contains(&lu_id(0)) && partial.summary.contains(&lu_id(2)));
    assert!(!partial.summary.contains(&format!("not on: {}", lu_id(1))));
    f.unfence(0, A);
    let all = f.status(0, A);
    assert_eq!(all.outcome, Outcome::Success);
    assert!(
        all.lus
            .iter()
            .all(|r| r.verdict == Verdict::Registered && r.ok)
    );
}

// ----- fence -----

#[test]
fn fence_removes_the_victim_everywhere_and_converges() {
    let f = two_nodes(4, 2);
    let report = f.fence(0, A, B);
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    for lu in 0..4 {
        assert!(!f.has(lu, B) && f.has(lu, A) && f.reserved(lu));
        assert_eq!(report.lus[lu].verdict, Verdict::VictimRemoved);
    }
    assert_eq!(f.status(1, B).outcome, Outcome::Off);
    // P4: again, nothing left to do, still success.
    let again = f.fence(0, A, B);
    assert_eq!(again.outcome, Outcome::Success);
    assert!(
        again
            .lus
            .iter()
            .all(|r| r.verdict == Verdict::AlreadyFenced)
    );
}

#[test]
fn fence_refuses_bad_keys() {
    let f = two_nodes(1, 1);
    assert_eq!(
        fence(f.targets(0), A, A, limits()).unwrap_err(),
        RequestError::SameKey(A)
    );
    assert_eq!(
        fence(f.targets(0), A, Key::ZERO, limits()).unwrap_err(),
        RequestError::ZeroKey
    );
    assert_eq!(
        fence(Vec::<LuTarget<ModelPath>>::new(), A, B, limits()).unwrap_err(),
        RequestError::NoLus
    );
}

#[test]
fn the_loser_of_a_fence_race_touches_nothing() {
    let f = two_nodes(3, 2);
    assert_eq!(f.fence(0, A, B).outcome, Outcome::Success);
    let after_winner = f.snapshot();
    let loser = f.fence(1, B, A);
    assert_eq!(loser.outcome, Outcome::ThisNodeFenced);
    assert_eq!(loser.lus[0].verdict, Verdict::ThisNodeFenced);
    assert!(loser.lus[1..].iter().all(|r| r.verdict == Verdict::Skipped));
    assert!(
        loser.lus[0]
            .error
            .as_ref()
            .map(ToString::to_string)
            .unwrap()
            .contains("prfence unfence")
    );
    assert_eq!(
        f.snapshot(),
        after_winner,
        "P2/P3: the loser changed nothing"
    );
}

// ----- tie-break (two PREEMPTs must not cross on one LU: they can lock up LIO) -----

fn tie_break_notes(report: &Report) -> usize {
    report.lus[0]
        .notes
        .iter()
        .filter(|n| n.to_string().contains("tie-break"))
        .count()
}

#[test]
fn the_smaller_key_fences_at_once() {
    let f = two_nodes(2, 1);
    // A wait of a minute would outlast the 20 s deadline and time the arbiter out.
    let report = fence(
        f.targets(0),
        A,
        B,
        limits_with_tie_break(Duration::from_secs(60)),
    )
    .unwrap();
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    assert_eq!(tie_break_notes(&report), 0);
}

#[test]
fn the_greater_key_waits_then_fences_a_peer_that_did_not_act() {
    let f = two_nodes(2, 1);
    let report = fence(
        f.targets(1),
        B,
        A,
        limits_with_tie_break(Duration::from_millis(20)),
    )
    .unwrap();
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    assert_eq!(tie_break_notes(&report), 1);
    assert!((0..2).all(|lu| f.has(lu, B) && !f.has(lu, A)));
}

/// The default tie-break is measured: twice what the fence took from its start to the arbiter's
/// first answer, at most its cap; a fixed one is what it says, and off is none.
#[test]
fn a_measured_tie_break_is_twice_the_time_to_the_arbiter_at_most_the_cap() {
    let since = std::time::Instant::now();
    let measured = TieBreak::Measured {
        since,
        cap: TIE_BREAK_CAP,
    };
    assert_eq!(
        measured.wait(since + Duration::from_millis(30)),
        Duration::from_millis(60)
    );
    assert_eq!(
        measured.wait(since + Duration::from_millis(499)),
        Duration::from_millis(998)
    );
    assert_eq!(measured.wait(since + Duration::from_secs(3)), TIE_BREAK_CAP);
    assert_eq!(
        TieBreak::Fixed(Duration::from_secs(2)).wait(since),
        Duration::from_secs(2)
    );
    assert_eq!(
        TieBreak::Off.wait(since + Duration::from_secs(1)),
        Duration::ZERO
    );
}

/// A fence with the default (measured) tie-break: the greater key still waits, reads again and
/// fences a peer that did not act, and says how long it waited.
#[test]
fn the_greater_key_waits_a_measured_tie_break_by_default() {
    let f = two_nodes(2, 1);
    let report = fence(f.targets(1), B, A, Limits::default()).unwrap();
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    assert_eq!(tie_break_notes(&report), 1, "{report:#?}");
    let note = report.lus[0]
        .notes
        .iter()
        .map(ToString::to_string)
        .find(|n| n.contains("tie-break"))
        .unwrap();
    assert!(
        note.contains("twice this fence's time to the arbiter's answer"),
        "{note}"
    );
    assert!((0..2).all(|lu| f.has(lu, B) && !f.has(lu, A)));
}

#[test]
fn the_greater_key_that_is_fenced_during_its_wait_sends_nothing() {
    let f = Arc::new(two_nodes(2, 1));
    let preempted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiting = {
        let f = Arc::clone(&f);
        let preempted = Arc::clone(&preempted);
        std::thread::spawn(move || {
            let targets = hooked(
                f.targets(1),
                (&lu_id(0), 0),
                PrOutAction::PreemptAndAbort,
                Box::new(move || preempted.store(true, std::sync::atomic::Ordering::SeqCst)),
            );
            fence(targets, B, A, limits_with_tie_break(Duration::from_secs(2))).unwrap()
        })
    };
    // B has read the keys (instant on the model) and waits; A fences it meanwhile.
    std::thread::sleep(Duration::from_millis(200));
    let generation = f.with_lu(0, |l| l.generation());
    let winner = f.fence(0, A, B);
    assert_eq!(winner.outcome, Outcome::Success, "{winner:#?}");
    let after_winner = f.snapshot();
    let generation_after_winner = f.with_lu(0, |l| l.generation());
    assert!(generation_after_winner > generation);
    let loser = waiting.join().unwrap();
    assert_eq!(loser.outcome, Outcome::ThisNodeFenced, "{loser:#?}");
    assert_eq!(tie_break_notes(&loser), 1);
    assert!(loser.lus[1..].iter().all(|r| r.verdict == Verdict::Skipped));
    assert_eq!(f.snapshot(), after_winner, "the loser changed nothing");
    assert_eq!(f.with_lu(0, |l| l.generation()), generation_after_winner);
    assert!(
        !preempted.load(std::sync::atomic::Ordering::SeqCst),
        "the loser never sent its PREEMPT AND ABORT to the arbiter"
    );
}

#[test]
fn a_failing_arbiter_stops_the_fan_out() {
    let f = two_nodes(3, 1);
    let arbiter = f.nexus(0, 0, 0);
    f.with_lu(0, |lu| lu.fail_next(arbiter, Injected::TransportDown, 100));
    let report = f.fence(0, A, B);
    assert_eq!(report.outcome, Outcome::Failure);
    assert_eq!(report.lus[0].verdict, Verdict::Failed);
    assert!(
        report.lus[1..]
            .iter()
            .all(|r| r.verdict == Verdict::Skipped)
    );
    assert!(f.has(1, B) && f.has(2, B), "no other LU touched");
}

#[test]
fn the_arbiter_is_chosen_by_identifier_not_by_argument_order() {
    let f = two_nodes(3, 1);
    // Node 1 lists the LUs in another order and has fenced node 0 on LU 2 only (e.g. a half
    // finished earlier run of its own). The arbiter is still LU 0, where node 0 is present.
    let mut b_targets = f.targets(1);
    b_targets.swap(0, 2);
    let lu2 = b_targets.iter().find(|t| t.id == lu_id(2)).unwrap();
    lu2.paths[0]
        .pr_out(&PrOut::preempt_and_abort(B, A, FENCING_TYPE))
        .unwrap();
    let report = f.fence(0, A, B);
    assert_eq!(report.lus[0].lu, lu_id(0));
    assert_eq!(report.lus[0].verdict, Verdict::VictimRemoved, "{report:#?}");
    assert_eq!(report.lus[1].verdict, Verdict::VictimRemoved, "{report:#?}");
    // LU 2: node 0 is gone there. Winning the arbiter is no licence to register again (P3):
    // the LU is left alone and the fence does not succeed, so the cluster does not go on.
    assert_eq!(
        report.lus[2].verdict,
        Verdict::ThisNodeFenced,
        "{report:#?}"
    );
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    assert!(!f.has(2, A) && f.has(2, B));
}

#[test]
fn a_fence_with_an_unidentified_device_sends_nothing() {
    // Node 0 cannot read LU 0's identifier (its device vanished as the command started), so LU 0
    // is named by its device path here while node 1 makes LU 0 its arbiter. Were node 0 to fence
    // under LU 1 instead, a mutual fence could leave LU 0 with node 1 and the others with node 0
    // (P2). Node 0 sends nothing and says which device; node 1's fence is whole.
    let f = two_nodes(3, 1);
    let before = f.snapshot();
    let rename = |targets: &mut Vec<LuTarget<ModelPath>>, which: &[usize]| {
        for t in targets.iter_mut() {
            if let Some(lu) = which.iter().find(|&&lu| t.id == lu_id(lu)) {
                t.id = format!("/dev/sdq{lu}").into();
            }
        }
    };
    let mut targets = f.targets(0);
    rename(&mut targets, &[0]);
    let report = fence(targets, A, B, limits()).unwrap();
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    assert_eq!(ids(&report), [lu_id(1).as_str(), &lu_id(2), "/dev/sdq0"]);
    let verdicts: Vec<Verdict> = report.lus.iter().map(|r| r.verdict).collect();
    assert_eq!(
        verdicts,
        [Verdict::Skipped, Verdict::Skipped, Verdict::Failed],
        "{report:#?}"
    );
    assert!(report.summary.contains("/dev/sdq0"), "{}", report.summary);
    assert_eq!(f.snapshot(), before, "a command was sent");

    // No device identified at all: no arbiter either, nothing sent.
    let mut targets = f.targets(0);
    rename(&mut targets, &[0, 1, 2]);
    let report = fence(targets, A, B, limits()).unwrap();
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    assert!(report.lus.iter().all(|r| r.verdict == Verdict::Failed));
    assert_eq!(f.snapshot(), before, "a command was sent");

    // One LU alone needs no arbiter: a device named by its path is fenced.
    let mut targets = f.targets(0);
    targets.retain(|t| t.id == lu_id(2));
    rename(&mut targets, &[2]);
    let report = fence(targets, A, B, limits()).unwrap();
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    assert!(f.has(2, A) && !f.has(2, B));

    let report = f.fence(1, B, A);
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    assert_eq!(
        report.lus[2].verdict,
        Verdict::ThisNodeFenced,
        "{report:#?}"
    );
    assert!((0..2).all(|lu| f.has(lu, B) && !f.has(lu, A)));
}

/// Node 0's view of a [`two_nodes`] fixture of five LUs: 0 and 1 the data LUs, 2..=4 the
/// coordinators (given to `edit` first), as a coordinated fence takes them.
fn coordinated(
    f: &Fixture,
    unreachable_data: UnreachableData,
    edit: impl FnOnce(&mut Vec<LuTarget<ModelPath>>),
) -> (Vec<LuTarget<ModelPath>>, Arbitration<ModelPath>) {
    let (mut coordinators, data): (Vec<_>, Vec<_>) = f
        .targets(0)
        .into_iter()
        .partition(|t| (2..=4).any(|lu| t.id == lu_id(lu)));
    edit(&mut coordinators);
    let arbitration = Arbitration::Coordinators {
        lus: coordinators,
        unreachable_data,
    };
    (data, arbitration)
}

#[test]
fn a_coordinator_not_identified_counts_as_lost_and_is_sent_nothing() {
    // LUs 0 and 1 hold data, 2..=4 are the coordinators. Node 0 cannot identify coordinator 4
    // (its device gone with its array): the fence still wins on 2 and 3, a majority of the three,
    // and fences the data LUs; coordinator 4 is reported lost and gets no command.
    let f = two_nodes(5, 1);
    let split = |f: &Fixture, unidentified: &[usize]| {
        coordinated(f, UnreachableData::Fail, |coordinators| {
            for t in coordinators.iter_mut() {
                if let Some(lu) = unidentified.iter().find(|&&lu| t.id == lu_id(lu)) {
                    t.id = format!("/dev/sdq{lu}").into();
                }
            }
        })
    };
    let (data, coordinators) = split(&f, &[4]);
    let report =
        fence_arbitrated_observed(data, coordinators, A, B, limits(), &mut |_| {}).unwrap();
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    let lost = report.lus.iter().find(|r| r.lu.as_str() == "/dev/sdq4");
    assert_eq!(
        lost.map(|r| (r.ok, r.verdict)),
        Some((false, Verdict::Failed))
    );
    assert!(
        f.has(4, B) && f.has(4, A),
        "a command reached the unidentified coordinator"
    );
    for lu in [0, 1, 2, 3] {
        assert!(f.has(lu, A) && !f.has(lu, B), "LU {lu}: {:?}", f.keys(lu));
    }

    // Two of three not identified: no majority can be won; no data LU is touched (coordinator 2
    // alone is fenced).
    let f = two_nodes(5, 1);
    let (data, coordinators) = split(&f, &[3, 4]);
    let report =
        fence_arbitrated_observed(data, coordinators, A, B, limits(), &mut |_| {}).unwrap();
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    for lu in [0, 1, 3, 4] {
        assert!(f.has(lu, A) && f.has(lu, B), "LU {lu}: {:?}", f.keys(lu));
    }
    assert!(
        f.has(2, A) && !f.has(2, B),
        "coordinator 2: {:?}",
        f.keys(2)
    );
}

#[test]
fn unreachable_data_report_leaves_only_unanswering_data_lus_unfenced() {
    // LUs 0 and 1 hold data, 2..=4 are the coordinators; node 0 fences node 1.
    let fence_with = |f: &Fixture, unreachable_data: UnreachableData| {
        let (data, arbitration) = coordinated(f, unreachable_data, |_| {});
        fence_arbitrated_observed(data, arbitration, A, B, limits(), &mut |_| {}).unwrap()
    };
    // The LU no longer offered to node 0 (LOGICAL UNIT NOT SUPPORTED), as the lab's unmapping
    // does: a gone path (a disconnected nexus answers DID_TRANSPORT_DISRUPTED here, which may be
    // a lost response and is not out of reach).
    let cut = |f: &Fixture, lu: usize| {
        let path = f.nexus(lu, 0, 0);
        let unmapped = crate::spc_model::ScsiFailure::CheckCondition {
            key: 0x05,
            asc: 0x25,
            ascq: 0x00,
        };
        f.with_lu(lu, |l| l.fail_next(path, Injected::Failure(unmapped), 1000));
    };
    // Data LU 1 out of node 0's reach (its array down): the default fails naming it.
    let f = two_nodes(5, 1);
    cut(&f, 1);
    let report = fence_with(&f, UnreachableData::Fail);
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    assert!(report.summary.contains(&lu_id(1)), "{}", report.summary);
    // The opt-in: success, LU 1 named as not fenced; B's key is still there, gone from LU 0.
    let f = two_nodes(5, 1);
    cut(&f, 1);
    let report = fence_with(&f, UnreachableData::Report);
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    assert!(
        report
            .summary
            .contains(&format!("NOT fenced on {}", lu_id(1))),
        "{}",
        report.summary
    );
    let lu1 = report.lus.iter().find(|r| r.lu.as_str() == lu_id(1));
    assert_eq!(lu1.map(|r| r.ok), Some(false));
    assert!(!f.has(0, B) && f.has(0, A) && f.has(1, B));
    // Every data LU out of reach: nothing fenced, no success.
    let f = two_nodes(5, 1);
    cut(&f, 0);
    cut(&f, 1);
    let report = fence_with(&f, UnreachableData::Report);
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    // A data LU that answers with an error is not out of reach: it fails the fence.
    let f = two_nodes(5, 1);
    let path = f.nexus(1, 0, 0);
    f.with_lu(1, |l| {
        l.fail_next(
            path,
            Injected::Failure(crate::spc_model::ScsiFailure::invalid_field_in_cdb()),
            100,
        )
    });
    let report = fence_with(&f, UnreachableData::Report);
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    assert!(f.has(1, B));
}

#[test]
fn preempt_and_abort_refused_falls_back_to_preempt_and_says_so() {
    let quirks = Quirks {
        preempt_and_abort_supported: false,
        ..Quirks::lio()
    };
    let f = Fixture::new(2, &[1, 1], quirks);
    f.unfence(0, A);
    f.unfence(1, B);
    let report = f.fence(0, A, B);
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    for r in &report.lus {
        assert!(
            r.notes
                .iter()
                .any(|n| n.to_string().contains("fell back to PREEMPT")),
            "{r:#?}"
        );
        assert!(r.paths.iter().all(|p| p.state == PathUse::Ok));
    }
    assert!(!f.has(0, B) && !f.has(1, B));
}

#[test]
fn a_dead_path_is_reported_and_not_fatal() {
    let f = Fixture::new(2, &[2, 1], Quirks::lio());
    for lu in 0..2 {
        let dead = f.nexus(lu, 0, 0);
        f.with_lu(lu, |l| l.disconnect(dead));
    }
    let report = f.unfence(0, A);
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    f.unfence(1, B);
    let report = f.fence(0, A, B);
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    for r in &report.lus {
        assert_eq!(r.paths[0].state, PathUse::Dead);
        assert!(
            r.paths[0]
                .error
                .as_ref()
                .map(ToString::to_string)
                .unwrap()
                .contains("/dev/n0")
        );
        assert_eq!(r.paths[1].state, PathUse::Ok);
        assert!(
            r.notes
                .iter()
                .any(|n| n.to_string().contains("dead, handled through")),
            "{r:#?}"
        );
    }
}

#[test]
fn all_paths_dead_fails_the_lu() {
    let f = two_nodes(2, 1);
    let dead = f.nexus(1, 0, 0);
    f.with_lu(1, |l| l.disconnect(dead));
    let report = f.fence(0, A, B);
    assert_eq!(report.outcome, Outcome::Failure);
    assert_eq!(report.lus[1].verdict, Verdict::Failed);
    assert_eq!(report.lus[1].paths[0].state, PathUse::Dead);
}

// ----- P4: failures midway, then a rerun converges -----

#[test]
fn a_timeout_on_one_lu_of_eight_fails_the_run_and_a_rerun_converges() {
    let f = two_nodes(8, 1);
    let lu3 = f.nexus(3, 0, 0);
    f.with_lu(3, |l| l.fail_next(lu3, Injected::Timeout, 1000));
    let first = f.fence(0, A, B);
    assert_eq!(first.outcome, Outcome::Failure);
    // The transport's words for a timeout (the hint that used to follow is the front end's).
    let error = first.lus[3]
        .error
        .as_ref()
        .map(ToString::to_string)
        .unwrap();
    assert!(
        !first.lus[3].ok && error.contains("no completion within"),
        "{error}"
    );
    assert!(first.summary.contains(&lu_id(3)));
    for lu in (0..8).filter(|&lu| lu != 3) {
        assert!(first.lus[lu].ok && !f.has(lu, B));
    }
    assert!(f.has(3, B));
    f.with_lu(3, |l| l.clear_injections(lu3));
    let second = f.fence(0, A, B);
    assert_eq!(second.outcome, Outcome::Success, "{second:#?}");
    assert_eq!(second.lus[3].verdict, Verdict::VictimRemoved);
    assert!((0..8).all(|lu| !f.has(lu, B) && f.has(lu, A) && f.reserved(lu)));
}

#[test]
fn a_lost_response_after_the_preempt_applied_converges_on_rerun() {
    let f = two_nodes(3, 1);
    let n = f.nexus(2, 0, 0);
    f.with_lu(2, |l| {
        l.inject(
            n,
            Injection {
                fault: Injected::Timeout,
                timing: Timing::AfterExecuting,
                filter: CommandFilter::Only(crate::spc_model::ModelCommand::PrOut(
                    PrOutAction::PreemptAndAbort,
                )),
                count: 1,
            },
        )
    });
    let first = f.fence(0, A, B);
    assert_eq!(first.lus[2].verdict, Verdict::Failed);
    assert!(!f.has(2, B), "applied although the answer was lost");
    let second = f.fence(0, A, B);
    assert_eq!(second.outcome, Outcome::Success);
    assert_eq!(second.lus[2].verdict, Verdict::AlreadyFenced);
}

#[test]
fn unfence_after_a_partial_failure_converges() {
    let f = Fixture::new(8, &[2], Quirks::lio());
    let n = f.nexus(5, 0, 1);
    f.with_lu(5, |l| {
        l.inject(
            n,
            Injection {
                fault: Injected::Failure(crate::spc_model::ScsiFailure::invalid_field_in_cdb()),
                timing: Timing::InsteadOfExecuting,
                filter: CommandFilter::AnyPrOut,
                count: 1,
            },
        )
    });
    let first = f.unfence(0, A);
    assert_eq!(
        first.outcome,
        Outcome::Success,
        "the other path reserved: {first:#?}"
    );
    // The failed path's registration is missing; a rerun adds it.
    assert_eq!(f.key_of(5, 0, 1), None);
    assert_eq!(first.lus[5].paths[1].state, PathUse::Failed);
    let second = f.unfence(0, A);
    assert_eq!(second.outcome, Outcome::Success);
    assert_eq!(f.key_of(5, 0, 1), Some(A));
}

// ----- overall deadline -----

/// A path whose commands take `delay` each.
struct Slow<T> {
    inner: T,
    delay: Duration,
}

impl<T: PrTransport> PrTransport for Slow<T> {
    fn device(&self) -> &Path {
        self.inner.device()
    }
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        if request != PrRequest::ReportCapabilities {
            std::thread::sleep(self.delay);
        }
        self.inner.execute(request)
    }
}

#[test]
fn lus_pending_at_the_deadline_are_timed_out() {
    let f = Fixture::new(3, &[1], Quirks::lio());
    let targets: Vec<LuTarget<Slow<ModelPath>>> = f
        .targets(0)
        .into_iter()
        .map(|t| {
            let slow = t.id == lu_id(1);
            LuTarget {
                id: t.id,
                paths: t
                    .paths
                    .into_iter()
                    .map(|inner| Slow {
                        inner,
                        delay: if slow {
                            Duration::from_millis(400)
                        } else {
                            Duration::ZERO
                        },
                    })
                    .collect(),
            }
        })
        .collect();
    let started = std::time::Instant::now();
    let report = unfence(
        targets,
        A,
        Limits {
            deadline: Duration::from_millis(100),
            ..limits()
        },
    )
    .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(report.outcome, Outcome::Failure);
    assert_eq!(report.lus[1].verdict, Verdict::TimedOut);
    assert!(report.lus[0].ok && report.lus[2].ok);
}

// ----- the observer: each LU told once, as it finishes -----

/// What an observer was told of one LU.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Told {
    lu: String,
    verdict: Verdict,
    done: usize,
    total: usize,
    arbiter: bool,
    ran: bool,
}

impl Told {
    fn of(done: &LuDone<'_>) -> Self {
        Told {
            lu: done.report.lu.to_string(),
            verdict: done.report.verdict,
            done: done.done,
            total: done.total,
            arbiter: done.arbiter,
            ran: done.took.is_some(),
        }
    }
}

/// Every LU of `report` told exactly once, with the verdict the report gives it, counted 1..=n.
fn check_told_once_each(told: &[Told], report: &Report) {
    let n = report.lus.len();
    assert_eq!(
        told.iter().map(|t| t.done).collect::<Vec<_>>(),
        (1..=n).collect::<Vec<_>>(),
        "{told:#?}"
    );
    assert!(told.iter().all(|t| t.total == n), "{told:#?}");
    for lu in &report.lus {
        let heard: Vec<&Told> = told.iter().filter(|t| lu.lu == t.lu).collect();
        assert_eq!(heard.len(), 1, "{} told once: {told:#?}", lu.lu);
        assert_eq!(heard[0].verdict, lu.verdict, "{}", lu.lu);
    }
}

#[test]
fn unfence_and_status_tell_each_lu_once_with_its_verdict() {
    let f = Fixture::new(4, &[2, 2], Quirks::lio());
    // One LU handed over as two targets (one per path): it is one LU, counted once.
    let mut targets = f.targets(0);
    let extra = targets[0].paths.pop().unwrap();
    let id = targets[0].id.clone();
    targets.push(LuTarget {
        id,
        paths: vec![extra],
    });
    let mut told = Vec::new();
    let report = unfence_observed(targets, A, UnfenceBy::Unrecorded, &[], limits(), &mut |d| {
        told.push(Told::of(&d))
    })
    .unwrap();
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(report.lus.len(), 4);
    check_told_once_each(&told, &report);
    assert!(
        told.iter()
            .all(|t| t.verdict == Verdict::Unfenced && t.ran && !t.arbiter)
    );

    let mut told = Vec::new();
    let report =
        status_observed(f.targets(0), A, limits(), &mut |d| told.push(Told::of(&d))).unwrap();
    check_told_once_each(&told, &report);
    assert!(told.iter().all(|t| t.verdict == Verdict::Registered));

    let mut told = Vec::new();
    let report =
        status_observed(f.targets(1), B, limits(), &mut |d| told.push(Told::of(&d))).unwrap();
    assert_eq!(report.outcome, Outcome::Off);
    check_told_once_each(&told, &report);
    assert!(told.iter().all(|t| t.verdict == Verdict::NotRegistered));
}

#[test]
fn fence_tells_the_arbiter_first_then_each_other_lu() {
    let f = two_nodes(5, 2);
    let mut told = Vec::new();
    let report = fence_observed(f.targets(0), A, B, limits(), &mut |d| {
        told.push(Told::of(&d))
    })
    .unwrap();
    assert_eq!(report.outcome, Outcome::Success);
    check_told_once_each(&told, &report);
    assert_eq!(
        told[0],
        Told {
            lu: lu_id(0),
            verdict: Verdict::VictimRemoved,
            done: 1,
            total: 5,
            arbiter: true,
            ran: true,
        }
    );
    assert!(
        told[1..]
            .iter()
            .all(|t| !t.arbiter && t.ran && t.verdict == Verdict::VictimRemoved),
        "{told:#?}"
    );
    // A rerun finds the victim gone everywhere.
    let mut told = Vec::new();
    let again = fence_observed(f.targets(0), A, B, limits(), &mut |d| {
        told.push(Told::of(&d))
    })
    .unwrap();
    check_told_once_each(&told, &again);
    assert!(told[0].arbiter && told.iter().all(|t| t.verdict == Verdict::AlreadyFenced));
}

#[test]
fn a_failing_arbiter_is_told_then_every_other_lu_as_skipped() {
    let f = two_nodes(3, 1);
    let arbiter = f.nexus(0, 0, 0);
    f.with_lu(0, |lu| lu.fail_next(arbiter, Injected::TransportDown, 100));
    let mut told = Vec::new();
    let report = fence_observed(f.targets(0), A, B, limits(), &mut |d| {
        told.push(Told::of(&d))
    })
    .unwrap();
    assert_eq!(report.outcome, Outcome::Failure);
    check_told_once_each(&told, &report);
    assert!(told[0].arbiter && told[0].ran && told[0].verdict == Verdict::Failed);
    // Skipped LUs never ran, so they have no time.
    assert!(
        told[1..]
            .iter()
            .all(|t| !t.arbiter && !t.ran && t.verdict == Verdict::Skipped),
        "{told:#?}"
    );
}

/// A hung follower does not hold back the news of the others: they are told as they finish, the
/// hung one at the deadline, as timed out.
#[test]
fn a_lu_pending_at_the_deadline_is_told_last_as_timed_out() {
    const HANG: Duration = Duration::from_secs(30);
    let f = two_nodes(3, 1);
    let hung = f.nexus(1, 0, 0);
    f.with_lu(1, |l| l.fail_next(hung, Injected::Hang(HANG), 1000));
    let mut told = Vec::new();
    let report = fence_observed(f.targets(0), A, B, hung_lu_limits(), &mut |d| {
        told.push(Told::of(&d))
    })
    .unwrap();
    check_told_once_each(&told, &report);
    let order: Vec<(String, Verdict)> = told.iter().map(|t| (t.lu.clone(), t.verdict)).collect();
    assert_eq!(
        order,
        [
            (lu_id(0), Verdict::VictimRemoved),
            (lu_id(2), Verdict::VictimRemoved),
            (lu_id(1), Verdict::TimedOut),
        ]
    );
    assert!(told[2].ran, "a LU timed out ran until the deadline");
}

// ----- P3 -----

#[test]
fn a_fenced_node_never_registers_itself_again_by_fence_or_heal() {
    let f = two_nodes(3, 2);
    f.fence(0, A, B);
    let b_fence = f.fence(1, B, A);
    assert_eq!(b_fence.outcome, Outcome::ThisNodeFenced);
    let b_heal = f.heal(1, B);
    assert_eq!(b_heal.outcome, Outcome::ThisNodeFenced);
    assert!(
        b_heal
            .lus
            .iter()
            .all(|r| r.verdict == Verdict::ThisNodeFenced)
    );
    assert!((0..3).all(|lu| !f.has(lu, B)));
    // Only the explicit unfence brings it back.
    assert_eq!(f.unfence(1, B).outcome, Outcome::Success);
    assert!((0..3).all(|lu| f.has(lu, B)));
}

#[test]
fn a_node_fenced_on_a_later_lu_only_is_not_healed_there() {
    let f = two_nodes(2, 1);
    f.pr_out(1, 1, &PrOut::preempt_and_abort(B, A, FENCING_TYPE));
    let report = f.heal(0, A);
    assert_eq!(report.outcome, Outcome::ThisNodeFenced);
    assert_eq!(report.lus[0].verdict, Verdict::Intact);
    assert_eq!(report.lus[1].verdict, Verdict::ThisNodeFenced);
    assert!(!f.has(1, A));
}

/// Runs `hook` once, just before the first PR OUT with `action` on this path.
struct Hooked<T> {
    inner: T,
    action: PrOutAction,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl<T: PrTransport> PrTransport for Hooked<T> {
    fn device(&self) -> &Path {
        self.inner.device()
    }
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        if let PrRequest::Out(out) = request
            && out.action == self.action
            && let Some(hook) = self.hook.lock().unwrap().take()
        {
            hook();
        }
        self.inner.execute(request)
    }
}

fn hooked(
    targets: Vec<LuTarget<ModelPath>>,
    at: (&str, usize),
    action: PrOutAction,
    hook: Box<dyn FnOnce() + Send>,
) -> Vec<LuTarget<Hooked<ModelPath>>> {
    let mut hook = Some(hook);
    targets
        .into_iter()
        .map(|t| {
            let lu = t.id.clone();
            LuTarget {
                id: t.id,
                paths: t
                    .paths
                    .into_iter()
                    .enumerate()
                    .map(|(i, inner)| Hooked {
                        inner,
                        action,
                        hook: Mutex::new(if (lu.as_str(), i) == at {
                            hook.take()
                        } else {
                            None
                        }),
                    })
                    .collect(),
            }
        })
        .collect()
}

#[test]
fn heal_never_registers_a_path_that_lost_its_registration() {
    let mut f = two_nodes(1, 2);
    // Path 1 of node 0 logs in again: a new nexus without a registration.
    let old = f.nexus(0, 0, 1);
    f.set_nexus(0, 0, 1, f.with_lu(0, |l| l.relogin(old, "23d0000ff")));
    let report = f.heal(0, A);
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    assert_eq!(report.lus[0].verdict, Verdict::PathsUnregistered);
    let error = report.lus[0]
        .error
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(
        error.contains("/dev/n0l0p1") && error.contains("prfence unfence"),
        "{error}"
    );
    assert_eq!(f.key_of(0, 0, 1), None, "P3: heal registers nothing");
    // The explicit act registers it.
    assert_eq!(f.unfence(0, A).outcome, Outcome::Success);
    assert_eq!(f.key_of(0, 0, 1), Some(A));
    assert_eq!(f.heal(0, A).lus[0].verdict, Verdict::Intact);
}

#[test]
fn fenced_while_fencing_leaves_the_other_nodes_fence_intact() {
    // Three nodes: node 0 fences node 1 while node 2 fences node 0, all LUs and verified, just
    // as node 0 preempts on LU 1 (issue 19's ring). Node 0 registers nothing anywhere.
    let f = Fixture::new(3, &[1, 1, 1], Quirks::lio());
    for (node, key) in [(0, A), (1, B), (2, C)] {
        assert_eq!(f.unfence(node, key).outcome, Outcome::Success);
    }
    let c = f.targets(2);
    let hook = Box::new(move || {
        let report = fence(c, C, A, limits()).unwrap();
        assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    });
    let targets = hooked(
        f.targets(0),
        (&lu_id(1), 0),
        PrOutAction::PreemptAndAbort,
        hook,
    );
    let report = fence(targets, A, B, limits()).unwrap();
    assert_eq!(report.outcome, Outcome::ThisNodeFenced, "{report:#?}");
    assert!(
        !f.has(0, A) && !f.has(1, A) && !f.has(2, A),
        "node 2's fence holds: node 0's key is on no LU"
    );
}

#[test]
fn a_follower_where_our_key_is_gone_is_left_alone() {
    // Node 0 won the arbiter against node 1, but its key is gone from LU 1 (someone fenced it
    // there): no REGISTER, no PREEMPT, the LU reported as fenced (P3).
    let f = Fixture::new(2, &[1, 1, 1], Quirks::lio());
    for (node, key) in [(0, A), (1, B), (2, C)] {
        assert_eq!(f.unfence(node, key).outcome, Outcome::Success);
    }
    let nexus = f.nexus(1, 2, 0);
    f.with_lu(1, |l| {
        l.pr_out(nexus, &PrOut::preempt_and_abort(C, A, FENCING_TYPE))
    })
    .unwrap();
    let generation = f.with_lu(1, |l| l.generation());
    let report = f.fence(0, A, B);
    assert_eq!(
        report.lus[1].verdict,
        Verdict::ThisNodeFenced,
        "{report:#?}"
    );
    assert!(!report.lus[1].ok);
    assert_ne!(report.outcome, Outcome::Success);
    assert!(!f.has(1, A), "not registered again");
    assert!(f.has(1, B), "nothing changed on that LU");
    assert_eq!(f.with_lu(1, |l| l.generation()), generation);
}

// ----- heal: orphans after iSCSI re-login -----

#[test]
fn heal_probes_an_all_tg_pt_registration_again_with_all_tg_pt() {
    // LIO refuses the plain re-statement of a key registered with ALL_TG_PT (INVALID FIELD); the
    // shared probe asks again with ALL_TG_PT instead of failing the LU.
    let f = Fixture::new(1, &[1, 1], Quirks::lio());
    assert_eq!(f.unfence(1, B).outcome, Outcome::Success);
    let nexus = f.nexus(0, 0, 0);
    f.with_lu(0, |l| {
        l.pr_out(nexus, &PrOut::register_ignore(A).with_all_tg_pt(true))
    })
    .unwrap();
    let before = f.snapshot();
    let report = f.heal(0, A);
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    assert_eq!(report.lus[0].verdict, Verdict::Intact);
    assert_eq!(report.lus[0].paths[0].state, PathUse::Ok);
    assert_eq!(f.snapshot(), before, "nothing registered or removed");
    assert_eq!(f.key_of(0, 0, 0), Some(A));
}

#[test]
fn heal_purges_the_orphan_and_leaves_the_new_session_to_unfence() {
    let mut f = Fixture::new(2, &[2, 1], Quirks::lio());
    f.unfence(0, A);
    f.unfence(1, B);
    for lu in 0..2 {
        let old = f.nexus(lu, 0, 0);
        f.set_nexus(lu, 0, 0, f.with_lu(lu, |l| l.relogin(old, "23d0000aa")));
    }
    let report = f.heal(0, A);
    assert_eq!(report.outcome, Outcome::Failure, "{report:#?}");
    for lu in 0..2 {
        assert_eq!(report.lus[lu].verdict, Verdict::PathsUnregistered);
        assert_eq!(
            f.key_of(lu, 0, 0),
            None,
            "the new session is left to unfence"
        );
        assert_eq!(f.key_of(lu, 0, 1), Some(A));
        let ours = f.keys(lu).iter().filter(|&&k| k == A).count();
        assert_eq!(ours, 1, "the orphan is gone: {:?}", f.keys(lu));
        assert!(f.has(lu, B));
        // The reservation moved off the orphan onto the registered path.
        let holder = f.with_lu(lu, |l| l.reservation()).unwrap().holder;
        assert_eq!(holder, crate::spc_model::Holder::Nexus(f.nexus(lu, 0, 1)));
        assert!(
            report.lus[lu]
                .notes
                .iter()
                .any(|n| n.to_string().contains("purged 1 orphaned"))
        );
    }
    assert_eq!(f.unfence(0, A).outcome, Outcome::Success);
    // P4: nothing left to heal.
    let again = f.heal(0, A);
    assert!(
        again.lus.iter().all(|r| r.verdict == Verdict::Intact),
        "{again:#?}"
    );
}

#[test]
fn heal_after_every_path_relogged_registers_nothing() {
    let mut f = Fixture::new(1, &[2, 1], Quirks::lio());
    f.unfence(1, B);
    f.unfence(0, A);
    for p in 0..2 {
        let old = f.nexus(0, 0, p);
        f.set_nexus(
            0,
            0,
            p,
            f.with_lu(0, |l| l.relogin(old, &format!("23d0000b{p}"))),
        );
    }
    let before = f.snapshot();
    let report = f.heal(0, A);
    assert_eq!(
        report.lus[0].verdict,
        Verdict::PathsUnregistered,
        "{report:#?}"
    );
    assert_eq!(f.key_of(0, 0, 0), None);
    assert_eq!(f.key_of(0, 0, 1), None);
    assert_eq!(f.snapshot(), before, "nothing registered or removed");
}

#[test]
fn fence_after_relogin_uses_a_registered_path_and_never_registers_on_the_arbiter() {
    let mut f = two_nodes(2, 2);
    let old = f.nexus(0, 0, 0);
    f.set_nexus(0, 0, 0, f.with_lu(0, |l| l.relogin(old, "23d0000cc")));
    let report = f.fence(0, A, B);
    assert_eq!(report.outcome, Outcome::Success, "{report:#?}");
    assert_eq!(
        f.key_of(0, 0, 0),
        None,
        "fence does not register on the arbiter"
    );
    assert!(
        report.lus[0]
            .notes
            .iter()
            .any(|n| n.to_string().contains("not registered with"))
    );
}

// ----- P2: two nodes fencing each other, interleaved command by command -----

/// Lets the nodes' commands through one at a time in a given order of node numbers; once the
/// schedule runs out (or names a node that has finished) everyone runs freely.
struct Turnstile {
    state: Mutex<(VecDeque<usize>, Vec<bool>)>,
    turn: Condvar,
}

impl Turnstile {
    fn new(schedule: Vec<usize>, nodes: usize) -> Arc<Self> {
        Arc::new(Turnstile {
            state: Mutex::new((schedule.into(), vec![false; nodes])),
            turn: Condvar::new(),
        })
    }

    fn enter(&self, node: usize) {
        let mut state = self.state.lock().unwrap();
        loop {
            let (schedule, done) = &mut *state;
            while schedule.front().is_some_and(|&n| done[n]) {
                schedule.pop_front();
            }
            match schedule.front() {
                None => return,
                Some(&n) if n == node => {
                    schedule.pop_front();
                    self.turn.notify_all();
                    return;
                }
                Some(_) => state = self.turn.wait(state).unwrap(),
            }
        }
    }

    fn finish(&self, node: usize) {
        self.state.lock().unwrap().1[node] = true;
        self.turn.notify_all();
    }
}

struct Gated<T> {
    inner: T,
    node: usize,
    gate: Arc<Turnstile>,
}

impl<T: PrTransport> PrTransport for Gated<T> {
    fn device(&self) -> &Path {
        self.inner.device()
    }
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        self.gate.enter(self.node);
        self.inner.execute(request)
    }
}

fn gated(
    targets: Vec<LuTarget<ModelPath>>,
    node: usize,
    gate: &Arc<Turnstile>,
) -> Vec<LuTarget<Gated<ModelPath>>> {
    targets
        .into_iter()
        .map(|t| LuTarget {
            id: t.id,
            paths: t
                .paths
                .into_iter()
                .map(|inner| Gated {
                    inner,
                    node,
                    gate: Arc::clone(gate),
                })
                .collect(),
        })
        .collect()
}

/// Both nodes fence each other concurrently under `schedule`; returns both outcomes.
fn race(f: &Fixture, schedule: Vec<usize>) -> [Outcome; 2] {
    let gate = Turnstile::new(schedule, 2);
    let runs: Vec<_> = [(0, A, B), (1, B, A)]
        .into_iter()
        .map(|(node, own, victim)| {
            let targets = gated(f.targets(node), node, &gate);
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                let report = fence(targets, own, victim, limits()).unwrap();
                gate.finish(node);
                report.outcome
            })
        })
        .collect();
    let mut outcomes = runs.into_iter().map(|r| r.join().unwrap());
    [outcomes.next().unwrap(), outcomes.next().unwrap()]
}

fn check_one_survivor(f: &Fixture, lus: usize, outcomes: [Outcome; 2]) {
    let keys = [A, B];
    let winners: Vec<usize> = (0..2)
        .filter(|&n| outcomes[n] == Outcome::Success)
        .collect();
    assert!(winners.len() <= 1, "both survived: {outcomes:?}");
    for (node, outcome) in outcomes.iter().enumerate() {
        assert!(
            matches!(outcome, Outcome::Success | Outcome::ThisNodeFenced),
            "node {node}: {outcome:?}"
        );
    }
    let [winner] = winners[..] else {
        panic!("nobody survived: {outcomes:?}");
    };
    let loser = 1 - winner;
    for lu in 0..lus {
        assert!(
            f.has(lu, keys[winner]),
            "LU {lu}: winner gone: {:?}",
            f.keys(lu)
        );
        assert!(
            !f.has(lu, keys[loser]),
            "LU {lu}: loser present: {:?}",
            f.keys(lu)
        );
        assert!(f.reserved(lu));
    }
}

#[test]
fn simultaneous_fences_leave_exactly_one_survivor_in_lockstep() {
    let f = two_nodes(3, 2);
    let outcomes = race(&f, [0, 1].repeat(40));
    check_one_survivor(&f, 3, outcomes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn fences_raced_in_any_interleaving_leave_one_survivor(
        schedule in prop::collection::vec(0usize..2, 0..60),
        lus in 1usize..4,
        paths in 1usize..3,
    ) {
        let f = two_nodes(lus, paths);
        let outcomes = race(&f, schedule);
        check_one_survivor(&f, lus, outcomes);
    }
}

/// Node 0 heals while node 1 fences it: whatever the interleaving, node 1's fence succeeds and
/// node 0's key is gone from every LU (heal never registers, so never brings it back, P3).
fn heal_races_fence(lus: usize, schedule: Vec<usize>) {
    let mut f = two_nodes(lus, 2);
    for lu in 0..lus {
        let old = f.nexus(lu, 0, 1);
        f.set_nexus(lu, 0, 1, f.with_lu(lu, |l| l.relogin(old, "23d0000dd")));
    }
    let gate = Turnstile::new(schedule, 2);
    let healer = {
        let targets = gated(f.targets(0), 0, &gate);
        let gate = Arc::clone(&gate);
        std::thread::spawn(move || {
            let report = heal(targets, A, limits()).unwrap();
            gate.finish(0);
            report.outcome
        })
    };
    let fencer = {
        let targets = gated(f.targets(1), 1, &gate);
        let gate = Arc::clone(&gate);
        std::thread::spawn(move || {
            let report = fence(targets, B, A, limits()).unwrap();
            gate.finish(1);
            report.outcome
        })
    };
    let (healed, fenced) = (healer.join().unwrap(), fencer.join().unwrap());
    // The relogged path is named for unfence (a failure), unless the fence came first.
    assert!(
        matches!(healed, Outcome::Failure | Outcome::ThisNodeFenced),
        "{healed:?}"
    );
    assert_eq!(fenced, Outcome::Success);
    for lu in 0..lus {
        assert!(
            !f.has(lu, A),
            "LU {lu}: {:?} (heal {healed:?}, fence {fenced:?})",
            f.keys(lu)
        );
    }
}

#[test]
fn heal_preempted_just_before_purging_its_orphan_gives_up_and_says_fenced() {
    // Found by the property below: node 1 preempts node 0 between node 0's READ RESERVATION and
    // its self-PREEMPT; the PREEMPT conflicts and changes nothing, and heal says fenced.
    heal_races_fence(1, vec![0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 0]);
}

/// One injected fault somewhere, a failed or partial fence, then a clean rerun converges.
fn fault_then_rerun(
    lus: usize,
    lu: usize,
    path: usize,
    fault: Injected,
    timing: Timing,
    count: u32,
) {
    let f = two_nodes(lus, 2);
    let nexus = f.nexus(lu, 0, path);
    f.with_lu(lu, |l| {
        l.inject(
            nexus,
            Injection {
                fault,
                timing,
                filter: CommandFilter::Any,
                count,
            },
        )
    });
    let first = f.fence(0, A, B);
    if first.outcome == Outcome::Success {
        assert!((0..lus).all(|l| !f.has(l, B)));
    } else {
        assert_eq!(first.outcome, Outcome::Failure, "{first:#?}");
    }
    f.with_lu(lu, |l| l.clear_injections(nexus));
    let second = f.fence(0, A, B);
    assert_eq!(second.outcome, Outcome::Success, "{second:#?}");
    for l in 0..lus {
        assert!(f.has(l, A) && !f.has(l, B) && f.reserved(l));
    }
}

fn fault() -> impl Strategy<Value = Injected> {
    prop_oneof![
        Just(Injected::Timeout),
        Just(Injected::TransportDown),
        Just(Injected::Failure(
            crate::spc_model::ScsiFailure::lio_communication_failure()
        )),
        Just(Injected::Failure(
            crate::spc_model::ScsiFailure::invalid_field_in_cdb()
        )),
        Just(Injected::Failure(
            crate::spc_model::UnitAttention::POWER_ON.to_failure()
        )),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn heal_raced_against_a_fence_never_survives_it(
        schedule in prop::collection::vec(0usize..2, 0..80),
        lus in 1usize..3,
    ) {
        heal_races_fence(lus, schedule);
    }

    #[test]
    fn any_single_fault_then_a_rerun_converges(
        lus in 1usize..5,
        lu_pick in 0usize..5,
        path in 0usize..2,
        fault in fault(),
        after in any::<bool>(),
        count in 1u32..20,
    ) {
        let timing = if after { Timing::AfterExecuting } else { Timing::InsteadOfExecuting };
        fault_then_rerun(lus, lu_pick % lus, path, fault, timing, count);
    }
}

/// Three nodes fence in a ring (0 fences 1, 1 fences 2, 2 fences 0) at once: every fence that
/// reports success has its victim gone from every LU at the end (P1, P3: nothing re-registers a
/// preempted key), and at least one node survives.
fn ring_race(lus: usize, schedule: Vec<usize>) {
    let f = Fixture::new(lus, &[1, 1, 1], Quirks::lio());
    let keys = [A, B, C];
    for (node, key) in keys.iter().enumerate() {
        assert_eq!(f.unfence(node, *key).outcome, Outcome::Success);
    }
    let gate = Turnstile::new(schedule, 3);
    let runs: Vec<_> = (0..3)
        .map(|node| {
            let targets = gated(f.targets(node), node, &gate);
            let gate = Arc::clone(&gate);
            let (own, victim) = (keys[node], keys[(node + 1) % 3]);
            std::thread::spawn(move || {
                let report = fence(targets, own, victim, limits()).unwrap();
                gate.finish(node);
                report.outcome
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = runs.into_iter().map(|r| r.join().unwrap()).collect();
    for (node, outcome) in outcomes.iter().enumerate() {
        if *outcome == Outcome::Success {
            let victim = keys[(node + 1) % 3];
            for lu in 0..lus {
                assert!(!f.has(lu, victim), "{outcomes:?}: LU {lu} {:?}", f.keys(lu));
            }
        }
    }
    assert!(
        (0..lus).all(|lu| !f.keys(lu).is_empty()),
        "{outcomes:?}: someone must survive"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_ring_of_fences_never_reports_a_victim_fenced_that_is_not(
        schedule in prop::collection::vec(0usize..3, 0..90),
        lus in 1usize..4,
    ) {
        ring_race(lus, schedule);
    }
}

// ----- Deadlines: a hung command or open holds only its own LU -----

/// Fence over three LUs where one follower's path hangs in a command and another's open hangs
/// (both far longer than the test): the report comes at the deadline, on the real clock, with
/// those two LUs timed out and the rest done; the target shows the victim gone only where the
/// report says so.
#[test]
fn a_hung_command_or_open_ends_at_the_deadline_with_those_lus_timed_out() {
    const HANG: Duration = Duration::from_secs(30);
    let f = two_nodes(3, 1);
    let hung_command = f.nexus(1, 0, 0);
    f.with_lu(1, |l| l.fail_next(hung_command, Injected::Hang(HANG), 1000));
    let hung_open = Cluster::device(0, 2, 0);
    let devices: Vec<(String, Arc<Mutex<ModelLu>>, Nexus)> = (0..3)
        .map(|lu| {
            (
                Cluster::device(0, lu, 0),
                Arc::clone(f.model(lu)),
                f.nexus(lu, 0, 0),
            )
        })
        .collect();
    let open: crate::ops::Opener<ModelPath> = Arc::new(move |device: &Path| {
        if device == Path::new(&hung_open) {
            std::thread::sleep(HANG);
        }
        let (dev, lu, nexus) = devices
            .iter()
            .find(|(dev, _, _)| Path::new(dev) == device)
            .expect("a fixture device");
        Ok(ScsiPr::new(
            ModelDevice::new(Arc::clone(lu), *nexus, dev),
            quick(),
        ))
    });
    let targets: Vec<LuTarget<crate::ops::OpenPath<ModelPath>>> = (0..3)
        .map(|lu| LuTarget {
            id: lu_id(lu).into(),
            paths: vec![crate::ops::OpenPath::new(
                Path::new(&Cluster::device(0, lu, 0)),
                Arc::clone(&open),
            )],
        })
        .collect();
    let limits = hung_lu_limits();
    let started = std::time::Instant::now();
    let report = fence(targets, A, B, limits).unwrap();
    let took = started.elapsed();
    println!(
        "fence over 3 LUs, one hung command and one hung open ({HANG:?}): {took:?} (deadline {:?})",
        limits.deadline
    );
    assert!(
        took <= limits.deadline + Duration::from_secs(1),
        "{took:?} past the deadline {:?}",
        limits.deadline
    );
    assert_eq!(report.outcome, Outcome::Failure);
    let verdicts: Vec<Verdict> = report.lus.iter().map(|r| r.verdict).collect();
    assert_eq!(
        verdicts,
        [Verdict::VictimRemoved, Verdict::TimedOut, Verdict::TimedOut]
    );
    assert!(!f.has(0, B), "the arbiter was fenced");
    assert!(f.has(1, B) && f.has(2, B), "the hung LUs were not touched");
}

/// Two nodes must never hold one key (fence_scsi's key_value=id after a node was added behind a
/// removed one: the new node derives the key a moved node still holds). An unfence told this
/// node's initiators reads every LU first and registers nowhere when another node's initiator
/// holds its key; this node's own earlier session (same initiator name, another ISID) is its
/// own.
#[test]
fn an_unfence_registers_nowhere_when_another_nodes_initiator_holds_its_key() {
    let f = Fixture::new(2, &[1, 1], Quirks::lio());
    f.unfence(0, A);
    let unfence_as = |f: &Fixture, node: usize, key: Key| {
        unfence_observed(
            f.targets(node),
            key,
            UnfenceBy::Unrecorded,
            &f.cluster.own_initiators(node),
            limits(),
            &mut |_| {},
        )
        .unwrap()
    };
    let report = unfence_as(&f, 1, A);
    assert_eq!(report.outcome, Outcome::Failure, "{report:?}");
    for lu in 0..2 {
        assert_eq!(f.key_of(lu, 1, 0), None, "node 1 registered on LU {lu}");
        assert_eq!(f.keys(lu), vec![A], "LU {lu}");
    }
    let named = report
        .lus
        .iter()
        .filter_map(|r| r.error.as_ref())
        .any(|e| e.to_string().contains("iqn.2026-11.lab:node0"));
    assert!(named, "the holder is named: {report:?}");
    // Told nothing (FC, SAS): not checked, as before.
    let unchecked = unfence_observed(
        f.targets(1),
        A,
        UnfenceBy::Unrecorded,
        &[],
        limits(),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(unchecked.outcome, Outcome::Success);
    // Node 0 after a re-login: its old session still holds A; that is its own.
    let mut g = Fixture::new(1, &[1, 1], Quirks::lio());
    g.unfence(0, A);
    g.cluster.relogin(0, 0, 0);
    let report = unfence_as(&g, 0, A);
    assert_eq!(report.outcome, Outcome::Success, "{report:?}");
    assert_eq!(g.key_of(0, 0, 0), Some(A));
}
