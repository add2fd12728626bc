//! The process edge of the one-shot front ends: a command that touches devices runs in a worker
//! process, and the process its caller waits for (the supervisor) exits with the worker's exit
//! status as soon as the worker has given its verdict.
//!
//! Why: a thread blocked in SG_IO (or an NVMe ioctl) on a hung path sleeps uninterruptibly until
//! the kernel gives the command up (open-iscsi's `replacement_timeout`, 120 s by default). The
//! engine's fan-out stops waiting for it at the deadline and the command prints its verdict then,
//! but on exit the thread group cannot be reaped, and the process's fd table (the stdout and
//! stderr pipes Pacemaker or a shell reads to EOF) stays open, until that thread leaves the
//! kernel. Pacemaker waits for the process, not the text: fence_pr `off` answered at its deadline
//! and still counted as two minutes late.
//!
//! How, with no `fork` and no `unsafe`:
//! - The supervisor makes a status pipe and re-executes its own binary (`/proc/self/exe`, so an
//!   upgrade in between cannot swap the program; `argv[0]` kept, as fence_pr is dispatched on its
//!   file name) with [`ENV`] = `supervisor pid:fd:pipe inode:start`. The worker inherits stdout and
//!   stderr as they are (a terminal stays a terminal), and stdin, or for fence_pr a pipe carrying
//!   the options the supervisor already read ([`Stdin::Bytes`]).
//! - Who holds which fd: the status pipe's write end is inherited by the worker alone (made
//!   close-on-exec, cleared on the one copy given to the worker, which the supervisor closes
//!   once it is spawned); the worker reopens it close-on-exec and closes the inherited number
//!   first thing, so nothing the worker starts holds it. The read end is the supervisor's alone.
//! - The worker, when its work is done, flushes its output, points fds 0, 1 and 2 at /dev/null
//!   (the fd table is the process's, so the caller's pipes are released for a thread stuck in the
//!   kernel too), writes its exit status (one byte) to the status pipe and exits.
//! - The supervisor exits with that byte. If the pipe ends without it (the worker crashed or was
//!   killed), or the worker's main thread is a zombie without having given it (it died with a
//!   thread held in the kernel, so neither EOF nor `waitpid` comes), it exits with the worker's
//!   status when it can be reaped, else 1 (a failure, fence_pr's and the CLI's).
//! - No time cap: every way the worker can end is seen within [`LOOK_EVERY`], and a worker still
//!   working is the command itself, bounded as before by its own deadline and by whoever waits
//!   for it (Pacemaker's timeout kills the supervisor, Ctrl-C is forwarded).
//! - Killing the supervisor kills the worker (its parent-death signal is SIGKILL, checked against
//!   a supervisor that died before it was set); SIGTERM and SIGINT are forwarded to the worker,
//!   and once the worker is gone the supervisor dies of the same signal, as the command did.
//!
//! - The command's deadlines count from when its caller started it ([`started`]): the supervisor
//!   passes its own start on the monotonic clock, so the worker's start-up (a second exec, slow
//!   on a starved machine) is inside `--deadline` and fence_pr's budget, not added to them.
//!
//! What the caller sees: the same stdout, stderr and exit status as from one process, the exit
//! at the verdict; one more process in its process group, which lingers (holding no fd of the
//! caller's) until the kernel lets its stuck thread go. Nothing extra is logged.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill, raise};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

/// Marks the worker: `supervisor pid:status fd:status pipe inode:supervisor's start` (nanoseconds
/// on CLOCK_MONOTONIC). A process that inherits the variable without the pipe (anything the
/// worker starts) is not a worker.
pub const ENV: &str = "PRFENCE_WORKER";

/// How often the supervisor looks whether a worker that has not answered died.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// The exit status when the worker ended without a verdict and without an exit status to pass on.
const NO_VERDICT: u8 = 1;

/// When the command was started: see [`started`].
static STARTED: OnceLock<Instant> = OnceLock::new();

