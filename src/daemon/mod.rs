//! `prfence agent`: the node daemon (sans-IO core; the driver is wired separately).
pub mod config;
mod shim;
pub mod watch;
