//! `prfence agent --config FILE`: the node daemon, a sans-IO core and its tokio driver.
//!
//! The core is pure: observations and command completions go in together with the caller's
//! monotonic `now`, decisions and actions come out. The driver owns the devices, timers,
//! signals, the watchdog fd, sd_notify, logging and the metrics endpoint, and does nothing but
//! carry out what the core decides.
//!
//! Each folder holds one job; each mode's pure core is its folder's root module, its driver
//! (the I/O) a file beneath it:
//! - [`config`]: the TOML file, validated into [`config::Settings`], timing rules included;
//!   [`config::reference`]: every setting with its default, for the man page (tested against
//!   it). Pure; it knows nothing of the modes that read it.
//! - [`watch`]: watch mode, the replacement for `fence_scsi_check` under Pacemaker + fence_pr:
//!   the core ([`watch::WatchState`]), `watch::driver` (`WatchDriver`: the checks, what they
//!   keep between ticks), [`watch::key`] (our key in watch mode), `watch::own_initiators`.
//! - [`lease`]: lease mode, active/passive failover without a cluster manager: the core
//!   ([`lease::Lease`]), `lease::driver` (`LeaseDriver`), [`lease::commands`] (each lease
//!   action's PR commands, shared with the simulation), [`lease::epoch_file`].
//! - [`os`]: the edge to the system, without policy: [`os::watchdog`], [`os::notify`]
//!   (sd_notify), [`os::logging`], and the thread the self-fence hook runs on (never the
//!   blocking pool that hung paths hold).
//! - Shared by both modes, at the top: [`agent`] (the `Agent` both drivers borrow, without
//!   knowledge of either: self-fence, watchdog, publishing), `heal` (the heal both run),
//!   [`executor`] (bounded command execution), [`lu_table`] (the LU table over the engine's
//!   [`crate::host::Host`]), [`metrics`] (counters, gauges, a latency histogram and their
//!   Prometheus text), [`status`] (the state `/status` and the status file show, as JSON),
//!   [`status_file`], [`http`] (`/metrics`, `/status`), [`failure`]; [`crate::descriptors`]
//!   (the descriptor budget, checked at start).
//! - [`entry`]: the process (arguments, signals, and the one place the mode is dispatched).
//!
//! Module graph (an arrow: "uses"; no cycle, checked folder by folder):
//! `entry → {watch, lease} → {agent, heal} → {executor, status_file, os} → {lu_table, metrics}
//! → status → config`, and `entry → http → {metrics, status}`; the cores `watch` and `lease`
//! use only `failure` (and `status`, for lease's `Role`) of the rest.
//!
//! # Safety does not rest on time (P5)
//! Fencing is done by the storage target. Once a node's key is preempted (PREEMPT AND ABORT),
//! the target has removed its registrations on every I_T nexus, aborted its queued commands,
//! and answers each further write with RESERVATION CONFLICT. That holds whatever any node's
//! clock says, however late a node notices, and whether or not it ever runs its self-fence
//! action. Every timing rule below is therefore about *liveness and tidiness*: how fast a
//! fenced node stops its services, and that a lease holder stops before a standby takes over.
//! Each node measures only intervals on its own monotonic clock (`Instant`); no rule compares
//! timestamps of two nodes, and no wall clock is consulted for any decision.
//!
//! A preempted key is never registered again by the agent (P3): watch mode never registers
//! (registration belongs to fence_pr's unfencing) and heals a path only while our key is still
//! on the LU; lease mode makes every key from a fresh, never-reused epoch.
//!
//! # Timing rules
//! One table, [`config::timing::TIMING_RULES`]: each rule, why it exists and where it is
//! enforced; `Settings` runs its checks in the table's order, docs/agent.md shows it (a test
//! compares) and prfence-agent.toml(5) is generated from it. Two derivations the table only
//! states:
//! - watch mode: the watchdog is fed once a check ends while not fenced (also during the grace,
//!   or the watchdog would cut it short), and a check over hung paths ends only at its budget
//!   ([`config::check_budget`]), so the watchdog's timeout and the unit's `WatchdogSec` must
//!   exceed `check_interval` plus that budget.
//! - lease mode, `margin ≥ 2·ρ·lease` with ρ the largest rate error of a node's monotonic clock
//!   against true time (`clock_drift_ppm`; a crystal is within 100 ppm, the default allows
//!   1000): the holder's deadline, `lease − margin` on its clock, is at most
//!   `(lease − margin)/(1 − ρ)` true seconds; a standby preempts no earlier than `lease/(1 + ρ)`
//!   true seconds after it saw the key change, which is after the holder sent that renew. The
//!   margin must also cover the driver's wake-up lateness and the self-fence action's run time,
//!   so in practice choose seconds, not the milliseconds this formula gives.
//!
//! What the admin must still ensure: the service is stopped with the agent (`PartOf=` the agent's
//! unit), as a restarted holder's lease counts from the restart, not from its previous renew;
//! node ids differ on every node; the state file survives reboots (`StateDirectory=`).
//!
//! What the timing cannot promise, and does not need to: a VM frozen longer than `lease` may
//! resume believing its lease is valid: `Instant` is Linux `CLOCK_MONOTONIC`, which excludes
//! system suspend and may or may not advance while a VM is paused. Its next renew meets
//! RESERVATION CONFLICT and it self-fences; its writes in between are refused by the target.

pub mod agent;
pub mod config;
pub mod entry;
pub mod executor;
pub mod failure;
mod heal;
pub mod http;
pub mod lease;
pub mod lu_table;
pub mod metrics;
pub mod os;
pub mod status;
pub mod status_file;
pub mod watch;

#[cfg(test)]
mod tests;

/// Locks `m`, taking the data of a poisoned lock as it is: a panicked holder (a bug) must not
/// stop the agent's checks, watchdog feeding or self-fence.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
