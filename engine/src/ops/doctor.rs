//! doctor: is each LU ready to fence, and if not, why? Read-only: only PERSISTENT RESERVE IN is
//! ever sent (no REGISTER probe, no PREEMPT AND ABORT trial), so the target is never changed.
//!
//! [`gather`] reads through every path of one LU (I/O); [`judge`] is a pure function from those
//! replies and what this node knows about its own paths (iSCSI initiator and ISID, the target's
//! kind) to findings; [`doctor`] runs both on every LU under one deadline.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::{self, Finished};
use serde::Serialize;

use crate::keys::LeaseKey;
use crate::pr::nvme::HostId;
use crate::pr::{
    Capabilities, FullStatus, Key, ReadKeys, ReadReservation, Registration, ReservationType, Scope,
    TransportId,
};
use crate::transport::{CommandError, ErrorKind, PrRequest, PrTransport, Reply};

use super::{FENCING_TYPE, LuTarget, RequestError, normalize};

/// What the target is, as far as its PREEMPT AND ABORT behaviour is known (README "Target
/// notes"): REPORT CAPABILITIES has no field for it, and doctor never sends it.
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

/// A PR IN command that failed: how, and the full error text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadError {
    pub kind: ErrorKind,
    pub message: String,
}

impl From<CommandError> for ReadError {
    fn from(e: CommandError) -> Self {
        ReadError {
            kind: e.kind,
            message: e.to_string(),
        }
    }
}

/// Every reply one LU gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuReplies {
    pub lu: String,
    /// Per path, in the order given: its device, facts and READ KEYS answer.
    pub paths: Vec<(String, PathFacts, Result<ReadKeys, ReadError>)>,
    /// The other reads, through the first path that answered READ KEYS (None: not asked).
    pub reservation: Option<Result<ReadReservation, ReadError>>,
    pub capabilities: Option<Result<Capabilities, ReadError>>,
    pub full_status: Option<Result<FullStatus, ReadError>>,
}

