//! fence_pr and fence_scsi run the way pacemaker-fenced runs them (parameters on stdin), with a
//! fake corosync-cmapctl for their keys: shared by the suites that compare or drive the agents
//! (`lab_fence` on LIO, `lab_nvme` on nvmet).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context;

use super::{CommandRun, Node};

/// The cluster's name, in the fake cmapctl's answers and in the lab cluster's corosync.conf;
/// fence_scsi's keys (and fence_pr's, key_value=id) hash it.
pub const CLUSTER: &str = "lab";

/// The fake `corosync-cmapctl` both agents ask for the cluster name and the nodelist (node1 id 1,
/// node2 id 2), one prefix after the other as the real one prints them, under /run/lab so
/// teardown removes it.
pub fn fake_cmapctl() -> anyhow::Result<PathBuf> {
    let path = PathBuf::from("/run/lab/corosync-cmapctl");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\n[ $# -gt 0 ] || exit 1\nfor prefix; do case \"$prefix\" in\n\
         totem.cluster_name) echo 'totem.cluster_name (str) = {CLUSTER}' ;;\n\
         nodelist) printf 'nodelist.local_node_pos (u32) = 0\\n\
nodelist.node.0.name (str) = node1\\nnodelist.node.0.nodeid (u32) = 1\\n\
nodelist.node.1.name (str) = node2\\nnodelist.node.1.nodeid (u32) = 2\\n' ;;\n\
         *) exit 1 ;;\nesac; done\n"
        ),
    )?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(path)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceAgent {
    FencePr,
    FenceScsi,
}

impl FenceAgent {
    pub fn name(self) -> &'static str {
        match self {
            FenceAgent::FencePr => "fence_pr",
            FenceAgent::FenceScsi => "fence_scsi",
        }
    }

    /// The id of its fence device (tests/lab/cluster-config.sh, docs/pacemaker.md's migration).
    pub fn device(self) -> &'static str {
        match self {
            FenceAgent::FencePr => "storage-fence",
            FenceAgent::FenceScsi => "scsi-fence",
        }
    }
}

/// Lab node `node`'s fence_pr key store (the stem FENCE_PR_STORE names). Under /run/lab, which
/// every new SCSI topology empties, so each topology's nodes start as if just booted.
fn store(node: Node) -> String {
    format!("/run/lab/node-{}", node.letter().to_ascii_lowercase())
}

/// The files of [`store`]: the key, the devices, the record of the LUs `on` registered on, the
/// lock.
pub fn store_files(node: Node) -> Vec<PathBuf> {
    [".key", ".dev", ".lus", ".dev.lock"]
        .iter()
        .map(|suffix| PathBuf::from(format!("{}{suffix}", store(node))))
        .collect()
}

/// Lab node `node` rebooted, as fence_pr sees it: /run is a tmpfs, so its key store is gone, and
/// with it the record that makes `on` refuse after this node was fenced (P3).
pub fn reboot(node: Node) -> anyhow::Result<()> {
    for file in store_files(node) {
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("rm {}", file.display()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Runs `agent` as lab node `node` the way pacemaker-fenced does: parameters on stdin, one
/// `name=value` a line, env PCMK_service=pacemaker-fenced. `target` is the node acted on.
/// fence_pr keeps each lab node's key store apart (FENCE_PR_STORE); fence_scsi has one store
/// (/var/run/cluster.key), so the acting node's own key is written there first, as its own `on`
/// would have left it on a real node.
pub fn run(
    agent: FenceAgent,
    node: Node,
    action: &str,
    target: Node,
    devices: &[PathBuf],
) -> anyhow::Result<CommandRun> {
    run_under(&[], agent, node, action, target, devices)
}

/// [`run`] through `wrapper` (a command that runs the agent, `prlimit --nofile=…`).
pub fn run_under(
    wrapper: &[&str],
    agent: FenceAgent,
    node: Node,
    action: &str,
    target: Node,
    devices: &[PathBuf],
) -> anyhow::Result<CommandRun> {
    let devices: Vec<String> = devices.iter().map(|d| d.display().to_string()).collect();
    let target_name = target.cluster_name();
    let stdin = format!(
        "action={action}\nnodename={target_name}\nport={target_name}\nplug={target_name}\n\
         devices={}\ncorosync_cmap_path=/run/lab/corosync-cmapctl\n",
        devices.join(",")
    );
    let program = match agent {
        // the package's link, where pacemaker-fenced finds agents
        FenceAgent::FencePr => super::INSTALLED_FENCE_PR,
        FenceAgent::FenceScsi => "fence_scsi",
    };
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut cmd = Command::new(first);
            cmd.args(rest).arg(program);
            cmd
        }
        None => Command::new(program),
    };
    if agent == FenceAgent::FencePr {
        cmd.env("FENCE_PR_STORE", store(node));
    }
    if agent == FenceAgent::FenceScsi && action == "off" {
        let own = derived_key(node)?;
        std::fs::write("/var/run/cluster.key", format!("{own:x}\n"))?;
    }
    cmd.env("PCMK_service", "pacemaker-fenced")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("spawn {agent:?}"))?;
    std::io::Write::write_all(&mut child.stdin.take().context("stdin")?, stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    let run = CommandRun {
        command: format!("{agent:?} as node {} <<< {stdin:?}", node.letter()),
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
    };
    println!(
        "  node {}: {agent:?} action={action} target={target_name} -> exit {} in {} ms",
        node.letter(),
        run.code(),
        run.elapsed.as_millis()
    );
    Ok(run)
}

pub fn expect(
    which: FenceAgent,
    node: Node,
    action: &str,
    target: Node,
    devices: &[PathBuf],
    code: i32,
) -> anyhow::Result<CommandRun> {
    run(which, node, action, target, devices)?.exited_with(code)
}

/// fence_scsi's key for `node` (key_value=id): the first 4 hex digits of md5([`CLUSTER`]), then
/// the node's position in corosync's nodelist (`nodelist.node.<N>.name`, not its nodeid; node1
/// first) as 4 decimal digits, read as hex. Computed here with md5sum, independently of both
/// agents, once per process (the cluster suite asks in its polling loops).
pub fn derived_key(node: Node) -> anyhow::Result<u64> {
    derived_key_at(node.index())
}

/// fence_scsi's key with `key_value=hash` of the node named `node`: md5(cluster name)'s first 4
/// hex digits, then md5(node name)'s.
pub fn hash_key(node: &str) -> anyhow::Result<u64> {
    let md5 = |text: &str| -> anyhow::Result<String> {
        let out = super::run("sh", ["-c", &format!("printf %s '{text}' | md5sum")])?.ok()?;
        Ok(out.stdout.get(..4).unwrap_or_default().to_owned())
    };
    Ok(u64::from_str_radix(
        &format!("{}{}", md5(CLUSTER)?, md5(node)?),
        16,
    )?)
}

/// fence_scsi's key (key_value=id) of the node at `position` in corosync's nodelist.
pub fn derived_key_at(position: usize) -> anyhow::Result<u64> {
    static MD5: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let md5 = match MD5.get() {
        Some(md5) => md5,
        None => {
            let out = super::run("sh", ["-c", &format!("printf {CLUSTER} | md5sum")])?.ok()?;
            MD5.get_or_init(|| out.stdout)
        }
    };
    let text = format!("{}{:04}", md5.get(..4).unwrap_or_default(), position);
    Ok(u64::from_str_radix(&text, 16)?)
}
