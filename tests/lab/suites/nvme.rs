//! prfence on NVMe namespaces (issue #13), proven on Linux's NVMe target: nvmet with reservations
//! over nvme-loop, on a newer Debian suite's kernel (Debian 12's 6.1 has neither nvme-loop nor
//! nvmet reservations). Every verdict comes from the target: the Reservation Report a third host
//! reads, and whether a node's O_DIRECT write is accepted. Run: `cargo test --test lab_nvme` (root).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::WORK;
use crate::agent::{
    AgentProcess as NodeAgent, FENCED_EXIT, LeaseTimings, hook_line, lease_config, read_hook,
    watch_config,
};
use crate::fence_agents::{self, FenceAgent, derived_key, fake_cmapctl};
use crate::node::{self, fence, hex, prfence_expect, unfence};
use crate::nvme::{NvmeHost, NvmeTopology, NvmetReport, ReservationCounter};
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::race;
use crate::{Node, WriteOutcome, Writer};
use anyhow::{Context, ensure};
use nix::sys::signal::Signal;
use serde_json::Value;

/// Several namespaces, so the arbiter (the first by identifier) has others behind it.
const NAMESPACES: usize = 4;
/// Mutual-fence rounds in CI; the long tier runs [`LONG_RACE_ROUNDS`] (`LAB_RACE_ROUNDS`
/// overrides either).
const RACE_ROUNDS: usize = 5;
const LONG_RACE_ROUNDS: usize = 20;
/// NVMe's reservation type codes as the target reports them.
const NVME_WRITE_EXCLUSIVE_REG_ONLY: u8 = 3;
/// What a fence from the holder leaves on nvmet: prfence preempts under the all-registrants twin
/// of WE-RO there, because nvmet ignores the PRKEY of a holder's PREEMPT (engine/src/nvme.rs).
const NVME_WRITE_EXCLUSIVE_ALL_REGS: u8 = 5;

pub const SUITE: Suite = Suite {
    name: "nvme",
    kernel: GuestKernel::Suite("unstable"),
    package: true,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(12 * 60),
    usual: Duration::from_secs(139),
    tests: crate::tests![
        the_oracle_sees_nvmet_refuse_a_preempted_host,
        single_commands_act_on_the_namespace,
        reports_name_hosts_and_say_what_nvme_lacks,
        fence_refuses_the_frozen_writer,
        reservation_commands_per_namespace_at_the_minimum,
        mutual_fence_race_has_one_survivor,
        fence_pr_on_off_status,
        watch_agent_self_fences_and_never_reregisters,
        lease_takeover_refuses_the_frozen_holder,
        privileges_reads_need_the_group_changes_need_cap_sys_admin,
        a_hung_tcp_path_ends_every_command_within_its_budget,
        the_units_capabilities_watch_and_the_nvme_drop_in_changes,
    ],
    long: crate::tests![mutual_fence_race_twenty_rounds],
    reproducers: &[],
};

/// `prfence args… [--json] devices…` as `node`, requiring exit status `code`.
fn prfence_on(devices: &[String], args: &[&str], code: i32) -> anyhow::Result<crate::CommandRun> {
    crate::prfence(
        args.iter()
            .copied()
            .chain(devices.iter().map(String::as_str)),
    )?
    .exited_with(code)
}

fn one(t: &NvmeTopology, node: Node, index: usize) -> Vec<String> {
    vec![t.device(NvmeHost::Node(node), index).display().to_string()]
}

/// The oracle and the target without prfence: nvme-cli registers both nodes and B preempts A.
/// The observer's report must show exactly that, and A's write must be refused — the lab can
/// tell a fenced node from a live one before prfence is judged by it.
fn the_oracle_sees_nvmet_refuse_a_preempted_host() -> anyhow::Result<()> {
    let t = NvmeTopology::new(1)?;
    let ns = &t.namespaces()[0];
    let nvme = |node: Node, args: &[&str]| -> anyhow::Result<()> {
        let mut all = vec![
            args[0].to_owned(),
            t.device(NvmeHost::Node(node), 0).display().to_string(),
        ];
        all.push(format!("--namespace-id={}", ns.nsid));
        all.extend(args[1..].iter().map(|a| (*a).to_owned()));
        crate::run("nvme", all)?.ok()?;
        Ok(())
    };
    nvme(Node::A, &["resv-register", "--nrkey=0xa", "--rrega=0"])?;
    nvme(Node::B, &["resv-register", "--nrkey=0xb", "--rrega=0"])?;
    nvme(
        Node::A,
        &["resv-acquire", "--crkey=0xa", "--rtype=3", "--racqa=0"],
    )?;
    let before = t.report(0)?;
    ensure!(before.keys() == [0xa, 0xb], "{before:?}");
    ensure!(
        before.holder() == Some(NvmeHost::Node(Node::A)),
        "{before:?}"
    );
    ensure!(t.write_probe(Node::B, 0, 1) == WriteOutcome::Accepted);
    nvme(
        Node::B,
        &[
            "resv-acquire",
            "--crkey=0xb",
            "--prkey=0xa",
            "--rtype=3",
            "--racqa=1",
        ],
    )?;
    let after = t.report(0)?;
    ensure!(after.keys() == [0xb], "{after:?}");
    ensure!(after.holder() == Some(NvmeHost::Node(Node::B)), "{after:?}");
    ensure!(
        after.generation > before.generation,
        "{before:?} → {after:?}"
    );
    let refused = t.write_probe(Node::A, 0, 1);
    ensure!(refused == WriteOutcome::Refused, "A's write: {refused:?}");
    Ok(())
}

