//! Running the per-LU steps: blocking PR commands, every LU at once on a thread of its own
//! ([`runtime::fan_out`]), under one overall deadline; the arbiter alone and first for fence.
//! Callers that show progress pass an observer (the `*_observed` forms), told of each LU as it
//! finishes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::discover::LuId;
use crate::pr::Key;
use crate::runtime::{self, Finished};
use crate::transport::{CommandError, PrTransport};

use super::arbitration::{Arbitration, Race, UnreachableData, check_coordinators, majority, race};
use super::fence::{fence_arbiter, fence_follower};
use super::heal::heal_lu;
use super::lu::LuWork;
use super::own_initiators::OwnInitiator;
use super::status::status_lu;
use super::unfence::{UnfenceBy, rejoin_check_lu, unfence_lu};
use super::{
    Failure, Limits, LuDone, LuReport, LuTarget, Observer, Outcome, PathUse, Report, RequestError,
    TieBreak, Verdict, normalize,
};

fn check_key(key: Key) -> Result<(), RequestError> {
    if key.is_zero() {
        Err(RequestError::ZeroKey)
    } else {
        Ok(())
    }
}

fn prepare<T: PrTransport>(
    lus: Vec<LuTarget<T>>,
    own: Key,
) -> Result<Vec<Arc<LuTarget<T>>>, RequestError> {
    check_key(own)?;
    Ok(normalize(lus)?.into_iter().map(Arc::new).collect())
}

fn devices<T: PrTransport>(lu: &LuTarget<T>) -> Vec<String> {
    lu.paths
        .iter()
        .map(|p| p.device().display().to_string())
        .collect()
}

/// The report of an LU left untouched, and why.
fn skipped<T: PrTransport>(lu: &LuTarget<T>, why: impl Into<Failure>) -> LuReport {
    LuReport::bare(&lu.id, &devices(lu), Verdict::Skipped, Some(why.into()))
}

/// Counts the LUs told to the caller's observer, so `done` runs from 1 to `total` across fence's
/// arbiter step and its fan-out.
struct Tally<'o, 'a> {
    observer: &'o mut Observer<'a>,
    done: usize,
    total: usize,
}

impl<'o, 'a> Tally<'o, 'a> {
    fn new(observer: &'o mut Observer<'a>, total: usize) -> Self {
        Tally {
            observer,
            done: 0,
            total,
        }
    }

    fn tell(&mut self, report: &LuReport, arbiter: bool, took: Option<Duration>) {
        self.done += 1;
        (self.observer)(LuDone {
            report,
            done: self.done,
            total: self.total,
            arbiter,
            took,
        });
    }
}

/// What a fan-out tells as each LU finishes: its report and how long it ran.
type Tell<'a> = dyn FnMut(&LuReport, Duration) + 'a;

/// Runs `op` on every LU concurrently and tells each report as its LU finishes; a LU still
/// running at `until` is reported (and told) as timed out (its blocking call keeps running in
/// the background; a rerun converges, P4). Reports come back in LU order.
fn fan_out<T, F>(
    lus: &[Arc<LuTarget<T>>],
    until: Instant,
    op: F,
    tell: &mut Tell<'_>,
) -> Vec<LuReport>
where
    T: PrTransport + 'static,
    F: Fn(&LuTarget<T>) -> LuReport + Send + Sync + 'static,
{
    let started = runtime::now();
    let finished = runtime::fan_out(lus, until, move |lu| op(lu), &mut |_, report, took| {
        tell(report, took)
    });
    lus.iter()
        .zip(finished)
        .map(|(lu, finished)| {
            let (verdict, error) = match finished {
                Finished::Done { value, .. } => return value,
                Finished::TimedOut => (
                    Verdict::TimedOut,
                    "still pending at the overall deadline; the LU may be half done: rerun the \
                     command, it converges"
                        .to_string(),
                ),
                Finished::Panicked => (
                    Verdict::Failed,
                    "internal error while working on the LU (a panic); nothing is known about \
                     what was done: check the LU before rerunning"
                        .to_string(),
                ),
                Finished::NotStarted(why) => (
                    Verdict::Failed,
                    format!(
                        "no thread could be started for the LU ({why}): the process hit a thread \
                         or memory limit; name fewer devices"
                    ),
                ),
            };
            let report = LuReport::bare(&lu.id, &devices(lu), verdict, Some(error.into()));
            tell(&report, runtime::now().saturating_duration_since(started));
            report
        })
        .collect()
}

