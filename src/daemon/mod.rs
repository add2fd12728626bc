//! `prfence agent` (placeholder docs, replaced below)
pub mod config;
pub mod lease;
mod shim;
pub mod watch;