/// keys, reservation, register, reserve, preempt, release, unregister and clear on one namespace,
/// each judged on the observer's report; the read commands must agree with it.
fn single_commands_act_on_the_namespace() -> anyhow::Result<()> {
    let t = NvmeTopology::new(1)?;
    let (a, b) = (one(&t, Node::A, 0), one(&t, Node::B, 0));

    prfence_on(&a, &["register", "--key", "0xa"], 0)?;
    prfence_on(&b, &["register", "--key", "0xb"], 0)?;
    // registering the same key again converges (P4)
    prfence_on(&b, &["register", "--ignore-existing", "--key", "0xb"], 0)?;
    ensure!(t.report(0)?.keys() == [0xa, 0xb], "{:?}", t.report(0)?);

    prfence_on(&a, &["reserve", "--key", "0xa", "--type", "wero"], 0)?;
    let report = t.report(0)?;
    ensure!(report.rtype == NVME_WRITE_EXCLUSIVE_REG_ONLY, "{report:?}");
    ensure!(
        report.holder() == Some(NvmeHost::Node(Node::A)),
        "{report:?}"
    );

    // What prfence reads through B is what the target reports.
    let keys = prfence_on(&b, &["keys", "--json"], 0)?.json()?;
    let listed: Vec<&str> = keys[0]["keys"]
        .as_array()
        .or_else(|| keys["keys"].as_array())
        .context("no keys in the JSON")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ensure!(
        listed == ["0x000000000000000a", "0x000000000000000b"],
        "prfence keys: {keys}"
    );
    let reservation = prfence_on(&b, &["reservation", "--json"], 0)?.json()?;
    let held = reservation
        .get(0)
        .unwrap_or(&reservation)
        .get("reservation")
        .cloned()
        .unwrap_or(Value::Null);
    ensure!(
        held["key"] == "0x000000000000000a" && held["type"] == "wero",
        "prfence reservation: {reservation}"
    );

    // B preempts A: A's registration and reservation are gone, its writes refused.
    prfence_on(
        &b,
        &["preempt", "--key", "0xb", "--victim", "0xa", "--abort"],
        0,
    )?;
    let report = t.report(0)?;
    ensure!(report.keys() == [0xb], "{report:?}");
    ensure!(
        report.holder() == Some(NvmeHost::Node(Node::B)),
        "{report:?}"
    );
    ensure!(t.write_probe(Node::A, 0, 1) == WriteOutcome::Refused);
    ensure!(t.write_probe(Node::B, 0, 1) == WriteOutcome::Accepted);

    // Release, then unregister: nothing of B's remains.
    prfence_on(&b, &["release", "--key", "0xb", "--type", "wero"], 0)?;
    ensure!(t.report(0)?.rtype == 0, "{:?}", t.report(0)?);
    prfence_on(&b, &["unregister", "--key", "0xb"], 0)?;
    ensure!(t.report(0)?.keys().is_empty(), "{:?}", t.report(0)?);

    // Clear drops every registration and the reservation.
    prfence_on(&a, &["register", "--key", "0xa"], 0)?;
    prfence_on(&b, &["register", "--key", "0xb"], 0)?;
    prfence_on(&a, &["reserve", "--key", "0xa"], 0)?;
    prfence_on(&b, &["clear", "--key", "0xb"], 0)?;
    let report = t.report(0)?;
    ensure!(report.keys().is_empty() && report.rtype == 0, "{report:?}");
    // A key that is not registered is refused, with the target's word for it.
    let refused = crate::prfence(["reserve", "--key", "0xa", a[0].as_str()])?;
    ensure!(
        refused.code() != 0 && refused.stderr.to_lowercase().contains("conflict"),
        "reserve with an unregistered key: exit {}: {}",
        refused.code(),
        refused.stderr
    );
    ensure!(t.report(0)?.rtype == 0, "{:?}", t.report(0)?);
    Ok(())
}

