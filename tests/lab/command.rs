//! Running commands in the guest: the one way lab suites run prfence and the tools around it,
//! and the small helpers every suite shares.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// What an external command did: its status, output and how long it took.
#[derive(Debug)]
pub struct CommandRun {
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl CommandRun {
    /// The exit code, or -1 when a signal killed it.
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }

    /// Ok when the command exited 0; otherwise an error quoting its status and stderr.
    pub fn ok(self) -> anyhow::Result<Self> {
        anyhow::ensure!(
            self.status.success(),
            "`{}` failed ({}): {}{}",
            self.command,
            self.status,
            self.stderr.trim(),
            self.stdout.trim()
        );
        Ok(self)
    }

    /// Ok when the command exited `code`; otherwise an error quoting its status and output.
    pub fn exited_with(self, code: i32) -> anyhow::Result<Self> {
        anyhow::ensure!(
            self.code() == code,
            "`{}` exited {}, expected {code}:\n{}{}",
            self.command,
            self.code(),
            self.stdout,
            self.stderr
        );
        Ok(self)
    }

    /// The JSON the command printed on stdout (`--json`), or an error quoting what it printed.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(self.stdout.trim()).map_err(|e| {
            anyhow::anyhow!(
                "`{}` (exit {}) printed no JSON ({e}): {}{}",
                self.command,
                self.code(),
                self.stdout,
                self.stderr
            )
        })
    }
}

/// Runs `prfence args…` to completion: the one way lab suites run it (wrap it to print timelines or
/// parse JSON).
pub fn prfence<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> anyhow::Result<CommandRun> {
    run(super::PRFENCE, args)
}

/// `prfence ARGS… DEVICES…`: [`prfence`] on a device list of the caller's (another node's view,
/// two sessions' paths).
pub fn prfence_with_devices<D: AsRef<OsStr>>(
    args: &[&str],
    devices: &[D],
) -> anyhow::Result<CommandRun> {
    let all = args
        .iter()
        .map(OsStr::new)
        .chain(devices.iter().map(AsRef::as_ref));
    run(super::PRFENCE, all)
}

/// Runs `program args…` to completion and captures everything (e.g. `lab::run("sg_persist",
/// ["-k", dev])`).
pub fn run<I, S>(program: impl AsRef<OsStr>, args: I) -> anyhow::Result<CommandRun>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(program.as_ref());
    cmd.args(args);
    run_command(&mut cmd)
}

/// [`run`] for a prepared [`Command`] (env, cwd…).
pub fn run_command(cmd: &mut Command) -> anyhow::Result<CommandRun> {
    let command = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let start = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run `{command}`: {e}"))?;
    Ok(CommandRun {
        command,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
    })
}

/// Runs a shell command line in the guest, failing on a non-zero status.
pub fn sh(script: &str) -> anyhow::Result<CommandRun> {
    run("sh", ["-c", script])?.ok()
}

/// A count from the environment variable `name` (set on the host, see host.rs), or `default`.
pub fn env_count(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a count")),
        Err(_) => Ok(default),
    }
}

/// Seconds with millisecond precision, for timelines and reports.
pub fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

pub fn write_file(path: impl AsRef<Path>, value: &str) -> anyhow::Result<()> {
    let path = path.as_ref();
    std::fs::write(path, value)
        .map_err(|e| anyhow::anyhow!("write {value:?} to {}: {e}", path.display()))
}

pub fn read_file(path: impl AsRef<Path>) -> anyhow::Result<String> {
    let path = path.as_ref();
    std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("read {}: {e}", path.display()))
}

/// Removes files when dropped, so a test that fails half-way leaves nothing behind for the next
/// test in the same guest (fence_scsi's key files, hooks, scripts).
pub struct RemoveOnDrop(Vec<PathBuf>);

impl RemoveOnDrop {
    pub fn new(path: impl AsRef<Path>) -> Self {
        RemoveOnDrop(vec![path.as_ref().to_path_buf()])
    }

    pub fn all<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Self {
        RemoveOnDrop(
            paths
                .into_iter()
                .map(|p| p.as_ref().to_path_buf())
                .collect(),
        )
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A background process (a monitor, a log reader) killed and reaped when dropped, so a test that
/// fails half-way leaves no process behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `path` is a mount point.
pub fn is_mount(path: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(path))
}

/// Waits up to `within` for `child`, asked to stop, to exit; kills it after that. Reaped either way.
pub fn reap_or_kill(child: &mut std::process::Child, within: Duration) {
    let start = Instant::now();
    while child.try_wait().ok().flatten().is_none() {
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
