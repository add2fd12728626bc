//! What the node agent costs as the package ships it (issue 48): the guest boots systemd as PID
//! 1, the .deb is installed, and `prfence agent` runs as the packaged unit (its arguments, its
//! environment and sandbox) from a configuration derived from the packaged
//! `/etc/prfence/agent.toml` ([`packaged_config`]: the lab's devices, a key value, softdog at the
//! packaged watchdog timeout; everything else as shipped: the status file, journald logging at
//! info, the metrics endpoint, path audit off). Beside it, in the same guest and the same run:
//! the floor (bare READ KEYS through SG_IO, one thread, devices opened once: `crate::floor`) and
//! fence-agents' `fence_scsi_check` run once a second as the watchdog daemon runs it. Printed,
//! never asserted (the guest is emulated: absolute figures are inflated, ratios are the point):
//! CPU per LU-check against the floor's, turn by turn, the agent's RSS, and with `LAB_PROFILE=1`
//! where its CPU goes (perf) and its system calls per LU-check (strace). `LAB_FENCE_SCSI_CHECK=0`
//! leaves fence_scsi_check out (reading every LU it takes minutes a run), to iterate on the agent.
//!
//! What the lab stands in for: udevd is stopped while the bench's disks exist (a real node's
//! udev probed its disks long before; on the emulated guest it takes 1.8 s a disk, 915 s for
//! 512, and neither the agent nor the floor reads anything through udev); the key is a value
//! (a node's key is derived from corosync, which this guest does not run; the derivation
//! happens once at start); the metrics endpoint is scraped once per turn, as a Prometheus would
//! (its default scrape interval is a minute).
//!
//! Long tier only, on the release build the package ships:
//! `cargo test --release --test lab -- --ignored bench_agent::` (as root; the 1024-LU case
//! needs `LAB_MEM=4096`).

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail, ensure};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::systemd::{CONFIG, Restore, STATUS, UNIT, journal, show, status, systemctl};
use crate::floor::{self, cpu_ticks, status_kib};
use crate::plan::Suite;
use crate::{Node, Topology};

/// The measuring window of each job (CPU per second of it).
const WINDOW: Duration = Duration::from_secs(30);
/// One turn of the agent's watch measurement: several of the packaged configuration's 2 s checks.
const TURN: Duration = Duration::from_secs(10);
/// The floor's turn after each of the agent's, the agent stopped meanwhile: well within the
/// packaged watchdog timeout (10 s) with a check interval and a check after it, or softdog resets
/// the guest.
const FLOOR_TURN: Duration = Duration::from_secs(4);
const FENCE_SCSI_CHECK: &str = "/usr/share/cluster/fence_scsi_check";
/// The packaged configuration's `[watchdog] timeout`, which the agent checks against the
/// driver's: softdog is loaded with this margin.
const PACKAGED_WATCHDOG_SECS: u32 = 10;
/// The packaged configuration's metrics endpoint.
const METRICS: &str = "http://127.0.0.1:9464/metrics";

pub const SUITE: Suite = Suite {
    name: "bench_agent",
    init: crate::plan::GuestInit::Systemd,
    // 16 LUs about 3 minutes, 64 about 4, 256 about 8, 1024 x 4 about 25 (the maps alone 4)
    budget: Duration::from_secs(60 * 60),
    usual: Duration::from_secs(20 * 60),
    tests: &[],
    long: crate::tests![
        watch_cost_16_luns,
        watch_cost_64_luns,
        watch_cost_256_luns,
        watch_cost_1024_luns_4_paths
    ],
    reproducers: &[],
    ..super::bench::SUITE
};

/// CPU time and memory of one measured job.
struct Cost {
    cpu: Duration,
    /// How long it was measured (a run still going at the end of the window is waited for).
    wall: Duration,
    /// Checks (agent) or runs (fence_scsi_check) in that time.
    runs: u64,
    rss_kib: u64,
    peak_kib: u64,
    note: String,
}

impl Cost {
    /// CPU time per wall-clock second.
    fn share(&self) -> f64 {
        self.cpu.as_secs_f64() / self.wall.as_secs_f64()
    }

    fn per_run(&self) -> f64 {
        self.cpu.as_secs_f64() / self.runs.max(1) as f64
    }
}