/// The read-only reports on NVMe: `full-status` names each registrant by its host ID (what nvmet
/// registers), `capabilities` comes from Identify Namespace (the types nvmet supports) and says
/// what NVMe has no notion of, `doctor` finds A ready to fence; REGISTER AND MOVE is refused in
/// plain words. Each is compared with the observer's report.
fn reports_name_hosts_and_say_what_nvme_lacks() -> anyhow::Result<()> {
    let t = NvmeTopology::new(2)?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    // An unfence reads the registrants' host IDs first: A's own registration is A's (a rerun
    // converges, P4), while B with A's key registers nowhere (two hosts must not share a key).
    unfence(&t, Node::A)?;
    let before = t.report(0)?;
    let (refused, _) = prfence_expect(&t, Node::B, &["unfence", "--key", &hex(Node::A.key())], 1)?;
    let a_id = NvmeHost::Node(Node::A).host_id();
    ensure!(
        format!("{}{}", refused.stdout, refused.stderr).contains(a_id)
            && t.report(0)?.keys() == before.keys(),
        "B's unfence with A's key: {}{}; the target before {before:?}, after {:?}",
        refused.stdout,
        refused.stderr,
        t.report(0)?
    );
    let a = one(&t, Node::A, 0);

    let full = prfence_on(&a, &["full-status", "--json"], 0)?.json()?;
    println!("  full-status: {full}");
    let text = full.to_string();
    for node in Node::BOTH {
        let id = NvmeHost::Node(node).host_id();
        ensure!(text.contains(id), "full-status does not name {id}: {full}");
    }
    let report = t.report(0)?;
    ensure!(
        text.matches("nvme-hostid:").count() == report.registrants.len(),
        "full-status lists other registrants than the target's {report:?}: {full}"
    );

    let text_caps = prfence_on(&a, &["capabilities"], 0)?;
    println!("  capabilities:\n{}", text_caps.stdout.trim_end());
    ensure!(
        text_caps.stdout.contains("NVMe has no REPORT CAPABILITIES"),
        "capabilities on NVMe do not say where they come from:\n{}",
        text_caps.stdout
    );
    let caps = prfence_on(&a, &["capabilities", "--json"], 0)?;
    let caps = caps.json()?;
    let types = caps.get(0).unwrap_or(&caps)["capabilities"]["types"].to_string();
    for short in ["we", "ea", "wero", "earo", "wear", "eaar"] {
        ensure!(
            types.contains(&format!("\"{short}\"")),
            "capabilities lack {short}: {caps}"
        );
    }

    let doctor = crate::prfence(
        ["doctor", "--key", "0xa", "--json"]
            .into_iter()
            .chain(t.node_args(Node::A).iter().map(String::as_str)),
    )?;
    println!(
        "  doctor (exit {}): {}",
        doctor.code(),
        doctor.stdout.trim()
    );
    let verdict = doctor.json()?;
    ensure!(
        doctor.code() == 0 && verdict["ready"] == true,
        "doctor on NVMe: exit {}: {}{}",
        doctor.code(),
        doctor.stdout,
        doctor.stderr
    );

    let moved = crate::prfence([
        "register-move",
        "--key",
        "0xa",
        "--new-key",
        "0xc",
        "--transport-id",
        "iqn.2026-12.org.prfence.lab:nobody",
        "--relative-target-port",
        "1",
        a[0].as_str(),
    ])?;
    let said = format!("{}{}", moved.stdout, moved.stderr);
    ensure!(
        moved.code() != 0 && said.contains("NVMe has no REGISTER AND MOVE"),
        "register-move on NVMe: exit {}: {said}",
        moved.code()
    );
    ensure!(
        t.report(0)? == report,
        "a refused REGISTER AND MOVE changed the namespace"
    );
    Ok(())
}

/// The target's verdict after `survivor` won: on every namespace only its key is registered, by
/// its host, and it holds a Write Exclusive reservation that lets registrants write (Registrants
/// Only, or All Registrants after a fence from the holder); the loser's O_DIRECT writes are
/// refused everywhere and the survivor's accepted.
fn assert_sole_survivor(
    t: &NvmeTopology,
    survivor: Node,
    reports: &[NvmetReport],
) -> anyhow::Result<()> {
    for (index, report) in reports.iter().enumerate() {
        ensure!(
            !report.registrants.is_empty()
                && report.registrants.iter().all(|r| {
                    r.key == survivor.key() && r.host == Some(NvmeHost::Node(survivor))
                }),
            "namespace {index}: registrants are not node {}'s alone: {report:?}",
            survivor.letter()
        );
        ensure!(
            [NVME_WRITE_EXCLUSIVE_REG_ONLY, NVME_WRITE_EXCLUSIVE_ALL_REGS].contains(&report.rtype)
                && report.holder() == Some(NvmeHost::Node(survivor)),
            "namespace {index}: not held WE-RO or WE-AR by node {}: {report:?}",
            survivor.letter()
        );
    }
    for index in 0..reports.len() {
        let refused = t.write_probe(survivor.other(), index, 2);
        ensure!(
            refused == WriteOutcome::Refused,
            "namespace {index}: the fenced node's write {refused:?}"
        );
        let accepted = t.write_probe(survivor, index, 2);
        ensure!(
            accepted == WriteOutcome::Accepted,
            "namespace {index}: the survivor's write {accepted:?}"
        );
    }
    Ok(())
}

/// P1, the seed's phantom write on NVMe: A writes a counter, is frozen (a paused holder), B fences
/// it; once thawed, A's next write must be refused by the target, on every namespace.
fn fence_refuses_the_frozen_writer() -> anyhow::Result<()> {
    let t = NvmeTopology::new(NAMESPACES)?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    let unfenced = t.reports()?;
    for (index, report) in unfenced.iter().enumerate() {
        ensure!(report.keys() == [0xa, 0xb], "namespace {index}: {report:?}");
    }
    let writer = Writer::start("A", t.devices(NvmeHost::Node(Node::A)), 3, |_| {})?;
    for _ in 0..NAMESPACES {
        let line = writer.next_line(Duration::from_secs(10))?;
        ensure!(
            line.starts_with("wrote "),
            "A's write before the fence: {line}"
        );
    }
    writer.signal(Signal::SIGSTOP)?;
    let start = Instant::now();
    fence(&t, Node::B, 0)?;
    let fenced_in = start.elapsed();
    let reports = t.reports()?;
    assert_sole_survivor(&t, Node::B, &reports)?;
    // `status` reads what the target says: A's key on no namespace (2), B's on all (0).
    prfence_on(&t.node_args(Node::A), &["status", "--key", "0xa"], 2)?;
    prfence_on(&t.node_args(Node::B), &["status", "--key", "0xb"], 0)?;
    writer.signal(Signal::SIGCONT)?;
    // The freeze may have caught the loop after a write completed but before it said so: that
    // one line may still say "wrote" (its write landed before the fence). The next must fail.
    let mut line = writer.next_line(Duration::from_secs(10))?;
    if line.starts_with("wrote ") {
        line = writer.next_line(Duration::from_secs(10))?;
    }
    ensure!(line.contains("FAILED"), "A's write after the fence: {line}");
    println!(
        "  fence over {NAMESPACES} namespaces took {} ms; A after the thaw: {line}",
        fenced_in.as_millis()
    );
    Ok(())
}

