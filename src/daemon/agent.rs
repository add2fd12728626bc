//! The services both modes of `prfence agent` share, without knowledge of either mode:
//! [`Agent`] holds the settings, host, executor, LU table, metrics and status, notifier,
//! watchdog and self-fence; each mode's driver borrows it and owns its own state:
//! `watch::driver::WatchDriver` (what the checks keep between ticks), `lease::driver::LeaseDriver`
//! (reservation type, epoch store). Which driver runs is decided in one place,
//! [`super::entry::run`]; the process (arguments, signals, the metrics server) is
//! [`super::entry`] too.
//!
//! Everything a test needs to replace is injected through [`AgentParts`]: the [`Host`] (discovery,
//! device opening, the self-fence hook, reboot; the SPC model in unit tests), the sd_notify
//! target, the sysfs root of the watchdog check, and the [`Control`] channel that stands in for
//! signals.
//!
//! Exit statuses of `prfence agent`: 0 stopped by SIGTERM (or `--once`/`--check-config` found
//! nothing wrong), 1 could not start or run (devices, key, state file, watchdog, port), 2 invalid
//! configuration or arguments, 3 `--once` found a problem, `self_fence.exit_status` (default 86)
//! fenced.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::config::Settings;
use super::executor::Executor;
use super::lock;
use super::lu_table::{LuTable, PathHandle};
use super::metrics::Metrics;
use super::os::hook_thread::{HookError, HookThread};
use super::os::logging::LogHandle;
use super::os::notify::Notifier;
use super::os::watchdog::{Pinned, Watchdog};
use super::status::{
    HookStep, RebootStep, SelfFenceSteps, State, Status, WatchdogState, WatchdogStatus,
    WatchdogStep,
};
use super::status_file::{self, StatusFile};
use crate::host::Host;
use crate::ops::LuSet;
use crate::pr::{Key, PrOut, PrOutAction};
use crate::transport::Command;

/// Exit status: a runtime failure (start-up included).
pub const EXIT_FAILURE: u8 = 1;
/// Exit status: the configuration or the arguments are invalid.
pub const EXIT_CONFIG: u8 = 2;
/// Exit status: `--once` found a problem.
pub const EXIT_ONCE_PROBLEM: u8 = 3;

/// How often the watchdogs are fed while the agent waits for something other than a check (the
/// self-fence hook, the unregistering at a stop): well within the shortest timeout either may
/// have (1 s). The hardware one is fed only after a self-fence with `stop_watchdog` off.
const WAIT_FEED_INTERVAL: Duration = Duration::from_millis(500);

/// What the signal handlers (or a test) ask of a running agent.
#[derive(Debug)]
pub enum Control {
    /// SIGHUP: the re-read, validated configuration.
    Reload(Box<Settings>),
    /// SIGTERM / SIGINT: stop cleanly.
    Stop,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Stopped on request.
    Stopped,
    /// Fenced, and `self_fence.exit` says to exit with this status.
    Fenced { exit_status: u8 },
    /// Could not start or continue.
    Failed(String),
}

impl RunEnd {
    pub fn exit_status(&self) -> u8 {
        match self {
            RunEnd::Stopped => 0,
            RunEnd::Fenced { exit_status } => *exit_status,
            RunEnd::Failed(_) => EXIT_FAILURE,
        }
    }
}

/// The injectable parts of an agent.
pub struct AgentParts {
    /// Discovery, device opening, the self-fence hook and reboot (the SPC model in unit tests).
    pub host: Arc<dyn Host>,
    pub notifier: Notifier,
    /// Written after every check (see [`super::status`]).
    pub status_file: Option<PathBuf>,
    /// `/sys` on a node; the watchdog's timeout is read below it.
    pub sys_root: PathBuf,
    pub log: Option<LogHandle>,
    /// The watchdog as checked at start ([`super::os::watchdog::pin`]); `None` opens
    /// `watchdog.device` as configured (unit tests' stand-in files).
    pub watchdog_pin: Option<Pinned>,
    /// Where a watchdog not pinned at start (its driver not loaded yet) is judged once it
    /// appears, before it is opened: `/dev` on a node; `None` opens `watchdog.device` unjudged
    /// (unit tests' stand-in files).
    pub watchdog_dev: Option<PathBuf>,
}

