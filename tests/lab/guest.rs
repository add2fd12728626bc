//! Guest side of a lab suite: run each test, tear its topology down whatever happened, and print
//! libtest-like lines the host parses.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::{TestFn, secs, topology};

/// True only inside the lab guest: the marker env var AND the lab's kernel command line. Teardown
/// removes iSCSI records and configfs objects, so it must never run on a real host.
pub fn inside() -> bool {
    std::env::var_os("LAB_GUEST").is_some_and(|v| v == "1")
        && std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| c.contains(" lab.cmd="))
}

/// Installs the .deb the host built (`LAB_PACKAGE`) as an admin would, and checks that dpkg
/// placed the binary and the fence agent's link.
pub fn install_package() -> anyhow::Result<()> {
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

pub fn run_tests(selected: &[(&'static str, TestFn)], total: usize) -> ExitCode {
    let start = Instant::now();
    watch_kernel();
    println!("\nrunning {} tests", selected.len());
    let mut failed = Vec::new();
    for (name, test) in selected {
        let test_start = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(test));
        // The topology's Drop already tore it down; this also catches anything a test leaked.
        let teardown = topology::teardown_all();
        let verdict = match (outcome, teardown) {
            (Ok(Ok(())), Ok(())) => Ok(()),
            (Ok(Err(e)), _) => Err(format!("{e:#}")),
            (Err(panic), _) => Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panicked".into())),
            (Ok(Ok(())), Err(e)) => Err(format!("teardown failed: {e:#}")),
        };
        match verdict {
            Ok(()) => println!("test {name} ... ok ({})", secs(test_start.elapsed())),
            Err(why) => {
                println!("---- {name} ----\n{why}");
                println!("test {name} ... FAILED ({})", secs(test_start.elapsed()));
                failed.push(*name);
            }
        }
    }
    let passed = selected.len() - failed.len();
    if !failed.is_empty() {
        println!("\nfailures:");
        for name in &failed {
            println!("    {name}");
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in {}\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        failed.len(),
        total - selected.len(),
        secs(start.elapsed())
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
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
