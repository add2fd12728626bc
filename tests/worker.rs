//! The worker process (src/worker.rs) as the caller sees it, on the built binary: a command that
//! touches devices runs in a worker; killing or stopping the process the caller started ends the
//! worker too. The pass-through of stdout, stderr and the exit status is what every test in
//! prfence_cli.rs and fence_pr_cli.rs checks. A worker held in the kernel after its verdict needs
//! a hung device: the lab's `faults::hung_path_every_entry_point_ends_within_its_budget`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{PermissionsExt, symlink};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// fence_pr `status` with no devices, so it asks `vgs` for them, and a `vgs` that sleeps: a
/// worker busy for `SLOW` seconds, on any host. The fake records its pid to be cleaned up.
struct SlowStatus {
    dir: tempfile::TempDir,
    child: Child,
}

const SLOW: u64 = 30;

impl SlowStatus {
    fn start() -> SlowStatus {
        let dir = tempfile::tempdir().unwrap();
        symlink(env!("CARGO_BIN_EXE_prfence"), dir.path().join("fence_pr")).unwrap();
        let vgs = dir.path().join("vgs");
        std::fs::write(
            &vgs,
            format!(
                "#!/bin/sh\necho $$ > {}\nexec sleep {SLOW}\n",
                dir.path().join("vgs.pid").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&vgs, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("store.key"), "b\n").unwrap();
        let child = Command::new(dir.path().join("fence_pr"))
            .args([
                "--action=status",
                "--key=b",
                &format!("--power-timeout={SLOW}"),
                &format!("--vgs-path={}", vgs.display()),
            ])
            .env("FENCE_PR_STORE", dir.path().join("store"))
            .env_remove("PCMK_service")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        SlowStatus { dir, child }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// The worker: the child of the started process marked as one, once it is there.
    fn worker(&self) -> Pid {
        let vgs_pid = self.dir.path().join("vgs.pid");
        let start = Instant::now();
        loop {
            // The slow vgs running means the work is under way.
            if vgs_pid.exists()
                && let Some(worker) = children(self.pid()).into_iter().find(|&p| is_worker(p))
            {
                return worker;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no worker process under fence_pr (pid {}): children {:?}",
                self.pid(),
                children(self.pid())
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for SlowStatus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pid) = std::fs::read_to_string(self.dir.path().join("vgs.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    Some(after.split_whitespace().map(str::to_owned).collect())
}

fn children(parent: Pid) -> Vec<Pid> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            stat_fields(pid).is_some_and(|f| f.get(1) == Some(&parent.as_raw().to_string()))
        })
        .map(Pid::from_raw)
        .collect()
}

fn is_worker(pid: Pid) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
        env.split(|&b| b == 0)
            .any(|var| var.starts_with(b"PRFENCE_WORKER="))
    })
}

/// Alive: there and not a zombie.
fn alive(pid: Pid) -> bool {
    stat_fields(pid.as_raw()).is_some_and(|f| f.first().map(String::as_str) != Some("Z"))
}

fn gone_within(pid: Pid, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Pacemaker's timeout kills the process it started: the worker must not go on fencing.
#[test]
fn killing_the_supervisor_kills_the_worker() {
    let mut status = SlowStatus::start();
    let worker = status.worker();
    kill(status.pid(), Signal::SIGKILL).unwrap();
    let ended = status.child.wait().unwrap();
    assert_eq!(ended.signal(), Some(Signal::SIGKILL as i32));
    assert!(
        gone_within(worker, Duration::from_secs(5)),
        "the worker {worker} outlived its killed supervisor"
    );
}

/// SIGTERM (and Ctrl-C's SIGINT) reach the worker; the supervisor dies of it as one process did.
#[test]
fn sigterm_is_passed_on_and_the_supervisor_dies_of_it() {
    let mut status = SlowStatus::start();
    let worker = status.worker();
    let sent = Instant::now();
    kill(status.pid(), Signal::SIGTERM).unwrap();
    let ended = status.child.wait().unwrap();
    assert_eq!(ended.signal(), Some(Signal::SIGTERM as i32), "{ended:?}");
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    assert!(
        gone_within(worker, Duration::from_secs(5)),
        "the worker {worker} outlived the SIGTERM"
    );
}

/// A process that inherits the marker variable without its pipe (anything a worker starts that
/// runs prfence) is no worker: it runs the command itself, in a worker of its own.
#[test]
fn the_marker_alone_makes_no_worker() {
    let plain = |marker: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_prfence"));
        command.args(["--json", "keys", "/nonexistent/prfence-worker-test"]);
        if let Some(marker) = marker {
            command.env("PRFENCE_WORKER", marker);
        }
        command.output().unwrap()
    };
    let without = plain(None);
    let with = plain(Some(&format!("{}:0:1", std::process::id())));
    assert_eq!(without.status.code(), Some(1));
    assert_eq!(with.status.code(), without.status.code());
    assert_eq!(with.stdout, without.stdout);
    assert_eq!(with.stderr, without.stderr);
    assert!(String::from_utf8_lossy(&with.stdout).contains("open failed"));
}