/// When the command was started by its caller: in a worker, its supervisor's start; else this
/// process's (its [`Role::detect`], or the first call). The one-shot front ends count their
/// deadlines from it, so `--deadline` bounds what the caller waits for.
pub fn started() -> Instant {
    *STARTED.get_or_init(Instant::now)
}

/// What is left of `budget`, counted from [`started`].
pub fn left_of(budget: Duration) -> Duration {
    budget.saturating_sub(started().elapsed())
}

/// CLOCK_MONOTONIC in nanoseconds, the clock `Instant` reads on Linux, so an instant can cross
/// into the worker as a number.
fn monotonic_ns() -> Option<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
    let secs = u64::try_from(now.tv_sec()).ok()?;
    let nanos = u64::try_from(now.tv_nsec()).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The instant `ns` (on CLOCK_MONOTONIC) stands for; now when it is not in the past.
fn instant_of(ns: u64) -> Instant {
    let now = Instant::now();
    let ago = monotonic_ns().map_or(0, |current| current.saturating_sub(ns));
    now.checked_sub(Duration::from_nanos(ago)).unwrap_or(now)
}

/// What this process is: started by a caller, or a supervisor's worker.
pub enum Role {
    Top,
    Worker(Worker),
}

/// The worker's end of the status pipe.
pub struct Worker {
    status: std::fs::File,
}

/// What the worker reads on stdin.
pub enum Stdin<'a> {
    /// The caller's stdin, as it is.
    Inherit,
    /// These bytes (fence_pr's options, which the supervisor read to decide).
    Bytes(&'a [u8]),
}

impl Role {
    /// Call first in `main`, before any thread or child exists. In a worker whose supervisor is
    /// already gone, exits at once: nobody waits for its verdict.
    pub fn detect() -> Role {
        let Some(marker) = std::env::var(ENV).ok().as_deref().and_then(parse_env) else {
            let _ = started();
            return Role::Top;
        };
        let Marker {
            parent,
            fd,
            inode,
            start,
        } = marker;
        // Ours only if `fd` is the very pipe the supervisor made.
        let ours = nix::sys::stat::fstat(fd).is_ok_and(|stat| {
            stat.st_mode & nix::libc::S_IFMT == nix::libc::S_IFIFO && stat.st_ino == inode
        });
        if !ours {
            let _ = started();
            return Role::Top;
        }
        let _ = STARTED.set(instant_of(start));
        // The supervisor spawned us with the signals it passes on blocked (a child inherits the
        // mask): the worker takes them as the one process did.
        let _ = forwarded().thread_unblock();
        // Killed with the supervisor (Pacemaker's timeout kills the process it started). Set
        // after the supervisor may have died: then our parent is no longer it.
        if nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_err()
            || nix::unistd::getppid().as_raw() != parent
        {
            std::process::exit(i32::from(NO_VERDICT));
        }
        // Reopened close-on-exec (O_NONBLOCK: a FIFO open never waits), the inherited number
        // closed, so nothing the worker starts inherits it.
        let reopened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(OFlag::O_NONBLOCK.bits())
            .open(format!("/proc/self/fd/{fd}"));
        let _ = nix::unistd::close(fd);
        match reopened {
            Ok(status) if status.metadata().is_ok_and(|m| m.file_type().is_fifo()) => {
                Role::Worker(Worker { status })
            }
            _ => std::process::exit(i32::from(NO_VERDICT)),
        }
    }

    /// Runs `work`, in a worker process when `needs_worker` (the command touches devices) and
    /// this process is not one already, and returns the exit status to exit with. If the worker
    /// cannot be started, `work` runs here (said on stderr: a stuck command may then hold the
    /// exit up).
    pub fn run(self, needs_worker: bool, stdin: Stdin, work: impl FnOnce() -> u8) -> u8 {
        match self {
            Role::Worker(worker) => {
                // A panic's message is on stderr already; its status is Rust's.
                let code =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or(101);
                worker.give(code)
            }
            Role::Top if needs_worker => match supervise(stdin) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!(
                        "prfence: cannot start a worker process ({e}); running in this one: a \
                         command stuck in the kernel may hold up its exit"
                    );
                    work()
                }
            },
            Role::Top => work(),
        }
    }
}

