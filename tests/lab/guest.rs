//! Guest side of a lab run: run each test the host named, tear its topology down whatever
//! happened, and print libtest-like lines the host parses.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::plan::{self, Suite, TestFn};
use super::{WORK, residue, secs, topology};

/// True only inside the lab guest: the marker env var AND the lab's kernel command line. Teardown
/// removes iSCSI records and configfs objects, so it must never run on a real host.
pub fn inside() -> bool {
    std::env::var_os("LAB_GUEST").is_some_and(|v| v == "1")
        && std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| c.contains(" lab.cmd="))
}

/// Installs the .deb the host built (`LAB_PACKAGE`) as an admin would, and checks that dpkg
/// placed the binary and the fence agent's link.
fn install_package() -> anyhow::Result<()> {
    let deb = std::env::var("LAB_PACKAGE")
        .map_err(|_| anyhow::anyhow!("LAB_PACKAGE is not set: the host built no package"))?;
    let start = Instant::now();
    // man-db's dpkg trigger rebuilds the whole manual database, minutes under emulation; the
    // file that enables it is removed from the guest's overlay only.
    let _ = std::fs::remove_file("/var/lib/man-db/auto-update");
    // --force-confold: a prfence configuration in the host's /etc (seen through the guest's
    // overlay) is kept, as an upgrade keeps a conffile.
    super::run("dpkg", ["-i", "--force-confold", &deb])?.ok()?;
    let owner = super::run("dpkg", ["-S", super::INSTALLED_FENCE_PR])?.ok()?;
    anyhow::ensure!(
        owner.stdout.starts_with("prfence:"),
        "{} is not the package's: {}",
        super::INSTALLED_FENCE_PR,
        owner.stdout
    );
    let target = std::fs::canonicalize(super::INSTALLED_FENCE_PR)?;
    anyhow::ensure!(
        target == std::path::Path::new(super::INSTALLED_PRFENCE),
        "{} leads to {}, not {}",
        super::INSTALLED_FENCE_PR,
        target.display(),
        super::INSTALLED_PRFENCE
    );
    println!(
        "lab: installed {deb} ({}; {} -> prfence)",
        secs(start.elapsed()),
        super::INSTALLED_FENCE_PR
    );
    Ok(())
}