/// A running agent: settings, devices and everything the loops share.
pub struct Agent {
    pub(super) settings: Settings,
    pub(super) host: Arc<dyn Host>,
    pub(super) exec: Arc<Executor>,
    pub(super) table: LuTable,
    pub(super) metrics: Arc<Mutex<Metrics>>,
    pub(super) status: Arc<Mutex<Status>>,
    pub(super) notifier: Notifier,
    status_file: Option<Mutex<StatusFile>>,
    pub(super) sys_root: PathBuf,
    watchdog: Option<Watchdog>,
    watchdog_pin: Option<Pinned>,
    watchdog_dev: Option<PathBuf>,
    log: Option<LogHandle>,
    pub(super) control: mpsc::UnboundedReceiver<Control>,
    /// Latched once the self-fence actions ran.
    fenced: bool,
    /// Latched by the self-fence: the watchdog is no longer fed (`self_fence.stop_watchdog`, or
    /// a reboot that failed).
    stop_feeding: bool,
    /// Descriptors held for the self-fence, released when it starts.
    reserve: DescriptorReserve,
    /// The thread the self-fence hook runs on (`self_fence.command`, now or after a reload).
    hook: HookThread,
}

/// Descriptors kept open from the start (on /dev/null) and closed when the self-fence starts, so
/// its status writes and the hook's spawn find free descriptors even when LU paths (or anything
/// else) used up `LimitNOFILE` meanwhile.
#[derive(Debug)]
pub(super) struct DescriptorReserve(Vec<std::fs::File>);

impl DescriptorReserve {
    /// What the self-fence needs at most: the status file (temporary + directory, 2) and the
    /// hook's spawn (/dev/null, two pipes with both ends, std's exec-error pipe: 7), doubled.
    pub(super) const SIZE: usize = 18;

    pub(super) fn take(count: usize) -> DescriptorReserve {
        let held: Vec<std::fs::File> = (0..count)
            .map_while(|_| std::fs::File::open("/dev/null").ok())
            .collect();
        if held.len() < count {
            tracing::warn!(
                held = held.len(),
                wanted = count,
                "cannot reserve descriptors for the self-fence; raise LimitNOFILE"
            );
        }
        DescriptorReserve(held)
    }

    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.0.len()
    }

    /// Closes the reserved descriptors, for the self-fence to use.
    pub(super) fn release(&mut self) {
        self.0.clear();
    }
}

/// Whether this process's descriptors fit the paths of `table` (as its last refresh found them),
/// raising the soft limit where the hard one allows ([`crate::descriptors::fit`]): an agent that
/// would run out could never read all its LUs. The error names the `LimitNOFILE=` to set.
pub(super) fn descriptors_fit(table: &LuTable) -> Result<(), String> {
    let (lus, paths) = table.size();
    crate::descriptors::fit(lus, paths).map(drop).map_err(|e| {
        format!(
            "{e}: {}, or watch fewer LUs",
            e.raise_in("prfence-agent.service")
        )
    })
}

impl Agent {
    /// What a reload that lists `devices` would need: their paths found now (sysfs only) against
    /// the descriptors, as the start checks them ([`descriptors_fit`]).
    pub(super) async fn devices_fit(
        &self,
        devices: &[super::config::DeviceSettings],
    ) -> Result<(), String> {
        let mut table = LuTable::new(devices);
        table.refresh(&self.host, self.check_deadline()).await;
        descriptors_fit(&table)
    }

    pub fn new(
        settings: Settings,
        options: AgentParts,
        control: mpsc::UnboundedReceiver<Control>,
    ) -> std::io::Result<Agent> {
        // Started whatever the configuration says: a reload may add `self_fence.command`, and
        // the hook must then run (an idle thread costs a stack, nothing else).
        let hook = HookThread::start(Arc::clone(&options.host))?;
        let names: Vec<String> = settings.devices.iter().map(|d| d.name.clone()).collect();
        let metrics = Arc::new(Mutex::new(Metrics::new(names.clone())));
        let mut shown = Status::new(settings.mode.name(), &settings.devices);
        shown.boot_id = status_file::boot_id();
        if settings.watchdog.is_some() {
            shown.watchdog.state = WatchdogState::NotArmed;
            lock(&metrics).set_watchdog(WatchdogState::NotArmed);
        }
        Ok(Agent {
            exec: Arc::new(Executor::new(
                Arc::clone(&options.host),
                settings.command_timeout,
                Arc::clone(&metrics),
            )),
            table: LuTable::new(&settings.devices),
            status: Arc::new(Mutex::new(shown)),
            metrics,
            settings,
            host: options.host,
            notifier: options.notifier,
            status_file: options.status_file.map(|p| Mutex::new(StatusFile::new(p))),
            sys_root: options.sys_root,
            watchdog: None,
            watchdog_pin: options.watchdog_pin,
            watchdog_dev: options.watchdog_dev,
            log: options.log,
            control,
            fenced: false,
            stop_feeding: false,
            reserve: DescriptorReserve::take(DescriptorReserve::SIZE),
            hook,
        })
    }

