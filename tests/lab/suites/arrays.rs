//! Coordinator LUs on three arrays (issue 47): a site lost with its node and its array, and the
//! other node's `prfence fence --coordinator` still fences the lost node. Judged on the targets
//! that stay: the registrations LIO keeps (configfs) and whether a node's write is refused.
//!
//! What stands in for what:
//! - three storage arrays: three LIO iSCSI targets in the one guest ([`Topology::arrays`]), each
//!   with its own IQN (`…:array1` to `…:array3`), backing files and portals; array 1 carries
//!   data LU 0 and coordinator LU 1, array 2 data LU 2 and coordinator LU 3, array 3 the third
//!   coordinator, LU 4, alone (the small third target the docs advise);
//! - an array's two front-end ports: two portals on loopback addresses (`127.0.1<i>.1:3260`
//!   for node A, `.2` for node B), each node logging in through its own;
//! - an array lost: every packet to and from both its portals dropped on arrival (nftables,
//!   [`Topology::lose_array`]): commands get no answer at all, as from a dead site;
//! - one node cut off one array: only that node's portal dropped ([`Topology::cut_array`]);
//! - how soon a node's iSCSI layer gives up on a dead array: 5 s after the session is found
//!   dead (`replacement_timeout`, which sites with arrays that can be lost shorten); with
//!   open-iscsi's 120 s the lost array's commands outlast `fence`'s 50 s deadline;
//! - node A lost with its array: A is an initiator, not a machine, so "lost" is A doing nothing
//!   from the loss on, and its application (a writer loop on its data LUs on the arrays that
//!   stay) stopped with SIGSTOP just before, then let go after the fence: its pending write must
//!   be refused, as a frozen node's that wakes up.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use nix::sys::signal::Signal;
use serde_json::Value;

use super::coordinators::{
    Set, both_everywhere, coordinator_verdicts, fence_args, fence_both, keys, mutual_rounds, run,
    survivor_alone, unfence,
};
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::race::{exits, survivor_writes_alone};
use crate::{Node, PRFENCE, Topology, WriteOutcome, Writer, write_number};

/// The LUs of each array, in order: array 1 LUs 0-1, array 2 LUs 2-3, array 3 LU 4.
const LUNS: [usize; 3] = [2, 2, 1];
/// One data LU on each of arrays 1 and 2 (the data spread over both).
const DATA: [usize; 2] = [0, 2];
/// A coordinator on each array.
const COORDINATORS: [usize; 3] = [1, 3, 4];
const SET: Set<'static> = Set {
    data: &DATA,
    coordinators: &COORDINATORS,
};
/// Mutual-fence rounds in CI (`LAB_RACE_ROUNDS` overrides it; the long tier runs 100).
const RACE_ROUNDS: usize = 5;
/// Mutual-fence rounds with a coordinator cut off from one node: each costs B's command timeout
/// (10 s) in its unfence and its fence.
const CUT_ROUNDS: usize = 3;
/// The block node A's application writes.
const WRITER_BLOCK: u64 = 8;
/// How long a prfence worker left in the kernel by a lost path may take to end once the path is
/// back (open-iscsi's re-login, then the queued command's answer).
const WORKERS_GONE: Duration = Duration::from_secs(60);

const TESTS: &[crate::plan::Test] = crate::tests![
    array1_lost_with_node_a_then_b_fences_a,
    array2_lost_with_node_a_then_b_fences_a,
    array3_lost_with_node_a_then_b_fences_a,
    mutual_fences_over_three_arrays,
];

pub const SUITE: Suite = Suite {
    name: "arrays",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(15 * 60),
    usual: Duration::from_secs(200),
    tests: TESTS,
    // The one-node cut is the coordinators suite's too (ACL unmapping, in CI); here it costs a
    // minute of CI's 25 for the same rule.
    long: crate::tests![
        mutual_fences_over_three_arrays_a_hundred_rounds,
        an_array_cut_off_from_one_node_only
    ],
    reproducers: &[],
};

fn array1_lost_with_node_a_then_b_fences_a() -> anyhow::Result<()> {
    lost_with_node_a(0)
}

fn array2_lost_with_node_a_then_b_fences_a() -> anyhow::Result<()> {
    lost_with_node_a(1)
}

