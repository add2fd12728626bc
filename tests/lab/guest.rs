//! Guest side of a lab suite: run each test, tear its topology down whatever happened, and print
//! libtest-like lines the host parses.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::time::Instant;

use super::{TestFn, secs, topology};

/// True only inside the lab guest: the marker env var AND the lab's kernel command line. Teardown
/// removes iSCSI records and configfs objects, so it must never run on a real host.
pub fn inside() -> bool {
    std::env::var_os("LAB_GUEST").is_some_and(|v| v == "1")
        && std::fs::read_to_string("/proc/cmdline").is_ok_and(|c| c.contains(" lab.cmd="))
}

pub fn run_tests(selected: &[(&'static str, TestFn)], total: usize) -> ExitCode {
    let start = Instant::now();
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
