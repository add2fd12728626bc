//! Judging one LU from its replies: pure. The replies are read once into [`Evidence`], then each
//! rule of [`RULES`] says what it finds, in the order the findings are shown.

use crate::keys::LeaseKey;
use crate::ops::lu::is_dead;
use crate::ops::{FENCING_TYPE, Failure, OwnInitiator};
use crate::pr::{FullStatus, Key, ReadKeys, ReadReservation};
use crate::transport::ErrorKind;

use super::gather::{LuReplies, PathReply, ReadError};
use super::matching::{Initiator, Matching, PathMatch, match_paths};
use super::{
    Finding, LuDiagnosis, PathDiagnosis, PathRegistration, PreemptAndAbort, RegistrationDiagnosis,
    ReservationDiagnosis, ServiceActions, Severity, Support, TargetKind,
};

/// Judges one LU from its replies. Pure. `own` is this node's key, if known.
pub fn judge(replies: &LuReplies, own: Option<Key>, arbiter: bool) -> LuDiagnosis {
    let evidence = Evidence::read(replies, own, arbiter);
    let findings = RULES.iter().flat_map(|rule| rule(&evidence)).collect();
    evidence.diagnosis(findings)
}

/// A rule: what it finds in one LU's evidence.
type Rule = fn(&Evidence<'_>) -> Vec<Finding>;

/// Every rule, in the order its findings are shown.
const RULES: &[Rule] = &[
    pr_support,
    unreachable_paths,
    capabilities,
    full_status,
    registrations_per_initiator,
    paths_registered_with_own_key,
    own_key_on_lu,
    stale_lease_epoch,
    reservation,
    preempt_and_abort,
];

/// One LU's replies, read once into what the rules look at.
struct Evidence<'r> {
    replies: &'r LuReplies,
    own: Option<Key>,
    arbiter: bool,
    /// The first READ KEYS that answered.
    keys: Option<&'r ReadKeys>,
    /// The first READ KEYS that failed.
    first_error: Option<&'r ReadError>,
    /// None: no path answered, so unknown.
    pr_supported: Option<bool>,
    reservation: Option<&'r ReadReservation>,
    status: Option<&'r FullStatus>,
    matching: Option<Matching<'r>>,
    /// This node's key is on the LU (None without a key or without READ KEYS).
    own_key_registered: Option<bool>,
    paths: Vec<PathDiagnosis>,
    preempt_and_abort: PreemptAndAbort,
}

fn answer<T>(reply: &Option<Result<T, ReadError>>) -> Option<&T> {
    reply.as_ref().and_then(|r| r.as_ref().ok())
}

impl<'r> Evidence<'r> {
    fn read(replies: &'r LuReplies, own: Option<Key>, arbiter: bool) -> Self {
        let keys = replies.paths.iter().find_map(|p| p.keys.as_ref().ok());
        let first_error = replies.paths.iter().find_map(|p| p.keys.as_ref().err());
        let pr_supported = match (keys, first_error) {
            (Some(_), _) => Some(true),
            (None, Some(e)) if e.kind == ErrorKind::NotSupported => Some(false),
            _ => None,
        };
        let status = answer(&replies.full_status);
        let matching = status.map(|s| match_paths(&replies.paths, s));
        let paths = replies
            .paths
            .iter()
            .enumerate()
            .map(|(i, reply)| {
                path_diagnosis(
                    reply,
                    matching.as_ref().and_then(|m| m.paths.get(i)),
                    status,
                )
            })
            .collect();
        Evidence {
            replies,
            own,
            arbiter,
            keys,
            first_error,
            pr_supported,
            reservation: answer(&replies.reservation),
            status,
            matching,
            own_key_registered: own.zip(keys).map(|(own, k)| k.keys.contains(&own)),
            paths,
            preempt_and_abort: preempt_and_abort_support(&replies.paths),
        }
    }

