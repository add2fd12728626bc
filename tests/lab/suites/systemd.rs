//! A booted node: the guest runs systemd as PID 1 (tests/lab/init, `lab.init=systemd`), the .deb
//! is installed with dpkg (and, once it is purged, the .rpm with rpm: long tier), and the agent
//! runs as the packaged unit with its whole sandbox (capabilities, device policy, read-only
//! system, seccomp), driven by the admin's own commands (`systemctl enable --now`, `reload`,
//! `restart`, `stop`). What the lab stands in for: the root
//! file system is the host's, seen through a tmpfs overlay; the second node is a second iSCSI
//! initiator in the same guest, driven with the prfence CLI. Every verdict comes from the target
//! (READ KEYS through configfs), from systemd (`systemctl show`), from /proc (the process's
//! capabilities and seccomp mode) and from the watchdog driver's own state.
//! Run: `cargo test --test lab -- systemd::` (as root).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

use crate::node::{self, Node};
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{Topology, secs};

pub const SUITE: Suite = Suite {
    name: "systemd",
    kernel: GuestKernel::Host,
    package: true,
    init: GuestInit::Systemd,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(15 * 60),
    usual: Duration::from_secs(175),
    tests: crate::tests![
        the_packaged_unit_starts_reloads_restarts_and_stops_disarmed,
        // ends the guest: the last test of the last suite of its guest
        a_fenced_node_runs_its_hook_then_resets
    ],
    // the long tier's (CI's 25 minutes on the slower 2-CPU machine): the .deb's purge and the
    // .rpm on a Debian node, standing in for a RHEL one (CI keeps the .deb's install in every
    // package guest and the unit's life above); the unit started with the cluster down (CI
    // keeps Pacemaker's unfencing in cluster::quick_start_as_written); the stop hook's block
    // run as written, the status kept after the stop (CI keeps the hook run in the sandbox
    // before the reset, below). Run with --ignored alone, as the long tier is: CI's last test
    // above ends the guest
    long: crate::tests![
        the_package_removes_then_purges_to_nothing_on_an_enabled_node,
        a_fenced_node_runs_its_stop_hook_in_the_sandbox_and_keeps_its_status,
        a_node_started_with_the_cluster_down_arms_once_pacemaker_unfences_it,
        the_rpm_installs_upgrades_under_a_running_agent_and_erases
    ],
    reproducers: &[],
};

pub(super) const UNIT: &str = "prfence-agent.service";
pub(super) const CONFIG: &str = "/etc/prfence/agent.toml";
pub(super) const STATUS: &str = "/run/prfence/status.json";
const RUNTIME_DIR: &str = "/run/prfence";
/// softdog's default margin (`soft_margin`, 60 s): the agent checks that `watchdog.timeout`
/// equals the driver's.
const SOFTDOG_TIMEOUT: &str = "60s";
/// How long the agent may take to report a state under emulation.
const SETTLE: Duration = Duration::from_secs(60);

/// CAP_SYS_RAWIO (17) and CAP_SYS_BOOT (22): the unit's `CapabilityBoundingSet=`.
const UNIT_CAPS: u64 = (1 << 17) | (1 << 22);
/// CAP_KILL (5): what docs/agent.md's stop-hook drop-in adds.
const CAP_KILL: u64 = 1 << 5;

/// `systemctl ARGS`, which must succeed (else the error holds the agent's journal).
pub(super) fn systemctl(args: &[&str]) -> anyhow::Result<String> {
    let run = crate::run("systemctl", args)?;
    if run.code() != 0 {
        bail!(
            "systemctl {} exited {}: {}{}\nthe agent's journal:\n{}",
            args.join(" "),
            run.code(),
            run.stdout,
            run.stderr,
            journal()
        );
    }
    Ok(run.stdout)
}

/// One property of a unit (`systemctl show -p NAME --value`).
pub(super) fn show(unit: &str, property: &str) -> anyhow::Result<String> {
    Ok(systemctl(&["show", unit, "-p", property, "--value"])?
        .trim()
        .to_owned())
}

pub(super) fn status() -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(STATUS).with_context(|| format!("reading {STATUS}"))?;
    serde_json::from_str(&text).with_context(|| format!("{STATUS} is not JSON: {text}"))
}

