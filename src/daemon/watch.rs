//! Watch mode (replaces `fence_scsi_check`): one observation per LU per tick in, one
//! [`Decision`] out. No I/O and no clock: the caller passes `now` from its monotonic clock.
//!
//! Per tick the caller reads the keys of every LU (one READ KEYS through a read-only open) and
//! feeds them to [`WatchState::tick`]. Per-path registration is only probed when the decision
//! asks for it ([`LuVerdict::InspectPaths`]): at start, when discovery saw the path set change
//! (an iSCSI re-login is a new session), when the number of times our key is listed changed,
//! once per `path_audit` if one is set, and while the last probe found a path unregistered:
//! every [`DEGRADED_RECHECK`], and at most every [`REPAIR_LOOK_SPACING`] when the LU's
//! PRgeneration moved (to see `prfence unfence`'s repair, which may leave the count as it was).
//! The count alone can miss an orphan: after an iSCSI re-login the old nexus's registration
//! stays on the target, so the count still matches while the new nexus has none. A probe is a
//! PERSISTENT RESERVE OUT (`ops::probe_registration`), and a PR OUT of the victim's can cross a
//! PREEMPT on LIO (docs/target-notes.md); so a healthy node in a steady state sends none. A
//! healthy node ignores the PRgeneration: every probe bumps it, so with probes on its change
//! each node's probe would make every other node probe, for ever.
//!
//! An LU is judged only once armed: one of this node's own paths seen holding our key there
//! ([`ArmCheck`]), not merely our key listed, which a node deriving the same key also makes.
//!
//! The verdicts, in the order they are decided for one LU:
//! - our key missing from the LU on `missing_confirmations` reads in a row: **fenced**. One LU is
//!   enough: fence_scsi_check passes if the key is on any device, which let a multi-LUN split
//!   brain keep running (fence-agents #278). A second read rides out a brief absence during a
//!   re-registration (#576).
//! - no good read for `grace` (unreachable, timed out, or no answer at all): **fenced**; before
//!   that the LU is reported [`LuVerdict::Unreachable`].
//! - our key present but some path lacks its registration: an iSCSI re-login orphan (new ISID,
//!   #517). The old session's orphaned registration may be purged; the path itself is left to
//!   `prfence unfence`: no automatic REGISTER, ever (P3).
//!
//! Fenced is latched: the state never returns to healthy and never asks for a heal again, even
//! if the key reappears (P3: a preempted key is never re-registered automatically).
//!
//! Coordinators (issue 47, [`WatchConfig::coordinators`]) are judged like the data LUs, but one
//! alone never fences: in a mutual fence the loser preempts the winner on the coordinators it
//! reached first, a minority, and the winner must go on (docs/concepts.md, "Coordinator LUs").
//! Our key gone from a **majority** of all the coordinators fences: this node can no longer win
//! a fence, and the node that took them fences the data LUs next. A coordinator lost (key gone,
//! or unreadable past the grace) is [`LuVerdict::CoordinatorLost`]: degraded, since fewer losses
//! are left before fencing stops working. An unreadable coordinator never counts towards the
//! majority: an array that is down says nothing about who won, and the data LUs still fence a
//! node another node fenced.

use std::time::{Duration, Instant};

pub use super::failure::CommandFailure;
use crate::pr::Key;

pub(super) mod driver;
pub mod key;
pub(super) mod own_initiators;

/// The name of one LU in the agent's reports: the configured device name, or its identifier's
/// text (a report's label; the identifier itself, which orders LUs, is `discover::LuId`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LuName(pub String);

/// One path (I_T nexus) of an LU, e.g. `sdc`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId(pub String);

impl std::fmt::Display for LuName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for PathId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether one path of an LU carries our registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbedPath {
    pub path: PathId,
    pub registered: bool,
}

/// The keys read from one LU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuKeys {
    /// Every registered key as READ KEYS lists it: one entry per registered I_T nexus, so our
    /// key appears once per registered path.
    pub keys: Vec<Key>,
    /// How many times our key is listed when every path is registered (from discovery): one per
    /// SCSI path, one for all of an NVMe namespace's paths (`LuEntry::registrations_expected`).
    pub path_count: usize,
    /// Per-path knowledge, when the caller probed the paths (after [`LuVerdict::InspectPaths`]).
    pub paths: Option<Vec<ProbedPath>>,
    /// Discovery saw a path appear, vanish or log in again since the previous tick.
    pub paths_changed: bool,
    /// The LU's PRgeneration as READ KEYS gave it: every PR OUT that changes something bumps it
    /// (our probes and every other node's included), so it is looked at only while a path is
    /// found unregistered, to see a repair that left the count as it was.
    pub generation: u32,
    /// A probe of the paths was asked for and no path answered it: the block PR ioctls that
    /// change a reservation need CAP_SYS_ADMIN, which the packaged unit does not grant, so on
    /// NVMe under it no probe is ever made.
    pub probe_failed: bool,
}

/// One LU's result for this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub lu: LuName,
    pub result: Result<LuKeys, CommandFailure>,
}

/// Why this node considers itself fenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceReason {
    /// Our key was missing from `lu` on `reads` consecutive reads.
    KeyMissing { lu: LuName, reads: u32 },
    /// No good read of `lu` for `for_` (≥ grace); `last_error` is the most recent failure.
    Unreachable {
        lu: LuName,
        for_: Duration,
        last_error: Option<CommandFailure>,
    },
    /// Our key was missing, on `missing_confirmations` reads in a row, from each of `lus`: a
    /// majority of the `of` coordinators.
    CoordinatorsLost { lus: Vec<LuName>, of: usize },
}