    /// The LU judged, with the rules' findings.
    fn diagnosis(self, findings: Vec<Finding>) -> LuDiagnosis {
        let replies = self.replies;
        let ready = !findings.iter().any(|f| f.severity == Severity::Problem) && self.own.is_some();
        let registrations = self.registrations();
        let holder = self
            .status
            .and_then(|s| s.registrations.iter().find(|r| r.holder))
            .map(|r| r.transport_id.clone());
        LuDiagnosis {
            lu: replies.lu.clone(),
            arbiter: self.arbiter,
            coordinator: false,
            ready,
            paths: self.paths,
            pr_supported: self.pr_supported,
            pr_in: ServiceActions {
                read_keys: match (self.keys, self.first_error) {
                    (Some(_), _) => Support::Supported,
                    (None, Some(e)) => refusal(e),
                    (None, None) => Support::Unknown,
                },
                read_reservation: support(replies.reservation.as_ref()),
                report_capabilities: support(replies.capabilities.as_ref()),
                read_full_status: support(replies.full_status.as_ref()),
            },
            capabilities: answer(&replies.capabilities).cloned(),
            preempt_and_abort: self.preempt_and_abort,
            generation: self.keys.map(|k| k.generation),
            keys: self.keys.map(|k| k.keys.clone()).unwrap_or_default(),
            reservation: self.reservation.and_then(|r| {
                r.reservation.as_ref().map(|held| ReservationDiagnosis {
                    key: held.key,
                    rtype: held.rtype,
                    scope: held.scope,
                    holder: if held.rtype.is_all_registrants() {
                        None
                    } else {
                        holder
                    },
                })
            }),
            registrations,
            own_key_registered: self.own_key_registered,
            findings,
        }
    }

    /// Each READ FULL STATUS registration, with the path of this node it belongs to.
    fn registrations(&self) -> Vec<RegistrationDiagnosis> {
        let Some(status) = self.status else {
            return Vec::new();
        };
        let matching = self.matching.as_ref();
        status
            .registrations
            .iter()
            .enumerate()
            .map(|(i, r)| RegistrationDiagnosis {
                key: r.key,
                initiator: r.transport_id.clone(),
                relative_target_port: r.relative_target_port,
                all_tg_pt: r.all_tg_pt,
                holder: r.holder,
                path: matching
                    .and_then(|m| m.owner.get(i).copied().flatten())
                    .and_then(|p| self.replies.paths.get(p))
                    .map(|p| p.device.clone()),
                orphan: matching.is_some_and(|m| m.is_orphan(i)),
            })
            .collect()
    }

    /// Whether the LU answered PR IN at all is known, and it does.
    fn pr_works(&self) -> bool {
        self.pr_supported == Some(true)
    }
}

/// One path as doctor shows it: reachable, and its registration as far as it was matched.
fn path_diagnosis(
    reply: &PathReply,
    matched: Option<&PathMatch>,
    status: Option<&FullStatus>,
) -> PathDiagnosis {
    let (registration, registered_key, unmatched) = match matched {
        Some(PathMatch::Registration(r)) => (
            PathRegistration::Matched,
            status.and_then(|s| s.registrations.get(*r)).map(|r| r.key),
            None,
        ),
        Some(PathMatch::NotRegistered) => (PathRegistration::NotRegistered, None, None),
        Some(PathMatch::Unknown(why)) => (PathRegistration::Unmatched, None, Some(why.clone())),
        None => (
            PathRegistration::Unmatched,
            None,
            Some("READ FULL STATUS unavailable".to_string()),
        ),
    };
    let error = reply.keys.as_ref().err();
    PathDiagnosis {
        device: reply.device.clone(),
        // An error answer (e.g. PR not supported) still proves the path carries commands.
        reachable: error.is_none_or(|e| !is_dead(e.kind)),
        facts: reply.facts.clone(),
        registered_key,
        registration,
        unmatched,
        error: error.map(|e| e.message.clone()),
    }
}

/// A PR IN service action's support, from its reply (None: not asked).
fn support<T>(reply: Option<&Result<T, ReadError>>) -> Support {
    match reply {
        Some(Ok(_)) => Support::Supported,
        Some(Err(e)) => refusal(e),
        None => Support::Unknown,
    }
}

/// What a failed PR IN says about its service action's support.
fn refusal(e: &ReadError) -> Support {
    if matches!(e.kind, ErrorKind::NotSupported | ErrorKind::InvalidField) {
        Support::NotSupported
    } else {
        Support::Unknown
    }
}

pub(super) fn problem(message: impl Into<Failure>, remedy: impl Into<String>) -> Finding {
    Finding {
        severity: Severity::Problem,
        message: message.into(),
        remedy: remedy.into(),
    }
}