/// Waits until `done` holds (checked every 200 ms), for at most `within`; the journal of the
/// unit goes into the error.
fn wait_for(
    what: &str,
    within: Duration,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        if done().unwrap_or(false) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > within {
            bail!(
                "{what}: not within {}; the unit's journal:\n{}",
                secs(within),
                journal()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(super) fn journal() -> String {
    crate::run("journalctl", ["-u", UNIT, "--no-pager", "-n", "40"])
        .map(|r| r.stdout)
        .unwrap_or_default()
}

fn state_is(state: &str) -> anyhow::Result<bool> {
    Ok(status()?["state"] == state)
}

/// The unit's main process's bounding set, `NoNewPrivs` and seccomp mode from /proc.
fn sandbox_of(pid: &str) -> anyhow::Result<(u64, String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let bounding = u64::from_str_radix(&field("CapBnd:"), 16)
        .with_context(|| format!("CapBnd of {pid}: {text}"))?;
    Ok((bounding, field("NoNewPrivs:"), field("Seccomp:")))
}

fn watchdog_state() -> String {
    std::fs::read_to_string("/sys/class/watchdog/watchdog0/state")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unreadable ({e})"))
}

/// Whether `key` is registered, LU by LU of `t`, read from the target.
fn registered(t: &Topology, key: u64) -> anyhow::Result<Vec<bool>> {
    t.lus()
        .iter()
        .map(|lu| Ok(lu.registrations()?.iter().any(|r| r.key == key)))
        .collect()
}

/// The agent's configuration for node A (key 0xa) on `devices`, with `tables` after the key.
fn config(devices: &[PathBuf], tables: &str) -> String {
    let mut text =
        String::from("mode = \"watch\"\ncheck_interval = \"1s\"\ncommand_timeout = \"2s\"\n");
    for (i, d) in devices.iter().enumerate() {
        text.push_str(&format!(
            "[[device]]\npath = \"{}\"\nname = \"lun{i}\"\n",
            d.display()
        ));
    }
    text.push_str("[key]\nvalue = \"0xa\"\n");
    text.push_str(tables);
    text
}

/// What the tests change in the guest's system (the package's config, the units they start, the
/// runtime directory, the files they add), put back when dropped: the next test, and the residue
/// check, find the guest as the package left it.
pub(super) struct Restore {
    /// The package's agent.toml, which the tests rewrite.
    config: String,
    times: crate::residue::WrittenTimes,
    remove: Vec<PathBuf>,
    /// Directories whose new files (those not in the list) are removed.
    emptied: Vec<(PathBuf, Vec<PathBuf>)>,
    units: Vec<&'static str>,
}

impl Restore {
    pub(super) fn take() -> anyhow::Result<Restore> {
        Ok(Restore {
            config: std::fs::read_to_string(CONFIG)
                .with_context(|| format!("{CONFIG}: the package's configuration"))?,
            times: crate::residue::WrittenTimes::take(),
            remove: vec![PathBuf::from(RUNTIME_DIR)],
            emptied: Vec::new(),
            units: vec![UNIT],
        })
    }

    /// Removes at the end what `dir` holds then and not now.
    fn empty_after(&mut self, dir: &str) {
        let mut before = Vec::new();
        files_under(std::path::Path::new(dir), &mut before);
        self.emptied.push((PathBuf::from(dir), before));
    }
}

fn files_under(dir: &std::path::Path, all: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            files_under(&entry.path(), all);
        } else {
            all.push(entry.path());
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        for unit in &self.units {
            let _ = crate::run("systemctl", ["stop", unit]);
            let _ = crate::run("systemctl", ["reset-failed", unit]);
        }
        let _ = crate::run("systemctl", ["disable", "--quiet", UNIT]);
        for path in &self.remove {
            let _ = std::fs::remove_dir_all(path).or_else(|_| std::fs::remove_file(path));
        }
        for (dir, before) in &self.emptied {
            let mut now = Vec::new();
            files_under(dir, &mut now);
            for file in now.iter().filter(|f| !before.contains(f)) {
                let _ = std::fs::remove_file(file);
            }
        }
        let _ = crate::run("systemctl", ["daemon-reload"]);
        let _ = std::fs::write(CONFIG, &self.config);
        let _ = crate::run("modprobe", ["-r", "softdog"]);
        self.times.restore();
    }
}

/// The admin's day with the packaged unit: `--check-config`, `systemctl enable --now`, a reload
/// that adds an LU, a restart, a stop. Each step is judged by systemd (active, READY, the main
/// process), by /proc (the running agent has the unit's two capabilities, no new privileges, a
/// seccomp filter), by the status the unit's agent writes and serves, and by the watchdog driver
/// (armed while the agent runs, disarmed after the stop); the registration stays on the target.
fn the_packaged_unit_starts_reloads_restarts_and_stops_disarmed() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    node::unfence(&t, Node::A)?;
    let restore = Restore::take()?;
    crate::run("modprobe", ["softdog"])?.ok()?;
    let devices = t.node(Node::A).devices().to_vec();
    let tables = format!(
        "[watchdog]\ndevice = \"/dev/watchdog0\"\ntimeout = \"{SOFTDOG_TIMEOUT}\"\n\
         [metrics]\nlisten = \"127.0.0.1:9464\"\n"
    );
    crate::write_file(CONFIG, &config(&devices[..1], &tables))?;
    crate::run(
        crate::INSTALLED_PRFENCE,
        ["agent", "--config", CONFIG, "--check-config"],
    )?
    .ok()?;

    let start = Instant::now();
    systemctl(&["enable", "--now", UNIT])?;
    // Type=notify: `enable --now` returns once the agent sent READY=1
    println!("  systemctl enable --now: {}", secs(start.elapsed()));
    ensure!(
        show(UNIT, "ActiveState")? == "active",
        "{UNIT} is not active:\n{}",
        journal()
    );
    ensure!(
        systemctl(&["is-enabled", UNIT])?.trim() == "enabled",
        "{UNIT} is not enabled"
    );
    let pid = show(UNIT, "MainPID")?;
    let (bounding, nnp, seccomp) = sandbox_of(&pid)?;
    ensure!(
        bounding == UNIT_CAPS && nnp == "1" && seccomp == "2",
        "the agent (pid {pid}) runs outside the unit's sandbox: CapBnd {bounding:#x} (want \
         {UNIT_CAPS:#x}), NoNewPrivs {nnp}, Seccomp {seccomp}"
    );
    let took = wait_for("the agent healthy", SETTLE, || state_is("healthy"))?;
    println!(
        "  healthy {} after READY; pid {pid}: CapBnd {bounding:#x}, NoNewPrivs 1, seccomp filter",
        secs(took)
    );
    ensure!(
        watchdog_state() == "active",
        "softdog is {} while the agent runs",
        watchdog_state()
    );
    let served = crate::run("curl", ["-sf", "http://127.0.0.1:9464/status"])?.ok()?;
    let served: Value = serde_json::from_str(&served.stdout)?;
    ensure!(
        served["state"] == "healthy",
        "GET /status says {}",
        served["state"]
    );

    // reload: the second LU is added to the file, and the same process watches it
    crate::write_file(CONFIG, &config(&devices, &tables))?;
    systemctl(&["reload", UNIT])?;
    wait_for("the reloaded agent watching both LUs", SETTLE, || {
        let s = status()?;
        Ok(s["lus"].as_array().is_some_and(|l| l.len() == 2) && s["state"] == "healthy")
    })?;
    ensure!(
        show(UNIT, "MainPID")? == pid,
        "the reload replaced the agent's process"
    );
    println!("  reload: the same process watches 2 LUs");

    systemctl(&["restart", UNIT])?;
    let restarted = show(UNIT, "MainPID")?;
    ensure!(
        restarted != pid && show(UNIT, "ActiveState")? == "active",
        "restart: main pid {restarted} (was {pid}), {}",
        show(UNIT, "ActiveState")?
    );
    wait_for("the restarted agent healthy", SETTLE, || {
        state_is("healthy")
    })?;
    println!("  restart: pid {pid} -> {restarted}, healthy");

    let start = Instant::now();
    systemctl(&["stop", UNIT])?;
    let stopped = (show(UNIT, "ActiveState")?, show(UNIT, "Result")?);
    ensure!(
        stopped == ("inactive".to_owned(), "success".to_owned()),
        "after the stop the unit is {stopped:?}:\n{}",
        journal()
    );
    ensure!(
        watchdog_state() == "inactive",
        "softdog is {} after a clean stop: it would reset the node",
        watchdog_state()
    );
    ensure!(
        registered(&t, Node::A.key())?.iter().all(|&r| r),
        "the stop unregistered node A: {:?}",
        registered(&t, Node::A.key())?
    );
    println!(
        "  stop: {}, unit inactive (success), softdog inactive, key 0xa still on both LUs",
        secs(start.elapsed())
    );
    drop(restore);
    Ok(())
}

/// The link `systemctl enable` makes for the unit (its `WantedBy=multi-user.target`).
const ENABLED_LINK: &str = "/etc/systemd/system/multi-user.target.wants/prfence-agent.service";

/// Issue 46: the .deb's life on a node where the admin enabled the agent, as piuparts checks a
/// package, with docs/packages.md's commands: `dpkg --remove` takes every file but the
/// configuration; `dpkg --purge` then leaves no file, directory or link of the package's, the
/// enable link included (a dangling link there made systemd warn at every boot). Judged on the
/// file system and on dpkg's and systemd's own view. The package is installed again
/// afterwards, as the suite found it.
fn the_package_removes_then_purges_to_nothing_on_an_enabled_node() -> anyhow::Result<()> {
    let deb = PathBuf::from(std::env::var("LAB_PACKAGE").context("LAB_PACKAGE")?);
    let _restore = Restore::take()?;
    let _reinstall = crate::residue::ReinstallOnDrop::new(&deb);
    remove_then_purge()
}

/// Issue 46: the .rpm's life with rpm itself (see [`rpm_cycle`]) on this node, the .deb purged
/// first and installed again afterwards.
fn the_rpm_installs_upgrades_under_a_running_agent_and_erases() -> anyhow::Result<()> {
    let deb = PathBuf::from(std::env::var("LAB_PACKAGE").context("LAB_PACKAGE")?);
    let t = Topology::iscsi(2)?;
    node::unfence(&t, Node::A)?;
    let mut restore = Restore::take()?;
    restore
        .remove
        .extend([PathBuf::from(RPM_DB), PathBuf::from(RPMSAVE)]);
    let _reinstall = crate::residue::ReinstallOnDrop::new(&deb);
    crate::run("dpkg", ["--purge", "prfence"])?.ok()?;
    ensure!(
        !std::path::Path::new(crate::INSTALLED_PRFENCE).exists(),
        "dpkg --purge left {}",
        crate::INSTALLED_PRFENCE
    );
    // then, dropped in turn: the .deb installed again, the guest's files put back
    rpm_cycle(&t)
}

/// Those of `paths` that still exist (a link counts, whatever it points to).
fn left(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .map(|p| p.display().to_string())
        .collect()
}

/// `dpkg --remove`, then `dpkg --purge`, of the installed .deb, each judged.
fn remove_then_purge() -> anyhow::Result<()> {
    let listed = crate::run("dpkg", ["-L", "prfence"])?.ok()?.stdout;
    // What is the package's alone: its files and links, and the directories named for it (the
    // others, /usr/share/man and such, belong to every package that puts a file there; /lib is
    // a link to one on a merged-/usr system).
    let owned: Vec<PathBuf> = listed
        .lines()
        .map(PathBuf::from)
        .filter(|p| {
            std::fs::metadata(p).is_ok_and(|m| !m.is_dir())
                || p.to_string_lossy().contains("prfence")
        })
        .collect();
    ensure!(
        owned.iter().any(|p| p.ends_with("usr/sbin/prfence"))
            && owned.iter().any(|p| p.ends_with("etc/prfence")),
        "dpkg -L prfence lists no binary or /etc/prfence: {listed}"
    );
    systemctl(&["enable", UNIT])?;
    ensure!(
        std::fs::symlink_metadata(ENABLED_LINK).is_ok(),
        "systemctl enable made no {ENABLED_LINK}"
    );
    crate::run("dpkg", ["--remove", "prfence"])?.ok()?;
    let status = crate::run("dpkg-query", ["-W", "-f", "${Status}", "prfence"])?.stdout;
    ensure!(
        status.trim() == "deinstall ok config-files",
        "after dpkg --remove, dpkg says {status:?}"
    );
    let kept: Vec<PathBuf> = owned
        .iter()
        .filter(|p| !p.starts_with("/etc/prfence"))
        .cloned()
        .collect();
    ensure!(
        left(&kept).is_empty(),
        "dpkg --remove left {:?}",
        left(&kept)
    );
    ensure!(
        std::path::Path::new(CONFIG).exists(),
        "dpkg --remove took the configuration {CONFIG}"
    );
    println!("  dpkg --remove: every file gone but {CONFIG}");
    crate::run("dpkg", ["--purge", "prfence"])?.ok()?;
    let mut after: Vec<PathBuf> = owned.clone();
    after.extend([PathBuf::from(ENABLED_LINK), PathBuf::from(RUNTIME_DIR)]);
    ensure!(
        left(&after).is_empty(),
        "dpkg --purge left {:?}",
        left(&after)
    );
    let status = crate::run("dpkg-query", ["-W", "-f", "${Status}", "prfence"])?;
    ensure!(
        status.code() != 0 || status.stdout.trim() == "unknown ok not-installed",
        "after dpkg --purge, dpkg says {:?}",
        status.stdout
    );
    let files = crate::run("systemctl", ["list-unit-files", "--no-legend", UNIT])?.stdout;
    ensure!(
        files.trim().is_empty(),
        "systemd still lists {UNIT} after the purge: {files}"
    );
    println!(
        "  dpkg --purge: none of the package's {} files, directories and links left, nor the \
         enable link; systemd lists no {UNIT}",
        owned.len()
    );
    Ok(())
}

/// rpm's own database in the lab: Debian's rpm keeps none of the system's (its default is
/// ~/.rpmdb), and this one is removed afterwards.
const RPM_DB: &str = "/var/lib/rpm-lab";
/// Where rpm keeps an edited configuration when the package is erased.
const RPMSAVE: &str = "/etc/prfence/agent.toml.rpmsave";

/// `rpm --dbpath RPM_DB ARGS` as Debian's rpm must be told: `--force-debian` to install (else it
/// complains that dpkg should be used) and `--nodeps` to install and verify (its database knows
/// no Debian package; what the package requires is checked against the node's own libraries
/// instead).
fn rpm(args: &[&str]) -> anyhow::Result<crate::command::CommandRun> {
    let mut all = vec!["--dbpath", RPM_DB];
    match args.first() {
        Some(a) if a.starts_with("-i") || a.starts_with("-U") => {
            all.extend(["--force-debian", "--nodeps"]);
        }
        Some(&"-V") => all.push("--nodeps"),
        _ => {}
    }
    all.extend(args);
    crate::run("rpm", all)
}

/// The .rpm's life with rpm itself, on a node without the .deb (what the lab stands in for: a
/// RHEL or Fedora node; rpm keeps its own database here and is told `--nodeps`, so the
/// package's requirements are checked against the node's libraries instead). Install: `rpm -V`
/// clean, the unit known to systemd and neither enabled nor started, agent.toml root's alone.
/// Upgrade from release 1 to 2 with the agent the admin enabled running and its agent.toml
/// edited: the same process runs on (the scriptlets neither stop nor restart it), the edited
/// file is kept and no .rpmnew written. Erase: the agent stopped and disabled, the enable link
/// and /run/prfence gone, none of the package's files left but the edited configuration as
/// agent.toml.rpmsave, and systemd lists no unit.
fn rpm_cycle(t: &Topology) -> anyhow::Result<()> {
    let first = std::env::var("LAB_RPM").context("LAB_RPM")?;
    let second = std::env::var("LAB_RPM_UPGRADE").context("LAB_RPM_UPGRADE")?;
    // what --nodeps does not check: every library the package requires is on the node
    let required = rpm(&["-qpR", &first])?.ok()?.stdout;
    let libraries = crate::run("ldconfig", ["-p"])?.ok()?.stdout;
    let mut libs: Vec<&str> = required
        .lines()
        .filter_map(|r| r.split('(').next())
        .filter(|r| r.contains(".so"))
        .collect();
    libs.dedup();
    let absent: Vec<&&str> = libs
        .iter()
        .filter(|l| !libraries.contains(&format!("{l} (")))
        .collect();
    ensure!(
        !libs.is_empty() && absent.is_empty(),
        "the .rpm requires {libs:?}; not on this node: {absent:?}\n{required}"
    );

    rpm(&["-ivh", &first])?.ok()?;
    let name = rpm(&["-q", "prfence"])?.ok()?.stdout;
    ensure!(
        name.trim().starts_with("prfence-") && name.trim().contains("-1."),
        "after rpm -i, rpm -q says {name:?}"
    );
    let verify = rpm(&["-V", "prfence"])?;
    ensure!(
        verify.code() == 0 && verify.stdout.trim().is_empty(),
        "rpm -V after the install ({}): {}{}",
        verify.code(),
        verify.stdout,
        verify.stderr
    );
    let owner = rpm(&["-qf", crate::INSTALLED_FENCE_PR])?.ok()?.stdout;
    ensure!(
        owner.trim() == name.trim(),
        "rpm -qf {}: {owner:?}",
        crate::INSTALLED_FENCE_PR
    );
    let enabled = crate::run("systemctl", ["is-enabled", UNIT])?.stdout;
    ensure!(
        enabled.trim() == "disabled" && show(UNIT, "ActiveState")? == "inactive",
        "after rpm -i, {UNIT} is {} and {} (want disabled, inactive)",
        enabled.trim(),
        show(UNIT, "ActiveState")?
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(CONFIG)?.permissions());
    ensure!(mode & 0o777 == 0o600, "{CONFIG} has mode {mode:o}");
    let files: Vec<PathBuf> = rpm(&["-ql", "prfence"])?
        .ok()?
        .stdout
        .lines()
        .map(PathBuf::from)
        .collect();
    println!(
        "  rpm -i {name}: {} files and directories, rpm -V clean, {UNIT} disabled and inactive, \
         {CONFIG} 0600; the libraries it requires ({}) on the node",
        files.len(),
        libs.join(", "),
        name = name.trim()
    );

    // the admin's configuration, the agent enabled and running, then the upgrade
    let devices = t.node(Node::A).devices().to_vec();
    let edited = config(&devices[..1], "[self_fence]\nreboot = false\n");
    crate::write_file(CONFIG, &edited)?;
    systemctl(&["enable", "--now", UNIT])?;
    wait_for("the agent healthy", SETTLE, || state_is("healthy"))?;
    let pid = show(UNIT, "MainPID")?;
    rpm(&["-Uvh", &second])?.ok()?;
    let upgraded = rpm(&["-q", "prfence"])?.ok()?.stdout;
    ensure!(
        upgraded.trim().contains("-2."),
        "after rpm -U, rpm -q says {upgraded:?}"
    );
    ensure!(
        show(UNIT, "MainPID")? == pid && state_is("healthy")?,
        "the upgrade touched the running agent: main pid {} (was {pid}), state {}",
        show(UNIT, "MainPID")?,
        status()?["state"]
    );
    ensure!(
        std::fs::read_to_string(CONFIG)? == edited,
        "the upgrade changed the admin's {CONFIG}"
    );
    let rpmnew = format!("{CONFIG}.rpmnew");
    ensure!(
        !std::path::Path::new(&rpmnew).exists(),
        "the upgrade wrote {rpmnew} for an unchanged packaged file"
    );
    let verify = rpm(&["-V", "prfence"])?.stdout;
    ensure!(
        verify.lines().count() == 1
            && verify
                .trim_end()
                .ends_with(&format!(" c /{}", CONFIG.trim_start_matches('/'))),
        "rpm -V after the upgrade should report the edited configuration only: {verify}"
    );
    println!(
        "  rpm -U {}: the agent (pid {pid}) runs on, healthy; the edited {CONFIG} kept, no \
         .rpmnew; rpm -V reports only it",
        upgraded.trim()
    );

    ensure!(
        std::path::Path::new(RUNTIME_DIR).is_dir(),
        "no {RUNTIME_DIR} before the erase: the check below would prove nothing"
    );
    rpm(&["-e", "prfence"])?.ok()?;
    ensure!(
        rpm(&["-q", "prfence"])?.code() != 0,
        "rpm -q still finds prfence after rpm -e"
    );
    ensure!(
        show(UNIT, "ActiveState")? != "active",
        "rpm -e left the agent running"
    );
    let mut gone = files.clone();
    gone.extend([PathBuf::from(ENABLED_LINK), PathBuf::from(RUNTIME_DIR)]);
    // but the directory of the saved configuration, and directories others share
    let gone: Vec<PathBuf> = gone
        .into_iter()
        .filter(|p| {
            !(p.as_os_str() == "/etc/prfence"
                || std::fs::metadata(p).is_ok_and(|m| m.is_dir())
                    && !p.to_string_lossy().contains("prfence"))
        })
        .collect();
    let remaining = left(&gone);
    ensure!(remaining.is_empty(), "rpm -e left {remaining:?}");
    ensure!(
        std::fs::read_to_string(RPMSAVE).ok().as_deref() == Some(edited.as_str()),
        "rpm -e did not keep the edited configuration as {RPMSAVE}"
    );
    let listed = crate::run("systemctl", ["list-unit-files", "--no-legend", UNIT])?.stdout;
    ensure!(
        listed.trim().is_empty(),
        "systemd still lists {UNIT} after rpm -e: {listed}"
    );
    println!(
        "  rpm -e: agent stopped and disabled, none of the package's {} paths left, the edited \
         configuration kept as {RPMSAVE}; systemd lists no {UNIT}",
        files.len()
    );
    Ok(())
}

/// The application the stop hook stops in the lab: a unit whose processes run as `nobody`, and a
/// process of that user outside the unit (as an admin's or cron's would be).
const APP: &str = "lab-app.service";
const APP_USER: &str = "nobody";
const APP_UNIT_FILE: &str = "/etc/systemd/system/lab-app.service";
const DROP_IN_DIR: &str = "/etc/systemd/system/prfence-agent.service.d";
const HOOK: &str = "/usr/local/sbin/prfence-stop-hook";
const NOTE: &str = "/var/lib/prfence/fenced.log";

/// A fence by the other node while the packaged unit watches: the agent runs docs/agent.md's stop
/// hook (set up by the block there, as written) inside the sandbox, which stops the
/// application's unit, kills its user's stray process (CAP_KILL, from the doc's drop-in) and
/// leaves a note, then exits 86; systemd keeps it down (RestartPreventExitStatus) and the status
/// file still says fenced, with each step's result, after the stop. An admin's `systemctl start`
/// then brings back an agent that waits for its key (it was preempted), not a second self-fence.
fn a_fenced_node_runs_its_stop_hook_in_the_sandbox_and_keeps_its_status() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    node::unfence(&t, Node::A)?;
    node::unfence(&t, Node::B)?;
    let mut restore = Restore::take()?;
    restore.units.insert(0, APP);
    restore.remove.extend(
        [APP_UNIT_FILE, DROP_IN_DIR, HOOK, NOTE]
            .into_iter()
            .map(PathBuf::from),
    );

    // the docs' block, as written, with the lab's values for the site's
    let block = crate::doc_blocks::blocks(crate::doc_blocks::AGENT, "stop-hook")
        .map_err(anyhow::Error::msg)?;
    ensure!(
        block.len() == 1,
        "docs/agent.md has {} stop-hook blocks",
        block.len()
    );
    let site = crate::doc_blocks::site_values(crate::doc_blocks::AGENT, "stop-hook")
        .map_err(anyhow::Error::msg)?;
    let names: Vec<&str> = site
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(n, _)| n)
        .collect();
    ensure!(
        names == ["APP", "APP_USER"],
        "docs/agent.md's stop hook starts from the values {names:?}, the lab sets APP and APP_USER"
    );
    let script = format!("set -e\nAPP={APP}\nAPP_USER={APP_USER}\n{}\n", block[0].1);
    crate::run("bash", ["-c", &script])?.ok()?;

    crate::write_file(
        APP_UNIT_FILE,
        "[Unit]\nDescription=lab application\nAfter=prfence-agent.service\n\
         [Service]\nUser=nobody\nExecStart=/bin/sleep infinity\n",
    )?;
    systemctl(&["daemon-reload"])?;
    systemctl(&["start", APP])?;
    // a process of the application's user outside its unit
    let stray = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "sleep",
            "infinity",
        ])
        .spawn()?;
    let mut stray = crate::KillOnDrop(stray);

    let devices = t.node(Node::A).devices().to_vec();
    let tables = format!(
        "[watch]\ngrace = \"5s\"\n[self_fence]\ncommand = [\"{HOOK}\"]\ncommand_timeout = \"20s\"\n\
         reboot = false\n"
    );
    crate::write_file(CONFIG, &config(&devices, &tables))?;
    systemctl(&["start", UNIT])?;
    wait_for("the agent healthy", SETTLE, || state_is("healthy"))?;
    let pid = show(UNIT, "MainPID")?;
    let (bounding, ..) = sandbox_of(&pid)?;
    ensure!(
        bounding == UNIT_CAPS | CAP_KILL,
        "the drop-in did not apply: CapBnd {bounding:#x}"
    );

    let fenced_at = Instant::now();
    node::fence(&t, Node::B, 0)?;
    ensure!(
        registered(&t, Node::A.key())?.iter().all(|&r| !r),
        "node B's fence left key 0xa: {:?}",
        registered(&t, Node::A.key())?
    );
    let took = wait_for("the agent's exit after its self-fence", SETTLE, || {
        Ok(show(UNIT, "ActiveState")? != "active" && show(UNIT, "ExecMainStatus")? == "86")
    })?;
    println!("  agent exited 86 {} after the fence", secs(took));
    std::thread::sleep(Duration::from_secs(4)); // RestartSec=2s: a restart would show by now
    let after = (
        show(UNIT, "ActiveState")?,
        show(UNIT, "NRestarts")?,
        show(APP, "ActiveState")?,
    );
    ensure!(
        after == ("failed".into(), "0".into(), "inactive".into()),
        "after the self-fence: unit {}, restarts {}, {APP} {} (want failed, 0, inactive)",
        after.0,
        after.1,
        after.2
    );
    ensure!(
        stray.0.try_wait()?.is_some(),
        "the hook did not kill {APP_USER}'s process outside {APP}:\n{}",
        journal()
    );
    let note = std::fs::read_to_string(NOTE).with_context(|| format!("the hook's note {NOTE}"))?;
    ensure!(
        note.contains("fenced: lab-app.service stopped"),
        "the note says {note:?}"
    );
    let record = status()?;
    ensure!(
        record["state"] == "fenced"
            && record["self_fence"]["hook"] == "ok"
            && record["self_fence"]["finished"] == true,
        "{STATUS} after the exit: {record}"
    );
    println!(
        "  {APP} stopped, the stray process killed, the note written, {STATUS} says fenced \
         (hook ok, finished) after the stop; {} from the fence",
        secs(fenced_at.elapsed())
    );

    // the admin starts it again in the same boot: it waits for the key, it does not fence again
    systemctl(&["start", UNIT])?;
    wait_for("the restarted agent waiting for its key", SETTLE, || {
        state_is("waiting_for_registration")
    })?;
    ensure!(
        show(UNIT, "ActiveState")? == "active",
        "the started agent is {}",
        show(UNIT, "ActiveState")?
    );
    println!("  systemctl start after exit 86: waiting_for_registration, active");
    drop(stray);
    drop(restore);
    Ok(())
}

