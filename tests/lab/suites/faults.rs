//! Faults on the real target (issue #10 items 5 and 6): a hung path, a path and an LU lost in the
//! middle of a fence, a victim that keeps re-registering, and prfence run with CAP_SYS_RAWIO as
//! its only privilege. Every verdict is the target's (LIO's configfs PR state, O_DIRECT writes);
//! each test prints its measured time to verdict. Run: `cargo test --test lab_faults` (as root).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::node::{self, Nodes, hex, prfence_expect, unfence};
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{Node, Topology, WriteOutcome, block_data, write_to};
use crate::{PRFENCE, WORK};
use anyhow::{Context, ensure};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

/// Where each test keeps its commands' output, configs and hook stamps (tmpfs; teardown leaves it).
/// `--timeout` given to every prfence command here: each SCSI command's bound.
const COMMAND_TIMEOUT_S: u64 = 2;
/// `--deadline` given to `fence`: the bound of the whole fence.
const FENCE_DEADLINE_S: u64 = 10;
/// fence_pr's `power_timeout` (per SCSI command) in the monitor runs.
pub(super) const POWER_TIMEOUT_S: u64 = 2;
/// Pacemaker's default timeout for a fence device's `monitor` (the budget fence_pr works in).
pub(super) const MONITOR_BUDGET: Duration = Duration::from_secs(20);
/// Process start, discovery and report under TCG on a loaded 2-core host, on top of a budget.
const SLACK: Duration = Duration::from_secs(3);
/// The agent's watch settings in these tests (see `watch_config`).
const AGENT_CHECK_MS: u64 = 500;
const AGENT_COMMAND_TIMEOUT_MS: u64 = 1000;
const AGENT_GRACE_MS: u64 = 6000;
/// The agent's exit status after self-fencing.
const FENCED_EXIT: i32 = 86;

pub const SUITE: Suite = Suite {
    name: "faults",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(12 * 60),
    usual: Duration::from_secs(168),
    tests: crate::tests![
        hung_path_every_entry_point_ends_within_its_budget,
        reregistering_victim_is_never_reported_fenced,
        path_lost_mid_fence_then_rerun_converges,
        lu_removed_mid_fence_then_rerun_converges,
        target_restart_forgets_or_keeps_pr_state,
        unit_attention_storm_during_fence_and_watch,
        only_cap_sys_rawio_is_needed,
        a_slow_fencer_never_undoes_a_third_nodes_fence,
        a_killed_on_then_a_fence_keeps_the_node_out,
        a_watchdog_in_the_device_list_is_refused_unopened,
    ],
    long: &[],
    reproducers: &[],
};

// ----- processes with a bound -----

/// A command started in its own process group, its output going to files under [`WORK`].
pub(super) struct Started {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    start: Instant,
    /// When its stdout first had something, as far as a [`Started::poll`] saw.
    printed: Option<Duration>,
}

/// How a [`Started`] command ended, or that it had not ended by its cap (`code` None).
#[derive(Debug)]
pub(super) struct Ended {
    pub(super) name: String,
    pub(super) code: Option<i32>,
    pub(super) elapsed: Duration,
    /// When its stdout first had something (the report), if ever. A process can print its
    /// verdict and still not exit: a thread in an uninterruptible SG_IO holds the exit until the
    /// kernel gives the command up.
    pub(super) printed: Option<Duration>,
    /// Its process group (its own pid).
    pub(super) pgid: Pid,
    /// What was left of its process group when it exited ([`group_left`]): a worker held in
    /// the kernel. And when that was gone, from its start, if before the last command watched
    /// with it ended.
    pub(super) left_behind: Vec<Leftover>,
    pub(super) left_gone: Option<Duration>,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

impl Ended {
    fn report(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or(Value::Null)
    }

    /// The time to verdict: when the report was printed, or the exit for a command that prints
    /// none (fence_pr).
    pub(super) fn verdict_after(&self) -> Duration {
        self.printed.unwrap_or(self.elapsed)
    }

    pub(super) fn describe(&self) -> String {
        let printed = self
            .printed
            .map(|p| format!(", report printed after {}", crate::secs(p)))
            .unwrap_or_default();
        match self.code {
            Some(code) => format!(
                "{}: exit {code} after {}{printed}",
                self.name,
                crate::secs(self.elapsed)
            ),
            None => format!(
                "{}: still running after {} (killed){printed}",
                self.name,
                crate::secs(self.elapsed)
            ),
        }
    }

    /// [`Self::describe`] with what the command printed: for a failure whose cause is in its
    /// messages (a report missing, an unexpected exit).
    fn describe_with_output(&self) -> String {
        format!(
            "{}\nstdout: {}\nstderr: {}",
            self.describe(),
            self.stdout.trim(),
            tail(&self.stderr)
        )
    }

    /// Requires exit status `code` and the process's exit (not only its verdict) within
    /// `budget` (plus [`SLACK`]): Pacemaker and a shell wait for the exit, and read the output
    /// to EOF, so a report printed on time by a process that lingers is late all the same.
    pub(super) fn expect_exit(&self, code: i32, budget: Duration) -> anyhow::Result<()> {
        ensure!(
            self.code.is_some() && self.elapsed <= budget + SLACK,
            "{}: the process exited late (budget {} + {} slack)\nstdout: {}\nstderr: {}",
            self.describe(),
            crate::secs(budget),
            crate::secs(SLACK),
            self.stdout.trim(),
            tail(&self.stderr)
        );
        self.expect(code, budget)
    }

    /// Requires exit status `code` and the verdict within `budget` (plus [`SLACK`]).
    pub(super) fn expect(&self, code: i32, budget: Duration) -> anyhow::Result<()> {
        ensure!(
            self.code.is_some() && self.verdict_after() <= budget + SLACK,
            "{} (budget {} + {} slack)\nstdout: {}\nstderr: {}",
            self.describe(),
            crate::secs(budget),
            crate::secs(SLACK),
            self.stdout.trim(),
            tail(&self.stderr)
        );
        ensure!(
            self.code == Some(code),
            "{}, expected exit {code}\nstdout: {}\nstderr: {}",
            self.describe(),
            self.stdout.trim(),
            tail(&self.stderr)
        );
        Ok(())
    }
}

/// Wall-clock nanoseconds, to compare with the `date +%s%N` the self-fence hook writes.
fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

impl Started {
    pub(super) fn spawn(name: &str, cmd: &mut Command) -> anyhow::Result<Started> {
        std::fs::create_dir_all(WORK)?;
        let stdout = PathBuf::from(format!("{WORK}/{name}.out"));
        let stderr = PathBuf::from(format!("{WORK}/{name}.err"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&stdout)?)
            .stderr(File::create(&stderr)?)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Started {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
            start: Instant::now(),
            printed: None,
        })
    }

    fn pgid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// Waits until it exits or `cap` has passed since its start; at the cap its process group is
    /// killed and it is left behind (a thread in an uninterruptible SG_IO keeps it from dying).
    fn finish(self, cap: Duration) -> anyhow::Result<Ended> {
        let mut all = finish_all(vec![self], cap)?;
        all.pop().context("no result")
    }

    /// One look: notes when the report first appears; Some(exit code, None when capped) once
    /// it ended.
    fn poll(&mut self, cap: Duration) -> anyhow::Result<Option<Option<i32>>> {
        if self.printed.is_none() && std::fs::metadata(&self.stdout).is_ok_and(|m| m.len() > 0) {
            self.printed = Some(self.start.elapsed());
        }
        if let Some(status) = self.child.try_wait()? {
            return Ok(Some(Some(status.code().unwrap_or(-1))));
        }
        if self.start.elapsed() >= cap {
            let _ = killpg(self.pgid(), Signal::SIGKILL);
            return Ok(Some(None));
        }
        Ok(None)
    }
}

/// A process left behind: its pid and the states of its threads (`ZD`: exited but for one
/// thread in uninterruptible sleep).
pub(super) type Leftover = (i32, String);

/// The live processes of process group `pgid` (each [`Started`] command leads its own), with
/// the states of their threads: what a command left behind once its own process exited (a
/// worker held in the kernel by an uninterruptible SG_IO). A process whose threads are all
/// zombies is gone but for its reaping, so it is not counted.
fn group_left(pgid: Pid) -> Vec<Leftover> {
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp …": read after the last ')'
        let after: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, a)| a)
            .split_whitespace()
            .take(3)
            .collect();
        if after.get(2) != Some(&pgid.as_raw().to_string().as_str()) {
            continue;
        }
        let states: String = std::fs::read_dir(entry.path().join("task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
            .filter_map(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, a)| a.split_whitespace().next().map(str::to_owned))
            })
            .collect();
        if states.chars().any(|c| c != 'Z') {
            left.push((pid, states));
        }
    }
    left
}

