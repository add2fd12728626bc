//! Host side of a lab run: build the guests, boot one per kernel with this very binary as its
//! command and the picked tests as its arguments, relay the console, hold each suite to its
//! budget, and turn what the guests reported into per-suite results and this process's status.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::plan::{GuestInit, GuestKernel, GuestRoot, Picked, Suite};
use super::secs;

/// Where the lab's sources live (build.sh, init).
const LAB_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab");
/// How long a guest may take from its start to its first suite (boot, modules, iscsid).
const BOOT_BUDGET: Duration = Duration::from_secs(5 * 60);
/// How long a guest may take from its last suite to its exit.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(60);

/// Runs `picked`. The suites of one guest setup (a kernel, with or without the package
/// installed, an init, a root) run in order in one guest, booted once, or in a few when the
/// setup's budgets would hold up the run: the work is cut at suite boundaries into jobs, run
/// longest first by `LAB_GUESTS` guests at once (default [`GUESTS`]), for a guest leaves the CPU
/// idle for most of its time (waiting on agents' intervals, timeouts and Pacemaker's timers).
/// The package is built once, beside the guests that do not need it.
/// A guest that stops before its last suite (a kernel lock-up, a suite over its budget) fails
/// the suite it was running, and a new guest runs the suites it had not started. With more than
/// one guest at once, each guest's console is printed whole when it ends, so that no two
/// interleave. Prints each suite's result and a summary; fails unless every picked test passed.
/// `filtered` is how many tests the filters left out.
pub fn run(picked: &[Picked], filtered: usize) -> ExitCode {
    let start = Instant::now();
    if picked.is_empty() {
        println!("lab: no test matches the filters, no guest booted");
        return ExitCode::SUCCESS;
    }
    let mut results: Vec<SuiteResult> = Vec::new();
    for pick in picked {
        match results.last_mut() {
            Some(r) if std::ptr::eq(r.suite, pick.suite) => r.picked.push(pick.name()),
            _ => results.push(SuiteResult::new(pick, results.len())),
        }
    }
    let package = picked
        .iter()
        .any(|p| p.suite.package)
        .then(|| Mutex::new(PackageBuild::start()));
    let slots = guests();
    let jobs = jobs(picked, &mut results, slots);
    let slots = slots.min(jobs.len());
    let live = slots == 1;
    if !live {
        println!(
            "lab: {} guests, {slots} at once, each guest's console printed when it ends:",
            jobs.len()
        );
        for job in &jobs {
            println!("lab:   {}", job.describe());
        }
    }
    let queue = Mutex::new(jobs.into_iter());
    let done: Mutex<(Vec<SuiteResult>, usize)> = Mutex::new((Vec::new(), 0));
    std::thread::scope(|scope| {
        for _ in 0..slots {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().map(|mut q| q.next()).ok().flatten();
                    let Some(mut job) = next else { break };
                    let mut console = Console::new(live);
                    if !live {
                        println!("lab: guest for {} started", job.describe());
                    }
                    let boots = job.run(package.as_ref(), &mut console);
                    console.flush(&format!(
                        "lab: guest for {} ended; its console:",
                        job.describe()
                    ));
                    if let Ok(mut done) = done.lock() {
                        done.0.append(&mut job.results);
                        done.1 += boots;
                    }
                }
            });
        }
    });
    drop(package);
    let (mut results, boots) = done.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|r| r.order);
    summary(&results, boots, filtered, start.elapsed())
}

/// How many guests run at once when `LAB_GUESTS` does not say. A guest keeps about one of the
/// 2-CPU machine's cores busy on average (sampled every 5 s: the agent suite 0.84, the fence
/// suite 1.07, both alone), so two share the machine; three ran every suite about twice as
/// slowly as alone (the two cores busy throughout) and pushed a timing test past its slack.
const GUESTS: usize = 2;