fn array3_lost_with_node_a_then_b_fences_a() -> anyhow::Result<()> {
    lost_with_node_a(2)
}

/// The topology of every test here, both nodes unfenced on every LU (checked on the targets).
fn unfenced_arrays() -> anyhow::Result<Topology> {
    let t = Topology::arrays(&LUNS)?;
    t.settle()?;
    unfence(&t, SET, Node::A, 0)?;
    unfence(&t, SET, Node::B, 0)?;
    both_everywhere(&t, SET)?;
    Ok(t)
}

/// Array `lost` (0-based) is lost together with node A; node B fences A with the three
/// coordinators: first with every data LU, as the cluster configured them (exit 1 when the lost
/// array holds one, which the report names, every data LU B reaches fenced), then with the lost
/// array's data LUs left out, as the admin who confirmed the array is down reruns it (exit 0).
/// On the arrays that stay, A's key is gone from every LU and B's there, A's frozen writer and
/// its writes are refused, B's writes accepted; the lost array's LUs keep both keys (nobody
/// reached them). Once the array is back its data LU still takes A's writes until B's fence over
/// every LU, rerun, removes A there too (exit 0, A refused everywhere).
fn lost_with_node_a(lost: usize) -> anyhow::Result<()> {
    let t = unfenced_arrays()?;
    let array = t.array(lost)?.clone();
    let name = format!("array {} ({}, LUs {:?})", lost + 1, array.target, array.lus);
    let on_lost = |lun: &usize| array.lus.contains(lun);
    let kept_data: Vec<usize> = DATA.iter().copied().filter(|l| !on_lost(l)).collect();
    let lost_data: Vec<usize> = DATA.iter().copied().filter(on_lost).collect();
    let kept: Vec<usize> = SET.all().filter(|l| !on_lost(l)).collect();
    let lost_lus: Vec<usize> = SET.all().filter(on_lost).collect();

    // node A's application on its data LUs of the arrays that stay, frozen before the loss
    let a_devices: Vec<PathBuf> = kept_data
        .iter()
        .map(|&lun| t.device(Node::A, lun).to_path_buf())
        .collect();
    let writer = Writer::start("node A", &a_devices, WRITER_BLOCK, |_| {})?;
    let last_write = writer.next_line(Duration::from_secs(30))?;
    ensure!(
        last_write.starts_with("wrote"),
        "node A's writer failed before the loss: {last_write}"
    );
    writer.signal(Signal::SIGSTOP)?;
    let fault = t.lose_array(lost)?;
    let lost_at = Instant::now();
    println!("  {name} lost with node A (A's writer stopped after \"{last_write}\")");

    // B's fence as configured: every data LU
    let (exit, report) = b_fences(&t, SET)?;
    let verdicts = coordinator_verdicts(&report, &t, SET);
    ensure!(
        verdicts.len() == 3 && verdicts.iter().filter(|(ok, _)| *ok).count() == 2,
        "B's fence with {name} lost: coordinators {verdicts:?}"
    );
    if lost_data.is_empty() {
        ensure!(
            exit == 0,
            "B's fence with {name} lost (no data LU on it) exited {exit}: {report:#}"
        );
    } else {
        ensure!(
            exit == 1,
            "B's fence with the data LUs of {name} given exited {exit}, not 1: {report:#}"
        );
        for &lun in &lost_data {
            let wwid = &t.lu(lun).wwid;
            let lu = lu_report(&report, wwid)
                .with_context(|| format!("B's fence report does not name LU {lun}: {report:#}"))?;
            ensure!(
                lu["ok"] == false,
                "data LU {lun} of the lost array reported fenced: {lu:#}"
            );
            println!(
                "  data LU {lun} ({wwid}) unreachable, reported {}; summary: {}",
                lu["verdict"], report["summary"]
            );
        }
    }
    // the targets that stay: A's key gone from every LU B reaches, data LUs included
    a_gone_where_b_reaches(&t, &kept)?;

    // the admin leaves the lost array's data LUs out
    let reachable = Set {
        data: &kept_data,
        coordinators: &COORDINATORS,
    };
    let (exit, report) = b_fences(&t, reachable)?;
    ensure!(
        exit == 0,
        "B's fence without the data LUs of {name} exited {exit}: {report:#}"
    );
    a_gone_where_b_reaches(&t, &kept)?;
    for &lun in &kept_data {
        let holder = t.lu(lun).holder()?;
        ensure!(
            holder.as_ref().map(|h| &h.initiator) == Some(&t.node(Node::B).initiator),
            "data LUN {lun} is held by {holder:?}, not node B"
        );
    }
    survivor_writes_alone(&t, Node::B, kept_data.iter().copied(), 2)?;
    for &lun in &lost_lus {
        ensure!(
            keys(&t, lun)? == [Node::A.key(), Node::B.key()],
            "LU {lun} of the lost {name}, which nobody reached, holds {:x?}",
            keys(&t, lun)?
        );
    }
    // A wakes up: the write it had under way is refused
    writer.signal(Signal::SIGCONT)?;
    frozen_write_refused(&writer, &last_write)?;
    println!(
        "  B fenced A {} after the loss: A's key gone from LUs {kept:?}, A's writes refused on \
         data LUs {kept_data:?}",
        crate::secs(lost_at.elapsed())
    );

    // the array comes back
    fault.release()?;
    let back = t.sessions_back()?;
    let gone = prfence_workers_gone()?;
    println!(
        "  {name} back: sessions logged in after {}, prfence workers gone after {}",
        crate::secs(back),
        crate::secs(gone)
    );
    for &lun in &lost_data {
        ensure!(
            keys(&t, lun)?.contains(&Node::A.key()),
            "data LU {lun} of {name} lost A's key while nobody reached it"
        );
        let write = t.write_probe(Node::A, lun, 3);
        ensure!(
            write == WriteOutcome::Accepted,
            "A's write to data LU {lun}, which no fence reached: {write:?}"
        );
        println!("  data LU {lun} back with A's key: A's write accepted until B fences it there");
    }
    let (exit, report) = b_fences(&t, SET)?;
    ensure!(
        exit == 0,
        "B's fence over every LU after {name} came back exited {exit}: {report:#}"
    );
    survivor_alone(&t, SET, Node::B, 4)?;
    for lun in SET.all() {
        ensure!(
            keys(&t, lun)? == [Node::B.key()],
            "LU {lun} holds {:x?} after B's fence over every LU",
            keys(&t, lun)?
        );
    }
    Ok(())
}

