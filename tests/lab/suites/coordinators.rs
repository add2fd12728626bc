//! Coordinator LUs (issue 47): `prfence fence --coordinator` decides on a majority of three
//! coordinators instead of the arbiter, so a fence still wins with one coordinator lost. Judged
//! on the target: the registrations LIO keeps and whether a node's write is accepted.
//!
//! Where the lab stands in: the two data LUs and the three coordinators are five LUNs of one LIO
//! target, where a cluster would put each coordinator on its own array. An array a node cannot
//! reach is its LUN taken out of that node's ACL ([`Topology::unmap_lun`]): the target answers
//! the node's commands there with LOGICAL UNIT NOT SUPPORTED, as a lost array answers nothing.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use serde_json::Value;

use crate::agent::{AgentProcess, SELF_FENCE_NO_RESET, watch_config};
use crate::node::hex;
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::race::{exits, spawn_both, survivor_writes_alone, winner};
use crate::{Node, Topology};
use crate::{PRFENCE, WORK};

/// The data LUNs, then the coordinators'.
const DATA: [usize; 2] = [0, 1];
const COORDINATORS: [usize; 3] = [2, 3, 4];
/// The LUNs of this suite's commands.
const SET: Set<'static> = Set {
    data: &DATA,
    coordinators: &COORDINATORS,
};
/// Mutual-fence rounds in CI (`LAB_RACE_ROUNDS` overrides it).
const RACE_ROUNDS: usize = 5;

const TESTS: &[crate::plan::Test] = crate::tests![
    a_majority_of_coordinators_decides_and_one_lost_does_not_stop_a_fence,
    fence_pr_takes_coordinators,
    doctor_checks_the_coordinator_set,
    the_agent_self_fences_on_a_majority_of_coordinators_lost,
    a_data_lu_out_of_reach_fails_the_fence_unless_reported,
];

pub const SUITE: Suite = Suite {
    name: "coordinators",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(6 * 60),
    usual: Duration::from_secs(100),
    tests: TESTS,
    long: crate::tests![mutual_fences_over_coordinators_a_hundred_rounds],
    reproducers: &[],
};

/// Which LUNs of a topology a coordinated command names (shared with the arrays suite).
#[derive(Clone, Copy, Debug)]
pub(super) struct Set<'a> {
    pub(super) data: &'a [usize],
    pub(super) coordinators: &'a [usize],
}

impl Set<'_> {
    /// Every LUN of the set, data first.
    pub(super) fn all(&self) -> impl Iterator<Item = usize> + '_ {
        self.data.iter().chain(self.coordinators).copied()
    }
}

/// `prfence VERB --json ARGS --coordinator C… DATA…` as `node`, on its own devices.
pub(super) fn command(t: &Topology, set: Set, node: Node, verb: &[&str]) -> Command {
    let mut cmd = Command::new(PRFENCE);
    cmd.args(verb).arg("--json");
    for &lun in set.coordinators {
        cmd.arg("--coordinator").arg(t.device(node, lun));
    }
    cmd.args(set.data.iter().map(|&lun| t.device(node, lun)));
    cmd
}

fn key_args(node: Node) -> [String; 2] {
    ["--key".into(), hex(node.key())]
}

/// Runs `prfence VERB` as `node` and returns its exit status and JSON report.
pub(super) fn run(
    t: &Topology,
    set: Set,
    node: Node,
    verb: &[&str],
) -> anyhow::Result<(i32, Value)> {
    let run = crate::run_command(&mut command(t, set, node, verb))?;
    println!(
        "  node {}: prfence {} -> exit {} in {} ms",
        node.letter(),
        verb.join(" "),
        run.code(),
        run.elapsed.as_millis()
    );
    let report: Value = serde_json::from_str(run.stdout.trim()).unwrap_or(Value::Null);
    ensure!(
        !report.is_null(),
        "node {}: `{}` printed no JSON report:\n{}{}",
        node.letter(),
        run.command,
        run.stdout,
        run.stderr
    );
    Ok((run.code(), report))
}