/// [`Started::finish`] for commands running at once, watched together so that each one's time
/// to verdict is seen when it happens.
pub(super) fn finish_all(mut started: Vec<Started>, cap: Duration) -> anyhow::Result<Vec<Ended>> {
    let mut ended: Vec<Option<(Option<i32>, Duration)>> = started.iter().map(|_| None).collect();
    // what each left in its process group when it exited, and when that was gone (as long as
    // the others run)
    let mut left: Vec<(Vec<Leftover>, Option<Duration>)> =
        started.iter().map(|_| (Vec::new(), None)).collect();
    while ended.iter().any(Option::is_none) {
        for ((one, end), (left, gone)) in started.iter_mut().zip(ended.iter_mut()).zip(&mut left) {
            if end.is_none()
                && let Some(code) = one.poll(cap)?
            {
                *end = Some((code, one.start.elapsed()));
                *left = group_left(one.pgid());
            } else if end.is_some()
                && !left.is_empty()
                && gone.is_none()
                && group_left(one.pgid()).is_empty()
            {
                *gone = Some(one.start.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut all = Vec::new();
    for ((one, end), (left_behind, left_gone)) in started.into_iter().zip(ended).zip(left) {
        let (code, elapsed) = end.context("unfinished")?;
        let finished = Ended {
            name: one.name.clone(),
            code,
            elapsed,
            pgid: one.pgid(),
            left_behind,
            left_gone,
            printed: one.printed,
            stdout: std::fs::read_to_string(&one.stdout).unwrap_or_default(),
            stderr: std::fs::read_to_string(&one.stderr).unwrap_or_default(),
        };
        println!("  {}", finished.describe());
        all.push(finished);
    }
    Ok(all)
}

fn prfence_cmd(args: &[&str], devices: &[PathBuf]) -> Command {
    let mut cmd = Command::new(PRFENCE);
    cmd.args(args).arg("--json").args(devices);
    cmd
}

/// `prfence fence` by `node` (its key, the other's as victim) with this suite's bounds.
fn fence_cmd(t: &Topology, node: Node) -> Command {
    let mut args = node::fence_args(node);
    args.extend([
        "--timeout".into(),
        COMMAND_TIMEOUT_S.to_string(),
        "--deadline".into(),
        FENCE_DEADLINE_S.to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    node::command(t, node, &args)
}

fn fence_budget() -> Duration {
    Duration::from_secs(FENCE_DEADLINE_S)
}

// ----- target-side oracles -----

/// The index of the topology LU a report's `lu` names: its VPD 83h identifier (the one Linux
/// shows as the disk's wwid), or, for an LU whose identifier could not be read, its device path.
fn lu_index(t: &Topology, id: &str) -> anyhow::Result<usize> {
    let bare = |s: &str| {
        s.trim()
            .trim_start_matches("naa.")
            .trim_start_matches("0x")
            .to_ascii_lowercase()
    };
    let by_wwid = t
        .lus()
        .iter()
        .position(|lu| bare(&lu.wwid) == bare(id) || bare(id).contains(&bare(&lu.wwid)));
    let by_path = || {
        Node::BOTH
            .iter()
            .find_map(|&n| t.node(n).devices().iter().position(|d| d == Path::new(id)))
    };
    by_wwid
        .or_else(by_path)
        .with_context(|| format!("the report names LU {id:?}, which is no LU of the topology"))
}

fn keys_on(t: &Topology, lun: usize) -> anyhow::Result<Vec<u64>> {
    let mut keys: Vec<u64> = t.lu(lun).registrations()?.iter().map(|r| r.key).collect();
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

fn report_keys(lu: &Value) -> Vec<u64> {
    lu["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|k| k.as_str())
        .filter_map(|k| u64::from_str_radix(k.trim_start_matches("0x"), 16).ok())
        .collect()
}

/// The verdicts that say "the victim is fenced on this LU".
fn says_fenced(lu: &Value) -> bool {
    lu["ok"] == Value::Bool(true)
        && matches!(
            lu["verdict"].as_str(),
            Some("victim_removed" | "already_fenced")
        )
}

/// Every LU a fence report calls fenced has the victim's key gone on the target, now, and the
/// report's own read-back agrees. Returns the per-LU verdicts (by LU index) for the log.
fn nothing_reported_fenced_that_is_not(
    t: &Topology,
    finished: &Ended,
    victim: Node,
) -> anyhow::Result<Vec<(usize, String)>> {
    let report = &finished.report();
    let mut verdicts = Vec::new();
    let lus = report["lus"].as_array().with_context(|| {
        format!(
            "no `lus` in the report: {}",
            finished.describe_with_output()
        )
    })?;
    for lu in lus {
        let index = lu_index(t, lu["lu"].as_str().unwrap_or_default())
            .with_context(|| format!("in {report}"))?;
        let verdict = lu["verdict"].as_str().unwrap_or("?").to_owned();
        if says_fenced(lu) {
            ensure!(
                !report_keys(lu).contains(&victim.key()),
                "LU {index} reported {verdict} with the victim's key in its own read-back: {lu}"
            );
            let on_target = keys_on(t, index)?;
            ensure!(
                !on_target.contains(&victim.key()),
                "LU {index} reported {verdict}, but the target still has key {:#x}: {on_target:x?}",
                victim.key()
            );
        }
        verdicts.push((index, verdict));
    }
    verdicts.sort();
    Ok(verdicts)
}

/// The victim's O_DIRECT writes are refused and the survivor's accepted on LUs `luns`.
fn writes_judged(t: &Topology, survivor: Node, luns: &[usize]) -> anyhow::Result<()> {
    let victim = survivor.other();
    for &lun in luns {
        let refused = t.write_probe(victim, lun, 2);
        ensure!(
            refused == WriteOutcome::Refused,
            "LU {lun}: node {}'s write after the fence: {refused:?}",
            victim.letter()
        );
        let accepted = t.write_probe(survivor, lun, 3);
        ensure!(
            accepted == WriteOutcome::Accepted,
            "LU {lun}: node {}'s write after the fence: {accepted:?}",
            survivor.letter()
        );
    }
    Ok(())
}

/// Polls until `probe` holds or `within` passes; returns how long it took.
fn wait_until(
    within: Duration,
    what: &str,
    mut probe: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        if probe()? {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < within,
            "{what}: not within {}",
            crate::secs(within)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ----- the agent and fence_pr as node B -----

/// Watch-mode config for `key` on `devices`; with `hook` a self-fence hook writing the time there;
/// with `watchdog` the lab's softdog ([`Softdog`]) as its hardware watchdog.
fn watch_config(devices: &[PathBuf], key: u64, hook: Option<&Path>, watchdog: bool) -> String {
    let mut text = format!(
        "mode = \"watch\"\ncheck_interval = \"{AGENT_CHECK_MS}ms\"\n\
         command_timeout = \"{AGENT_COMMAND_TIMEOUT_MS}ms\"\n"
    );
    for (index, device) in devices.iter().enumerate() {
        text.push_str(&format!(
            "[[device]]\npath = \"{}\"\nname = \"lun{index}\"\n",
            device.display()
        ));
    }
    text.push_str(&format!(
        "[key]\nvalue = \"{key:#x}\"\n[watch]\ngrace = \"{AGENT_GRACE_MS}ms\"\n\
         missing_confirmations = 1\n[self_fence]\nreboot = false\n"
    ));
    if let Some(hook) = hook {
        text.push_str(&format!(
            "command = [\"/bin/sh\", \"-c\", \"date +%s%N > {}\"]\ncommand_timeout = \"4s\"\n",
            hook.display()
        ));
    }
    if watchdog {
        text.push_str(&format!(
            "[watchdog]\ndevice = \"/dev/watchdog0\"\ntimeout = \"{WATCHDOG_TIMEOUT_S}s\"\n"
        ));
    }
    text.push_str("[log]\ntarget = \"stderr\"\n");
    text
}

/// softdog's timeout in the hung-path test: above `check_interval` + one check's budget
/// (3 × (command_timeout + 200 ms) = 3.6 s), as the agent requires, and below `grace`, so a check
/// held up by the hung path would starve it.
const WATCHDOG_TIMEOUT_S: u64 = 5;
/// What softdog with `soft_noboot=1` prints when it expires.
const SOFTDOG_EXPIRED: &str = "softdog: Triggered - Reboot ignored";

/// softdog loaded with `soft_noboot=1` (it logs its expiry instead of rebooting the guest);
/// unloaded on drop.
struct Softdog;

impl Softdog {
    fn load() -> anyhow::Result<Softdog> {
        if Path::new("/sys/module/softdog").exists() {
            crate::run("rmmod", ["softdog"])?.ok()?;
        }
        let margin = format!("soft_margin={WATCHDOG_TIMEOUT_S}");
        crate::run("modprobe", ["softdog", "soft_noboot=1", &margin])?.ok()?;
        Ok(Softdog)
    }

    /// When softdog expired, in seconds of the kernel log's clock.
    fn expiries() -> anyhow::Result<Vec<f64>> {
        Ok(crate::kernel_log::records()?
            .iter()
            .filter(|r| r.text.contains(SOFTDOG_EXPIRED))
            .map(|r| r.micros as f64 / 1e6)
            .collect())
    }
}

impl Drop for Softdog {
    fn drop(&mut self) {
        let _ = crate::run("rmmod", ["softdog"]);
    }
}

/// Seconds since boot (the kernel log's clock, near enough for sub-second comparisons).
fn uptime() -> anyhow::Result<f64> {
    let text = std::fs::read_to_string("/proc/uptime")?;
    text.split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .context("bad /proc/uptime")
}

fn agent_cmd(name: &str, config: &str, once: bool) -> anyhow::Result<Command> {
    std::fs::create_dir_all(WORK)?;
    let path = PathBuf::from(format!("{WORK}/{name}.toml"));
    std::fs::write(&path, config)?;
    let mut cmd = Command::new(PRFENCE);
    cmd.arg("agent").arg("--config").arg(&path);
    if once {
        cmd.arg("--once");
    } else {
        cmd.arg("--status-file")
            .arg(format!("{WORK}/{name}.status.json"));
    }
    Ok(cmd)
}

fn agent_state(name: &str) -> String {
    std::fs::read_to_string(format!("{WORK}/{name}.status.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|status| status["state"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// `fence_pr -o monitor` as node `node`, parameters on stdin as pacemaker-fenced gives them, with
/// the node's key store (under [`WORK`]) holding `key` as its own `on` would have left it.
fn fence_pr_monitor(t: &Topology, node: Node, key: u64) -> anyhow::Result<Command> {
    fence_pr_monitor_on(t.node(node).devices(), node, key)
}

/// [`fence_pr_monitor`] on `devices` (any transport), with `power_timeout` [`POWER_TIMEOUT_S`].
pub(super) fn fence_pr_monitor_on(
    devices: &[PathBuf],
    node: Node,
    key: u64,
) -> anyhow::Result<Command> {
    std::fs::create_dir_all(WORK)?;
    let stem = format!("{WORK}/fence_pr-{}", node.letter());
    std::fs::write(format!("{stem}.key"), format!("{key:x}\n"))?;
    fence_pr_at(
        &stem,
        &format!("action=monitor\npower_timeout={POWER_TIMEOUT_S}\n"),
        devices,
    )
}

/// fence_pr with its parameters (`stdin` and `devices`) on stdin from a file, as pacemaker-fenced
/// passes them, its key store at `stem`.
fn fence_pr_at(stem: &str, stdin: &str, devices: &[PathBuf]) -> anyhow::Result<Command> {
    std::fs::create_dir_all(WORK)?;
    let link = Path::new(WORK).join("fence_pr");
    if !link.exists() {
        std::os::unix::fs::symlink(PRFENCE, &link)?;
    }
    let devices: Vec<String> = devices.iter().map(|d| d.display().to_string()).collect();
    let stdin_file = PathBuf::from(format!("{stem}.stdin"));
    std::fs::write(
        &stdin_file,
        format!("{stdin}devices={}\n", devices.join(",")),
    )?;
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" < \"$1\"")
        .arg(&link)
        .arg(&stdin_file)
        .env("FENCE_PR_STORE", stem);
    Ok(cmd)
}

// ----- the tests -----

/// Node B's iSCSI path hangs (its packets dropped silently, the session never told). Node A
/// fences B; meanwhile B's admin command, fence_pr `monitor`, agent `--once` and running agent
/// each must end within its budget with the right verdict; the target shows B fenced, and once
/// the path is back B's writes are refused.
fn hung_path_every_entry_point_ends_within_its_budget() -> anyhow::Result<()> {
    let t = Topology::iscsi_second_portal(2)?;
    t.settle()?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    let b_devices = t.node(Node::B).devices().to_vec();

    let hook = PathBuf::from(format!("{WORK}/hook-hung"));
    std::fs::create_dir_all(WORK)?;
    let _ = std::fs::remove_file(&hook);
    let _softdog = Softdog::load()?;
    // The running agent reboots when fenced, as in production, but without CAP_SYS_BOOT: its
    // reboot request fails (logged, shown in the status) instead of resetting the guest. Its hook
    // counts the agent's threads inside ioctl(2) (SG_IO stuck on the hung path) beside its time
    // stamp, so the test sees the hook ran while they were outstanding.
    let config = watch_config(&b_devices, Node::B.key(), Some(&hook), true)
        .replace("reboot = false", "reboot = true")
        .replace(
            &format!("date +%s%N > {}", hook.display()),
            &format!(
                "date +%s%N > {0}; grep -l '^{IOCTL} ' /proc/$PPID/task/*/syscall \
                 2>/dev/null | wc -l >> {0}",
                hook.display()
            ),
        )
        .replace(
            "target = \"stderr\"",
            "target = \"stderr\"\nformat = \"json\"",
        );
    let watch_spawned_ns = now_ns();
    let watch = Started::spawn(
        "agent-watch-b",
        &mut without_cap_sys_boot(agent_cmd("agent-watch-b", &config, false)?)?,
    )?;
    // A second agent on B's LUs, stopped (SIGTERM, as systemd stops it) while its READ KEYS is
    // stuck on the hung path; its grace outlasts the test, so it never self-fences.
    let stop_config = watch_config(&b_devices, Node::B.key(), None, false).replace(
        &format!("grace = \"{AGENT_GRACE_MS}ms\""),
        "grace = \"10min\"",
    );
    let stop_spawned = Instant::now();
    let stop = Started::spawn(
        "agent-stop-b",
        &mut agent_cmd("agent-stop-b", &stop_config, false)?,
    )?;
    let stop_pid = stop.pgid();
    wait_until(Duration::from_secs(60), "B's agents healthy", || {
        Ok(agent_state("agent-watch-b") == "healthy" && agent_state("agent-stop-b") == "healthy")
    })?;

    let hung = t.hang_path(Node::B)?;
    let hung_at = Instant::now();
    // SIGTERM once its commands have been stuck for a while (a check every 500 ms, each given up
    // after 1 s, the kernel holding them ~10 s), noting how many of its threads were in ioctl(2)
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(STOP_AFTER_HANG.saturating_sub(hung_at.elapsed()));
        let in_ioctl = threads_in_ioctl(stop_pid);
        let _ = nix::sys::signal::kill(stop_pid, Signal::SIGTERM);
        (Instant::now(), in_ioctl)
    });
    let hung_wall_ns = now_ns();
    let hung_uptime = uptime()?;
    let starved_before_hang = Softdog::expiries()?;
    println!("node B's path hung (packets dropped)");
    let timeout = COMMAND_TIMEOUT_S.to_string();
    // fence_pr on the hung node: `status` of its own key, and `off` of A (B fencing its peer
    // back, as a partitioned node does; its PREEMPT never reaches the target: the READ KEYS
    // before it hangs)
    let stem = format!("{WORK}/fence_pr-b-hung");
    std::fs::write(format!("{stem}.key"), format!("{:x}\n", Node::B.key()))?;
    let pr_status = Started::spawn(
        "fence_pr-status-b",
        &mut fence_pr_at(
            &stem,
            &format!(
                "action=status\npower_timeout={POWER_TIMEOUT_S}\nkey={:x}\n",
                Node::B.key()
            ),
            &b_devices,
        )?,
    )?;
    let pr_off = Started::spawn(
        "fence_pr-off-by-b",
        &mut fence_pr_at(
            &stem,
            &format!(
                "action=off\npower_timeout={POWER_TIMEOUT_S}\nkey={:x}\n",
                Node::A.key()
            ),
            &b_devices,
        )?,
    )?;
    // Eight commands, each two processes (supervisor and worker) of a debug build under TCG,
    // started at once: their start-ups take seconds, which a command's deadline counts (from
    // the supervisor's start). The two above (20 s budgets) get a second's head start; the rest
    // still give their verdicts before the kernel lets go of a hung SG_IO (~10 s here), so
    // their workers are left in the kernel (checked below).
    std::thread::sleep(Duration::from_secs(1));
    let keys = Started::spawn(
        "keys-b",
        &mut prfence_cmd(&["keys", "--timeout", &timeout], &b_devices[..1]),
    )?;
    // status: its --deadline one command's timeout (discovery and the opens inside it), its
    // budget as keys'
    let status_deadline = COMMAND_TIMEOUT_S.to_string();
    let status = Started::spawn(
        "status-b",
        &mut prfence_cmd(
            &[
                "status",
                "--key",
                &format!("{:x}", Node::B.key()),
                "--timeout",
                &timeout,
                "--deadline",
                &status_deadline,
            ],
            &b_devices,
        ),
    )?;
    let monitor = Started::spawn(
        "monitor-b",
        &mut fence_pr_monitor(&t, Node::B, Node::B.key())?,
    )?;
    let once = Started::spawn(
        "agent-once-b",
        &mut agent_cmd(
            "agent-once-b",
            &watch_config(&b_devices, Node::B.key(), None, false),
            true,
        )?,
    )?;
    let fence = Started::spawn("fence-by-a", &mut fence_cmd(&t, Node::A))?;
    // a single command's deadline is twice its --timeout (src/cli/args.rs): the open, then the
    // command, may each block that long
    let keys_budget = Duration::from_secs(2 * COMMAND_TIMEOUT_S);
    let once_budget = Duration::from_millis(AGENT_GRACE_MS);
    // the running agent: a check may be under way when the key becomes unreadable, then grace
    let watch_budget =
        Duration::from_millis(AGENT_CHECK_MS + AGENT_COMMAND_TIMEOUT_MS + AGENT_GRACE_MS);
    let cap = MONITOR_BUDGET + SLACK + Duration::from_secs(2);
    let [
        fence,
        keys,
        once,
        monitor,
        watch,
        status,
        pr_status,
        pr_off,
        stop,
    ]: [Ended; 9] = finish_all(
        vec![
            fence, keys, once, monitor, watch, status, pr_status, pr_off, stop,
        ],
        cap,
    )?
    .try_into()
    .map_err(|_| anyhow::anyhow!("nine results expected"))?;
    let (stopped_at, stopped_in_ioctl) = stopper
        .join()
        .map_err(|_| anyhow::anyhow!("the stopping thread panicked"))?;
    let stop_exit_after = (stop_spawned + stop.elapsed).saturating_duration_since(stopped_at);
    // what B's one-shot commands left behind when they exited: a worker held in the kernel
    let one_shots = [&keys, &status, &monitor, &pr_status, &pr_off, &once];
    for one in one_shots.iter().filter(|e| !e.left_behind.is_empty()) {
        println!(
            "  {} exited after {}, leaving (pid, thread states) {:?} in the kernel: gone {}",
            one.name,
            crate::secs(one.elapsed),
            one.left_behind,
            one.left_gone.map_or("later".to_owned(), |at| format!(
                "after {}",
                crate::secs(at)
            ))
        );
    }
    // when the running agent self-fenced, counted from the hang (the hook writes the time, then
    // how many of the agent's threads were inside ioctl(2))
    let hook_text = std::fs::read_to_string(&hook).unwrap_or_default();
    let mut hook_lines = hook_text.lines().map(|l| l.trim().parse::<u64>().ok());
    let hook_at_ns = hook_lines.next().flatten();
    let hung_threads = hook_lines.next().flatten();
    let self_fenced_after =
        hook_at_ns.map(|at| Duration::from_nanos(at.saturating_sub(hung_wall_ns)));
    let steps = SelfFenceTimes::from_log(&watch.stderr);

    // softdog must not expire before the self-fence: a check held up by the hung path must not
    // starve it (that would reset a node still inside its grace).
    let self_fence_uptime = self_fenced_after.map(|d| hung_uptime + d.as_secs_f64());
    let expiries = Softdog::expiries()?;
    let first_expiry = expiries.iter().copied().find(|&at| at >= hung_uptime);

    // The target's verdict first: A fenced B whatever B's path did.
    for lun in 0..t.lus().len() {
        let keys = keys_on(&t, lun)?;
        ensure!(
            keys == [Node::A.key()],
            "LU {lun}: after A's fence the target has keys {keys:x?}"
        );
    }
    hung.release()?;
    let released = Instant::now();
    // B's session comes back; its next write must be refused (it may wait for the re-login).
    let refused = t.write_probe(Node::B, 0, 2);
    println!(
        "path released; B's first write {refused:?} after {}",
        crate::secs(released.elapsed())
    );
    // The workers left in the kernel end once the kernel gives their SG_IO up (iSCSI's
    // replacement_timeout) or the path is back; none may outlive this test.
    for one in one_shots.iter().filter(|e| e.left_gone.is_none()) {
        let pgid = one.pgid;
        if let Err(e) = wait_until(
            Duration::from_secs(30),
            &format!("{}'s worker gone", one.name),
            || Ok(group_left(pgid).is_empty()),
        ) {
            let left = group_left(pgid);
            let _ = killpg(pgid, Signal::SIGKILL);
            anyhow::bail!(
                "{e:#}: {left:?} still there {} after the path came back",
                crate::secs(released.elapsed())
            );
        }
    }
    ensure!(
        refused == WriteOutcome::Refused,
        "B's write after the fence: {refused:?}"
    );
    writes_judged(&t, Node::A, &[0, 1])?;

    println!(
        "hung path, time to verdict (exit): A's fence {} ({}) | B: prfence keys {} ({}) | \
         prfence status {} ({}) | fence_pr monitor ({}) status ({}) off ({}) | agent --once {} \
         ({}) | running agent: exit {:?}, self-fence hook {} after the hang",
        crate::secs(fence.verdict_after()),
        crate::secs(fence.elapsed),
        crate::secs(keys.verdict_after()),
        crate::secs(keys.elapsed),
        crate::secs(status.verdict_after()),
        crate::secs(status.elapsed),
        crate::secs(monitor.elapsed),
        crate::secs(pr_status.elapsed),
        crate::secs(pr_off.elapsed),
        crate::secs(once.verdict_after()),
        crate::secs(once.elapsed),
        watch.code,
        self_fenced_after.map_or("never ran".to_owned(), crate::secs),
    );
    println!(
        "self-fence with every path hung ({} agent threads in ioctl(2) at the \
         hook): decision -> hook {} -> reboot request {} (reboot(2) {})",
        hung_threads.map_or("?".to_owned(), |n| n.to_string()),
        steps.after(steps.decided, hook_at_ns),
        steps.after(steps.decided, steps.reboot_requested),
        if steps.reboot_refused {
            "refused: no CAP_SYS_BOOT, as arranged"
        } else {
            "not seen"
        },
    );
    println!(
        "agent stopped {} after the hang with {stopped_in_ioctl} thread(s) in ioctl(2): exit {:?} \
         {} after SIGTERM",
        crate::secs(stopped_at.saturating_duration_since(hung_at)),
        stop.code,
        crate::secs(stop_exit_after)
    );
    println!(
        "softdog ({WATCHDOG_TIMEOUT_S} s): first expiry {} after the hang",
        first_expiry.map_or("none yet".to_owned(), |at| format!(
            "{:.3} s",
            at - hung_uptime
        ))
    );
    // Each entry point's verdict within its budget.
    fence.expect(0, fence_budget())?;
    let mut failures = Vec::new();
    // The test shows what it is for only if some entry point exited with its worker still held
    // in the kernel.
    if one_shots.iter().all(|e| e.left_behind.is_empty()) {
        failures.push(
            "no entry point exited while its worker was held in the kernel: the hang did not \
             outlast the verdicts, the test showed nothing"
                .to_owned(),
        );
    }
    if !starved_before_hang.is_empty() {
        failures.push(format!(
            "softdog expired while B's agent was healthy, before the hang: {starved_before_hang:?}"
        ));
    }
    if let (Some(expiry), Some(self_fence)) = (first_expiry, self_fence_uptime)
        && expiry < self_fence
    {
        failures.push(format!(
            "softdog expired {:.3} s after the hang, before the self-fence at {:.3} s: a check \
             held up by the hung path starved the watchdog",
            expiry - hung_uptime,
            self_fence - hung_uptime
        ));
    }
    // B's one-shot entry points: each process exits within its budget (their callers wait for
    // the exit), whatever is still stuck in the kernel.
    if let Err(e) = keys.expect_exit(1, keys_budget) {
        failures.push(format!("prfence keys: {e:#}"));
    }
    if let Err(e) = status.expect_exit(1, keys_budget) {
        failures.push(format!("prfence status: {e:#}"));
    }
    if let Err(e) = monitor.expect_exit(1, MONITOR_BUDGET) {
        failures.push(format!("fence_pr monitor: {e:#}"));
    }
    if let Err(e) = pr_status.expect_exit(1, MONITOR_BUDGET) {
        failures.push(format!("fence_pr status: {e:#}"));
    }
    if let Err(e) = pr_off.expect_exit(1, MONITOR_BUDGET) {
        failures.push(format!("fence_pr off: {e:#}"));
    } else if !pr_off.stderr.contains("not fenced") {
        failures.push(format!(
            "fence_pr off does not say A is not fenced: {}",
            pr_off.describe_with_output()
        ));
    }
    if let Err(e) = once.expect_exit(3, once_budget) {
        failures.push(format!("agent --once: {e:#}"));
    } else if !once.stdout.contains("\"verdict\": \"unreadable") {
        failures.push(format!(
            "agent --once does not call the LUs unreadable: {}",
            once.stdout
        ));
    }
    match self_fenced_after {
        Some(after) if after <= watch_budget + SLACK && watch.code == Some(FENCED_EXIT) => {}
        _ => failures.push(format!(
            "running agent: self-fence hook {:?} after the hang (budget {} + {} slack), {}\n{}",
            self_fenced_after,
            crate::secs(watch_budget),
            crate::secs(SLACK),
            watch.describe(),
            tail(&watch.stderr)
        )),
    }
    // A stopped agent exits at once, its stuck commands left to the kernel (they go through the
    // paths' sg nodes, whose wait a dying process leaves): through the block nodes the exit
    // waited until the kernel gave the commands up.
    if stopped_in_ioctl == 0 {
        failures.push(
            "no thread of the stopped agent was in ioctl(2) at its SIGTERM: the test did not \
             stop it beside a stuck command"
                .to_owned(),
        );
    }
    if stop.code != Some(0) || stop_exit_after > STOP_EXIT {
        failures.push(format!(
            "agent stopped on a hung path: {}, {} after SIGTERM (within {})\n{}",
            stop.describe(),
            crate::secs(stop_exit_after),
            crate::secs(STOP_EXIT),
            tail(&stop.stderr)
        ));
    }
    // The self-fence never waits for storage: the hook starts, and the reboot is requested once
    // it is done, within SELF_FENCE_STEP of the step before, with the hung calls still stuck.
    match (steps.decided, hook_at_ns, steps.reboot_requested) {
        (Some(decided), Some(hook_at), Some(reboot)) => {
            let to_hook = Duration::from_nanos(hook_at.saturating_sub(decided));
            let to_reboot = Duration::from_nanos(reboot.saturating_sub(hook_at));
            if to_hook > SELF_FENCE_STEP || to_reboot > SELF_FENCE_STEP || reboot < hook_at {
                failures.push(format!(
                    "self-fence: decision -> hook {}, hook -> reboot request {} (each within {})",
                    crate::secs(to_hook),
                    crate::secs(to_reboot),
                    crate::secs(SELF_FENCE_STEP)
                ));
            }
            if !steps.reboot_refused {
                failures.push("no failed reboot(2) logged: was CAP_SYS_BOOT dropped?".to_owned());
            }
            if hung_threads.is_none_or(|n| n == 0) {
                failures.push(format!(
                    "no agent thread was in ioctl(2) at the hook ({hung_threads:?}): the test \
                     did not show the hook running beside hung commands"
                ));
            }
            // and the process is gone right after, not held by the stuck commands
            let exited = watch_spawned_ns
                .saturating_add(u64::try_from(watch.elapsed.as_nanos()).unwrap_or(u64::MAX));
            let to_exit = Duration::from_nanos(exited.saturating_sub(reboot));
            if to_exit > SELF_FENCE_EXIT {
                failures.push(format!(
                    "self-fence: the agent exited {} after its reboot request (within {}): held \
                     by its stuck commands",
                    crate::secs(to_exit),
                    crate::secs(SELF_FENCE_EXIT)
                ));
            }
        }
        missing => failures.push(format!(
            "self-fence steps (decision, hook, reboot request) not all seen: {missing:?}\n{}",
            tail(&watch.stderr)
        )),
    }
    ensure!(
        failures.is_empty(),
        "on a hung path:\n{}",
        failures.join("\n")
    );
    Ok(())
}

/// When the hung-path test stops its second agent, after the hang: its commands stuck by then.
const STOP_AFTER_HANG: Duration = Duration::from_secs(3);
/// How soon a stopped agent must have exited: its runtime's 1 s shutdown and the exit, under
/// TCG; the kernel holds a stuck command ~10 s after the hang here.
const STOP_EXIT: Duration = Duration::from_millis(2500);
/// ioctl(2)'s number on x86_64 (the lab's only architecture), the first field of
/// /proc/PID/task/TID/syscall for a thread inside it.
const IOCTL: &str = "16";

/// How many threads of `pid` are inside ioctl(2) now.
fn threads_in_ioctl(pid: Pid) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("syscall")).ok())
        .filter(|text| text.split_whitespace().next() == Some(IOCTL))
        .count()
}

/// How long each self-fence step may take after the one before (decision -> hook started,
/// hook done -> reboot requested): process start and status writes under TCG, nothing that
/// waits for the hung paths (held by them would take the ~9 s the kernel keeps their commands
/// here). Decision -> hook measured 0.30 s on an idle host, 1.03, 1.03 and 1.38 s in fresh-clone
/// CI runs, where other guests, clippy and the packages share the two CPUs: 1 s failed those.
const SELF_FENCE_STEP: Duration = Duration::from_secs(3);
/// How soon after its reboot request the self-fenced agent's process must be gone: well under
/// the ~9 s the kernel holds its stuck commands here (what "held by them" would look like), with
/// room for a one-vCPU guest's scheduling beside seven other commands (1.086 s seen in CI).
const SELF_FENCE_EXIT: Duration = Duration::from_secs(3);

/// The self-fence steps as the agent logged them (JSON log, wall-clock time stamps in ns).
#[derive(Debug, Default)]
struct SelfFenceTimes {
    decided: Option<u64>,
    reboot_requested: Option<u64>,
    reboot_refused: bool,
}

impl SelfFenceTimes {
    fn from_log(stderr: &str) -> SelfFenceTimes {
        let mut times = SelfFenceTimes::default();
        for line in stderr.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let message = event["fields"]["message"].as_str().unwrap_or_default();
            let at = event["timestamp"].as_str().and_then(rfc3339_ns);
            if message.starts_with("this node is fenced") {
                times.decided = times.decided.or(at);
            } else if message.starts_with("rebooting now") {
                times.reboot_requested = times.reboot_requested.or(at);
            } else if message.starts_with("reboot(2) failed") {
                times.reboot_refused = true;
            }
        }
        times
    }

    fn after(&self, from: Option<u64>, to: Option<u64>) -> String {
        match (from, to) {
            (Some(from), Some(to)) => crate::secs(Duration::from_nanos(to.saturating_sub(from))),
            _ => "not seen".to_owned(),
        }
    }
}

/// `2026-12-03T06:40:12.123456Z` (tracing's JSON time stamps, UTC) as ns since the epoch.
fn rfc3339_ns(text: &str) -> Option<u64> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut ymd = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, d) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut parts = hms.splitn(3, ':').map(|p| p.parse::<u64>().ok());
    let (hh, mm, ss) = (parts.next()??, parts.next()??, parts.next()??);
    let digits = fraction.get(..fraction.len().min(9))?;
    let scale = 10u64.pow(u32::try_from(9 - digits.len()).ok()?);
    let nanos = digits.parse::<u64>().ok()? * scale;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(((days * 86_400 + hh * 3_600 + mm * 60 + ss) * 1_000_000_000) + nanos)
}

/// `cmd` run by setpriv with CAP_SYS_BOOT out of its bounding set: a reboot(2) it makes fails
/// with EPERM instead of resetting the guest. Checked first, since a reboot that went through
/// would end the whole lab run.
fn without_cap_sys_boot(cmd: Command) -> anyhow::Result<Command> {
    let probe = crate::run(
        "setpriv",
        [
            "--bounding-set",
            "-sys_boot",
            "grep",
            "^CapBnd",
            "/proc/self/status",
        ],
    )?
    .ok()?;
    let mask = probe
        .stdout
        .split_whitespace()
        .nth(1)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .context("setpriv's CapBnd")?;
    ensure!(
        mask & (1 << 22) == 0,
        "setpriv did not drop CAP_SYS_BOOT (CapBnd {mask:#x})"
    );
    let mut wrapped = Command::new("setpriv");
    wrapped
        .args(["--bounding-set", "-sys_boot", "--"])
        .arg(cmd.get_program())
        .args(cmd.get_args());
    Ok(wrapped)
}

/// Node B re-registers its key (REGISTER AND IGNORE EXISTING KEY, sg_persist in a loop on every
/// LU) while A fences it. A fence report calling an LU fenced must be true at its verification:
/// if the target shows B's key there after the fence, its PRgeneration moved past the
/// generation the report read (B registered again afterwards). Once B stops, a fence converges.
fn reregistering_victim_is_never_reported_fenced() -> anyhow::Result<()> {
    const ROUNDS: usize = 6;
    let t = Topology::iscsi(4)?;
    t.settle()?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    let script = format!(
        "while :; do for d in \"$@\"; do sg_persist -n --out --register-ignore \
         --param-sark={:#x} \"$d\" >/dev/null 2>&1; done; done",
        Node::B.key()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script, "reregister"])
        .args(t.node(Node::B).devices());
    let looper = Started::spawn("reregister-b", &mut cmd)?;
    let looper_group = looper.pgid();
    let mut outcomes = Vec::new();
    for round in 1..=ROUNDS {
        let run = Started::spawn(&format!("fence-{round}"), &mut fence_cmd(&t, Node::A))?
            .finish(fence_budget() + SLACK + Duration::from_secs(5))?;
        // freeze B so that the target's state can be read against the report
        killpg(looper_group, Signal::SIGSTOP)?;
        let report = run.report();
        let mut lines = Vec::new();
        for lu in report["lus"].as_array().into_iter().flatten() {
            let index = lu_index(&t, lu["lu"].as_str().unwrap_or_default())?;
            let verdict = lu["verdict"].as_str().unwrap_or("?");
            let generation = t.lu(index).generation()?;
            if says_fenced(lu) {
                ensure!(
                    !report_keys(lu).contains(&Node::B.key()),
                    "round {round}: LU {index} reported {verdict} with B's key in its read-back"
                );
                let reported = lu["generation"].as_u64().context("no generation")?;
                // LIO bumps the device's generation for a REGISTER before it adds the
                // registration to the list READ KEYS walks, so a read can return the new
                // generation without the new key; a registration made before the read carries a
                // generation + 1 below the one the read returned.
                let registered_at = t
                    .lu(index)
                    .registrations()?
                    .iter()
                    .filter(|r| r.key == Node::B.key())
                    .map(|r| u64::from(r.generation) + 1)
                    .min();
                ensure!(
                    registered_at.is_none_or(|at| at >= reported),
                    "round {round}: LU {index} reported {verdict} at generation {reported}, but B's \
                     registration on the target dates from generation {registered_at:?} (device now \
                     at {generation}): B was registered when fence verified"
                );
            }
            lines.push(format!("LU {index} {verdict}"));
        }
        println!("  round {round}: exit {:?}: {}", run.code, lines.join(", "));
        ensure!(
            run.code.is_some(),
            "round {round}: fence did not end within its budget"
        );
        ensure!(
            run.code != Some(0)
                || report["lus"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(says_fenced),
            "round {round}: exit 0 without every LU fenced: {report}"
        );
        outcomes.push(run.code.unwrap_or(-1));
        killpg(looper_group, Signal::SIGCONT)?;
    }
    killpg(looper_group, Signal::SIGKILL)?;
    let cap = looper.start.elapsed() + Duration::from_secs(5);
    looper.finish(cap)?;
    println!(
        "re-registering victim: fence exit statuses over {ROUNDS} rounds: {outcomes:?} (0 = every \
         LU verified without B's key at that moment)"
    );
    // What the target lets a victim do that registered again after a fence: WERO admits the
    // writes of every registrant (printed: SPC's rule, not prfence's).
    for lun in 0..t.lus().len() {
        if keys_on(&t, lun)?.contains(&Node::B.key()) {
            println!(
                "  LU {lun}: B registered again after the fences; its write: {:?}",
                t.write_probe(Node::B, lun, 4)
            );
        }
    }
    // B stopped: the next fence converges and B's writes are refused.
    let start = Instant::now();
    prfence_expect(
        &t,
        Node::A,
        &[
            "fence",
            "--key",
            &hex(Node::A.key()),
            "--victim",
            &hex(Node::B.key()),
        ],
        0,
    )?;
    println!(
        "after B stopped, fence converged in {}",
        crate::secs(start.elapsed())
    );
    for lun in 0..t.lus().len() {
        let keys = keys_on(&t, lun)?;
        ensure!(keys == [Node::A.key()], "LU {lun}: keys {keys:x?}");
    }
    writes_judged(&t, Node::A, &[0, 1, 2, 3])
}

/// How many LUs these tests fence: an arbiter and a fan-out that takes a while under TCG.
const MID_FENCE_LUNS: usize = 8;

/// The LU indexes in arbiter order (prfence sorts LUs by identifier; the first is the arbiter).
fn arbiter_first(t: &Topology) -> Vec<usize> {
    let mut order: Vec<usize> = (0..t.lus().len()).collect();
    order.sort_by(|&a, &b| t.lu(a).wwid.cmp(&t.lu(b).wwid));
    order
}

/// Starts A's fence of B and returns it once the arbiter LU shows B's key gone (the fan-out is
/// under way), with how long that took.
fn fence_past_the_arbiter(t: &Topology, name: &str) -> anyhow::Result<(Started, Duration)> {
    let arbiter = arbiter_first(t)[0];
    let fence = Started::spawn(name, &mut fence_cmd(t, Node::A))?;
    let took = wait_until(fence_budget(), "B's key gone from the arbiter", || {
        Ok(!keys_on(t, arbiter)?.contains(&Node::B.key()))
    })?;
    Ok((fence, took))
}

/// The fencing node's only iSCSI session is logged out just before its fence: the devices it
/// names are gone, so it sends nothing (one of them could be the arbiter the other node uses,
/// P2) and names them. Logged in and unfenced again, its session logs out while its fence fans
/// out past the arbiter: each LU gets a verdict, none is called fenced that is not; after a
/// re-login a re-run fences every LU, and a third run finds nothing to change (P4). The fencer
/// is node B, whose portal of its own can be slowed down to hold the fan-out open.
fn path_lost_mid_fence_then_rerun_converges() -> anyhow::Result<()> {
    const FENCER: Node = Node::B;
    const VICTIM: Node = Node::A;
    let mut t = Topology::iscsi_second_portal(MID_FENCE_LUNS)?;
    t.settle()?;
    unfence(&t, FENCER)?;
    unfence(&t, VICTIM)?;
    let gone = t.devices_of(FENCER);
    let before: Vec<Vec<u64>> = (0..MID_FENCE_LUNS)
        .map(|lun| keys_on(&t, lun))
        .collect::<anyhow::Result<_>>()?;
    t.logout(FENCER)?;
    let vanished = Started::spawn(
        "fence-vanished",
        fence_cmd(&t, FENCER).env("PRFENCE_LOG", "prfence=debug"),
    )?
    .finish(fence_budget() + SLACK)?;
    vanished.expect(1, fence_budget())?;
    let after: Vec<Vec<u64>> = (0..MID_FENCE_LUNS)
        .map(|lun| keys_on(&t, lun))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        before == after,
        "a fence naming vanished devices changed keys: {before:x?} -> {after:x?}"
    );
    let report = vanished.report();
    ensure!(
        report["summary"]
            .as_str()
            .is_some_and(|s| s.contains("nothing was sent")
                && gone.iter().all(|d| s.contains(&d.display().to_string()))),
        "the summary must say nothing was sent and name every vanished device: {}",
        vanished.describe_with_output()
    );
    println!(
        "devices gone before the fence: exit 1 in {}, nothing sent: {}",
        crate::secs(vanished.elapsed),
        report["summary"].as_str().unwrap_or_default()
    );
    t.login(FENCER)?;
    unfence(&t, FENCER)?;

    // Every request on the fencer's path arrives PATH_DELAY late, so its fan-out (a few
    // commands per LU) lasts about a second; the logout starts once the arbiter is fenced and
    // ends the session after the commands under way, while the other LUs are being fenced.
    const PATH_DELAY: Duration = Duration::from_millis(250);
    let delay = t.delay_path(FENCER, PATH_DELAY)?;
    let arbiter = arbiter_first(&t)[0];
    let fence = Started::spawn("fence-logout", &mut fence_cmd(&t, FENCER))?;
    let started = fence.start;
    let arbiter_after = wait_until(
        fence_budget(),
        "the victim's key gone from the arbiter",
        || Ok(!keys_on(&t, arbiter)?.contains(&VICTIM.key())),
    )?;
    let (fence, logout) = std::thread::scope(|scope| {
        let logout = scope.spawn(|| t.logout(FENCER).map(|()| started.elapsed()));
        let fence = fence.finish(fence_budget() + SLACK + Duration::from_secs(5));
        (fence, logout.join())
    });
    delay.release()?;
    let fence = fence?;
    let logout_done = logout.map_err(|_| anyhow::anyhow!("logout thread panicked"))??;
    ensure!(
        fence.code.is_some() && fence.elapsed <= fence_budget() + SLACK,
        "{}",
        fence.describe_with_output()
    );
    let verdicts = nothing_reported_fenced_that_is_not(&t, &fence, VICTIM)?;
    for lu in fence.report()["lus"].as_array().into_iter().flatten() {
        if let Some(error) = lu["error"].as_str() {
            println!("  {}: {error}", lu["lu"].as_str().unwrap_or("?"));
        }
    }
    println!(
        "the fencer's session logged out during its fence (requests {} late; arbiter fenced at \
         {}, session gone at {}): fence exit {:?} after {}: {verdicts:?}",
        crate::secs(PATH_DELAY),
        crate::secs(arbiter_after),
        crate::secs(logout_done),
        fence.code,
        crate::secs(fence.elapsed)
    );
    ensure!(
        verdicts.len() == MID_FENCE_LUNS,
        "a verdict per LU expected, got {verdicts:?}"
    );
    // "skipped" means untouched: the victim is still registered there.
    for (lu, verdict) in &verdicts {
        ensure!(
            verdict != "skipped" || keys_on(&t, *lu)?.contains(&VICTIM.key()),
            "LU {lu} reported skipped, but the victim's key is gone there"
        );
    }

    // The re-login is a new I_T nexus, registered nowhere; the fencer's key is on the LUs through the
    // old one. `fence` never registers on the arbiter (P2, P3): if the arbiter still had the victim's
    // key, the re-run must fail there, touch nothing, and say to unfence first.
    t.login(FENCER)?;
    let direct = Started::spawn("fence-relogin", &mut fence_cmd(&t, FENCER))?
        .finish(fence_budget() + SLACK + Duration::from_secs(5))?;
    ensure!(
        direct.code.is_some() && direct.verdict_after() <= fence_budget() + SLACK,
        "{}",
        direct.describe_with_output()
    );
    let verdicts = nothing_reported_fenced_that_is_not(&t, &direct, VICTIM)?;
    println!(
        "after the re-login, fence: exit {:?} in {}: {verdicts:?}",
        direct.code,
        crate::secs(direct.elapsed)
    );
    if direct.code != Some(0) {
        ensure!(
            direct.stdout.contains("prfence unfence"),
            "a fence that fails for an unregistered new nexus must say to unfence: {}",
            direct.stdout
        );
        // the documented recovery: unfence registers the new nexus (our key is still there)
        unfence(&t, FENCER)?;
    }
    let rerun = Started::spawn("fence-rerun", &mut fence_cmd(&t, FENCER))?
        .finish(fence_budget() + SLACK + Duration::from_secs(5))?;
    rerun.expect(0, fence_budget())?;
    nothing_reported_fenced_that_is_not(&t, &rerun, VICTIM)?;
    let before: Vec<Vec<u64>> = (0..MID_FENCE_LUNS)
        .map(|lun| keys_on(&t, lun))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        before.iter().all(|keys| !keys.contains(&VICTIM.key())),
        "the victim's key left after the re-run: {before:x?}"
    );
    let again = Started::spawn("fence-again", &mut fence_cmd(&t, FENCER))?
        .finish(fence_budget() + SLACK + Duration::from_secs(5))?;
    again.expect(0, fence_budget())?;
    let after: Vec<Vec<u64>> = (0..MID_FENCE_LUNS)
        .map(|lun| keys_on(&t, lun))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        before == after,
        "a third fence changed keys: {before:x?} -> {after:x?}"
    );
    writes_judged(&t, FENCER, &(0..MID_FENCE_LUNS).collect::<Vec<_>>())?;
    println!(
        "path lost mid-fence: re-run after re-login converged in {}, third run {}",
        crate::secs(rerun.elapsed),
        crate::secs(again.elapsed)
    );
    Ok(())
}

/// The target's admin removes the last LU (in arbiter order) while A's fence fans out: each LU
/// gets a verdict, none is called fenced that is not; a re-run fences every LU still there and
/// reports the removed one failed, twice the same (P4).
fn lu_removed_mid_fence_then_rerun_converges() -> anyhow::Result<()> {
    let t = Topology::iscsi(MID_FENCE_LUNS)?;
    t.settle()?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    let removed = *arbiter_first(&t).last().context("no LU")?;
    let (fence, arbiter_after) = fence_past_the_arbiter(&t, "fence-unlink")?;
    t.remove_lun(removed)?;
    let removed_at = fence.start.elapsed();
    let fence = fence.finish(fence_budget() + SLACK + Duration::from_secs(5))?;
    ensure!(
        fence.code.is_some() && fence.elapsed <= fence_budget() + SLACK,
        "{}",
        fence.describe_with_output()
    );
    let verdicts = nothing_reported_fenced_that_is_not(&t, &fence, Node::B)?;
    println!(
        "LU {removed} removed {} into the fence (arbiter done at {}): exit {:?} after {}: \
         {verdicts:?}",
        crate::secs(removed_at),
        crate::secs(arbiter_after),
        fence.code,
        crate::secs(fence.elapsed)
    );
    ensure!(
        verdicts.len() == MID_FENCE_LUNS,
        "a verdict per LU expected, got {verdicts:?}"
    );
    let remaining: Vec<usize> = (0..MID_FENCE_LUNS).filter(|&l| l != removed).collect();
    let mut previous = None;
    for run in ["fence-rerun-1", "fence-rerun-2"] {
        let rerun = Started::spawn(run, &mut fence_cmd(&t, Node::A))?
            .finish(fence_budget() + SLACK + Duration::from_secs(5))?;
        rerun.expect(1, fence_budget())?;
        let verdicts = nothing_reported_fenced_that_is_not(&t, &rerun, Node::B)?;
        for &(lun, ref verdict) in &verdicts {
            ensure!(
                (lun == removed) != matches!(verdict.as_str(), "victim_removed" | "already_fenced"),
                "{run}: LU {lun} (removed: LU {removed}) got {verdict}: {verdicts:?}"
            );
        }
        let keys: Vec<Vec<u64>> = (0..MID_FENCE_LUNS)
            .map(|lun| keys_on(&t, lun))
            .collect::<anyhow::Result<_>>()?;
        println!("  {run}: {verdicts:?} in {}", crate::secs(rerun.elapsed));
        if let Some(previous) = &previous {
            ensure!(
                previous == &keys,
                "the re-runs differ on the target: {previous:x?} -> {keys:x?}"
            );
        }
        previous = Some(keys);
    }
    writes_judged(&t, Node::A, &remaining)
}

/// What `status`, the agent (`--once`) and `fence` report as node A after the target restarted.
fn after_restart(t: &Topology, label: &str) -> anyhow::Result<[Ended; 3]> {
    let timeout = COMMAND_TIMEOUT_S.to_string();
    let deadline = FENCE_DEADLINE_S.to_string();
    let a = hex(Node::A.key());
    let devices = t.node(Node::A).devices();
    let status = Started::spawn(
        &format!("status-{label}"),
        &mut prfence_cmd(
            &[
                "status",
                "--key",
                &a,
                "--timeout",
                &timeout,
                "--deadline",
                &deadline,
            ],
            devices,
        ),
    )?
    .finish(fence_budget() + SLACK)?;
    let once = Started::spawn(
        &format!("once-{label}"),
        &mut agent_cmd(
            &format!("once-{label}"),
            &watch_config(devices, Node::A.key(), None, false),
            true,
        )?,
    )?
    .finish(Duration::from_millis(AGENT_GRACE_MS) + SLACK)?;
    let fence = Started::spawn(&format!("fence-{label}"), &mut fence_cmd(t, Node::A))?
        .finish(fence_budget() + SLACK)?;
    println!(
        "  after the restart ({label}): status exit {:?} in {}, agent --once exit {:?} ({}) in \
         {}, fence exit {:?} in {}",
        status.code,
        crate::secs(status.elapsed),
        once.code,
        once.report()["state"]
            .as_str()
            .into_iter()
            .chain(
                once.report()["lus"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|lu| lu["verdict"].as_str())
            )
            .collect::<Vec<_>>()
            .join("; "),
        crate::secs(once.elapsed),
        fence.code,
        crate::secs(fence.elapsed)
    );
    Ok([status, once, fence])
}

/// The target restarts. Without APTPL it forgets every registration and the reservation:
/// `status` says "registered on no LU" (2), the agent check is not healthy (3), `fence` finds
/// this node fenced and touches nothing (4), and the target now takes anyone's writes. With
/// APTPL (registrations made with it, then one made without it, as the agent's probe does, which
/// keeps the LU's state; LIO's files loaded back) nothing changed: status 0, agent 0, and the
/// fence works (B's writes refused).
fn target_restart_forgets_or_keeps_pr_state() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    t.settle()?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;

    let start = Instant::now();
    t.restart_target(false)?;
    println!(
        "target restarted without APTPL; sessions back in {}",
        crate::secs(start.elapsed())
    );
    for lun in 0..2 {
        ensure!(
            keys_on(&t, lun)?.is_empty() && t.lu(lun).holder()?.is_none(),
            "LU {lun}: the restarted target still has PR state: {:?}",
            t.lu(lun).registrations()?
        );
    }
    let [status, once, fence] = after_restart(&t, "forgotten")?;
    status.expect(2, fence_budget())?;
    once.expect(3, Duration::from_millis(AGENT_GRACE_MS))?;
    fence.expect(4, fence_budget())?;
    for lun in 0..2 {
        ensure!(
            keys_on(&t, lun)?.is_empty(),
            "LU {lun}: a fence from a node that found itself fenced changed the target"
        );
        let write = t.write_probe(Node::B, lun, 2);
        ensure!(
            write == WriteOutcome::Accepted,
            "LU {lun}: with no PR state B's write should be accepted, got {write:?}"
        );
    }

    // Registrations made with APTPL: LIO writes them to its dbroot and they come back.
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    for node in Node::BOTH {
        let k = hex(node.key());
        prfence_expect(
            &t,
            node,
            &["register", "--key", &k, "--old-key", &k, "--aptpl"],
            0,
        )?;
    }
    // Then A re-registers its key without --aptpl, as the node agent's path probe does: the bit
    // of the last REGISTER applies to the whole LU, and prfence sends the LU's state along.
    let a = hex(Node::A.key());
    prfence_expect(&t, Node::A, &["register", "--key", &a, "--old-key", &a], 0)?;
    let before: Vec<Vec<u64>> = (0..2)
        .map(|l| keys_on(&t, l))
        .collect::<anyhow::Result<_>>()?;
    let start = Instant::now();
    t.restart_target(true)?;
    println!(
        "target restarted with APTPL; sessions back in {}",
        crate::secs(start.elapsed())
    );
    let after: Vec<Vec<u64>> = (0..2)
        .map(|l| keys_on(&t, l))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        before == after,
        "APTPL restart: keys {before:x?} -> {after:x?}"
    );
    for lun in 0..2 {
        ensure!(
            t.lu(lun)
                .holder()?
                .is_some_and(|h| h.initiator == t.node(Node::A).initiator),
            "LU {lun}: after an APTPL restart the holder is {:?}",
            t.lu(lun).holder()?
        );
    }
    let [status, once, fence] = after_restart(&t, "kept")?;
    status.expect(0, fence_budget())?;
    once.expect(0, Duration::from_millis(AGENT_GRACE_MS))?;
    fence.expect(0, fence_budget())?;
    for lun in 0..2 {
        ensure!(
            keys_on(&t, lun)? == [Node::A.key()],
            "LU {lun}: {:x?}",
            keys_on(&t, lun)?
        );
    }
    writes_judged(&t, Node::A, &[0, 1])
}