/// A fan-out whose LUs are not news to the caller (fence's re-read of the arbiter, heal).
fn silent(_: &LuReport, _: Duration) {}

fn all_ok(reports: &[LuReport]) -> bool {
    reports.iter().all(|r| r.ok)
}

/// Whether no path of the LU answered (each timed out, failed below the protocol, could not be
/// opened, or was never reached before the deadline): the one reading of "unreachable" that
/// [`UnreachableData::Report`] leaves unfenced. An LU that answered, even with an error, is not:
/// its failure may be the victim's key still there. Each dead path must have failed as a gone
/// path does ([`CommandError::path_gone`]), not as a disturbed one whose command may have landed
/// or be lost: the simulation found a lost response to the PREEMPT (SCSI's
/// DID_TRANSPORT_DISRUPTED, NVMe's EIO) leaving a healthy LU reported unfenced.
fn out_of_reach(report: &LuReport) -> bool {
    !report.ok
        && report.paths.iter().all(|p| match p.state {
            PathUse::Unused => true,
            PathUse::Dead => p
                .error
                .as_ref()
                .and_then(|e| e.cause.as_deref())
                .is_some_and(CommandError::path_gone),
            PathUse::Ok | PathUse::Failed => false,
        })
}

fn failed_ids(reports: &[LuReport]) -> String {
    reports
        .iter()
        .filter(|r| !r.ok)
        .map(|r| format!("{} ({})", r.lu, r.verdict))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Registers `own` on every path of every LU, reserves where no reservation exists, verifies.
/// P3: the only engine command that registers a key that may have been preempted.
pub fn unfence<T: PrTransport + 'static>(
    lus: Vec<LuTarget<T>>,
    own: Key,
    limits: Limits,
) -> Result<Report, RequestError> {
    unfence_observed(lus, own, UnfenceBy::Unrecorded, &[], limits, &mut |_| {})
}

/// [`unfence`], telling `observer` of each LU as it finishes, keeping the node's record of its
/// boot as `by` says. A rejoin ([`UnfenceBy::Rejoin`]: fence_pr's `on`) reads the LUs in the
/// record first, and if this node's key is gone from any of them it registers nowhere: those LUs
/// report [`Verdict::ThisNodeFenced`], the others [`Verdict::Skipped`], and the outcome is
/// [`Outcome::ThisNodeFenced`]. Otherwise every LU is unfenced, each one not yet in the record
/// added to it before its REGISTER.
///
/// `initiators`: this node's identities on every path (its iSCSI initiator names, its NVMe host
/// id). Given, each LU is read (READ FULL STATUS) before anything else is done there, and where
/// another initiator already holds `own` nothing is registered; empty (not known on some path:
/// FC, SAS, tcm_loop), that is not checked.
pub fn unfence_observed<T: PrTransport + 'static>(
    lus: Vec<LuTarget<T>>,
    own: Key,
    by: UnfenceBy,
    initiators: &[OwnInitiator],
    limits: Limits,
    observer: &mut Observer<'_>,
) -> Result<Report, RequestError> {
    let lus = prepare(lus, own)?;
    let until = runtime::now() + limits.deadline;
    let mut tally = Tally::new(observer, lus.len());
    if let UnfenceBy::Rejoin(record) = &by {
        let recorded: Vec<Arc<LuTarget<T>>> = lus
            .iter()
            .filter(|lu| record.contains(&lu.id))
            .cloned()
            .collect();
        let checks = fan_out(
            &recorded,
            until,
            move |lu| rejoin_check_lu(lu, own),
            &mut silent,
        );
        // P3: no REGISTER anywhere until every LU of the record shows our key.
        if !all_ok(&checks) {
            return Ok(rejoin_refused(&lus, own, checks, &mut tally));
        }
    }
    let initiators: Arc<[OwnInitiator]> = initiators.into();
    let reports = fan_out(
        &lus,
        until,
        move |lu| {
            let unrecorded = by.record().filter(|r| !r.contains(&lu.id));
            unfence_lu(lu, own, unrecorded, &initiators)
        },
        &mut |r, took| tally.tell(r, false, Some(took)),
    );
    let (outcome, summary) = if all_ok(&reports) {
        (
            Outcome::Success,
            format!("{own} registered and a reservation exists on every LU"),
        )
    } else {
        // Our key gone at the verification is an unfence that raced a fence: a rerun settles
        // it (a rejoin's rerun refuses, the LU being in its record now).
        (
            Outcome::Failure,
            format!("unfence incomplete on: {}; rerun it", failed_ids(&reports)),
        )
    };
    Ok(Report {
        command: "unfence",
        outcome,
        summary,
        lus: reports,
    })
}