/// Issue 24 on NVMe, counted by the target (nvmet's trace event for every command it takes in,
/// [`ReservationCounter`]) with one controller per node. `status`: at most 2 Reservation commands
/// per namespace, as on SCSI. `fence`: the SCSI bounds (the fence suite's
/// `commands_per_lu_at_the_minimum`: 3 on each namespace but the arbiter, 4 on the arbiter, one
/// more for the greater key's tie-break read). The transport reads once after its PREEMPT (did
/// the victim go? nvmet ignores the victim's key in a PREEMPT from the reservation holder); that
/// Report is the fence's verification, so it costs nothing more, except when the fencer holds
/// the reservation: then the victim is still there, the two Acquires of the all-registrants twin
/// follow (`exec/nvme.rs`), and the verification is a Report of its own, 3 more. The victim's
/// key must be gone from every namespace.
fn reservation_commands_per_namespace_at_the_minimum() -> anyhow::Result<()> {
    let t = NvmeTopology::new(NAMESPACES)?;
    let counter = ReservationCounter::start()?;
    // The arbiter is the first LU by identifier: the wwid `uuid.<uuid>`.
    let arbiter = t
        .namespaces()
        .iter()
        .min_by_key(|ns| ns.uuid.to_ascii_lowercase())
        .context("no namespace")?
        .nsid;
    let per_namespace = |counts: &BTreeMap<u32, BTreeMap<String, u64>>| -> Vec<(u32, u64)> {
        t.namespaces()
            .iter()
            .map(|ns| {
                (
                    ns.nsid,
                    counts.get(&ns.nsid).map_or(0, |c| c.values().sum()),
                )
            })
            .collect()
    };
    // A unfences first and so holds the reservation when it fences; B only registers.
    for fencer in [Node::A, Node::B] {
        unfence(&t, Node::A)?;
        unfence(&t, Node::B)?;
        let holds = t.report(0)?.holder() == Some(NvmeHost::Node(fencer));
        counter.take()?;
        prfence_on(
            &t.node_args(fencer),
            &["status", "--key", &hex(fencer.key())],
            0,
        )?;
        let status_by_command = counter.take()?;
        fence(&t, fencer, 0)?;
        let fenced_by_command = counter.take()?;
        let (status, fenced) = (
            per_namespace(&status_by_command),
            per_namespace(&fenced_by_command),
        );
        for (index, report) in t.reports()?.iter().enumerate() {
            ensure!(
                report.keys() == [fencer.key()],
                "namespace {index}: after node {}'s fence: {report:?}",
                fencer.letter()
            );
        }
        let greater = fencer.key() > fencer.other().key();
        println!(
            "  Reservation commands per namespace (nvmet's trace, nsid: count), node {} ({} key, \
             {}) fences node {}: status {status:?}; fence {fenced:?}, arbiter nsid {arbiter}; \
             fence by command {fenced_by_command:?}",
            fencer.letter(),
            if greater { "greater" } else { "smaller" },
            if holds { "holder" } else { "not the holder" },
            fencer.other().letter(),
        );
        ensure!(
            status.iter().all(|&(_, n)| n <= 2),
            "node {}: status took {status:?} commands per namespace (at most 2)",
            fencer.letter()
        );
        let extra = if holds { 3 } else { 0 };
        let (follower_most, arbiter_most) = (3 + extra, 4 + u64::from(greater) + extra);
        ensure!(
            fenced.iter().all(|&(nsid, n)| if nsid == arbiter {
                n <= arbiter_most
            } else {
                n <= follower_most
            }),
            "node {}: fence took {fenced:?} commands (at most {arbiter_most} on the arbiter, nsid \
             {arbiter}, and {follower_most} on the others)",
            fencer.letter()
        );
    }
    Ok(())
}

/// P2 on NVMe: A and B unfence, then fence each other at the same moment, [`RACE_ROUNDS`] times:
/// every round one exits 0 and the other 4, and the target shows that one alone on every
/// namespace.
fn mutual_fence_race_has_one_survivor() -> anyhow::Result<()> {
    mutual_fence_race(crate::env_count("LAB_RACE_ROUNDS", RACE_ROUNDS)?)
}

/// Long tier: the same race, [`LONG_RACE_ROUNDS`] times (about 6 s a round under emulation).
fn mutual_fence_race_twenty_rounds() -> anyhow::Result<()> {
    mutual_fence_race(crate::env_count("LAB_RACE_ROUNDS", LONG_RACE_ROUNDS)?)
}