impl Worker {
    /// Hands the verdict to the supervisor: output flushed, the caller's fds let go, the status
    /// written. Returns `code` for the worker's own exit.
    fn give(mut self, code: u8) -> u8 {
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            for fd in 0..=2 {
                let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
            }
        }
        let _ = self.status.write_all(&[code]);
        code
    }
}

/// What [`ENV`] carries.
#[derive(Debug, PartialEq)]
struct Marker {
    parent: i32,
    fd: RawFd,
    inode: u64,
    /// The supervisor's start, nanoseconds on CLOCK_MONOTONIC.
    start: u64,
}

/// `pid:fd:inode:start`.
fn parse_env(value: &str) -> Option<Marker> {
    let mut parts = value.split(':');
    let marker = Marker {
        parent: parts.next()?.parse().ok()?,
        fd: parts.next()?.parse().ok()?,
        inode: parts.next()?.parse().ok()?,
        start: parts.next()?.parse().ok()?,
    };
    parts.next().is_none().then_some(marker)
}

/// The signals passed on to the worker.
fn forwarded() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set
}

/// Starts the worker and waits for its verdict. Err only when the worker could not be started.
fn supervise(stdin: Stdin) -> std::io::Result<u8> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    fcntl(write.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty()))?;
    let inode = nix::sys::stat::fstat(write.as_raw_fd())?.st_ino;
    let mut args = std::env::args_os();
    // The caller's start, as this process saw it (a clock that cannot be read gives the worker
    // its own start: the deadline as long as before, never shorter).
    let start = monotonic_ns()
        .map(|now| now.saturating_sub(nanos(started().elapsed())))
        .unwrap_or(u64::MAX);
    let mut command = Command::new("/proc/self/exe");
    command
        .arg0(args.next().unwrap_or_default())
        .args(args)
        .env(
            ENV,
            format!(
                "{}:{}:{inode}:{start}",
                std::process::id(),
                write.as_raw_fd()
            ),
        )
        .stdin(match stdin {
            Stdin::Inherit => Stdio::inherit(),
            Stdin::Bytes(_) => Stdio::piped(),
        });
    // Blocked before the spawn, so a signal from now on is read from the signalfd and passed on
    // (the worker inherits the mask and unblocks them in `Role::detect`).
    let signals = forwarded();
    signals.thread_block()?;
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = signals.thread_unblock();
            return Err(e);
        }
    };
    drop(write);
    if let (Stdin::Bytes(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A worker that died before reading shows in its status below.
        let _ = pipe.write_all(bytes);
    }
    let end = wait_for_verdict(&mut child, read);
    Ok(match end {
        End::Verdict(code) => code,
        End::Exited(status) => status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(NO_VERDICT),
        End::Signalled(signal) => {
            // Die of the signal we were sent, as the one process did.
            let _ = signals.thread_unblock();
            let _ = raise(signal);
            128 + u8::try_from(signal as i32).unwrap_or(0)
        }
        End::Died => NO_VERDICT,
    })
}

enum End {
    /// The worker's status, from the pipe.
    Verdict(u8),
    /// The worker ended without one and was reaped.
    Exited(ExitStatus),
    /// We were sent this signal (passed on) and the worker ended without a verdict.
    Signalled(Signal),
    /// The worker died without a verdict and cannot be reaped (a thread held in the kernel).
    Died,
}

/// SIGTERM and SIGINT, read from a signalfd, passed on to the worker.
struct Forwarder {
    signalfd: Option<SignalFd>,
    worker: Pid,
    /// The last one passed on.
    sent: Option<Signal>,
}

impl Forwarder {
    fn new(worker: Pid) -> Forwarder {
        let signalfd =
            SignalFd::with_flags(&forwarded(), SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).ok();
        if signalfd.is_none() {
            // Cannot read them: let them act on this process as usual (the worker then dies of
            // its parent-death signal).
            let _ = forwarded().thread_unblock();
        }
        Forwarder {
            signalfd,
            worker,
            sent: None,
        }
    }

