//! What watching costs: `prfence agent` in watch mode on 256 LUNs at a 1 s interval, next to
//! fence-agents' `fence_scsi_check` run once a second as the watchdog daemon runs it. Printed,
//! never asserted (the guest is emulated: absolute figures are inflated, ratios are the point).
//! The 256-LUN run is in the long tier (`cargo test --test lab -- --ignored bench::`, as root);
//! CI runs the same jobs and checks on 16 LUNs.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::WORK;
use crate::plan::{GuestKernel, Suite};
use crate::{Node, Topology};
use anyhow::{Context, ensure};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::PRFENCE;
/// The measuring window of each job (CPU per second of it).
const WINDOW: Duration = Duration::from_secs(15);
/// CI's run: the same jobs and checks on 16 LUNs, with a shorter window.
const CI_LUNS: usize = 16;
const CI_WINDOW: Duration = Duration::from_secs(5);
const FENCE_SCSI_CHECK: &str = "/usr/share/cluster/fence_scsi_check";

pub const SUITE: Suite = Suite {
    name: "bench",
    kernel: GuestKernel::Host,
    package: false,
    budget: Duration::from_secs(12 * 60),
    tests: crate::tests![watch_cost_16_luns],
    long: crate::tests![watch_cost_256_luns],
    reproducers: &[],
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

/// CI: the benchmark's jobs and checks at a small scale (the agent healthy on every LU,
/// fence_scsi_check passing, as shipped and reading every LU), [`CI_LUNS`] LUNs and a short window.
fn watch_cost_16_luns() -> anyhow::Result<()> {
    watch_cost(CI_LUNS, CI_WINDOW)
}

/// Long tier: the benchmark proper, 256 LUNs (the topology alone takes 15-40 s to build, the whole
/// run about 4 minutes under emulation).
fn watch_cost_256_luns() -> anyhow::Result<()> {
    watch_cost(256, WINDOW)
}

fn watch_cost(luns: usize, window: Duration) -> anyhow::Result<()> {
    let t = Topology::iscsi(luns)?;
    let devices: Vec<String> = t
        .node(Node::A)
        .devices()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let mut args = vec!["unfence", "--key", "0xa"];
    args.extend(devices.iter().map(String::as_str));
    let unfence = crate::prfence(&args)?.ok()?;
    println!(
        "bench: {luns} LUNs set up in {}, node A unfenced on all in {}",
        crate::secs(t.setup_time()),
        crate::secs(unfence.elapsed)
    );

    let agent = agent_cost(&devices, window)?;
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
        "bench: watching {luns} LUNs at a 1 s interval, {} s window (TCG-emulated guest)\n",
        window.as_secs()
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

fn clock_ticks() -> anyhow::Result<u64> {
    let run = crate::run("getconf", ["CLK_TCK"])?.ok()?;
    Ok(run.stdout.trim().parse()?)
}

/// utime + stime of a process, in clock ticks (/proc/PID/stat fields 14 and 15).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // the command name may hold spaces: count fields after its closing parenthesis
    let after = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // after ')' the fields start at 3 (state): utime is field 14, stime 15
    let utime: u64 = fields[14 - 3].parse()?;
    let stime: u64 = fields[15 - 3].parse()?;
    Ok(utime + stime)
}

fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("empty field")?
        .parse()?)
}

fn agent_cost(devices: &[String], window: Duration) -> anyhow::Result<Cost> {
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
    let ticks = clock_ticks()?;
    let (cpu0, checks0) = (cpu_ticks(pid)?, checks().map_or(0, |c| c.1));
    std::thread::sleep(window);
    let (cpu1, checks1) = (cpu_ticks(pid)?, checks().map_or(0, |c| c.1));
    let cost = Cost {
        cpu: Duration::from_millis((cpu1 - cpu0) * 1000 / ticks),
        wall: window,
        runs: checks1 - checks0,
        rss_kib: status_kib(pid, "VmRSS:")?,
        peak_kib: status_kib(pid, "VmHWM:")?,
        note: format!(
            "{} checks of {} LUs in the window (healthy after {})",
            checks1 - checks0,
            devices.len(),
            crate::secs(warm_up)
        ),
    };
    kill(Pid::from_raw(i32::try_from(pid)?), Signal::SIGTERM)?;
    child.wait()?;
    Ok(cost)
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
