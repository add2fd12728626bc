//! The lab: a QEMU guest running Debian's kernel with LIO as a real SCSI-3 PR target, two initiator
//! "nodes" (A and B) and oracles that read the target's own state.
//!
//! Every lab suite is a test binary `tests/lab_<suite>.rs` (`harness = false`) whose `main` calls
//! [`main`]. The same binary runs twice: on the host it builds the guest (`build.sh`, cached under
//! `<target>/lab`), boots it and relays the console; inside the guest (env `LAB_GUEST=1`) it runs each
//! test on a fresh topology and prints `test NAME ... ok|FAILED`.
// Each suite uses a different part of the lab.
#![allow(dead_code, unused_imports)]

pub mod agent;
pub mod fence_agents;
mod guest;
mod host;
pub mod nvme;
pub mod race;
mod topology;
mod writer;

pub use topology::{
    BLOCK_SIZE, Holder, HungPath, Lu, Node, NodeView, Registration, Topology, WriteOutcome,
    block_data, block_text, write_to,
};
pub use writer::{Writer, write_number};

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

/// A lab test: builds its own topology (dropping it tears it down) and returns an error or panics
/// to fail.
pub type TestFn = fn() -> anyhow::Result<()>;

/// `lab::tests![a, b]` is the list `[("a", a), ("b", b)]` that [`main`] takes.
#[macro_export]
macro_rules! tests {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), $name as $crate::lab::TestFn)),*]
    };
}

/// Entry point of a lab suite: on the host, boots a guest that runs this same binary; in the guest,
/// runs the tests. Arguments: substring filters (`--exact` for whole names), `--list`. `budget`
/// bounds the guest's life (about three times the suite's usual time under emulation; the
/// environment variable `LAB_TIMEOUT`, in seconds, overrides it).
pub fn main(budget: Duration, tests: &[(&'static str, TestFn)]) -> ExitCode {
    run_suite(budget, tests, false, None)
}

/// [`main`] for a suite that tests prfence as an admin installs it: the host builds the .deb
/// around the binary under test, and the guest installs it with dpkg (into its tmpfs overlay; the
/// host's root is never written) before any test runs, so `/usr/sbin/prfence` and the
/// `/usr/sbin/fence_pr` link where pacemaker-fenced looks for agents are the package's.
pub fn main_with_package(budget: Duration, tests: &[(&'static str, TestFn)]) -> ExitCode {
    run_suite(budget, tests, true, None)
}

/// [`main_with_package`] for a suite that needs a newer kernel than the host's Debian release
/// carries (nvmet's reservations came with Linux 6.13): its guest boots the newest kernel of the
/// Debian suite `kernel_suite` (e.g. `unstable`), which build.sh fetches from the mirror the host's
/// own apt configuration names. `LAB_KERNEL_SUITE` set to another suite wins, as for every suite.
pub fn main_with_package_on(
    kernel_suite: &'static str,
    budget: Duration,
    tests: &[(&'static str, TestFn)],
) -> ExitCode {
    run_suite(budget, tests, true, Some(kernel_suite))
}

/// The installed prfence (a suite started with [`main_with_package`]).
pub const INSTALLED_PRFENCE: &str = "/usr/sbin/prfence";
/// The installed fence agent: the package's link to [`INSTALLED_PRFENCE`].
pub const INSTALLED_FENCE_PR: &str = "/usr/sbin/fence_pr";

fn run_suite(
    budget: Duration,
    tests: &[(&'static str, TestFn)],
    package: bool,
    kernel_suite: Option<&'static str>,
) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exact = args.iter().any(|a| a == "--exact");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let selected: Vec<(&'static str, TestFn)> = tests
        .iter()
        .filter(|(name, _)| {
            filters.is_empty()
                || filters.iter().any(|f| {
                    if exact {
                        name == f
                    } else {
                        name.contains(f.as_str())
                    }
                })
        })
        .copied()
        .collect();
    if args.iter().any(|a| a == "--list") {
        // libtest's format, so cargo-nextest and `cargo test -- --list` understand it.
        if !args.iter().any(|a| a == "--ignored") {
            for (name, _) in &selected {
                println!("{name}: test");
            }
        }
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "--ignored") {
        return ExitCode::SUCCESS; // no lab test is ignored
    }
    if guest::inside() {
        if package && let Err(e) = guest::install_package() {
            println!("lab: FAILED: installing the package: {e:#}");
            return ExitCode::FAILURE;
        }
        guest::run_tests(&selected, tests.len())
    } else {
        host::run_suite(&args, selected.len(), budget, package, kernel_suite)
    }
}

/// What an external command did: its status, output and how long it took.
#[derive(Debug)]
pub struct Run {
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
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

/// The prfence binary under test (also `fence_pr` through a link named so).
pub const PRFENCE: &str = env!("CARGO_BIN_EXE_prfence");

/// Runs `prfence args…` to completion: the one way lab suites run it (wrap it to print timelines or
/// parse JSON).
pub fn prfence<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> anyhow::Result<Run> {
    run(PRFENCE, args)
}

/// Runs `program args…` to completion and captures everything (e.g. `lab::run("sg_persist",
/// ["-k", dev])`).
pub fn run<I, S>(program: impl AsRef<OsStr>, args: I) -> anyhow::Result<Run>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(program.as_ref());
    cmd.args(args);
    run_command(&mut cmd)
}

/// [`run`] for a prepared [`Command`] (env, cwd…).
pub fn run_command(cmd: &mut Command) -> anyhow::Result<Run> {
    let command = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let start = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run `{command}`: {e}"))?;
    Ok(Run {
        command,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
    })
}

/// Runs a shell command line in the guest, failing on a non-zero status.
pub(crate) fn sh(script: &str) -> anyhow::Result<Run> {
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

fn write_file(path: impl AsRef<Path>, value: &str) -> anyhow::Result<()> {
    let path = path.as_ref();
    std::fs::write(path, value)
        .map_err(|e| anyhow::anyhow!("write {value:?} to {}: {e}", path.display()))
}

fn read_file(path: impl AsRef<Path>) -> anyhow::Result<String> {
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
