//! doctor against SPC-model LUs through the real codec and execution policy.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::exec::ScsiPr;
use crate::keys::LeaseKey;
use crate::ops::FENCING_TYPE;
use crate::pr::PrOut;
use crate::spc_model::{ModelDevice, ModelLu, Nexus, Quirks, iscsi_initiator};
use crate::testing::Cluster;

const A: Key = Key::new(0xa);
const B: Key = Key::new(0xb);

type Path = DoctorPath<ScsiPr<ModelDevice>>;

use crate::ops::tests::quick;

/// One LU; node A has `a_isids.len()` sessions, node B one: a [`Cluster`] of two nodes whose
/// sessions are named, all through target port 1.
struct Setup {
    lu: Arc<Mutex<ModelLu>>,
    a: Vec<Nexus>,
    b: Nexus,
}

impl Setup {
    fn new(quirks: Quirks, a_isids: &[&str]) -> Self {
        let a = a_isids
            .iter()
            .map(|isid| (iscsi_initiator("nodea", isid), 1))
            .collect();
        let b = vec![(iscsi_initiator("nodeb", "23d000009"), 1)];
        let cluster = Cluster::scsi_with_initiators(quirks, 1, &[a, b]);
        Setup {
            lu: Arc::clone(cluster.scsi_lu(0).expect("an SPC cluster")),
            a: (0..a_isids.len())
                .map(|path| cluster.nexus(0, 0, path).expect("an SPC cluster"))
                .collect(),
            b: cluster.nexus(0, 1, 0).expect("an SPC cluster"),
        }
    }

    fn out(&self, nexus: Nexus, request: &PrOut) {
        self.lu.lock().unwrap().pr_out(nexus, request).unwrap();
    }

    fn generation(&self) -> u32 {
        self.lu.lock().unwrap().generation()
    }

    /// Node A's paths with the facts discovery would give (`isids[i]` None: not known).
    fn paths(&self, nexus: &[Nexus], isids: &[Option<&str>], target: TargetKind) -> Vec<Path> {
        nexus
            .iter()
            .zip(isids)
            .enumerate()
            .map(|(i, (&n, isid))| DoctorPath {
                transport: ScsiPr::new(
                    ModelDevice::new(Arc::clone(&self.lu), n, format!("/dev/sd{i}")),
                    quick(),
                ),
                facts: PathFacts {
                    initiator: Some("iqn.2026-11.lab:nodea".to_string()),
                    isid: isid.map(str::to_string),
                    isid_source: isid.map(|_| "kernel".to_string()),
                    not_running: None,
                    nvme_host_id: None,
                    target: Some(target),
                    target_name: None,
                },
            })
            .collect()
    }

    fn doctor(&self, paths: Vec<Path>, own: Option<Key>) -> Diagnosis {
        let before = self.generation();
        let lus = vec![LuTarget {
            id: "naa.6001405000000001".into(),
            paths,
        }];
        let d = doctor(lus, own, Duration::from_secs(10)).unwrap();
        assert_eq!(self.generation(), before, "doctor changed PRgeneration");
        d
    }
}

fn problems(d: &Diagnosis) -> Vec<String> {
    d.lus
        .iter()
        .flat_map(|l| &l.findings)
        .filter(|f| f.severity == Severity::Problem)
        .map(|f| f.message.to_string())
        .collect()
}

fn unfence_a(s: &Setup) {
    for &n in &s.a {
        s.out(n, &PrOut::register_ignore(A));
    }
    s.out(s.a[0], &PrOut::reserve(A, FENCING_TYPE));
}

