//! doctor: is each LU ready to fence, and if not, why? Read-only: only PERSISTENT RESERVE IN is
//! ever sent (no REGISTER probe, no PREEMPT AND ABORT trial), so the target is never changed.
//!
//! [`gather`] reads through every path of one LU (I/O); [`judge`] is a pure function from those
//! replies and what this node knows about its own paths (iSCSI initiator and ISID, the target's
//! kind) to findings, one named rule at a time, after `matching` has placed the registrations on
//! the paths; [`doctor`] runs both on every LU under one deadline.

mod coordinators;
mod gather;
mod judge;
mod matching;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::discover::LuId;
use crate::pr::{Capabilities, Key, ReservationType, Scope, TransportId};
use crate::runtime::{self, Finished};
use crate::transport::{CommandError, ErrorKind, Hints, PrRequest, PrTransport, Reply};

use super::{Failure, LuTarget, RequestError, normalize};

pub use coordinators::{CoordinatorSet, judge_set};
pub use gather::{LuReplies, PathReply, ReadError, gather};
pub use judge::judge;

/// What the target is, as far as its PREEMPT AND ABORT behaviour is known
/// (docs/target-notes.md): REPORT CAPABILITIES has no field for it, and doctor never sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// LIO (vendor `LIO-ORG`) over iSCSI: performs PREEMPT AND ABORT (lab).
    LioIscsi,
    /// LIO over tcm_loop: PREEMPT AND ABORT never completes (the command waits for itself).
    LioTcmLoop,
    /// LIO over another fabric.
    Lio,
    Unknown,
}

/// How this node reaches the LU through one path, from discovery (sysfs), not from the target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PathFacts {
    /// The iSCSI initiator name of the session carrying the path, if it is iSCSI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initiator: Option<String>,
    /// The session's ISID in hex, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isid: Option<String>,
    /// How the ISID is known (`kernel`, or the rule it was inferred by).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isid_source: Option<String>,
    /// Why the path is not usable now (its sysfs state), if it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_running: Option<String>,
    /// For an NVMe path: the host identifier this node registers with (the controller's
    /// `hostid`, a UUID), which READ FULL STATUS lists as `nvme-hostid:…`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme_host_id: Option<String>,
    #[serde(skip)]
    pub target: Option<TargetKind>,
    /// The iSCSI target (IQN) the path reaches, if it is iSCSI: coordinators on one target are
    /// one failure domain.
    #[serde(skip)]
    pub target_name: Option<String>,
}

/// One path and this node's facts about it.
#[derive(Debug)]
pub struct DoctorPath<T> {
    pub transport: T,
    pub facts: PathFacts,
}

impl<T: PrTransport> PrTransport for DoctorPath<T> {
    fn device(&self) -> &Path {
        self.transport.device()
    }
    /// PR IN passes; PR OUT is refused here, so doctor cannot change the target whatever its
    /// code asks for.
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        match request {
            PrRequest::Out(_) => Err(CommandError::without_completion(
                self.device(),
                request.command(),
                ErrorKind::Failed,
                "doctor is read-only: it sends no PERSISTENT RESERVE OUT",
            )),
            _ => self.transport.execute(request),
        }
    }
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    /// Fencing works, but not as well as it could.
    Warning,
    /// The LU is not ready to fence.
    Problem,
}

/// One thing doctor found, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// What was found; a failed command kept as data, advised by the front end that shows it.
    pub message: Failure,
    /// What to do; empty for information.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub remedy: String,
}

/// Whether a PR IN service action answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Support {
    Supported,
    NotSupported,
    /// It failed for another reason (dead path, malformed data…), or was not asked.
    Unknown,
}

/// One path as doctor saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathDiagnosis {
    pub device: String,
    pub reachable: bool,
    #[serde(flatten)]
    pub facts: PathFacts,
    /// The key registered for this path's initiator port, when a READ FULL STATUS descriptor
    /// could be matched to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered_key: Option<Key>,
    pub registration: PathRegistration,
    /// Why the path could not be matched to a registration (with [`PathRegistration::Unmatched`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmatched: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
}

