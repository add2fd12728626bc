//! What a test leaves behind in the guest. Suites share a guest, so a test must leave it as it
//! found it: the runner takes a [`Snapshot`] before each test and compares it with the guest after
//! the test and its teardown. Anything new that is still there (a process, a mount, a file under
//! /run, a block device, an iSCSI session, a target object, a cgroup, an nftables table) fails the
//! test; leftover processes are killed so that they cannot disturb the next one.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long processes a test stopped may take to be gone (reaped, their namespaces torn down).
const SETTLE: Duration = Duration::from_secs(10);

/// The places a test can leave state in, each as a set of lines.
#[derive(PartialEq, Eq)]
pub struct Snapshot {
    processes: BTreeSet<Process>,
    things: BTreeSet<String>,
}

/// A user-space process: its pid and command line.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Process {
    pid: i32,
    cmdline: String,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        Snapshot {
            processes: processes(),
            things: things(),
        }
    }

    /// What is in the guest now and was not in `self`: Ok when nothing, else the list (and
    /// the leftover processes are killed).
    pub fn compare(&self) -> Result<(), String> {
        let start = Instant::now();
        let (new_processes, new_things) = loop {
            let now = processes();
            // A service restarted (udevd, after a test that paused it) is no new process: the old
            // one is gone and one with its command line took its place.
            let gone: Vec<&str> = self
                .processes
                .difference(&now)
                .map(|p| p.cmdline.as_str())
                .collect();
            let new_processes: Vec<Process> = now
                .difference(&self.processes)
                .filter(|p| !gone.contains(&p.cmdline.as_str()))
                .cloned()
                .collect();
            let new_things: Vec<String> = things().difference(&self.things).cloned().collect();
            if (new_processes.is_empty() && new_things.is_empty()) || start.elapsed() > SETTLE {
                break (new_processes, new_things);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if new_processes.is_empty() && new_things.is_empty() {
            return Ok(());
        }
        let mut left: Vec<String> = new_processes
            .iter()
            .map(|p| {
                let stat =
                    std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).unwrap_or_default();
                let state_ppid: Vec<&str> = stat
                    .rsplit_once(')')
                    .map_or("", |(_, a)| a)
                    .split_whitespace()
                    .take(2)
                    .collect();
                format!(
                    "process {} ({}), state {} parent {}, now killed",
                    p.pid,
                    p.cmdline,
                    state_ppid.first().unwrap_or(&"?"),
                    state_ppid.get(1).unwrap_or(&"?")
                )
            })
            .collect();
        left.extend(new_things);
        for p in &new_processes {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        Err(format!(
            "the test left this behind in the guest (the next test would find it):\n  {}",
            left.join("\n  ")
        ))
    }
}

/// Every live user-space process but this one (kernel threads are children of kthreadd, pid 2;
/// zombies hold nothing).
fn processes() -> BTreeSet<Process> {
    let me = std::process::id().to_string();
    let mut all = BTreeSet::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(pid) = name.parse::<i32>() else {
            continue;
        };
        if name == me || pid == 1 {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": comm may hold spaces and parentheses, so read after the last ')'
        let mut after = stat
            .rsplit_once(')')
            .map_or("", |(_, a)| a)
            .split_whitespace();
        let (state, ppid) = (after.next().unwrap_or(""), after.next().unwrap_or(""));
        if state == "Z" || ppid == "2" || ppid == "0" {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline: Vec<String> = cmdline
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        all.insert(Process {
            pid,
            cmdline: cmdline.join(" "),
        });
    }
    all
}

/// Mounts, files under /run and the target's state directories, block devices, iSCSI sessions,
/// LIO's and nvmet's configfs objects, cgroups and nftables tables, one line each. What a tool
/// or a module makes once, on first use, and keeps (a directory, iscsiadm's lock file, a fabric's
/// own configfs attributes) is not a test's state.
fn things() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in mounts.lines() {
        // "id parent major:minor root mount-point options … - fstype source super-options"
        let point = line.split_whitespace().nth(4).unwrap_or("");
        let fstype = line
            .split_once(" - ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("");
        all.insert(format!("mount {point} ({fstype})"));
    }
    for dir in [
        "/run",
        "/etc/iscsi",
        "/var/lib/iscsi",
        "/var/target/pr",
        "/usr/lib/ocf/resource.d",
    ] {
        files(Path::new(dir), 4, &mut all);
    }
    written(Path::new(UPPER), Path::new("/"), &mut all);
    for (dir, what) in [
        ("/sys/block", "block device"),
        ("/sys/class/iscsi_session", "iSCSI session"),
        ("/sys/kernel/config/nvmet/subsystems", "nvmet subsystem"),
        ("/sys/kernel/config/nvmet/ports", "nvmet port"),
        ("/sys/kernel/config/nvmet/hosts", "nvmet host"),
    ] {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            all.insert(format!("{what} {}", entry.path().display()));
        }
    }
    // LIO's objects as teardown knows them: targets (iqn., naa. names) and backstores (HBAs)
    for (dir, what) in [
        ("/sys/kernel/config/target/iscsi", "LIO iSCSI target"),
        ("/sys/kernel/config/target/loopback", "LIO loopback target"),
        ("/sys/kernel/config/target/core", "LIO backstore"),
        ("/sys/fs/cgroup", "cgroup"),
    ] {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let object = match what {
                "LIO backstore" => name != "alua",
                "cgroup" => true,
                _ => name.contains('.'),
            };
            if object && entry.file_type().is_ok_and(|t| t.is_dir()) {
                all.insert(format!("{what} {}", entry.path().display()));
            }
        }
    }
    if Path::new("/sys/module/nf_tables").exists()
        && let Ok(out) = std::process::Command::new("nft")
            .args(["list", "tables"])
            .output()
    {
        for table in String::from_utf8_lossy(&out.stdout).lines() {
            all.insert(format!("nftables {table}"));
        }
    }
    all
}

