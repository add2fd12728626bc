//! Running a helper program (corosync-cmapctl, vgs, a self-fence hook) with a time bound: the
//! one place that spawns, drains and kills.
//!
//! The helper runs in its own process group, so that a kill reaches whatever it started too.
//! Its pipes are drained on threads that report over a channel; the caller never waits for them
//! past the deadline, and a thread still blocked then is left behind (it ends once the group is
//! killed and the pipe closes).

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;

/// At most this much stdout is kept; a helper printing more is [`RunError::OutputTooLarge`]
/// (every caller parses the output, and a cut list is a wrong list). The rest is read and dropped
/// so the helper never blocks on a full pipe.
pub const STDOUT_CAP: usize = 1 << 20;
/// At most this much stderr is kept for [`RunError::Failed`], which then says it was truncated.
pub const STDERR_CAP: usize = 64 << 10;
/// Once the helper itself has exited, how long its pipes may stay open (held by something it
/// left running in the background) before its process group is killed. With a timeout, the pipes
/// never get longer than the timeout either.
pub const GRACE_AFTER_EXIT: Duration = Duration::from_secs(2);
/// After a kill, how long to wait for the drain threads to see end-of-file (so output already in
/// the pipe is kept) and for the helper to be reaped. A process in uninterruptible sleep (vgs
/// on a dead device) may outlive this; it is then left behind rather than waited for.
const AFTER_KILL: Duration = Duration::from_millis(100);
/// How often the helper is checked for having exited.
const POLL: Duration = Duration::from_millis(5);

/// Why a bounded run did not produce output.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start it: {0}")]
    Spawn(std::io::Error),
    #[error("cannot wait for it: {0}")]
    Wait(std::io::Error),
    #[error("timed out after {0:?} and was killed, with everything it started")]
    TimedOut(Duration),
    #[error("{status} ({stderr})")]
    Failed { status: ExitStatus, stderr: String },
    #[error("its output is larger than {limit} bytes (truncated; the rest was discarded)")]
    OutputTooLarge { limit: usize },
}

/// What a drain thread has read so far.
#[derive(Default)]
struct Drained {
    bytes: Vec<u8>,
    truncated: bool,
}

type Shared = Arc<Mutex<Drained>>;

/// Reads `pipe` to its end into `into`, keeping at most `cap` bytes, then sends on `done`.
fn drain(pipe: Option<impl Read + Send + 'static>, cap: usize, into: Shared, done: Sender<()>) {
    std::thread::spawn(move || {
        if let Some(mut pipe) = pipe {
            let mut chunk = [0u8; 8192];
            loop {
                match pipe.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        let mut d = into.lock().unwrap_or_else(PoisonError::into_inner);
                        let room = cap.saturating_sub(d.bytes.len());
                        let keep = n.min(room);
                        d.bytes
                            .extend_from_slice(chunk.get(..keep).unwrap_or_default());
                        d.truncated |= keep < n;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // A read error only shortens the output, which the caller then fails to parse.
                    Err(_) => break,
                }
            }
        }
        // The receiver may be gone (the run returned without this pipe): nothing to tell.
        let _ = done.send(());
    });
}

fn take(shared: &Shared) -> Drained {
    std::mem::take(&mut *shared.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Waits until `open` drain threads have reported or `until` has passed; returns how many are
/// still open.
fn await_drains(done: &Receiver<()>, mut open: usize, until: Instant) -> usize {
    while open > 0 {
        match done.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(()) => open -= 1,
            Err(RecvTimeoutError::Timeout) => break,
            Err(RecvTimeoutError::Disconnected) => return 0,
        }
    }
    open
}

/// Whether the helper has exited, without reaping it: while it is an unreaped zombie its pid
/// (= its process group id) cannot be reused, so a later `killpg` cannot hit a stranger.
fn has_exited(pid: Pid) -> Result<bool, Errno> {
    loop {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::StillAlive) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// SIGKILLs the helper's process group and gives the helper [`AFTER_KILL`] to be reaped; a
/// helper that is not dead by then (stuck in the kernel, as vgs on a dead device is) is handed to
/// [`reap_later`], so that it does not stay a zombie once it dies.
fn kill_group(mut child: Child, pid: Pid) -> Option<ExitStatus> {
    // ESRCH: everyone in the group has already exited, which is what we want.
    let _ = killpg(pid, Signal::SIGKILL);
    let until = Instant::now() + AFTER_KILL;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(POLL),
            Ok(None) | Err(_) => {
                reap_later(child);
                return None;
            }
        }
    }
}

/// Waits for `child` on a thread of its own, which ends when the child does: a long-running
/// agent that timed out one helper a minute would otherwise collect a zombie each time.
fn reap_later(mut child: Child) {
    // Without a thread the zombie stays until the agent exits; nothing better to do.
    let _ = std::thread::Builder::new()
        .name("reaper".to_owned())
        .spawn(move || {
            let _ = child.wait();
        });
}