fn warning(message: impl Into<Failure>, remedy: impl Into<String>) -> Finding {
    Finding {
        severity: Severity::Warning,
        message: message.into(),
        remedy: remedy.into(),
    }
}

fn info(message: impl Into<Failure>) -> Finding {
    Finding {
        severity: Severity::Info,
        message: message.into(),
        remedy: String::new(),
    }
}

/// The LU has persistent reservations, and some path answered.
fn pr_support(ev: &Evidence<'_>) -> Vec<Finding> {
    match ev.pr_supported {
        Some(false) => vec![problem(
            "the LU does not support persistent reservations (PERSISTENT RESERVE IN answered \
             ILLEGAL REQUEST, invalid command operation code)"
                .to_string(),
            "fence with a PR-capable LU (LIO: attrib/emulate_pr=1; hypervisor disks need PR \
             pass-through)",
        )],
        None => vec![problem(
            ev.first_error
                .map_or_else(
                    || Failure::from("the LU has no paths"),
                    |e| e.message.clone(),
                )
                .prefixed("no path answered"),
            "check the sessions and devices (iscsiadm -m session, multipath -ll)",
        )],
        Some(true) => Vec::new(),
    }
}

/// Every path of an LU that answers carries commands.
fn unreachable_paths(ev: &Evidence<'_>) -> Vec<Finding> {
    if !ev.pr_works() {
        return Vec::new();
    }
    let reachable = ev.replies.paths.iter().filter(|p| p.keys.is_ok()).count();
    ev.replies
        .paths
        .iter()
        .filter_map(|p| {
            let e = p.keys.as_ref().err()?;
            Some(problem(
                e.message.clone().prefixed(format!(
                    "path {} is not reachable{}",
                    p.device,
                    p.facts
                        .not_running
                        .as_ref()
                        .map(|s| format!(" (state {s})"))
                        .unwrap_or_default(),
                )),
                if reachable > 0 {
                    "fencing goes through the other paths, but this path will not carry the key \
                     when it returns: repair it, then run `prfence unfence`"
                } else {
                    "repair the path"
                },
            ))
        })
        .collect()
}

/// REPORT CAPABILITIES answered, and lists the type fencing reserves.
fn capabilities(ev: &Evidence<'_>) -> Vec<Finding> {
    if !ev.pr_works() {
        return Vec::new();
    }
    let finding = match &ev.replies.capabilities {
        Some(Err(e)) => Some(warning(
            e.message.clone().prefixed("REPORT CAPABILITIES failed"),
            "ALL_TG_PT, APTPL, SIP and the supported types are unknown; prfence needs none of \
             them, but check the target's documentation",
        )),
        Some(Ok(c)) => match &c.supported_types {
            None => Some(info(
                "REPORT CAPABILITIES leaves the type mask invalid (TMV=0): the supported \
                 reservation types are not reported"
                    .to_string(),
            )),
            Some(types) if !types.contains(&FENCING_TYPE) => Some(problem(
                format!(
                    "the target does not report {FENCING_TYPE} ({}), the type fencing reserves",
                    FENCING_TYPE.description()
                ),
                "use a target that supports Write Exclusive - Registrants Only",
            )),
            Some(_) => None,
        },
        None => None,
    };
    finding.into_iter().collect()
}

/// READ FULL STATUS answered (it places registrations on paths).
fn full_status(ev: &Evidence<'_>) -> Vec<Finding> {
    match &ev.replies.full_status {
        Some(Err(e)) if ev.pr_works() => vec![warning(
            e.message.clone().prefixed("READ FULL STATUS failed"),
            "which path carries the key and orphaned registrations cannot be checked",
        )],
        _ => Vec::new(),
    }
}

/// Per initiator name of this node's: no orphaned registration where every session's ISID is
/// known, and as many registrations of our key as sessions where some is not.
fn registrations_per_initiator(ev: &Evidence<'_>) -> Vec<Finding> {
    let (Some(matching), Some(status)) = (&ev.matching, ev.status) else {
        return Vec::new();
    };
    let mut findings = Vec::new();
    for initiator in &matching.initiators {
        if initiator.isids_known {
            findings.extend(orphans(ev, matching, initiator, status));
        } else if let Some(own) = ev.own {
            findings.push(registration_count(own, initiator, status));
        }
    }
    findings
}