/// A rejoin that found its key gone from (or could not read) an LU of its record: nothing was
/// registered; the LUs read report what they showed, the rest are skipped.
fn rejoin_refused<T: PrTransport>(
    lus: &[Arc<LuTarget<T>>],
    own: Key,
    checks: Vec<LuReport>,
    tally: &mut Tally<'_, '_>,
) -> Report {
    let fenced: Vec<&LuReport> = checks
        .iter()
        .filter(|r| r.verdict == Verdict::ThisNodeFenced)
        .collect();
    let (outcome, summary, why) = if fenced.is_empty() {
        (
            Outcome::Failure,
            format!(
                "could not read {}, where this node began registering in this boot, to tell \
                 whether it was fenced since; nothing registered: rerun it",
                failed_ids(&checks)
            ),
            "an LU this node registered on before could not be read",
        )
    } else {
        let ids: Vec<String> = fenced.iter().map(|r| r.lu.to_string()).collect();
        (
            Outcome::ThisNodeFenced,
            format!(
                "{own} is gone since this node began registering on: {} (preempted, or the LU \
                 lost every key, which erased any fence before); not registered on any LU (P3)",
                ids.join(", ")
            ),
            "this node was fenced since it registered before",
        )
    };
    let reports = lus
        .iter()
        .map(|lu| {
            let report = match checks.iter().find(|c| c.lu == lu.id) {
                Some(check) => check.clone(),
                None => skipped(lu, format!("not registered: {why}")),
            };
            tally.tell(&report, false, None);
            report
        })
        .collect();
    Report {
        command: "unfence",
        outcome,
        summary,
        lus: reports,
    }
}

/// Removes `victim` from every LU: the arbiter (first LU by identifier) alone first, and the rest
/// only if this node won there (P2); an LU where our own key is gone is left alone (P3: fence
/// never registers). After the fan-out the arbiter is read again; if our own key vanished
/// meanwhile (someone fenced us), the outcome is [`Outcome::ThisNodeFenced`].
pub fn fence<T: PrTransport + 'static>(
    lus: Vec<LuTarget<T>>,
    own: Key,
    victim: Key,
    limits: Limits,
) -> Result<Report, RequestError> {
    fence_observed(lus, own, victim, limits, &mut |_| {})
}

/// [`fence`], telling `observer` of each LU as it finishes: the arbiter first, then the others
/// (each as skipped if the arbiter did not succeed). The re-read of the arbiter is not told: it
/// can still change the verdicts (see [`LuDone::report`]).
pub fn fence_observed<T: PrTransport + 'static>(
    lus: Vec<LuTarget<T>>,
    own: Key,
    victim: Key,
    limits: Limits,
    observer: &mut Observer<'_>,
) -> Result<Report, RequestError> {
    fence_arbitrated_observed(lus, Arbitration::FirstLu, own, victim, limits, observer)
}

