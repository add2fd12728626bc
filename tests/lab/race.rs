//! Two nodes fencing each other at the same moment, judged on the target: the races of
//! `fence` (CI's), `stress` (the long races and the raw PREEMPT races that show LIO's lock-up) and
//! `nvme`.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use super::node::{self, Nodes, hex};
use super::{Node, PRFENCE, Topology, WriteOutcome};

/// The target's verdict after a fence won by `survivor`: on every LU only its key is registered,
/// only through its own nexuses, it holds a WERO reservation; the other node's O_DIRECT writes
/// are refused on every LU and the survivor's accepted.
pub fn assert_sole_survivor(t: &Topology, survivor: Node, block: u64) -> anyhow::Result<()> {
    for lu in t.lus() {
        let regs = lu.registrations()?;
        ensure!(
            !regs.is_empty()
                && regs.iter().all(|r| {
                    r.key == survivor.key() && r.initiator == t.node(survivor).initiator
                }),
            "LU {} registrations are not node {}'s alone: {regs:?}",
            lu.index,
            survivor.letter()
        );
        let holder = lu.holder()?;
        ensure!(
            holder.as_ref().map(|h| &h.initiator) == Some(&t.node(survivor).initiator),
            "LU {} is held by {holder:?}, not node {}",
            lu.index,
            survivor.letter()
        );
        ensure!(
            lu.reservation_type()? == Some(5),
            "LU {} is not reserved WERO",
            lu.index
        );
    }
    survivor_writes_alone(t, survivor, 0..t.lus().len(), block)
}

/// On each of `luns`, the other node's O_DIRECT write to `block` is refused and `survivor`'s
/// accepted.
pub fn survivor_writes_alone(
    t: &Topology,
    survivor: Node,
    luns: impl IntoIterator<Item = usize>,
    block: u64,
) -> anyhow::Result<()> {
    let loser = survivor.other();
    for lun in luns {
        let refused = t.write_probe(loser, lun, block);
        ensure!(
            refused == WriteOutcome::Refused,
            "node {}'s write to LUN {lun} after it was fenced: {refused:?}",
            loser.letter()
        );
        let accepted = t.write_probe(survivor, lun, block);
        ensure!(
            accepted == WriteOutcome::Accepted,
            "survivor {}'s write to LUN {lun}: {accepted:?}",
            survivor.letter()
        );
    }
    Ok(())
}

/// Starts `args` as both nodes at the same moment and waits for both.
pub fn both_at_once(
    t: &impl Nodes,
    args: impl Fn(Node) -> Vec<String>,
) -> anyhow::Result<Vec<(Node, Output)>> {
    spawn_both(|node| {
        let args = args(node);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        node::command(t, node, &args)
    })
}

/// Starts each node's `command` at the same moment (output captured) and waits for both.
pub fn spawn_both(command: impl Fn(Node) -> Command) -> anyhow::Result<Vec<(Node, Output)>> {
    let mut children = Vec::new();
    for node in Node::BOTH {
        let child = command(node)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn prfence")?;
        children.push((node, child));
    }
    children
        .into_iter()
        .map(|(node, child)| Ok((node, child.wait_with_output()?)))
        .collect()
}

/// The node that won a mutual fence: exactly one exited 0 (fenced the other) and the other 4
/// (was fenced).
pub fn winner(outputs: &[(Node, Output)]) -> anyhow::Result<Node> {
    let code = |node: Node| {
        outputs
            .iter()
            .find(|(n, _)| *n == node)
            .and_then(|(_, out)| out.status.code())
            .unwrap_or(-1)
    };
    match (code(Node::A), code(Node::B)) {
        (0, 4) => Ok(Node::A),
        (4, 0) => Ok(Node::B),
        (a, b) => bail!("exits A {a}, B {b}, not one 0 and one 4:{}", exits(outputs)),
    }
}