fn orphans(
    ev: &Evidence<'_>,
    matching: &Matching<'_>,
    initiator: &Initiator<'_>,
    status: &FullStatus,
) -> Vec<Finding> {
    initiator
        .registrations
        .iter()
        .filter(|&&r| matching.is_orphan(r))
        .filter_map(|&r| status.registrations.get(r))
        .map(|reg| {
            let whose = if Some(reg.key) == ev.own {
                "this node's key"
            } else {
                "key"
            };
            problem(
                format!(
                    "orphaned registration: {whose} {} is registered for initiator port {} \
                     (relative target port {}), which no current session of this node has (an \
                     earlier iSCSI login)",
                    reg.key, reg.transport_id, reg.relative_target_port
                ),
                "run `prfence unfence` on this node: it registers the current sessions and \
                 purges the orphan (the node agent never registers a path)",
            )
        })
        .collect()
}

/// Where some session's ISID is unknown, only the count of our key's registrations for the
/// initiator name can be compared with the count of its sessions.
fn registration_count(own: Key, initiator: &Initiator<'_>, status: &FullStatus) -> Finding {
    let name = initiator.name;
    let registered = initiator
        .registrations
        .iter()
        .filter(|&&r| {
            status
                .registrations
                .get(r)
                .is_some_and(|reg| reg.key == own)
        })
        .count();
    let n = initiator.sessions;
    if registered < n {
        problem(
            format!(
                "{} of {n} path(s) of initiator {name} are not registered with {own} \
                 ({registered} registration(s) for {n} session(s))",
                n - registered
            ),
            "run `prfence unfence` on this node to register every path",
        )
    } else if registered > n {
        problem(
            format!(
                "{} orphaned registration(s): {own} is registered {registered} times for \
                 initiator {name}, which has {n} session(s) (an earlier iSCSI login)",
                registered - n
            ),
            "run `prfence unfence` on this node: it purges orphaned registrations",
        )
    } else {
        info(format!(
            "{registered} registration(s) of {own} for initiator {name} and {n} session(s): the \
             counts agree, but which path carries which cannot be told without the sessions' \
             ISIDs"
        ))
    }
}

/// This node's key, when it and READ KEYS are known.
fn own_and_keys<'r>(ev: &Evidence<'r>) -> Option<(Key, &'r ReadKeys)> {
    ev.own.zip(ev.keys)
}

/// Every path of this node's is registered, and with our key.
fn paths_registered_with_own_key(ev: &Evidence<'_>) -> Vec<Finding> {
    let Some((own, _)) = own_and_keys(ev) else {
        return Vec::new();
    };
    ev.paths
        .iter()
        .filter_map(|path| {
            if path.registration == PathRegistration::NotRegistered {
                Some(problem(
                    format!(
                        "path {} is not registered (no registration for its initiator port)",
                        path.device
                    ),
                    "run `prfence unfence` on this node to register every path",
                ))
            } else {
                let other = path.registered_key.filter(|k| *k != own)?;
                // NVMe registers a host, by host id: two nodes that share one (a cloned
                // /etc/nvme/hostid) are one registrant to the target, whose key is the last
                // one either registered, and a fence between them removes nothing (P1).
                if let Some(host) = &path.facts.nvme_host_id {
                    return Some(problem(
                        format!(
                            "path {}: this node's NVMe host id {host} is registered with {other}, \
                             not {own}; if {other} is another node's key, the two nodes share \
                             this host id and the target takes them for one host: a fence \
                             between them cannot remove either",
                            path.device
                        ),
                        OwnInitiator::NvmeHost(host.clone()).advice(),
                    ));
                }
                // iSCSI registers an initiator port (name and ISID): two nodes with one cloned
                // initiator name and open-iscsi's default ISIDs are one registrant, as above.
                if let Some(name) = &path.facts.initiator {
                    return Some(problem(
                        format!(
                            "path {}: this node's initiator port ({name}{}) is registered with \
                             {other}, not {own}; if {other} is another node's key, the two \
                             nodes share this initiator name and the target takes them for \
                             one initiator: a fence between them cannot remove either",
                            path.device,
                            path.facts
                                .isid
                                .as_deref()
                                .map(|isid| format!(", ISID {isid}"))
                                .unwrap_or_default()
                        ),
                        OwnInitiator::Iscsi(name.clone()).advice(),
                    ));
                }
                Some(problem(
                    format!("path {} is registered with {other}, not {own}", path.device),
                    "check which key this node should use; `prfence unfence` with the right key \
                     replaces it",
                ))
            }
        })
        .collect()
}

