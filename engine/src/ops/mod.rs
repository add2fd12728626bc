//! The fencing engine: unfence, fence (arbiter first), status and heal over many LUs, each LU
//! reached through one or more paths (I_T nexuses), with a verdict per LU.
//!
//! Safety properties (issue #4) and where each is decided:
//! - P1 (after fence succeeds no write from the victim's key lands): [`fence`] verifies the victim
//!   is gone and a reservation exists on every LU before it reports success. A key must name one
//!   node for that to mean the node: [`unfence_observed`], told this node's initiators, registers
//!   on no LU where another initiator holds its key.
//! - P2 (two nodes fencing each other never both survive, never split across LUs):
//!   `fence::fence_arbiter` fences each deciding LU, and `arbitration::race` reads their
//!   verdicts: the first LU by identifier decides alone, or a majority of an odd set of
//!   coordinator LUs ([`Arbitration`]); nothing else is touched until they have.
//! - P3 (a preempted key is never re-registered automatically): [`unfence`], an explicit act, is
//!   the only operation that registers a key. No SPC command registers a nexus only while a key
//!   is present, so any automatic REGISTER could bring a key back behind a fence that ran since
//!   the last look: `fence` registers nothing (a follower where our key is gone is left alone),
//!   `heal` registers nothing (it purges orphans with one self-PREEMPT, atomic, and names the
//!   paths that need `unfence`); [`probe_registration`], the one path probe, never registers.
//!   [`unfence_observed`] as a rejoin ([`UnfenceBy::Rejoin`]: fence_pr's `on`, which Pacemaker
//!   may run on a node it has just fenced) registers nowhere once its key is gone from an LU the
//!   node began registering on in this boot ([`BootRecord`]); every unfence that keeps the
//!   record adds each LU to it before its first REGISTER there.
//! - P4 (idempotent, convergent): every step reads the target first and only changes what is
//!   missing, so a rerun after a partial failure finishes the job.
//! - P5 (no clock-based safety): deadlines only turn slowness into reported failures; no decision
//!   depends on time.
//!
//! The engine is generic over [`PrTransport`], so it runs on SG_IO, on NVMe reservations, and on
//! the SPC and nvmet models in tests.

mod arbitration;
pub mod doctor;
mod drive;
mod failure;
mod fence;
mod heal;
mod lu;
mod lu_set;
mod own_initiators;
mod probe;
mod status;
mod targets;
mod unfence;

#[cfg(test)]
mod tests;

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::discover::LuId;
use crate::pr::{Key, ReservationType};
use crate::transport::{Hints, PrTransport};

pub use arbitration::{
    Arbitration, COORDINATORS, Race, UnreachableData, coordinator_count_ok, majority,
};
pub use drive::{
    fence, fence_arbitrated_observed, fence_observed, heal, status, status_observed, unfence,
    unfence_observed,
};
pub use failure::Failure;
pub use lu_set::{LastingPartialKeys, LuSet, keys_not_on_every_lu};
pub use own_initiators::{
    OtherKeyOnOwnInitiator, OwnInitiator, other_keys_on_own_initiators, own_key_on_other_initiators,
};
pub use probe::probe_registration;
pub use targets::{OpenPath, Opener, targets};
pub use unfence::{BootRecord, UnfenceBy};

/// The reservation type the engine creates: writes only from registered nexuses, so preempting a
/// key fences every path of that node at once (fence_scsi and fence_mpath use the same).
pub const FENCING_TYPE: ReservationType = ReservationType::WriteExclusiveRegistrantsOnly;

/// One logical unit and every path this node has to it.
#[derive(Debug)]
pub struct LuTarget<T> {
    /// The LU's identifier (VPD page 83h designator, e.g. `naa.6001405…`). LUs are ordered by it,
    /// so every node picks the same arbiter.
    pub id: LuId,
    pub paths: Vec<T>,
}

/// Limits for one engine command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The whole command, arbiter and fan-out together; LUs still pending then are reported as
    /// timed out. The per-command timeout is the transport's own (see [`crate::transport::Policy`]).
    pub deadline: Duration,
    /// fence: how long the node with the greater key waits on the arbiter LU, when both its own
    /// and the victim's key are registered there, before it reads again and preempts.
    pub tie_break: TieBreak,
}