/// Runs the tests named by `names` (`suite::test`, in the order the host gave), suite after
/// suite, and prints what the host parses: `lab: suite NAME start`, a libtest-like line per test
/// (`test NAME ... ok|FAILED`), `lab: suite NAME done`. A suite with [`Suite::package`] first has
/// the package installed (once per guest). Exits 1 when a test failed.
pub fn run(suites: &'static [Suite], names: &[String]) -> ExitCode {
    let start = Instant::now();
    watch_kernel();
    let mut picked = Vec::new();
    for name in names {
        match plan::find(suites, name) {
            Some(pick) => picked.push(pick),
            None => {
                println!("lab: FAILED: the guest knows no test {name:?}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("\nrunning {} tests", picked.len());
    let mut failed = Vec::new();
    let mut installed = false;
    for group in picked.chunk_by(|a, b| std::ptr::eq(a.suite, b.suite)) {
        let suite = group[0].suite;
        let suite_start = Instant::now();
        println!("lab: suite {} start", suite.name);
        if suite.package && !installed {
            if let Err(e) = install_package() {
                println!("lab: FAILED: installing the package: {e:#}");
                return ExitCode::FAILURE;
            }
            installed = true;
        }
        let mut suite_failed = 0;
        for pick in group {
            let name = pick.name();
            println!("lab: test {name} start");
            match run_one(pick.test.run) {
                (Ok(()), took) => println!("test {name} ... ok ({})", secs(took)),
                (Err(why), took) => {
                    println!("---- {name} ----\n{why}");
                    println!("test {name} ... FAILED ({})", secs(took));
                    failed.push(name);
                    suite_failed += 1;
                }
            }
        }
        println!(
            "lab: suite {} done: {} passed, {suite_failed} failed in {}",
            suite.name,
            group.len() - suite_failed,
            secs(suite_start.elapsed())
        );
    }
    if !failed.is_empty() {
        println!("\nfailures:");
        for name in &failed {
            println!("    {name}");
        }
    }
    println!(
        "\nin the guest: {} passed; {} failed; finished in {}\n",
        picked.len() - failed.len(),
        failed.len(),
        secs(start.elapsed())
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs one test in an empty [`WORK`] directory, then tears down whatever topology is left (the
/// topology's Drop already did; this also catches anything a test leaked), removes [`WORK`], and
/// checks that the test left nothing else behind ([`residue`]); returns its verdict and how long
/// it took.
fn run_one(test: TestFn) -> (Result<(), String>, Duration) {
    let work = Path::new(WORK);
    let _ = std::fs::remove_dir_all(work);
    if let Err(e) = std::fs::create_dir_all(work) {
        return (Err(format!("mkdir {WORK}: {e}")), Duration::ZERO);
    }
    let before = residue::Snapshot::take();
    let start = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(test));
    let teardown = topology::teardown_all();
    let took = start.elapsed();
    let _ = std::fs::remove_dir_all(work);
    let left = before.compare();
    let mut why = Vec::new();
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => why.push(format!("{e:#}")),
        Err(panic) => why.push(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panicked".into()),
        ),
    }
    if let Err(e) = teardown {
        why.push(format!("teardown failed: {e:#}"));
    }
    if let Err(left) = left {
        why.push(left);
    }
    let verdict = if why.is_empty() {
        Ok(())
    } else {
        Err(why.join("\n"))
    };
    (verdict, took)
}

/// Kernel messages by which the guest kernel says a task hangs or the kernel broke.
const KERNEL_TROUBLE: &[&str] = &[
    " blocked for more than ",
    "BUG: ",
    "Oops: ",
    "general protection fault",
    "detected stall",
];
/// How long the monitor relays every kernel message after trouble: the stacks follow the report.
const RELAY_AFTER_TROUBLE: Duration = Duration::from_secs(5);

/// Starts a thread that reads the kernel log (`/dev/kmsg`, every level) and, when the kernel
/// reports a hung task, an oops or a lock-up, prints `lab: kernel trouble: …` and relays everything
/// the kernel logs for a few seconds, stacks included, after asking for every blocked task's and
/// every CPU's backtrace (sysrq w, l). The console itself shows only warnings and worse, and a
/// hung task's stack is logged below that. The host ends the run on that line (host.rs).
fn watch_kernel() {
    let kmsg = match std::fs::File::open("/dev/kmsg") {
        Ok(f) => f,
        Err(e) => {
            println!("lab: cannot read /dev/kmsg ({e}): hung tasks will show without stacks");
            return;
        }
    };
    // Long enough for SCSI error recovery under emulation, short enough to end a hung run soon.
    let _ = std::fs::write("/proc/sys/kernel/hung_task_timeout_secs", "60");
    std::thread::spawn(move || {
        use std::io::{Read, Seek, SeekFrom};
        let mut kmsg = kmsg;
        // Only what happens from now on: the boot log is not news.
        let _ = kmsg.seek(SeekFrom::End(0));
        let mut relay_until: Option<Instant> = None;
        let mut record = vec![0u8; 8192];
        loop {
            // One read returns one record: "prio,seq,usec,flags;text\n".
            let n = match kmsg.read(&mut record) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue, // overwritten: skip
                Err(_) => return,
            };
            let text = String::from_utf8_lossy(record.get(..n).unwrap_or_default());
            let message = text.split_once(';').map_or(&*text, |(_, m)| m).trim_end();
            if relay_until.is_none() && KERNEL_TROUBLE.iter().any(|p| message.contains(p)) {
                println!("lab: kernel trouble: {message}");
                relay_until = Some(Instant::now() + RELAY_AFTER_TROUBLE);
                let _ = std::fs::write("/proc/sysrq-trigger", "w");
                let _ = std::fs::write("/proc/sysrq-trigger", "l");
            }
            match relay_until {
                Some(until) if Instant::now() < until => println!("kernel: {message}"),
                _ => {}
            }
        }
    });
}