/// Where the lab's corosync.conf is named to corosync (`systemctl edit --runtime`'s place).
const COROSYNC_DROP_IN: &str = "/run/systemd/system/corosync.service.d";

/// The one-node cluster of [`a_node_started_with_the_cluster_down_arms_once_pacemaker_unfences_it`]:
/// corosync on loopback (the guest has no other link), its node named as the host
/// (tests/lab/init names the booted node `node1`). Logs to the journal.
const COROSYNC_CONF: &str = "totem {\n  version: 2\n  cluster_name: lab\n  transport: knet\n  \
    crypto_cipher: none\n  crypto_hash: none\n  token: 5000\n}\n\
    nodelist {\n  node {\n    ring0_addr: 127.0.0.1\n    name: node1\n    nodeid: 1\n  }\n}\n\
    quorum {\n  provider: corosync_votequorum\n}\n\
    logging {\n  to_syslog: yes\n  to_stderr: no\n}\n";

/// The CIB the node had before this boot (written where Pacemaker keeps it, unsigned: Pacemaker
/// reads it and warns): fence_pr on node A's paths with `provides=unfencing`, and a service that
/// `requires=unfencing`, so that Pacemaker unfences the node before it starts anything.
/// `dc-deadtime` 5 s: a lone controller waits that long for a DC before electing itself.
fn cib(devices: &[PathBuf]) -> String {
    let devices: Vec<String> = devices.iter().map(|d| d.display().to_string()).collect();
    format!(
        r#"<cib validate-with="pacemaker-3.9" epoch="1" num_updates="0" admin_epoch="0">
  <configuration>
    <crm_config>
      <cluster_property_set id="cib-bootstrap-options">
        <nvpair id="o-dc-deadtime" name="dc-deadtime" value="5s"/>
        <nvpair id="o-stonith-enabled" name="stonith-enabled" value="true"/>
        <nvpair id="o-stonith-action" name="stonith-action" value="off"/>
        <nvpair id="o-recheck" name="cluster-recheck-interval" value="10s"/>
      </cluster_property_set>
    </crm_config>
    <nodes/>
    <resources>
      <primitive id="storage-fence" class="stonith" type="fence_pr">
        <instance_attributes id="storage-fence-params">
          <nvpair id="storage-fence-devices" name="devices" value="{}"/>
          <nvpair id="storage-fence-hosts" name="pcmk_host_list" value="node1"/>
        </instance_attributes>
        <meta_attributes id="storage-fence-meta">
          <nvpair id="storage-fence-provides" name="provides" value="unfencing"/>
        </meta_attributes>
        <operations>
          <op id="storage-fence-monitor" name="monitor" interval="3600s"/>
        </operations>
      </primitive>
      <primitive id="app" class="ocf" provider="pacemaker" type="Dummy">
        <meta_attributes id="app-meta">
          <nvpair id="app-requires" name="requires" value="unfencing"/>
        </meta_attributes>
      </primitive>
    </resources>
    <constraints/>
  </configuration>
  <status/>
</cib>
"#,
        devices.join(",")
    )
}

