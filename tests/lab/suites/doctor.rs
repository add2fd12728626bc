//! `prfence doctor` against the real LIO target (issue 12 item 4): ready after unfence and not
//! before (iSCSI and tcm_loop), the no-PR LUN, a multipath map with one unregistered path and a
//! re-login orphan. Every case checks against the target's configfs (registrations, ISIDs) and
//! that doctor changed nothing: PRgeneration (`res_pr_generation`) is the same before and after.
//! Run: `cargo test --test lab_doctor` (as root).

use std::path::PathBuf;
use std::time::Duration;

use crate::node::unfence;
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{Node, Topology};
use anyhow::{Context, ensure};
use serde_json::Value;

pub const SUITE: Suite = Suite {
    name: "doctor",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(10 * 60),
    usual: Duration::from_secs(23),
    tests: crate::tests![
        iscsi_ready_after_unfence_not_before,
        tcm_loop_ready_after_unfence_not_before,
        no_pr_lun_is_not_ready,
        multipath_map_with_one_unregistered_path,
        relogin_orphan_is_found,
    ],
    long: &[],
    reproducers: &[],
};

const KEY_A: &str = "0xa";
const KEY_B: &str = "0xb";

fn generations(t: &Topology) -> anyhow::Result<Vec<u32>> {
    t.lus().iter().map(|lu| lu.generation()).collect()
}

/// Runs doctor on `devices` with `key`, expects exit `code`, checks PRgeneration did not move;
/// prints the text output and returns the JSON.
fn doctor(t: &Topology, key: &str, devices: &[PathBuf], code: i32) -> anyhow::Result<Value> {
    let before = generations(t)?;
    let mut args: Vec<String> = vec!["doctor".into(), "--key".into(), key.into()];
    args.extend(devices.iter().map(|d| d.display().to_string()));
    let text = crate::prfence(&args)?;
    println!(
        "$ prfence {}\n{}{}",
        args.join(" "),
        text.stdout,
        text.stderr
    );
    args.insert(0, "--json".into());
    let json = crate::prfence(&args)?;
    ensure!(
        text.code() == code && json.code() == code,
        "doctor exited {} (text) and {} (JSON), expected {code}:\n{}{}",
        text.code(),
        json.code(),
        json.stdout,
        json.stderr
    );
    ensure!(
        generations(t)? == before,
        "doctor changed PRgeneration: {before:?} -> {:?}",
        generations(t)?
    );
    let value = json.json()?;
    ensure!(value["ready"] == (code == 0), "{value}");
    Ok(value)
}

fn isid_value(isid: &str) -> Option<u64> {
    u64::from_str_radix(isid.trim().trim_start_matches("0x"), 16).ok()
}

fn lus(report: &Value) -> &[Value] {
    report["lus"].as_array().map_or(&[], Vec::as_slice)
}