impl std::fmt::Display for FenceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FenceReason::KeyMissing { lu, reads } => {
                write!(
                    f,
                    "our key is gone from LU {lu} ({reads} reads in a row): we were fenced"
                )
            }
            FenceReason::Unreachable {
                lu,
                for_,
                last_error,
            } => write!(
                f,
                "LU {lu} unreadable for {for_:?} (last error: {last_error:?}), past the grace: \
                 treating ourselves as fenced"
            ),
            FenceReason::CoordinatorsLost { lus, of } => write!(
                f,
                "our key is gone from {} of the {of} coordinators ({}): another node won them, \
                 we were fenced",
                lus.len(),
                lus.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// The verdict on one LU for this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LuVerdict {
    /// Our key is registered on every path we know of.
    Healthy,
    /// Our key was missing on `reads` consecutive reads, fewer than needed to call it fenced;
    /// read again next tick.
    KeyMissing { reads: u32 },
    /// Our key is on the LU fewer times than it has paths, the path set changed, or the audit
    /// is due: probe each path and report [`LuKeys::paths`] next tick. `unregistered`: the paths
    /// the last probe found without our registration, which stand until a probe says otherwise.
    InspectPaths { unregistered: Vec<PathId> },
    /// These paths lack our registration: `ops::heal` purges the orphaned registrations of
    /// earlier sessions where one atomic command can, and names the paths for `prfence
    /// unfence`. It never registers them (P3: a preempt can land between any read and a
    /// REGISTER).
    Heal { paths: Vec<PathId> },
    /// Paths lack our registration and `heal = false`: report only.
    Orphaned { paths: Vec<PathId> },
    /// No good read since `last_good` (or since start); fenced once this reaches the grace.
    Unreachable {
        last_good: Instant,
        last_error: Option<CommandFailure>,
    },
    /// This node is fenced (latched).
    Fenced,
    /// Added by a reload and our key not yet held on it: not judged (no fence, no unreachable
    /// grace) until it is ([`ArmCheck`]).
    WaitingForRegistration,
    /// Added by a reload: our key is listed on it, not yet judged; `probe`: probe every path at
    /// the next check to see whether one of ours holds it ([`ArmCheck`]).
    CheckingOwnRegistration { probe: bool },
    /// Added by a reload: our key is listed on it, but the probe found none of this node's paths
    /// holding it ([`Arming::HeldElsewhere`]); not judged.
    HeldElsewhere,
    /// A coordinator lost: what would fence on a data LU (`reason`), which on a coordinator
    /// fences only with a majority of them lost. Judged again at every check: `prfence unfence`
    /// registering our key there again makes it healthy.
    CoordinatorLost { reason: FenceReason },
}

impl LuVerdict {
    /// Whether this verdict makes the node's state `degraded`: anything but our key on every
    /// path (or a probe of paths that were all registered last time).
    pub fn is_degraded(&self) -> bool {
        match self {
            LuVerdict::Healthy => false,
            LuVerdict::InspectPaths { unregistered } => !unregistered.is_empty(),
            _ => true,
        }
    }
}

/// The outcome of one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Per LU, in configuration order.
    pub lus: Vec<(LuName, LuVerdict)>,
    /// Set from the tick that decided it onwards (latched).
    pub fenced: Option<FenceReason>,
    /// True on exactly the tick that fenced: run the self-fence action now.
    pub newly_fenced: bool,
    /// Feed the hardware watchdog this tick: true until fenced. Within the grace an unreachable
    /// LU still feeds, or the watchdog would cut the grace short.
    pub feed_watchdog: bool,
}

/// Watch-mode settings the state machine needs (from `config::WatchModeSettings` plus the
/// resolved key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    pub own_key: Key,
    pub grace: Duration,
    pub missing_confirmations: u32,
    pub heal: bool,
    /// Also probe every path this often while all looks right (`None`: only on a change).
    pub path_audit: Option<Duration>,
    /// The LUs that are coordinators (none, or an odd set checked by the configuration): our key
    /// gone from one of them does not fence, from a majority does.
    pub coordinators: Vec<LuName>,
}

/// How often the paths of an LU are probed again while the last probe found one unregistered:
/// the repair (`prfence unfence`) may not change the key count (the orphan it purges counted).
pub const DEGRADED_RECHECK: Duration = Duration::from_secs(60);

/// While a path is found unregistered, a PRgeneration that moved (someone's PR OUT: perhaps
/// `prfence unfence`'s repair) asks for a probe, but no sooner than this after the last one, so
/// that two degraded nodes' probes, each of which bumps the generation, do not chase each other
/// at every check.
pub const REPAIR_LOOK_SPACING: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
struct LuState {
    id: LuName,
    last_good: Instant,
    last_error: Option<CommandFailure>,
    missing_reads: u32,
    /// When per-path registration was last reported; `None`: not yet in this run.
    last_audit: Option<Instant>,
    /// How many times our key was listed when the paths were last probed.
    audited_count: Option<usize>,
    /// The PRgeneration as the first read after the last probe saw it (`None` until that read:
    /// the probe's own REGISTERs bump it). Kept until the next probe, so a change is not lost
    /// while [`REPAIR_LOOK_SPACING`] holds the probe back.
    generation: Option<u32>,
    /// The paths the last probe found without our registration. The key count cannot show
    /// them (an orphan of an earlier session counts as one), so they are reported until the
    /// next probe finds them registered (after `prfence unfence`).
    unregistered: Vec<PathId>,
    /// Judged: one of our paths has been seen holding our key. An LU added by a reload starts
    /// unjudged until then, as every LU does at start: a missing key on an LU nobody registered
    /// yet is no fence.
    armed: bool,
    /// Until armed: whether our own paths hold the key ([`ArmCheck`]).
    arm_check: ArmCheck,
    /// One of [`WatchConfig::coordinators`].
    coordinator: bool,
}

/// The watch-mode state: per LU, when it was last read well and how many reads missed our key.
#[derive(Debug, Clone)]
pub struct WatchState {
    config: WatchConfig,
    lus: Vec<LuState>,
    fenced: Option<FenceReason>,
}

impl WatchState {
    /// Starts watching `lus`. The start counts as the last good read, so an LU that never
    /// answers is declared fenced `grace` after start.
    pub fn new(config: WatchConfig, lus: impl IntoIterator<Item = LuName>, now: Instant) -> Self {
        WatchState::with_pending(config, lus.into_iter().map(|id| (id, true)), now)
    }

    /// Starts watching `lus`, each `(name, armed)`: an LU not armed (added by a reload) is not
    /// judged until one of this node's paths holds our key there ([`ArmCheck`]; until then
    /// [`LuVerdict::WaitingForRegistration`] or [`LuVerdict::HeldElsewhere`]); from then on it is
    /// judged like the others.
    pub fn with_pending(
        config: WatchConfig,
        lus: impl IntoIterator<Item = (LuName, bool)>,
        now: Instant,
    ) -> Self {
        let lus = lus
            .into_iter()
            .map(|(id, armed)| LuState {
                coordinator: config.coordinators.contains(&id),
                id,
                last_good: now,
                last_error: None,
                missing_reads: 0,
                last_audit: None,
                audited_count: None,
                generation: None,
                unregistered: Vec::new(),
                armed,
                arm_check: ArmCheck::default(),
            })
            .collect();
        WatchState {
            config,
            lus,
            fenced: None,
        }
    }

    pub fn fenced(&self) -> Option<&FenceReason> {
        self.fenced.as_ref()
    }