pub(super) fn unfence(t: &Topology, set: Set, node: Node, code: i32) -> anyhow::Result<Value> {
    let [k, key] = key_args(node);
    let (exit, report) = run(t, set, node, &["unfence", &k, &key])?;
    ensure!(
        exit == code,
        "node {}'s unfence exited {exit}, expected {code}: {report:#}",
        node.letter()
    );
    Ok(report)
}

/// `fence --key K --victim V`, plus `--tie-break SECS` when `LAB_RACE_TIE_BREAK` is set: by
/// default the greater key waits on each coordinator where both are registered, so the smaller
/// (A) wins every mutual fence (100 of 100 in the long tier); 0 lets the PREEMPTs race.
pub(super) fn fence_args(node: Node) -> Vec<String> {
    let [k, key] = key_args(node);
    let mut args = vec![
        "fence".into(),
        k,
        key,
        "--victim".into(),
        hex(node.other().key()),
    ];
    if let Ok(secs) = std::env::var("LAB_RACE_TIE_BREAK") {
        args.extend(["--tie-break".into(), secs]);
    }
    args
}

pub(super) fn fence(t: &Topology, set: Set, node: Node, code: i32) -> anyhow::Result<Value> {
    let args = fence_args(node);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (exit, report) = run(t, set, node, &args)?;
    ensure!(
        exit == code,
        "node {}'s fence exited {exit}, expected {code}: {report:#}",
        node.letter()
    );
    Ok(report)
}

/// Both nodes' `fence` of each other ([`fence_args`]) over `set`, started at once.
pub(super) fn fence_both(t: &Topology, set: Set) -> anyhow::Result<Vec<(Node, Output)>> {
    spawn_both(|node| {
        let args = fence_args(node);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        command(t, set, node, &args)
    })
}