/// Reads one LU: READ KEYS on every path (so each path's reachability is seen), then READ
/// RESERVATION, REPORT CAPABILITIES and READ FULL STATUS through the first path that answered.
pub fn gather<T: PrTransport>(target: &LuTarget<DoctorPath<T>>) -> LuReplies {
    let paths: Vec<_> = target
        .paths
        .iter()
        .map(|p| {
            (
                p.device().display().to_string(),
                p.facts.clone(),
                p.read_keys().map_err(ReadError::from),
            )
        })
        .collect();
    let first = paths
        .iter()
        .position(|(_, _, keys)| keys.is_ok())
        .and_then(|i| target.paths.get(i));
    LuReplies {
        lu: target.id.clone(),
        reservation: first.map(|p| p.read_reservation().map_err(ReadError::from)),
        capabilities: first.map(|p| p.report_capabilities().map_err(ReadError::from)),
        full_status: first.map(|p| p.read_full_status().map_err(ReadError::from)),
        paths,
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
    pub message: String,
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
    pub error: Option<String>,
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
    pub lu: String,
    /// The first LU by identifier: the one `fence` decides on.
    pub arbiter: bool,
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
    pub lus: Vec<LuDiagnosis>,
}

fn problem(message: String, remedy: impl Into<String>) -> Finding {
    Finding {
        severity: Severity::Problem,
        message,
        remedy: remedy.into(),
    }
}

fn warning(message: String, remedy: impl Into<String>) -> Finding {
    Finding {
        severity: Severity::Warning,
        message,
        remedy: remedy.into(),
    }
}

fn info(message: String) -> Finding {
    Finding {
        severity: Severity::Info,
        message,
        remedy: String::new(),
    }
}

fn ok<T: Clone>(reply: &Option<Result<T, ReadError>>) -> Option<T> {
    reply.as_ref().and_then(|r| r.as_ref().ok()).cloned()
}

fn support<T>(reply: Option<&Result<T, ReadError>>) -> Support {
    match reply {
        Some(Ok(_)) => Support::Supported,
        Some(Err(e)) if matches!(e.kind, ErrorKind::NotSupported | ErrorKind::InvalidField) => {
            Support::NotSupported
        }
        _ => Support::Unknown,
    }
}

/// ISIDs compare as numbers: targets print them with or without `0x` and leading zeros.
fn same_isid(a: &str, b: &str) -> bool {
    let value = |s: &str| {
        let digits = s.trim().trim_start_matches("0x").trim_start_matches("0X");
        u64::from_str_radix(digits, 16).ok()
    };
    match (value(a), value(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.eq_ignore_ascii_case(b),
    }
}

/// The registration of this NVMe host (all its paths share it), by host id. A target that
/// reports 64-bit host ids cannot be matched with Linux's 128-bit one.
fn match_nvme_host(host: &str, regs: &[Registration]) -> Result<usize, Option<String>> {
    let ours: TransportId = format!("nvme-hostid:{host}")
        .parse()
        .map_err(|e| Some(format!("this node's NVMe host id is unreadable ({e})")))?;
    if let Some(r) = regs.iter().position(|r| r.transport_id == ours) {
        return Ok(r);
    }
    let basic = regs.iter().any(|r| {
        matches!(
            r.transport_id,
            TransportId::NvmeHostId {
                host_id: HostId::Basic(_)
            }
        )
    });
    if basic {
        Err(Some(
            "the target reports 64-bit NVMe host ids; this node's is 128-bit, so its \
             registration cannot be picked out"
                .to_string(),
        ))
    } else {
        Err(None)
    }
}

fn iscsi_name(id: &TransportId) -> Option<(&str, Option<&str>)> {
    match id {
        TransportId::Iscsi { name, isid } => Some((name, isid.as_deref())),
        _ => None,
    }
}

/// What [`match_paths`] concluded.
struct Matching {
    /// Per path: the descriptor index it matched, or Err(None) for none, or Err(why) when it
    /// cannot be told.
    paths: Vec<Result<usize, Option<String>>>,
    /// Per descriptor: the path index it belongs to.
    owner: Vec<Option<usize>>,
    orphan: Vec<bool>,
    findings: Vec<Finding>,
}

/// Matches READ FULL STATUS descriptors to this node's paths by iSCSI initiator name and ISID.
/// Where the ISID of a session is unknown only counts can be compared, and that is said.
fn match_paths(
    paths: &[(String, PathFacts, bool)],
    status: &FullStatus,
    own: Option<Key>,
) -> Matching {
    let regs = &status.registrations;
    let mut m = Matching {
        paths: Vec::with_capacity(paths.len()),
        owner: vec![None; regs.len()],
        orphan: vec![false; regs.len()],
        findings: Vec::new(),
    };
    for (index, (_, facts, _)) in paths.iter().enumerate() {
        if let Some(host) = &facts.nvme_host_id {
            m.paths.push(match_nvme_host(host, regs));
            if let Some(Ok(r)) = m.paths.last()
                && let Some(owner) = m.owner.get_mut(*r)
            {
                *owner = Some(index);
            }
            continue;
        }
        let Some(initiator) = &facts.initiator else {
            m.paths.push(Err(Some(
                "not an iSCSI path (prfence knows this node's initiator port only for iSCSI \
                 sessions)"
                    .to_string(),
            )));
            continue;
        };
        let Some(isid) = &facts.isid else {
            m.paths.push(Err(Some(format!(
                "the ISID of {initiator}'s session is not known (the kernel does not show it)"
            ))));
            continue;
        };
        let found = regs.iter().position(|r| {
            iscsi_name(&r.transport_id).is_some_and(|(name, reg_isid)| {
                name.eq_ignore_ascii_case(initiator) && reg_isid.is_some_and(|i| same_isid(i, isid))
            })
        });
        match found {
            Some(r) => {
                if let Some(owner) = m.owner.get_mut(r) {
                    *owner = Some(index);
                }
                m.paths.push(Ok(r));
            }
            None => m.paths.push(Err(None)),
        }
    }
    // Per initiator name of ours: descriptors no session of ours has are orphans (every session
    // of that name has a known ISID), or are compared by count (some ISID unknown).
    let mut names: Vec<&str> = paths
        .iter()
        .filter_map(|(_, f, _)| f.initiator.as_deref())
        .collect();
    names.sort_unstable();
    names.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
    for name in names {
        let sessions: Vec<&PathFacts> = paths
            .iter()
            .map(|(_, f, _)| f)
            .filter(|f| {
                f.initiator
                    .as_deref()
                    .is_some_and(|i| i.eq_ignore_ascii_case(name))
            })
            .collect();
        let ours: Vec<usize> = regs
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                iscsi_name(&r.transport_id).is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
            })
            .map(|(i, _)| i)
            .collect();
        if sessions.iter().all(|f| f.isid.is_some()) {
            for &r in &ours {
                if m.owner.get(r).copied().flatten().is_none()
                    && let (Some(orphan), Some(reg)) = (m.orphan.get_mut(r), regs.get(r))
                {
                    *orphan = true;
                    let whose = if Some(reg.key) == own {
                        "this node's key"
                    } else {
                        "key"
                    };
                    m.findings.push(problem(
                        format!(
                            "orphaned registration: {whose} {} is registered for initiator port \
                             {} (relative target port {}), which no current session of this \
                             node has (an earlier iSCSI login)",
                            reg.key, reg.transport_id, reg.relative_target_port
                        ),
                        "run `prfence unfence` on this node: it registers the current sessions \
                         and purges the orphan (the node agent never registers a path)",
                    ));
                }
            }
        } else if let Some(own) = own {
            let registered = ours
                .iter()
                .filter(|&&r| regs.get(r).is_some_and(|reg| reg.key == own))
                .count();
            let n = sessions.len();
            if registered < n {
                m.findings.push(problem(
                    format!(
                        "{} of {n} path(s) of initiator {name} are not registered with {own} \
                         ({registered} registration(s) for {n} session(s))",
                        n - registered
                    ),
                    "run `prfence unfence` on this node to register every path",
                ));
            } else if registered > n {
                m.findings.push(problem(
                    format!(
                        "{} orphaned registration(s): {own} is registered {registered} times for \
                         initiator {name}, which has {n} session(s) (an earlier iSCSI login)",
                        registered - n
                    ),
                    "run `prfence unfence` on this node: it purges orphaned registrations",
                ));
            } else {
                m.findings.push(info(format!(
                    "{registered} registration(s) of {own} for initiator {name} and {n} \
                     session(s): the counts agree, but which path carries which cannot be told \
                     without the sessions' ISIDs"
                )));
            }
        }
    }
    m
}

