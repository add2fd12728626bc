//! The `prfence` admin command line: argument definitions, per-device execution and rendering.
//!
//! Every command takes one or more devices and runs on all of them concurrently; results are
//! reported in argument order, as text or (with `--json`) one JSON array.

mod args;
mod doctor;
mod fencing;
mod hints;
mod progress;
mod render;
mod run;

#[cfg(test)]
mod output_tests;

pub use args::{Cli, Cmd};
pub use run::{ExitStatus, execute};
