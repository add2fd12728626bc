//! What prfence costs, next to fence-agents' fence_scsi and to the floor (bare READ KEYS through
//! SG_IO, `crate::floor`), in the same guest and the same run. Printed, never asserted (the guest
//! is emulated: absolute figures are inflated, ratios are the point); what each operation leaves
//! on the target is checked, so a fast wrong answer fails.
//!
//! - `performance_*`: unfence, fence (both key orders) and status by fence_pr, fence_scsi and
//!   `prfence`, and the floor, on N LUs x 1 or 2 paths. Each prints a table and `perf-data` lines
//!   that `cargo xtask perf` turns into docs/performance.md's table and plot.
//! - `watch_cost_*`: `prfence agent` in watch mode at a 1 s interval, next to the floor's READ KEYS
//!   loop over the same LUs and fence-agents' `fence_scsi_check` run once a second as the watchdog
//!   daemon runs it.
//!
//! CI runs both on 16 LUNs (the test build it tests: opt-level 1, debug assertions); the long
//! tier, on the release build the package ships (`cargo test --release --test lab -- --ignored
//! bench::`, as root), runs the growth series (1 to 256 LUNs, 1 and 2 paths) and the watch cost
//! on 256 LUNs.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::path::PathBuf;

use super::fence::keys_everywhere;
use crate::fence_agents::{self, FenceAgent, derived_key, fake_cmapctl};
use crate::floor::{self, cpu_ticks, status_kib};
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{CommandRun, Node, Topology, WORK};
use anyhow::{Context, ensure};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::PRFENCE;
/// The measuring window of each job (CPU per second of it).
const WINDOW: Duration = Duration::from_secs(15);
/// CI's run: the same jobs and checks on 16 LUNs, with a shorter window.
const CI_LUNS: usize = 16;
const CI_WINDOW: Duration = Duration::from_secs(5);
/// One turn of the agent's watch measurement, and of the floor's after it.
const TURN: Duration = Duration::from_secs(5);
const FENCE_SCSI_CHECK: &str = "/usr/share/cluster/fence_scsi_check";

pub const SUITE: Suite = Suite {
    name: "bench",
    kernel: GuestKernel::Host,
    package: true,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    // Benchmarks, in the long tier only: the 16-LU watch cost about half a minute, the 16-LU
    // table about 1, the growth series about 20 (its 64-LU cases with fence_scsi alone about 5 each), the 256-LU
    // watch cost 3 to 5
    budget: Duration::from_secs(40 * 60),
    usual: Duration::from_secs(800),
    tests: &[],
    long: crate::tests![
        watch_cost_16_luns,
        performance_16_luns,
        performance_growth,
        watch_cost_256_luns,
        holds_at_1024_luns_4_paths
    ],
    reproducers: &[],
};

