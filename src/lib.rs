//! prfence: SCSI-3 persistent reservation fencing — the three front ends over the engine.
//!
//! The engine (`prfence-engine`: `ops`, `transport`, `exec`, `discover`, `host`, `keys`,
//! `process`, `atomic_file`) and the codec (`pr-codec`, as `pr`) are their own crates, re-exported here so
//! every front end names them as `crate::ops`, `crate::pr`…. The front ends: `cli` (the admin
//! command), `fence_agent` (fence_pr, the Pacemaker agent), `daemon` (`prfence agent`); beside
//! them `descriptors`, the descriptor limit each of them raises to fit the LU paths it opens, and
//! `worker`, the process edge that lets a one-shot command exit at its verdict while a command
//! of its is stuck in the kernel.

pub mod cli;
pub mod daemon;
pub mod descriptors;
pub mod fence_agent;
pub mod worker;

pub use prfence_engine::{
    MAX_DEVICES, atomic_file, discover, exec, hints, host, keys, ops, pr, process, transport,
    whoami,
};
/// The target models and the model host: only for tests (the engine's `test-support` feature).
#[cfg(test)]
pub use prfence_engine::{spc_model, testing};