/// Lines the storm of [`unit_attention_storm_during_fence_and_watch`] printed: one per LU reset.
fn resets_so_far() -> usize {
    std::fs::read_to_string(format!("{WORK}/storm-c.out")).map_or(0, |t| t.lines().count())
}

/// A third initiator (no cluster node) resets the LUs in a loop (LU RESET through sg_reset: LIO
/// gives every nexus UNIT ATTENTION 29h/03h and aborts what is under way) and churns its own
/// registration, while A fences B and then while A's agent watches. The fence ends within its
/// deadline and calls nothing fenced that is not (a re-run after the storm converges); the
/// agent does not self-fence over unit attentions, and A's key stays on every LU.
fn unit_attention_storm_during_fence_and_watch() -> anyhow::Result<()> {
    const WATCHED: Duration = Duration::from_secs(8);
    let t = Topology::iscsi(4)?;
    t.settle()?;
    unfence(&t, Node::A)?;
    unfence(&t, Node::B)?;
    let c = t.third_initiator()?;
    // resets as fast as they go, beside a loop that registers and unregisters C's key
    let script = "(while :; do for d in \"$@\"; do \
                  sg_reset -d \"$d\" >/dev/null 2>&1 && echo reset; done; done) & \
                  while :; do for d in \"$@\"; do \
                  sg_persist -n --out --register-ignore --param-sark=0xc \"$d\" >/dev/null 2>&1; \
                  sg_persist -n --out --register --param-rk=0xc --param-sark=0 \"$d\" >/dev/null 2>&1; \
                  done; done";
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script, "storm"]).args(&c);
    let storm = Started::spawn("storm-c", &mut cmd)?;
    let storm_group = storm.pgid();
    wait_until(
        Duration::from_secs(30),
        "the storm's first LU reset",
        || Ok(resets_so_far() > 0),
    )?;

    let before = resets_so_far();
    let fence = Started::spawn("fence-storm", &mut fence_cmd(&t, Node::A))?
        .finish(fence_budget() + SLACK + Duration::from_secs(5))?;
    let during_fence = resets_so_far() - before;
    ensure!(
        fence.code.is_some() && fence.verdict_after() <= fence_budget() + SLACK,
        "{}",
        fence.describe_with_output()
    );
    let verdicts = nothing_reported_fenced_that_is_not(&t, &fence, Node::B)?;
    let notes: Vec<String> = fence.report()["lus"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|lu| lu["notes"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    println!(
        "UA storm: fence exit {:?} after {} with {during_fence} LU resets under way: {verdicts:?}; \
         notes: {notes:?}",
        fence.code,
        crate::secs(fence.elapsed)
    );

    let hook = PathBuf::from(format!("{WORK}/hook-storm"));
    let _ = std::fs::remove_file(&hook);
    let mut watch = Started::spawn(
        "agent-storm",
        &mut agent_cmd(
            "agent-storm",
            &watch_config(t.node(Node::A).devices(), Node::A.key(), Some(&hook), false),
            false,
        )?,
    )?;
    let mut states = std::collections::BTreeSet::new();
    let healthy_after = wait_until(Duration::from_secs(60), "A's agent healthy", || {
        Ok(agent_state("agent-storm") == "healthy")
    })?;
    let before = resets_so_far();
    let until = Instant::now() + WATCHED;
    while Instant::now() < until {
        states.insert(agent_state("agent-storm"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let during_watch = resets_so_far() - before;
    killpg(storm_group, Signal::SIGKILL)?;
    let cap = storm.start.elapsed() + Duration::from_secs(5);
    storm.finish(cap)?;
    let exited = watch.child.try_wait()?.is_some();
    let _ = killpg(watch.pgid(), Signal::SIGTERM);
    let watch = watch.finish(Duration::from_secs(60))?;
    println!(
        "UA storm: A's agent healthy after {}, then watched {} with {during_watch} LU resets: \
         states {states:?}",
        crate::secs(healthy_after),
        crate::secs(WATCHED)
    );
    ensure!(
        !exited && !hook.exists() && !states.contains("fenced"),
        "A's agent self-fenced over unit attentions: states {states:?}, {}\n{}",
        watch.describe(),
        tail(&watch.stderr)
    );
    ensure!(
        during_fence + during_watch > 0,
        "the storm reset nothing while it was measured"
    );

    // After the storm: the fence converges; A alone of the cluster's keys is left.
    let rerun = Started::spawn("fence-after-storm", &mut fence_cmd(&t, Node::A))?
        .finish(fence_budget() + SLACK)?;
    rerun.expect(0, fence_budget())?;
    for lun in 0..t.lus().len() {
        let keys = keys_on(&t, lun)?;
        ensure!(
            keys.contains(&Node::A.key()) && !keys.contains(&Node::B.key()),
            "LU {lun}: keys {keys:x?} after the storm"
        );
    }
    writes_judged(&t, Node::A, &[0, 1, 2, 3])
}

/// `setpriv` as nobody with the device nodes' group: with CAP_SYS_RAWIO alone, `prfence` reads
/// keys, unfences and fences (judged on the target); without it every command fails with exit 1
/// and a message naming CAP_SYS_RAWIO, and the target is unchanged; without the group, the open
/// fails and the message says what permission is missing.
fn only_cap_sys_rawio_is_needed() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    t.settle()?;
    // The guest has no udev: devtmpfs leaves the nodes root:root 0600. Give A's the group and
    // mode udev's default rules give a disk (root:disk 0660).
    let disk_gid = crate::run("getent", ["group", "disk"])?.ok()?.stdout;
    let disk_gid = disk_gid
        .trim()
        .split(':')
        .nth(2)
        .context("no group `disk`")?
        .to_owned();
    for device in t.node(Node::A).devices() {
        let device = device.display().to_string();
        crate::run("chgrp", [disk_gid.as_str(), &device])?.ok()?;
        crate::run("chmod", ["0660", &device])?.ok()?;
    }
    let store = node::nobody_store()?;
    let as_nobody =
        |caps: bool, group: bool, args: &[&str], node: Node| -> anyhow::Result<crate::CommandRun> {
            let mut cmd = Command::new("setpriv");
            cmd.args(["--reuid=65534", "--regid=65534"]);
            if group {
                cmd.arg(format!("--groups={disk_gid}"));
            } else {
                cmd.arg("--clear-groups");
            }
            if caps {
                cmd.args(["--inh-caps=-all,+sys_rawio", "--ambient-caps=+sys_rawio"]);
            } else {
                cmd.args(["--inh-caps=-all", "--ambient-caps=-all"]);
            }
            // unfence adds the LUs to fence_pr's record of this boot, in a store nobody can
            // write (the default, /run/cluster.lus, is root's).
            cmd.arg("--")
                .arg(PRFENCE)
                .args(args)
                .args(t.node(node).devices())
                .env("FENCE_PR_STORE", &store);
            let run = crate::run_command(&mut cmd)?;
            println!(
                "  nobody{}{}: prfence {} -> exit {} in {} ms",
                if group { " +disk" } else { "" },
                if caps { " +CAP_SYS_RAWIO" } else { "" },
                args.join(" "),
                run.code(),
                run.elapsed.as_millis()
            );
            Ok(run)
        };
    let (a, b) = (hex(Node::A.key()), hex(Node::B.key()));
    // fence_pr's default store is root's: unfence cannot add the LUs to the record there, so it
    // registers nothing.
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534"])
        .arg(format!("--groups={disk_gid}"))
        .args([
            "--inh-caps=-all,+sys_rawio",
            "--ambient-caps=+sys_rawio",
            "--",
        ])
        .arg(PRFENCE)
        .args(["unfence", "--key", &a])
        .args(t.node(Node::A).devices());
    let run = crate::run_command(&mut cmd)?;
    ensure!(
        run.code() == 1 && run.stdout.contains("run it as root") && keys_on(&t, 0)?.is_empty(),
        "`prfence unfence` as nobody with fence_pr's default store: exit {}, output:\n{}{}",
        run.code(),
        run.stdout,
        run.stderr
    );
    println!("  nobody +disk +CAP_SYS_RAWIO, fence_pr's default store: prfence unfence -> exit 1");

    // Without the capability: refused, named, and nothing changes on the target.
    for args in [vec!["keys"], vec!["unfence", "--key", &a]] {
        let run = as_nobody(false, true, &args, Node::A)?;
        let said = format!("{}{}", run.stdout, run.stderr);
        ensure!(
            run.code() == 1 && said.contains("CAP_SYS_RAWIO"),
            "`prfence {}` without CAP_SYS_RAWIO: exit {}, output:\n{said}",
            args.join(" "),
            run.code(),
        );
        println!("    says: {}", said.lines().next().unwrap_or_default());
    }
    ensure!(
        keys_on(&t, 0)?.is_empty() && keys_on(&t, 1)?.is_empty(),
        "a refused command changed the target"
    );
    // Without read permission on the node: the open fails and says so.
    let run = as_nobody(true, false, &["keys"], Node::A)?;
    let said = format!("{}{}", run.stdout, run.stderr);
    ensure!(
        run.code() == 1 && said.contains("Permission denied") && said.contains("`disk`"),
        "`prfence keys` without the device's group: exit {}, output:\n{said}",
        run.code(),
    );
    println!("    says: {}", said.lines().next().unwrap_or_default());

    // With CAP_SYS_RAWIO alone: everything works, judged on the target.
    as_nobody(true, true, &["unfence", "--key", &a], Node::A)?.ok()?;
    unfence(&t, Node::B)?;
    let keys = as_nobody(true, true, &["--json", "keys"], Node::A)?.ok()?;
    let report: Value = serde_json::from_str(keys.stdout.trim())?;
    for lun in 0..2 {
        let seen = report_keys(&report[lun]);
        ensure!(
            seen.len() == 2 && keys_on(&t, lun)? == [Node::A.key(), Node::B.key()],
            "LU {lun}: keys read {seen:x?}, on the target {:x?}",
            keys_on(&t, lun)?
        );
    }
    as_nobody(true, true, &["fence", "--key", &a, "--victim", &b], Node::A)?.ok()?;
    for lun in 0..2 {
        ensure!(
            keys_on(&t, lun)? == [Node::A.key()],
            "LU {lun}: after the unprivileged fence the target has {:x?}",
            keys_on(&t, lun)?
        );
    }
    writes_judged(&t, Node::A, &[0, 1])
}

/// Issue 19's window on the real target, with three initiators. B fences A and wins the arbiter,
/// but its commands to the other LUs are delayed (netem, [`SLOW_FENCER_DELAY`]); meanwhile C
/// fences B and returns. B's late fan-out must not bring B back: from C's success on, B's key is
/// on no LU (P3), every write B issues is refused (P1), and B's fence ends "this node was fenced"
/// (exit 4). Before the fix, B's first follower command was REGISTER AND IGNORE EXISTING KEY.
fn a_slow_fencer_never_undoes_a_third_nodes_fence() -> anyhow::Result<()> {
    const LUNS: usize = 4;
    let (a, b) = (hex(Node::A.key()), hex(Node::B.key()));
    let c = "0xc";
    let t = Topology::iscsi_second_portal(LUNS)?;
    t.settle()?;
    // B's second session goes through the first portal: its path to the arbiter, never delayed.
    let b_first_portal = t.second_session(Node::B)?;
    let c_devices = t.third_initiator()?;
    unfence(&t, Node::A)?; // A holds every LU
    let b_own = t.node(Node::B).devices().to_vec();
    let b_all: Vec<PathBuf> = b_own.iter().chain(&b_first_portal).cloned().collect();
    expect_exit(&mut prfence_cmd(&["unfence", "--key", &b], &b_all), 0)?;
    expect_exit(&mut prfence_cmd(&["unfence", "--key", c], &c_devices), 0)?;
    let order = arbiter_first(&t);
    let (arbiter, followers) = (order[0], &order[1..]);
    let mut b_devices = vec![b_first_portal[arbiter].clone()];
    b_devices.extend(followers.iter().map(|&f| b_own[f].clone()));

    let delayed = t.delay_path(Node::B, SLOW_FENCER_DELAY)?;
    let bounds = ["--tie-break", "0", "--timeout", "30", "--deadline", "60"];
    let mut args = vec!["fence", "--key", &b, "--victim", &a];
    args.extend(bounds);
    let mut b_fence = Started::spawn("fence-by-b", &mut prfence_cmd(&args, &b_devices))?;
    let b_won = wait_until(
        Duration::from_secs(20),
        "A's key gone from the arbiter",
        || Ok(!keys_on(&t, arbiter)?.contains(&Node::A.key())),
    )?;
    let mut args = vec!["fence", "--key", c, "--victim", &b];
    args.extend(bounds);
    let c_fence = Started::spawn("fence-by-c", &mut prfence_cmd(&args, &c_devices))?
        .finish(Duration::from_secs(70))?;
    c_fence.expect(0, Duration::from_secs(60))?;
    let c_returned = Instant::now();
    // The window is open only while B's delayed commands have not reached the other LUs: B
    // preempts A there first, so A's key still on each of them says they have not.
    for &lun in followers {
        ensure!(
            keys_on(&t, lun)?.contains(&Node::A.key()),
            "the window was missed: B's delayed commands reached LU {lun} before C's fence \
             returned ({} after B won the arbiter, B's path delayed {}); raise the delay",
            crate::secs(b_won + c_fence.elapsed),
            crate::secs(SLOW_FENCER_DELAY)
        );
    }
    for lun in 0..LUNS {
        let keys = keys_on(&t, lun)?;
        ensure!(
            !keys.contains(&Node::B.key()),
            "LU {lun}: C's fence of B returned 0, the target has keys {keys:x?}"
        );
    }
    println!(
        "B won the arbiter {} after its start; C's fence of B returned 0 {} later, with B's \
         commands to the other {} LUs still on their way ({} each)",
        crate::secs(b_won),
        crate::secs(c_fence.elapsed),
        followers.len(),
        crate::secs(SLOW_FENCER_DELAY)
    );

    // B writes to every other LU through its delayed path now: each write reaches the target
    // after B's own delayed commands. Meanwhile the target is read until B's fence ends.
    let (writes, back) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let writers: Vec<_> = followers
            .iter()
            .map(|&lun| {
                let device = b_own[lun].clone();
                let data = block_data(&format!("B, after C fenced it, to LU {lun}"));
                scope.spawn(move || (lun, write_to(&device, 7, &data)))
            })
            .collect();
        let mut back = None;
        while b_fence.poll(Duration::from_secs(90))?.is_none() {
            for lun in 0..LUNS {
                if back.is_none() && keys_on(&t, lun)?.contains(&Node::B.key()) {
                    back = Some((lun, c_returned.elapsed()));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let writes: Vec<(usize, WriteOutcome)> = writers
            .into_iter()
            .map(|w| w.join().map_err(|_| anyhow::anyhow!("a writer panicked")))
            .collect::<Result<_, _>>()?;
        Ok((writes, back))
    })?;
    let b_fence = b_fence.finish(Duration::from_secs(90))?;
    delayed.release()?;
    if let Some((lun, after)) = back {
        anyhow::bail!(
            "B's key was registered again on LU {lun} {} after C's fence of B returned \
             (P3)\n{}",
            crate::secs(after),
            b_fence.stdout.trim()
        );
    }
    for (lun, outcome) in &writes {
        ensure!(
            *outcome == WriteOutcome::Refused,
            "LU {lun}: B's write issued after C's fence of B returned: {outcome:?} (P1)"
        );
    }
    b_fence.expect(4, Duration::from_secs(60))?;
    for (lun, path) in b_first_portal.iter().enumerate() {
        let keys = keys_on(&t, lun)?;
        ensure!(
            !keys.contains(&Node::B.key()),
            "LU {lun}: after B's fence ended the target has keys {keys:x?}"
        );
        let probe = write_to(path, 7, &block_data("B, at the end"));
        ensure!(
            probe == WriteOutcome::Refused,
            "LU {lun}: B's write through its other session: {probe:?}"
        );
    }
    println!(
        "B's {} writes after C's fence refused; B's key on no LU at any read until B's fence \
         ended: exit 4, {} after it started",
        writes.len(),
        crate::secs(b_fence.elapsed)
    );
    Ok(())
}

/// fence_pr's `on` killed (Pacemaker's timeout) after its REGISTER reached the target, the node
/// then fenced, and its `on` run again in the same boot (Pacemaker's retry): refused, B's key on
/// no LU and its writes refused (P3, P1), until the admin's explicit `prfence unfence`. B's
/// commands are delayed (netem, [`KILLED_ON_DELAY`]) so the kill lands while the `on` is still
/// working. Before the fix, `on` recorded its LUs only after it finished, the killed one none, and
/// the second `on` registered B again (the simulation's boot family found it).
fn a_killed_on_then_a_fence_keeps_the_node_out() -> anyhow::Result<()> {
    const LUNS: usize = 2;
    let t = Topology::iscsi_second_portal(LUNS)?;
    t.settle()?;
    unfence(&t, Node::A)?;
    let (a, b) = (hex(Node::A.key()), hex(Node::B.key()));
    let b_devices = t.node(Node::B).devices().to_vec();
    let stem = format!("{WORK}/fence_pr-b-killed");
    let on = format!("action=on\nplug=node-b\nkey={:x}\n", Node::B.key());
    let b_on_lus = |t: &Topology| -> anyhow::Result<Vec<usize>> {
        let mut on = Vec::new();
        for lun in 0..LUNS {
            if keys_on(t, lun)?.contains(&Node::B.key()) {
                on.push(lun);
            }
        }
        Ok(on)
    };

    let delayed = t.delay_path(Node::B, KILLED_ON_DELAY)?;
    let first = Started::spawn("on-by-b-killed", &mut fence_pr_at(&stem, &on, &b_devices)?)?;
    let landed = wait_until(Duration::from_secs(30), "B's key on an LU", || {
        Ok(!b_on_lus(&t)?.is_empty())
    })?;
    let _ = killpg(first.pgid(), Signal::SIGKILL);
    let first = first.finish(Duration::from_secs(30))?;
    delayed.release()?;
    ensure!(
        first.code != Some(0),
        "the window was missed: B's `on` finished before it was killed ({}); raise the delay",
        first.describe_with_output()
    );
    let record = std::fs::read_to_string(format!("{stem}.lus")).unwrap_or_default();
    println!(
        "B's key reached the target {} after its `on` started; killed then, B on LUs {:?}; \
         its record: {:?}",
        crate::secs(landed),
        b_on_lus(&t)?,
        record.trim()
    );

    let a_devices = t.node(Node::A).devices().to_vec();
    let mut fence = prfence_cmd(&["fence", "--key", &a, "--victim", &b], &a_devices);
    expect_exit(&mut fence, 0)?;
    ensure!(b_on_lus(&t)?.is_empty(), "B's key after A's fence of it");

    let again = Started::spawn("on-by-b-again", &mut fence_pr_at(&stem, &on, &b_devices)?)?
        .finish(Duration::from_secs(60))?;
    again.expect(1, Duration::from_secs(60))?;
    ensure!(
        again.stderr.contains("THIS NODE WAS FENCED"),
        "B's refused `on` says why: {}",
        again.describe_with_output()
    );
    ensure!(
        b_on_lus(&t)?.is_empty(),
        "B's key is back after its `on` following the fence (P3)"
    );
    for (lun, device) in b_devices.iter().enumerate() {
        let probe = write_to(device, 7, &block_data("B, after its refused on"));
        ensure!(
            probe == WriteOutcome::Refused,
            "LU {lun}: B's write after its refused `on`: {probe:?} (P1)"
        );
    }
    // The explicit way back, from B's own store.
    let mut explicit = prfence_cmd(&["unfence", "--key", &b], &b_devices);
    explicit.env("FENCE_PR_STORE", &stem);
    expect_exit(&mut explicit, 0)?;
    ensure!(
        b_on_lus(&t)? == (0..LUNS).collect::<Vec<_>>(),
        "B after the explicit unfence"
    );
    Ok(())
}

/// How late node B's commands through its own portal reach the target in
/// [`a_killed_on_then_a_fence_keeps_the_node_out`]: long enough to kill B's `on` between its
/// REGISTER and its end, short of open-iscsi's NOP-Out timeout (5 s).
const KILLED_ON_DELAY: Duration = Duration::from_secs(2);

/// How late node B's commands through its own portal reach the target in
/// [`a_slow_fencer_never_undoes_a_third_nodes_fence`]: long enough for C's whole fence, short of
/// open-iscsi's NOP-Out timeout (5 s), which would drop the session.
const SLOW_FENCER_DELAY: Duration = Duration::from_secs(4);

/// Runs `cmd`, requiring exit status `code`.
fn expect_exit(cmd: &mut Command, code: i32) -> anyhow::Result<()> {
    let run = crate::run_command(cmd)?;
    ensure!(
        run.code() == code,
        "`{}` exited {}, expected {code}:\n{}{}",
        run.command,
        run.code(),
        run.stdout,
        run.stderr
    );
    Ok(())
}

/// Issue 44: a typo in a device list naming the watchdog must never arm it (opening
/// /dev/watchdog starts softdog, and a close without the magic character would then reset the
/// node). `prfence keys` and fence_pr `off` (its lone LU is the arbiter, so off tries it) are
/// refused naming the path, and softdog's own sysfs state stays `inactive` throughout; an open
/// of the test's own first shows that state does turn `active` when the device is opened.
fn a_watchdog_in_the_device_list_is_refused_unopened() -> anyhow::Result<()> {
    let _softdog = Softdog::load()?;
    // Only this test's expiries count: an earlier test's (the hung path's self-fence stops
    // feeding softdog on purpose) stay in the kernel log.
    let before = crate::kernel_log::mark()?;
    let dogs: Vec<PathBuf> = std::fs::read_dir("/sys/class/watchdog")?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    ensure!(dogs.len() == 1, "one watchdog (softdog) expected: {dogs:?}");
    let state_file = dogs[0].join("state");
    let state = || -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(&state_file)?.trim().to_owned())
    };
    // The control: opened, softdog is active; the magic close (`V`) stops it again.
    {
        use std::io::Write;
        let mut dog = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/watchdog")?;
        let opened = state()?;
        dog.write_all(b"V")?;
        drop(dog);
        ensure!(opened == "active", "softdog opened reads {opened:?}");
    }
    ensure!(
        state()? == "inactive",
        "softdog still {} after the magic close",
        state()?
    );
    let started = Instant::now();
    let stem = format!("{WORK}/fence_pr-typo");
    std::fs::create_dir_all(WORK)?;
    std::fs::write(format!("{stem}.key"), "a\n")?;
    for device in ["/dev/watchdog", "/dev/watchdog0"] {
        let keys = || crate::run(PRFENCE, ["keys", device]);
        let off = || {
            crate::run_command(&mut fence_pr_at(
                &stem,
                "action=off\nkey=b\n",
                &[PathBuf::from(device)],
            )?)
        };
        let runs: [(&str, &dyn Fn() -> anyhow::Result<crate::CommandRun>); 2] =
            [("prfence keys", &keys), ("fence_pr off", &off)];
        for (name, run) in runs {
            let run = run()?;
            // Judged at once, before the next run: an armed softdog stays armed.
            let now = state()?;
            ensure!(now == "inactive", "{name} {device} left softdog {now:?}");
            ensure!(
                run.code() == 1
                    && run
                        .stderr
                        .contains(&format!("{device} is a character device"))
                    && run.stderr.contains("not opened"),
                "{name} {device}: exit {}: {}{}",
                run.code(),
                run.stdout,
                run.stderr
            );
        }
    }
    let expiries = crate::kernel_log::count_since(before, SOFTDOG_EXPIRED)?;
    ensure!(
        expiries == 0,
        "softdog expired {expiries} time(s) during the test"
    );
    println!(
        "/dev/watchdog and /dev/watchdog0 refused by prfence keys and fence_pr off in {}; softdog \
         stayed inactive",
        crate::secs(started.elapsed())
    );
    Ok(())
}