fn guests() -> usize {
    std::env::var("LAB_GUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(GUESTS)
}

/// One guest's work: suites of one setup, in the order picked, with their results.
struct Job {
    setup: Setup,
    picked: Vec<Picked>,
    results: Vec<SuiteResult>,
}

/// Cuts `picked` into jobs for `slots` guests at once, longest first (by the suites' usual
/// times): each setup's suites in order, one job when one guest runs at a time; with more, cut
/// before a suite that would take a job past two thirds of an even share of the whole, so that
/// the slots have jobs to even out with (each cut costs a boot: 10-50 s).
fn jobs(picked: &[Picked], results: &mut Vec<SuiteResult>, slots: usize) -> Vec<Job> {
    let total: Duration = results.iter().map(|r| r.suite.usual).sum();
    let share = if slots == 1 {
        Duration::MAX
    } else {
        total * 2 / u32::try_from(3 * slots).unwrap_or(u32::MAX)
    };
    let mut jobs: Vec<Job> = Vec::new();
    for setup in setups(picked) {
        let mut current: Option<Job> = None;
        for r in results.extract_if(.., |r| setup_of(r.suite) == setup) {
            if let Some(job) = current
                .take_if(|job| job.weight() + r.suite.usual > share && !job.results.is_empty())
            {
                jobs.push(job);
            }
            let job = current.get_or_insert_with(|| Job {
                setup,
                picked: Vec::new(),
                results: Vec::new(),
            });
            job.picked.extend(
                picked
                    .iter()
                    .filter(|p| std::ptr::eq(p.suite, r.suite))
                    .copied(),
            );
            job.results.push(r);
        }
        jobs.extend(current);
    }
    jobs.sort_by_key(|job| std::cmp::Reverse(job.weight()));
    jobs
}

impl Job {
    fn weight(&self) -> Duration {
        self.results.iter().map(|r| r.suite.usual).sum()
    }

    fn describe(&self) -> String {
        let suites: Vec<&str> = self.results.iter().map(|r| r.suite.name).collect();
        let kernel = match self.setup.0 {
            GuestKernel::Host => "the host release's kernel".to_owned(),
            GuestKernel::Suite(suite) => format!("{suite}'s kernel"),
        };
        format!("{} on {kernel}", suites.join(", "))
    }

    /// Boots guests until every suite ran or could not; returns how many were booted.
    fn run(&mut self, package: Option<&Mutex<PackageBuild>>, console: &mut Console) -> usize {
        let setup = self.setup;
        let mut guest = Guest::new(setup.0);
        let mut boots = 0;
        loop {
            let waiting: Vec<Picked> = self
                .picked
                .iter()
                .filter(|p| suite_result(&self.results, p.suite).state == State::Waiting)
                .copied()
                .collect();
            if waiting.is_empty() {
                return boots;
            }
            let packages = match (package, setup.1) {
                (Some(build), true) => build
                    .lock()
                    .map_err(|_| anyhow::anyhow!("the package build panicked"))
                    .and_then(|mut build| build.wait(console))
                    .map(Some),
                _ => Ok(None),
            };
            let progress = packages
                .and_then(|packages| {
                    guest.boot(
                        &waiting,
                        packages.as_ref(),
                        setup.2,
                        setup.3,
                        &mut self.results,
                        console,
                    )
                })
                .unwrap_or_else(|e| {
                    console.line(format!("lab: FAILED: {e:#}"));
                    false
                });
            boots += 1;
            // A kernel that failed in its own boot (an oops under TCG, before the lab's init
            // ran anything) is booted once more per setup; it says so, and a second such boot
            // fails the suites.
            if !progress && std::mem::take(&mut guest.failed_in_boot) && !guest.booted_again {
                guest.booted_again = true;
                console.line(
                    "lab: the guest's kernel failed in its own boot, before any test: booting it \
                     once more",
                );
                continue;
            }
            if !progress {
                for p in &waiting {
                    let r = suite_result_mut(&mut self.results, p.suite);
                    if r.state == State::Waiting {
                        r.state = State::NotRun("its guest did not run it".into());
                    }
                }
            }
        }
    }
}

/// Where a guest's lines go: straight to stdout when it is the only guest running, else kept
/// and printed whole at its end.
struct Console {
    live: bool,
    kept: Vec<String>,
}

impl Console {
    fn new(live: bool) -> Self {
        Console {
            live,
            kept: Vec::new(),
        }
    }

    fn line(&mut self, text: impl Into<String>) {
        let text = text.into();
        if self.live {
            println!("{text}");
        } else {
            self.kept.push(text);
        }
    }

    /// Prints the kept lines after `header`, under one lock of stdout (nothing when live).
    fn flush(&mut self, header: &str) {
        if self.live {
            return;
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{header}");
        for line in self.kept.drain(..) {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// What became of one picked suite.
struct SuiteResult {
    suite: &'static Suite,
    picked: Vec<String>,
    passed: Vec<String>,
    failed: Vec<String>,
    state: State,
    /// From its start line to its done line (or to its guest's end), as the host saw them.
    took: Option<Duration>,
    /// The guest it ran in: its kernel package and which boot of the run it was.
    guest: String,
    /// Its place in the run's order, which the results are printed in.
    order: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Done,
    /// The guest stopped while it ran (why).
    Stopped(String),
    /// No guest ran it (why).
    NotRun(String),
}

impl SuiteResult {
    fn new(pick: &Picked, order: usize) -> Self {
        SuiteResult {
            order,
            suite: pick.suite,
            picked: vec![pick.name()],
            passed: Vec::new(),
            failed: Vec::new(),
            state: State::Waiting,
            took: None,
            guest: String::new(),
        }
    }

    fn ok(&self) -> bool {
        self.state == State::Done
            && self.failed.is_empty()
            && self.passed.len() == self.picked.len()
    }
}

fn suite_result<'a>(results: &'a [SuiteResult], suite: &Suite) -> &'a SuiteResult {
    results
        .iter()
        .find(|r| std::ptr::eq(r.suite, suite))
        .unwrap_or_else(|| unreachable!("every picked suite has a result"))
}

fn suite_result_mut<'a>(results: &'a mut [SuiteResult], suite: &Suite) -> &'a mut SuiteResult {
    results
        .iter_mut()
        .find(|r| std::ptr::eq(r.suite, suite))
        .unwrap_or_else(|| unreachable!("every picked suite has a result"))
}

/// The kernel a suite's guest boots: `LAB_KERNEL_SUITE` (a Debian suite) for every suite when
/// set, else the suite's own.
fn kernel_of(suite: &Suite) -> GuestKernel {
    static CHOSEN: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        std::env::var("LAB_KERNEL_SUITE")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| &*s.leak())
    });
    chosen.map_or(suite.kernel, GuestKernel::Suite)
}

