//! The fencing engine: everything between an operator's intent and the wire, with no front end.
//!
//! Data flow (one direction): `ops` (decisions: fence, unfence, status, heal) → `transport`
//! (the [`transport::PrTransport`] seam: PR operations on one path) → `exec` (its two
//! implementations, SCSI and NVMe, side by side: retry and classification policy) → `pr` (the
//! pure codec, its own crate) → `sg-io` and `nvme-io` (the ioctls). `discover` finds the paths
//! and LUs the operations run on (a leaf: sysfs in, LUs out); `process` runs bounded helpers;
//! `keys` derives every scheme's reservation keys; `hints` is what each front end advises per
//! kind of failure; `atomic_file` is how every file is written;
//! `runtime` is the engine's clock, sleeps and threads; `host` is the node as the front ends use
//! it (discovery, opening paths, corosync, helpers, sleep, reboot).

pub mod atomic_file;
pub mod discover;
pub mod exec;
pub mod hints;
pub mod host;
pub mod keys;
pub mod ops;
/// The PR codec, its own crate (`pr-codec`); re-exported so `crate::pr::…` paths read naturally.
pub use pr_codec as pr;
pub mod process;
pub mod runtime;
#[cfg(any(test, feature = "test-support"))]
pub mod spc_model;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod transport;
pub mod whoami;

/// The most devices one request may name (the admin CLI's arguments, fence_pr's `devices`, the
/// agent's `[[device]]` list). Every device gets a worker thread and open file descriptors, so an
/// absurd list would exhaust threads or memory before the first command; 1024 is far above any
/// real cluster's shared LUs times their paths, and a larger set belongs in several requests.
pub const MAX_DEVICES: usize = 1024;