#[test]
fn ready_after_unfence_not_ready_before() {
    let s = Setup::new(Quirks::lio(), &["23d000001", "23d000002"]);
    let isids = [Some("0x23d000001"), Some("00023d000002")];
    let before = s.doctor(s.paths(&s.a, &isids, TargetKind::LioIscsi), Some(A));
    assert!(!before.ready);
    assert_eq!(before.can_fence, Some(false));
    let p = problems(&before);
    assert!(
        p.iter()
            .any(|m| m.contains("not registered on the LU (the arbiter)")),
        "{p:?}"
    );
    assert_eq!(
        before.lus[0].paths[0].registration,
        PathRegistration::NotRegistered
    );

    unfence_a(&s);
    s.out(s.b, &PrOut::register_ignore(B));
    let after = s.doctor(s.paths(&s.a, &isids, TargetKind::LioIscsi), Some(A));
    assert!(after.ready, "{:?}", problems(&after));
    assert_eq!(after.can_fence, Some(true));
    let lu = &after.lus[0];
    assert_eq!(lu.pr_supported, Some(true));
    assert_eq!(lu.preempt_and_abort.supported, Some(true));
    assert!(lu.paths.iter().all(|p| p.registered_key == Some(A)));
    let r = lu.reservation.as_ref().unwrap();
    assert_eq!((r.key, r.rtype), (A, FENCING_TYPE));
    assert_eq!(lu.registrations.len(), 3);
    assert!(lu.registrations.iter().all(|r| !r.orphan));
    assert_eq!(
        lu.capabilities
            .as_ref()
            .unwrap()
            .supported_types
            .as_ref()
            .unwrap()
            .len(),
        6
    );
}

#[test]
fn without_a_key_nothing_is_ready_but_everything_is_shown() {
    let s = Setup::new(Quirks::lio(), &["23d000001"]);
    unfence_a(&s);
    let d = s.doctor(
        s.paths(&s.a, &[Some("23d000001")], TargetKind::LioIscsi),
        None,
    );
    assert!(!d.ready);
    assert_eq!(d.can_fence, None);
    assert!(d.summary.contains("--key"), "{}", d.summary);
    assert_eq!(d.lus[0].keys, vec![A]);
}

#[test]
fn a_lu_without_pr_is_not_ready() {
    let s = Setup::new(
        Quirks {
            emulate_pr: false,
            ..Quirks::lio()
        },
        &["23d000001"],
    );
    let d = s.doctor(
        s.paths(&s.a, &[Some("23d000001")], TargetKind::LioIscsi),
        Some(A),
    );
    assert!(!d.ready);
    assert_eq!(d.lus[0].pr_supported, Some(false));
    assert_eq!(d.lus[0].pr_in.read_keys, Support::NotSupported);
    assert!(
        d.lus[0].paths[0].reachable,
        "an ILLEGAL REQUEST is an answer"
    );
    assert!(problems(&d)[0].contains("does not support persistent reservations"));
}

#[test]
fn one_unregistered_path_of_a_map_is_named() {
    let s = Setup::new(Quirks::lio(), &["23d000001", "23d000002"]);
    s.out(s.a[0], &PrOut::register_ignore(A));
    s.out(s.a[0], &PrOut::reserve(A, FENCING_TYPE));
    let d = s.doctor(
        s.paths(
            &s.a,
            &[Some("23d000001"), Some("23d000002")],
            TargetKind::LioIscsi,
        ),
        Some(A),
    );
    assert!(!d.ready);
    let p = problems(&d);
    assert!(
        p.iter()
            .any(|m| m.contains("path /dev/sd1 is not registered")),
        "{p:?}"
    );
    assert_eq!(d.lus[0].paths[0].registration, PathRegistration::Matched);

    // Without ISIDs only the counts can be compared, and that says so.
    let d = s.doctor(s.paths(&s.a, &[None, None], TargetKind::LioIscsi), Some(A));
    assert!(!d.ready);
    let p = problems(&d);
    assert!(p.iter().any(|m| m.contains("1 of 2 path(s)")), "{p:?}");
    assert_eq!(d.lus[0].paths[0].registration, PathRegistration::Unmatched);
    assert!(
        d.lus[0].paths[0]
            .unmatched
            .as_ref()
            .unwrap()
            .contains("ISID")
    );
}

