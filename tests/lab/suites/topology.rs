//! Smoke tests of the lab itself: each topology works, and the oracles read the target's state.
//! Uses sg_persist (independent of prfence) to change PR state.

use std::time::Duration;

use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{Node, Topology, WriteOutcome};

pub const SUITE: Suite = Suite {
    name: "topology",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(5 * 60),
    usual: Duration::from_secs(20),
    tests: crate::tests![
        tcm_loop_two_nexuses,
        iscsi_16_luns,
        no_pr_lun,
        targetcli_iscsi_two_nodes,
    ],
    long: &[],
    reproducers: &[],
};

fn sg_persist(args: &[&str], device: &std::path::Path) -> anyhow::Result<crate::CommandRun> {
    let mut all: Vec<&std::ffi::OsStr> = vec!["-n".as_ref()];
    all.extend(args.iter().map(|a| std::ffi::OsStr::new(*a)));
    all.push(device.as_os_str());
    crate::run("sg_persist", all)
}

/// Through LUN `lun`: A registers and reserves WERO; unregistered B is refused, A is accepted;
/// B registers and may then write. Asserted on the target's configfs state.
fn pr_smoke(t: &Topology, lun: usize) -> anyhow::Result<()> {
    let (a, b) = (t.device(Node::A, lun), t.device(Node::B, lun));
    let lu = t.lu(lun);
    let (init_a, init_b) = (&t.node(Node::A).initiator, &t.node(Node::B).initiator);
    assert!(lu.registrations()?.is_empty(), "fresh LU has registrations");
    assert_eq!(lu.holder()?, None);
    let generation = lu.generation()?;

    sg_persist(&["--out", "--register", "--param-sark=0xa"], a)?.ok()?;
    let regs = lu.registrations()?;
    assert_eq!(regs.len(), 1, "{regs:?}");
    assert_eq!((&regs[0].initiator, regs[0].key), (init_a, 0xa));
    assert_eq!(
        regs[0].isid.is_some(),
        regs[0].fabric == "iSCSI",
        "{regs:?}"
    );

    sg_persist(
        &["--out", "--reserve", "--param-rk=0xa", "--prout-type=5"],
        a,
    )?
    .ok()?;
    assert_eq!(lu.holder()?.map(|h| h.initiator).as_ref(), Some(init_a));
    assert_eq!(lu.reservation_type()?, Some(5));

    assert_eq!(
        t.write_probe(Node::B, lun, 1),
        WriteOutcome::Refused,
        "unregistered B under WERO"
    );
    assert_eq!(
        t.write_probe(Node::A, lun, 1),
        WriteOutcome::Accepted,
        "holder A"
    );

    sg_persist(&["--out", "--register", "--param-sark=0xb"], b)?.ok()?;
    let mut regs: Vec<(String, u64)> = lu
        .registrations()?
        .into_iter()
        .map(|r| (r.initiator, r.key))
        .collect();
    regs.sort_by_key(|r| r.1);
    assert_eq!(regs, [(init_a.clone(), 0xa), (init_b.clone(), 0xb)]);
    assert!(lu.generation()? > generation, "PRgeneration did not grow");

    assert_eq!(
        t.write_probe(Node::B, lun, 2),
        WriteOutcome::Accepted,
        "registrant B under WERO"
    );
    let block = crate::block_text(&t.read_block(Node::A, lun, 2)?);
    assert_eq!(
        block,
        format!("write probe from node B to LUN {lun} block 2")
    );
    Ok(())
}

fn tcm_loop_two_nexuses() -> anyhow::Result<()> {
    let t = Topology::tcm_loop()?;
    assert_ne!(t.device(Node::A, 0), t.device(Node::B, 0));
    t.settle()?;
    pr_smoke(&t, 0)
}

fn iscsi_16_luns() -> anyhow::Result<()> {
    let t = Topology::iscsi(16)?;
    for node in Node::BOTH {
        assert_eq!(t.node(node).devices().len(), 16);
    }
    let mut all: Vec<_> = Node::BOTH
        .iter()
        .flat_map(|&n| t.node(n).devices().to_vec())
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 32, "every node and LUN has its own disk");
    let mut ids: Vec<_> = t.lus().iter().map(|lu| lu.wwid.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 16, "LU identifiers are distinct: {ids:?}");
    for (i, lu) in t.lus().iter().enumerate() {
        assert_eq!(lu.index, i);
        for node in Node::BOTH {
            let name = t
                .device(node, i)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let wwid = std::fs::read_to_string(format!("/sys/class/block/{name}/device/wwid"))?;
            assert_eq!(wwid.trim(), lu.wwid, "node {node:?} LUN {i}");
        }
    }
    t.settle()?;
    pr_smoke(&t, 15)?;
    // the registrations went to LUN 15's backstore only: device order matches LUN order
    assert!(t.lu(0).registrations()?.is_empty());
    assert!(t.lu(14).registrations()?.is_empty());
    Ok(())
}

fn no_pr_lun() -> anyhow::Result<()> {
    let t = Topology::no_pr()?;
    t.settle()?;
    let keys = sg_persist(&["--in", "--read-keys"], t.device(Node::A, 0))?;
    // 5: ILLEGAL REQUEST, 9: INVALID OPERATION CODE (sg3_utils exit statuses)
    assert!(
        matches!(keys.code(), 5 | 9),
        "sg_persist -k on a LUN without PR: {keys:?}"
    );
    assert_eq!(t.write_probe(Node::B, 0, 1), WriteOutcome::Accepted);
    Ok(())
}

fn targetcli_iscsi_two_nodes() -> anyhow::Result<()> {
    let t = Topology::targetcli_iscsi(2)?;
    for node in Node::BOTH {
        assert_eq!(t.node(node).devices().len(), 2);
    }
    t.settle()?;
    pr_smoke(&t, 1)?;
    assert!(t.lu(0).registrations()?.is_empty());
    Ok(())
}
