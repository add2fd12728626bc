//! Host side of a lab suite: build the guest, boot it with this very binary as its command, relay
//! the console and turn what the guest reported into this process's result.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use super::secs;

/// Where the lab's sources live (build.sh, init).
const LAB_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab");

/// Builds the guest if needed, boots it, runs this suite's `selected` tests inside (same `args`),
/// and fails unless the guest booted, ran and reported every test as passed.
pub fn run_suite(args: &[String], selected: usize) -> ExitCode {
    match boot_and_run(args, selected) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn boot_and_run(args: &[String], selected: usize) -> anyhow::Result<()> {
    let suite_start = Instant::now();
    let exe = std::env::current_exe()?;
    let suite = suite_name(&exe);
    if selected == 0 {
        println!("lab {suite}: no test matches the filters, no guest booted");
        return Ok(());
    }
    let lab_dir = target_dir(&exe).join(lab_dir_name());

    let build_start = Instant::now();
    let status = Command::new("bash")
        .arg(format!("{LAB_SOURCES}/build.sh"))
        .arg(&lab_dir)
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run {LAB_SOURCES}/build.sh: {e}"))?;
    anyhow::ensure!(status.success(), "building the lab guest failed ({status})");
    println!("lab {suite}: guest build {}", secs(build_start.elapsed()));

    // The guest runs this script from the shared host root (never /run: the guest's is fresh).
    let script = lab_dir.join(format!("run-{suite}-{}.sh", std::process::id()));
    let cwd = std::env::current_dir()?;
    let mut line = format!("cd {} && LAB_GUEST=1 exec {}", quote(&cwd), quote(&exe));
    for a in args {
        line.push(' ');
        line.push_str(&quote(Path::new(a)));
    }
    std::fs::write(&script, format!("#!/bin/sh\n{line}\n"))?;
    let _remove_script = RemoveOnDrop(script.clone());
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let script_arg = script.to_str().filter(|s| !s.contains(char::is_whitespace));
    let script_arg = script_arg.ok_or_else(|| {
        anyhow::anyhow!("the lab needs a path without spaces: {}", script.display())
    })?;

    let timeout = std::env::var("LAB_TIMEOUT").unwrap_or_else(|_| "1500".into());
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
        .arg(format!("console=ttyS0 quiet panic=-1 lab.cmd={script_arg}"))
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

    let mut report = Report::default();
    for raw in BufReader::new(console).split(b'\n') {
        let raw = raw?;
        let text = String::from_utf8_lossy(&raw);
        let text = text.trim_end_matches('\r');
        // Before the guest is up, only the lab's own lines matter (firmware output is noise).
        let text = match text.find("lab:") {
            Some(at) if report.ready.is_none() => &text[at..],
            None if report.ready.is_none() => {
                // kept to explain a guest that never comes up (panic, missing module…)
                report.early.push(text.to_owned());
                continue;
            }
            _ => text,
        };
        println!("{text}");
        report.observe(text, boot_start.elapsed());
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

#[derive(Default)]
struct Report {
    ready: Option<std::time::Duration>,
    early: Vec<String>,
    passed: Vec<String>,
    failed: Vec<String>,
    exit: Option<i32>,
}

impl Report {
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

/// The guest's cache directory under the target dir: `lab` for Debian 12's kernel, `lab-SUITE` for
/// the kernel of another Debian suite (`LAB_KERNEL_SUITE`, e.g. `unstable`), so that switching
/// between kernels rebuilds nothing.
fn lab_dir_name() -> String {
    match std::env::var("LAB_KERNEL_SUITE") {
        Ok(suite) if !suite.is_empty() => format!("lab-{suite}"),
        _ => "lab".to_owned(),
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

/// Single-quotes a path for sh.
fn quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