fn mutual_fence_race(rounds: usize) -> anyhow::Result<()> {
    let t = NvmeTopology::new(NAMESPACES)?;
    let mut winners: BTreeMap<char, usize> = BTreeMap::new();
    let mut times = Vec::new();
    let mut twin_rounds = 0;
    let mut last_winner: Option<Node> = None;
    for round in 1..=rounds {
        // Every round from a bare namespace: A unfences first and holds WE-RO, so A's fence is a
        // holder's, the case nvmet gets wrong (engine/src/nvme.rs), and B's is a registrant's.
        if let Some(node) = last_winner {
            let k = hex(node.key());
            prfence_on(&t.node_args(node), &["clear", "--key", &k], 0)?;
        }
        unfence(&t, Node::A)?;
        unfence(&t, Node::B)?;
        ensure!(
            t.reports()?
                .iter()
                .all(|r| r.rtype == NVME_WRITE_EXCLUSIVE_REG_ONLY
                    && r.holder() == Some(NvmeHost::Node(Node::A))),
            "round {round}: A does not hold WE-RO everywhere after the unfences"
        );
        let start = Instant::now();
        let outputs = race::both_at_once(&t, node::fence_args)?;
        let elapsed = start.elapsed();
        let why = || race::exits(&outputs);
        let winner = race::winner(&outputs).with_context(|| format!("round {round}"))?;
        let reports = t.reports()?;
        assert_sole_survivor(&t, winner, &reports)
            .with_context(|| format!("round {round}: split after the race:{}", why()))?;
        let all_registrants = reports
            .iter()
            .filter(|r| r.rtype == NVME_WRITE_EXCLUSIVE_ALL_REGS)
            .count();
        twin_rounds += usize::from(winner == Node::A && all_registrants == reports.len());
        println!(
            "  round {round:>3}: node {} survived, both fences done in {} ms, {all_registrants} \
             namespace(s) left WE-AR",
            winner.letter(),
            elapsed.as_millis()
        );
        *winners.entry(winner.letter()).or_default() += 1;
        last_winner = Some(winner);
        times.push(elapsed);
    }
    times.sort();
    println!(
        "  {rounds} rounds: winners {winners:?}, {twin_rounds} won by the holder (left WE-AR); round \
         time min {} ms, median {} ms, max {} ms",
        times.first().map_or(0, Duration::as_millis),
        times.get(times.len() / 2).map_or(0, Duration::as_millis),
        times.last().map_or(0, Duration::as_millis)
    );
    Ok(())
}

/// fence_pr with fence_scsi's parameters and keys on NVMe: `on` registers the node's derived key
/// on every namespace, `monitor` finds it there, `status` tells registered (0) from not (2), `off`
/// of the other node removes its key everywhere and its writes are refused; the fenced node's
/// `on` is refused until it reboots.
fn fence_pr_on_off_status() -> anyhow::Result<()> {
    // The nodes' key stores, from none (a fresh boot) to none, even when the test fails half-way.
    for node in [Node::A, Node::B] {
        fence_agents::reboot(node)?;
    }
    let _key_stores = crate::RemoveOnDrop::all(
        [Node::A, Node::B]
            .into_iter()
            .flat_map(fence_agents::store_files),
    );
    let t = NvmeTopology::new(NAMESPACES)?;
    fake_cmapctl()?;
    let (ka, kb) = (derived_key(Node::A)?, derived_key(Node::B)?);
    let devices = |node: Node| -> Vec<PathBuf> { t.devices(NvmeHost::Node(node)).to_vec() };
    let agent = |node: Node, action: &str, target: Node, code: i32| {
        fence_agents::expect(
            FenceAgent::FencePr,
            node,
            action,
            target,
            &devices(node),
            code,
        )
    };
    agent(Node::A, "status", Node::A, 2)?;
    agent(Node::A, "on", Node::A, 0)?;
    // monitor, as fence_scsi's: the devices answer and this node's key (written by `on`) is on them
    agent(Node::A, "monitor", Node::A, 0)?;
    agent(Node::B, "on", Node::B, 0)?;
    for (index, report) in t.reports()?.iter().enumerate() {
        let mut want = vec![ka, kb];
        want.sort_unstable();
        ensure!(
            report.keys() == want,
            "namespace {index} after both on: {report:?}"
        );
    }
    agent(Node::A, "status", Node::A, 0)?;
    agent(Node::A, "status", Node::B, 0)?;
    agent(Node::B, "off", Node::A, 0)?;
    for (index, report) in t.reports()?.iter().enumerate() {
        ensure!(
            report.keys() == [kb]
                && report
                    .registrants
                    .iter()
                    .all(|r| r.host == Some(NvmeHost::Node(Node::B))),
            "namespace {index} after B's off of A: {report:?}"
        );
        ensure!(
            report.rtype != 0,
            "namespace {index} is not reserved: {report:?}"
        );
        let refused = t.write_probe(Node::A, index, 4);
        ensure!(
            refused == WriteOutcome::Refused,
            "namespace {index}: A's write {refused:?}"
        );
    }
    agent(Node::B, "status", Node::A, 2)?;
    agent(Node::B, "status", Node::B, 0)?;
    // off again converges (P4)
    agent(Node::B, "off", Node::A, 0)?;
    // A's `on` in the same boot, as Pacemaker may run it on a node it has just fenced, is refused
    // (P3): A registered on these namespaces in this boot and its key was preempted since.
    let refused = agent(Node::A, "on", Node::A, 1)?;
    ensure!(
        refused.stderr.contains("THIS NODE WAS FENCED"),
        "A's refused `on` says why: {}",
        refused.stderr
    );
    for (index, report) in t.reports()?.iter().enumerate() {
        ensure!(
            report.keys() == [kb],
            "namespace {index} after A's refused on: {report:?}"
        );
        let refused = t.write_probe(Node::A, index, 5);
        ensure!(
            refused == WriteOutcome::Refused,
            "namespace {index}: A's write after its refused on: {refused:?}"
        );
    }
    // After a reboot A's own `on` is the way back.
    fence_agents::reboot(Node::A)?;
    agent(Node::A, "on", Node::A, 0)?;
    agent(Node::A, "status", Node::A, 0)?;
    Ok(())
}