/// [`fence_observed`] with the LUs that decide who survives named by `arbitration`: the first
/// LU by identifier (the arbiter, itself a data LU), or coordinators apart from the data LUs
/// `lus`, every one told to `observer` as a decider (`LuDone::arbiter`) before any data LU.
///
/// The P2 protocol, phase by phase: the deciders first, each fenced by this node at once
/// ([`FenceRun::race`]; the target serialises two nodes' PREEMPTs on each); if this node did not
/// win a majority of them ([`arbitration::race`](super::arbitration::race)), no data LU is
/// touched ([`FenceRun::not_won`]); the data LUs at once ([`FenceRun::followers`]); the deciders
/// read again ([`FenceRun::reread`]), since this node may have been fenced meanwhile; the
/// verdict ([`FenceRun::verdict`]). A loser's PREEMPTs on a minority of coordinators remove the
/// winner's key there, for good (P3: only an explicit unfence registers it again): the winner
/// keeps its majority, and its agent reports the coordinators it lost without self-fencing.
pub fn fence_arbitrated_observed<T: PrTransport + 'static>(
    lus: Vec<LuTarget<T>>,
    arbitration: Arbitration<T>,
    own: Key,
    victim: Key,
    limits: Limits,
    observer: &mut Observer<'_>,
) -> Result<Report, RequestError> {
    let lus = fence_lus(lus, own, victim)?;
    let (deciders, followers, coordinated, unreachable_data): (Vec<_>, &[_], bool, _) =
        match arbitration {
            Arbitration::FirstLu => {
                let Some((arbiter, followers)) = lus.split_first() else {
                    return Err(RequestError::NoLus);
                };
                (
                    vec![Arc::clone(arbiter)],
                    followers,
                    false,
                    UnreachableData::Fail,
                )
            }
            Arbitration::Coordinators {
                lus: coordinators,
                unreachable_data,
            } => {
                let coordinators = normalize(coordinators)?;
                let data: Vec<&LuId> = lus.iter().map(|lu| &lu.id).collect();
                check_coordinators(&coordinators, &data)?;
                (
                    coordinators.into_iter().map(Arc::new).collect(),
                    &lus[..],
                    true,
                    unreachable_data,
                )
            }
        };
    let run = FenceRun {
        own,
        victim,
        deciders: &deciders,
        coordinated,
        unreachable_data,
        followers,
        until: runtime::now() + limits.deadline,
    };
    let mut tally = Tally::new(observer, run.deciders.len() + run.followers.len());
    if let Some(report) = run.arbiter_uncertain(&mut tally) {
        return Ok(report);
    }
    let mut reports = run.race(limits.tie_break, &mut tally);
    let outcome = race(&reports);
    if !matches!(outcome, Race::Won { .. }) {
        return Ok(run.not_won(reports, outcome, &mut tally));
    }
    reports.extend(run.followers(&mut tally));
    let mut held = true;
    if !run.followers.is_empty() || run.coordinated {
        let reread = run.reread();
        match race(&reread) {
            Race::Won { .. } => {}
            Race::Lost { gone, .. } => return Ok(run.fenced_meanwhile(reports, gone)),
            Race::Undecided { .. } => {
                run.note_unreadable(&mut reports, reread);
                held = false;
            }
        }
    }
    Ok(run.verdict(reports, held))
}

/// A coordinator this node cannot identify (its device gone with its array, or an LU without a
/// designator) counts as lost in the race, and nothing is sent to it: it may be another
/// coordinator named twice, and one LU won twice would let two nodes' majorities miss each
/// other (P2). `None` for an identified LU, or outside a coordinated fence.
fn unidentified_coordinator<T: PrTransport>(
    lu: &LuTarget<T>,
    coordinated: bool,
) -> Option<LuReport> {
    (coordinated && lu.id.is_node_local()).then(|| {
        LuReport::bare(
            &lu.id,
            &devices(lu),
            Verdict::Failed,
            Some(
                "coordinator not identified on this node (its VPD page 83h designator could not \
                 be read: the device is gone, or the LU has none): counted as lost, nothing sent"
                    .into(),
            ),
        )
    })
}

