//! The coordinator set as one node sees it (issue 47): what makes it unable to decide a fence
//! safely or at all, read from the judged LUs. Pure.

use serde::Serialize;

use crate::discover::LuId;
use crate::pr::Key;

use super::super::{LuSet, coordinator_count_ok, majority};
use super::judge::problem;
use super::{Finding, LuDiagnosis, PathRegistration, Severity};

/// The coordinators, judged as a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CoordinatorSet {
    /// Their identifiers, to compare with the other nodes' (two nodes racing on different sets
    /// could both win).
    pub lu_set: LuSet,
    /// On how many this node's key is registered through a path of its own (None without a
    /// key); a fence from here needs a majority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub own_key_on: Option<usize>,
    pub findings: Vec<Finding>,
}

impl CoordinatorSet {
    /// Whether a fence from this node can win the race: its key usable on a majority.
    pub fn can_fence(&self) -> Option<bool> {
        self.own_key_on.map(|on| on >= majority(self.lu_set.count))
    }

    /// Whether nothing about the set itself stops a fence.
    pub fn sound(&self) -> bool {
        !self
            .findings
            .iter()
            .any(|f| f.severity == Severity::Problem)
    }
}

/// This node's key registered on `lu` through a reachable path of its own.
pub(super) fn own_key_usable(lu: &LuDiagnosis, own: Key) -> bool {
    lu.own_key_registered == Some(true)
        && lu.paths.iter().any(|p| {
            p.reachable
                && (p.registered_key == Some(own) || p.registration == PathRegistration::Unmatched)
        })
}

/// The set's findings: its size (odd, 3 or 5), each coordinator identified and not a data LU,
/// each on an iSCSI target of its own where this node can tell (the target IQN of its paths), and
/// every key registered on the data LUs also on each coordinator (a node missing there loses
/// races it should win, and fences nobody with a majority lost).
pub fn judge_set(
    data: &[LuDiagnosis],
    coordinators: &[LuDiagnosis],
    own: Option<Key>,
) -> CoordinatorSet {
    let mut findings = Vec::new();
    let count = coordinators.len();
    if !coordinator_count_ok(count) {
        findings.push(problem(
            format!("{count} coordinator LU(s): a set is 3 or 5, an odd number"),
            "name 3 coordinators (one per array or target), or 5; the same set on every node",
        ));
    }
    for lu in coordinators.iter().filter(|c| c.lu.is_node_local()) {
        findings.push(problem(
            format!(
                "coordinator {} is not identified on this node (no designator read): its \
                 identity cannot be compared with the other nodes' set",
                lu.lu
            ),
            "check its paths (multipath -ll, iscsiadm -m session), or name another LU",
        ));
    }
    let data_ids: Vec<&LuId> = data.iter().map(|lu| &lu.lu).collect();
    for lu in coordinators.iter().filter(|c| data_ids.contains(&&c.lu)) {
        findings.push(problem(
            format!("coordinator {} is also a data LU", lu.lu),
            "coordinators only decide who survives: give each LU in one list",
        ));
    }
    let targets: Vec<Option<&str>> = coordinators.iter().map(target_of).collect();
    for (i, (lu, target)) in coordinators.iter().zip(&targets).enumerate() {
        let Some(target) = target else { continue };
        if let Some(other) = coordinators[..i]
            .iter()
            .zip(&targets)
            .find(|(_, t)| t.as_deref() == Some(*target))
        {
            findings.push(problem(
                format!(
                    "coordinators {} and {} are both on the iSCSI target {target}: one failure \
                     domain, so losing it loses two",
                    other.0.lu, lu.lu
                ),
                "put each coordinator on its own array or target",
            ));
        }
    }
    let mut on_data: Vec<Key> = data.iter().flat_map(|lu| lu.keys.iter().copied()).collect();
    on_data.sort_unstable();
    on_data.dedup();
    for lu in coordinators.iter().filter(|c| c.generation.is_some()) {
        let missing: Vec<String> = on_data
            .iter()
            .filter(|k| !lu.keys.contains(k))
            .map(ToString::to_string)
            .collect();
        if !missing.is_empty() {
            findings.push(problem(
                format!(
                    "key(s) {} registered on the data LUs are not on coordinator {}: those nodes \
                     lose races they could win",
                    missing.join(" "),
                    lu.lu
                ),
                "run `prfence unfence --coordinator …` (or fence_pr on) on those nodes, with \
                 every coordinator named",
            ));
        }
    }
    CoordinatorSet {
        lu_set: LuSet::of(
            coordinators
                .iter()
                .map(|lu| (!lu.lu.is_node_local()).then(|| lu.lu.clone())),
        ),
        own_key_on: own.map(|own| {
            coordinators
                .iter()
                .filter(|lu| own_key_usable(lu, own))
                .count()
        }),
        findings,
    }
}

/// The iSCSI target every path of `lu` reaches, if they agree and it is known.
fn target_of(lu: &LuDiagnosis) -> Option<&str> {
    let mut targets = lu.paths.iter().map(|p| p.facts.target_name.as_deref());
    let first = targets.next()??;
    targets.all(|t| t == Some(first)).then_some(first)
}