    pub fn metrics(&self) -> Arc<Mutex<Metrics>> {
        Arc::clone(&self.metrics)
    }

    pub fn status(&self) -> Arc<Mutex<Status>> {
        Arc::clone(&self.status)
    }

    /// Whether the self-fence actions ran (latched; the drivers only read it).
    pub(super) fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// Opens the configured watchdog, if any and not open yet (which starts it). A failure is
    /// shown as a degraded watchdog (status, metrics) and returned.
    pub(super) fn open_watchdog(&mut self) -> Result<(), String> {
        if let (Some(settings), None) = (&self.settings.watchdog, &self.watchdog) {
            // Not there at start: judged now, as the start would have, before it is opened.
            if let (None, Some(dev)) = (&self.watchdog_pin, &self.watchdog_dev) {
                match super::os::watchdog::pin(&settings.device, dev, &self.sys_root) {
                    Ok(pin) => self.watchdog_pin = Some(pin),
                    Err(e) => {
                        let e = e.to_string();
                        self.set_watchdog(WatchdogState::Degraded, Some(e.clone()));
                        return Err(e);
                    }
                }
            }
            let (device, expect) = match &self.watchdog_pin {
                Some(pin) => (pin.path.as_path(), Some(pin.id)),
                None => (settings.device.as_path(), None),
            };
            let watchdog = match Watchdog::open(device, settings.timeout, &self.sys_root, expect) {
                Ok(watchdog) => watchdog,
                Err(e) => {
                    let e = e.to_string();
                    self.set_watchdog(WatchdogState::Degraded, Some(e.clone()));
                    return Err(e);
                }
            };
            tracing::info!(device = %settings.device.display(), timeout = ?settings.timeout, "watchdog armed");
            self.watchdog = Some(watchdog);
            self.set_watchdog(WatchdogState::Ok, None);
        }
        Ok(())
    }