/// A fence's LUs after the request's checks, the arbiter first.
fn fence_lus<T: PrTransport>(
    lus: Vec<LuTarget<T>>,
    own: Key,
    victim: Key,
) -> Result<Vec<Arc<LuTarget<T>>>, RequestError> {
    check_key(victim)?;
    if own == victim {
        return Err(RequestError::SameKey(own));
    }
    prepare(lus, own)
}

/// One fence under way: the keys, the LUs that decide and the other LUs, the overall deadline.
struct FenceRun<'l, T> {
    own: Key,
    victim: Key,
    /// The arbiter alone, or the coordinators, in identifier order.
    deciders: &'l [Arc<LuTarget<T>>],
    /// The deciders are coordinators, apart from the data LUs; else the one arbiter, itself a
    /// data LU, whose verdict is part of the fence's.
    coordinated: bool,
    /// The data LUs but the arbiter.
    followers: &'l [Arc<LuTarget<T>>],
    /// With coordinators: whether data LUs out of reach fail the fence (the default).
    unreachable_data: UnreachableData,
    until: Instant,
}

impl<T: PrTransport + 'static> FenceRun<'_, T> {
    /// The arbiter, or the coordinators as named in the reports.
    fn deciders_named(&self) -> String {
        match self.deciders {
            [arbiter] if !self.coordinated => format!("the arbiter LU {}", arbiter.id),
            all => format!(
                "the coordinators {}",
                all.iter()
                    .map(|lu| lu.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// P2: every decider fenced at once, before any other LU is touched ([`fence_arbiter`]);
    /// reports in identifier order.
    fn race(&self, tie_break: TieBreak, tally: &mut Tally<'_, '_>) -> Vec<LuReport> {
        let (own, victim, coordinated) = (self.own, self.victim, self.coordinated);
        fan_out(
            self.deciders,
            self.until,
            move |lu| match unidentified_coordinator(lu, coordinated) {
                Some(lost) => lost,
                None => fence_arbiter(lu, own, victim, tie_break),
            },
            &mut |r, took| tally.tell(r, true, Some(took)),
        )
    }

    /// P2: with a single arbiter and several LUs, every one must be identified. A node-local LU
    /// (a device whose designator could not be read here: gone as the command started, or an LU
    /// without one) may be the LU with the lowest identifier, which the other nodes make the
    /// arbiter; fencing the rest under another arbiter could leave the LUs split between two
    /// nodes. Nothing is sent: the node-local LUs are reported failed, the others skipped,
    /// untouched. With coordinators the data LUs decide nothing, and a coordinator not
    /// identified counts as lost ([`unidentified_coordinator`]).
    fn arbiter_uncertain(&self, tally: &mut Tally<'_, '_>) -> Option<Report> {
        let [arbiter] = self.deciders else {
            return None;
        };
        if self.coordinated {
            return None;
        }
        let all = || std::iter::once(arbiter).chain(self.followers);
        let unidentified: Vec<&str> = all()
            .filter(|lu| lu.id.is_node_local())
            .map(|lu| lu.id.as_str())
            .collect();
        if self.followers.is_empty() || unidentified.is_empty() {
            return None;
        }
        let lus = all()
            .map(|lu| {
                let report = if lu.id.is_node_local() {
                    LuReport::bare(
                        &lu.id,
                        &devices(lu),
                        Verdict::Failed,
                        Some(
                            "not identified on this node (its VPD page 83h designator could not \
                             be read: the device is gone, or the LU has none); other nodes may \
                             make this LU the arbiter"
                                .into(),
                        ),
                    )
                } else {
                    skipped(lu, "not touched: the arbiter cannot be named")
                };
                tally.tell(&report, Arc::ptr_eq(lu, arbiter), None);
                report
            })
            .collect();
        Some(Report {
            command: "fence",
            outcome: Outcome::Failure,
            summary: format!(
                "nothing was sent: {} could not be identified, so the arbiter (the LU with the \
                 lowest identifier, the same on every node) cannot be named; check the sessions \
                 and paths (iscsiadm -m session, multipath -ll, lsblk) and run again, or leave \
                 the device out of the devices given",
                unidentified.join(", ")
            ),
            lus,
        })
    }

    /// The deciders did not go our way: every other LU is reported skipped, untouched.
    fn not_won(&self, mut reports: Vec<LuReport>, race: Race, tally: &mut Tally<'_, '_>) -> Report {
        let (outcome, summary) = match (race, &reports[..]) {
            (Race::Lost { .. }, [arbiter]) if !self.coordinated => (
                Outcome::ThisNodeFenced,
                format!(
                    "this node was fenced: {} is gone from the arbiter LU {}; no LU was touched",
                    self.own, arbiter.lu
                ),
            ),
            (_, [arbiter]) if !self.coordinated => (
                Outcome::Failure,
                format!(
                    "the arbiter LU {} was not fenced ({}), so no other LU was touched; rerun",
                    arbiter.lu, arbiter.verdict
                ),
            ),
            (Race::Lost { gone, of }, _) => (
                Outcome::ThisNodeFenced,
                format!(
                    "this node was fenced: {} is gone from {gone} of the {of} coordinators, a \
                     majority (it lost the race, or another node fenced it); no data LU was \
                     touched",
                    self.own
                ),
            ),
            (Race::Undecided { won, of, .. } | Race::Won { won, of }, _) => (
                Outcome::Failure,
                format!(
                    "{} won {won} of the {of} coordinators, and a fence needs {}: no data LU was \
                     touched; not won: {}; rerun once they answer",
                    self.own,
                    majority(of),
                    failed_ids(&reports)
                ),
            ),
        };
        let deciders = self.deciders_named();
        reports.extend(self.followers.iter().map(|lu| {
            let report = skipped(lu, format!("not touched: {deciders} did not succeed"));
            tally.tell(&report, false, None);
            report
        }));
        Report {
            command: "fence",
            outcome,
            summary,
            lus: reports,
        }
    }

    /// This node won the deciders: every data LU but the arbiter at once ([`fence_follower`]).
    fn followers(&self, tally: &mut Tally<'_, '_>) -> Vec<LuReport> {
        let (own, victim) = (self.own, self.victim);
        fan_out(
            self.followers,
            self.until,
            move |lu| fence_follower(lu, own, victim),
            &mut |r, took| tally.tell(r, false, Some(took)),
        )
    }

    /// Reads the deciders' keys again: a node fenced while it fenced the data LUs finds its own
    /// key gone there. Each report is `ok` (as [`Verdict::VictimRemoved`]) where our key is
    /// still registered, [`Verdict::ThisNodeFenced`] where it is gone: read by
    /// [`race`](super::arbitration::race) as the first look was.
    fn reread(&self) -> Vec<LuReport> {
        let (own, coordinated) = (self.own, self.coordinated);
        fan_out(
            self.deciders,
            self.until,
            move |lu| {
                if let Some(lost) = unidentified_coordinator(lu, coordinated) {
                    return lost;
                }
                let mut work = LuWork::new(lu);
                let result = work.read_keys_any().map(|(_, keys)| {
                    if keys.keys.contains(&own) {
                        Verdict::VictimRemoved
                    } else {
                        Verdict::ThisNodeFenced
                    }
                });
                work.finish(result, &[Verdict::VictimRemoved])
            },
            &mut silent,
        )
    }

    /// Another node fenced this one meanwhile (our key is gone from `gone` deciders, a
    /// majority): every LU says so. Nothing to undo: fence registers no key (P3), so this node
    /// left nothing behind the other node's fence.
    fn fenced_meanwhile(&self, mut reports: Vec<LuReport>, gone: usize) -> Report {
        let deciders = self.deciders.len();
        for report in reports.iter_mut().skip(deciders) {
            report.ok = false;
            report.verdict = Verdict::ThisNodeFenced;
        }
        for report in reports.iter_mut().take(deciders) {
            report.ok = false;
            report.verdict = Verdict::ThisNodeFenced;
            report.notes.push(
                format!(
                    "{} was preempted here after this node fenced the LU",
                    self.own
                )
                .into(),
            );
        }
        let summary = match self.deciders {
            [arbiter] if !self.coordinated => format!(
                "this node was fenced while fencing {}: {} vanished from the arbiter LU {}",
                self.victim, self.own, arbiter.id
            ),
            _ => format!(
                "this node was fenced while fencing {}: {} vanished from {gone} of the {deciders} \
                 coordinators, a majority",
                self.victim, self.own
            ),
        };
        Report {
            command: "fence",
            outcome: Outcome::ThisNodeFenced,
            summary,
            lus: reports,
        }
    }

    /// Too few deciders could be read again to show a majority still ours: the fence is not
    /// verified, and each unreadable one says why.
    fn note_unreadable(&self, reports: &mut [LuReport], reread: Vec<LuReport>) {
        let first = if self.coordinated {
            "could not re-read enough coordinators after the fan-out to hold a majority"
        } else {
            "could not re-read the arbiter after the fan-out"
        };
        for (report, failed) in reports.iter_mut().zip(reread).filter(|(_, r)| !r.ok) {
            if failed.verdict == Verdict::ThisNodeFenced {
                continue;
            }
            report.ok = false;
            report.notes.push(match failed.error {
                // The re-read's own failure, kept as data: advised where the report is shown.
                Some(failure) => failure.prefixed(first),
                None => format!("{first}: ").into(),
            });
        }
    }

    /// Success if every data LU verified the victim gone and a reservation in place, and the
    /// deciders' re-read still showed this node's majority (`held`). A coordinator lost in the
    /// race (the loser's, or unreachable) is reported and does not fail the fence.
    fn verdict(&self, reports: Vec<LuReport>, held: bool) -> Report {
        let victim = self.victim;
        let (deciding, data) = reports.split_at(if self.coordinated {
            self.deciders.len()
        } else {
            0
        });
        let ok = all_ok(data) && held;
        let won = || {
            format!(
                "this node won {} of the {} coordinators",
                deciding.iter().filter(|r| r.ok).count(),
                deciding.len()
            )
        };
        // The admin's opt-in: data LUs no path answers are reported, not waited for, once every
        // other data LU (at least one) is fenced.
        let unanswered: Vec<&LuReport> = data.iter().filter(|r| out_of_reach(r)).collect();
        let reported = self.unreachable_data == UnreachableData::Report
            && held
            && !unanswered.is_empty()
            && unanswered.len() < data.len()
            && data.iter().all(|r| r.ok || out_of_reach(r));
        let (outcome, summary) = if reported {
            (
                Outcome::Success,
                format!(
                    "{victim} fenced on the {} data LUs this node reaches; NOT fenced on {}: no \
                     path answered, and its key stays there (unreachable_data=report: the admin \
                     asserts that array is down; fence again once it answers); {}",
                    data.len() - unanswered.len(),
                    failed_ids(&unanswered.into_iter().cloned().collect::<Vec<_>>()),
                    won()
                ),
            )
        } else if ok && self.coordinated {
            (
                Outcome::Success,
                format!(
                    "{victim} fenced: gone from every data LU, a reservation exists on each; {}",
                    won()
                ),
            )
        } else if ok {
            (
                Outcome::Success,
                format!("{victim} fenced: gone from every LU, a reservation exists on each"),
            )
        } else {
            (
                Outcome::Failure,
                format!(
                    "{victim} not verified fenced on: {}; rerun (it converges)",
                    failed_ids(if held { data } else { &reports })
                ),
            )
        };
        Report {
            command: "fence",
            outcome,
            summary,
            lus: reports,
        }
    }
}

/// Reads whether `own` is registered on each LU. Success: on all; Off: on none; Partial: some.
pub fn status<T: PrTransport + 'static>(
    lus: Vec<LuTarget<T>>,
    own: Key,
    limits: Limits,
) -> Result<Report, RequestError> {
    status_observed(lus, own, limits, &mut |_| {})
}

/// [`status`], telling `observer` of each LU as it has been read.
pub fn status_observed<T: PrTransport + 'static>(
    lus: Vec<LuTarget<T>>,
    own: Key,
    limits: Limits,
    observer: &mut Observer<'_>,
) -> Result<Report, RequestError> {
    let lus = prepare(lus, own)?;
    let until = runtime::now() + limits.deadline;
    let mut tally = Tally::new(observer, lus.len());
    let reports = fan_out(&lus, until, move |lu| status_lu(lu, own), &mut |r, took| {
        tally.tell(r, false, Some(took))
    });
    let on: Vec<&str> = reports
        .iter()
        .filter(|r| r.verdict == Verdict::Registered)
        .map(|r| r.lu.as_str())
        .collect();
    let off: Vec<&str> = reports
        .iter()
        .filter(|r| r.verdict == Verdict::NotRegistered)
        .map(|r| r.lu.as_str())
        .collect();
    let unknown = reports.len() - on.len() - off.len();
    let (outcome, summary) = if on.len() == reports.len() {
        (
            Outcome::Success,
            format!("{own} registered on all {} LUs", reports.len()),
        )
    } else if off.len() == reports.len() {
        (Outcome::Off, format!("{own} registered on none of the LUs"))
    } else if unknown == reports.len() {
        (
            Outcome::Failure,
            format!("no LU could be read: {}", failed_ids(&reports)),
        )
    } else {
        let mut summary = format!(
            "{own} registered on {} of {} LUs; not on: {}",
            on.len(),
            reports.len(),
            if off.is_empty() {
                "-".to_string()
            } else {
                off.join(", ")
            }
        );
        if unknown > 0 {
            summary.push_str(&format!(
                "; unreadable: {}",
                reports
                    .iter()
                    .filter(|r| !matches!(r.verdict, Verdict::Registered | Verdict::NotRegistered))
                    .map(|r| r.lu.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        (Outcome::Partial, summary)
    };
    Ok(Report {
        command: "status",
        outcome,
        summary,
        lus: reports,
    })
}

/// Repairs this node's registrations on every LU where its key is still present (new iSCSI
/// sessions registered, orphaned registrations purged). Never registers where the key is gone
/// (P3): such LUs report [`Verdict::ThisNodeFenced`].
pub fn heal<T: PrTransport + 'static>(
    lus: Vec<LuTarget<T>>,
    own: Key,
    limits: Limits,
) -> Result<Report, RequestError> {
    let lus = prepare(lus, own)?;
    let until = runtime::now() + limits.deadline;
    let reports = fan_out(&lus, until, move |lu| heal_lu(lu, own), &mut silent);
    let (outcome, summary) = if all_ok(&reports) {
        (
            Outcome::Success,
            format!("{own}: registrations intact or repaired on every LU"),
        )
    } else if reports.iter().any(|r| r.verdict == Verdict::ThisNodeFenced) {
        (
            Outcome::ThisNodeFenced,
            format!(
                "{own} is gone from: {}; not re-registered (P3)",
                failed_ids(&reports)
            ),
        )
    } else {
        (
            Outcome::Failure,
            format!("heal incomplete on: {}", failed_ids(&reports)),
        )
    };
    Ok(Report {
        command: "heal",
        outcome,
        summary,
        lus: reports,
    })
}
