//! `prfence agent` (placeholder docs, replaced below)
pub mod config;
pub mod lease;
pub mod metrics;
mod shim;
pub mod watch;