    /// When a check started now must end: its budget ([`super::config::check_budget`]) away.
    pub(super) fn check_deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + super::config::check_budget(self.settings.command_timeout)
    }

    /// Watch mode, at every check once armed: opens the watchdog if it is configured but not
    /// open (a failed open stays a visible degraded state and is tried again next check).
    pub(super) fn retry_watchdog(&mut self) {
        if !self.fenced {
            // The failure is already shown and logged (once) by open_watchdog.
            let _ = self.open_watchdog();
        }
    }

    /// Shows the watchdog's state in the status and metrics; logs a change once (an error
    /// again only when its text changes).
    pub(super) fn set_watchdog(&self, state: WatchdogState, error: Option<String>) {
        let mut status = lock(&self.status);
        let before = status.watchdog.clone();
        let now = WatchdogStatus { state, error };
        if before == now {
            return;
        }
        match (&before.state, &now.state) {
            (_, WatchdogState::Degraded) => tracing::error!(
                error = now.error.as_deref().unwrap_or(""),
                "the watchdog is degraded: no hardware reset backs this agent; retrying at \
                 every check"
            ),
            (WatchdogState::Degraded, _) => tracing::info!("the watchdog works again"),
            _ => {}
        }
        status.watchdog = now;
        drop(status);
        lock(&self.metrics).set_watchdog(state);
    }

    /// Feeds the watchdog if `healthy`, or after fencing unless the self-fence stopped the
    /// feeding ([`Agent::stop_feeding`]). A failed feed shows the watchdog degraded; the next
    /// check feeds again. The sd_notify watchdog is fed on every check: it is about this
    /// process being alive.
    pub(super) fn feed(&mut self, healthy: bool) {
        let feed = if self.fenced {
            !self.stop_feeding
        } else {
            healthy
        };
        if feed && let Some(watchdog) = &mut self.watchdog {
            match watchdog.feed() {
                Ok(()) => self.set_watchdog(WatchdogState::Ok, None),
                Err(e) => {
                    tracing::error!(error = %e, "cannot feed the watchdog; the node will be reset");
                    self.set_watchdog(WatchdogState::Degraded, Some(e.to_string()));
                }
            }
        }
        self.notifier.watchdog();
    }

    /// Records (status, metrics) and publishes the self-fence steps so far.
    fn show_self_fence(&self, steps: SelfFenceSteps) {
        lock(&self.status).self_fence = Some(steps);
        lock(&self.metrics).set_self_fence(steps);
        self.publish();
    }

    /// Publishes the status (file, endpoint) after a check.
    pub(super) fn publish(&self) {
        let state = {
            let mut status = lock(&self.status);
            status.lu_set = LuSet::of(status.lus.iter().map(|lu| lu.id.clone()));
            status.state
        };
        {
            let mut metrics = lock(&self.metrics);
            metrics.set_blocked_paths(self.table.blocked_paths());
            metrics.set_state(state);
        }
        if let Some(file) = &self.status_file {
            let mut file = lock(file);
            if let Err(e) = file.publish(&self.status) {
                lock(&self.metrics).record_status_file_error();
                tracing::warn!(path = %file.path.display(), error = %e, "cannot write the status file");
            }
        }
    }

    /// The reason of a self-fence that an agent started earlier in this boot did not finish
    /// (killed or crashed mid-way: its status file says so). Such an agent must not come back
    /// waiting for a key that is gone: the caller runs the self-fence again.
    pub(super) fn unfinished_self_fence(&self) -> Option<String> {
        let path = lock(self.status_file.as_ref()?).path.clone();
        let boot = lock(&self.status).boot_id.clone()?;
        status_file::unfinished_self_fence(&path, &boot)
    }

    /// The self-fence actions, in order: stop feeding the watchdog, run the hook, reboot; if
    /// the reboot fails, stop feeding the watchdog (even with `self_fence.stop_watchdog` off:
    /// the hardware reset is the reboot that did not happen); then exit. Each step's result is
    /// published (status file, `/status`, metrics) before the next one, so it is on disk before
    /// a reboot or an exit. Returns the exit status if the agent is to exit.
    pub(super) async fn self_fence(&mut self, reason: String) -> Option<u8> {
        self.fenced = true;
        self.reserve.release();
        tracing::error!(%reason, "this node is fenced: running the self-fence actions");
        lock(&self.metrics).set_fenced();
        {
            let mut status = lock(&self.status);
            status.state = State::Fenced;
            status.fenced_reason = Some(reason.clone());
        }
        self.publish();
        self.notifier.status(&format!("fenced: {reason}"));
        let actions = self.settings.self_fence.clone();
        // 1. Stop feeding the watchdog.
        let mut steps = SelfFenceSteps {
            watchdog: self.stop_watchdog_feeding(actions.stop_watchdog),
            hook: if actions.command.is_some() {
                HookStep::Running
            } else {
                HookStep::NotConfigured
            },
            reboot: RebootStep::Disabled,
            finished: false,
        };
        self.show_self_fence(steps);
        // 2. The stop hook, on its own thread (never behind the commands hung on a dead path).
        if let Some(argv) = &actions.command {
            let shown = argv.join(" ");
            let hook = self.hook.clone();
            let ran = hook.run(argv.clone(), actions.command_timeout);
            tokio::pin!(ran);
            // The loop that feeds both watchdogs waits for the hook: feed them here meanwhile.
            // systemd's (WATCHDOG=1) says the agent is alive, as it is, so that systemd does not
            // kill it mid-hook; the hardware one only while self_fence.stop_watchdog is off.
            let mut beat = tokio::time::interval(WAIT_FEED_INTERVAL);
            let ran = loop {
                tokio::select! {
                    ran = &mut ran => break ran,
                    _ = beat.tick() => self.feed(false),
                }
            };
            steps.hook = match ran {
                Ok(()) => {
                    tracing::info!(command = %shown, "self-fence command done");
                    HookStep::Ok
                }
                Err(HookError::Run(crate::process::RunError::TimedOut(after))) => {
                    tracing::error!(command = %shown, ?after, "self-fence command timed out and was killed");
                    HookStep::TimedOut
                }
                Err(e) => {
                    tracing::error!(command = %shown, error = %e, "self-fence command failed");
                    HookStep::Failed
                }
            };
            self.show_self_fence(steps);
        }
        // 3. Reboot.
        if actions.reboot {
            steps.reboot = RebootStep::Requested;
            self.show_self_fence(steps);
            tracing::error!("rebooting now, without sync");
            // The log's own thread gets a moment to pass the reason on; a stalled journal
            // costs at most this.
            super::os::logging::flush(Duration::from_millis(100));
            let e = self.host.reboot_now();
            tracing::error!(error = %e, "reboot(2) failed (CAP_SYS_BOOT missing?)");
            steps.reboot = RebootStep::Failed;
            // Fall through: the watchdog reset is the reboot that did not happen.
            steps.watchdog = self.stop_watchdog_feeding(true);
            self.show_self_fence(steps);
        }
        // 4. Exit (the caller returns the status), with all of the above published.
        steps.finished = true;
        self.show_self_fence(steps);
        actions.exit_status
    }

    /// Self-fence step 1 (and the fall-back of a failed reboot): stops the feeding if `stop`.
    fn stop_watchdog_feeding(&mut self, stop: bool) -> WatchdogStep {
        if self.settings.watchdog.is_none() {
            return WatchdogStep::NotConfigured;
        }
        if !stop {
            return WatchdogStep::KeptFeeding;
        }
        self.stop_feeding = true;
        match &self.watchdog {
            Some(watchdog) => {
                tracing::error!(
                    device = %watchdog.device().display(),
                    "no longer feeding the watchdog: the node will be reset"
                );
                WatchdogStep::Ok
            }
            None => {
                tracing::error!(
                    "the watchdog is configured but not open: no hardware reset will come"
                );
                WatchdogStep::Failed
            }
        }
    }

    /// Closes the watchdog at a clean stop: disarmed only if `watchdog.magic_close`, and never
    /// once fenced.
    pub(super) fn close_watchdog(&mut self) {
        let Some(watchdog) = self.watchdog.take() else {
            return;
        };
        let magic_close = self
            .settings
            .watchdog
            .as_ref()
            .is_some_and(|w| w.magic_close);
        if magic_close && !self.fenced {
            match watchdog.disarm() {
                Ok(()) => tracing::info!("watchdog disarmed"),
                Err(e) => tracing::error!(error = %e, "cannot disarm the watchdog"),
            }
        } else {
            tracing::warn!(
                device = %watchdog.device().display(),
                "closing the watchdog armed (watchdog.magic_close is off or we are fenced): the \
                 node resets unless the agent is back in time"
            );
        }
    }

    /// Removes `key` from every live path of every LU (unregister_on_exit), all paths at once:
    /// a stop takes one command's bound ([`Executor::run`]'s) however many paths there are, so it
    /// ends within the unit's `TimeoutStopSec=`. systemd's watchdog hears from the agent meanwhile.
    pub(super) async fn unregister_everywhere(&self, keys: &[(usize, Key)]) {
        let mut pending = tokio::task::JoinSet::new();
        for &(index, key) in keys {
            let Some(lu) = self.table.lus.get(index) else {
                continue;
            };
            for path in lu.live_paths() {
                let exec = Arc::clone(&self.exec);
                let lu = lu.name.clone();
                pending.spawn(async move {
                    let result = exec
                        .run(&path, Command::PrOut(PrOutAction::Register), move |t| {
                            t.pr_out(&PrOut::unregister(key))
                        })
                        .await;
                    (lu, path.spec.name.clone(), key, result)
                });
            }
        }
        let mut beat = tokio::time::interval(WAIT_FEED_INTERVAL);
        loop {
            let done = tokio::select! {
                done = pending.join_next() => done,
                _ = beat.tick() => {
                    self.notifier.watchdog();
                    continue;
                }
            };
            match done {
                None => break,
                Some(Ok((lu, path, key, Ok(_)))) => {
                    tracing::info!(%lu, %path, %key, "unregistered")
                }
                Some(Ok((lu, path, _, Err(e)))) => {
                    tracing::warn!(%lu, %path, error = %e, "cannot unregister")
                }
                Some(Err(e)) => tracing::warn!(error = %e, "an unregister task failed"),
            }
        }
    }

    /// Applies what a reload may change in any mode: log level, command timeout, self-fence
    /// actions, unregister_on_exit. Returns the settings with the fields that need a restart
    /// put back (and says so).
    pub(super) fn apply_common(&mut self, mut new: Settings) -> Settings {
        if let Some(log) = &self.log
            && let Err(e) = log.set_level(&new.log.level)
        {
            tracing::error!(error = %e, "log level not changed");
        }
        if new.watchdog != self.settings.watchdog {
            tracing::warn!("[watchdog] changes only with a restart; keeping the running one");
            new.watchdog = self.settings.watchdog.clone();
        }
        if new.metrics_listen != self.settings.metrics_listen {
            tracing::warn!("metrics.listen changes only with a restart");
            new.metrics_listen = self.settings.metrics_listen;
        }
        if new.log.target != self.settings.log.target || new.log.json != self.settings.log.json {
            tracing::warn!("log.target and log.format change only with a restart");
        }
        if new.sd_notify != self.settings.sd_notify {
            tracing::warn!("systemd.notify changes only with a restart");
            new.sd_notify = self.settings.sd_notify;
        }
        if new.command_timeout != self.settings.command_timeout {
            self.exec = Arc::new(Executor::new(
                Arc::clone(&self.host),
                new.command_timeout,
                Arc::clone(&self.metrics),
            ));
            // Open devices carry the old timeout: reopen them.
            for lu in &self.table.lus {
                lu.paths.iter().for_each(PathHandle::forget);
            }
        }
        new
    }
}
