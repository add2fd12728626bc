//! Debian's udevd in the lab guest, for the tests that need what a booted host has: multipathd
//! (it takes only the paths udev has seen) and `udevadm monitor` (the change events a write-close
//! causes). The guest normally runs none. Its database goes to a tmpfs over `/run/udev`, what
//! multipath-tools' udev rules write to a tmpfs over `/etc/multipath` (unless a caller mounted
//! one there already), and the `/dev` links it makes are removed when [`Udevd`] is dropped: the
//! guest is left as found.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};

use crate::{CommandRun, WORK, run};

const UDEV_RUN: &str = "/run/udev";
/// multipath-tools' state (its udev rules run `multipath -u`, which records WWIDs there).
const MULTIPATH_STATE: &str = "/etc/multipath";
const UDEVD: &str = "/lib/systemd/systemd-udevd";

/// A running udevd that has processed an `add` event for every block device.
pub struct Udevd {
    child: Option<Child>,
    links_before: BTreeSet<PathBuf>,
    /// The tmpfs mounts it made, and the mount points among them it created.
    mounted: Vec<&'static str>,
    made_dirs: Vec<&'static str>,
    log: PathBuf,
}

impl Udevd {
    pub fn start() -> anyhow::Result<Udevd> {
        let mut udevd = Udevd {
            child: None,
            links_before: links_under(Path::new("/dev")),
            mounted: Vec::new(),
            made_dirs: Vec::new(),
            log: PathBuf::from(format!("{WORK}/udevd.log")),
        };
        for dir in [UDEV_RUN, MULTIPATH_STATE] {
            if crate::is_mount(dir) {
                continue;
            }
            if !Path::new(dir).exists() {
                std::fs::create_dir_all(dir)?;
                udevd.made_dirs.push(dir);
            }
            run("mount", ["-t", "tmpfs", "lab-udev", dir])?.ok()?;
            udevd.mounted.push(dir);
        }
        std::fs::create_dir_all(WORK)?;
        let log = std::fs::File::create(&udevd.log)?;
        udevd.child = Some(
            Command::new(UDEVD)
                .env("SYSTEMD_IGNORE_CHROOT", "1")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting systemd-udevd (tests/lab/host-tools.sh installs udev)")?,
        );
        let control = Path::new(UDEV_RUN).join("control");
        let start = Instant::now();
        while !control.exists() {
            ensure!(
                start.elapsed() < Duration::from_secs(20),
                "udevd made no control socket in 20 s: {}",
                udevd.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        udevadm(&["trigger", "--action=add", "--subsystem-match=block"])?.ok()?;
        udevadm(&["settle", "--timeout=60"])?.ok()?;
        Ok(udevd)
    }

    /// The end of udevd's log, for an error.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Udevd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = udevadm(&["control", "--exit"]);
            crate::reap_or_kill(&mut child, Duration::from_secs(10));
        }
        // its links (/dev/disk/by-id/…), stale once their devices go with the topology
        for link in links_under(Path::new("/dev")).difference(&self.links_before) {
            let _ = std::fs::remove_file(link);
        }
        for dir in self.mounted.drain(..) {
            let _ = run("umount", [dir]);
        }
        for dir in self.made_dirs.drain(..) {
            let _ = std::fs::remove_dir(dir);
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// udevadm as root of the guest: the guest runs chrooted into its overlay, and systemd's tools
/// ignore most requests in a chroot unless told it is meant.
pub fn udevadm(args: &[&str]) -> anyhow::Result<CommandRun> {
    crate::run_command(
        Command::new("udevadm")
            .args(args)
            .env("SYSTEMD_IGNORE_CHROOT", "1"),
    )
}

/// Waits (up to `limit`) for a running udevd's workers to finish with the devices added or
/// removed so far, and says how long that took; nothing to wait for when none runs (a systemd
/// guest runs one). Hundreds of new disks (each with an add event and a change event for its
/// first unit attention) keep its workers busy for minutes on the emulated guest, and PR
/// commands sent meanwhile can time out: the SCSI error handler then takes devices offline.
pub fn settle_if_running(limit: Duration) -> anyhow::Result<()> {
    // (the control socket's unit removes it when stopped: RemoveOnStop=yes)
    if Path::new("/run/udev/control").exists() {
        let started = Instant::now();
        udevadm(&["settle", &format!("--timeout={}", limit.as_secs())])?
            .ok()
            .with_context(|| {
                format!("udevadm settle (waited {})", crate::secs(started.elapsed()))
            })?;
        if started.elapsed() > Duration::from_secs(5) {
            println!("lab: udevd settled in {}", crate::secs(started.elapsed()));
        }
    }
    Ok(())
}

/// A systemd guest's udevd, stopped while this lives and started again when it is dropped:
/// for a benchmark over hundreds of disks, which udevd takes a quarter of an hour to probe on the
/// emulated guest (1.8 s a disk, 915 s for 512) and which nothing it measures reads through
/// udev. No-op where no udevd runs.
pub struct Paused {
    units: Vec<&'static str>,
}

/// systemd's units of udevd: the sockets too, or a uevent would start it again.
const UDEVD_UNITS: [&str; 3] = [
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
];

impl Paused {
    pub fn take() -> anyhow::Result<Paused> {
        if !Path::new("/run/systemd/system").exists()
            || run("systemctl", ["is-active", "--quiet", UDEVD_UNITS[0]])?.code() != 0
        {
            return Ok(Paused { units: Vec::new() });
        }
        let mut args = vec!["stop"];
        args.extend(UDEVD_UNITS);
        run("systemctl", args)?.ok()?;
        println!("lab: udevd stopped for this test (its disks are not probed)");
        Ok(Paused {
            units: UDEVD_UNITS.to_vec(),
        })
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if self.units.is_empty() {
            return;
        }
        let mut args = vec!["start"];
        args.extend(self.units.iter().rev().copied());
        if let Err(e) = run("systemctl", args).and_then(|r| r.ok()) {
            eprintln!("lab: udevd not started again: {e:#}");
        }
    }
}

/// Every symlink under `dir`, recursively.
fn links_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut all = BTreeSet::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_symlink() {
            all.insert(entry.path());
        } else if kind.is_dir() && entry.path() != Path::new("/dev/shm") {
            all.extend(links_under(&entry.path()));
        }
    }
    all
}