#[test]
fn a_relogin_orphan_is_found() {
    let s = Setup::new(Quirks::lio(), &["23d000001"]);
    unfence_a(&s);
    let new = s.lu.lock().unwrap().relogin(s.a[0], "23d000005");
    let d = s.doctor(
        s.paths(&[new], &[Some("23d000005")], TargetKind::LioIscsi),
        Some(A),
    );
    assert!(!d.ready);
    let lu = &d.lus[0];
    assert!(lu.registrations.iter().any(|r| r.orphan && r.key == A));
    let p = problems(&d);
    assert!(
        p.iter().any(|m| m.contains("orphaned registration")),
        "{p:?}"
    );
    assert!(
        p.iter().any(|m| m.contains("/dev/sd0 is not registered")),
        "{p:?}"
    );
    // The key is still on the LU, but only through the orphan: `fence` could not preempt from here.
    assert_eq!(lu.own_key_registered, Some(true));
    assert_eq!(d.can_fence, Some(false));
}

#[test]
fn tcm_loop_warns_about_preempt_and_abort_but_is_ready() {
    let s = Setup::new(Quirks::lio(), &["23d000001"]);
    unfence_a(&s);
    let d = s.doctor(
        s.paths(&s.a, &[Some("23d000001")], TargetKind::LioTcmLoop),
        Some(A),
    );
    assert!(d.ready, "{:?}", problems(&d));
    assert_eq!(d.lus[0].preempt_and_abort.supported, Some(false));
    assert!(
        d.lus[0]
            .findings
            .iter()
            .any(|f| f.severity == Severity::Warning
                && f.message.to_string().contains("PREEMPT AND ABORT"))
    );
}

#[test]
fn a_preempted_lease_epoch_is_recognised() {
    let node = std::num::NonZeroU16::new(3).unwrap();
    let old = LeaseKey::new(node, 4).unwrap().key();
    let new = LeaseKey::new(node, 5).unwrap().key();
    let s = Setup::new(Quirks::lio(), &["23d000001"]);
    s.out(s.a[0], &PrOut::register_ignore(new));
    let d = s.doctor(
        s.paths(&s.a, &[Some("23d000001")], TargetKind::LioIscsi),
        Some(old),
    );
    let p = problems(&d);
    assert!(
        p.iter().any(|m| m.contains("preempted lease epoch")),
        "{p:?}"
    );
}

#[test]
fn no_reservation_and_a_dead_path_are_reported() {
    let s = Setup::new(Quirks::lio(), &["23d000001", "23d000002"]);
    for &n in &s.a {
        s.out(n, &PrOut::register_ignore(A));
    }
    s.lu.lock().unwrap().disconnect(s.a[1]);
    let d = s.doctor(
        s.paths(
            &s.a,
            &[Some("23d000001"), Some("23d000002")],
            TargetKind::Unknown,
        ),
        Some(A),
    );
    let lu = &d.lus[0];
    assert!(!lu.paths[1].reachable);
    assert!(
        lu.findings
            .iter()
            .any(|f| f.message.to_string().starts_with("no reservation"))
    );
    assert!(
        problems(&d)
            .iter()
            .any(|m| m.contains("/dev/sd1 is not reachable"))
    );
    assert_eq!(lu.preempt_and_abort.supported, None);
}

/// Two nodes with one cloned initiator name (and open-iscsi's default ISID) are one initiator
/// port to the target: this node's path carries the other node's key, and doctor says why a
/// fence between them would remove nothing.
#[test]
fn a_cloned_initiator_name_is_named() {
    let s = Setup::new(Quirks::lio(), &["23d000001"]);
    // The other node, through the same initiator port, registered last.
    s.out(s.a[0], &PrOut::register_ignore(B));
    s.out(s.a[0], &PrOut::reserve(B, FENCING_TYPE));
    let d = s.doctor(
        s.paths(&s.a, &[Some("23d000001")], TargetKind::LioIscsi),
        Some(A),
    );
    assert!(!d.ready);
    let p = problems(&d);
    assert!(
        p.iter()
            .any(|m| m.contains("iqn.2026-11.lab:nodea, ISID 23d000001")
                && m.contains("share this initiator name")),
        "{p:?}"
    );
    let fixes: Vec<&str> = d.lus[0]
        .findings
        .iter()
        .map(|f| f.remedy.as_str())
        .collect();
    assert!(fixes.iter().any(|f| f.contains("iscsi-iname")), "{fixes:?}");
}