fn preempt_and_abort(paths: &[(String, PathFacts, bool)]) -> PreemptAndAbort {
    let kinds: Vec<TargetKind> = paths.iter().filter_map(|(_, f, _)| f.target).collect();
    let basis = "REPORT CAPABILITIES has no field for PREEMPT AND ABORT and doctor never sends it";
    if kinds.contains(&TargetKind::LioTcmLoop) {
        PreemptAndAbort {
            supported: Some(false),
            basis: format!(
                "{basis}; known behaviour: LIO over tcm_loop never completes it (the command \
                 waits for itself; README \"Target notes\")"
            ),
        }
    } else if !kinds.is_empty() && kinds.iter().all(|k| *k == TargetKind::LioIscsi) {
        PreemptAndAbort {
            supported: Some(true),
            basis: format!(
                "{basis}; known behaviour: LIO over iSCSI performs it (queued writes of the \
                 victim are refused once it has run)"
            ),
        }
    } else {
        PreemptAndAbort {
            supported: None,
            basis: format!("{basis}; this target's behaviour is not known to prfence"),
        }
    }
}

/// Judges one LU from its replies. Pure. `own` is this node's key, if known.
pub fn judge(replies: &LuReplies, own: Option<Key>, arbiter: bool) -> LuDiagnosis {
    let mut findings = Vec::new();
    let facts: Vec<(String, PathFacts, bool)> = replies
        .paths
        .iter()
        .map(|(d, f, k)| (d.clone(), f.clone(), k.is_ok()))
        .collect();
    let keys = replies.paths.iter().find_map(|(_, _, k)| k.as_ref().ok());
    let first_error = replies.paths.iter().find_map(|(_, _, k)| k.as_ref().err());
    let pr_supported = match (keys, first_error) {
        (Some(_), _) => Some(true),
        (None, Some(e)) if e.kind == ErrorKind::NotSupported => Some(false),
        _ => None,
    };
    match pr_supported {
        Some(false) => findings.push(problem(
            "the LU does not support persistent reservations (PERSISTENT RESERVE IN answered \
             ILLEGAL REQUEST, invalid command operation code)"
                .to_string(),
            "fence with a PR-capable LU (LIO: attrib/emulate_pr=1; hypervisor disks need PR \
             pass-through)",
        )),
        None => findings.push(problem(
            format!(
                "no path answered: {}",
                first_error.map_or("the LU has no paths", |e| e.message.as_str())
            ),
            "check the sessions and devices (iscsiadm -m session, multipath -ll)",
        )),
        Some(true) => {}
    }
    let reachable_count = facts.iter().filter(|(_, _, ok)| *ok).count();
    let is_dead = |kind: ErrorKind| {
        matches!(
            kind,
            ErrorKind::Timeout | ErrorKind::Transport | ErrorKind::Open
        )
    };
    for (device, path_facts, reply) in &replies.paths {
        if let Err(e) = reply
            && pr_supported == Some(true)
        {
            findings.push(problem(
                format!(
                    "path {device} is not reachable{}: {}",
                    path_facts
                        .not_running
                        .as_ref()
                        .map(|s| format!(" (state {s})"))
                        .unwrap_or_default(),
                    e.message
                ),
                if reachable_count > 0 {
                    "fencing goes through the other paths, but this path will not carry the key \
                     when it returns: repair it, then run `prfence unfence`"
                } else {
                    "repair the path"
                },
            ));
        }
    }

    let reservation: Option<ReadReservation> = ok(&replies.reservation);
    let capabilities: Option<Capabilities> = ok(&replies.capabilities);
    let status: Option<FullStatus> = ok(&replies.full_status);
    if pr_supported == Some(true) {
        match &replies.capabilities {
            Some(Err(e)) => findings.push(warning(
                format!("REPORT CAPABILITIES failed: {}", e.message),
                "ALL_TG_PT, APTPL, SIP and the supported types are unknown; prfence needs none \
                 of them, but check the target's documentation",
            )),
            Some(Ok(c)) => match &c.supported_types {
                None => findings.push(info(
                    "REPORT CAPABILITIES leaves the type mask invalid (TMV=0): the supported \
                         reservation types are not reported"
                        .to_string(),
                )),
                Some(types) if !types.contains(&FENCING_TYPE) => findings.push(problem(
                    format!(
                        "the target does not report {FENCING_TYPE} ({}), the type fencing \
                             reserves",
                        FENCING_TYPE.description()
                    ),
                    "use a target that supports Write Exclusive - Registrants Only",
                )),
                Some(_) => {}
            },
            None => {}
        }
        if let Some(Err(e)) = &replies.full_status {
            findings.push(warning(
                format!("READ FULL STATUS failed: {}", e.message),
                "which path carries the key and orphaned registrations cannot be checked",
            ));
        }
    }

    let matching = status.as_ref().map(|s| match_paths(&facts, s, own));
    let registrations: Vec<RegistrationDiagnosis> = status
        .as_ref()
        .map(|s| {
            s.registrations
                .iter()
                .enumerate()
                .map(|(i, r)| RegistrationDiagnosis {
                    key: r.key,
                    initiator: r.transport_id.clone(),
                    relative_target_port: r.relative_target_port,
                    all_tg_pt: r.all_tg_pt,
                    holder: r.holder,
                    path: matching
                        .as_ref()
                        .and_then(|m| m.owner.get(i).copied().flatten())
                        .and_then(|p| facts.get(p))
                        .map(|(d, _, _)| d.clone()),
                    orphan: matching
                        .as_ref()
                        .is_some_and(|m| m.orphan.get(i).copied().unwrap_or(false)),
                })
                .collect()
        })
        .unwrap_or_default();
    let paths: Vec<PathDiagnosis> = replies
        .paths
        .iter()
        .enumerate()
        .map(|(i, (device, path_facts, reply))| {
            let matched = matching.as_ref().and_then(|m| m.paths.get(i));
            let registered_key = matched
                .and_then(|r| r.as_ref().ok())
                .and_then(|&r| status.as_ref()?.registrations.get(r))
                .map(|r| r.key);
            let (registration, unmatched) = match matched {
                Some(Ok(_)) => (PathRegistration::Matched, None),
                Some(Err(None)) => (PathRegistration::NotRegistered, None),
                Some(Err(Some(why))) => (PathRegistration::Unmatched, Some(why.clone())),
                None => (
                    PathRegistration::Unmatched,
                    Some("READ FULL STATUS unavailable".to_string()),
                ),
            };
            PathDiagnosis {
                device: device.clone(),
                // An error answer (e.g. PR not supported) still proves the path carries commands.
                reachable: reply.as_ref().err().is_none_or(|e| !is_dead(e.kind)),
                facts: path_facts.clone(),
                registered_key,
                registration,
                unmatched,
                error: reply.as_ref().err().map(|e| e.message.clone()),
            }
        })
        .collect();
    if let Some(m) = &matching {
        findings.extend(m.findings.iter().cloned());
    }

    let own_key_registered = own.zip(keys).map(|(own, k)| k.keys.contains(&own));
    if let Some(own) = own
        && keys.is_some()
    {
        for path in &paths {
            if path.registration == PathRegistration::NotRegistered {
                findings.push(problem(
                    format!(
                        "path {} is not registered (no registration for its initiator port)",
                        path.device
                    ),
                    "run `prfence unfence` on this node to register every path",
                ));
            } else if let Some(other) = path.registered_key.filter(|k| *k != own) {
                findings.push(problem(
                    format!("path {} is registered with {other}, not {own}", path.device),
                    "check which key this node should use; `prfence unfence` with the right key \
                     replaces it",
                ));
            }
        }
        if own_key_registered == Some(false) {
            findings.push(problem(
                format!(
                    "this node's key {own} is not registered on the LU{}",
                    if arbiter {
                        " (the arbiter): this node cannot fence another and would itself be \
                         treated as fenced"
                    } else {
                        ""
                    }
                ),
                format!("run `prfence unfence --key {own}` on this node (if it was fenced, only after it rejoined the cluster)"),
            ));
        }
        if let (Some(mine), Some(k)) = (LeaseKey::decode(own), keys) {
            let newer = k
                .keys
                .iter()
                .filter_map(|&key| LeaseKey::decode(key))
                .find(|l| l.node() == mine.node() && l.epoch() > mine.epoch());
            if let Some(newer) = newer {
                findings.push(problem(
                    format!(
                        "this key looks like a preempted lease epoch: {own} is node {} epoch {}, \
                         and the same node's newer epoch {} ({}) is registered",
                        mine.node(),
                        mine.epoch(),
                        newer.epoch(),
                        newer.key()
                    ),
                    "use the node agent's current key (its state file's epoch); never re-register \
                     an older epoch",
                ));
            }
        }
    }

    let holder = status
        .as_ref()
        .and_then(|s| s.registrations.iter().find(|r| r.holder))
        .map(|r| r.transport_id.clone());
    let reservation_view = reservation.as_ref().and_then(|r| {
        r.reservation.as_ref().map(|held| ReservationDiagnosis {
            key: held.key,
            rtype: held.rtype,
            scope: held.scope,
            holder: if held.rtype.is_all_registrants() {
                None
            } else {
                holder.clone()
            },
        })
    });
    if let Some(r) = &reservation {
        match &r.reservation {
            None => findings.push(warning(
                "no reservation: every initiator, registered or not, may write".to_string(),
                "run `prfence unfence` (it reserves Write Exclusive - Registrants Only); `fence` \
                 also creates one",
            )),
            Some(held) if held.rtype != FENCING_TYPE && !held.rtype.is_all_registrants() => {
                findings.push(warning(
                    format!(
                        "the LU is reserved as {} ({}), not {FENCING_TYPE}: preempting a key \
                         may not stop that node's writes",
                        held.rtype,
                        held.rtype.description()
                    ),
                    "release it and let `prfence unfence` reserve wero",
                ));
            }
            Some(_) => {}
        }
    }
    let paa = preempt_and_abort(&facts);
    if paa.supported == Some(false) && pr_supported == Some(true) {
        findings.push(warning(
            "target lacks PREEMPT AND ABORT: fencing will not abort queued writes (prfence falls \
             back to PREEMPT)"
                .to_string(),
            "on LIO, serve the LU over iSCSI rather than tcm_loop",
        ));
    }

    let ready = !findings.iter().any(|f| f.severity == Severity::Problem) && own.is_some();
    LuDiagnosis {
        lu: replies.lu.clone(),
        arbiter,
        ready,
        paths,
        pr_supported,
        pr_in: ServiceActions {
            read_keys: if keys.is_some() {
                Support::Supported
            } else {
                support(first_error.map(|e| Err::<(), _>(e.clone())).as_ref())
            },
            read_reservation: support(replies.reservation.as_ref()),
            report_capabilities: support(replies.capabilities.as_ref()),
            read_full_status: support(replies.full_status.as_ref()),
        },
        capabilities,
        preempt_and_abort: paa,
        generation: keys.map(|k| k.generation),
        keys: keys.map(|k| k.keys.clone()).unwrap_or_default(),
        reservation: reservation_view,
        registrations,
        own_key_registered,
        findings,
    }
}