    /// Applies new timings (a configuration reload) and keeps what was observed: last good reads,
    /// missed reads, audits, and the fenced latch. The key and the LUs are not changed here: a
    /// reload that changes them starts a new state.
    pub fn reconfigure(&mut self, config: WatchConfig) {
        self.config = WatchConfig {
            own_key: self.config.own_key,
            ..config
        };
    }

    /// Applies this tick's observations (at most one per LU; an LU without one is "no answer")
    /// and decides. Observations for LUs not being watched are ignored.
    pub fn tick(
        &mut self,
        now: Instant,
        observations: impl IntoIterator<Item = Observation>,
    ) -> Decision {
        let mut results: Vec<Option<Result<LuKeys, CommandFailure>>> = vec![None; self.lus.len()];
        for observation in observations {
            if let Some(index) = self.lus.iter().position(|lu| lu.id == observation.lu) {
                results[index] = Some(observation.result);
            }
        }
        let already_fenced = self.fenced.is_some();
        let mut verdicts = Vec::with_capacity(self.lus.len());
        // Coordinators without our key: lost while judged (confirmed), and not yet judged with a
        // good read that does not list it (gone before the watch armed on the others).
        let mut coordinators_gone = Vec::new();
        let mut lost_while_judged = false;
        for (lu, result) in self.lus.iter_mut().zip(results) {
            let unjudged_without_key = lu.coordinator
                && !lu.armed
                && matches!(&result, Some(Ok(keys)) if !keys.keys.contains(&self.config.own_key));
            let verdict = match judge(&self.config, lu, result, now) {
                Verdict::Fence(reason) if lu.coordinator => {
                    if let FenceReason::KeyMissing { .. } = reason {
                        coordinators_gone.push(lu.id.clone());
                        lost_while_judged = true;
                    }
                    Verdict::Lu(LuVerdict::CoordinatorLost { reason })
                }
                verdict => {
                    if unjudged_without_key {
                        coordinators_gone.push(lu.id.clone());
                    }
                    verdict
                }
            };
            // P3: once fenced, nothing is healed; the first LU (in order) that fences names why.
            if let Verdict::Fence(reason) = &verdict
                && self.fenced.is_none()
            {
                self.fenced = Some(reason.clone());
            }
            verdicts.push((lu.id.clone(), verdict));
        }
        // A majority gone fences, once one of them went while judged: coordinators a reload
        // added and nobody registered yet are no sign of a fence.
        let of = self.config.coordinators.len();
        if self.fenced.is_none()
            && lost_while_judged
            && coordinators_gone.len() >= crate::ops::majority(of)
        {
            self.fenced = Some(FenceReason::CoordinatorsLost {
                lus: coordinators_gone,
                of,
            });
        }
        let fenced = self.fenced.is_some();
        Decision {
            lus: verdicts
                .into_iter()
                .map(|(id, verdict)| {
                    let verdict = match verdict {
                        _ if fenced => LuVerdict::Fenced,
                        Verdict::Fence(_) => LuVerdict::Fenced,
                        Verdict::Lu(v) => v,
                    };
                    (id, verdict)
                })
                .collect(),
            fenced: self.fenced.clone(),
            newly_fenced: fenced && !already_fenced,
            feed_watchdog: !fenced,
        }
    }
}

enum Verdict {
    Lu(LuVerdict),
    Fence(FenceReason),
}

/// The single place that judges one LU (P3: heal only while our key is on the LU).
fn judge(
    config: &WatchConfig,
    lu: &mut LuState,
    result: Option<Result<LuKeys, CommandFailure>>,
    now: Instant,
) -> Verdict {
    if !lu.armed {
        let Some(Ok(keys)) = &result else {
            return Verdict::Lu(LuVerdict::WaitingForRegistration);
        };
        match lu.arm_check.judge(now, config.own_key, keys) {
            Arming::Held | Arming::ListedUnprobed => {
                lu.armed = true;
                lu.last_good = now;
            }
            Arming::Probe => {
                return Verdict::Lu(LuVerdict::CheckingOwnRegistration { probe: true });
            }
            Arming::Pending => {
                return Verdict::Lu(LuVerdict::CheckingOwnRegistration { probe: false });
            }
            Arming::HeldElsewhere => return Verdict::Lu(LuVerdict::HeldElsewhere),
            Arming::NotListed => return Verdict::Lu(LuVerdict::WaitingForRegistration),
        }
    }
    let keys = match result {
        Some(Ok(keys)) => keys,
        failure => {
            if let Some(Err(kind)) = failure {
                lu.last_error = Some(kind);
            }
            let for_ = now.saturating_duration_since(lu.last_good);
            if for_ >= config.grace {
                return Verdict::Fence(FenceReason::Unreachable {
                    lu: lu.id.clone(),
                    for_,
                    last_error: lu.last_error,
                });
            }
            return Verdict::Lu(LuVerdict::Unreachable {
                last_good: lu.last_good,
                last_error: lu.last_error,
            });
        }
    };
    lu.last_good = now;
    lu.last_error = None;
    let registered_paths = keys.keys.iter().filter(|&&k| k == config.own_key).count();
    if registered_paths == 0 {
        lu.missing_reads = lu.missing_reads.saturating_add(1);
        if lu.missing_reads >= config.missing_confirmations {
            return Verdict::Fence(FenceReason::KeyMissing {
                lu: lu.id.clone(),
                reads: lu.missing_reads,
            });
        }
        return Verdict::Lu(LuVerdict::KeyMissing {
            reads: lu.missing_reads,
        });
    }
    lu.missing_reads = 0;
    let Some(paths) = keys.paths else {
        let generation_moved = *lu.generation.get_or_insert(keys.generation) != keys.generation;
        let audit_due = match lu.last_audit {
            None => true,
            Some(at) => {
                let since = now.saturating_duration_since(at);
                config.path_audit.is_some_and(|every| since >= every)
                    || (!lu.unregistered.is_empty()
                        && (since >= DEGRADED_RECHECK
                            || (generation_moved && since >= REPAIR_LOOK_SPACING)))
            }
        };
        let count_changed = lu.audited_count != Some(registered_paths);
        return Verdict::Lu(if count_changed || keys.paths_changed || audit_due {
            LuVerdict::InspectPaths {
                unregistered: lu.unregistered.clone(),
            }
        } else if !lu.unregistered.is_empty() {
            // Between two audits the last one's finding stands; the heal ran at the audit.
            LuVerdict::Orphaned {
                paths: lu.unregistered.clone(),
            }
        } else {
            LuVerdict::Healthy
        });
    };
    lu.last_audit = Some(now);
    lu.audited_count = Some(registered_paths);
    lu.generation = None;
    let orphans: Vec<PathId> = paths
        .into_iter()
        .filter(|p| !p.registered)
        .map(|p| p.path)
        .collect();
    lu.unregistered.clone_from(&orphans);
    Verdict::Lu(match (orphans.is_empty(), config.heal) {
        (true, _) => LuVerdict::Healthy,
        (false, true) => LuVerdict::Heal { paths: orphans },
        (false, false) => LuVerdict::Orphaned { paths: orphans },
    })
}

