//! Which READ FULL STATUS registration is which path of this node's: by NVMe host id, by iSCSI
//! initiator name and ISID, and where an ISID is unknown, by count per initiator name.

use crate::pr::nvme::HostId;
use crate::pr::{FullStatus, Registration, TransportId};

use super::PathFacts;
use super::gather::PathReply;

/// How one path of this node's matched the LU's registrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PathMatch {
    /// The registration at this index of READ FULL STATUS names the path's initiator port.
    Registration(usize),
    /// No registration names the path's initiator port.
    NotRegistered,
    /// Which registration is the path's cannot be told, for this reason.
    Unknown(String),
}

/// The registrations of one iSCSI initiator name of this node's, beside its sessions.
#[derive(Debug)]
pub(super) struct Initiator<'a> {
    pub name: &'a str,
    /// This node's paths through sessions of that name.
    pub sessions: usize,
    /// Every one of those sessions has a known ISID, so each registration of the name belongs
    /// to one of them or to none (an orphan); otherwise only counts can be compared.
    pub isids_known: bool,
    /// The registrations for that name, as indexes into READ FULL STATUS.
    pub registrations: Vec<usize>,
}

/// What [`match_paths`] concluded.
#[derive(Debug)]
pub(super) struct Matching<'a> {
    /// Per path, in the order given.
    pub paths: Vec<PathMatch>,
    /// Per registration: the path it belongs to.
    pub owner: Vec<Option<usize>>,
    /// Per iSCSI initiator name of this node's paths, sorted.
    pub initiators: Vec<Initiator<'a>>,
}

impl Matching<'_> {
    /// A registration for one of this node's initiator names whose sessions all have known
    /// ISIDs, yet none of them is its: left from an earlier session.
    pub fn is_orphan(&self, registration: usize) -> bool {
        self.owner.get(registration).copied().flatten().is_none()
            && self
                .initiators
                .iter()
                .any(|i| i.isids_known && i.registrations.contains(&registration))
    }
}

/// Matches READ FULL STATUS registrations to this node's paths.
pub(super) fn match_paths<'a>(paths: &'a [PathReply], status: &FullStatus) -> Matching<'a> {
    let regs = &status.registrations;
    let matched: Vec<PathMatch> = paths.iter().map(|p| match_path(&p.facts, regs)).collect();
    let mut owner = vec![None; regs.len()];
    for (index, found) in matched.iter().enumerate() {
        if let PathMatch::Registration(r) = found
            && let Some(slot) = owner.get_mut(*r)
        {
            *slot = Some(index);
        }
    }
    Matching {
        paths: matched,
        owner,
        initiators: initiators(paths, regs),
    }
}

/// One path: an NVMe path by its host id, an iSCSI path by initiator name and ISID.
fn match_path(facts: &PathFacts, regs: &[Registration]) -> PathMatch {
    if let Some(host) = &facts.nvme_host_id {
        return by_host_id(host, regs);
    }
    let Some(initiator) = &facts.initiator else {
        return PathMatch::Unknown(
            "not an iSCSI path (prfence knows this node's initiator port only for iSCSI sessions)"
                .to_string(),
        );
    };
    let Some(isid) = &facts.isid else {
        return PathMatch::Unknown(format!(
            "the ISID of {initiator}'s session is not known (the kernel does not show it)"
        ));
    };
    by_isid(initiator, isid, regs)
}

/// The registration of this NVMe host (all its paths share it), by host id. A target that
/// reports 64-bit host ids cannot be matched with Linux's 128-bit one.
fn by_host_id(host: &str, regs: &[Registration]) -> PathMatch {
    let ours: TransportId = match format!("nvme-hostid:{host}").parse() {
        Ok(ours) => ours,
        Err(e) => {
            return PathMatch::Unknown(format!("this node's NVMe host id is unreadable ({e})"));
        }
    };
    if let Some(r) = regs.iter().position(|r| r.transport_id == ours) {
        return PathMatch::Registration(r);
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
        PathMatch::Unknown(
            "the target reports 64-bit NVMe host ids; this node's is 128-bit, so its \
             registration cannot be picked out"
                .to_string(),
        )
    } else {
        PathMatch::NotRegistered
    }
}

/// The registration of one iSCSI session, by initiator name and ISID.
fn by_isid(initiator: &str, isid: &str, regs: &[Registration]) -> PathMatch {
    regs.iter()
        .position(|r| {
            iscsi_name(&r.transport_id).is_some_and(|(name, reg_isid)| {
                name.eq_ignore_ascii_case(initiator) && reg_isid.is_some_and(|i| same_isid(i, isid))
            })
        })
        .map_or(PathMatch::NotRegistered, PathMatch::Registration)
}

/// Per initiator name of this node's paths: its sessions and its registrations.
fn initiators<'a>(paths: &'a [PathReply], regs: &[Registration]) -> Vec<Initiator<'a>> {
    let mut names: Vec<&str> = paths
        .iter()
        .filter_map(|p| p.facts.initiator.as_deref())
        .collect();
    names.sort_unstable();
    names.dedup_by(|a, b| a.eq_ignore_ascii_case(b));
    names
        .into_iter()
        .map(|name| {
            let sessions: Vec<&PathFacts> = paths
                .iter()
                .map(|p| &p.facts)
                .filter(|f| {
                    f.initiator
                        .as_deref()
                        .is_some_and(|i| i.eq_ignore_ascii_case(name))
                })
                .collect();
            Initiator {
                name,
                sessions: sessions.len(),
                isids_known: sessions.iter().all(|f| f.isid.is_some()),
                registrations: regs
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| {
                        iscsi_name(&r.transport_id)
                            .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
                    })
                    .map(|(i, _)| i)
                    .collect(),
            }
        })
        .collect()
}

fn iscsi_name(id: &TransportId) -> Option<(&str, Option<&str>)> {
    match id {
        TransportId::Iscsi { name, isid } => Some((name, isid.as_deref())),
        _ => None,
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
