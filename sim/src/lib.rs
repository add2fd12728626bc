//! The deterministic simulation of prfence's fencing (issue 19): several nodes run the engine's
//! own operations, unchanged, on the target models (SPC-4, LIO's quirks, Linux nvmet), while a
//! scheduler decides which command reaches the target next, when time moves on, and which
//! commands fail; after every step the safety properties are checked on the models' own state
//! ([`check`]). A run is a pure function of its scenario and its picks, so every failure replays.
//!
//! - [`sched`]: the scheduler (simulated threads, simulated time, per-node clocks).
//! - [`world`]: the simulated cluster, its gated devices, writers and log.
//! - [`scenario`]: what a run sets up, drawn from a seed, with a text form.
//! - [`check`]: P1–P4 on the target's state (P5: the clocks run at different rates).
//! - [`explore`]: running, the schedule choosers (random, PCT, exhaustive, replay), shrinking,
//!   and the timeline of a counterexample.
//!
//! `cargo run -p prfence-sim --release -- help` lists the commands (long runs, replay).

// The simulation is test code: a broken expectation of its own is a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod check;
pub mod explore;
pub mod rng;
pub mod scenario;
pub mod sched;
pub mod world;

#[cfg(test)]
mod tests;