/// Whether a path's initiator port has a registration, as READ FULL STATUS shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathRegistration {
    /// A descriptor names this path's initiator port (its key is in `registered_key`).
    Matched,
    /// No descriptor names this path's initiator port.
    NotRegistered,
    /// Which descriptor is this path's cannot be told (not iSCSI, ISID unknown, no READ FULL
    /// STATUS).
    Unmatched,
}

/// One READ FULL STATUS descriptor as doctor judged it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RegistrationDiagnosis {
    pub key: Key,
    pub initiator: TransportId,
    pub relative_target_port: u16,
    pub all_tg_pt: bool,
    pub holder: bool,
    /// The path of this node it belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// This node's initiator, but no current session of it: left from an earlier session.
    pub orphan: bool,
}

/// PREEMPT AND ABORT support and where that knowledge comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PreemptAndAbort {
    pub supported: Option<bool>,
    pub basis: String,
}

/// The reservation as the target reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReservationDiagnosis {
    pub key: Key,
    #[serde(rename = "type")]
    pub rtype: ReservationType,
    pub scope: Scope,
    /// The holder's initiator port, from READ FULL STATUS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<TransportId>,
}

/// The PR IN service actions and what REPORT CAPABILITIES said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceActions {
    pub read_keys: Support,
    pub read_reservation: Support,
    pub report_capabilities: Support,
    pub read_full_status: Support,
}

/// One LU, judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LuDiagnosis {
    pub lu: LuId,
    /// The first LU by identifier: the one `fence` decides on (never with coordinators).
    pub arbiter: bool,
    /// A coordinator: with the others, it decides `fence` by majority.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub coordinator: bool,
    pub ready: bool,
    pub paths: Vec<PathDiagnosis>,
    /// None: no path answered, so unknown.
    pub pr_supported: Option<bool>,
    pub pr_in: ServiceActions,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    pub preempt_and_abort: PreemptAndAbort,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u32>,
    pub keys: Vec<Key>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<ReservationDiagnosis>,
    pub registrations: Vec<RegistrationDiagnosis>,
    /// This node's key is registered on the LU (None without a key or without READ KEYS).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_key_registered: Option<bool>,
    pub findings: Vec<Finding>,
}

/// Every LU, judged; `ready` when each is and this node can fence from the arbiter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<Key>,
    pub ready: bool,
    /// This node's key is on the arbiter LU, so `fence` from here can win (None without a key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_fence: Option<bool>,
    pub summary: String,
    /// The LUs as this node names them, to compare with the other nodes (P2).
    pub lu_set: super::LuSet,
    /// The coordinators, judged as a set (absent without them); each is also in `lus`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coordinators: Option<CoordinatorSet>,
    pub lus: Vec<LuDiagnosis>,
}

impl Diagnosis {
    /// The diagnosis with every failed command given `hints`' advice: what a front end does
    /// before it shows it.
    pub fn advised(mut self, hints: Hints) -> Self {
        for lu in &mut self.lus {
            let paths = lu.paths.iter_mut().filter_map(|p| p.error.as_mut());
            for failure in paths.chain(lu.findings.iter_mut().map(|f| &mut f.message)) {
                failure.advise(hints);
            }
        }
        self
    }
}