/// When `unit` last became inactive, on the monotonic clock (µs).
fn stopped_at(unit: &str) -> anyhow::Result<u64> {
    let v = show(unit, "InactiveEnterTimestampMonotonic")?;
    v.parse()
        .with_context(|| format!("{unit}'s InactiveEnterTimestampMonotonic {v:?}"))
}

/// After a fence, the admin often leaves the cluster stack off at boot and starts it by hand. The
/// agent (key derived from corosync, as the packaged configuration does) starts while corosync is
/// down: it must not give up, but start, wait with the cause in its status, and arm by itself
/// once Pacemaker's unfencing (fence_pr `on`) registered the key corosync names, with no admin
/// command in between. Then the node shuts down with Pacemaker running: the three units stopped
/// in one transaction, as shutdown stops them, in the order the units set (Pacemaker first, then
/// the agent, corosync last), the agent cleanly, not fenced, its key left on the target. What
/// the lab stands in for: the boot is the enabled unit started with corosync stopped (the
/// guest boots lab.target, where the cluster stack does not start), and the shutdown is that
/// stop transaction.
fn a_node_started_with_the_cluster_down_arms_once_pacemaker_unfences_it() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    let mut restore = Restore::take()?;
    for dir in [
        "/var/lib/pacemaker",
        "/var/lib/corosync",
        "/var/log/pacemaker",
        "/var/log/corosync",
    ] {
        restore.empty_after(dir);
    }
    restore.remove.extend(
        [
            "/run/cluster.key",
            "/run/cluster.lus",
            "/run/cluster.dev",
            COROSYNC_DROP_IN,
        ]
        .map(PathBuf::from),
    );
    restore
        .units
        .splice(0..0, ["pacemaker.service", "corosync.service"]);
    for unit in ["corosync.service", "pacemaker.service"] {
        ensure!(
            show(unit, "ActiveState")? == "inactive",
            "{unit} runs already"
        );
    }
    let key = crate::fence_agents::derived_key(Node::A)?;
    let devices = t.node(Node::A).devices().to_vec();
    // corosync.conf where the test's files go (the guest's /etc is the host's, and a file
    // written there stays in the overlay), named to corosync by a runtime drop-in
    let corosync_conf = format!("{}/corosync.conf", crate::WORK);
    crate::write_file(&corosync_conf, COROSYNC_CONF)?;
    std::fs::create_dir_all(COROSYNC_DROP_IN)?;
    crate::write_file(
        format!("{COROSYNC_DROP_IN}/lab.conf"),
        &format!("[Service]\nExecStart=\nExecStart=/usr/sbin/corosync -f -c {corosync_conf}\n"),
    )?;
    systemctl(&["daemon-reload"])?;
    let cib_file = "/var/lib/pacemaker/cib/cib.xml";
    crate::write_file(cib_file, &cib(&devices))?;
    crate::run("chown", ["hacluster:haclient", cib_file])?.ok()?;
    crate::run("chmod", ["0600", cib_file])?.ok()?;
    let tables = "[key]\nderive = \"fence_scsi\"\n[watch]\ngrace = \"20s\"\n\
                  [self_fence]\nreboot = false\n";
    let mut text = config(&devices, "").replace("[key]\nvalue = \"0xa\"\n", "");
    text = text.replace("command_timeout = \"2s\"", "command_timeout = \"5s\"");
    text.push_str(tables);
    crate::write_file(CONFIG, &text)?;
    systemctl(&["enable", "--now", UNIT])?;
    let waiting = status()?;
    ensure!(
        waiting["state"] == "waiting_for_registration" && waiting["key_problem"].is_string(),
        "with corosync down the agent says: {waiting}"
    );
    println!(
        "  corosync down: the unit is active, waiting_for_registration, key_problem {}",
        waiting["key_problem"]
    );

    systemctl(&["start", "corosync.service", "pacemaker.service"])?;
    let unfenced = wait_for(
        "Pacemaker's unfencing (the derived key on both LUs)",
        Duration::from_secs(240),
        || Ok(registered(&t, key)?.iter().all(|&r| r)),
    )?;
    let armed = wait_for("the agent armed on the derived key", SETTLE, || {
        let s = status()?;
        Ok(s["state"] == "healthy")
    })?;
    let s = status()?;
    let watched = s["own_key"]
        .as_str()
        .and_then(|k| u64::from_str_radix(k.trim_start_matches("0x"), 16).ok());
    ensure!(
        watched == Some(key),
        "the agent watches {} where Pacemaker unfenced key {key:#x}",
        s["own_key"]
    );
    println!(
        "  systemctl start corosync pacemaker: key {key:#x} on both LUs {}, the agent healthy \
         on it {} later",
        secs(unfenced),
        secs(armed)
    );

    let start = Instant::now();
    systemctl(&["stop", "pacemaker.service", UNIT, "corosync.service"])?;
    let took = start.elapsed();
    let agent = (
        show(UNIT, "Result")?,
        show(UNIT, "ExecMainStatus")?,
        status()?["state"].clone(),
    );
    ensure!(
        agent.0 == "success" && agent.1 == "0" && agent.2 != "fenced",
        "the agent at the shutdown: result {}, exit {}, state {}:\n{}",
        agent.0,
        agent.1,
        agent.2,
        journal()
    );
    let (pacemaker, agent_at, corosync) = (
        stopped_at("pacemaker.service")?,
        stopped_at(UNIT)?,
        stopped_at("corosync.service")?,
    );
    ensure!(
        pacemaker <= agent_at && agent_at <= corosync,
        "stop order: pacemaker at {pacemaker} µs, the agent at {agent_at}, corosync at {corosync}"
    );
    ensure!(
        registered(&t, key)?.iter().all(|&r| r),
        "the shutdown removed key {key:#x}"
    );
    println!(
        "  stop of pacemaker, the agent and corosync: {}; the agent stopped {} after Pacemaker \
         and {} before corosync, exit 0, key {key:#x} kept",
        secs(took),
        secs(Duration::from_micros(agent_at - pacemaker)),
        secs(Duration::from_micros(corosync - agent_at))
    );
    drop(restore);
    Ok(())
}