/// Whether this node holds its key on one LU, before the LU is judged (armed). Our key listed
/// by READ KEYS is not enough: a node that derives the same key (a corosync position another node
/// kept after a removal) lists it too, and a node armed on it would self-fence when that other
/// node's key goes, though it was never unfenced. One of this node's own paths must hold it, as
/// a probe (`ops::probe_registration`: REGISTER key -> same key, refused on a path that does not
/// hold it, so it changes nothing there) shows. The single place arming is decided: at start for
/// every LU and for an LU a reload adds.
///
/// Probes are PR OUTs, so they are spaced as the armed watch spaces them: one when the key is
/// first listed, then, while the last one found no path holding it, every [`DEGRADED_RECHECK`]
/// or at most every [`REPAIR_LOOK_SPACING`] when the PRgeneration moved; a finding that the
/// key is held stands until the PRgeneration moves.
#[derive(Debug, Clone, Default)]
pub struct ArmCheck {
    /// When the paths were last probed, and whether one held our key.
    probed: Option<(Instant, bool)>,
    /// The PRgeneration as the first read after the last probe saw it (the probe's own
    /// REGISTER bumps it).
    generation: Option<u32>,
}

/// What [`ArmCheck::judge`] found on one LU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arming {
    /// Our key is not listed: waiting for fence_pr's `on` or `prfence unfence`.
    NotListed,
    /// Listed: probe every path at the next check.
    Probe,
    /// Listed, and a probe is due but spaced: nothing to conclude yet.
    Pending,
    /// Listed, but the last probe found no path of this node holding it: another node registered
    /// the same key, or this node's session logged in again since its unfencing (an orphan).
    HeldElsewhere,
    /// One of this node's paths holds our key: the LU can be judged.
    Held,
    /// Listed, no path of this node could be probed (see [`LuKeys::probe_failed`]) and none
    /// ever was since the key was listed: judged on the key as listed, as before probes existed. Only the check that another node does not
    /// hold the same key is lost.
    ListedUnprobed,
}

impl ArmCheck {
    /// No probe yet since our key was last listed: the caller may probe in the check that
    /// first lists it, where [`ArmCheck::judge`] would ask for one.
    pub fn never_probed(&self) -> bool {
        self.probed.is_none()
    }

