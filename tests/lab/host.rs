//! Host side of a lab suite: build the guest, boot it with this very binary as its command, relay
//! the console and turn what the guest reported into this process's result.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use super::secs;

/// Where the lab's sources live (build.sh, init).
const LAB_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab");

/// Builds the guest if needed, boots it, runs this suite's `selected` tests inside (same `args`),
/// and fails unless the guest booted, ran and reported every test as passed. `budget` bounds the
/// guest's whole life (`LAB_TIMEOUT` seconds overrides it); a guest kernel that reports a lock-up,
/// a hung task or an oops ends the run within seconds instead (see [`KernelTrouble`]).
///
/// With `package`, the .deb is first built around the prfence binary under test (`cargo xtask
/// deb --binary`, the packaging code that makes the release packages) and handed to the guest
/// in `LAB_PACKAGE`, which installs it before the tests run.
pub fn run_suite(
    args: &[String],
    selected: usize,
    budget: Duration,
    package: bool,
    kernel_suite: Option<&str>,
) -> ExitCode {
    match boot_and_run(args, selected, budget, package, kernel_suite) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn boot_and_run(
    args: &[String],
    selected: usize,
    budget: Duration,
    package: bool,
    kernel_suite: Option<&str>,
) -> anyhow::Result<()> {
    let suite_start = Instant::now();
    let exe = std::env::current_exe()?;
    let suite = suite_name(&exe);
    if selected == 0 {
        println!("lab {suite}: no test matches the filters, no guest booted");
        return Ok(());
    }
    let kernel_suite = std::env::var("LAB_KERNEL_SUITE")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| kernel_suite.map(str::to_owned));
    let lab_dir = target_dir(&exe).join(lab_dir_name(kernel_suite.as_deref()));

    let build_start = Instant::now();
    let mut build = Command::new("bash");
    build.arg(format!("{LAB_SOURCES}/build.sh")).arg(&lab_dir);
    if let Some(kernel_suite) = &kernel_suite {
        build.env("LAB_KERNEL_SUITE", kernel_suite);
    }
    let status = build
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run {LAB_SOURCES}/build.sh: {e}"))?;
    anyhow::ensure!(status.success(), "building the lab guest failed ({status})");
    println!("lab {suite}: guest build {}", secs(build_start.elapsed()));

    let deb = if package {
        let start = Instant::now();
        let deb = build_package(&lab_dir.join(format!("package-{suite}")))?;
        println!(
            "lab {suite}: package {} built in {}",
            deb.display(),
            secs(start.elapsed())
        );
        Some(deb)
    } else {
        None
    };

    // The guest runs this script from the shared host root (never /run: the guest's is fresh).
    let script = lab_dir.join(format!("run-{suite}-{}.sh", std::process::id()));
    let cwd = std::env::current_dir()?;
    // The guest starts from init's bare environment: hand the suite's own settings (LAB_*) over.
    let mut settings: String = std::env::vars()
        .filter(|(name, _)| {
            name.starts_with("LAB_")
                && name != "LAB_GUEST"
                && name != "LAB_PACKAGE"
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(name, value)| format!("{name}={} ", quote(Path::new(&value))))
        .collect();
    if let Some(deb) = &deb {
        settings.push_str(&format!("LAB_PACKAGE={} ", quote(deb)));
    }
    let mut line = format!(
        "cd {} && {settings}LAB_GUEST=1 exec {}",
        quote(&cwd),
        quote(&exe)
    );
    for a in args {
        line.push(' ');
        line.push_str(&quote(Path::new(a)));
    }
    std::fs::write(&script, format!("#!/bin/sh\n{line}\n"))?;
    let _remove_script = super::RemoveOnDrop::new(&script);
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let script_arg = script.to_str().filter(|s| !s.contains(char::is_whitespace));
    let script_arg = script_arg.ok_or_else(|| {
        anyhow::anyhow!("the lab needs a path without spaces: {}", script.display())
    })?;

    let timeout = std::env::var("LAB_TIMEOUT").unwrap_or_else(|_| budget.as_secs().to_string());
    let memory = std::env::var("LAB_MEM").unwrap_or_else(|_| "2048".into());
    let boot_start = Instant::now();
    // `timeout` bounds a hung guest (--foreground keeps qemu in our process group, so killing the
    // test kills the guest); -nic none skips the network boot ROM.
    let mut qemu = Command::new("timeout")
        .args([
            "--foreground",
            "-k",
            "10",
            &timeout,
            "qemu-system-x86_64",
            "-accel",
            "tcg",
        ])
        .args([
            "-m",
            &memory,
            "-smp",
            "2",
            "-nographic",
            "-no-reboot",
            "-nic",
            "none",
        ])
        .arg("-kernel")
        .arg(lab_dir.join("vmlinuz"))
        .arg("-initrd")
        .arg(lab_dir.join("initrd.gz"))
        .arg("-append")
        .arg(format!("console=ttyS0 {KERNEL_ARGS} lab.cmd={script_arg}"))
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start qemu-system-x86_64: {e}"))?;
    let console = qemu
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("qemu has no stdout"))?;
    let stopper = Stopper::new(qemu.id());

    let mut report = Report::default();
    for raw in BufReader::new(console).split(b'\n') {
        let raw = raw?;
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim_end_matches('\r');
        report.watch_trouble(text, boot_start.elapsed());
        // Before the guest is up, only the lab's own lines matter (firmware output is noise).
        let text = match text.find("lab:") {
            Some(at) if report.ready.is_none() => &text[at..],
            None if report.ready.is_none() && report.trouble.is_none() => {
                // kept to explain a guest that never comes up (panic, missing module…)
                report.early.push(text.to_owned());
                continue;
            }
            _ => text,
        };
        println!("{text}");
        report.observe(text, boot_start.elapsed());
        if let Some(trouble) = &mut report.trouble {
            if trouble.lines.len() < TROUBLE_LINES {
                trouble.lines.push(text.to_owned());
            }
            // The kernel prints its stacks right after the report; then the guest is useless.
            stopper.stop_after(TROUBLE_GRACE);
        }
    }
    let status = qemu.wait()?;
    let boot = report.ready.map(secs).unwrap_or_else(|| "-".into());
    println!(
        "lab {suite}: boot {boot}, {} passed, {} failed, whole suite {} (qemu {status})",
        report.passed.len(),
        report.failed.len(),
        secs(suite_start.elapsed())
    );
    if report.ready.is_none() {
        let tail = report.early.len().saturating_sub(40);
        for line in &report.early[tail..] {
            println!("guest console: {line}");
        }
    }
    if let Some(trouble) = &report.trouble {
        anyhow::bail!(
            "the guest kernel reported {:?} after {}; the run was stopped within {} of it. \
             What the kernel printed (stacks included):\n{}",
            trouble.kind,
            secs(trouble.at),
            secs(TROUBLE_GRACE),
            trouble.lines.join("\n")
        );
    }
    anyhow::ensure!(
        report.ready.is_some(),
        "the guest did not boot (no `lab: guest ready`)"
    );
    let exit = report.exit.ok_or_else(|| {
        anyhow::anyhow!(
            "the guest never reported its exit status (crash or timeout after {timeout} s?)"
        )
    })?;
    anyhow::ensure!(
        report.failed.is_empty(),
        "failed in the guest: {}",
        report.failed.join(", ")
    );
    anyhow::ensure!(exit == 0, "the in-guest run exited {exit}");
    anyhow::ensure!(
        report.passed.len() == selected,
        "{selected} tests selected but {} reported passing",
        report.passed.len()
    );
    Ok(())
}