/// `prfence fence` as node B over `set` ([`fence_args`]): its exit status and report, each LU's
/// verdict printed.
fn b_fences(t: &Topology, set: Set) -> anyhow::Result<(i32, Value)> {
    let args = fence_args(Node::B);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (exit, report) = run(t, set, Node::B, &args)?;
    for lu in report["lus"].as_array().into_iter().flatten() {
        let index = t
            .lus()
            .iter()
            .position(|l| lu["lu"].as_str() == Some(l.wwid.as_str()));
        let error = lu["error"].to_string();
        println!(
            "    LU {index:?}: ok {} {}{}",
            lu["ok"],
            lu["verdict"],
            if lu["error"].is_null() {
                String::new()
            } else {
                format!(" ({})", error.chars().take(160).collect::<String>())
            }
        );
    }
    println!("    summary: {}", report["summary"]);
    Ok((exit, report))
}

/// The entry of `report["lus"]` for the LU `wwid`.
fn lu_report<'a>(report: &'a Value, wwid: &str) -> Option<&'a Value> {
    report["lus"]
        .as_array()?
        .iter()
        .find(|lu| lu["lu"].as_str() == Some(wwid))
}

/// On each of `luns`, node B's key and not node A's.
fn a_gone_where_b_reaches(t: &Topology, luns: &[usize]) -> anyhow::Result<()> {
    for &lun in luns {
        ensure!(
            keys(t, lun)? == [Node::B.key()],
            "LU {lun}, which B reaches, holds {:x?} after B's fence, not B's key alone",
            keys(t, lun)?
        );
    }
    Ok(())
}