/// Our key is on the LU (on the arbiter, without it this node cannot fence).
fn own_key_on_lu(ev: &Evidence<'_>) -> Vec<Finding> {
    let Some((own, _)) = own_and_keys(ev) else {
        return Vec::new();
    };
    if ev.own_key_registered != Some(false) {
        return Vec::new();
    }
    vec![problem(
        format!(
            "this node's key {own} is not registered on the LU{}",
            if ev.arbiter {
                " (the arbiter): this node cannot fence another and would itself be treated as \
                 fenced"
            } else {
                ""
            }
        ),
        format!(
            "run `prfence unfence --key {own}` on this node (if it was fenced, only after it \
             rejoined the cluster)"
        ),
    )]
}

/// Our key is not a lease epoch that a newer epoch of the same node has replaced.
fn stale_lease_epoch(ev: &Evidence<'_>) -> Vec<Finding> {
    let Some((own, keys)) = own_and_keys(ev) else {
        return Vec::new();
    };
    let Some(mine) = LeaseKey::decode(own) else {
        return Vec::new();
    };
    keys.keys
        .iter()
        .filter_map(|&key| LeaseKey::decode(key))
        .find(|l| l.node() == mine.node() && l.epoch() > mine.epoch())
        .map(|newer| {
            problem(
                format!(
                    "this key looks like a preempted lease epoch: {own} is node {} epoch {}, and \
                     the same node's newer epoch {} ({}) is registered",
                    mine.node(),
                    mine.epoch(),
                    newer.epoch(),
                    newer.key()
                ),
                "use the node agent's current key (its state file's epoch); never re-register an \
                 older epoch",
            )
        })
        .into_iter()
        .collect()
}

/// A reservation exists, of the type fencing makes (or an all-registrants one).
fn reservation(ev: &Evidence<'_>) -> Vec<Finding> {
    let Some(r) = ev.reservation else {
        return Vec::new();
    };
    match &r.reservation {
        None => vec![warning(
            "no reservation: every initiator, registered or not, may write".to_string(),
            "run `prfence unfence` (it reserves Write Exclusive - Registrants Only); `fence` also \
             creates one",
        )],
        Some(held) if held.rtype != FENCING_TYPE && !held.rtype.is_all_registrants() => {
            vec![warning(
                format!(
                    "the LU is reserved as {} ({}), not {FENCING_TYPE}: preempting a key may not \
                     stop that node's writes",
                    held.rtype,
                    held.rtype.description()
                ),
                "release it and let `prfence unfence` reserve wero",
            )]
        }
        Some(_) => Vec::new(),
    }
}

/// The target performs PREEMPT AND ABORT, as far as its kind is known.
fn preempt_and_abort(ev: &Evidence<'_>) -> Vec<Finding> {
    if ev.preempt_and_abort.supported == Some(false) && ev.pr_works() {
        vec![warning(
            "target lacks PREEMPT AND ABORT: fencing will not abort queued writes (prfence falls \
             back to PREEMPT)"
                .to_string(),
            "on LIO, serve the LU over iSCSI rather than tcm_loop",
        )]
    } else {
        Vec::new()
    }
}

/// What is known of the target's PREEMPT AND ABORT, from the kinds of target behind the paths.
fn preempt_and_abort_support(paths: &[PathReply]) -> PreemptAndAbort {
    let kinds: Vec<TargetKind> = paths.iter().filter_map(|p| p.facts.target).collect();
    let basis = "REPORT CAPABILITIES has no field for PREEMPT AND ABORT and doctor never sends it";
    if kinds.contains(&TargetKind::LioTcmLoop) {
        PreemptAndAbort {
            supported: Some(false),
            basis: format!(
                "{basis}; known behaviour: LIO over tcm_loop never completes it (the command \
                 waits for itself; docs/target-notes.md)"
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