    /// Passes on what is pending.
    fn pass_on(&mut self) {
        let Some(signalfd) = &self.signalfd else {
            return;
        };
        while let Ok(Some(info)) = signalfd.read_signal() {
            if let Ok(signal) = Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) {
                let _ = kill(self.worker, signal);
                self.sent = Some(signal);
            }
        }
    }

    /// How a worker that gave no verdict ended, `status` if it was reaped. A signal pending
    /// here counts (Ctrl-C reaches the whole process group at once).
    fn without_verdict(&mut self, status: Option<ExitStatus>) -> End {
        self.pass_on();
        match (self.sent, status) {
            (_, Some(status)) if status.code().is_some() => End::Exited(status),
            (Some(signal), _) => End::Signalled(signal),
            (None, Some(status)) => End::Exited(status),
            (None, None) => End::Died,
        }
    }
}

fn wait_for_verdict(child: &mut Child, read: OwnedFd) -> End {
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let mut signals = Forwarder::new(pid);
    let mut read = std::fs::File::from(read);
    let timeout = PollTimeout::try_from(LOOK_EVERY).unwrap_or(PollTimeout::NONE);
    loop {
        let mut fds = vec![PollFd::new(read.as_fd(), PollFlags::POLLIN)];
        if let Some(signalfd) = &signals.signalfd {
            fds.push(PollFd::new(signalfd.as_fd(), PollFlags::POLLIN));
        }
        let ready = poll(&mut fds, timeout);
        let pipe_ready = fds[0].any().unwrap_or(false);
        drop(fds);
        if let Err(e) = ready
            && e != nix::errno::Errno::EINTR
        {
            // Cannot watch: wait for the exit itself.
            return signals.without_verdict(child.wait().ok());
        }
        signals.pass_on();
        if pipe_ready {
            let mut byte = [0u8; 1];
            return match read.read(&mut byte) {
                Ok(1) => End::Verdict(byte[0]),
                // EOF: the worker's fds are closed, so it has exited; reaped at once.
                _ => signals.without_verdict(child.wait().ok()),
            };
        }
        if let Ok(Some(status)) = child.try_wait() {
            return signals.without_verdict(Some(status));
        }
        if main_thread_exited(pid) {
            // Its verdict may have come just before.
            let mut byte = [0u8; 1];
            let mut fds = [PollFd::new(read.as_fd(), PollFlags::POLLIN)];
            let ready = poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0);
            if ready && matches!(read.read(&mut byte), Ok(1)) {
                return End::Verdict(byte[0]);
            }
            return signals.without_verdict(None);
        }
    }
}

/// Whether `pid`'s main thread is a zombie: the process is exiting (Rust's main thread ends only
/// with the process), but a thread held in the kernel keeps it from being reaped.
fn main_thread_exited(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // "pid (comm) state …": comm may hold anything, so read after the last ')'
        stat.rsplit_once(')')
            .and_then(|(_, after)| after.split_whitespace().next())
            == Some("Z")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_four_numbers() {
        assert_eq!(
            parse_env("12:5:99:7"),
            Some(Marker {
                parent: 12,
                fd: 5,
                inode: 99,
                start: 7
            })
        );
        assert_eq!(parse_env("12:5:99"), None);
        assert_eq!(parse_env("12:5:99:7:1"), None);
        assert_eq!(parse_env("x:5:99:7"), None);
    }

    #[test]
    fn a_start_crosses_as_a_number_of_the_same_clock() {
        let before = Instant::now();
        let now = monotonic_ns().expect("CLOCK_MONOTONIC");
        let ago = Duration::from_millis(1500);
        let start = instant_of(now - nanos(ago));
        let after = Instant::now();
        // 1.5 s before a moment between `before` and `after`
        assert!(start + ago >= before && start + ago <= after);
        // a start not in the past is now
        let future = instant_of(u64::MAX);
        assert!(future >= before && future <= Instant::now());
    }
}