/// The overall verdict over judged LUs (the first is the arbiter). Pure.
pub fn conclude(lus: Vec<LuDiagnosis>, own: Option<Key>) -> Diagnosis {
    // `fence` preempts from the arbiter through a path of ours registered with our key; the key
    // registered only for initiator ports we no longer have (orphans) does not do.
    let can_fence = own.map(|own| {
        lus.first().is_some_and(|a| {
            a.own_key_registered == Some(true)
                && a.paths.iter().any(|p| {
                    p.reachable
                        && (p.registered_key == Some(own)
                            || p.registration == PathRegistration::Unmatched)
                })
        })
    });
    let not_ready: Vec<&str> = lus
        .iter()
        .filter(|l| !l.ready)
        .map(|l| l.lu.as_str())
        .collect();
    let ready = own.is_some() && not_ready.is_empty() && can_fence == Some(true);
    let summary = match own {
        None => "readiness to fence needs this node's key: give --key (or key.value in the \
                 configuration)"
            .to_string(),
        Some(own) if ready => {
            format!("ready to fence: {own} is registered on every path of every LU")
        }
        Some(own) => format!(
            "not ready to fence with {own}: problems on {}",
            if not_ready.is_empty() {
                "the arbiter LU".to_string()
            } else {
                not_ready.join(", ")
            }
        ),
    };
    Diagnosis {
        key: own,
        ready,
        can_fence,
        summary,
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
    if own.is_some_and(|k| k.is_zero()) {
        return Err(RequestError::ZeroKey);
    }
    let lus: Vec<Arc<LuTarget<DoctorPath<T>>>> =
        normalize(lus)?.into_iter().map(Arc::new).collect();
    let until = runtime::now() + deadline;
    let gathered = runtime::fan_out(&lus, until, |lu| gather(lu), &mut |_, _, _| {});
    let mut judged = Vec::with_capacity(lus.len());
    for (index, (lu, finished)) in lus.iter().zip(gathered).enumerate() {
        let why = match finished {
            Finished::Done { value, .. } => {
                judged.push(judge(&value, own, index == 0));
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
        let replies = LuReplies {
            lu: lu.id.clone(),
            paths: lu
                .paths
                .iter()
                .map(|p| {
                    (
                        p.device().display().to_string(),
                        p.facts.clone(),
                        Err(ReadError {
                            kind: ErrorKind::Timeout,
                            message: why.clone(),
                        }),
                    )
                })
                .collect(),
            reservation: None,
            capabilities: None,
            full_status: None,
        };
        judged.push(judge(&replies, own, index == 0));
    }
    Ok(conclude(judged, own))
}

#[cfg(test)]
#[path = "doctor_tests.rs"]
mod tests;
