//! Long mutual-fence races, not run by `cargo test` (its target has `test = false`): the stress
//! behind issue #8, and the bare PREEMPT races that show why LIO can lock up. Run as root:
//!
//!     cargo test --test lab_stress -- mutual_fence      # prfence fence from both nodes at once
//!     cargo test --test lab_stress -- raw_preempts      # bare PREEMPTs: hangs an affected LIO
//!
//! `LAB_STRESS_ROUNDS` (default 500), `LAB_STRESS_LUNS` (mutual_fence, default 8; 1 works),
//! `LAB_STRESS_FABRIC` (`iscsi`, the default, or `tcm_loop`: one LU, raw_preempts only),
//! `LAB_STRESS_PREEMPT` (raw_preempts: `both-abort`, the default, `both-plain` or `one-abort`).
//! With `LAB_KERNEL_SUITE=unstable` the guest runs that suite's newer kernel.

use std::time::Duration;

use crate::Topology;
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::race::{self, Preempts};
use anyhow::ensure;

pub const SUITE: Suite = Suite {
    name: "stress",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(60 * 60),
    usual: Duration::from_secs(1200),
    tests: &[],
    long: crate::tests![mutual_fence],
    reproducers: crate::tests![raw_preempts],
};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// `prfence fence` from both nodes at the same moment, `LAB_STRESS_ROUNDS` times over iSCSI.
fn mutual_fence() -> anyhow::Result<()> {
    let rounds = crate::env_count("LAB_STRESS_ROUNDS", 500)?;
    let luns = crate::env_count("LAB_STRESS_LUNS", 8)?;
    ensure!(
        env_or("LAB_STRESS_FABRIC", "iscsi") == "iscsi",
        "mutual_fence runs over iSCSI: on tcm_loop (Linux 6.1 and 7.2) PREEMPT AND ABORT never completes"
    );
    let t = Topology::iscsi(luns)?;
    t.settle()?;
    let mut stats = race::mutual_fence(&t, rounds)?;
    println!(
        "  stress: {rounds} mutual fences over {luns} LUs (iSCSI), no lock-up: {}",
        stats.summary()
    );
    Ok(())
}

/// Bare PREEMPTs of each other's key from both nodes at once, on one LU.
fn raw_preempts() -> anyhow::Result<()> {
    let rounds = crate::env_count("LAB_STRESS_ROUNDS", 500)?;
    let mode = Preempts::parse(&env_or("LAB_STRESS_PREEMPT", "both-abort"))?;
    let fabric = env_or("LAB_STRESS_FABRIC", "iscsi");
    let t = match fabric.as_str() {
        "iscsi" => Topology::iscsi(1)?,
        "tcm_loop" => Topology::tcm_loop()?,
        _ => anyhow::bail!("LAB_STRESS_FABRIC is iscsi or tcm_loop, not {fabric:?}"),
    };
    t.settle()?;
    let mut stats = race::raw_preempts(&t, rounds, mode)?;
    println!(
        "  stress: {rounds} raw {mode:?} races on {fabric}, no lock-up: {}",
        stats.summary()
    );
    Ok(())
}
