//! The floor the benchmarks compare prfence with: bare PERSISTENT RESERVE IN / READ KEYS through
//! SG_IO (the `sg-io` crate, none of prfence's engine), in a process of its own so that its start,
//! CPU and memory are counted like prfence's. This lab binary becomes it when [`FLOOR_ENV`] is set.
//!
//! - `once`: every device at the same time, a thread each, one READ KEYS, then exit (what reading
//!   all LUs can cost at the least: the fence and status figures are compared with it);
//! - `loop SECS`: one thread, READ KEYS on every device in turn, once a second for SECS seconds
//!   (what a watch check can cost at the least); prints the LU-checks done, its CPU time in clock
//!   ticks (user + system) and its peak RSS in KiB.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use sg_io::{DataTransfer, Device, OpenMode};

/// Set to `once` or `loop SECS`; the arguments are the devices.
const FLOOR_ENV: &str = "LAB_FLOOR";
const TIMEOUT: Duration = Duration::from_secs(30);

/// The floor process, when this process is one: runs it and returns its exit status.
pub fn floor_main() -> Option<ExitCode> {
    let mode = std::env::var(FLOOR_ENV).ok()?;
    let devices: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let done = match mode.split_once(' ') {
        None if mode == "once" => once(&devices),
        Some(("loop", secs)) => secs
            .parse()
            .context("loop SECS")
            .and_then(|secs| checks(&devices, Duration::from_secs(secs))),
        _ => Err(anyhow::anyhow!(
            "{FLOOR_ENV}={mode:?}: want `once` or `loop SECS`"
        )),
    };
    Some(match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: {e:#}");
            ExitCode::FAILURE
        }
    })
}

/// The floor command for `devices`: `mode` as [`FLOOR_ENV`] takes it.
pub fn command(mode: &str, devices: &[PathBuf]) -> anyhow::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command.env(FLOOR_ENV, mode).args(devices);
    Ok(command)
}

fn read_keys(device: &Device) -> anyhow::Result<()> {
    let mut data = [0u8; 1024];
    let len = u16::try_from(data.len())?.to_be_bytes();
    // PERSISTENT RESERVE IN, service action READ KEYS, allocation length in bytes 7-8
    let cdb = [0x5e, 0x00, 0, 0, 0, 0, 0, len[0], len[1], 0];
    let done = device.execute(&cdb, DataTransfer::FromDevice(&mut data), TIMEOUT)?;
    ensure!(
        done.is_good(),
        "{}: READ KEYS: {done:?}",
        device.path().display()
    );
    Ok(())
}

fn open(path: &Path) -> anyhow::Result<Device> {
    Device::open(path, OpenMode::ReadOnly).with_context(|| format!("{}", path.display()))
}

fn once(devices: &[PathBuf]) -> anyhow::Result<()> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = devices
            .iter()
            .map(|path| scope.spawn(move || read_keys(&open(path)?)))
            .collect();
        workers.into_iter().try_for_each(|worker| {
            worker
                .join()
                .map_err(|_| anyhow::anyhow!("a reader panicked"))?
        })
    })
}

fn checks(devices: &[PathBuf], window: Duration) -> anyhow::Result<()> {
    let opened: Vec<Device> = devices.iter().map(|p| open(p)).collect::<Result<_, _>>()?;
    let start = Instant::now();
    let mut done = 0u64;
    let mut round = 0u32;
    while start.elapsed() < window {
        for device in &opened {
            read_keys(device)?;
            done += 1;
        }
        round += 1;
        let next = Duration::from_secs(round.into());
        std::thread::sleep(next.saturating_sub(start.elapsed()));
    }
    let me = std::process::id();
    println!("{done} {} {}", cpu_ticks(me)?, status_kib(me, "VmHWM:")?);
    Ok(())
}

/// The kernel's clock ticks per second (the unit of [`cpu_ticks`]).
pub fn clock_ticks() -> anyhow::Result<u64> {
    let run = crate::run("getconf", ["CLK_TCK"])?.ok()?;
    Ok(run.stdout.trim().parse()?)
}

/// utime + stime of a process, in clock ticks (/proc/PID/stat fields 14 and 15).
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // the command name may hold spaces: count fields after its closing parenthesis
    let after = stat.rsplit_once(')').context("malformed stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // after ')' the fields start at 3 (state): utime is field 14, stime 15
    let utime: u64 = fields[14 - 3].parse()?;
    let stime: u64 = fields[15 - 3].parse()?;
    Ok(utime + stime)
}

/// A `/proc/PID/status` field in KiB (`VmRSS:`, `VmHWM:`).
pub fn status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
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