/// The guest kernel's command line. A soft lockup (a CPU spinning in the kernel for 10 s, twice
/// `watchdog_thresh`, before the RCU stall detector's 21 s) panics
/// after every CPU's backtrace is printed, and the panic ends QEMU at once (`panic=-1` reboots,
/// `-no-reboot` exits); an oops panics too. `loglevel=5` lets the backtraces (printed at the
/// default level) reach the console while informational chatter stays off it. Hung tasks are
/// reported by the kernel after `hung_task_timeout_secs` (set by `init`); the guest's own monitor
/// prints their stacks (see `guest::watch_kernel`).
const KERNEL_ARGS: &str = "loglevel=5 panic=-1 watchdog_thresh=5 softlockup_panic=1 \
     softlockup_all_cpu_backtrace=1 oops=panic";

/// How long the console is still read after the kernel reported trouble: enough for the stacks
/// and the panic (and, after an RCU stall, for the soft lockup report with every CPU's stack),
/// then QEMU is stopped whatever the guest does.
const TROUBLE_GRACE: Duration = Duration::from_secs(12);
/// How many console lines after the trouble report go into the failure message.
const TROUBLE_LINES: usize = 400;

/// Console lines by which the guest kernel says it is broken, and the diagnosis each stands for.
const TROUBLE_PATTERNS: &[(&str, &str)] = &[
    (
        "BUG: soft lockup",
        "soft lockup (a CPU spinning in the kernel)",
    ),
    ("rcu_sched detected stall", "RCU stall"),
    ("rcu: INFO: rcu_preempt detected stall", "RCU stall"),
    (" blocked for more than ", "hung task"),
    ("BUG: unable to handle", "oops"),
    ("general protection fault", "oops"),
    ("Oops: ", "oops"),
    ("Kernel panic - not syncing", "kernel panic"),
    (
        "lab: kernel trouble:",
        "hung task or oops seen by the guest's monitor",
    ),
];

