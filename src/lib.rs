//! prfence: SCSI-3 persistent reservation fencing.
//!
//! Data flow (one direction): intent → `ops` (decisions) → `pr` (pure codec) → `exec` (retry and
//! classification policy) → `transport` (SG_IO today) → verdicts → rendering.

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