/// The watch-mode agent on NVMe: A's agent watches its key on every namespace; B fences A; the
/// agent must run its self-fence hook and exit 86, and a restarted agent must not bring the key
/// back (P3): the target shows none of A's registrations and refuses A's writes throughout.
fn watch_agent_self_fences_and_never_reregisters() -> anyhow::Result<()> {
    let t = NvmeTopology::new(NAMESPACES)?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    std::fs::create_dir_all(WORK)?;
    let hook = PathBuf::from(format!("{WORK}/hook-nvme-fenced"));
    let _ = std::fs::remove_file(&hook);
    let config = watch_config(
        t.devices(NvmeHost::Node(Node::A)),
        "0xa",
        1000,
        "grace = \"5s\"\nmissing_confirmations = 1",
        &hook_line(&hook),
        "",
    );
    let mut agent = NodeAgent::start("nvme-watch-a", &config)?;
    agent.wait_state("healthy", Duration::from_secs(60))?;
    std::thread::sleep(Duration::from_secs(2));
    ensure!(agent.state() == "healthy", "agent: {}", agent.state());

    fence(&t, Node::B, 0)?;
    let code = agent.wait_exit(Duration::from_secs(20))?;
    ensure!(
        code == FENCED_EXIT,
        "agent exited {code}:\n{}",
        agent.log_tail()
    );
    read_hook(&hook)?;

    let mut again = NodeAgent::start("nvme-watch-a-again", &config)?;
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        for (index, report) in t.reports()?.iter().enumerate() {
            ensure!(
                !report.registers(NvmeHost::Node(Node::A)),
                "namespace {index}: A registered again (agent {}): {report:?}",
                again.state()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "  restarted agent for 8 s: {}; A's key absent on the target throughout",
        again
            .exited()
            .map_or_else(|| again.state(), |c| format!("exited {c}"))
    );
    for index in 0..NAMESPACES {
        let probe = t.write_probe(Node::A, index, 5);
        ensure!(
            probe == WriteOutcome::Refused,
            "namespace {index}: A's write {probe:?}"
        );
    }
    Ok(())
}

/// Lease mode on NVMe: A's agent holds namespace 0 and writes; A (agent and writer) is frozen; B's
/// standby agent takes over after the lease; the target shows B holding and A's key gone; thawed,
/// A's writer is refused by the target and A's agent self-fences (exit 86).
fn lease_takeover_refuses_the_frozen_holder() -> anyhow::Result<()> {
    let t = NvmeTopology::new(1)?;
    let timings = LeaseTimings {
        check_interval: 500,
        command_timeout: 1000,
        renew: 1000,
        lease: 4000,
        margin: 1500,
        hook_timeout: 1000,
    };
    std::fs::create_dir_all(WORK)?;
    let hook_a = PathBuf::from(format!("{WORK}/hook-nvme-lease-a"));
    let _ = std::fs::remove_file(&hook_a);
    let mut a = NodeAgent::start(
        "nvme-lease-a",
        &lease_config(
            1,
            t.device(NvmeHost::Node(Node::A), 0),
            timings,
            Some(&hook_a),
        ),
    )?;
    a.wait_state("holder", Duration::from_secs(60))?;
    ensure!(
        t.report(0)?.holder() == Some(NvmeHost::Node(Node::A)),
        "A is not the holder on the target: {:?}",
        t.report(0)?
    );
    let mut b = NodeAgent::start(
        "nvme-lease-b",
        &lease_config(2, t.device(NvmeHost::Node(Node::B), 0), timings, None),
    )?;
    b.wait_state("standby", Duration::from_secs(60))?;

    let writer = Writer::start("A", &t.devices(NvmeHost::Node(Node::A))[..1], 6, |_| {})?;
    for _ in 0..3 {
        let line = writer.next_line(Duration::from_secs(10))?;
        ensure!(line.starts_with("wrote "), "A's write as holder: {line}");
    }
    writer.signal(Signal::SIGSTOP)?;
    a.signal(Signal::SIGSTOP)?;
    let frozen = Instant::now();
    let handover = loop {
        if t.report(0)?.holder() == Some(NvmeHost::Node(Node::B)) {
            break frozen.elapsed();
        }
        ensure!(
            frozen.elapsed() < Duration::from_secs(30),
            "B did not take over within 30 s:\n{}",
            b.log_tail()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let report = t.report(0)?;
    ensure!(
        !report.registers(NvmeHost::Node(Node::A)),
        "A's key is still registered after the takeover: {report:?}"
    );
    b.wait_state("holder", Duration::from_secs(10))?;
    ensure!(t.write_probe(Node::B, 0, 7) == WriteOutcome::Accepted);

    writer.signal(Signal::SIGCONT)?;
    a.signal(Signal::SIGCONT)?;
    let mut line = writer.next_line(Duration::from_secs(10))?;
    if line.starts_with("wrote ") {
        line = writer.next_line(Duration::from_secs(10))?;
    }
    ensure!(
        line.contains("FAILED"),
        "A's write after the takeover: {line}"
    );
    let code = a.wait_exit(Duration::from_secs(20))?;
    ensure!(
        code == FENCED_EXIT,
        "A's agent exited {code}:\n{}",
        a.log_tail()
    );
    read_hook(&hook_a)?;
    ensure!(
        t.report(0)?.holder() == Some(NvmeHost::Node(Node::B)),
        "B lost the namespace: {:?}",
        t.report(0)?
    );
    println!(
        "  B held the namespace {} ms after A froze (lease 4 s); A's thawed write: {line}",
        handover.as_millis()
    );
    Ok(())
}

/// What docs/nvme.md says an admin needs on NVMe: an unprivileged user in the device's group reads
/// keys and the reservation (Linux 6.19 allows the IOC_PR_READ_* ioctls on a read-only open); changing
/// a reservation needs CAP_SYS_ADMIN (CAP_SYS_RAWIO, which SCSI needs, is not enough) and is
/// refused, named, with nothing changed on the target; with CAP_SYS_ADMIN `unfence` works.
fn privileges_reads_need_the_group_changes_need_cap_sys_admin() -> anyhow::Result<()> {
    let t = NvmeTopology::new(2)?;
    unfence(&t, Node::B)?;
    // No udev in the guest: give A's nodes what udev gives a disk (root:disk 0660).
    let group = crate::run("getent", ["group", "disk"])?.ok()?.stdout;
    let disk_gid = group
        .trim()
        .split(':')
        .nth(2)
        .context("no group `disk`")?
        .to_owned();
    for device in t.node_args(Node::A) {
        crate::run("chgrp", [disk_gid.as_str(), &device])?.ok()?;
        crate::run("chmod", ["0660", &device])?.ok()?;
    }
    // unfence records its LUs in fence_pr's store: one nobody can write.
    let store = crate::node::nobody_store()?;
    let as_nobody = |caps: &str, args: &[&str]| -> anyhow::Result<crate::CommandRun> {
        let mut cmd = Command::new("setpriv");
        cmd.env("FENCE_PR_STORE", &store)
            .args(["--reuid=65534", "--regid=65534"])
            .arg(format!("--groups={disk_gid}"))
            .arg(format!("--inh-caps=-all{caps}"))
            .arg(format!("--ambient-caps=-all{caps}"))
            .arg("--")
            .arg(crate::PRFENCE)
            .args(args)
            .args(t.node_args(Node::A));
        let run = crate::run_command(&mut cmd)?;
        println!(
            "  nobody +disk{caps}: prfence {} -> exit {}",
            args.join(" "),
            run.code()
        );
        Ok(run)
    };
    for read in [["keys", "--json"], ["reservation", "--json"]] {
        let run = as_nobody("", &read)?;
        ensure!(
            run.code() == 0 && run.stdout.contains("0x000000000000000b"),
            "`prfence {}` as nobody in group disk: exit {}\n{}{}",
            read.join(" "),
            run.code(),
            run.stdout,
            run.stderr
        );
    }
    for caps in ["", ",+sys_rawio"] {
        let run = as_nobody(caps, &["unfence", "--key", "0xa"])?;
        let said = format!("{}{}", run.stdout, run.stderr);
        ensure!(
            run.code() != 0 && said.contains("CAP_SYS_ADMIN"),
            "`prfence unfence` as nobody{caps}: exit {}, output:\n{said}",
            run.code()
        );
        println!("    says: {}", said.lines().next().unwrap_or_default());
    }
    for (index, report) in t.reports()?.iter().enumerate() {
        ensure!(
            report.keys() == [0xb],
            "namespace {index}: a refused unfence changed it: {report:?}"
        );
    }
    let run = as_nobody(",+sys_admin", &["unfence", "--key", "0xa"])?;
    ensure!(
        run.code() == 0,
        "unfence with CAP_SYS_ADMIN: exit {}\n{}{}",
        run.code(),
        run.stdout,
        run.stderr
    );
    for (index, report) in t.reports()?.iter().enumerate() {
        ensure!(
            report.keys() == [0xa, 0xb],
            "namespace {index} after unfence: {report:?}"
        );
    }
    Ok(())
}

/// Issue 23 item 4: the block PR ioctls carry no timeout of their own (the kernel's NVMe I/O
/// timeout, 30 s by default, is theirs). B's namespaces over NVMe/TCP hang (packets dropped);
/// A fences B through its own path meanwhile. B's `prfence keys --timeout 2` and `agent --once`
/// (command_timeout 1 s) each give their verdict within the budget they state, as on SCSI: the
/// command runs on a thread the caller stops waiting for. The exit may follow only when the
/// kernel gives the command up; that time is printed, not judged.
fn a_hung_tcp_path_ends_every_command_within_its_budget() -> anyhow::Result<()> {
    use super::faults::{
        MONITOR_BUDGET, POWER_TIMEOUT_S, Started, fence_pr_monitor_on, finish_all,
    };
    const TIMEOUT_S: u64 = 2;
    let t = NvmeTopology::new(2)?;
    let tcp = t.connect_tcp(NvmeHost::Node(Node::B))?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    let b_tcp: Vec<String> = tcp
        .devices()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    // Before the hang, B's TCP path answers: B's key is there.
    let keys = prfence_on(&b_tcp[..1], &["keys", "--json"], 0)?;
    ensure!(
        keys.stdout.contains("\"0x000000000000000b\""),
        "B's keys through TCP before the hang: {}",
        keys.stdout
    );
    let config = watch_config(
        tcp.devices(),
        "0xb",
        500,
        "grace = \"4s\"",
        "reboot = false",
        "",
    );
    std::fs::create_dir_all(WORK)?;
    let config_path = format!("{WORK}/nvme-hung.toml");
    std::fs::write(&config_path, &config)?;

    tcp.hang()?;
    let hung = Instant::now();
    let timeout = TIMEOUT_S.to_string();
    let mut keys_cmd = Command::new(crate::PRFENCE);
    keys_cmd.args(["keys", "--json", "--timeout", &timeout, &b_tcp[0]]);
    let mut once_cmd = Command::new(crate::PRFENCE);
    once_cmd.args(["agent", "--config", &config_path, "--once"]);
    let started = vec![
        Started::spawn("nvme-keys-b", &mut keys_cmd)?,
        Started::spawn("nvme-once-b", &mut once_cmd)?,
        Started::spawn(
            "nvme-monitor-b",
            &mut fence_pr_monitor_on(tcp.devices(), Node::B, 0xb)?,
        )?,
    ];
    // A's fence goes through A's own loop path, unaffected.
    fence(&t, Node::A, 0)?;
    let fenced_after = hung.elapsed();
    let [keys, once, monitor]: [super::faults::Ended; 3] =
        finish_all(started, Duration::from_secs(90))?
            .try_into()
            .map_err(|_| anyhow::anyhow!("three results expected"))?;
    crate::nvme::release_hang();
    for (index, report) in t.reports()?.iter().enumerate() {
        ensure!(
            report.registers(NvmeHost::Node(Node::A)) && !report.registers(NvmeHost::Node(Node::B)),
            "namespace {index} after A's fence: {report:?}"
        );
    }
    println!(
        "hung NVMe/TCP path: A's fence done {} after the hang; B: prfence keys verdict {} (exit \
         {:?} after {}), agent --once verdict {} (exit {:?} after {}), fence_pr monitor \
         (power_timeout={POWER_TIMEOUT_S}) exit {:?} after {}",
        crate::secs(fenced_after),
        crate::secs(keys.verdict_after()),
        keys.code,
        crate::secs(keys.elapsed),
        crate::secs(once.verdict_after()),
        once.code,
        crate::secs(once.elapsed),
        monitor.code,
        crate::secs(monitor.elapsed),
    );
    // Pacemaker's monitor timeout: fence_pr must have exited by then.
    monitor.expect(1, MONITOR_BUDGET)?;
    // A single command's budget: the open, then the command, each up to --timeout. Its report
    // says why: our deadline, or the kernel's cancel when nvme-tcp's keep-alive gave up first
    // (both seen: keep-alive failure ~3.5 s after the hang in some runs, later in others).
    keys.expect(1, Duration::from_secs(2 * TIMEOUT_S))?;
    ensure!(
        keys.printed.is_some()
            && (keys.stdout.contains("no result within the deadline")
                || keys.stdout.contains("cancelled by the kernel")),
        "prfence keys does not say the device hung: {}",
        keys.stdout
    );
    // --once: the check's budget, 3 × (command_timeout + 200 ms), well inside grace.
    once.expect(3, Duration::from_millis(3 * 1200))?;
    ensure!(
        once.stdout.contains("\"verdict\": \"unreadable"),
        "agent --once does not call the hung namespaces unreadable: {}",
        once.stdout
    );
    Ok(())
}

/// Issue 23 item 2: the packaged unit leaves the agent CAP_SYS_RAWIO and CAP_SYS_BOOT only. On
/// NVMe that is enough to watch (reading keys needs no capability from 6.19), not to change a
/// reservation; the documented drop-in adds CAP_SYS_ADMIN. Shown with `unregister_on_exit`, the
/// one PR OUT a watching agent sends on its own: under the unit's set the key stays on the target
/// after the stop (and the log says why), under the drop-in's it is gone.
fn the_units_capabilities_watch_and_the_nvme_drop_in_changes() -> anyhow::Result<()> {
    const UNIT: &[&str] = &["sys_rawio", "sys_boot"];
    const DROP_IN: &[&str] = &["sys_rawio", "sys_boot", "sys_admin"];
    let t = NvmeTopology::new(2)?;
    let config = format!(
        "unregister_on_exit = true\n{}",
        watch_config(
            t.devices(NvmeHost::Node(Node::A)),
            "0xa",
            500,
            "",
            "reboot = false",
            ""
        )
    );
    let mut left = Vec::new();
    for (name, caps) in [("nvme-caps-unit", UNIT), ("nvme-caps-drop-in", DROP_IN)] {
        unfence(&t, Node::A)?;
        let mut agent = NodeAgent::start_with_caps(name, &config, Some(caps))?;
        agent.wait_state("healthy", Duration::from_secs(60))?;
        agent.signal(Signal::SIGTERM)?;
        let code = agent.wait_exit(Duration::from_secs(20))?;
        let registered: Vec<bool> = t
            .reports()?
            .iter()
            .map(|r| r.registers(NvmeHost::Node(Node::A)))
            .collect();
        println!(
            "  {name} ({}): healthy, stopped with exit {code}; A registered after the stop: \
             {registered:?}",
            caps.join(" ")
        );
        left.push((name, code, registered, agent.log_tail()));
    }
    let (_, _, under_unit, unit_log) = &left[0];
    ensure!(
        under_unit.iter().all(|&r| r),
        "under the unit's capabilities the unregistration should have been refused: {under_unit:?}"
    );
    ensure!(
        unit_log.contains("CAP_SYS_ADMIN") || unit_log.contains("Operation not permitted"),
        "the refused unregistration is not explained in the log:\n{unit_log}"
    );
    let (_, code, under_drop_in, log) = &left[1];
    ensure!(
        *code == 0 && under_drop_in.iter().all(|&r| !r),
        "with the drop-in's CAP_SYS_ADMIN the stop should unregister: exit {code}, registered \
         {under_drop_in:?}\n{log}"
    );
    Ok(())
}