/// The tie-break of a mutual fence. Two nodes preempting each other on one LU at the same moment
/// can lock up an LIO target (every Linux kernel up to 7.2 at least: the PREEMPT spins, holding
/// the LU's reservation lock, until the other node's PERSISTENT RESERVE OUT lets go of its
/// registration, and that command waits for the same lock). So while both keys are registered on
/// the arbiter, the node with the smaller key goes first and the other waits, then looks again:
/// by then it finds itself preempted and sends nothing. Only liveness rests on the wait: the
/// target alone decides who is fenced (P2, P5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieBreak {
    /// No wait (tests of a single fencer; the lab's reproduction of the lock-up).
    Off,
    /// This long, whatever this fence took (an admin's `--tie-break SECS`).
    Fixed(Duration),
    /// Twice what this fence took from `since` (its start: process start, after any deliberate
    /// delay) to the arbiter's first answer, at most `cap`. The other node of a mutual fence runs
    /// the same steps to reach its PREEMPT, so it needs about that long too: twice covers a start
    /// up to that much later or a node up to about three times slower, and a fence of a dead peer
    /// on fast storage waits milliseconds instead of [`TIE_BREAK_CAP`].
    Measured { since: Instant, cap: Duration },
}

/// The longest tie-break a measured one takes (and the wait before measured tie-breaks existed):
/// it covers the other node's start-up and its arbiter steps with a wide margin even under
/// emulation, and is far below a fence timeout.
pub const TIE_BREAK_CAP: Duration = Duration::from_secs(1);

impl TieBreak {
    /// Measured from now (the engine call's start), at most [`TIE_BREAK_CAP`].
    pub fn measured_from_now() -> Self {
        TieBreak::Measured {
            since: crate::runtime::now(),
            cap: TIE_BREAK_CAP,
        }
    }

    /// The wait, decided when the arbiter first answered (`now`).
    pub fn wait(self, now: Instant) -> Duration {
        match self {
            TieBreak::Off => Duration::ZERO,
            TieBreak::Fixed(wait) => wait,
            TieBreak::Measured { since, cap } => now
                .saturating_duration_since(since)
                .saturating_mul(2)
                .min(cap),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        // Below Pacemaker's default pcmk_off_timeout of 60 s, so we report before fenced gives up.
        Limits {
            deadline: Duration::from_secs(50),
            tie_break: TieBreak::measured_from_now(),
        }
    }
}

/// Requests the engine refuses before touching any LU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("no logical units given; name at least one device")]
    NoLus,
    #[error("LU {lu} has no paths")]
    NoPaths { lu: LuId },
    #[error("key 0 means \"no key\" in SPC; use a non-zero key")]
    ZeroKey,
    #[error("the own key and the victim key are the same ({0}); keys cannot be same")]
    SameKey(Key),
    #[error(
        "{count} coordinator LU(s) given: a coordinator set is 3 or 5 LUs, an odd number so that \
         two nodes cannot both hold a majority; name 3 (one per failure domain) or 5"
    )]
    CoordinatorCount { count: usize },
    #[error(
        "LU {lu} is named both as a coordinator and as a data LU: coordinators only decide who \
         survives; give it in one list"
    )]
    CoordinatorIsData { lu: LuId },
}

/// What became of one LU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// unfence: own key registered and a reservation exists.
    Unfenced,
    /// fence: the victim was registered and is gone; a reservation exists.
    VictimRemoved,
    /// fence: the victim was not registered (fenced before); a reservation exists.
    AlreadyFenced,
    /// status: own key registered.
    Registered,
    /// status: own key not registered.
    NotRegistered,
    /// heal: registrations repaired.
    Healed,
    /// heal: nothing to repair.
    Intact,
    /// heal: our key is on the LU but some live paths have no registration (a new iSCSI
    /// session): only `unfence` registers them.
    PathsUnregistered,
    /// Own key is not (or no longer) on this LU: this node was fenced, or never unfenced.
    ThisNodeFenced,
    /// Not touched because the arbiter LU did not succeed.
    Skipped,
    /// Still pending at the overall deadline.
    TimedOut,
    /// Anything else; the error says what.
    Failed,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Unfenced => "unfenced",
            Verdict::VictimRemoved => "victim removed",
            Verdict::AlreadyFenced => "victim already fenced",
            Verdict::Registered => "registered",
            Verdict::NotRegistered => "not registered",
            Verdict::Healed => "healed",
            Verdict::Intact => "intact",
            Verdict::PathsUnregistered => "paths not registered",
            Verdict::ThisNodeFenced => "this node was fenced",
            Verdict::Skipped => "skipped",
            Verdict::TimedOut => "timed out",
            Verdict::Failed => "failed",
        })
    }
}

/// How one path was used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathUse {
    /// Not needed (another path carried the work).
    Unused,
    /// Answered every command sent to it.
    Ok,
    /// Timeout, transport failure or open failure: the path looks dead.
    Dead,
    /// Answered, but with an error the engine could not work around on this path.
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathReport {
    pub device: String,
    pub state: PathUse,
    /// The last error on this path, in full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
}