/// The 16-LU comparison on Debian 13 nodes: fence_scsi 4.16 and sg3_utils 1.48 beside the same
/// prfence binary (issue 45), on Debian 13's kernel.
pub const SUITE_DEBIAN13: Suite = Suite {
    name: "bench_debian13",
    kernel: GuestKernel::Suite("trixie"),
    root: GuestRoot::Suite("trixie"),
    long: crate::tests![performance_16_luns],
    ..SUITE
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

/// Long tier: the benchmark's jobs and checks at a small scale (the agent healthy on every LU,
/// fence_scsi_check passing, as shipped and reading every LU), [`CI_LUNS`] LUNs and a short window.
fn watch_cost_16_luns() -> anyhow::Result<()> {
    watch_cost(CI_LUNS, CI_WINDOW)
}

/// Long tier: the benchmark proper, 256 LUNs (the topology alone takes 15-40 s to build, the whole
/// run about 4 minutes under emulation).
fn watch_cost_256_luns() -> anyhow::Result<()> {
    watch_cost(256, WINDOW)
}

/// Long tier: what prfence holds at the issue's largest size, 1024 LUNs with 4 paths each (node
/// A: 4 iSCSI sessions, 4096 paths, one dm-multipath map per LU as an admin would name them;
/// node B one session), beyond the growth series' 256 x 2: unfence, status and fence by node A
/// on its maps, each run under [`held_by`], each result checked on the target (every LU
/// registered through all 4 of A's nexuses; after the fence, A's registrations alone).
fn holds_at_1024_luns_4_paths() -> anyhow::Result<()> {
    const LUNS: usize = crate::topology::MAX_LUNS;
    // The guest kernel's own share: 5000 SCSI disks and 1024 maps took about 900 MiB of slab,
    // and a 2 GiB guest ran out of memory making the maps.
    let memory_kib: u64 = crate::read_file("/proc/meminfo")?
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        .context("MemTotal in /proc/meminfo")?;
    ensure!(
        memory_kib >= 3 << 20,
        "the guest has {} MiB; 1024 LUNs with 4 paths need 4 GiB: run with LAB_MEM=4096",
        memory_kib >> 10
    );
    let t = Topology::iscsi(LUNS)?;
    let mut sessions = vec![t.node(Node::A).devices().to_vec()];
    for n in 2..=crate::topology::SESSIONS {
        sessions.push(t.session(Node::A, n)?);
    }
    t.settle()?;
    let started = Instant::now();
    let a: Vec<PathBuf> = (0..LUNS)
        .map(|lun| {
            let paths: Vec<&std::path::Path> = sessions.iter().map(|s| s[lun].as_path()).collect();
            t.multipath_map(&format!("a{lun}"), lun, &paths)
        })
        .collect::<anyhow::Result<_>>()?;
    println!(
        "bench: {LUNS} LUNs set up in {}, node A's {} paths in {} maps in {} more, node B {} paths",
        crate::secs(t.setup_time()),
        sessions.iter().map(Vec::len).sum::<usize>(),
        a.len(),
        crate::secs(started.elapsed()),
        t.node(Node::B).devices().len(),
    );
    let a_everywhere = |what: &str, alone: bool| -> anyhow::Result<()> {
        for lu in t.lus() {
            let registrations = lu.registrations()?;
            let own = registrations.iter().filter(|r| r.key == 0xa).count();
            ensure!(
                own == crate::topology::SESSIONS && (!alone || own == registrations.len()),
                "after {what}: LU {} holds {registrations:?}",
                lu.index
            );
        }
        Ok(())
    };
    let mut held = Vec::new();
    held.push(("unfence", held_by(&["unfence", "--key", "0xa"], &a)?));
    a_everywhere("unfence", true)?;
    crate::prfence_with_devices(&["unfence", "--key", "0xb"], t.node(Node::B).devices())?.ok()?;
    held.push(("status", held_by(&["status", "--key", "0xa"], &a)?));
    let fence = ["fence", "--key", "0xa", "--victim", "0xb"];
    held.push(("fence", held_by(&fence, &a)?));
    a_everywhere("fence", true)?;
    for (op, held) in &held {
        println!("{}", held.line(op, LUNS, crate::topology::SESSIONS));
    }
    clear(&a, 0xa)
}

/// The performance table on 16 LUNs, one path each (fence_scsi takes 15-60 s per operation there
/// under emulation): the long tier's quick look, the series' 16-LU row alone.
fn performance_16_luns() -> anyhow::Result<()> {
    performance(CI_LUNS, 1, true)
}

/// Long tier: how cost grows, 1 to 256 LUNs (the lab's largest topology) with 1 and 2 paths per
/// LU; fence_scsi up to 64 LUNs (at 64 each of its operations takes about a minute).
/// `LAB_PERF_LUNS` and `LAB_PERF_PATHS` (comma-separated) pick a part of the series.
fn performance_growth() -> anyhow::Result<()> {
    let list = |var: &str, default: &[usize]| -> anyhow::Result<Vec<usize>> {
        match std::env::var(var) {
            Ok(text) => text
                .split(',')
                .map(|n| n.trim().parse().with_context(|| format!("{var}={text:?}")))
                .collect(),
            Err(_) => Ok(default.to_vec()),
        }
    };
    for paths in list("LAB_PERF_PATHS", &[1, 2])? {
        for luns in list("LAB_PERF_LUNS", &[1, 16, 64, 256])? {
            performance(luns, paths, luns <= 64)?;
        }
    }
    Ok(())
}

/// Which build of prfence (and of the floor) was measured: the profile of this lab binary, which
/// cargo built together with them. The package ships the release build; the test build is the
/// workspace's opt-level 1 with debug assertions (Cargo.toml).
fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "test build (opt-level 1)"
    } else {
        "release build"
    }
}

