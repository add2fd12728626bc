//! Test support, never in a release build (the `test-support` feature, or the engine's own unit
//! tests): target models that answer like devices, so tests exercise the real codec and
//! execution policy. They are doubles for tests of logic; a PR behaviour is proven in the lab.
//!
//! - [`crate::spc_model`]: one SCSI logical unit's persistent reservations (SPC-4, LIO's quirks
//!   as switches).
//! - [`nvmet`]: one NVMe namespace's reservations as Linux nvmet keeps them.
//! - [`Cluster`]: N nodes × M LUs × paths over either model.
//! - [`ModelHost`]: the one `Host` double, a node whose storage is model devices.
//! - [`MemoryRecord`]: a node's record of its boot, in memory.

pub mod cluster;
pub mod host;
pub mod nvmet;
pub mod record;

pub use cluster::{Cluster, ClusterPath, Medium, Port, TargetModel};
pub use host::ModelHost;
pub use record::MemoryRecord;