/// Runs `program args…` with stdin closed, in its own process group, and returns its stdout.
///
/// - With a timeout, a helper still running after it is killed with its whole process group and
///   reported as [`RunError::TimedOut`].
/// - A helper that exits but leaves something running that holds its stdout or stderr open is
///   waited for [`GRACE_AFTER_EXIT`] at most (and never past the timeout); then its process group
///   is killed, a warning is logged, and the run returns the helper's own result with the output
///   read so far (all of what the helper wrote itself).
/// - A non-zero exit is [`RunError::Failed`] with the trimmed stderr (at most [`STDERR_CAP`]);
///   stdout beyond [`STDOUT_CAP`] is [`RunError::OutputTooLarge`].
///
/// Anything the helper leaves running with its pipes closed (a daemon it starts) is left alone.
pub fn run_bounded<I, S>(
    program: &Path,
    args: I,
    timeout: Option<Duration>,
) -> Result<Vec<u8>, RunError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(RunError::Spawn)?;
    let started = Instant::now();
    let Ok(raw_pid) = i32::try_from(child.id()) else {
        // Cannot happen on Linux (pid_max ≤ 2^22); without a pid there is nothing to kill.
        let _ = child.kill();
        return Err(RunError::Wait(std::io::Error::other("pid out of range")));
    };
    let pid = Pid::from_raw(raw_pid);
    let (done_tx, done) = mpsc::channel();
    let stdout = Shared::default();
    let stderr = Shared::default();
    drain(
        child.stdout.take(),
        STDOUT_CAP,
        stdout.clone(),
        done_tx.clone(),
    );
    drain(child.stderr.take(), STDERR_CAP, stderr.clone(), done_tx);

    let mut open = 2;
    let mut deadline = timeout.map(|t| started + t);
    let mut exited = false;
    let held_open = loop {
        if !exited {
            match has_exited(pid) {
                Ok(false) => {}
                Ok(true) => {
                    exited = true;
                    let grace = Instant::now() + GRACE_AFTER_EXIT;
                    deadline = Some(deadline.map_or(grace, |d| d.min(grace)));
                }
                Err(e) => {
                    kill_group(child, pid);
                    return Err(RunError::Wait(e.into()));
                }
            }
        }
        if exited && open == 0 {
            break false;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            if !exited {
                kill_group(child, pid);
                return Err(RunError::TimedOut(started.elapsed()));
            }
            break true;
        }
        // Until the helper exits, wake up every POLL to check on it; after, only the pipes count.
        let until = match deadline {
            Some(d) if exited => d,
            Some(d) => d.min(now + POLL),
            None => now + POLL,
        };
        if open == 0 {
            std::thread::sleep(until.saturating_duration_since(now));
        } else {
            open = await_drains(&done, open, until);
        }
    };
    let status = if held_open {
        let status = kill_group(child, pid);
        // The kill closed the pipes: let the drains take in what was already written.
        await_drains(&done, open, Instant::now() + AFTER_KILL);
        tracing::warn!(
            program = %program.display(),
            "it exited but left a process holding its output open; killed its process group"
        );
        // The helper itself had exited: only a failing waitid leaves it unreaped here.
        status.ok_or_else(|| {
            RunError::Wait(std::io::Error::other(
                "it exited but could not be reaped (reaped in the background)",
            ))
        })?
    } else {
        child.wait().map_err(RunError::Wait)?
    };
    let stdout = take(&stdout);
    let stderr = take(&stderr);
    if !status.success() {
        let mut text = String::from_utf8_lossy(&stderr.bytes).trim().to_owned();
        if stderr.truncated {
            text.push_str(&format!(" … (stderr truncated at {STDERR_CAP} bytes)"));
        }
        return Err(RunError::Failed {
            status,
            stderr: text,
        });
    }
    if stdout.truncated {
        return Err(RunError::OutputTooLarge { limit: STDOUT_CAP });
    }
    Ok(stdout.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SH: &str = "/bin/sh";

    /// Whether `pid` is still a live process (a zombie waiting for init counts as gone). Polls
    /// for up to 2 s, since a SIGKILLed process takes a moment to die.
    fn alive(pid: i32) -> bool {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let gone = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => true,
                Ok(stat) => stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z')),
            };
            if gone {
                return false;
            }
            if Instant::now() >= until {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn output_failure_and_timeout() {
        let sh = Path::new(SH);
        assert_eq!(run_bounded(sh, ["-c", "echo hi"], None).unwrap(), b"hi\n");
        let e = run_bounded(sh, ["-c", "echo bad >&2; exit 3"], None).unwrap_err();
        assert!(
            matches!(&e, RunError::Failed { stderr, .. } if stderr == "bad"),
            "{e}"
        );
        let e = run_bounded(sh, ["-c", "sleep 5"], Some(Duration::from_millis(100))).unwrap_err();
        assert!(matches!(e, RunError::TimedOut(_)));
        assert!(matches!(
            run_bounded(Path::new("/nonexistent"), [""; 0], None),
            Err(RunError::Spawn(_))
        ));
    }

    #[test]
    fn normal_helper_is_unchanged_with_and_without_timeout() {
        let sh = Path::new(SH);
        let script = "printf 'a\\nb\\n'; echo warn >&2";
        for timeout in [None, Some(Duration::from_secs(5))] {
            assert_eq!(run_bounded(sh, ["-c", script], timeout).unwrap(), b"a\nb\n");
        }
        // A daemon that closed its pipes is not the helper's output holder: left alone, no wait.
        let t = Instant::now();
        let out = run_bounded(sh, ["-c", "sleep 30 >/dev/null 2>&1 & echo $!"], None).unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let pid: i32 = String::from_utf8(out).unwrap().trim().parse().unwrap();
        assert!(alive(pid));
        nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    }

    #[test]
    fn failing_helper_reports_stderr() {
        let e = run_bounded(
            Path::new(SH),
            ["-c", "echo out; echo 'no such key' >&2; exit 1"],
            Some(Duration::from_secs(5)),
        )
        .unwrap_err();
        match e {
            RunError::Failed { status, stderr } => {
                assert_eq!(status.code(), Some(1));
                assert_eq!(stderr, "no such key");
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn background_process_holding_stdout_is_killed_at_the_timeout() {
        let t = Instant::now();
        let out = run_bounded(
            Path::new(SH),
            ["-c", "sleep 30 & echo $!; echo done"],
            Some(Duration::from_secs(1)),
        )
        .unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let out = String::from_utf8(out).unwrap();
        let mut lines = out.lines();
        let pid: i32 = lines.next().unwrap().parse().unwrap();
        assert_eq!(lines.next(), Some("done"));
        assert!(!alive(pid), "background sleep {pid} survived");
    }

    #[test]
    fn background_process_holding_stderr_is_killed_after_the_grace_without_timeout() {
        let t = Instant::now();
        let out = run_bounded(Path::new(SH), ["-c", "sleep 30 >&2 & echo $!"], None).unwrap();
        let took = t.elapsed();
        assert!(
            took >= GRACE_AFTER_EXIT && took < GRACE_AFTER_EXIT + Duration::from_secs(4),
            "{took:?}"
        );
        let out = String::from_utf8(out).unwrap();
        let pid: i32 = out.lines().last().unwrap().parse().unwrap();
        assert!(!alive(pid), "background sleep {pid} survived");
    }

    #[test]
    fn timed_out_helper_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; sleep 30", pidfile.display());
        let t = Instant::now();
        let e = run_bounded(
            Path::new(SH),
            ["-c", script.as_str()],
            Some(Duration::from_secs(1)),
        )
        .unwrap_err();
        assert!(matches!(e, RunError::TimedOut(_)), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!alive(pid), "child sleep {pid} survived");
    }

    #[test]
    fn output_beyond_the_cap_is_truncated_without_hanging() {
        // "Without hanging": a hang would end in TimedOut at the bound, not in the errors below
        // (a timed assertion instead failed on a loaded CI host: 10.7 s for the two runs).
        let sh = Path::new(SH);
        let script = "head -c 3000000 /dev/zero";
        let e = run_bounded(sh, ["-c", script], Some(Duration::from_secs(60))).unwrap_err();
        assert!(
            matches!(e, RunError::OutputTooLarge { limit: STDOUT_CAP }),
            "{e}"
        );
        assert!(e.to_string().contains("truncated"), "{e}");
        let script = "head -c 1000000 /dev/zero | tr '\\0' x >&2; exit 2";
        let e = run_bounded(sh, ["-c", script], Some(Duration::from_secs(60))).unwrap_err();
        match e {
            RunError::Failed { stderr, .. } => {
                assert!(stderr.len() < STDERR_CAP + 100, "{}", stderr.len());
                assert!(stderr.starts_with("xxx"));
                assert!(stderr.ends_with(&format!("(stderr truncated at {STDERR_CAP} bytes)")));
            }
            other => panic!("{other}"),
        }
    }

    /// A child not reaped when its run gave up on it (stuck in the kernel, here merely slow to
    /// die) is reaped once it dies: no zombie is left behind.
    #[test]
    fn a_child_given_up_on_is_reaped_when_it_dies() {
        let child = Command::new(SH).args(["-c", "sleep 0.3"]).spawn().unwrap();
        let pid = child.id();
        reap_later(child);
        let until = Instant::now() + Duration::from_secs(5);
        // /proc/PID stays while the process is a zombie; it goes once reaped.
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(Instant::now() < until, "{pid} is still a zombie or alive");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