    /// Judges one good read of the LU (`keys.paths` set when this check probed).
    pub fn judge(&mut self, now: Instant, own_key: Key, keys: &LuKeys) -> Arming {
        if !keys.keys.contains(&own_key) {
            // A key that comes back is probed afresh.
            *self = ArmCheck::default();
            return Arming::NotListed;
        }
        if let Some(paths) = &keys.paths {
            let held = paths.iter().any(|p| p.registered);
            self.probed = Some((now, held));
            self.generation = None;
            return if held {
                Arming::Held
            } else {
                Arming::HeldElsewhere
            };
        }
        // Never looked at: judged on the key as listed. Looked at before: that finding stands
        // (a probe that fails once must not arm a node the last one found holding nothing).
        if keys.probe_failed && self.probed.is_none() {
            return Arming::ListedUnprobed;
        }
        let Some((at, held)) = self.probed else {
            return Arming::Probe;
        };
        let moved = *self.generation.get_or_insert(keys.generation) != keys.generation;
        let since = now.saturating_duration_since(at);
        match (held, moved) {
            (true, false) => Arming::Held,
            (_, true) if since >= REPAIR_LOOK_SPACING => Arming::Probe,
            (false, _) if since >= DEGRADED_RECHECK => Arming::Probe,
            (true, true) => Arming::Pending,
            (false, _) => Arming::HeldElsewhere,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: Key = Key::new(0x1111);
    const THEIRS: Key = Key::new(0x2222);
    /// Probe the paths; the last probe found none unregistered.
    const INSPECT: LuVerdict = LuVerdict::InspectPaths {
        unregistered: Vec::new(),
    };

    fn config() -> WatchConfig {
        WatchConfig {
            own_key: OURS,
            grace: Duration::from_secs(10),
            missing_confirmations: 2,
            heal: true,
            path_audit: None,
            coordinators: Vec::new(),
        }
    }

    fn all_registered(lu_name: &str) -> Observation {
        Observation {
            lu: lu(lu_name),
            result: Ok(LuKeys {
                keys: vec![OURS],
                path_count: 1,
                paths: Some(vec![ProbedPath {
                    path: PathId(format!("{lu_name}-p0")),
                    registered: true,
                }]),
                paths_changed: false,
                generation: 0,
                probe_failed: false,
            }),
        }
    }

    /// A state whose start-up path audit is done, so verdicts below are about keys alone.
    fn audited(config: WatchConfig, names: &[&str], t0: Instant) -> WatchState {
        let mut w = WatchState::new(config, names.iter().map(|n| lu(n)), t0);
        let d = w.tick(t0, names.iter().map(|n| all_registered(n)));
        assert!(d.lus.iter().all(|(_, v)| *v == LuVerdict::Healthy), "{d:?}");
        w
    }

    /// LU "a" probed: `paths` unregistered, "sdb" registered; our key listed twice.
    fn obs_unregistered(paths: &[PathId]) -> Observation {
        let mut probed = vec![ProbedPath {
            path: PathId("sdb".into()),
            registered: true,
        }];
        probed.extend(paths.iter().map(|p| ProbedPath {
            path: p.clone(),
            registered: false,
        }));
        Observation {
            lu: lu("a"),
            result: Ok(LuKeys {
                keys: vec![OURS, OURS],
                path_count: 2,
                paths: Some(probed),
                paths_changed: false,
                generation: 0,
                probe_failed: false,
            }),
        }
    }

    fn lu(name: &str) -> LuName {
        LuName(name.to_owned())
    }

    fn keys(lu_name: &str, keys: &[Key], path_count: usize) -> Observation {
        Observation {
            lu: lu(lu_name),
            result: Ok(LuKeys {
                keys: keys.to_vec(),
                path_count,
                paths: None,
                paths_changed: false,
                generation: 0,
                probe_failed: false,
            }),
        }
    }

    fn failed(lu_name: &str, kind: CommandFailure) -> Observation {
        Observation {
            lu: lu(lu_name),
            result: Err(kind),
        }
    }

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    fn two_lus(t0: Instant) -> WatchState {
        audited(config(), &["a", "b"], t0)
    }

    #[test]
    fn healthy_when_key_on_every_path_of_every_lu() {
        let t0 = Instant::now();
        let mut w = two_lus(t0);
        let d = w.tick(
            at(t0, 1),
            [keys("a", &[OURS, THEIRS], 1), keys("b", &[OURS], 1)],
        );
        assert_eq!(
            d.lus,
            vec![(lu("a"), LuVerdict::Healthy), (lu("b"), LuVerdict::Healthy)]
        );
        assert!(d.fenced.is_none() && d.feed_watchdog && !d.newly_fenced);
    }

    #[test]
    fn key_gone_from_one_lu_fences_even_if_on_others() {
        // fence-agents #278: fence_scsi_check passes if the key is on any device.
        let t0 = Instant::now();
        let mut w = two_lus(t0);
        let d = w.tick(at(t0, 1), [keys("a", &[OURS], 1), keys("b", &[THEIRS], 1)]);
        assert_eq!(d.lus[1].1, LuVerdict::KeyMissing { reads: 1 });
        assert!(d.fenced.is_none() && d.feed_watchdog);
        let d = w.tick(at(t0, 2), [keys("a", &[OURS], 1), keys("b", &[THEIRS], 1)]);
        assert_eq!(
            d.fenced,
            Some(FenceReason::KeyMissing {
                lu: lu("b"),
                reads: 2
            })
        );
        assert!(d.newly_fenced && !d.feed_watchdog);
        assert!(d.lus.iter().all(|(_, v)| *v == LuVerdict::Fenced));
    }

    #[test]
    fn brief_absence_is_ridden_out() {
        // #576: the key vanishes for one read during a re-registration, then is back.
        let t0 = Instant::now();
        let mut w = two_lus(t0);
        w.tick(at(t0, 1), [keys("a", &[], 1), keys("b", &[OURS], 1)]);
        let d = w.tick(at(t0, 2), [keys("a", &[OURS], 1), keys("b", &[OURS], 1)]);
        assert!(d.fenced.is_none());
        // The count restarts: a later single miss is again only a suspicion.
        let d = w.tick(at(t0, 3), [keys("a", &[], 1), keys("b", &[OURS], 1)]);
        assert_eq!(d.lus[0].1, LuVerdict::KeyMissing { reads: 1 });
    }

    #[test]
    fn one_confirmation_fences_on_first_miss() {
        let t0 = Instant::now();
        let mut w = WatchState::new(
            WatchConfig {
                missing_confirmations: 1,
                ..config()
            },
            [lu("a")],
            t0,
        );
        assert!(w.tick(at(t0, 1), [keys("a", &[THEIRS], 1)]).newly_fenced);
    }

    #[test]
    fn fenced_is_latched_and_never_heals() {
        let t0 = Instant::now();
        let mut w = WatchState::new(
            WatchConfig {
                missing_confirmations: 1,
                ..config()
            },
            [lu("a")],
            t0,
        );
        let first = w.tick(at(t0, 1), [keys("a", &[], 2)]);
        assert!(first.newly_fenced);
        // The key is back (someone re-registered it) and a path lacks it: no heal (P3), still
        // fenced, not "newly" so the action does not run twice.
        let mut obs = keys("a", &[OURS], 2);
        if let Ok(k) = &mut obs.result {
            k.paths = Some(vec![
                ProbedPath {
                    path: PathId("sdb".into()),
                    registered: true,
                },
                ProbedPath {
                    path: PathId("sdc".into()),
                    registered: false,
                },
            ]);
        }
        let d = w.tick(at(t0, 2), [obs]);
        assert_eq!(d.fenced, first.fenced);
        assert!(!d.newly_fenced && !d.feed_watchdog);
        assert_eq!(d.lus, vec![(lu("a"), LuVerdict::Fenced)]);
    }

    #[test]
    fn missing_path_registration_asks_for_inspection_then_heal() {
        let t0 = Instant::now();
        let mut w = WatchState::new(config(), [lu("a")], t0);
        let d = w.tick(at(t0, 1), [keys("a", &[OURS, THEIRS, THEIRS], 2)]);
        assert_eq!(d.lus[0].1, INSPECT);
        let obs = Observation {
            lu: lu("a"),
            result: Ok(LuKeys {
                keys: vec![OURS, THEIRS],
                path_count: 2,
                paths_changed: false,
                generation: 0,
                probe_failed: false,
                paths: Some(vec![
                    ProbedPath {
                        path: PathId("sdb".into()),
                        registered: true,
                    },
                    ProbedPath {
                        path: PathId("sdc".into()),
                        registered: false,
                    },
                ]),
            }),
        };
        let d = w.tick(at(t0, 2), [obs.clone()]);
        assert_eq!(
            d.lus[0].1,
            LuVerdict::Heal {
                paths: vec![PathId("sdc".into())]
            }
        );
        assert!(d.feed_watchdog);
        let mut no_heal = WatchState::new(
            WatchConfig {
                heal: false,
                ..config()
            },
            [lu("a")],
            t0,
        );
        let d = no_heal.tick(at(t0, 2), [obs]);
        assert_eq!(
            d.lus[0].1,
            LuVerdict::Orphaned {
                paths: vec![PathId("sdc".into())]
            }
        );
    }

    #[test]
    fn unreachable_fences_after_grace_from_last_good_read() {
        let t0 = Instant::now();
        let mut w = two_lus(t0);
        w.tick(at(t0, 5), [keys("a", &[OURS], 1), keys("b", &[OURS], 1)]);
        let d = w.tick(
            at(t0, 6),
            [keys("a", &[OURS], 1), failed("b", CommandFailure::Timeout)],
        );
        assert_eq!(
            d.lus[1].1,
            LuVerdict::Unreachable {
                last_good: at(t0, 5),
                last_error: Some(CommandFailure::Timeout)
            }
        );
        assert!(
            d.feed_watchdog,
            "the grace must not be cut short by the watchdog"
        );
        // No observation at all counts the same; the last error is remembered.
        let d = w.tick(at(t0, 14), [keys("a", &[OURS], 1)]);
        assert!(d.fenced.is_none());
        let d = w.tick(
            at(t0, 15),
            [
                keys("a", &[OURS], 1),
                failed("b", CommandFailure::Unreachable),
            ],
        );
        assert_eq!(
            d.fenced,
            Some(FenceReason::Unreachable {
                lu: lu("b"),
                for_: Duration::from_secs(10),
                last_error: Some(CommandFailure::Unreachable)
            })
        );
        assert!(d.newly_fenced && !d.feed_watchdog);
    }

    #[test]
    fn never_answering_lu_fences_grace_after_start() {
        let t0 = Instant::now();
        let mut w = WatchState::new(config(), [lu("a")], t0);
        assert!(w.tick(at(t0, 9), []).fenced.is_none());
        let d = w.tick(at(t0, 10), []);
        assert!(matches!(
            d.fenced,
            Some(FenceReason::Unreachable {
                last_error: None,
                ..
            })
        ));
    }

    #[test]
    fn recovery_within_grace_resets_the_clock() {
        let t0 = Instant::now();
        let mut w = audited(config(), &["a"], t0);
        w.tick(at(t0, 8), [failed("a", CommandFailure::Conflict)]);
        assert_eq!(
            w.tick(at(t0, 9), [keys("a", &[OURS], 1)]).lus[0].1,
            LuVerdict::Healthy
        );
        assert!(
            w.tick(at(t0, 18), [failed("a", CommandFailure::Failed)])
                .fenced
                .is_none()
        );
        assert!(w.tick(at(t0, 19), []).fenced.is_some());
    }

    #[test]
    fn first_fencing_lu_names_the_reason_and_unknown_lus_are_ignored() {
        let t0 = Instant::now();
        let mut w = WatchState::new(
            WatchConfig {
                missing_confirmations: 1,
                ..config()
            },
            [lu("a"), lu("b")],
            t0,
        );
        let d = w.tick(
            at(t0, 1),
            [keys("zz", &[], 1), keys("b", &[], 1), keys("a", &[], 1)],
        );
        assert_eq!(
            d.fenced,
            Some(FenceReason::KeyMissing {
                lu: lu("a"),
                reads: 1
            })
        );
    }

    #[test]
    fn paths_are_probed_at_start_and_on_a_change_only() {
        let t0 = Instant::now();
        let mut w = WatchState::new(config(), [lu("a")], t0);
        // The count looks right, but nothing was audited yet in this run.
        assert_eq!(w.tick(at(t0, 1), [keys("a", &[OURS], 1)]).lus[0].1, INSPECT);
        w.tick(at(t0, 2), [all_registered("a")]);
        // Steady and healthy: no probe (a PR OUT) for a day.
        for secs in (3..86_400).step_by(997) {
            assert_eq!(
                w.tick(at(t0, secs), [keys("a", &[OURS], 1)]).lus[0].1,
                LuVerdict::Healthy
            );
        }
        let mut changed = keys("a", &[OURS], 1);
        if let Ok(k) = &mut changed.result {
            k.paths_changed = true;
        }
        assert_eq!(w.tick(at(t0, 86_401), [changed]).lus[0].1, INSPECT);
        w.tick(at(t0, 86_402), [all_registered("a")]);
        // Our key listed once more or once less than at the last probe.
        assert_eq!(
            w.tick(at(t0, 86_403), [keys("a", &[OURS, OURS], 1)]).lus[0].1,
            INSPECT
        );
    }

    #[test]
    fn healthy_nodes_do_not_probe_for_each_others_pr_out() {
        // Three nodes on one LU. Each probe is a REGISTER per path, which bumps the LU's
        // PRgeneration; a node that probed whenever the generation moved made the next node
        // probe, and so on for ever (seen in the lab's three-node cluster: every other check).
        let t0 = Instant::now();
        let mut nodes: Vec<WatchState> = (0..3)
            .map(|_| WatchState::new(config(), [lu("a")], t0))
            .collect();
        let mut generation = 0_u32;
        let mut probes = [0_u32; 3];
        for second in 1..600 {
            for (n, w) in nodes.iter_mut().enumerate() {
                let mut read = keys("a", &[OURS], 1);
                if let Ok(k) = &mut read.result {
                    k.generation = generation;
                }
                if w.tick(at(t0, second), [read]).lus[0].1 == INSPECT {
                    probes[n] += 1;
                    generation += 1;
                    let mut probed = all_registered("a");
                    if let Ok(k) = &mut probed.result {
                        k.generation = generation;
                    }
                    assert_eq!(
                        w.tick(at(t0, second), [probed]).lus[0].1,
                        LuVerdict::Healthy
                    );
                }
            }
        }
        assert_eq!(
            probes,
            [1, 1, 1],
            "probes per node in 10 min (start-up only)"
        );
        // Another node's registration or its fence changes the keys but not ours: no probe.
        let mut w = audited(config(), &["a"], t0);
        for (second, listed) in [
            (1_u32, &[OURS, THEIRS][..]),
            (2, &[OURS]),
            (3, &[THEIRS, OURS, THEIRS]),
        ] {
            let mut read = keys("a", listed, 1);
            if let Ok(k) = &mut read.result {
                k.generation = 10 + second;
            }
            assert_eq!(
                w.tick(at(t0, u64::from(second)), [read]).lus[0].1,
                LuVerdict::Healthy
            );
        }
    }

    #[test]
    fn a_periodic_audit_runs_only_when_configured() {
        let t0 = Instant::now();
        let config = WatchConfig {
            path_audit: Some(Duration::from_secs(3600)),
            ..config()
        };
        let mut w = audited(config, &["a"], t0);
        assert_eq!(
            w.tick(at(t0, 3599), [keys("a", &[OURS], 1)]).lus[0].1,
            LuVerdict::Healthy
        );
        assert_eq!(
            w.tick(at(t0, 3600), [keys("a", &[OURS], 1)]).lus[0].1,
            INSPECT
        );
    }

    #[test]
    fn relogin_orphan_hidden_by_a_stale_registration_is_found_by_the_audit() {
        // #517: sdc logged in again with a new ISID. The old nexus still holds our key, so READ
        // KEYS lists it twice for two paths; only the per-path audit shows sdc unregistered.
        let t0 = Instant::now();
        let mut w = WatchState::new(config(), [lu("a")], t0);
        let mut obs = keys("a", &[OURS, OURS], 2);
        assert_eq!(w.tick(at(t0, 1), [obs.clone()]).lus[0].1, INSPECT);
        if let Ok(k) = &mut obs.result {
            k.paths = Some(vec![
                ProbedPath {
                    path: PathId("sdb".into()),
                    registered: true,
                },
                ProbedPath {
                    path: PathId("sdc".into()),
                    registered: false,
                },
            ]);
        }
        let sdc = vec![PathId("sdc".into())];
        assert_eq!(
            w.tick(at(t0, 2), [obs]).lus[0].1,
            LuVerdict::Heal { paths: sdc.clone() }
        );
        // The count still looks right, but the finding stands until a probe says otherwise:
        // reported (the node is degraded), not healed again before the next audit.
        let count_only = keys("a", &[OURS, OURS], 2);
        assert_eq!(
            w.tick(at(t0, 3), [count_only.clone()]).lus[0].1,
            LuVerdict::Orphaned { paths: sdc.clone() }
        );
        assert_eq!(
            w.tick(at(t0, 61), [count_only.clone()]).lus[0].1,
            LuVerdict::Orphaned { paths: sdc.clone() }
        );
        // Degraded: probed again every DEGRADED_RECHECK, a backstop to the generation.
        assert_eq!(
            w.tick(at(t0, 62), [count_only.clone()]).lus[0].1,
            LuVerdict::InspectPaths {
                unregistered: sdc.clone()
            }
        );
        w.tick(at(t0, 63), [obs_unregistered(&sdc)]);
        assert_eq!(
            w.tick(at(t0, 64), [count_only.clone()]).lus[0].1,
            LuVerdict::Orphaned { paths: sdc.clone() }
        );
        // `prfence unfence` registered sdc and purged the orphan: the count is the same, the
        // generation is not, so the paths are probed again REPAIR_LOOK_SPACING after the last
        // probe (t0+63), and the probe clears it.
        let mut repaired = count_only.clone();
        if let Ok(k) = &mut repaired.result {
            k.generation = 9;
        }
        assert_eq!(
            w.tick(at(t0, 65), [repaired.clone()]).lus[0].1,
            LuVerdict::Orphaned { paths: sdc.clone() }
        );
        assert_eq!(
            w.tick(at(t0, 68), [repaired.clone()]).lus[0].1,
            LuVerdict::InspectPaths { unregistered: sdc }
        );
        w.tick(at(t0, 68), [obs_unregistered(&[])]);
        assert_eq!(
            w.tick(at(t0, 69), [repaired.clone()]).lus[0].1,
            LuVerdict::Healthy
        );
        // Healthy again: no more probes, whatever the generation does.
        let mut moved = repaired;
        if let Ok(k) = &mut moved.result {
            k.generation = 12;
        }
        assert_eq!(
            w.tick(at(t0, 69 + 3600), [moved]).lus[0].1,
            LuVerdict::Healthy
        );
    }

    fn listed(generation: u32, paths: Option<Vec<ProbedPath>>) -> LuKeys {
        LuKeys {
            keys: vec![THEIRS, OURS],
            path_count: 1,
            paths,
            paths_changed: false,
            generation,
            probe_failed: false,
        }
    }

    fn probed(registered: bool) -> Option<Vec<ProbedPath>> {
        Some(vec![ProbedPath {
            path: PathId("sdb".into()),
            registered,
        }])
    }

    /// Arming rests on a probe of our own paths, not on our key listed; the probes are spaced
    /// like the armed watch's.
    #[test]
    fn arming_needs_one_of_our_paths_holding_the_key() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut check = ArmCheck::default();
        let not_listed = LuKeys {
            keys: vec![THEIRS],
            ..listed(0, None)
        };
        assert_eq!(check.judge(at(0), OURS, &not_listed), Arming::NotListed);
        // Listed: probe first; held by another node's path only: not armed.
        assert_eq!(check.judge(at(1), OURS, &listed(4, None)), Arming::Probe);
        assert_eq!(
            check.judge(at(2), OURS, &listed(4, probed(false))),
            Arming::HeldElsewhere
        );
        // No new probe while nothing moves, until the recheck.
        assert_eq!(
            check.judge(at(3), OURS, &listed(4, None)),
            Arming::HeldElsewhere
        );
        assert_eq!(
            check.judge(at(61), OURS, &listed(4, None)),
            Arming::HeldElsewhere
        );
        assert_eq!(check.judge(at(62), OURS, &listed(4, None)), Arming::Probe);
        // A generation that moves asks again, spaced.
        assert_eq!(
            check.judge(at(63), OURS, &listed(4, probed(false))),
            Arming::HeldElsewhere
        );
        assert_eq!(
            check.judge(at(64), OURS, &listed(4, None)),
            Arming::HeldElsewhere
        );
        assert_eq!(
            check.judge(at(65), OURS, &listed(5, None)),
            Arming::HeldElsewhere
        );
        assert_eq!(check.judge(at(68), OURS, &listed(5, None)), Arming::Probe);
        // Our unfencing: one of our paths holds it.
        assert_eq!(
            check.judge(at(69), OURS, &listed(5, probed(true))),
            Arming::Held
        );
        assert_eq!(check.judge(at(70), OURS, &listed(6, None)), Arming::Held);
        // Held, then the generation moves: not armed on that stale look; probed again, spaced.
        assert_eq!(check.judge(at(71), OURS, &listed(7, None)), Arming::Pending);
        assert_eq!(check.judge(at(74), OURS, &listed(7, None)), Arming::Probe);
        // The key gone and back: probed afresh.
        assert_eq!(check.judge(at(75), OURS, &not_listed), Arming::NotListed);
        assert_eq!(check.judge(at(76), OURS, &listed(8, None)), Arming::Probe);
        // No path can be probed (NVMe under the packaged unit: EPERM): judged on the key as
        // listed, as before probes existed, rather than never armed.
        let unprobeable = LuKeys {
            probe_failed: true,
            ..listed(8, None)
        };
        assert_eq!(
            check.judge(at(77), OURS, &unprobeable),
            Arming::ListedUnprobed
        );
        // But a failed probe after one that found no path holding the key keeps that finding.
        assert_eq!(
            check.judge(at(78), OURS, &listed(8, probed(false))),
            Arming::HeldElsewhere
        );
        assert_eq!(
            check.judge(at(79), OURS, &unprobeable),
            Arming::HeldElsewhere
        );
    }

    /// Data LU "d" and coordinators "c1", "c2", "c3", judged from the start.
    fn coordinated(t0: Instant) -> WatchState {
        let config = WatchConfig {
            coordinators: ["c1", "c2", "c3"].map(lu).to_vec(),
            ..config()
        };
        audited(config, &["d", "c1", "c2", "c3"], t0)
    }

    /// One tick over "d", "c1", "c2", "c3", each with our key or not (`None`: no answer).
    fn coordinated_tick(w: &mut WatchState, now: Instant, ours: [Option<bool>; 4]) -> Decision {
        let observations =
            ["d", "c1", "c2", "c3"]
                .into_iter()
                .zip(ours)
                .filter_map(|(name, ours)| {
                    ours.map(|ours| keys(name, if ours { &[OURS, THEIRS] } else { &[THEIRS] }, 1))
                });
        w.tick(now, observations.collect::<Vec<_>>())
    }

    #[test]
    fn a_coordinator_lost_is_degraded_and_a_majority_lost_fences() {
        let t0 = Instant::now();
        let mut w = coordinated(t0);
        // Key gone from c1 (a loser's preempt there): two reads confirm it, no fence.
        for s in 1..=3 {
            let d = coordinated_tick(
                &mut w,
                at(t0, s),
                [Some(true), Some(false), Some(true), Some(true)],
            );
            assert!(d.fenced.is_none() && d.feed_watchdog, "{d:?}");
            assert!(d.lus[1].1.is_degraded(), "{d:?}");
        }
        let d = coordinated_tick(
            &mut w,
            at(t0, 3),
            [Some(true), Some(false), Some(true), Some(true)],
        );
        assert!(
            matches!(
                &d.lus[1].1,
                LuVerdict::CoordinatorLost {
                    reason: FenceReason::KeyMissing { .. }
                }
            ),
            "{d:?}"
        );
        assert_eq!(d.lus[0].1, LuVerdict::Healthy);
        // Gone from c3 too: 2 of 3, fenced once its absence is confirmed there.
        let d = coordinated_tick(
            &mut w,
            at(t0, 4),
            [Some(true), Some(false), Some(true), Some(false)],
        );
        assert!(
            d.fenced.is_none(),
            "one read of c3 is not yet a confirmation: {d:?}"
        );
        let d = coordinated_tick(
            &mut w,
            at(t0, 5),
            [Some(true), Some(false), Some(true), Some(false)],
        );
        assert!(d.newly_fenced && !d.feed_watchdog, "{d:?}");
        assert_eq!(
            d.fenced,
            Some(FenceReason::CoordinatorsLost {
                lus: vec![lu("c1"), lu("c3")],
                of: 3
            })
        );
        assert!(d.lus.iter().all(|(_, v)| *v == LuVerdict::Fenced), "{d:?}");
    }

    #[test]
    fn unreadable_coordinators_never_fence_and_a_data_lu_still_does() {
        let t0 = Instant::now();
        let mut w = coordinated(t0);
        // c1 and c2 unreadable far past the grace (two arrays down): degraded, not fenced.
        for s in [5, 11, 30] {
            let d = coordinated_tick(&mut w, at(t0, s), [Some(true), None, None, Some(true)]);
            assert!(d.fenced.is_none() && d.feed_watchdog, "{d:?}");
        }
        let d = coordinated_tick(&mut w, at(t0, 31), [Some(true), None, None, Some(true)]);
        assert!(
            matches!(
                &d.lus[2].1,
                LuVerdict::CoordinatorLost {
                    reason: FenceReason::Unreachable { .. }
                }
            ),
            "{d:?}"
        );
        // And one key gone with them is still a minority of keys gone: no fence.
        for s in 32..=34 {
            let d = coordinated_tick(&mut w, at(t0, s), [Some(true), None, None, Some(false)]);
            assert!(d.fenced.is_none(), "{d:?}");
        }
        // The data LU fences alone, as without coordinators.
        coordinated_tick(&mut w, at(t0, 35), [Some(false), None, None, Some(true)]);
        let d = coordinated_tick(&mut w, at(t0, 36), [Some(false), None, None, Some(true)]);
        assert!(
            matches!(&d.fenced, Some(FenceReason::KeyMissing { lu: l, .. }) if *l == lu("d")),
            "{d:?}"
        );
    }

    #[test]
    fn a_coordinator_registered_again_is_healthy_again() {
        // `prfence unfence` puts our key back on a coordinator a loser took it from.
        let t0 = Instant::now();
        let mut w = coordinated(t0);
        for s in 1..=3 {
            coordinated_tick(
                &mut w,
                at(t0, s),
                [Some(true), Some(true), Some(false), Some(true)],
            );
        }
        let d = coordinated_tick(
            &mut w,
            at(t0, 4),
            [Some(true), Some(true), Some(true), Some(true)],
        );
        assert_eq!(d.lus[2].1, LuVerdict::Healthy, "{d:?}");
        // Losing another one later is a minority again: the first loss no longer counts.
        for s in 5..=6 {
            let d = coordinated_tick(
                &mut w,
                at(t0, s),
                [Some(true), Some(false), Some(true), Some(true)],
            );
            assert!(d.fenced.is_none(), "{d:?}");
        }
    }

    #[test]
    fn coordinators_gone_before_the_watch_armed_count_once_one_goes_while_judged() {
        let t0 = Instant::now();
        let config = WatchConfig {
            coordinators: ["c1", "c2", "c3"].map(lu).to_vec(),
            ..config()
        };
        // Armed on "d", "c2" and "c3"; our key already gone from "c1" (a loser's preempt).
        let start = [("d", true), ("c1", false), ("c2", true), ("c3", true)];
        let mut w = WatchState::with_pending(config.clone(), start.map(|(n, a)| (lu(n), a)), t0);
        w.tick(t0, ["d", "c2", "c3"].map(all_registered));
        for s in 1..=3 {
            let d = coordinated_tick(
                &mut w,
                at(t0, s),
                [Some(true), Some(false), Some(true), Some(true)],
            );
            assert!(d.fenced.is_none(), "{d:?}");
            assert_eq!(d.lus[1].1, LuVerdict::WaitingForRegistration, "{d:?}");
        }
        coordinated_tick(
            &mut w,
            at(t0, 4),
            [Some(true), Some(false), Some(false), Some(true)],
        );
        let d = coordinated_tick(
            &mut w,
            at(t0, 5),
            [Some(true), Some(false), Some(false), Some(true)],
        );
        assert_eq!(
            d.fenced,
            Some(FenceReason::CoordinatorsLost {
                lus: vec![lu("c1"), lu("c2")],
                of: 3
            }),
            "{d:?}"
        );
        // Three coordinators a reload added, nobody registered on them yet: no fence.
        let added = [("d", true), ("c1", false), ("c2", false), ("c3", false)];
        let mut w = WatchState::with_pending(config, added.map(|(n, a)| (lu(n), a)), t0);
        w.tick(t0, [all_registered("d")]);
        for s in 1..=5 {
            let d = coordinated_tick(
                &mut w,
                at(t0, s),
                [Some(true), Some(false), Some(false), Some(false)],
            );
            assert!(d.fenced.is_none() && d.feed_watchdog, "{d:?}");
        }
    }
}