/// What a booted guest's systemd, journald and udevd keep under /run for themselves (a unit's
/// invocation link, the volatile journal, udev's device database): theirs, not a test's state.
const SERVICE_MANAGER_RUN: [&str; 3] = ["/run/systemd", "/run/log", "/run/udev"];

/// Every file (not directory) under `dir`, `depth` levels deep (symlinks not followed; the lock
/// files tools keep, `*.lock` and /run/lock, left out, and [`SERVICE_MANAGER_RUN`]).
fn files(dir: &Path, depth: usize, all: &mut BTreeSet<String>) {
    if dir == Path::new("/run/lock")
        || dir == Path::new(UPPER)
        || SERVICE_MANAGER_RUN.iter().any(|d| dir == Path::new(d))
    {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if depth > 1 {
                files(&path, depth - 1, all);
            }
        } else if !is_lock_file(&path) {
            all.insert(format!("file {}", path.display()));
        }
    }
}

/// A lock file, which holds no state: `*.lock`, and apt's and dpkg's `lock` and `lock-frontend`.
fn is_lock_file(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "lock")
        || path
            .file_name()
            .is_some_and(|n| n == "lock" || n == "lock-frontend")
}

/// The guest's writes to its root (the host's, read-only): the overlay's upper layer, which the
/// guest's init shows here.
const UPPER: &str = "/run/lab-upper";

/// Every file the guest wrote to its root, as the path it has there and when it was last written
/// (a file written again is new).
fn written(upper: &Path, shown: &Path, all: &mut BTreeSet<String>) {
    let mut files = Vec::new();
    collect_times(upper, shown, &mut files);
    for (path, _, mtime) in files {
        // apt's and dpkg's lock files, copied up when apt opens them: no state in them
        if !is_lock_file(&path) {
            all.insert(format!(
                "file {} (written at {}.{:09})",
                path.display(),
                mtime.tv_sec(),
                mtime.tv_nsec()
            ));
        }
    }
}

/// The times of every file the guest has written to its root so far (the overlay's upper layer).
/// A test that reinstalls the lab's package (the same files again) puts them back afterwards, so
/// that the next test finds the guest's root as it was: same files, same times.
pub struct WrittenTimes(
    Vec<(
        std::path::PathBuf,
        nix::sys::time::TimeSpec,
        nix::sys::time::TimeSpec,
    )>,
);

impl WrittenTimes {
    pub fn take() -> WrittenTimes {
        let mut all = Vec::new();
        collect_times(Path::new(UPPER), Path::new("/"), &mut all);
        WrittenTimes(all)
    }

    /// Sets each file's access and modification times back (the file itself, not a link's target).
    pub fn restore(&self) {
        use nix::sys::stat::{UtimensatFlags, utimensat};
        for (path, atime, mtime) in &self.0 {
            let _ = utimensat(None, path, atime, mtime, UtimensatFlags::NoFollowSymlink);
        }
    }
}

/// Installs the package at its path again when dropped, then gives the files dpkg and apt wrote
/// their times back (the same package, the same files: the next test finds the guest as it was).
pub struct ReinstallOnDrop(std::path::PathBuf, WrittenTimes);

impl ReinstallOnDrop {
    /// Takes the times now: create it before the test changes the installation.
    pub fn new(deb: &Path) -> ReinstallOnDrop {
        ReinstallOnDrop(deb.to_path_buf(), WrittenTimes::take())
    }
}

impl Drop for ReinstallOnDrop {
    fn drop(&mut self) {
        let _ = crate::run("dpkg", ["-i", &self.0.display().to_string()]);
        self.1.restore();
    }
}

fn collect_times(
    upper: &Path,
    shown: &Path,
    all: &mut Vec<(
        std::path::PathBuf,
        nix::sys::time::TimeSpec,
        nix::sys::time::TimeSpec,
    )>,
) {
    use std::os::unix::fs::MetadataExt;
    for entry in std::fs::read_dir(upper).into_iter().flatten().flatten() {
        let path = shown.join(entry.file_name());
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if meta.is_dir() {
            collect_times(&entry.path(), &path, all);
        } else {
            all.push((
                path,
                nix::sys::time::TimeSpec::new(meta.atime(), meta.atime_nsec()),
                nix::sys::time::TimeSpec::new(meta.mtime(), meta.mtime_nsec()),
            ));
        }
    }
}
