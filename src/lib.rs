//! prfence: SCSI-3 persistent reservation fencing.
//!
//! Data flow (one direction): intent → `ops` (decisions) → `pr` (pure codec) → `exec` (retry and
//! classification policy) → `transport` (SG_IO today) → verdicts → rendering.

pub mod atomic_file;
pub mod cli;
pub mod daemon;
pub mod discover;
pub mod exec;
pub mod fence_agent;
pub mod ops;
/// The PR codec, its own crate (`pr-codec`); re-exported so `prfence::pr::…` paths stay.
pub use pr_codec as pr;
pub mod process;
pub mod spc_model;
pub mod transport;

/// The most devices one request may name (the admin CLI's arguments, fence_pr's `devices`, the
/// agent's `[[device]]` list). Every device gets a worker thread and open file descriptors, so an
/// absurd list would exhaust threads or memory before the first command; 1024 is far above any
/// real cluster's shared LUs times their paths, and a larger set belongs in several requests.
pub const MAX_DEVICES: usize = 1024;