/// The seconds an operation took, per tool.
struct Timed {
    op: &'static str,
    times: Vec<(&'static str, Duration)>,
}

/// One topology of `luns` LUNs, each seen by each node through `paths` paths (1 or 2 iSCSI
/// sessions); unfence, fence in both key orders and status by every tool, from the same state;
/// prints the table and its `perf-data` lines.
fn performance(luns: usize, paths: usize, with_fence_scsi: bool) -> anyhow::Result<()> {
    ensure!((1..=2).contains(&paths), "1 or 2 paths per LU, not {paths}");
    let _key_store = crate::RemoveOnDrop::all(["/var/run/cluster.key", "/var/run/cluster.dev"]);
    let t = Topology::iscsi(luns)?;
    let mut devices: [Vec<PathBuf>; 2] = [Node::A, Node::B].map(|n| t.node(n).devices().to_vec());
    if paths == 2 {
        for node in [Node::A, Node::B] {
            let second = t.second_session(node)?;
            devices[node.index()].extend(second);
        }
    }
    t.settle()?;
    fake_cmapctl()?;
    let of = |node: Node| devices[node.index()].as_slice();
    let mut rows: Vec<Timed> = [
        "unfence",
        "fence, greater key",
        "fence, smaller key",
        "status",
    ]
    .into_iter()
    .map(|op| Timed {
        op,
        times: Vec::new(),
    })
    .collect();

    let agents: &[FenceAgent] = if with_fence_scsi {
        &[FenceAgent::FencePr, FenceAgent::FenceScsi]
    } else {
        &[FenceAgent::FencePr]
    };
    for &agent in agents {
        let name = agent.name();
        let (ka, kb) = (derived_key(Node::A)?, derived_key(Node::B)?);
        // Each agent's round starts as a freshly booted cluster.
        fence_agents::reboot(Node::A)?;
        fence_agents::reboot(Node::B)?;
        let on = fence_agents::expect(agent, Node::A, "on", Node::A, of(Node::A), 0)?;
        fence_agents::expect(FenceAgent::FencePr, Node::B, "on", Node::B, of(Node::B), 0)?;
        ensure!(keys_everywhere(&t)? == [ka, kb], "after {name}'s on");
        let greater = fence_agents::expect(agent, Node::B, "off", Node::A, of(Node::B), 0)?;
        ensure!(
            keys_everywhere(&t)? == [kb],
            "after {name}'s off by the greater key"
        );
        // A was fenced: fence_pr's `on` takes it back only after a reboot (P3).
        fence_agents::reboot(Node::A)?;
        fence_agents::expect(FenceAgent::FencePr, Node::A, "on", Node::A, of(Node::A), 0)?;
        let smaller = fence_agents::expect(agent, Node::A, "off", Node::B, of(Node::A), 0)?;
        ensure!(
            keys_everywhere(&t)? == [ka],
            "after {name}'s off by the smaller key"
        );
        let status = fence_agents::expect(agent, Node::A, "status", Node::A, of(Node::A), 0)?;
        for (row, run) in rows.iter_mut().zip([on, greater, smaller, status]) {
            row.times.push((name, run.elapsed));
        }
        clear(of(Node::A), ka)?;
    }

    // prfence's own commands, the node's keys 0xa and 0xb
    let prfence = |node: Node, args: &[&str]| -> anyhow::Result<CommandRun> {
        crate::prfence_with_devices(args, of(node))?.ok()
    };
    let (a, b) = (
        crate::node::hex(Node::A.key()),
        crate::node::hex(Node::B.key()),
    );
    let unfence = prfence(Node::A, &["unfence", "--key", &a])?;
    prfence(Node::B, &["unfence", "--key", &b])?;
    let greater = prfence(Node::B, &["fence", "--key", &b, "--victim", &a])?;
    ensure!(
        keys_everywhere(&t)? == [0xb],
        "after prfence fence by the greater key"
    );
    prfence(Node::A, &["unfence", "--key", &a])?;
    let smaller = prfence(Node::A, &["fence", "--key", &a, "--victim", &b])?;
    ensure!(
        keys_everywhere(&t)? == [0xa],
        "after prfence fence by the smaller key"
    );
    let status = prfence(Node::A, &["status", "--key", &a])?;
    for (row, run) in rows.iter_mut().zip([unfence, greater, smaller, status]) {
        row.times.push(("prfence", run.elapsed));
    }
    // where prfence's time goes: its READ KEYS alone (the floor's job), and starting at all
    let best_of_3 = |args: &[&str]| -> anyhow::Result<Duration> {
        let mut best = Duration::MAX;
        for _ in 0..3 {
            best = best.min(prfence(Node::A, args)?.elapsed);
        }
        Ok(best)
    };
    rows.push(Timed {
        op: "keys",
        times: vec![("prfence", best_of_3(&["keys"])?)],
    });
    let start = crate::prfence(["--version"])?.ok()?.elapsed;
    let start = start.min(crate::prfence(["--version"])?.ok()?.elapsed);
    rows.push(Timed {
        op: "start (--version)",
        times: vec![("prfence", start)],
    });
    // the floor: READ KEYS on every path at once, the best of three
    let mut floors = Vec::new();
    for _ in 0..3 {
        let run = crate::run_command(&mut floor::command("once", of(Node::A))?)?.ok()?;
        floors.push(run.elapsed);
    }
    let floor = floors.into_iter().min().context("no floor run")?;
    // What a command that opens every path holds at most, each measured in a run of its own.
    let held: Vec<(&str, Held)> = [&["status", "--key", &a][..], &["unfence", "--key", &a]]
        .into_iter()
        .map(|args| Ok((args[0], held_by(args, of(Node::A))?)))
        .collect::<anyhow::Result<_>>()?;
    clear(of(Node::A), 0xa)?;

    let mut report = format!(
        "perf: {luns} LUs x {paths} path(s) per node, iSCSI, TCG-emulated guest, {}; seconds, \
         one run each (floor: READ KEYS on every path at once, one process, best of 3: {:.3} s)\n",
        build_profile(),
        floor.as_secs_f64()
    );
    let tools = ["fence_pr", "fence_scsi", "prfence"];
    writeln!(
        report,
        "perf:   {:<20} {:>10} {:>10} {:>10}  {:>18} {:>16}",
        "operation", tools[0], tools[1], tools[2], "fence_scsi/fence_pr", "prfence/floor"
    )?;
    for row in &rows {
        let secs = |tool: &str| {
            row.times
                .iter()
                .find(|(t, _)| *t == tool)
                .map(|(_, d)| d.as_secs_f64())
        };
        let cell = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}x", a / b),
            _ => "-".to_owned(),
        };
        let floor = Some(floor.as_secs_f64());
        writeln!(
            report,
            "perf:   {:<20} {:>10} {:>10} {:>10}  {:>18} {:>16}",
            row.op,
            cell(secs(tools[0])),
            cell(secs(tools[1])),
            cell(secs(tools[2])),
            ratio(secs(tools[1]), secs(tools[0])),
            ratio(secs(tools[2]), floor)
        )?;
        for (tool, took) in &row.times {
            writeln!(
                report,
                "perf-data\t{}\t{luns}\t{paths}\t{tool}\t{:.6}",
                row.op,
                took.as_secs_f64()
            )?;
        }
    }
    writeln!(
        report,
        "perf-data\tfloor\t{luns}\t{paths}\tfloor\t{:.6}",
        floor.as_secs_f64()
    )?;
    for (op, held) in &held {
        writeln!(report, "{}", held.line(op, luns, paths))?;
    }
    print!("{report}");
    Ok(())
}