/// The writer, let go after its node was fenced, reports its next write refused with
/// RESERVATION CONFLICT (EBADE, "Invalid exchange"); a write completed just before the freeze
/// may be reported first.
fn frozen_write_refused(writer: &Writer, last_write: &str) -> anyhow::Result<()> {
    let frozen_at = write_number(last_write).context("the writer's last line")?;
    let mut verdict = writer.next_line(Duration::from_secs(60))?;
    if write_number(&verdict) == Some(frozen_at + 1) {
        verdict = writer.next_line(Duration::from_secs(60))?;
    }
    ensure!(
        verdict.contains("FAILED") && verdict.contains("Invalid exchange"),
        "node A's writer after the fence: {verdict:?}, not a write refused with RESERVATION \
         CONFLICT"
    );
    println!("  A's writer let go: {verdict}");
    Ok(())
}

/// Waits until no prfence process is left: a worker whose SG_IO went to a lost path stays in the
/// kernel after its command gave its verdict, until the path is back and the command answered.
fn prfence_workers_gone() -> anyhow::Result<Duration> {
    let binary = std::fs::canonicalize(PRFENCE)?;
    let start = Instant::now();
    loop {
        let left: Vec<String> = std::fs::read_dir("/proc")?
            .flatten()
            .filter(|entry| {
                std::fs::read_link(entry.path().join("exe")).is_ok_and(|exe| exe == binary)
            })
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        if left.is_empty() {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < WORKERS_GONE,
            "prfence processes {left:?} still there {} after the path came back",
            crate::secs(start.elapsed())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// P2 over three arrays, all up: both nodes unfence, `prfence doctor` on node A finds the set
/// sound (three coordinators on three targets, its key on all three: exit 0, no finding), then
/// [`RACE_ROUNDS`] mutual fences each leave one survivor, data LUs never split
/// ([`mutual_rounds`]).
fn mutual_fences_over_three_arrays() -> anyhow::Result<()> {
    let rounds = crate::env_count("LAB_RACE_ROUNDS", RACE_ROUNDS)?;
    let t = unfenced_arrays()?;
    let key = crate::node::hex(Node::A.key());
    let (exit, doctor) = run(&t, SET, Node::A, &["doctor", "--key", &key])?;
    let set = &doctor["coordinators"];
    ensure!(
        exit == 0
            && set["own_key_on"] == 3
            && doctor["can_fence"] == true
            && set["findings"].as_array().is_some_and(Vec::is_empty),
        "A's doctor on three coordinators on three targets: exit {exit}: {doctor:#}"
    );
    mutual_rounds(&t, SET, rounds)
}

/// Long tier (issue 47: at least 100 rounds): [`mutual_rounds`] over the three arrays 100 times
/// (`LAB_RACE_ROUNDS` to change it). CI keeps five in `mutual_fences_over_three_arrays`.
fn mutual_fences_over_three_arrays_a_hundred_rounds() -> anyhow::Result<()> {
    let rounds = crate::env_count("LAB_RACE_ROUNDS", 100)?;
    let t = unfenced_arrays()?;
    mutual_rounds(&t, SET, rounds)
}

/// One node cut off one array, the other node and the array up. B cut off array 3 (its
/// coordinator alone): B's fence of idle A wins on the other two (exit 0), A's key gone from
/// every LU B reaches and its writes refused, coordinator 4 keeps both keys; then [`CUT_ROUNDS`]
/// mutual fences under the cut: never two survivors, data LUs never split, the survivor's key
/// on a majority of the coordinators and the loser's on a minority. B cut off array 1 (data
/// LU 0 and coordinator 1): B's fence of idle A wins the coordinators (3 and 4) but fails
/// (exit 1) naming LU 0, where A's key stays and A's writes are still accepted: the victim
/// still writes where the fencer cannot reach, which is why that fence must not succeed.
fn an_array_cut_off_from_one_node_only() -> anyhow::Result<()> {
    let t = unfenced_arrays()?;

    let third = COORDINATORS[2];
    let cut = t.cut_array(Node::B, 2)?;
    println!("  node B cut off array 3 (coordinator LU {third}); A idle");
    let (exit, report) = b_fences(&t, SET)?;
    let verdicts = coordinator_verdicts(&report, &t, SET);
    ensure!(
        exit == 0 && verdicts.iter().filter(|(ok, _)| *ok).count() == 2,
        "B's fence with coordinator {third} out of its reach: exit {exit}, coordinators \
         {verdicts:?}: {report:#}"
    );
    let reached = Set {
        data: &DATA,
        coordinators: &COORDINATORS[..2],
    };
    survivor_alone(&t, reached, Node::B, 2)?;
    ensure!(
        keys(&t, third)? == [Node::A.key(), Node::B.key()],
        "coordinator {third}, which B cannot reach, holds {:x?}",
        keys(&t, third)?
    );

    let mut outcomes = Vec::new();
    for round in 1..=CUT_ROUNDS {
        unfence(&t, SET, Node::A, 0)?;
        // exit 1: coordinator 4 does not answer B; every other LU registered
        unfence(&t, SET, Node::B, 1)?;
        let outputs = fence_both(&t, SET)?;
        let code = |i: usize| outputs[i].1.status.code().unwrap_or(-1);
        let survivor = match (code(0), code(1)) {
            (0, 4) => Some(Node::A),
            (4, 0) => Some(Node::B),
            (a, b) if a != 0 && b != 0 => None,
            (a, b) => bail!("round {round}: exits A {a}, B {b}:{}", exits(&outputs)),
        };
        match survivor {
            Some(node) => {
                let data_only = Set {
                    data: &DATA,
                    coordinators: &[],
                };
                survivor_alone(&t, data_only, node, 5)
                    .and_then(|()| coordinators_decided(&t, node))
                    .with_context(|| format!("round {round}:{}", exits(&outputs)))?;
            }
            None => {
                for lun in DATA {
                    ensure!(
                        keys(&t, lun)?.len() == 2,
                        "round {round}: neither fence won, yet data LU {lun} holds {:x?}",
                        keys(&t, lun)?
                    );
                }
            }
        }
        println!(
            "  round {round} with B cut off array 3: exits A {}, B {}",
            code(0),
            code(1)
        );
        outcomes.push((code(0), code(1)));
    }
    println!("  {CUT_ROUNDS} mutual fences with B cut off array 3: exits (A, B) {outcomes:?}");
    cut.release()?;
    t.sessions_back()?;
    prfence_workers_gone()?;

    unfence(&t, SET, Node::A, 0)?;
    unfence(&t, SET, Node::B, 0)?;
    both_everywhere(&t, SET)?;
    let first = DATA[0];
    let cut = t.cut_array(Node::B, 0)?;
    println!("  node B cut off array 1 (data LU {first}, coordinator LU 1); A idle");
    let (exit, report) = b_fences(&t, SET)?;
    let lu = lu_report(&report, &t.lu(first).wwid)
        .with_context(|| format!("B's fence report does not name LU {first}: {report:#}"))?;
    ensure!(
        exit == 1 && lu["ok"] == false,
        "B's fence with data LU {first} out of its reach: exit {exit}: {report:#}"
    );
    a_gone_where_b_reaches(&t, &[DATA[1], COORDINATORS[1], COORDINATORS[2]])?;
    ensure!(
        keys(&t, first)? == [Node::A.key(), Node::B.key()],
        "data LU {first}, which B cannot reach, holds {:x?}",
        keys(&t, first)?
    );
    let write = t.write_probe(Node::A, first, 6);
    ensure!(
        write == WriteOutcome::Accepted,
        "A's write to data LU {first}, which B's fence could not reach: {write:?}"
    );
    println!(
        "  B's fence failed naming LU {first} ({}); A still writes there",
        lu["verdict"]
    );
    cut.release()?;
    t.sessions_back()?;
    prfence_workers_gone()?;
    Ok(())
}

/// After a fence won by `survivor`: its key on a majority of the three coordinators, the
/// loser's on a minority (the loser keeps what it won: concepts.md).
fn coordinators_decided(t: &Topology, survivor: Node) -> anyhow::Result<()> {
    let held = |node: Node| -> anyhow::Result<usize> {
        let mut n = 0;
        for lun in COORDINATORS {
            n += usize::from(keys(t, lun)?.contains(&node.key()));
        }
        Ok(n)
    };
    let (won, lost) = (held(survivor)?, held(survivor.other())?);
    ensure!(
        won >= 2 && lost <= 1,
        "survivor {}'s key on {won} of 3 coordinators, the loser's on {lost}",
        survivor.letter()
    );
    Ok(())
}