/// What the guest kernel reported, and the console from there on.
struct KernelTrouble {
    kind: &'static str,
    at: Duration,
    lines: Vec<String>,
}

/// Stops QEMU (through `timeout`, which forwards SIGTERM to it) a grace period after the first
/// request, from a thread of its own: the console reader may be blocked on a silent guest.
struct Stopper {
    request: std::sync::mpsc::Sender<Duration>,
    requested: std::cell::Cell<bool>,
}

impl Stopper {
    fn new(pid: u32) -> Self {
        let (request, requests) = std::sync::mpsc::channel::<Duration>();
        std::thread::spawn(move || {
            if let Ok(grace) = requests.recv() {
                std::thread::sleep(grace);
                if let Ok(pid) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
            }
        });
        Stopper {
            request,
            requested: std::cell::Cell::new(false),
        }
    }

    fn stop_after(&self, grace: Duration) {
        if !self.requested.replace(true) {
            let _ = self.request.send(grace);
        }
    }
}

#[derive(Default)]
struct Report {
    ready: Option<std::time::Duration>,
    early: Vec<String>,
    passed: Vec<String>,
    failed: Vec<String>,
    exit: Option<i32>,
    trouble: Option<KernelTrouble>,
}

impl Report {
    /// Notes the first console line by which the kernel says it is broken (before boot too).
    fn watch_trouble(&mut self, line: &str, at: Duration) {
        if self.trouble.is_none()
            && let Some((_, kind)) = TROUBLE_PATTERNS.iter().find(|(p, _)| line.contains(p))
        {
            self.trouble = Some(KernelTrouble {
                kind,
                at,
                lines: Vec::new(),
            });
        }
    }

    fn observe(&mut self, line: &str, at: std::time::Duration) {
        if line.starts_with("lab: guest ready") {
            self.ready.get_or_insert(at);
        } else if let Some(code) = line.strip_prefix("LAB_EXIT=") {
            self.exit = code.trim().parse().ok();
        } else if let Some(rest) = line.strip_prefix("test ")
            && let Some((name, result)) = rest.split_once(" ... ")
        {
            if result.starts_with("ok") {
                self.passed.push(name.to_owned());
            } else if result.starts_with("FAILED") {
                self.failed.push(name.to_owned());
            }
        }
    }
}

/// The guest's cache directory under the target dir: `lab` for the host's own kernel package,
/// `lab-SUITE` for the kernel of another Debian suite (`LAB_KERNEL_SUITE`, or the suite's own
/// choice, e.g. `unstable`), so that switching between kernels rebuilds nothing.
fn lab_dir_name(kernel_suite: Option<&str>) -> String {
    match kernel_suite {
        Some(suite) => format!("lab-{suite}"),
        None => "lab".to_owned(),
    }
}

/// The suite's name: the test binary's name without cargo's hash suffix.
fn suite_name(exe: &Path) -> String {
    let stem = exe
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
        _ => stem,
    }
}

/// Cargo's target directory holding this test binary (it carries CACHEDIR.TAG), wherever
/// CARGO_TARGET_DIR put it.
fn target_dir(exe: &Path) -> PathBuf {
    exe.ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")))
}

/// The .deb of the binary under test, built into `dir` by the packaging code itself (`cargo
/// xtask deb --binary`); returns its path.
fn build_package(dir: &Path) -> anyhow::Result<PathBuf> {
    let out = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["xtask", "deb", "--binary", super::PRFENCE, "--out"])
        .arg(dir)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run cargo xtask deb: {e}"))?;
    anyhow::ensure!(
        out.status.success(),
        "cargo xtask deb --binary {} failed ({}): {}",
        super::PRFENCE,
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let deb = stdout
        .lines()
        .last()
        .map(PathBuf::from)
        .filter(|p| p.extension().is_some_and(|e| e == "deb") && p.is_file())
        .ok_or_else(|| anyhow::anyhow!("cargo xtask deb printed no package: {stdout}"))?;
    Ok(deb)
}

/// Single-quotes a path for sh.
fn quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}