/// Each node's exit status and output, for a failure message.
pub fn exits(outputs: &[(Node, Output)]) -> String {
    let mut why = String::new();
    for (node, out) in outputs {
        why.push_str(&format!(
            "\nnode {} exit {}: {}{}",
            node.letter(),
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    why
}

/// What a series of races came to.
#[derive(Debug, Default)]
pub struct RaceStats {
    pub winners: BTreeMap<char, usize>,
    pub times: Vec<Duration>,
}

impl RaceStats {
    fn record(&mut self, winner: Node, elapsed: Duration) {
        *self.winners.entry(winner.letter()).or_default() += 1;
        self.times.push(elapsed);
    }

    /// "winners {…}; round time min …, median …, max …".
    pub fn summary(&mut self) -> String {
        self.times.sort();
        let ms = |i: usize| self.times.get(i).map_or(0, Duration::as_millis);
        format!(
            "winners {:?}; round time min {} ms, median {} ms, max {} ms",
            self.winners,
            ms(0),
            ms(self.times.len() / 2),
            ms(self.times.len().saturating_sub(1))
        )
    }
}

/// What LIO 6.1 logs when it runs a PREEMPT [AND ABORT] from a nexus that is no longer
/// registered: the loser of a race preempted after all, the two fences crossed on the arbiter
/// (when LIO can lock up, docs/target-notes.md). A loser's PREEMPT that a unit attention stops
/// first never gets there, so this sees only crossings that reached the PR code.
const LATE_PREEMPT: &str = "Unable to locate PR_REGISTERED *pr_reg for PREEMPT";

/// P2: A and B unfence, then fence each other at the same moment, `rounds` times: every round
/// exactly one exits 0 and the other 4, the target shows that one survivor alone on every LU, and
/// the target ran no PREEMPT from a nexus that had already lost its registration (the tie-break
/// kept the two PREEMPTs from crossing).
pub fn mutual_fence(t: &Topology, rounds: usize) -> anyhow::Result<RaceStats> {
    let mut stats = RaceStats::default();
    for round in 1..=rounds {
        node::unfence(t, Node::A)?;
        node::unfence(t, Node::B)?;
        let mark = crate::kernel_log::mark()?;
        let start = Instant::now();
        let outputs = both_at_once(t, node::fence_args)?;
        let elapsed = start.elapsed();
        // PREEMPTs from unregistered nexuses the guest kernel logged during the round
        let late = crate::kernel_log::count_since(mark, LATE_PREEMPT)?;
        let winner = winner(&outputs).with_context(|| format!("round {round}"))?;
        assert_sole_survivor(t, winner, 2)
            .with_context(|| format!("round {round}: split after the race"))?;
        ensure!(
            late == 0,
            "round {round}: the target ran {late} PREEMPT(s) from a nexus no longer registered: \
             the loser preempted after all, the two fences crossed:{}",
            exits(&outputs)
        );
        println!(
            "  round {round:>3}: node {} survived, both fences done in {} ms",
            winner.letter(),
            elapsed.as_millis()
        );
        stats.record(winner, elapsed);
    }
    Ok(stats)
}

/// Which PERSISTENT RESERVE OUT each node sends in a raw race.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preempts {
    /// PREEMPT AND ABORT from both nodes.
    BothAbort,
    /// Plain PREEMPT from both nodes.
    BothPlain,
    /// PREEMPT AND ABORT from A, plain PREEMPT from B.
    OneAbort,
}

impl Preempts {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(match text {
            "both-abort" => Preempts::BothAbort,
            "both-plain" => Preempts::BothPlain,
            "one-abort" => Preempts::OneAbort,
            _ => bail!("preempt mode is both-abort, both-plain or one-abort, not {text:?}"),
        })
    }

    fn abort(self, node: Node) -> bool {
        match self {
            Preempts::BothAbort => true,
            Preempts::BothPlain => false,
            Preempts::OneAbort => node == Node::A,
        }
    }
}

/// The bare target race, without prfence's fencing sequence: both nodes registered on LU 0 (A
/// holding WERO), then each sends one PREEMPT [AND ABORT] of the other's key at the same moment,
/// `rounds` times. The target must leave exactly one of them registered. On an LIO target with
/// the lock-up this hangs the guest, and the lab reports the kernel's stacks.
pub fn raw_preempts(t: &Topology, rounds: usize, mode: Preempts) -> anyhow::Result<RaceStats> {
    let mut stats = RaceStats::default();
    let lu0 = |node: Node| vec![t.device(node, 0).display().to_string()];
    for round in 1..=rounds {
        for node in Node::BOTH {
            let k = hex(node.key());
            let mut cmd = Command::new(PRFENCE);
            cmd.args(["register", "--ignore-existing", "--key", &k])
                .args(lu0(node));
            super::run_command(&mut cmd)?.ok()?;
        }
        if t.lu(0).holder()?.is_none() {
            let mut cmd = Command::new(PRFENCE);
            cmd.args(["reserve", "--key", "0xa", "--type", "wero"])
                .args(lu0(Node::A));
            super::run_command(&mut cmd)?.ok()?;
        }
        let start = Instant::now();
        let mut children = Vec::new();
        for node in Node::BOTH {
            let mut cmd = Command::new(PRFENCE);
            cmd.args(["preempt", "--key", &hex(node.key())])
                .args(["--victim", &hex(node.other().key())]);
            if mode.abort(node) {
                cmd.arg("--abort");
            }
            let child = cmd
                .args(lu0(node))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("spawn prfence preempt")?;
            children.push((node, child));
        }
        let outputs: Vec<(Node, Output)> = children
            .into_iter()
            .map(|(node, child)| Ok((node, child.wait_with_output()?)))
            .collect::<anyhow::Result<_>>()?;
        let elapsed = start.elapsed();
        let keys: Vec<u64> = t.lu(0).registrations()?.iter().map(|r| r.key).collect();
        let winner = match keys.as_slice() {
            [k] if *k == Node::A.key() => Node::A,
            [k] if *k == Node::B.key() => Node::B,
            _ => bail!(
                "round {round}: the target kept {keys:x?}, not one of the two keys:{}",
                exits(&outputs)
            ),
        };
        println!(
            "  round {round:>3}: {mode:?}, node {} kept its key, both preempts done in {} ms",
            winner.letter(),
            elapsed.as_millis()
        );
        stats.record(winner, elapsed);
    }
    Ok(stats)
}