/// The keys LIO holds on LUN `lun`, sorted, each once.
pub(super) fn keys(t: &Topology, lun: usize) -> anyhow::Result<Vec<u64>> {
    let mut keys: Vec<u64> = t.lu(lun).registrations()?.iter().map(|r| r.key).collect();
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

/// Both nodes' keys on every LUN (after both unfenced).
pub(super) fn both_everywhere(t: &Topology, set: Set) -> anyhow::Result<()> {
    let both = {
        let mut k = vec![Node::A.key(), Node::B.key()];
        k.sort_unstable();
        k
    };
    for lun in set.all() {
        ensure!(
            keys(t, lun)? == both,
            "LUN {lun} holds {:x?}",
            keys(t, lun)?
        );
    }
    Ok(())
}

/// The target after `survivor` won: on the data LUs its key alone, its reservation, the other
/// node's writes refused and its own accepted; on the set's coordinators (none: the data LUs
/// alone are judged) its key on a majority and never beside the loser's.
pub(super) fn survivor_alone(
    t: &Topology,
    set: Set,
    survivor: Node,
    block: u64,
) -> anyhow::Result<()> {
    let loser = survivor.other();
    for &lun in set.data {
        ensure!(
            keys(t, lun)? == [survivor.key()],
            "data LUN {lun} holds {:x?}, not node {}'s key alone",
            keys(t, lun)?,
            survivor.letter()
        );
        let holder = t.lu(lun).holder()?;
        ensure!(
            holder.as_ref().map(|h| &h.initiator) == Some(&t.node(survivor).initiator),
            "data LUN {lun} is held by {holder:?}, not node {}",
            survivor.letter()
        );
    }
    survivor_writes_alone(t, survivor, set.data.iter().copied(), block)?;
    let mut held = 0;
    for &lun in set.coordinators {
        let keys = keys(t, lun)?;
        ensure!(
            !(keys.contains(&survivor.key()) && keys.contains(&loser.key())),
            "coordinator LUN {lun} holds both keys after the fence: {keys:x?}"
        );
        held += usize::from(keys.contains(&survivor.key()));
    }
    let all = set.coordinators.len();
    ensure!(
        all == 0 || held > all / 2,
        "survivor {}'s key is on {held} of the {all} coordinators, not a majority",
        survivor.letter()
    );
    Ok(())
}

/// The coordinators' verdicts in a fence's report, in its order: (ok, verdict).
pub(super) fn coordinator_verdicts(report: &Value, t: &Topology, set: Set) -> Vec<(bool, String)> {
    let wwids: Vec<&str> = set
        .coordinators
        .iter()
        .map(|&lun| t.lu(lun).wwid.as_str())
        .collect();
    report["lus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|lu| wwids.iter().any(|w| lu["lu"].as_str() == Some(w)))
        .map(|lu| {
            (
                lu["ok"].as_bool().unwrap_or(false),
                lu["verdict"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// `rounds` mutual fences over the three coordinators, all up: each round both nodes unfence
/// (registered on every LUN of `set`, checked), fence each other at once, and exactly one exits 0,
/// the other 4, and the target shows the survivor alone ([`survivor_alone`]).
pub(super) fn mutual_rounds(t: &Topology, set: Set, rounds: usize) -> anyhow::Result<()> {
    let mut winners = [0usize; 2];
    for round in 1..=rounds {
        unfence(t, set, Node::A, 0)?;
        unfence(t, set, Node::B, 0)?;
        both_everywhere(t, set)?;
        let outputs = fence_both(t, set)?;
        let winner = winner(&outputs).with_context(|| format!("round {round}"))?;
        survivor_alone(t, set, winner, 2).with_context(|| format!("round {round}"))?;
        winners[winner.index()] += 1;
        println!("  round {round}: node {} survived", winner.letter());
    }
    println!(
        "  {rounds} mutual fences over 3 coordinators: winners A {}, B {}",
        winners[0], winners[1]
    );
    Ok(())
}

/// Long tier (issue 47: at least 100 rounds): [`mutual_rounds`] 100 times, `LAB_RACE_ROUNDS`
/// to change it. CI keeps five in
/// `a_majority_of_coordinators_decides_and_one_lost_does_not_stop_a_fence`.
fn mutual_fences_over_coordinators_a_hundred_rounds() -> anyhow::Result<()> {
    let rounds = crate::env_count("LAB_RACE_ROUNDS", 100)?;
    let t = Topology::iscsi(DATA.len() + COORDINATORS.len())?;
    t.settle()?;
    mutual_rounds(&t, SET, rounds)
}

/// P2 with three coordinators: `unfence` registers both nodes on them; mutual fences leave one
/// survivor, the data LUs never split ([`RACE_ROUNDS`] rounds). A coordinator node B cannot
/// reach: B's fence of an idle A still wins (2 of 3, the lost one reported) and A's writes are
/// refused. The same coordinator lost from both nodes: A's fence of an idle B wins on the other
/// two. Mutual fences with it lost from both: never two survivors, never a data LU split (both
/// may fail: two coordinators left, one won by each, is no majority for either).
fn a_majority_of_coordinators_decides_and_one_lost_does_not_stop_a_fence() -> anyhow::Result<()> {
    let rounds = crate::env_count("LAB_RACE_ROUNDS", RACE_ROUNDS)?;
    let t = Topology::iscsi(DATA.len() + COORDINATORS.len())?;
    t.settle()?;
    let devices: Vec<PathBuf> = t.node(Node::A).devices().to_vec();
    println!("  data {DATA:?}, coordinators {COORDINATORS:?} of {devices:?} (node A's names)");

    mutual_rounds(&t, SET, rounds)?;

    // coordinator LUN 4 unreachable from B only; A idle
    unfence(&t, SET, Node::A, 0)?;
    unfence(&t, SET, Node::B, 0)?;
    both_everywhere(&t, SET)?;
    let lost = COORDINATORS[2];
    t.unmap_lun(Node::B, lost)?;
    let report = fence(&t, SET, Node::B, 0)?;
    let verdicts = coordinator_verdicts(&report, &t, SET);
    ensure!(
        verdicts.iter().filter(|(ok, _)| *ok).count() == 2 && verdicts.len() == 3,
        "B's fence with coordinator {lost} unreachable: coordinators {verdicts:?}"
    );
    survivor_alone(&t, SET, Node::B, 3)?;
    ensure!(
        keys(&t, lost)?.contains(&Node::A.key()),
        "coordinator {lost}, which B cannot reach, lost A's key: {:x?}",
        keys(&t, lost)?
    );
    println!(
        "  B fenced A with coordinator {lost} unreachable from B: {}",
        report["summary"]
    );

    // the same coordinator lost from both nodes; B idle
    unfence(&t, SET, Node::A, 0)?;
    t.unmap_lun(Node::A, lost)?;
    let report = fence(&t, SET, Node::A, 0)?;
    survivor_alone(&t, SET, Node::A, 4)?;
    println!(
        "  A fenced B with coordinator {lost} lost from both: {}",
        report["summary"]
    );

    // mutual fences with it lost from both: no split, never two survivors
    for round in 1..=rounds {
        // exit 1: the lost coordinator cannot be registered on; every other LU is
        unfence(&t, SET, Node::A, 1)?;
        unfence(&t, SET, Node::B, 1)?;
        let outputs = fence_both(&t, SET)?;
        let code = |i: usize| outputs[i].1.status.code().unwrap_or(-1);
        match (code(0), code(1)) {
            (0, 4) => survivor_alone(&t, SET, Node::A, 5)?,
            (4, 0) => survivor_alone(&t, SET, Node::B, 5)?,
            (a, b) if a != 0 && b != 0 => {
                for lun in DATA {
                    ensure!(
                        keys(&t, lun)?.len() == 2,
                        "round {round}: neither fence won, yet data LUN {lun} holds {:x?}",
                        keys(&t, lun)?
                    );
                }
            }
            (a, b) => bail!("round {round}: exits A {a}, B {b}:{}", exits(&outputs)),
        }
        println!(
            "  round {round} with coordinator {lost} lost: exits A {}, B {}",
            code(0),
            code(1)
        );
        // the next round starts from both registered: an explicit unfence is the way back
    }
    Ok(())
}

/// fence_pr as Pacemaker runs it (options on stdin), `devices` the data LUs and `coordinators`
/// the LUNs `coordinators` as `node` names them; `node`'s own key store.
fn fence_pr(
    t: &Topology,
    node: Node,
    options: &str,
    coordinators: &[usize],
) -> anyhow::Result<crate::CommandRun> {
    std::fs::create_dir_all(WORK)?;
    let link = std::path::Path::new(WORK).join("fence_pr");
    if !link.exists() {
        std::os::unix::fs::symlink(PRFENCE, &link)?;
    }
    let names = |luns: &[usize]| -> String {
        luns.iter()
            .map(|&lun| t.device(node, lun).display().to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let stdin = format!(
        "{options}devices={}\ncoordinators={}\n",
        names(&DATA),
        names(coordinators)
    );
    let stdin_file = format!("{WORK}/fence_pr-{}.stdin", node.lower());
    std::fs::write(&stdin_file, &stdin)?;
    let run = crate::run_command(
        Command::new("sh")
            .arg("-c")
            .arg("exec \"$0\" < \"$1\"")
            .arg(&link)
            .arg(&stdin_file)
            .env("FENCE_PR_STORE", format!("{WORK}/store-{}", node.lower())),
    )?;
    println!(
        "  node {}: fence_pr {} (coordinators {coordinators:?}) -> exit {} in {} ms",
        node.letter(),
        stdin.lines().next().unwrap_or(""),
        run.code(),
        run.elapsed.as_millis()
    );
    Ok(run)
}

/// fence_pr's `coordinators`: `on` registers each node on the data LUs and the coordinators;
/// with a coordinator B cannot reach, B's `off` of idle A wins on the other two, and A's writes
/// are refused; a set of two is refused before anything is sent.
fn fence_pr_takes_coordinators() -> anyhow::Result<()> {
    let t = Topology::iscsi(DATA.len() + COORDINATORS.len())?;
    t.settle()?;
    for node in Node::BOTH {
        let on = format!("action=on\nkey={:x}\n", node.key());
        let run = fence_pr(&t, node, &on, &COORDINATORS)?;
        ensure!(
            run.code() == 0,
            "node {}'s on: {}{}",
            node.letter(),
            run.stdout,
            run.stderr
        );
    }
    both_everywhere(&t, SET)?;

    // two coordinators: refused, nothing sent
    let every = || -> anyhow::Result<Vec<Vec<u64>>> {
        DATA.into_iter()
            .chain(COORDINATORS)
            .map(|lun| keys(&t, lun))
            .collect()
    };
    let before = every()?;
    let off_b = format!("action=off\nkey={:x}\n", Node::B.key());
    let run = fence_pr(&t, Node::A, &off_b, &COORDINATORS[..2])?;
    ensure!(
        run.code() == 1 && run.stderr.contains("2 coordinators given"),
        "A's off with two coordinators: exit {}: {}{}",
        run.code(),
        run.stdout,
        run.stderr
    );
    ensure!(
        before == every()?,
        "keys changed by a refused off: {before:x?}"
    );

    let lost = COORDINATORS[2];
    t.unmap_lun(Node::B, lost)?;
    let off_a = format!("action=off\nkey={:x}\n", Node::A.key());
    let run = fence_pr(&t, Node::B, &off_a, &COORDINATORS)?;
    ensure!(
        run.code() == 0 && run.stdout.contains("Success"),
        "B's off of A with coordinator {lost} unreachable from B: {}{}",
        run.stdout,
        run.stderr
    );
    survivor_alone(&t, SET, Node::B, 2)?;
    ensure!(
        keys(&t, lost)?.contains(&Node::A.key()),
        "coordinator {lost}, which B cannot reach, lost A's key: {:x?}",
        keys(&t, lost)?
    );
    Ok(())
}

/// `prfence doctor --coordinator`: with both nodes unfenced, A's key is on all three
/// coordinators (can fence), and the set is refused because the lab's three coordinators share
/// one iSCSI target (one failure domain: what the lab stands in for, doctor sees through; the
/// second and the third each named with the first); after
/// B fences A, A's key is on no coordinator and A cannot fence.
fn doctor_checks_the_coordinator_set() -> anyhow::Result<()> {
    let t = Topology::iscsi(DATA.len() + COORDINATORS.len())?;
    t.settle()?;
    unfence(&t, SET, Node::A, 0)?;
    unfence(&t, SET, Node::B, 0)?;
    let [k, key] = key_args(Node::A);
    let (exit, d) = run(&t, SET, Node::A, &["doctor", &k, &key])?;
    let set = &d["coordinators"];
    let findings = set["findings"].to_string();
    ensure!(
        exit == 1
            && set["own_key_on"] == 3
            && d["can_fence"] == true
            && findings.contains("are both on the iSCSI target")
            && set["findings"].as_array().map_or(0, Vec::len) == 2,
        "A's doctor after both unfenced: exit {exit}: {d:#}"
    );
    fence(&t, SET, Node::B, 0)?;
    let (exit, d) = run(&t, SET, Node::A, &["doctor", &k, &key])?;
    ensure!(
        exit == 1 && d["coordinators"]["own_key_on"] == 0 && d["can_fence"] == false,
        "A's doctor after B fenced it: exit {exit}: {d:#}"
    );
    Ok(())
}

/// `prfence agent` in watch mode on both nodes, the coordinators as `coordinator = true`
/// devices (docs/agent.md, "Coordinators"): in a mutual fence the loser's agent self-fences and
/// the winner's stays healthy. Then, both unfenced again: a coordinator A cannot reach, past the grace, leaves
/// A degraded, not fenced; A's key preempted on one coordinator (as a losing node's PREEMPT
/// lands) leaves it degraded, not fenced; on a second, a majority gone, A's agent self-fences
/// while its key is still on the data LUs, and B's agent stays healthy throughout.
fn the_agent_self_fences_on_a_majority_of_coordinators_lost() -> anyhow::Result<()> {
    let t = Topology::iscsi(DATA.len() + COORDINATORS.len())?;
    t.settle()?;
    unfence(&t, SET, Node::A, 0)?;
    unfence(&t, SET, Node::B, 0)?;
    both_everywhere(&t, SET)?;
    const GRACE_S: u64 = 3;
    let start = |node: Node| {
        let data: Vec<PathBuf> = DATA.map(|lun| t.device(node, lun).to_path_buf()).to_vec();
        let coordinators: String = COORDINATORS
            .iter()
            .map(|&lun| {
                format!(
                    "[[device]]\npath = \"{}\"\nname = \"coordinator{lun}\"\ncoordinator = true\n",
                    t.device(node, lun).display()
                )
            })
            .collect();
        AgentProcess::start(
            &format!("coordinators-{}", node.lower()),
            &watch_config(
                &data,
                &hex(node.key()),
                500,
                &format!("grace = \"{GRACE_S}s\""),
                SELF_FENCE_NO_RESET,
                &coordinators,
            ),
        )
    };
    // A mutual fence under both agents: the loser's agent self-fences, the winner's stays up.
    {
        let mut agents = [start(Node::A)?, start(Node::B)?];
        for agent in &mut agents {
            agent.wait_state("healthy", Duration::from_secs(30))?;
        }
        let outputs = fence_both(&t, SET)?;
        let winner = winner(&outputs)?;
        survivor_alone(&t, SET, winner, 7)?;
        agents[winner.other().index()].wait_state("fenced", Duration::from_secs(10))?;
        std::thread::sleep(Duration::from_secs(2));
        let kept = &agents[winner.index()];
        ensure!(
            kept.state() == "healthy",
            "the winner {}'s agent is {:?}:\n{}",
            winner.letter(),
            kept.state(),
            kept.log_tail()
        );
        println!(
            "  mutual fence: {} won, its agent healthy; the loser's agent self-fenced",
            winner.letter()
        );
    }
    unfence(&t, SET, Node::A, 0)?;
    unfence(&t, SET, Node::B, 0)?;
    both_everywhere(&t, SET)?;
    let mut a = start(Node::A)?;
    let mut b = start(Node::B)?;
    a.wait_state("healthy", Duration::from_secs(30))?;
    b.wait_state("healthy", Duration::from_secs(30))?;
    // The agent's LUs in configuration order: the data LUs, then the coordinators.
    let verdict = |agent: &AgentProcess, coordinator: usize| -> String {
        let lu = &agent.status().unwrap_or_default()["lus"][DATA.len() + coordinator];
        format!("{}: {}", lu["name"], lu["verdict"])
    };
    let still_up = |agent: &AgentProcess, what: &str| -> anyhow::Result<()> {
        let state = agent.state();
        ensure!(
            state == "degraded",
            "{what}: agent A is {state:?}, not degraded:\n{}",
            agent.log_tail()
        );
        Ok(())
    };

    // coordinator 2 unreachable from A, for twice the grace: degraded, never fenced
    t.unmap_lun(Node::A, COORDINATORS[2])?;
    a.wait_state("degraded", Duration::from_secs(10))?;
    std::thread::sleep(Duration::from_secs(2 * GRACE_S));
    still_up(&a, "a coordinator unreadable past the grace")?;
    ensure!(
        verdict(&a, 2).contains("coordinator unreadable"),
        "A's coordinator 2: {}",
        verdict(&a, 2)
    );
    println!("  A, coordinator 2 unreachable: {}", verdict(&a, 2));

    // B preempts A on coordinator 0, as a losing node's PREEMPT lands: degraded, not fenced
    let preempt = |lun: usize| -> anyhow::Result<()> {
        let run = crate::run_command(Command::new(PRFENCE).args([
            "preempt",
            "--key",
            &hex(Node::B.key()),
            "--victim",
            &hex(Node::A.key()),
            "--abort",
            &t.device(Node::B, lun).display().to_string(),
        ]))?;
        ensure!(
            run.code() == 0,
            "B's preempt on LUN {lun}: {}{}",
            run.stdout,
            run.stderr
        );
        Ok(())
    };
    preempt(COORDINATORS[0])?;
    std::thread::sleep(Duration::from_secs(3));
    still_up(&a, "A's key gone from one coordinator")?;
    ensure!(
        verdict(&a, 0).contains("coordinator lost"),
        "A's coordinator 0: {}",
        verdict(&a, 0)
    );
    println!("  A, key gone from coordinator 0: {}", verdict(&a, 0));

    // and on coordinator 1: a majority gone, A self-fences; its key is still on the data LUs
    preempt(COORDINATORS[1])?;
    a.wait_state("fenced", Duration::from_secs(10))?;
    let reason = a.status().unwrap_or_default()["fenced_reason"].to_string();
    ensure!(
        reason.contains("gone from 2 of the 3 coordinators"),
        "A's fenced reason: {reason}"
    );
    for lun in DATA {
        ensure!(
            keys(&t, lun)?.contains(&Node::A.key()),
            "data LUN {lun} lost A's key: {:x?}",
            keys(&t, lun)?
        );
    }
    ensure!(
        b.state() == "healthy",
        "B's agent is {:?}:\n{}",
        b.state(),
        b.log_tail()
    );
    println!("  A self-fenced: {reason}; B healthy");
    Ok(())
}

/// Array "2" lost from B's view: data LUN 1 and coordinator LUN 4 taken out of B's ACL (LOGICAL
/// UNIT NOT SUPPORTED: no path answers), A idle. B's fence of A wins the other two coordinators
/// and fences data LUN 0, and fails naming LUN 1 (exit 1); rerun with `--unreachable-data
/// report` it succeeds (exit 0) and names LUN 1 as not fenced. Judged on the target: A's key gone
/// from LUN 0 and its writes refused there, A's key still on LUN 1 (untouched, as reported).
fn a_data_lu_out_of_reach_fails_the_fence_unless_reported() -> anyhow::Result<()> {
    let t = Topology::iscsi(DATA.len() + COORDINATORS.len())?;
    t.settle()?;
    unfence(&t, SET, Node::A, 0)?;
    unfence(&t, SET, Node::B, 0)?;
    both_everywhere(&t, SET)?;
    let (data_lost, coordinator_lost) = (DATA[1], COORDINATORS[2]);
    t.unmap_lun(Node::B, data_lost)?;
    t.unmap_lun(Node::B, coordinator_lost)?;
    let report = fence(&t, SET, Node::B, 1)?;
    let summary = report["summary"].to_string();
    ensure!(
        summary.contains(&t.lu(data_lost).wwid) && !keys(&t, DATA[0])?.contains(&Node::A.key()),
        "B's fence with LUN {data_lost} unreachable: {report:#}"
    );
    println!("  without the opt-in: exit 1, {summary}");
    let mut args = fence_args(Node::B);
    args.extend(["--unreachable-data".into(), "report".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (exit, report) = run(&t, SET, Node::B, &args)?;
    let summary = report["summary"].to_string();
    ensure!(
        exit == 0 && summary.contains(&format!("NOT fenced on {}", t.lu(data_lost).wwid)),
        "B's fence with --unreachable-data report: exit {exit}: {report:#}"
    );
    ensure!(
        keys(&t, DATA[0])? == [Node::B.key()],
        "data LUN {} holds {:x?}",
        DATA[0],
        keys(&t, DATA[0])?
    );
    survivor_writes_alone(&t, Node::B, [DATA[0]], 6)?;
    ensure!(
        keys(&t, data_lost)?.contains(&Node::A.key()),
        "LUN {data_lost}, reported not fenced, lost A's key: {:x?}",
        keys(&t, data_lost)?
    );
    println!("  with --unreachable-data report: exit 0, {summary}");
    Ok(())
}