fn problems(lu: &Value) -> Vec<String> {
    lu["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["severity"] == "problem")
        .map(|f| f["message"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn iscsi_ready_after_unfence_not_before() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    t.settle()?;
    let devices = t.node(Node::A).devices().to_vec();
    let before = doctor(&t, KEY_A, &devices, 1)?;
    ensure!(before["can_fence"] == false, "{before}");
    for lu in lus(&before) {
        ensure!(lu["own_key_registered"] == false, "{lu}");
        ensure!(lu["pr_supported"] == true, "{lu}");
    }
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    let after = doctor(&t, KEY_A, &devices, 0)?;
    ensure!(after["can_fence"] == true, "{after}");
    // P2's precondition, compared across nodes: B names the same two LUs through other device
    // nodes, in another order, and gets A's fingerprint and arbiter; one LU less is another set.
    let mut b_devices = t.node(Node::B).devices().to_vec();
    b_devices.reverse();
    let from_b = doctor(&t, KEY_B, &b_devices, 0)?;
    let arbiter = t.lus().iter().map(|lu| lu.wwid.clone()).min();
    ensure!(
        after["lu_set"] == from_b["lu_set"]
            && after["lu_set"]["count"] == 2
            && after["lu_set"]["unidentified"] == 0
            && after["lu_set"]["arbiter"].as_str() == arbiter.as_deref(),
        "A's LU set {} and B's {} (arbiter {arbiter:?})",
        after["lu_set"],
        from_b["lu_set"]
    );
    let one_less = doctor(&t, KEY_B, &b_devices[..1], 0)?;
    ensure!(
        one_less["lu_set"]["fingerprint"] != after["lu_set"]["fingerprint"]
            && one_less["lu_set"]["count"] == 1,
        "one LU less, the same LU set: {}",
        one_less["lu_set"]
    );
    // --config: the agent's devices and key.value give the same verdict.
    let config = std::env::temp_dir().join("prfence-doctor-agent.toml");
    let _remove = crate::RemoveOnDrop::new(&config);
    let mut toml = format!("mode = \"watch\"\n[key]\nvalue = \"{KEY_A}\"\n");
    for device in &devices {
        toml.push_str(&format!("[[device]]\npath = \"{}\"\n", device.display()));
    }
    std::fs::write(&config, toml)?;
    let before = generations(&t)?;
    let run = crate::prfence([
        "--json".as_ref(),
        "doctor".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
    ])?;
    ensure!(
        run.code() == 0,
        "doctor --config exited {}: {}{}",
        run.code(),
        run.stdout,
        run.stderr
    );
    let from_config = run.json()?;
    ensure!(
        from_config["key"] == "0x000000000000000a" && from_config["ready"] == true,
        "{from_config}"
    );
    ensure!(
        generations(&t)? == before,
        "doctor --config changed PRgeneration"
    );
    let initiator = &t.node(Node::A).initiator;
    for (lu, target) in lus(&after).iter().zip(t.lus()) {
        // The ISIDs doctor matched are the ones the target registered A's key under.
        let registered: Vec<u64> = target
            .registrations()?
            .iter()
            .filter(|r| &r.initiator == initiator && r.key == 0xa)
            .filter_map(|r| r.isid.as_deref().and_then(isid_value))
            .collect();
        for path in lu["paths"].as_array().into_iter().flatten() {
            ensure!(path["registration"] == "matched", "{path}");
            ensure!(path["registered_key"] == "0x000000000000000a", "{path}");
            let isid = path["isid"].as_str().and_then(isid_value);
            ensure!(
                isid.is_some_and(|i| registered.contains(&i)),
                "path {path} does not carry an ISID the target registered A under ({registered:x?})"
            );
        }
        ensure!(lu["preempt_and_abort"]["supported"] == true, "{lu}");
        ensure!(lu["capabilities"]["atp_c"] == true, "{lu}");
        let holder = target.holder()?.context("no reservation")?;
        ensure!(
            lu["reservation"]["holder"]
                .as_str()
                .is_some_and(|h| h.starts_with(&holder.initiator)),
            "{lu} vs holder {holder:?}"
        );
    }
    Ok(())
}

fn tcm_loop_ready_after_unfence_not_before() -> anyhow::Result<()> {
    let t = Topology::tcm_loop()?;
    t.settle()?;
    let devices = t.node(Node::A).devices().to_vec();
    doctor(&t, KEY_A, &devices, 1)?;
    unfence(&t, Node::A)?;
    let registered = t.lu(0).registrations()?;
    ensure!(
        registered.iter().any(|r| r.key == 0xa),
        "unfence left no registration of A: {registered:?}"
    );
    let after = doctor(&t, KEY_A, &devices, 0)?;
    let lu = &lus(&after)[0];
    ensure!(lu["preempt_and_abort"]["supported"] == false, "{lu}");
    ensure!(
        lu["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f["message"]
                .as_str()
                .unwrap_or_default()
                .contains("lacks PREEMPT AND ABORT")),
        "{lu}"
    );
    Ok(())
}

fn no_pr_lun_is_not_ready() -> anyhow::Result<()> {
    let t = Topology::no_pr()?;
    t.settle()?;
    let report = doctor(&t, KEY_A, t.node(Node::A).devices(), 1)?;
    let lu = &lus(&report)[0];
    ensure!(lu["pr_supported"] == false, "{lu}");
    ensure!(lu["pr_in"]["read_keys"] == "not_supported", "{lu}");
    ensure!(lu["paths"][0]["reachable"] == true, "{lu}");
    ensure!(
        problems(lu)
            .iter()
            .any(|p| p.contains("does not support persistent reservations")),
        "{lu}"
    );
    Ok(())
}

/// A map over A's two sessions, only the first registered (by hand, as after a path was added).
fn multipath_map_with_one_unregistered_path() -> anyhow::Result<()> {
    let t = Topology::iscsi(1)?;
    let second = t.second_session(Node::A)?;
    let first = t.device(Node::A, 0).to_path_buf();
    let map = t.multipath_map("a0", 0, &[&first, &second[0]])?;
    t.settle()?;
    let first_text = first.display().to_string();
    crate::prfence(["register", "--key", KEY_A, &first_text])?.ok()?;
    crate::prfence(["reserve", "--key", KEY_A, &first_text])?.ok()?;
    ensure!(t.lu(0).registrations()?.len() == 1);
    let report = doctor(&t, KEY_A, &[map], 1)?;
    let lu = &lus(&report)[0];
    let paths = lu["paths"].as_array().context("paths")?;
    ensure!(paths.len() == 2, "{lu}");
    let state = |dev: &PathBuf| {
        paths
            .iter()
            .find(|p| p["device"] == dev.display().to_string())
            .map(|p| p["registration"].clone())
    };
    ensure!(state(&first) == Some("matched".into()), "{lu}");
    ensure!(state(&second[0]) == Some("not_registered".into()), "{lu}");
    ensure!(
        problems(lu)
            .iter()
            .any(|p| p.contains(&format!("path {} is not registered", second[0].display()))),
        "{lu}"
    );
    Ok(())
}

fn relogin_orphan_is_found() -> anyhow::Result<()> {
    let mut t = Topology::iscsi(1)?;
    t.settle()?;
    unfence(&t, Node::A)?;
    let initiator = t.node(Node::A).initiator.clone();
    let old: Vec<u64> = t
        .lu(0)
        .registrations()?
        .iter()
        .filter(|r| r.initiator == initiator)
        .filter_map(|r| r.isid.as_deref().and_then(isid_value))
        .collect();
    ensure!(old.len() == 1, "{old:?}");
    t.relogin(Node::A)?;
    t.settle()?;
    let report = doctor(&t, KEY_A, t.node(Node::A).devices(), 1)?;
    let lu = &lus(&report)[0];
    let orphans: Vec<&Value> = lu["registrations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["orphan"] == true)
        .collect();
    ensure!(orphans.len() == 1, "{lu}");
    let orphan_isid = orphans[0]["initiator"]
        .as_str()
        .and_then(|i| i.split_once(",i,"))
        .and_then(|(_, isid)| isid_value(isid));
    ensure!(orphan_isid == Some(old[0]), "{lu} vs old ISID {old:x?}");
    ensure!(
        problems(lu)
            .iter()
            .any(|p| p.contains("orphaned registration")),
        "{lu}"
    );
    ensure!(lu["paths"][0]["registration"] == "not_registered", "{lu}");
    // A's key is on the arbiter only through the orphan: `fence` from A would fail there.
    ensure!(report["can_fence"] == false, "{report}");
    Ok(())
}