/// The coordinator set's rules, on LUs judged from one model LU where A and B are registered:
/// copies of it under other identifiers, on targets and with keys as each case needs.
#[test]
fn a_coordinator_set_is_odd_distinct_apart_and_holds_every_nodes_key() {
    let s = Setup::new(Quirks::lio(), &["23d000001"]);
    unfence_a(&s);
    s.out(s.b, &PrOut::register_ignore(B));
    let judged = s.doctor(
        s.paths(&s.a, &[Some("0x23d000001")], TargetKind::LioIscsi),
        Some(A),
    );
    let lu = |id: &str, target: &str| {
        let mut lu = judged.lus[0].clone();
        lu.lu = id.into();
        for p in &mut lu.paths {
            p.facts.target_name = Some(target.to_owned());
        }
        lu
    };
    let data = [lu("naa.1", "iqn.t1")];
    let set = |c: &[LuDiagnosis]| judge_set(&data, c, Some(A));
    let messages = |set: &CoordinatorSet| -> Vec<String> {
        set.findings.iter().map(|f| f.message.to_string()).collect()
    };
    let three = [
        lu("naa.c1", "iqn.t1"),
        lu("naa.c2", "iqn.t2"),
        lu("naa.c3", "iqn.t3"),
    ];
    let sound = set(&three);
    assert!(sound.sound(), "{:?}", messages(&sound));
    assert_eq!((sound.own_key_on, sound.can_fence()), (Some(3), Some(true)));

    let two = set(&three[..2]);
    assert!(
        messages(&two)
            .iter()
            .any(|m| m.contains("2 coordinator LU(s)")),
        "{:?}",
        messages(&two)
    );

    let shared = set(&[
        lu("naa.c1", "iqn.t1"),
        lu("naa.c2", "iqn.t2"),
        lu("naa.c3", "iqn.t2"),
    ]);
    assert!(
        messages(&shared)
            .iter()
            .any(|m| m.contains("naa.c2 and naa.c3 are both on the iSCSI target iqn.t2")),
        "{:?}",
        messages(&shared)
    );

    let with_data = set(&[
        lu("naa.1", "iqn.t1"),
        lu("naa.c2", "iqn.t2"),
        lu("naa.c3", "iqn.t3"),
    ]);
    assert!(
        messages(&with_data)
            .iter()
            .any(|m| m.contains("naa.1 is also a data LU"))
    );

    // B's key gone from one coordinator, A's from two: A cannot win a race from here
    let mut lost = three.clone();
    lost[0].keys.retain(|&k| k != B);
    for c in &mut lost[1..] {
        c.keys.retain(|&k| k != A);
        c.own_key_registered = Some(false);
    }
    let lost = set(&lost);
    assert_eq!((lost.own_key_on, lost.can_fence()), (Some(1), Some(false)));
    let m = messages(&lost);
    assert!(
        m.iter().any(|m| m.contains(&format!(
            "{B} registered on the data LUs are not on coordinator naa.c1"
        ))),
        "{m:?}"
    );
    assert!(
        m.iter().any(|m| m.contains(&format!(
            "{A} registered on the data LUs are not on coordinator naa.c2"
        ))),
        "{m:?}"
    );

    // conclude: ready needs a sound set and a majority
    let d = conclude(data.to_vec(), three.to_vec(), Some(A));
    assert!(d.ready && d.can_fence == Some(true), "{}", d.summary);
    let d = conclude(data.to_vec(), three[..2].to_vec(), Some(A));
    assert!(!d.ready, "{}", d.summary);
    assert!(d.summary.contains("the coordinator set"), "{}", d.summary);
}