/// The overall verdict over judged LUs: the data LUs (the first is the arbiter unless there
/// are coordinators) and the coordinators. Pure.
pub fn conclude(
    lus: Vec<LuDiagnosis>,
    coordinators: Vec<LuDiagnosis>,
    own: Option<Key>,
) -> Diagnosis {
    // `fence` preempts from the arbiter (or each coordinator) through a path of ours registered
    // with our key; the key registered only for initiator ports we no longer have (orphans)
    // does not do.
    let set = (!coordinators.is_empty()).then(|| judge_set(&lus, &coordinators, own));
    let can_fence = match &set {
        Some(set) => set.can_fence(),
        None => own.map(|own| {
            lus.first()
                .is_some_and(|a| coordinators::own_key_usable(a, own))
        }),
    };
    let lu_set = super::LuSet::of(lus.iter().map(|l| Some(l.lu.clone())));
    let mut lus = lus;
    lus.extend(coordinators);
    let not_ready: Vec<&str> = lus
        .iter()
        .filter(|l| !l.ready)
        .map(|l| l.lu.as_str())
        .collect();
    let ready = own.is_some()
        && not_ready.is_empty()
        && can_fence == Some(true)
        && set.as_ref().is_none_or(CoordinatorSet::sound);
    let summary = match own {
        None => "readiness to fence needs this node's key: give --key (or key.value in the \
                 configuration)"
            .to_string(),
        Some(own) if ready => {
            format!("ready to fence: {own} is registered on every path of every LU")
        }
        Some(own) => format!(
            "not ready to fence with {own}: problems on {}",
            if !not_ready.is_empty() {
                not_ready.join(", ")
            } else if set.is_some() {
                "the coordinator set".to_string()
            } else {
                "the arbiter LU".to_string()
            }
        ),
    };
    Diagnosis {
        key: own,
        ready,
        can_fence,
        summary,
        lu_set,
        coordinators: set,
        lus,
    }
}

/// Gathers and judges every LU at once; an LU still being read at `deadline` is judged from no
/// replies (a problem that says it timed out).
pub fn doctor<T: PrTransport + 'static>(
    lus: Vec<LuTarget<DoctorPath<T>>>,
    own: Option<Key>,
    deadline: Duration,
) -> Result<Diagnosis, RequestError> {
    doctor_coordinated(lus, Vec::new(), own, deadline)
}

/// [`doctor`] with `coordinators` (none: the arbiter decides): each judged as an LU, then as a
/// set ([`judge_set`]); ready only if this node's key can win a majority of them.
pub fn doctor_coordinated<T: PrTransport + 'static>(
    lus: Vec<LuTarget<DoctorPath<T>>>,
    coordinators: Vec<LuTarget<DoctorPath<T>>>,
    own: Option<Key>,
    deadline: Duration,
) -> Result<Diagnosis, RequestError> {
    if own.is_some_and(|k| k.is_zero()) {
        return Err(RequestError::ZeroKey);
    }
    let data = normalize(lus)?;
    let data_count = data.len();
    let coordinators = if coordinators.is_empty() {
        Vec::new()
    } else {
        normalize(coordinators)?
    };
    let coordinated = !coordinators.is_empty();
    let lus: Vec<Arc<LuTarget<DoctorPath<T>>>> =
        data.into_iter().chain(coordinators).map(Arc::new).collect();
    // the arbiter: the first data LU, unless coordinators decide
    let arbiter = |index: usize| index == 0 && !coordinated;
    let until = runtime::now() + deadline;
    let gathered = runtime::fan_out(&lus, until, |lu| gather(lu), &mut |_, _, _| {});
    let mut judged = Vec::with_capacity(lus.len());
    for (index, (lu, finished)) in lus.iter().zip(gathered).enumerate() {
        let why = match finished {
            Finished::Done { value, .. } => {
                judged.push(judge(&value, own, arbiter(index)));
                continue;
            }
            Finished::TimedOut => format!(
                "no answer within the overall deadline of {} s",
                deadline.as_secs_f64()
            ),
            Finished::Panicked => "internal error while reading the LU (a panic)".to_string(),
            Finished::NotStarted(why) => {
                format!("no thread could be started to read the LU: {why}")
            }
        };
        judged.push(judge(&gather::unread(lu, &why), own, arbiter(index)));
    }
    let mut coordinators = judged.split_off(data_count);
    for lu in &mut coordinators {
        lu.coordinator = true;
    }
    Ok(conclude(judged, coordinators, own))
}

#[cfg(test)]
mod tests;
