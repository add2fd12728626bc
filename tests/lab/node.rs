//! The two nodes as the suites drive them: who they are (their keys, their cluster names), and
//! prfence run as a node on all of its devices, on either target (LIO's [`Topology`], nvmet's
//! [`NvmeTopology`]). The one home of these helpers: a suite that needs another shape of them
//! adds it here.

use std::path::PathBuf;
use std::process::Command;

use anyhow::ensure;
use serde_json::Value;

use super::nvme::{NvmeHost, NvmeTopology};
use super::{CommandRun, PRFENCE, Topology};

/// One of the two initiators ("cluster nodes") of a topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    A,
    B,
}

impl Node {
    pub const BOTH: [Node; 2] = [Node::A, Node::B];

    /// 0 for A, 1 for B: the node's place in per-node arrays (and corosync's nodelist).
    pub fn index(self) -> usize {
        match self {
            Node::A => 0,
            Node::B => 1,
        }
    }

    pub fn letter(self) -> char {
        match self {
            Node::A => 'A',
            Node::B => 'B',
        }
    }

    pub fn lower(self) -> char {
        self.letter().to_ascii_lowercase()
    }

    pub fn other(self) -> Node {
        match self {
            Node::A => Node::B,
            Node::B => Node::A,
        }
    }

    /// The node's own key when the suite gives it one: A's is 0xa, B's 0xb.
    pub fn key(self) -> u64 {
        match self {
            Node::A => 0xa,
            Node::B => 0xb,
        }
    }

    /// The corosync node name the node plays in a cluster (`node1`, `node2`).
    pub fn cluster_name(self) -> &'static str {
        match self {
            Node::A => "node1",
            Node::B => "node2",
        }
    }
}

/// A key as prfence takes it (`0xa`).
pub fn hex(key: u64) -> String {
    format!("{key:#x}")
}

/// A topology whose nodes have devices prfence can be run on.
pub trait Nodes {
    /// `node`'s devices (LUN or namespace order).
    fn devices_of(&self, node: Node) -> Vec<PathBuf>;
}

impl Nodes for Topology {
    fn devices_of(&self, node: Node) -> Vec<PathBuf> {
        self.node(node).devices().to_vec()
    }
}

impl Nodes for NvmeTopology {
    fn devices_of(&self, node: Node) -> Vec<PathBuf> {
        self.devices(NvmeHost::Node(node)).to_vec()
    }
}

/// The `prfence` command line `args… --json <node's devices>`.
pub fn command(t: &impl Nodes, node: Node, args: &[&str]) -> Command {
    let mut cmd = Command::new(PRFENCE);
    cmd.args(args).arg("--json").args(t.devices_of(node));
    cmd
}

/// Runs prfence as `node` on all its devices (`--json`) and prints what it took; returns the run
/// and its JSON report (Null when it printed none).
pub fn prfence(t: &impl Nodes, node: Node, args: &[&str]) -> anyhow::Result<(CommandRun, Value)> {
    let run = super::run_command(&mut command(t, node, args))?;
    let report = serde_json::from_str(run.stdout.trim()).unwrap_or(Value::Null);
    println!(
        "  node {}: prfence {} -> exit {} in {} ms",
        node.letter(),
        args.join(" "),
        run.code(),
        run.elapsed.as_millis()
    );
    Ok((run, report))
}

/// [`prfence`], requiring exit status `code`.
pub fn prfence_expect(
    t: &impl Nodes,
    node: Node,
    args: &[&str],
    code: i32,
) -> anyhow::Result<(CommandRun, Value)> {
    let (run, report) = prfence(t, node, args)?;
    ensure!(
        run.code() == code,
        "node {}: `{}` exited {}, expected {code}:\n{}{}",
        node.letter(),
        run.command,
        run.code(),
        run.stdout,
        run.stderr
    );
    Ok((run, report))
}

/// `prfence unfence` with the node's own key on all its devices, which must succeed.
pub fn unfence(t: &impl Nodes, node: Node) -> anyhow::Result<Value> {
    let k = hex(node.key());
    Ok(prfence_expect(t, node, &["unfence", "--key", &k], 0)?.1)
}

/// `fence --key K --victim V` (the node's key, the other's as victim), plus `--tie-break SECS`
/// when `LAB_RACE_TIE_BREAK` is set (0 shows what the races do without it).
pub fn fence_args(node: Node) -> Vec<String> {
    let mut args = vec![
        "fence".into(),
        "--key".into(),
        hex(node.key()),
        "--victim".into(),
        hex(node.other().key()),
    ];
    if let Ok(secs) = std::env::var("LAB_RACE_TIE_BREAK") {
        args.extend(["--tie-break".into(), secs]);
    }
    args
}

/// `prfence fence` as `node` on all its devices ([`fence_args`]), requiring exit status `code`.
pub fn fence(t: &impl Nodes, node: Node, code: i32) -> anyhow::Result<(CommandRun, Value)> {
    let args = fence_args(node);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    prfence_expect(t, node, &args, code)
}

/// A key store stem (`FENCE_PR_STORE`) the unprivileged user `nobody` can write, under
/// [`crate::WORK`] (removed after each test): `prfence unfence` records its LUs in fence_pr's
/// store, and the default one (/run/cluster.lus) is root's.
pub fn nobody_store() -> anyhow::Result<String> {
    let dir = format!("{}/nobody-store", crate::WORK);
    std::fs::create_dir_all(&dir)?;
    crate::run("chown", ["65534:65534", dir.as_str()])?.ok()?;
    Ok(format!("{dir}/cluster"))
}