/// What one run of a command held at most.
struct Held {
    wall: Duration,
    threads: u64,
    descriptors: u64,
    peak_kib: u64,
}

impl Held {
    /// The `perf-held:` line of prfence `op` on `luns` LUs with `paths` paths each.
    fn line(&self, op: &str, luns: usize, paths: usize) -> String {
        format!(
            "perf-held: prfence {op}, {luns} LUs x {paths} path(s): {:.3} s, at most {} threads \
             and {} descriptors seen (sampled every millisecond), peak RSS {} KiB",
            self.wall.as_secs_f64(),
            self.threads,
            self.descriptors,
            self.peak_kib
        )
    }
}

/// Runs prfence `args` on `devices` under a small Python driver that samples its threads and
/// open descriptors from /proc every millisecond while it runs (the most seen: the true peak is
/// at least that) and reads its peak RSS from the finished child's rusage (exact). prfence gets
/// the descriptor limits of a Debian 12 login or service (systemd's soft 1024, hard 524288),
/// not the lab init's (the kernel's 1024 and 4096).
fn held_by(args: &[&str], devices: &[PathBuf]) -> anyhow::Result<Held> {
    const DRIVER: &str = r#"
import os, resource, subprocess, sys, time
began = time.monotonic()
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
threads = fds = 0
while child.poll() is None:
    try:
        with open(f"/proc/{child.pid}/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    threads = max(threads, int(line.split()[1]))
        fds = max(fds, len(os.listdir(f"/proc/{child.pid}/fd")))
    except OSError:
        pass
    time.sleep(0.001)
wall = time.monotonic() - began
print(child.returncode, threads, fds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, wall)
"#;
    let mut cmd = Command::new("python3");
    cmd.args(["-c", DRIVER, "prlimit", "--nofile=1024:524288", PRFENCE])
        .args(args)
        .args(devices);
    let run = crate::run_command(&mut cmd)?.ok()?;
    let said = || format!("driver said {:?}", run.stdout);
    let fields: Vec<&str> = run.stdout.split_whitespace().collect();
    let [code, threads, descriptors, peak_kib, wall] = fields[..] else {
        anyhow::bail!("{}", said());
    };
    ensure!(
        code == "0",
        "prfence {} under the driver: {}",
        args.join(" "),
        said()
    );
    let count = |text: &str| text.parse::<u64>().with_context(said);
    Ok(Held {
        wall: Duration::from_secs_f64(wall.parse().with_context(said)?),
        threads: count(threads)?,
        descriptors: count(descriptors)?,
        peak_kib: count(peak_kib)?,
    })
}

/// PERSISTENT RESERVE OUT CLEAR with a registered key: no registration and no reservation left,
/// the state every tool's unfence starts from.
fn clear(devices: &[PathBuf], key: u64) -> anyhow::Result<()> {
    crate::prfence_with_devices(&["clear", "--key", &format!("{key:#x}")], devices)?.ok()?;
    Ok(())
}

fn watch_cost(luns: usize, window: Duration) -> anyhow::Result<()> {
    let t = Topology::iscsi(luns)?;
    let devices: Vec<String> = t.node(Node::A).device_args();
    let mut args = vec!["unfence", "--key", "0xa"];
    args.extend(devices.iter().map(String::as_str));
    let unfence = crate::prfence(&args)?.ok()?;
    println!(
        "bench: {luns} LUNs set up in {}, node A unfenced on all in {}",
        crate::secs(t.setup_time()),
        crate::secs(unfence.elapsed)
    );

    let (agent, bare, turns) = agent_and_floor_cost(&t, &devices, window)?;
    // fence_scsi_check as shipped: it passes at the first device that has our key (fence-agents
    // #278), so with the key everywhere each run reads one LU of the 256
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

    let mut report = format!(
        "bench: watching {luns} LUNs at a 1 s interval, {} s window (TCG-emulated guest, {})\n",
        window.as_secs(),
        build_profile()
    );
    for (name, cost) in [
        ("prfence agent (watch)", &agent),
        ("fence_scsi_check", &shipped),
        ("fence_scsi_check", &every_lu),
    ] {
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
        "perf-data\twatch CPU per LU-check\t{luns}\t1\tprfence\t{agent_per_lu:.9}\n\
         perf-data\twatch CPU per LU-check\t{luns}\t1\tfloor\t{:.9}\n\
         perf-data\twatch RSS KiB\t{luns}\t1\tprfence\t{}",
        bare.per_run(),
        agent.rss_kib
    )?;
    for (what, other) in [("as shipped", &shipped), ("all LUs", &every_lu)] {
        writeln!(
            report,
            "bench:   fence_scsi_check ({what}) / prfence agent: CPU share x{:.1}, CPU per \
             check x{:.1}, peak memory x{:.1}",
            ratio(other.share(), agent.share()),
            ratio(other.per_run(), agent.per_run()),
            ratio(other.peak_kib as f64, agent.peak_kib as f64)
        )?;
    }
    print!("{report}");
    Ok(())
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

/// The agent's watch CPU and the floor loop's, in turns of [`TURN`] over `window`: the agent
/// measured from the end of one of its checks to the end of another (whole checks only), then
/// stopped (SIGSTOP, between two checks) while the floor loop runs, then on again. A change in
/// the guest's speed during the run so weighs on both alike. Returns both costs summed over the
/// turns, and each turn's ratio of CPU per LU-check.
fn agent_and_floor_cost(
    t: &Topology,
    devices: &[String],
    window: Duration,
) -> anyhow::Result<(Cost, Cost, Vec<f64>)> {
    std::fs::create_dir_all(WORK)?;
    let mut config =
        String::from("mode = \"watch\"\ncheck_interval = \"1s\"\ncommand_timeout = \"5s\"\n");
    for (index, device) in devices.iter().enumerate() {
        writeln!(
            config,
            "[[device]]\npath = \"{device}\"\nname = \"lun{index}\""
        )?;
    }
    config.push_str(
        "[key]\nvalue = \"0xa\"\n[watch]\ngrace = \"30s\"\n[self_fence]\nexit = true\n\
         [log]\ntarget = \"stderr\"\nlevel = \"warn\"\n",
    );
    let config_path = format!("{WORK}/agent.toml");
    let status_path = format!("{WORK}/status.json");
    std::fs::write(&config_path, config)?;
    let mut child = Command::new(PRFENCE)
        .envs(unit_environment())
        .args([
            "agent",
            "--config",
            &config_path,
            "--status-file",
            &status_path,
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(format!("{WORK}/agent.log"))?)
        .spawn()?;
    let pid = child.id();
    let checks = || -> Option<(String, u64)> {
        let text = std::fs::read_to_string(&status_path).ok()?;
        let status: serde_json::Value = serde_json::from_str(&text).ok()?;
        Some((
            status["state"].as_str()?.to_owned(),
            status["checks"].as_u64()?,
        ))
    };
    let start = Instant::now();
    loop {
        if let Some((state, n)) = checks()
            && state == "healthy"
            && n >= 3
        {
            break;
        }
        ensure!(
            child.try_wait()?.is_none(),
            "the agent exited: {}",
            std::fs::read_to_string(format!("{WORK}/agent.log"))?
        );
        ensure!(
            start.elapsed() < Duration::from_secs(300),
            "the agent is not healthy after 300 s: {:?}",
            checks()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let warm_up = start.elapsed();
    // CPU read right after a check ended (the status file's count moved past `since`): the
    // agent is idle then until its next check, so a window holds whole checks only.
    let after_check = |since: u64| -> anyhow::Result<(u64, u64, Instant)> {
        let waiting = Instant::now();
        loop {
            if let Some((_, n)) = checks()
                && n > since
            {
                return Ok((cpu_ticks(pid)?, n, Instant::now()));
            }
            ensure!(
                waiting.elapsed() < Duration::from_secs(60),
                "the agent ended no check in 60 s"
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
    let mut seen = checks().map_or(0, |c| c.1);
    for _ in 0..turns {
        let (cpu0, checks0, began) = after_check(seen)?;
        std::thread::sleep(TURN);
        let (cpu1, checks1, ended) = after_check(checks().map_or(checks0, |c| c.1))?;
        let agent_per_lu = (cpu1 - cpu0) as f64
            / ticks as f64
            / (checks1 - checks0).max(1) as f64
            / devices.len() as f64;
        (cpu, runs, wall) = (
            cpu + cpu1 - cpu0,
            runs + checks1 - checks0,
            wall + (ended - began),
        );
        // The floor's turn, with the agent stopped between two of its checks.
        kill(agent_pid, Signal::SIGSTOP)?;
        let floor = floor_loop_cost(t, TURN);
        kill(agent_pid, Signal::SIGCONT)?;
        let floor = floor?;
        ratios.push(agent_per_lu / floor.per_run());
        floors.push(floor);
        seen = checks1;
    }
    if std::env::var_os("LAB_PROFILE").is_some_and(|v| v == "1") {
        profile(pid)?;
    }
    let agent = Cost {
        cpu: Duration::from_millis(cpu * 1000 / ticks),
        wall,
        runs,
        rss_kib: status_kib(pid, "VmRSS:")?,
        peak_kib: status_kib(pid, "VmHWM:")?,
        note: format!(
            "{runs} checks of {} LUs in {turns} turn(s) of {} s (healthy after {}; the unit's \
             environment: {})",
            devices.len(),
            TURN.as_secs(),
            crate::secs(warm_up),
            unit_environment()
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    };
    kill(agent_pid, Signal::SIGTERM)?;
    child.wait()?;
    let floor = Cost {
        cpu: floors.iter().map(|f| f.cpu).sum(),
        wall: floors.iter().map(|f| f.wall).sum(),
        runs: floors.iter().map(|f| f.runs).sum(),
        rss_kib: floors.iter().map(|f| f.rss_kib).max().unwrap_or(0),
        peak_kib: floors.iter().map(|f| f.peak_kib).max().unwrap_or(0),
        note: format!(
            "{} LU-checks in {turns} turn(s) of {} s, one thread, devices opened once",
            floors.iter().map(|f| f.runs).sum::<u64>(),
            TURN.as_secs()
        ),
    };
    Ok((agent, floor, ratios))
}

/// The `Environment=` settings of the shipped unit, so the agent is measured as it runs there.
fn unit_environment() -> Vec<(String, String)> {
    include_str!("../../../packaging/prfence-agent.service")
        .lines()
        .filter_map(|line| line.strip_prefix("Environment="))
        .filter_map(|setting| setting.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// `LAB_PROFILE=1`: where the agent's watch CPU goes, after the measured window (so it does not
/// skew it): a perf profile of the agent for 10 s (kernel and user symbols, by self time), then
/// strace's system call counts for 10 s (strace slows the agent: its counts, not its times, are
/// the point; divide by the READ KEYS ioctls to get calls per LU-check).
fn profile(pid: u32) -> anyhow::Result<()> {
    let pid = pid.to_string();
    let data = format!("{WORK}/perf.data");
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
            &pid,
            "-o",
            &data,
            "--",
            "sleep",
            "10",
        ],
    )?
    .ok()?;
    let report = crate::run(
        "perf",
        [
            "report",
            "-i",
            &data,
            "--stdio",
            "--no-children",
            "--percent-limit",
            "0.7",
            "-g",
            "none",
            "--sort",
            "dso,sym",
        ],
    )?
    .ok()?;
    std::fs::remove_file(&data)?;
    let counts = format!("{WORK}/strace.txt");
    // strace ends at SIGINT and writes its table to -o
    crate::run(
        "timeout",
        [
            "-s", "INT", "10", "strace", "-qq", "-c", "-f", "-o", &counts, "-p", &pid,
        ],
    )?;
    let table = std::fs::read_to_string(&counts)?;
    std::fs::remove_file(&counts)?;
    println!(
        "bench: profile of the agent (LAB_PROFILE=1)\n{}{}\n{}",
        record.stdout, record.stderr, report.stdout
    );
    println!("bench: system calls of the agent for 10 s under strace\n{table}");
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
