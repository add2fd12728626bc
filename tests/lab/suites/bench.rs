//! What prfence costs, next to fence-agents' fence_scsi and to the floor (bare READ KEYS through
//! SG_IO, `crate::floor`), in the same guest and the same run. Printed, never asserted (the guest
//! is emulated: absolute figures are inflated, ratios are the point); what each operation leaves
//! on the target is checked, so a fast wrong answer fails.
//!
//! - `performance_*`: unfence, fence (both key orders) and status by fence_pr, fence_scsi and
//!   `prfence`, and the floor, on N LUs x 1 or 2 paths. Each prints a table and `perf-data` lines
//!   that `cargo xtask perf` turns into docs/performance.md's table and plot.
//! - `holds_at_1024_luns_4_paths`: what the one-shot commands hold at the largest size.
//!
//! The node agent's cost is `super::bench_agent`'s (the packaged unit on a systemd node).
//!
//! Long tier only, on the release build the package ships (`cargo test --release --test lab --
//! --ignored bench::`, as root): the growth series (1 to 256 LUNs, 1 and 2 paths).

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use std::path::PathBuf;

use super::fence::keys_everywhere;
use crate::fence_agents::{self, FenceAgent, derived_key, fake_cmapctl};
use crate::floor;
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{CommandRun, Node, Topology};
use anyhow::{Context, ensure};

use crate::PRFENCE;
/// The quick look's size.
const CI_LUNS: usize = 16;

pub const SUITE: Suite = Suite {
    name: "bench",
    kernel: GuestKernel::Host,
    package: true,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    // Benchmarks, in the long tier only: the 16-LU table about 1, the growth series about 20
    // (its 64-LU cases with fence_scsi alone about 5 each), the 1024-LU one about 10
    budget: Duration::from_secs(40 * 60),
    usual: Duration::from_secs(800),
    tests: &[],
    long: crate::tests![
        performance_16_luns,
        performance_growth,
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

/// Long tier: what prfence holds at the issue's largest size, 1024 LUNs with 4 paths each (node
/// A: 4 iSCSI sessions, 4096 paths, one dm-multipath map per LU as an admin would name them;
/// node B one session), beyond the growth series' 256 x 2: unfence, status and fence by node A
/// on its maps, each run under [`held_by`], each result checked on the target (every LU
/// registered through all 4 of A's nexuses; after the fence, A's registrations alone).
fn holds_at_1024_luns_4_paths() -> anyhow::Result<()> {
    const LUNS: usize = crate::topology::MAX_LUNS;
    memory_for_four_paths(LUNS)?;
    let t = Topology::iscsi(LUNS)?;
    let a = four_path_maps(&t)?;
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

/// The guest has the memory for `luns` LUNs with 4 paths each and their maps: the guest
/// kernel's own share for 5000 SCSI disks and 1024 maps was about 900 MiB of slab, and a 2 GiB
/// guest ran out of memory making the maps. Asked before the topology is built.
pub(super) fn memory_for_four_paths(luns: usize) -> anyhow::Result<()> {
    let memory_kib: u64 = crate::read_file("/proc/meminfo")?
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        .context("MemTotal in /proc/meminfo")?;
    ensure!(
        luns < 512 || memory_kib >= 3 << 20,
        "the guest has {} MiB; {luns} LUNs with 4 paths need 4 GiB: run with LAB_MEM=4096",
        memory_kib >> 10
    );
    Ok(())
}

/// Node A's LUs through 4 iSCSI sessions, one dm-multipath map per LU (`a0`, `a1`, ...) as an
/// admin would name them; node B keeps one session.
pub(super) fn four_path_maps(t: &Topology) -> anyhow::Result<Vec<PathBuf>> {
    let luns = t.lus().len();
    let mut sessions = vec![t.node(Node::A).devices().to_vec()];
    for n in 2..=crate::topology::SESSIONS {
        sessions.push(t.session(Node::A, n)?);
    }
    t.settle()?;
    let started = Instant::now();
    let maps: Vec<PathBuf> = (0..luns)
        .map(|lun| {
            let paths: Vec<&std::path::Path> = sessions.iter().map(|s| s[lun].as_path()).collect();
            t.multipath_map(&format!("a{lun}"), lun, &paths)
        })
        .collect::<anyhow::Result<_>>()?;
    println!(
        "bench: node A's {} paths in {} maps in {}, node B {} paths",
        sessions.iter().map(Vec::len).sum::<usize>(),
        maps.len(),
        crate::secs(started.elapsed()),
        t.node(Node::B).devices().len(),
    );
    Ok(maps)
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
pub(super) fn build_profile() -> &'static str {
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