/// The benchmark's jobs and checks at a small scale, with a short window: a quick look.
fn watch_cost_16_luns() -> anyhow::Result<()> {
    watch_cost(16, 1, Duration::from_secs(20))
}

fn watch_cost_64_luns() -> anyhow::Result<()> {
    watch_cost(64, 1, WINDOW)
}

/// The issue's first size (the topology alone takes 15-40 s to build).
fn watch_cost_256_luns() -> anyhow::Result<()> {
    watch_cost(256, 1, WINDOW)
}

/// The issue's largest: 1024 LUs, node A through 4 iSCSI sessions, one dm-multipath map per LU
/// as an admin names them (`crate::suites::bench::four_path_maps`); the floor reads each LU
/// through one of its paths.
fn watch_cost_1024_luns_4_paths() -> anyhow::Result<()> {
    watch_cost(crate::topology::MAX_LUNS, crate::topology::SESSIONS, WINDOW)
}

/// The packaged `agent.toml` made this node's: its `[[device]]` examples replaced by `devices`,
/// its `[key]` by the lab's key value 0xa; every other line as shipped.
fn packaged_config(devices: &[String]) -> anyhow::Result<String> {
    let shipped = include_str!("../../../packaging/prfence-agent.toml");
    let mut text = String::new();
    let mut table = String::new();
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            table = trimmed.split('#').next().unwrap_or("").trim().to_owned();
            if table == "[[device]]" {
                continue;
            }
        }
        let setting = !trimmed.is_empty() && !trimmed.starts_with('#') && !trimmed.starts_with('[');
        match table.as_str() {
            // the examples' paths: the lab's devices are appended below
            "[[device]]" if setting => continue,
            "[key]" if setting => {
                ensure!(
                    trimmed.starts_with("derive"),
                    "unexpected [key] line {line:?}"
                );
                text.push_str("value = \"0xa\"\n");
                continue;
            }
            _ => {}
        }
        text.push_str(line);
        text.push('\n');
    }
    let settings = || {
        text.lines()
            .map(str::trim_start)
            .filter(|l| !l.starts_with('#'))
    };
    ensure!(
        settings().any(|l| l == "value = \"0xa\"")
            && !settings().any(|l| l.contains("/dev/mapper/") || l.starts_with("derive")),
        "the packaged agent.toml changed shape: {text}"
    );
    for (index, device) in devices.iter().enumerate() {
        writeln!(
            text,
            "[[device]]\npath = \"{device}\"\nname = \"lun{index}\""
        )?;
    }
    Ok(text)
}

fn watch_cost(luns: usize, paths: usize, window: Duration) -> anyhow::Result<()> {
    if paths > 1 {
        super::bench::memory_for_four_paths(luns)?;
    }
    // Started again after the topology's teardown (dropped before it).
    let _udevd = crate::udevd::Paused::take()?;
    let t = Topology::iscsi(luns)?;
    let devices: Vec<String> = if paths == 1 {
        t.node(Node::A).device_args()
    } else {
        super::bench::four_path_maps(&t)?
            .iter()
            .map(|p| p.display().to_string())
            .collect()
    };
    // The emulated guest unfences 256 LUs in about 50 s, unfence's default deadline.
    let mut args = vec!["unfence", "--deadline", "600", "--key", "0xa"];
    args.extend(devices.iter().map(String::as_str));
    let unfence = crate::prfence(&args)?.ok()?;
    println!(
        "bench: {luns} LUNs x {paths} path(s) set up in {}, node A unfenced on all in {}",
        crate::secs(t.setup_time()),
        crate::secs(unfence.elapsed)
    );

    let (agent, bare, turns) = {
        let _restore = Restore::take()?;
        crate::run(
            "modprobe",
            ["softdog", &format!("soft_margin={PACKAGED_WATCHDOG_SECS}")],
        )?
        .ok()?;
        crate::write_file(CONFIG, &packaged_config(&devices)?)?;
        crate::run(
            crate::INSTALLED_PRFENCE,
            ["agent", "--config", CONFIG, "--check-config"],
        )?
        .ok()?;
        systemctl(&["start", UNIT])?;
        let pid: u32 = show(UNIT, "MainPID")?
            .parse()
            .context("the unit's MainPID")?;
        agent_and_floor_cost(&t, luns, pid, window)?
        // the unit stopped, softdog and the package's agent.toml put back
    };
    // `LAB_FENCE_SCSI_CHECK=0`: the agent and the floor only (fence_scsi_check reading all LUs
    // takes minutes a run: 278 s at 256 LUs), for iterating on the agent's cost.
    if std::env::var_os("LAB_FENCE_SCSI_CHECK").is_some_and(|v| v == "0") {
        print!(
            "{}",
            agent_report(luns, paths, window, &agent, &bare, &turns, &[])?
        );
        println!("bench:   fence_scsi_check not run (LAB_FENCE_SCSI_CHECK=0)");
        return Ok(());
    }
    // fence_scsi_check as shipped: it passes at the first device that has our key (fence-agents
    // #278), so with the key everywhere each run reads one LU
    let _key_store = crate::RemoveOnDrop::all(["/var/run/cluster.dev", "/var/run/cluster.key"]);
    std::fs::write("/var/run/cluster.dev", devices.join("\n") + "\n")?;
    std::fs::write("/var/run/cluster.key", "a\n")?;
    let shipped =
        fence_scsi_check_cost("as shipped: stops at the first LU holding the key", window)?;
    // the same job as the agent's, reading every LU: the key only on the last one
    let mut args = vec!["unregister", "--key", "0xa"];
    args.extend(devices[..luns - 1].iter().map(String::as_str));
    crate::prfence(&args)?.ok()?;
    let every_lu = fence_scsi_check_cost(
        &format!("reading all {luns} LUs (key only on the last)"),
        window,
    )?;

    print!(
        "{}",
        agent_report(
            luns,
            paths,
            window,
            &agent,
            &bare,
            &turns,
            &[("as shipped", &shipped), ("all LUs", &every_lu)]
        )?
    );
    Ok(())
}