/// The reservation as the target reported it at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReservationView {
    pub key: Key,
    #[serde(rename = "type")]
    pub rtype: ReservationType,
}

/// The verdict for one LU plus the evidence: which paths, what the target said afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LuReport {
    pub lu: LuId,
    pub ok: bool,
    pub verdict: Verdict,
    pub paths: Vec<PathReport>,
    /// READ KEYS at the end (None if it could not be read).
    pub keys: Option<Vec<Key>>,
    pub reservation: Option<ReservationView>,
    pub generation: Option<u32>,
    /// What happened on the way: fallbacks, dead paths, orphans.
    pub notes: Vec<Failure>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
}

impl LuReport {
    /// Gives every failed command in the report `hints`' advice (see [`Failure::advise`]).
    pub fn advise(&mut self, hints: Hints) {
        let paths = self.paths.iter_mut().filter_map(|p| p.error.as_mut());
        for failure in paths.chain(&mut self.notes).chain(self.error.as_mut()) {
            failure.advise(hints);
        }
    }

    fn bare(lu: &LuId, devices: &[String], verdict: Verdict, error: Option<Failure>) -> Self {
        LuReport {
            lu: lu.clone(),
            ok: false,
            verdict,
            paths: devices
                .iter()
                .map(|d| PathReport {
                    device: d.clone(),
                    state: PathUse::Unused,
                    error: None,
                })
                .collect(),
            keys: None,
            reservation: None,
            generation: None,
            notes: Vec::new(),
            error,
        }
    }
}

/// One LU finished its step: what a caller may show while the others are still running (the
/// admin CLI prints a progress line on a terminal). The engine knows nothing of how it is shown.
#[derive(Debug, Clone, Copy)]
pub struct LuDone<'a> {
    /// The LU's report as its step left it. fence: if this node is found fenced after the
    /// fan-out, every verdict becomes [`Verdict::ThisNodeFenced`]; the returned [`Report`] is the
    /// final word.
    pub report: &'a LuReport,
    /// LUs finished so far, this one included (1-based).
    pub done: usize,
    /// LUs in the command, after paths to the same LU were merged.
    pub total: usize,
    /// fence: this is the arbiter LU, decided alone before any other LU is touched.
    pub arbiter: bool,
    /// How long the LU's step ran (for a LU timed out: until the deadline); `None` for a LU that
    /// was skipped and never ran.
    pub took: Option<Duration>,
}

/// Told of every LU once, as it finishes, in the order they finish (see [`LuDone`]). It runs on
/// the task awaiting the engine command, between LUs, so it should be quick.
pub type Observer<'a> = dyn FnMut(LuDone<'_>) + Send + 'a;

/// The overall result of one engine command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every LU verified (status: own key registered on every LU).
    Success,
    /// fence: the arbiter showed our own key gone (we lost the race or were never unfenced), or
    /// we were fenced while fencing; heal: own key gone.
    ThisNodeFenced,
    /// status: own key on no LU.
    Off,
    /// status: own key on some LUs only.
    Partial,
    /// Anything else: a LU failed, timed out or was skipped.
    Failure,
}

/// One engine command's result: the outcome plus a report per LU, in LU identifier order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub command: &'static str,
    pub outcome: Outcome,
    /// For people: what the outcome means and what to do.
    pub summary: String,
    pub lus: Vec<LuReport>,
}

impl Report {
    /// The report with every failed command given `hints`' advice: what a front end does
    /// before it shows the report.
    pub fn advised(mut self, hints: Hints) -> Self {
        for lu in &mut self.lus {
            lu.advise(hints);
        }
        self
    }
}

/// Sorts by LU identifier and merges targets that name the same LU (callers' order and grouping
/// are not trusted: the arbiter must be the same LU on every node, P2). Node-local identifiers
/// sort after every designator ([`LuId`]'s order), so one unidentifiable device cannot become the
/// arbiter (and a fence refuses to name one while any is present: `FenceRun::arbiter_uncertain`).
fn normalize<T: PrTransport>(mut lus: Vec<LuTarget<T>>) -> Result<Vec<LuTarget<T>>, RequestError> {
    if lus.is_empty() {
        return Err(RequestError::NoLus);
    }
    lus.sort_by(|a, b| a.id.cmp(&b.id));
    let mut merged: Vec<LuTarget<T>> = Vec::with_capacity(lus.len());
    for lu in lus {
        match merged.last_mut() {
            Some(last) if last.id == lu.id => last.paths.extend(lu.paths),
            _ => merged.push(lu),
        }
    }
    if let Some(empty) = merged.iter().find(|lu| lu.paths.is_empty()) {
        return Err(RequestError::NoPaths {
            lu: empty.id.clone(),
        });
    }
    Ok(merged)
}