/// A guest setup: the kernel it boots, whether it installs the package, its PID 1 and its root.
type Setup = (GuestKernel, bool, GuestInit, GuestRoot);

fn setup_of(suite: &Suite) -> Setup {
    (kernel_of(suite), suite.package, suite.init, suite.root)
}

/// The guest setups `picked` needs, in the order of their first suite.
fn setups(picked: &[Picked]) -> Vec<Setup> {
    let mut setups = Vec::new();
    for pick in picked {
        let setup = setup_of(pick.suite);
        if !setups.contains(&setup) {
            setups.push(setup);
        }
    }
    setups
}

/// A suite's budget: its own, or `LAB_TIMEOUT` seconds.
fn budget(suite: &Suite) -> Duration {
    std::env::var("LAB_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(suite.budget, Duration::from_secs)
}

/// The guests of one kernel: built once (`build.sh`), booted as often as needed.
struct Guest {
    kernel: GuestKernel,
    dir: PathBuf,
    built: bool,
    /// The last boot ended in kernel trouble before the guest was ready.
    failed_in_boot: bool,
    /// It was booted once more after such a boot.
    booted_again: bool,
}

impl Guest {
    fn new(kernel: GuestKernel) -> Self {
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = target_dir(&exe).join(match kernel {
            GuestKernel::Host => "lab".to_owned(),
            GuestKernel::Suite(suite) => format!("lab-{suite}"),
        });
        Guest {
            kernel,
            dir,
            built: false,
            failed_in_boot: false,
            booted_again: false,
        }
    }

    /// The guest's kernel package, as build.sh recorded it.
    fn label(&self) -> String {
        std::fs::read_to_string(self.dir.join("stamp"))
            .ok()
            .and_then(|s| s.split_whitespace().next().map(str::to_owned))
            .unwrap_or_else(|| self.dir.display().to_string())
    }

    fn build(&mut self, console: &mut Console) -> anyhow::Result<()> {
        if self.built {
            return Ok(());
        }
        let start = Instant::now();
        let mut build = Command::new("bash");
        build.arg(format!("{LAB_SOURCES}/build.sh")).arg(&self.dir);
        if let GuestKernel::Suite(suite) = self.kernel {
            build.env("LAB_KERNEL_SUITE", suite);
        }
        let status = build
            .status()
            .map_err(|e| anyhow::anyhow!("cannot run {LAB_SOURCES}/build.sh: {e}"))?;
        anyhow::ensure!(status.success(), "building the lab guest failed ({status})");
        console.line(format!(
            "lab: guest {} ready in {}",
            self.label(),
            secs(start.elapsed())
        ));
        self.built = true;
        Ok(())
    }

    /// Boots a guest that runs `picked` (the suites of one setup not yet run), with `packages`
    /// for it to install (the .deb) and `init` as its PID 1, and records what the guest reported in `results`. True when the guest
    /// started a suite (a guest that stops early is then worth booting again for the suites it
    /// did not start).
    fn boot(
        &mut self,
        picked: &[Picked],
        packages: Option<&Packages>,
        init: GuestInit,
        root: GuestRoot,
        results: &mut [SuiteResult],
        console: &mut Console,
    ) -> anyhow::Result<bool> {
        self.build(console)?;
        let root_arg = match root {
            GuestRoot::Host => String::new(),
            GuestRoot::Suite(suite) => node_root(suite, console)?,
        };
        let names: Vec<String> = picked.iter().map(Picked::name).collect();
        let script = self.script(&names, packages)?;
        let _remove_script = super::RemoveOnDrop::new(&script);
        let script_arg = script.to_str().filter(|s| !s.contains(char::is_whitespace));
        let script_arg = script_arg.ok_or_else(|| {
            anyhow::anyhow!("the lab needs a path without spaces: {}", script.display())
        })?;
        let mut label = self.label();
        if packages.is_some() {
            label.push_str(" +deb");
        }
        let mut init_arg = "";
        if init == GuestInit::Systemd {
            label.push_str(" +systemd");
            init_arg = " lab.init=systemd";
        }
        if let GuestRoot::Suite(suite) = root {
            label.push_str(&format!(" +{suite}"));
        }
        for p in picked {
            suite_result_mut(results, p.suite).guest = label.clone();
        }

        // The guest's whole life is bounded by `timeout` as well (--foreground keeps qemu in our
        // process group, so killing the test kills the guest), in case this process's own
        // watchdog could not stop it.
        let mut suites: Vec<&Suite> = picked.iter().map(|p| p.suite).collect();
        suites.dedup_by(|a, b| std::ptr::eq(*a, *b));
        let life =
            BOOT_BUDGET + SHUTDOWN_BUDGET + suites.iter().map(|s| budget(s)).sum::<Duration>();
        let memory = std::env::var("LAB_MEM").unwrap_or_else(|_| "2048".into());
        let cpus = std::env::var("LAB_CPUS")
            .unwrap_or_else(|_| suites.iter().map(|s| s.cpus).max().unwrap_or(1).to_string());
        let boot_start = Instant::now();
        // -nic none skips the network boot ROM.
        let mut qemu = Command::new("timeout")
            .args(["--foreground", "-k", "10"])
            .arg(life.as_secs().to_string())
            .args([
                "qemu-system-x86_64",
                "-accel",
                "tcg",
                "-m",
                &memory,
                "-smp",
                &cpus,
            ])
            .args(["-nographic", "-no-reboot", "-nic", "none"])
            .arg("-kernel")
            .arg(self.dir.join("vmlinuz"))
            .arg("-initrd")
            .arg(self.dir.join("initrd.gz"))
            .arg("-append")
            .arg(format!(
                "console=ttyS0 {KERNEL_ARGS}{init_arg}{root_arg} lab.cmd={script_arg}"
            ))
            .args([
                "-virtfs",
                "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start qemu-system-x86_64: {e}"))?;
        let serial = qemu
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("qemu has no stdout"))?;
        let watchdog = Watchdog::start(qemu.id(), boot_start + BOOT_BUDGET);

        let mut report = Report::default();
        for raw in BufReader::new(serial).split(b'\n') {
            let raw = raw?;
            let text = String::from_utf8_lossy(&raw);
            let text = text.trim_end_matches('\r');
            let now = boot_start.elapsed();
            report.watch_trouble(text, now);
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
            console.line(text);
            match report.observe(text, now, results) {
                Some(Event::SuiteStart(suite)) => {
                    watchdog.until(Instant::now() + budget(suite));
                }
                // until the next suite starts, or the guest powers off after the last
                Some(Event::SuiteDone) => watchdog.until(Instant::now() + SHUTDOWN_BUDGET),
                None => {}
            }
            if let Some(trouble) = &mut report.trouble {
                if trouble.lines.len() < TROUBLE_LINES {
                    trouble.lines.push(text.to_owned());
                }
                // The kernel prints its stacks right after the report; then the guest is useless.
                watchdog.stop_after(TROUBLE_GRACE);
            }
        }
        let status = qemu.wait()?;
        let expired = watchdog.expired();
        drop(watchdog);
        if !expired && report.trouble.is_none() && report.exit.is_none() {
            report.judge_reset(boot_start.elapsed(), results, console);
        }
        let boot = report.ready.map(secs).unwrap_or_else(|| "-".into());
        console.line(format!(
            "lab: guest {label}: boot {boot}, {} suites done, guest {} (qemu {status})",
            report.done.len(),
            secs(boot_start.elapsed())
        ));
        if report.ready.is_none() {
            let tail = report.early.len().saturating_sub(40);
            for line in &report.early[tail..] {
                console.line(format!("guest console: {line}"));
            }
        }
        self.failed_in_boot = report.ready.is_none() && report.trouble.is_some();
        let why = if let Some(trouble) = &report.trouble {
            format!(
                "the guest kernel reported {:?} after {}; the run was stopped within {} of it. \
                 What the kernel printed (stacks included):\n{}",
                trouble.kind,
                secs(trouble.at),
                secs(TROUBLE_GRACE),
                trouble.lines.join("\n")
            )
        } else if report.ready.is_none() {
            "the guest did not boot (no `lab: guest ready`)".to_owned()
        } else if expired {
            match report.current {
                Some((suite, _)) => format!(
                    "suite {} ran past its budget of {} (LAB_TIMEOUT overrides it), in {}; the \
                     guest was stopped",
                    suite.name,
                    secs(budget(suite)),
                    report.running.as_deref().unwrap_or("no test")
                ),
                None => "the guest stopped answering between suites".to_owned(),
            }
        } else if report.exit.is_none() {
            "the guest never reported its exit status (crash?)".to_owned()
        } else {
            String::new()
        };
        if let Some((suite, started)) = report.current {
            let r = suite_result_mut(results, suite);
            r.took = Some(boot_start.elapsed().saturating_sub(started));
            r.state = State::Stopped(if why.is_empty() {
                "the guest ended before the suite did".to_owned()
            } else {
                why.clone()
            });
        }
        if !why.is_empty() {
            console.line(format!("lab: FAILED: {why}"));
        }
        Ok(!report.done.is_empty() || report.current.is_some())
    }

    /// The script the guest runs (from the shared host root, never /run: the guest's is fresh):
    /// this binary with the tests' names, in the host's working directory, with the host's
    /// `LAB_*` settings (the guest starts from init's bare environment) and the packages.
    fn script(&self, names: &[String], packages: Option<&Packages>) -> anyhow::Result<PathBuf> {
        let exe = std::env::current_exe()?;
        // one per boot: guests of one kernel may run at once
        static BOOTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let boot = BOOTS.fetch_add(1, Ordering::SeqCst);
        let script = self
            .dir
            .join(format!("run-{}-{boot}.sh", std::process::id()));
        let mut settings: String = std::env::vars()
            .filter(|(name, _)| {
                name.starts_with("LAB_")
                    && name != "LAB_GUEST"
                    && !Packages::SETTINGS.contains(&name.as_str())
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
            .map(|(name, value)| format!("{name}={} ", quote(Path::new(&value))))
            .collect();
        if let Some(p) = packages {
            for (name, path) in Packages::SETTINGS
                .iter()
                .zip([&p.deb, &p.rpm, &p.rpm_upgrade])
            {
                settings.push_str(&format!("{name}={} ", quote(path)));
            }
        }
        let mut line = format!(
            "cd {} && {settings}LAB_GUEST=1 exec {}",
            quote(&std::env::current_dir()?),
            quote(&exe)
        );
        for name in names {
            line.push(' ');
            line.push_str(&quote(Path::new(name)));
        }
        std::fs::write(&script, format!("#!/bin/sh\n{line}\n"))?;
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(script)
    }
}

/// Prints each suite's result and the run's, libtest's last line included.
fn summary(results: &[SuiteResult], boots: usize, filtered: usize, took: Duration) -> ExitCode {
    println!("\nlab: results (times as the host saw them, guest boots not included)");
    for r in results {
        let verdict = match &r.state {
            State::Done if r.ok() => "ok".to_owned(),
            State::Done => format!("FAILED: {}", r.failed.join(", ")),
            State::Stopped(_) => "FAILED: its guest was stopped (above)".to_owned(),
            State::NotRun(why) => format!("FAILED: not run ({why})"),
            State::Waiting => "FAILED: not run".to_owned(),
        };
        println!(
            "lab:   {:<10} {:>3}/{:<3} passed  {:>9}  {:<28} {verdict}",
            r.suite.name,
            r.passed.len(),
            r.picked.len(),
            r.took.map(secs).unwrap_or_else(|| "-".into()),
            r.guest,
        );
    }
    let picked: usize = results.iter().map(|r| r.picked.len()).sum();
    let passed: usize = results.iter().map(|r| r.passed.len()).sum();
    let ok = results.iter().all(SuiteResult::ok);
    println!(
        "\ntest result: {}. {passed} passed; {} failed; 0 ignored; 0 measured; {filtered} \
         filtered out; finished in {} ({boots} guest boot{})\n",
        if ok { "ok" } else { "FAILED" },
        picked - passed,
        secs(took),
        if boots == 1 { "" } else { "s" }
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The guest kernel's command line. A soft lockup (a CPU spinning in the kernel for 10 s, twice
/// `watchdog_thresh`, before the RCU stall detector's 21 s) panics
/// after every CPU's backtrace is printed, and the panic ends QEMU at once (`panic=-1` reboots,
/// `-no-reboot` exits); an oops panics too. `loglevel=5` lets the backtraces (printed at the
/// default level) reach the console while informational chatter stays off it. Hung tasks are
/// reported by the kernel after `hung_task_timeout_secs` (set by the guest runner); its monitor
/// prints their stacks (see `guest::watch_kernel`). `mitigations=off`: the guest runs nothing but
/// the lab, and the speculative-execution mitigations (page-table isolation's flush at every
/// system call above all) cost emulated instructions: the pr suite took 99 s with them, 86 s
/// without.
const KERNEL_ARGS: &str = "mitigations=off loglevel=5 panic=-1 watchdog_thresh=5 \
     softlockup_panic=1 softlockup_all_cpu_backtrace=1 oops=panic";

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

/// Stops QEMU (through `timeout`, which forwards SIGTERM to it) when a deadline passes, from a
/// thread of its own: the console reader may be blocked on a silent guest. The deadline moves
/// with the suites (each has its budget); after kernel trouble it is a grace period away, and
/// stays there.
struct Watchdog {
    orders: mpsc::Sender<Order>,
    expired: Arc<AtomicBool>,
}

enum Order {
    Until(Instant),
    StopAfter(Duration),
}

impl Watchdog {
    fn start(pid: u32, first: Instant) -> Self {
        let (orders, received) = mpsc::channel::<Order>();
        let expired = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&expired);
        std::thread::spawn(move || {
            let mut deadline = first;
            let mut stopping = false;
            loop {
                let wait = deadline.saturating_duration_since(Instant::now());
                match received.recv_timeout(wait) {
                    Ok(Order::Until(until)) if !stopping => deadline = until,
                    Ok(Order::StopAfter(grace)) if !stopping => {
                        stopping = true;
                        deadline = Instant::now() + grace;
                    }
                    Ok(_) => {}
                    Err(RecvTimeoutError::Timeout) => {
                        flag.store(!stopping, Ordering::SeqCst);
                        if let Ok(pid) = i32::try_from(pid) {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid),
                                nix::sys::signal::Signal::SIGTERM,
                            );
                        }
                        return;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        });
        Watchdog { orders, expired }
    }

    fn until(&self, deadline: Instant) {
        let _ = self.orders.send(Order::Until(deadline));
    }

    fn stop_after(&self, grace: Duration) {
        let _ = self.orders.send(Order::StopAfter(grace));
    }

    /// True when a deadline (not kernel trouble) stopped the guest.
    fn expired(&self) -> bool {
        self.expired.load(Ordering::SeqCst)
    }
}

/// What one guest reported.
#[derive(Default)]
struct Report {
    ready: Option<Duration>,
    early: Vec<String>,
    /// The suite running and when it started (on the guest's clock as the host reads it).
    current: Option<(&'static Suite, Duration)>,
    /// The test running (its last `test … ok|FAILED` line not seen yet), for a budget overrun.
    running: Option<String>,
    done: Vec<&'static Suite>,
    exit: Option<i32>,
    trouble: Option<KernelTrouble>,
    /// A test that ends by resetting the guest (see [`RESET_EXPECTED`]), and the console from
    /// its announcement on.
    reset: Option<ExpectedReset>,
}

/// A booted node's test whose last act is the node's reset (a self-fence's reboot(2)) prints
/// `lab: reset expected: NAME|SECONDS|TEXT` as the last line before the act: the guest must then
/// reset within SECONDS, after a console line containing TEXT (the proof of what had to happen
/// before the reset). The host judges that test by the guest's end; it must be its guest's last.
const RESET_EXPECTED: &str = "lab: reset expected: ";

struct ExpectedReset {
    name: String,
    within: Duration,
    evidence: String,
    announced: Duration,
    seen: Option<Duration>,
    /// The kernel's own last words at a reset.
    restarting: bool,
}

enum Event {
    SuiteStart(&'static Suite),
    SuiteDone,
}

impl Report {
    /// The guest ended without an exit status: if a test announced this reset, it passes when
    /// the kernel restarted within the announced time after the announced evidence, and its
    /// suite is done when that was its last test; otherwise it fails, saying what was missing.
    fn judge_reset(&mut self, ended: Duration, results: &mut [SuiteResult], console: &mut Console) {
        let Some(reset) = self.reset.take() else {
            return;
        };
        let Some((suite, started)) = self.current else {
            return;
        };
        let after = ended.saturating_sub(reset.announced);
        let r = suite_result_mut(results, suite);
        let verdict = match reset.seen {
            _ if !reset.restarting => Err("the guest ended without the kernel's \"reboot: \
                                           Restarting system\""
                .to_owned()),
            None => Err(format!(
                "the guest reset without a console line containing {:?} first",
                reset.evidence
            )),
            Some(_) if after > reset.within => Err(format!(
                "the guest reset {} after the announcement, later than {}",
                secs(after),
                secs(reset.within)
            )),
            Some(seen) => Ok(seen.saturating_sub(reset.announced)),
        };
        match verdict {
            Ok(evidence) => {
                console.line(format!(
                    "test {} ... ok (the guest reset {} after the announcement, {:?} seen {} \
                     after it)",
                    reset.name,
                    secs(after),
                    reset.evidence,
                    secs(evidence)
                ));
                r.passed.push(reset.name);
            }
            Err(why) => {
                console.line(format!("---- {} ----\n{why}", reset.name));
                console.line(format!("test {} ... FAILED", reset.name));
                r.failed.push(reset.name);
            }
        }
        if r.passed.len() + r.failed.len() == r.picked.len() {
            r.took = Some(ended.saturating_sub(started));
            r.state = State::Done;
            self.done.push(suite);
            self.current = None;
            self.exit = Some(i32::from(!r.failed.is_empty()));
        }
    }

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

    /// Reads one line of the guest runner's (guest.rs) into `results`.
    fn observe(&mut self, line: &str, at: Duration, results: &mut [SuiteResult]) -> Option<Event> {
        if let Some(reset) = &mut self.reset {
            if reset.seen.is_none() && line.contains(&reset.evidence) {
                reset.seen = Some(at);
            }
            reset.restarting |= line.contains("reboot: Restarting system");
        }
        if let Some(spec) = line.strip_prefix(RESET_EXPECTED) {
            let mut parts = spec.splitn(3, '|');
            if let (Some(name), Some(Ok(within)), Some(evidence)) = (
                parts.next(),
                parts.next().map(str::parse::<u64>),
                parts.next(),
            ) {
                self.reset = Some(ExpectedReset {
                    name: name.to_owned(),
                    within: Duration::from_secs(within),
                    evidence: evidence.to_owned(),
                    announced: at,
                    seen: None,
                    restarting: false,
                });
            }
            return None;
        }
        if line.starts_with("lab: guest ready") {
            self.ready.get_or_insert(at);
        } else if let Some(code) = line.strip_prefix("LAB_EXIT=") {
            self.exit = code.trim().parse().ok();
        } else if let Some(name) = line.strip_prefix("lab: suite ") {
            let (name, what) = name.split_once(' ')?;
            let r = results.iter_mut().find(|r| r.suite.name == name)?;
            if what == "start" {
                self.current = Some((r.suite, at));
                return Some(Event::SuiteStart(r.suite));
            } else if what.starts_with("done") {
                let (suite, started) = self.current.take()?;
                r.took = Some(at.saturating_sub(started));
                r.state = State::Done;
                self.done.push(suite);
                return Some(Event::SuiteDone);
            }
        } else if let Some(rest) = line.strip_prefix("test ")
            && let Some((name, result)) = rest.split_once(" ... ")
        {
            self.running = None;
            let suite = name.split_once("::").map(|(s, _)| s)?;
            let r = results.iter_mut().find(|r| r.suite.name == suite)?;
            if result.starts_with("ok") {
                r.passed.push(name.to_owned());
            } else if result.starts_with("FAILED") {
                r.failed.push(name.to_owned());
            }
        } else if let Some(name) = line
            .strip_prefix("lab: test ")
            .and_then(|l| l.strip_suffix(" start"))
        {
            self.running = Some(name.to_owned());
        }
        None
    }
}

/// Cargo's target directory holding this test binary (it carries CACHEDIR.TAG), wherever
/// CARGO_TARGET_DIR put it.
/// The kernel arguments for a node root of Debian `suite` (tests/lab/init): built (or found in
/// its cache) by root.sh, and the host directories the guest must see in it: the checkout (the
/// tests' working directory and the lab's sources) and the build's target directory (the test
/// binary, prfence, the package, the guest's run script), each once.
fn node_root(suite: &str, console: &mut Console) -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let target = target_dir(&exe);
    let out = target.join(format!("lab-root-{suite}"));
    let start = Instant::now();
    let status = Command::new("bash")
        .arg(format!("{LAB_SOURCES}/root.sh"))
        .arg(&out)
        .arg(suite)
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run {LAB_SOURCES}/root.sh: {e}"))?;
    anyhow::ensure!(
        status.success(),
        "building the {suite} node root failed ({status})"
    );
    console.line(format!(
        "lab: {suite} node root ready in {}",
        secs(start.elapsed())
    ));
    let mut binds: Vec<PathBuf> =
        vec![std::env::current_dir()?, PathBuf::from(LAB_SOURCES), target];
    binds.sort();
    binds.dedup();
    let kept: Vec<&PathBuf> = binds
        .iter()
        .filter(|b| {
            !binds
                .iter()
                .any(|other| other != *b && b.starts_with(other))
        })
        .collect();
    let text = |p: &Path| {
        p.to_str()
            .filter(|s| !s.contains(|c: char| c.is_whitespace() || c == ':'))
            .map(str::to_owned)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the lab needs a path without spaces or colons: {}",
                    p.display()
                )
            })
    };
    let binds: Vec<String> = kept
        .iter()
        .map(|b| text(b))
        .collect::<anyhow::Result<_>>()?;
    Ok(format!(
        " lab.root={} lab.bind={}",
        text(&out.join("root"))?,
        binds.join(":")
    ))
}

fn target_dir(exe: &Path) -> PathBuf {
    exe.ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target")))
}

/// The packages of the binary under test: the .deb each package suite's guest installs, and the
/// .rpm at releases 1 and 2, which the systemd suite installs and upgrades with rpm.
#[derive(Clone)]
struct Packages {
    deb: PathBuf,
    rpm: PathBuf,
    rpm_upgrade: PathBuf,
}

impl Packages {
    /// The settings the guest finds them in, in the order of the fields.
    const SETTINGS: [&str; 3] = ["LAB_PACKAGE", "LAB_RPM", "LAB_RPM_UPGRADE"];
}

/// The packages of the binary under test, built by the packaging code itself (`cargo xtask deb
/// --binary`, then `rpm --binary`) in a thread of its own, so that
/// the guests that do not install them run meanwhile; removed when dropped.
struct PackageBuild {
    dir: PathBuf,
    building: Option<std::thread::JoinHandle<anyhow::Result<(Packages, Duration)>>>,
    built: Option<Packages>,
}

impl PackageBuild {
    fn start() -> Self {
        let exe = std::env::current_exe().unwrap_or_default();
        let dir = target_dir(&exe).join(format!("lab-package-{}", std::process::id()));
        let out = dir.clone();
        let building = std::thread::spawn(move || {
            let start = Instant::now();
            build_packages(&out).map(|built| (built, start.elapsed()))
        });
        PackageBuild {
            dir,
            building: Some(building),
            built: None,
        }
    }

    /// The packages, once built (waits for the build).
    fn wait(&mut self, console: &mut Console) -> anyhow::Result<Packages> {
        if let Some(building) = self.building.take() {
            let (built, took) = building
                .join()
                .map_err(|_| anyhow::anyhow!("the package build panicked"))??;
            console.line(format!(
                "lab: packages {}, {} and {} built in {} (beside the guests)",
                built.deb.display(),
                built.rpm.display(),
                built.rpm_upgrade.display(),
                secs(took)
            ));
            self.built = Some(built);
        }
        self.built
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the package build failed (above)"))
    }
}

impl Drop for PackageBuild {
    fn drop(&mut self) {
        if let Some(building) = self.building.take() {
            let _ = building.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Builds the packages into `dir` (`cargo xtask deb --binary PRFENCE --out DIR`,
/// then `rpm ... --release 1` and `2`; the .rpm's file list is compared with the .deb's there).
fn build_packages(dir: &Path) -> anyhow::Result<Packages> {
    let deb = xtask(&["deb", "--binary", super::PRFENCE, "--out"], dir, "deb")?;
    let rpm = |release: &str| {
        xtask(
            &[
                "rpm",
                "--binary",
                super::PRFENCE,
                "--release",
                release,
                "--out",
            ],
            dir,
            "rpm",
        )
    };
    Ok(Packages {
        deb,
        rpm: rpm("1")?,
        rpm_upgrade: rpm("2")?,
    })
}

/// `cargo xtask ARGS DIR`, which prints the package it built (extension `ext`) last; its output
/// is shown only when it fails: it runs while a guest's console is shown. At the guests' own
/// priority: a guest that installs the package waits for it (niced, with two guests busy, it
/// took 308 s in CI, most of it compiling xtask, which CI now builds with the tests).
fn xtask(args: &[&str], dir: &Path, ext: &str) -> anyhow::Result<PathBuf> {
    let out = Command::new(env!("CARGO"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("xtask")
        .args(args)
        .arg(dir)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run cargo xtask: {e}"))?;
    let command = format!("cargo xtask {} {}", args.join(" "), dir.display());
    anyhow::ensure!(
        out.status.success(),
        "{command} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .last()
        .map(PathBuf::from)
        .filter(|p| p.extension().is_some_and(|e| e == ext) && p.is_file())
        .ok_or_else(|| anyhow::anyhow!("{command} printed no .{ext}: {stdout}"))
}

/// Single-quotes a path for sh.
fn quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}