/// The benchmark's report: the agent beside the floor, and beside each fence_scsi_check job run.
fn agent_report(
    luns: usize,
    paths: usize,
    window: Duration,
    agent: &Cost,
    bare: &Cost,
    turns: &[f64],
    others: &[(&str, &Cost)],
) -> anyhow::Result<String> {
    let mut report = format!(
        "bench: the packaged agent watching {luns} LUNs x {paths} path(s), {} s window \
         (TCG-emulated guest, {})\n",
        window.as_secs(),
        super::bench::build_profile()
    );
    let rows = [("prfence agent (unit)", agent)]
        .into_iter()
        .chain(others.iter().map(|&(_, cost)| ("fence_scsi_check", cost)));
    for (name, cost) in rows {
        writeln!(
            report,
            "bench:   {name:<22} CPU {:>7.3} s in {:>5.1} s = {:>5.1} % of a core, {:.3} s per \
             check/run; RSS {:>6} KiB, peak {:>6} KiB; {}",
            cost.cpu.as_secs_f64(),
            cost.wall.as_secs_f64(),
            100.0 * cost.share(),
            cost.per_run(),
            cost.rss_kib,
            cost.peak_kib,
            cost.note
        )?;
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let agent_per_lu = agent.per_run() / luns as f64;
    writeln!(
        report,
        "bench:   {:<22} CPU {:>7.3} s in {:>5.1} s, {:.3} ms per LU-check; RSS peak {:>6} KiB; {}",
        "floor (READ KEYS loop)",
        bare.cpu.as_secs_f64(),
        bare.wall.as_secs_f64(),
        1e3 * bare.per_run(),
        bare.peak_kib,
        bare.note
    )?;
    writeln!(
        report,
        "bench:   prfence agent / floor: CPU per LU-check {:.3} ms / {:.3} ms = x{:.2} (turn by \
         turn: {}); agent RSS {} KiB (peak {} KiB)",
        1e3 * agent_per_lu,
        1e3 * bare.per_run(),
        ratio(agent_per_lu, bare.per_run()),
        turns
            .iter()
            .map(|r| format!("x{r:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        agent.rss_kib,
        agent.peak_kib
    )?;
    writeln!(
        report,
        "perf-data\twatch CPU per LU-check\t{luns}\t{paths}\tprfence\t{agent_per_lu:.9}\n\
         perf-data\twatch CPU per LU-check\t{luns}\t{paths}\tfloor\t{:.9}\n\
         perf-data\twatch RSS KiB\t{luns}\t{paths}\tprfence\t{}",
        bare.per_run(),
        agent.rss_kib
    )?;
    for &(what, other) in others {
        writeln!(
            report,
            "bench:   fence_scsi_check ({what}) / prfence agent: CPU share x{:.1}, CPU per \
             check x{:.1}, peak memory x{:.1}",
            ratio(other.share(), agent.share()),
            ratio(other.per_run(), agent.per_run()),
            ratio(other.peak_kib as f64, agent.peak_kib as f64)
        )?;
    }
    Ok(report)
}

/// The state the unit's status file says.
fn state() -> Option<String> {
    Some(status().ok()?["state"].as_str()?.to_owned())
}

/// When the agent last ended a check: the status file's modification time, set after every
/// check (the document itself is rewritten only when it changes, or every 30 s).
fn last_check_end() -> Option<SystemTime> {
    std::fs::metadata(STATUS).ok()?.modified().ok()
}

/// The check ends after `since` seen while polling every 20 ms for `window` (a check lasts
/// longer than that, so none is missed): how many, and the last one.
fn check_ends(since: SystemTime, window: Duration) -> (u64, SystemTime) {
    let (mut count, mut last) = (0, since);
    let end = Instant::now() + window;
    while Instant::now() < end {
        if let Some(ended) = last_check_end()
            && ended > last
        {
            (count, last) = (count + 1, ended);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (count, last)
}

/// Fails when the unit is no longer active, with its journal.
fn still_active() -> anyhow::Result<()> {
    let state = show(UNIT, "ActiveState")?;
    if state != "active" {
        bail!("{UNIT} is {state}:\n{}", journal());
    }
    Ok(())
}

/// The agent's watch CPU (process `pid`, the unit's main process) and the floor loop's, in turns
/// of [`TURN`] over `window`: the agent measured from the end of one of its checks to the end of
/// another (whole checks only), then stopped (SIGSTOP, between two checks) for the floor loop's
/// [`FLOOR_TURN`], then on again. A
/// change in the guest's speed during the run so weighs on both alike. Its metrics are scraped
/// once per turn. Returns both costs summed over the turns, and each turn's ratio of CPU per
/// LU-check.
fn agent_and_floor_cost(
    t: &Topology,
    luns: usize,
    pid: u32,
    window: Duration,
) -> anyhow::Result<(Cost, Cost, Vec<f64>)> {
    let start = Instant::now();
    while state().as_deref() != Some("healthy") {
        still_active()?;
        ensure!(
            start.elapsed() < Duration::from_secs(600),
            "the agent is not healthy after 600 s: {:?}\n{}",
            state(),
            journal()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Two more checks, healthy.
    let (mut healthy, mut seen) = (0, last_check_end().unwrap_or(SystemTime::UNIX_EPOCH));
    while healthy < 2 {
        let (ended, last) = check_ends(seen, Duration::from_secs(1));
        (healthy, seen) = (healthy + ended, last);
        still_active()?;
        ensure!(
            start.elapsed() < Duration::from_secs(600),
            "the agent ends no check: {:?}\n{}",
            state(),
            journal()
        );
    }
    let warm_up = start.elapsed();
    // CPU read right after a check ended (the status file's modification time moved past
    // `since`): the agent is idle then until its next check, so a window holds whole checks
    // only.
    let after_check = |since: SystemTime| -> anyhow::Result<(u64, SystemTime, Instant)> {
        let waiting = Instant::now();
        loop {
            if let Some(ended) = last_check_end()
                && ended > since
            {
                return Ok((cpu_ticks(pid)?, ended, Instant::now()));
            }
            ensure!(
                waiting.elapsed() < Duration::from_secs(120),
                "the agent ended no check in 120 s\n{}",
                journal()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let ticks = floor::clock_ticks()?;
    let agent_pid = Pid::from_raw(i32::try_from(pid)?);
    let turns = (window.as_secs() / TURN.as_secs()).max(1);
    let (mut cpu, mut runs, mut wall) = (0, 0, Duration::ZERO);
    let mut floors: Vec<Cost> = Vec::new();
    let mut ratios = Vec::new();
    for _ in 0..turns {
        let (cpu0, first_end, began) = after_check(seen)?;
        let (before_scrape, last) = check_ends(first_end, TURN / 2);
        let scrape = crate::run("curl", ["-sf", "-o", "/dev/null", METRICS])?;
        ensure!(
            scrape.code() == 0,
            "GET {METRICS} failed: {}",
            scrape.stderr
        );
        let (after_scrape, last) = check_ends(last, TURN / 2);
        let (cpu1, last_end, ended) = after_check(last)?;
        let checks = before_scrape + after_scrape + 1;
        let agent_per_lu = (cpu1 - cpu0) as f64 / ticks as f64 / checks as f64 / luns as f64;
        (cpu, runs, wall) = (cpu + cpu1 - cpu0, runs + checks, wall + (ended - began));
        // The floor's turn, with the agent stopped between two of its checks.
        kill(agent_pid, Signal::SIGSTOP)?;
        let floor = floor_loop_cost(t, FLOOR_TURN);
        kill(agent_pid, Signal::SIGCONT)?;
        let floor = floor?;
        ratios.push(agent_per_lu / floor.per_run());
        floors.push(floor);
        seen = last_end;
    }
    still_active()?;
    if std::env::var_os("LAB_PROFILE").is_some_and(|v| v == "1") {
        profile(pid, luns)?;
    }
    let agent = Cost {
        cpu: Duration::from_millis(cpu * 1000 / ticks),
        wall,
        runs,
        rss_kib: status_kib(pid, "VmRSS:")?,
        peak_kib: status_kib(pid, "VmHWM:")?,
        note: format!(
            "{runs} checks of {luns} LUs in {turns} turn(s) of {} s (healthy after {}; the \
             packaged unit and configuration)",
            TURN.as_secs(),
            crate::secs(warm_up),
        ),
    };
    let floor = Cost {
        cpu: floors.iter().map(|f| f.cpu).sum(),
        wall: floors.iter().map(|f| f.wall).sum(),
        runs: floors.iter().map(|f| f.runs).sum(),
        rss_kib: floors.iter().map(|f| f.rss_kib).max().unwrap_or(0),
        peak_kib: floors.iter().map(|f| f.peak_kib).max().unwrap_or(0),
        note: format!(
            "{} LU-checks in {turns} turn(s) of {} s, one thread, devices opened once",
            floors.iter().map(|f| f.runs).sum::<u64>(),
            FLOOR_TURN.as_secs()
        ),
    };
    Ok((agent, floor, ratios))
}

/// `LAB_PROFILE=1`: where the agent's watch CPU goes, after the measured window (so it does not
/// skew it): a perf profile of the agent for 20 s (kernel and user symbols, by self time), then
/// strace's system call counts for 20 s divided by the LU-checks it saw (strace slows the agent:
/// its counts, not its times, are the point).
fn profile(pid: u32, luns: usize) -> anyhow::Result<()> {
    let pid_text = pid.to_string();
    let data = format!("{}/perf.data", crate::WORK);
    std::fs::create_dir_all(crate::WORK)?;
    // --no-buildid-cache: nothing written under /root/.debug (the guest's residue check)
    let record = crate::run(
        "perf",
        [
            "record",
            "--no-buildid-cache",
            "-g",
            "-F",
            "499",
            "-p",
            &pid_text,
            "-o",
            &data,
            "--",
            "sleep",
            "20",
        ],
    )?
    .ok()?;
    // The package's binary is stripped (`strip` keeps its build id): perf finds the test build's
    // own, with its symbols, at the installed path under --symfs.
    let installed = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    let symfs = format!("{}/symfs", crate::WORK);
    let unstripped = Path::new(&symfs).join(installed.strip_prefix("/")?);
    std::fs::create_dir_all(unstripped.parent().unwrap_or(Path::new(&symfs)))?;
    std::fs::copy(crate::PRFENCE, &unstripped)?;
    // By object (kernel, prfence, libc), then by symbol: self time (the release build has no
    // frame pointers to charge callers with).
    let mut report = String::new();
    for (sort, limit) in [("dso", "0.5"), ("dso,sym", "0.4")] {
        let run = crate::run(
            "perf",
            [
                "report",
                "--symfs",
                &symfs,
                "--kallsyms",
                "/proc/kallsyms",
                "-i",
                &data,
                "--stdio",
                "--no-children",
                "--percent-limit",
                limit,
                "-g",
                "none",
                "--sort",
                sort,
            ],
        )?
        .ok()?;
        report.push_str(&run.stdout);
    }
    std::fs::remove_file(&data)?;
    std::fs::remove_dir_all(&symfs)?;
    let counts = format!("{}/strace.txt", crate::WORK);
    // strace ends at SIGINT and writes its table to -o; the checks it saw are counted meanwhile.
    let since = last_check_end().unwrap_or(SystemTime::UNIX_EPOCH);
    let counting = std::thread::spawn(move || check_ends(since, Duration::from_secs(20)));
    crate::run(
        "timeout",
        [
            "-s", "INT", "20", "strace", "-qq", "-c", "-f", "-o", &counts, "-p", &pid_text,
        ],
    )?;
    let (ended, _) = counting
        .join()
        .map_err(|_| anyhow::anyhow!("the count of checks panicked"))?;
    let lu_checks = ended * luns as u64;
    let table = std::fs::read_to_string(&counts)?;
    std::fs::remove_file(&counts)?;
    let mut per_lu = String::new();
    for line in table.lines() {
        // "% time  seconds  usecs/call  calls  [errors]  syscall", and a "total" line
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(name), Some(calls)) = (fields.last(), fields.get(3)) else {
            continue;
        };
        if let Ok(calls) = calls.parse::<u64>()
            && lu_checks > 0
        {
            writeln!(
                per_lu,
                "bench:   {name:<20} {:>8.2} per LU-check",
                calls as f64 / lu_checks as f64
            )?;
        }
    }
    println!(
        "bench: profile of the agent (LAB_PROFILE=1)\n{}{}\n{}",
        record.stdout, record.stderr, report
    );
    println!(
        "bench: system calls of the agent for 20 s under strace ({lu_checks} LU-checks)\n{table}\n{per_lu}"
    );
    Ok(())
}

/// The floor's READ KEYS loop over node A's LUs for `window`: its CPU per LU-check and peak RSS,
/// as the floor process itself read them from /proc at its end.
fn floor_loop_cost(t: &Topology, window: Duration) -> anyhow::Result<Cost> {
    let mode = format!("loop {}", window.as_secs());
    let run = crate::run_command(&mut floor::command(&mode, t.node(Node::A).devices())?)?.ok()?;
    let fields: Vec<u64> = run
        .stdout
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("the floor said {:?}", run.stdout))?;
    let [checks, ticks, peak] = fields[..] else {
        anyhow::bail!("the floor said {:?}", run.stdout);
    };
    Ok(Cost {
        cpu: Duration::from_millis(ticks * 1000 / floor::clock_ticks()?),
        wall: run.elapsed,
        runs: checks,
        rss_kib: peak,
        peak_kib: peak,
        note: format!("{checks} LU-checks, one thread, devices opened once"),
    })
}

/// fence_scsi_check started once a second (back to back when a run takes longer), as the
/// watchdog daemon's test-binary; CPU and peak RSS of everything it ran, from the children's
/// rusage of a small Python driver (fence_scsi_check is Python too).
fn fence_scsi_check_cost(what: &str, window: Duration) -> anyhow::Result<Cost> {
    let driver = format!(
        r#"
import resource, subprocess, time
begin = time.monotonic()
end = begin + {window}
runs, failed, longest = 0, 0, 0.0
while time.monotonic() < end:
    started = time.monotonic()
    if subprocess.call(["{FENCE_SCSI_CHECK}"]) != 0:
        failed += 1
    runs += 1
    took = time.monotonic() - started
    longest = max(longest, took)
    time.sleep(max(0.0, 1.0 - took))
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime, r.ru_maxrss, runs, failed, longest, time.monotonic() - begin)
"#,
        window = window.as_secs()
    );
    let run = crate::run("python3", ["-c", &driver])?.ok()?;
    let fields: Vec<&str> = run.stdout.split_whitespace().collect();
    ensure!(fields.len() == 6, "driver said {:?}", run.stdout);
    let cpu: f64 = fields[0].parse()?;
    let peak: u64 = fields[1].parse()?;
    ensure!(
        fields[3] == "0",
        "fence_scsi_check failed {} of {} runs",
        fields[3],
        fields[2]
    );
    Ok(Cost {
        cpu: Duration::from_secs_f64(cpu),
        wall: Duration::from_secs_f64(fields[5].parse()?),
        runs: fields[2].parse()?,
        rss_kib: peak,
        peak_kib: peak,
        note: format!(
            "{what}: {} runs, longest {:.2} s (RSS: largest process it ran)",
            fields[2],
            fields[4].parse::<f64>()?
        ),
    })
}
