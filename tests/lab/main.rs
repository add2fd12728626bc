//! The lab: a QEMU guest running Debian's kernel with LIO (and nvmet) as a real persistent
//! reservation target, two initiator "nodes" (A and B) and oracles that read the target's own
//! state.
//!
//! One test binary (`cargo test --test lab`, `harness = false`) holds every suite
//! (`suites/<name>.rs`, listed in [`suites::ALL`]). It runs twice: on the host it picks the tests
//! (libtest's filters on `suite::test` names), builds the guests (`build.sh`, cached under
//! `<target>/lab`), boots one guest per kernel with this very binary as its command, and relays the
//! console; inside the guest (env `LAB_GUEST=1`) it runs the tests it was given, suite after suite,
//! each test on a fresh topology, and prints `test NAME ... ok|FAILED`. See host.rs and guest.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent;
mod command;
#[path = "../common/doc_blocks.rs"]
#[allow(dead_code)] // each test binary uses part of it
mod doc_blocks;
mod fence_agents;
mod floor;
mod guest;
mod host;
mod kernel_log;
mod multipathd;
mod node;
mod nvme;
mod plan;
mod race;
mod residue;
mod suites;
mod topology;
mod udevd;
mod writer;

pub use command::{
    CommandRun, KillOnDrop, RemoveOnDrop, env_count, is_mount, prfence, prfence_with_devices,
    read_file, reap_or_kill, run, run_command, secs, sh, write_file,
};
pub use node::Node;
pub use topology::{
    BLOCK_SIZE, TargetHolder, TargetLu, Topology, WriteOutcome, block_data, block_text, write_to,
};
pub use writer::{Writer, write_number};

use std::process::ExitCode;

/// The prfence binary under test (also `fence_pr` through a link named so).
pub const PRFENCE: &str = env!("CARGO_BIN_EXE_prfence");
/// The running test's scratch space on the guest's tmpfs (configs, logs, status and state files):
/// the guest runner makes it empty before each test and removes it after, so that nothing a test
/// writes there is found by the next.
pub const WORK: &str = "/run/lab-work";
/// The installed prfence (in a suite with [`plan::Suite::package`]).
pub const INSTALLED_PRFENCE: &str = "/usr/sbin/prfence";
/// The installed fence agent: the package's link to [`INSTALLED_PRFENCE`].
pub const INSTALLED_FENCE_PR: &str = "/usr/sbin/fence_pr";

/// On the host: runs the tests the arguments select (`--list` lists them), one guest per kernel.
/// In the guest: runs the tests named by the arguments. This binary is also lab_agent's writer
/// process (see [`suites::agent::writer_main`]).
fn main() -> ExitCode {
    if let Some(code) = suites::agent::writer_main() {
        return code;
    }
    if let Some(code) = floor::floor_main() {
        return code;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if guest::inside() {
        return guest::run(suites::ALL, &args);
    }
    let args = plan::Args::parse(args);
    if args.list {
        args.print_list(suites::ALL);
        return ExitCode::SUCCESS;
    }
    let (picked, filtered) = args.select(suites::ALL);
    host::run(&picked, filtered)
}