/// What the reset test's hook logs (to the journal, relayed to the console), as the host's
/// evidence that the hook ran before the reset.
const HOOK_EVIDENCE: &str = "lab stop hook ran inside prfence-agent.service";
/// How long the guest may take from the fence to its reset: the fence itself, two reads of the
/// missing key a check apart, the hook (2 s), under emulation.
const RESET_WITHIN: Duration = Duration::from_secs(60);

/// The whole self-fence under the packaged unit with `reboot = true`: a fence by node B, the
/// hook inside the sandbox, then reboot(2), which the unit's seccomp filter (`@reboot`) and its
/// CAP_SYS_BOOT must let through. The guest's reset ends the run, so the host judges this test
/// (host.rs, `lab: reset expected`): the kernel restarts within [`RESET_WITHIN`] of the fence,
/// after the hook's journal line reached the console. The last test of its guest.
fn a_fenced_node_runs_its_hook_then_resets() -> anyhow::Result<()> {
    let t = Topology::iscsi(1)?;
    node::unfence(&t, Node::A)?;
    node::unfence(&t, Node::B)?;
    let _restore = Restore::take()?;
    let devices = t.node(Node::A).devices().to_vec();
    // The hook logs, then gives the journal's relay below time to reach the console.
    let tables = format!(
        "[watch]\ngrace = \"5s\"\n[self_fence]\n\
         command = [\"/bin/sh\", \"-c\", \"logger -t lab-hook '{HOOK_EVIDENCE}'; sleep 2\"]\n\
         command_timeout = \"10s\"\nreboot = true\n"
    );
    crate::write_file(CONFIG, &config(&devices, &tables))?;
    systemctl(&["start", UNIT])?;
    wait_for("the agent healthy", SETTLE, || state_is("healthy"))?;
    // the unit's journal on the console (this test's output is the console) until the reset;
    // the hook's logger line by its tag too (journald may not tell the unit of a process that
    // exited at once)
    let relay = std::process::Command::new("journalctl")
        .args(["-f", "-n", "0", "-o", "short-monotonic"])
        .arg(format!("_SYSTEMD_UNIT={UNIT}"))
        .args(["+", "SYSLOG_IDENTIFIER=lab-hook"])
        .spawn()?;
    let _relay = crate::KillOnDrop(relay);
    std::thread::sleep(Duration::from_millis(500));
    println!(
        "lab: reset expected: systemd::a_fenced_node_runs_its_hook_then_resets|{}|{HOOK_EVIDENCE}",
        RESET_WITHIN.as_secs()
    );
    node::fence(&t, Node::B, 0)?;
    std::thread::sleep(RESET_WITHIN + Duration::from_secs(10));
    bail!(
        "the node was not reset {} after the fence:\n{}",
        secs(RESET_WITHIN + Duration::from_secs(10)),
        journal()
    )
}
