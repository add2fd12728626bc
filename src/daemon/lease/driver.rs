//! Lease mode, driven: one [`Lease`] machine per LU, polled until idle; each command it asks for
//! runs at once (the poll's `now` is its send time) on the blocking pool, and its completion is
//! reported back. A [`LeaseAction::SelfFence`] from any LU fences the node.
//!
//! Each action's PR commands are [`commands`]'s (shared with the simulation), run on a blocking
//! thread through the executor, each command bounded by `command_timeout`; before a Join or Renew
//! the key's epoch is persisted. Paths a renew found without our registration go to `ops::heal`,
//! which purges orphans and never registers (P3): they need `prfence unfence` or the next join.
//!
//! The epoch state file is written durably before a key from a new block is sent. The driver
//! tracks what is on disk itself, so a failed write is retried before the next key is used
//! rather than trusting the machine's hint.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Mutex as AsyncMutex;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::commands::{self, LeasePaths};
use super::epoch_file;
use crate::daemon::agent::{Agent, Control, RunEnd};
use crate::daemon::config::{LeaseReservation, ModeSettings, Settings};
use crate::daemon::executor::{Executor, no_live_path};
use crate::daemon::failure::CommandFailure;
use crate::daemon::heal::{heal_lu, report_heal};
use crate::daemon::lease::{
    self, EPOCH_BLOCK, EPOCH_MAX, EpochSources, Lease, LeaseAction, LeaseCompletion, LeaseConfig,
    LeaseKey, Role, StartView,
};
use crate::daemon::lock;
use crate::daemon::lu_table::PathHandle;
use crate::daemon::metrics::CommandResult;
use crate::daemon::status::State;
use crate::discover::LuId;
use crate::pr::{Key, PrInAction, ReservationType};
use crate::transport::{Command, CommandError};

/// What is durably on disk.
struct EpochStore {
    path: PathBuf,
    durable: Option<u64>,
}

/// Everything one action needs, owned, so it can run on its own task.
struct Job {
    exec: Arc<Executor>,
    metrics: Arc<std::sync::Mutex<crate::daemon::metrics::Metrics>>,
    lu: String,
    /// The LU identifier for the `ops` engine.
    id: LuId,
    device: PathBuf,
    paths: Vec<PathHandle>,
    rtype: ReservationType,
    epochs: Arc<AsyncMutex<EpochStore>>,
}

impl Job {
    fn live(&self) -> Vec<PathHandle> {
        self.paths.iter().filter(|p| p.spec.live).cloned().collect()
    }

    /// Makes sure `key`'s epoch (and `hint`, the block end the machine asks for) is on disk.
    async fn persist(&self, key: Key, hint: Option<u64>) -> Result<(), CommandFailure> {
        let epoch = LeaseKey::decode(key).map_or(0, LeaseKey::epoch);
        let mut store = self.epochs.lock().await;
        let wanted = hint.unwrap_or(0).max(epoch);
        if store.durable.is_some_and(|d| d >= wanted) {
            return Ok(());
        }
        // After a failed write the machine gives no hint for the rest of its block.
        let write = hint
            .unwrap_or_else(|| epoch.saturating_add(EPOCH_BLOCK - 1).min(EPOCH_MAX))
            .max(epoch);
        let path = store.path.clone();
        match tokio::task::spawn_blocking(move || epoch_file::write_durably(&path, write)).await {
            Ok(Ok(())) => {
                store.durable = Some(write);
                Ok(())
            }
            Ok(Err(e)) => {
                tracing::error!(lu = %self.lu, error = %e, "key not sent: its epoch is not on disk");
                Err(CommandFailure::Failed)
            }
            Err(e) => {
                tracing::error!(lu = %self.lu, error = %e, "epoch write failed");
                Err(CommandFailure::Failed)
            }
        }
    }

    /// This LU's live paths for the lease commands ([`commands`]), through the executor.
    fn paths(&self) -> Arc<ExecPaths> {
        Arc::new(ExecPaths {
            exec: Arc::clone(&self.exec),
            live: self.live(),
            all: self.paths.clone(),
            device: self.device.clone(),
            lu: self.lu.clone(),
        })
    }

    /// Runs one blocking lease command sequence on a blocking thread.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(Arc<ExecPaths>) -> T + Send + 'static,
        failed: impl FnOnce(CommandFailure) -> T,
    ) -> T {
        let paths = self.paths();
        match tokio::task::spawn_blocking(move || work(paths)).await {
            Ok(value) => value,
            Err(e) => {
                tracing::error!(lu = %self.lu, error = %e, "a lease command's worker failed");
                failed(CommandFailure::Failed)
            }
        }
    }

    async fn read_reservation(&self) -> Result<Option<Key>, CommandError> {
        let (device, paths) = (self.device.clone(), self.paths.clone());
        self.blocking(
            |p| commands::read_reservation(p.as_ref()),
            move |_| {
                Err(no_live_path(
                    &device,
                    &paths,
                    Command::PrIn(PrInAction::ReadReservation),
                ))
            },
        )
        .await
    }

    async fn join(&self, key: Key, hint: Option<u64>) -> LeaseCompletion {
        if let Err(e) = self.persist(key, hint).await {
            return LeaseCompletion::Join(Err(e));
        }
        self.blocking(
            move |p| commands::join(p.as_ref(), key),
            |e| LeaseCompletion::Join(Err(e)),
        )
        .await
    }

    async fn renew(&self, from: Vec<Key>, to: Key, hint: Option<u64>) -> LeaseCompletion {
        if let Err(e) = self.persist(to, hint).await {
            return LeaseCompletion::Renew(Err(e));
        }
        let renewed = self
            .blocking(
                move |p| commands::renew(&p, &from, to),
                |e| commands::Renewed {
                    completion: LeaseCompletion::Renew(Err(e)),
                    lost: Vec::new(),
                },
            )
            .await;
        if !renewed.lost.is_empty() {
            // heal never registers (P3): it purges orphans and names the paths for unfence.
            let id = self.id.clone();
            let result = heal_lu(&self.exec, id, &self.paths, to).await;
            report_heal(&self.lu, &result, &self.metrics);
        }
        renewed.completion
    }

    async fn execute(&self, action: LeaseAction) -> Option<LeaseCompletion> {
        let rtype = self.rtype;
        Some(match action {
            LeaseAction::Join { key, persist_epoch } => self.join(key, persist_epoch).await,
            LeaseAction::ReadReservation => LeaseCompletion::Reservation(
                self.read_reservation()
                    .await
                    .map_err(|e| CommandFailure::of(&e)),
            ),
            LeaseAction::Renew {
                from,
                to,
                persist_epoch,
            } => self.renew(from, to, persist_epoch).await,
            LeaseAction::Preempt { own, victim } => {
                self.blocking(
                    move |p| commands::preempt(p.as_ref(), own, victim, rtype),
                    |e| LeaseCompletion::Preempt(Err(e)),
                )
                .await
            }
            LeaseAction::Reserve { own } => {
                self.blocking(
                    move |p| commands::reserve(p.as_ref(), own, rtype),
                    |e| LeaseCompletion::Reserve(Err(e)),
                )
                .await
            }
            LeaseAction::Promoted { .. } | LeaseAction::SelfFence(_) => return None,
        })
    }
}

/// One LU's live paths through the agent's executor: each command bounded by
/// `command_timeout`, counted in the metrics.
struct ExecPaths {
    exec: Arc<Executor>,
    live: Vec<PathHandle>,
    all: Vec<PathHandle>,
    device: PathBuf,
    lu: String,
}

impl LeasePaths for ExecPaths {
    fn live(&self) -> usize {
        self.live.len()
    }
    fn run<T, F>(&self, index: usize, command: Command, f: F) -> Result<T, CommandError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn crate::transport::PrTransport) -> Result<T, CommandError> + Send + 'static,
    {
        match self.live.get(index) {
            Some(path) => self.exec.run_blocking(path, command, f),
            None => Err(self.none(command)),
        }
    }
    fn none(&self, command: Command) -> CommandError {
        no_live_path(&self.device, &self.all, command)
    }
    fn lu(&self) -> &str {
        &self.lu
    }
}

/// The node-wide role: holder only when holding every LU.
fn node_role(leases: &[Lease]) -> Role {
    let roles: Vec<Role> = leases.iter().map(Lease::role).collect();
    if roles.contains(&Role::Fenced) {
        Role::Fenced
    } else if roles.iter().all(|r| *r == Role::Holder { promoted: true }) {
        Role::Holder { promoted: true }
    } else if roles.iter().all(|r| matches!(r, Role::Holder { .. })) {
        Role::Holder { promoted: false }
    } else {
        Role::Standby
    }
}

// Here, not in config: the configuration knows nothing of the modes that read it.
impl Settings {
    /// The lease state machine's settings. `None` in watch mode.
    pub fn lease_config(&self) -> Option<LeaseConfig> {
        match &self.mode {
            ModeSettings::Lease(l) => Some(LeaseConfig {
                node: l.node_id,
                renew: l.renew,
                lease: l.lease,
                margin: l.margin,
                check_interval: self.check_interval,
                watchdog_timeout: self.watchdog.as_ref().map(|w| w.timeout),
            }),
            ModeSettings::Watch(_) => None,
        }
    }
}

/// Lease mode's driver: the agent's shared part, borrowed for the run, the reservation type
/// every LU is held with, and the epoch state file's durable value.
pub(in crate::daemon) struct LeaseDriver<'a> {
    agent: &'a mut Agent,
    rtype: ReservationType,
    epochs: Arc<AsyncMutex<EpochStore>>,
}

impl<'a> LeaseDriver<'a> {
    fn job(&self, index: usize) -> Option<Job> {
        let lu = self.agent.table.lus.get(index)?;
        Some(Job {
            exec: Arc::clone(&self.agent.exec),
            metrics: Arc::clone(&self.agent.metrics),
            lu: lu.name.clone(),
            id: lu
                .id
                .clone()
                .unwrap_or_else(|| LuId::node_local(&lu.device)),
            device: lu.device.clone(),
            paths: lu.paths.clone(),
            rtype: self.rtype,
            epochs: Arc::clone(&self.epochs),
        })
    }

    /// READ RESERVATION and READ KEYS of every LU, retried every check_interval until all
    /// answer. `None`: stopped meanwhile.
    async fn start_views(&mut self) -> Option<Vec<StartView>> {
        loop {
            self.agent
                .table
                .refresh(&self.agent.host, self.agent.check_deadline())
                .await;
            let mut views = Vec::new();
            for index in 0..self.agent.table.lus.len() {
                let job = self.job(index)?;
                let holder = job.read_reservation().await;
                let keys = self.agent.exec.read_keys_any(&job.device, &job.paths).await;
                match (holder, keys) {
                    (Ok(holder), Ok((keys, _, _))) => {
                        lock(&self.agent.status).lus[index].keys =
                            keys.keys.iter().map(Key::to_string).collect();
                        views.push(StartView {
                            holder,
                            keys: keys.keys,
                        });
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::warn!(lu = %job.lu, error = %e, "cannot read the LU at start; retrying");
                        lock(&self.agent.status).lus[index].verdict = format!("unreadable: {e}");
                    }
                }
            }
            self.agent.publish();
            if views.len() == self.agent.table.lus.len() {
                return Some(views);
            }
            tokio::select! {
                _ = tokio::time::sleep(self.agent.settings.check_interval) => {}
                control = self.agent.control.recv() => match control {
                    Some(Control::Reload(_)) => tracing::warn!("SIGHUP ignored while starting"),
                    Some(Control::Stop) | None => return None,
                },
            }
        }
    }

    /// Lease mode over `agent`'s LUs: reads the epoch state file, then runs until stopped or
    /// fenced.
    pub(in crate::daemon) async fn run_lease(agent: &'a mut Agent) -> RunEnd {
        let (Some(config), ModeSettings::Lease(settings)) =
            (agent.settings.lease_config(), agent.settings.mode.clone())
        else {
            return RunEnd::Failed("lease mode needs [lease]".to_owned());
        };
        let rtype = match settings.reservation {
            LeaseReservation::WriteExclusive => ReservationType::WriteExclusive,
            LeaseReservation::ExclusiveAccess => ReservationType::ExclusiveAccess,
        };
        let state_file = settings.state_file.clone();
        let persisted =
            match tokio::task::spawn_blocking(move || epoch_file::read(&state_file)).await {
                Ok(Ok(persisted)) => persisted,
                Ok(Err(e)) => return RunEnd::Failed(e.to_string()),
                Err(e) => return RunEnd::Failed(e.to_string()),
            };
        let epochs = Arc::new(AsyncMutex::new(EpochStore {
            path: settings.state_file.clone(),
            durable: persisted,
        }));
        LeaseDriver {
            agent,
            rtype,
            epochs,
        }
        .run(config, persisted)
        .await
    }

    /// Lease mode from the first look at every LU on.
    async fn run(&mut self, config: LeaseConfig, persisted: Option<u64>) -> RunEnd {
        let mut leases = match self.first_leases(config, persisted).await {
            Ok(leases) => leases,
            Err(end) => return end,
        };
        self.agent.notifier.ready("lease: starting");
        let mut jobs: JoinSet<(usize, Option<LeaseCompletion>)> = JoinSet::new();
        let mut next_check = Instant::now();
        let mut role = None;
        loop {
            let now = Instant::now();
            if let Some(end) = self.poll_leases(&mut leases, &mut jobs, now).await {
                return end;
            }
            let current = node_role(&leases);
            if role != Some(current) {
                role = Some(current);
                self.lease_role_changed(current, &leases);
            }
            if now >= next_check {
                let healthy = leases.iter().all(|l| l.feed_watchdog(now.into_std()));
                self.agent.feed(healthy);
                self.agent
                    .table
                    .refresh(&self.agent.host, self.agent.check_deadline())
                    .await;
                self.lease_status(&leases);
                next_check = now + self.agent.settings.check_interval;
            }
            let wake = leases
                .iter()
                .filter_map(Lease::next_wakeup)
                .map(Instant::from_std)
                .fold(next_check, Instant::min);
            tokio::select! {
                Some(joined) = jobs.join_next(), if !jobs.is_empty() => {
                    if let Ok((index, Some(completion))) = joined {
                        self.record_completion(&completion);
                        if let Some(lease) = leases.get_mut(index) {
                            lease.complete(Instant::now().into_std(), completion);
                        }
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
                control = self.agent.control.recv() => match control {
                    Some(Control::Reload(new)) => {
                        self.agent.notifier.reloading();
                        self.reload_lease(*new);
                        self.agent.notifier.ready("reloaded");
                    }
                    Some(Control::Stop) | None => return self.stop_lease(&leases).await,
                },
            }
        }
    }

    /// One lease per LU, all from the same first epoch, once every LU was read and the
    /// watchdog opened. `Err` ends the run: stopped before the first look, the same LU listed
    /// twice, no epoch to start from, or no watchdog.
    async fn first_leases(
        &mut self,
        config: LeaseConfig,
        persisted: Option<u64>,
    ) -> Result<Vec<Lease>, RunEnd> {
        let Some(views) = self.start_views().await else {
            return Err(self.stop_lease(&[]).await);
        };
        if let Some((a, b, id)) = self.agent.table.duplicate() {
            return Err(RunEnd::Failed(format!(
                "devices {a} and {b} are the same LU {id}; list each LU once"
            )));
        }
        let on_target: Vec<Key> = views.iter().flat_map(|v| v.keys.iter().copied()).collect();
        let wall_clock_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .and_then(|d| u64::try_from(d.as_millis()).ok());
        let first_epoch = lease::starting_epoch(
            config.node,
            &EpochSources {
                persisted,
                on_target: &on_target,
                wall_clock_ms,
            },
        )
        .map_err(|e| RunEnd::Failed(e.to_string()))?;
        let now = Instant::now().into_std();
        let leases: Vec<Lease> = views
            .iter()
            .map(|view| Lease::new(config.clone(), first_epoch, persisted, view, now))
            .collect();
        // Stricter than watch mode on purpose (watch mode shows a degraded watchdog and retries):
        // a configured holder's watchdog is part of the lease timing rule (a hung holder must be
        // reset before its lease ends and a standby takes over), so lease mode does not start if
        // it cannot open it. Without [watchdog] it starts, and said so ([`Settings::warnings`]).
        self.agent.open_watchdog().map_err(RunEnd::Failed)?;
        tracing::info!(
            node = config.node.get(),
            first_epoch,
            lus = leases.len(),
            "lease mode"
        );
        Ok(leases)
    }

    /// Carries out what each lease asks for now: its commands start as jobs, and a lease that
    /// must self-fence stops the node. Returns the run's end when the self-fence ends it.
    async fn poll_leases(
        &mut self,
        leases: &mut [Lease],
        jobs: &mut JoinSet<(usize, Option<LeaseCompletion>)>,
        now: Instant,
    ) -> Option<RunEnd> {
        if self.agent.is_fenced() {
            return None;
        }
        let mut fence = None;
        'poll: for (index, lease) in leases.iter_mut().enumerate() {
            while let Some(action) = lease.poll(now.into_std()) {
                match action {
                    LeaseAction::SelfFence(reason) => {
                        let name = self.agent.table.name(index);
                        fence = Some(format!("LU {name}: {reason}"));
                        break 'poll;
                    }
                    LeaseAction::Promoted { key } => {
                        let name = self.agent.table.name(index);
                        tracing::info!(lu = %name, %key, "holding the reservation");
                    }
                    action => {
                        if let Some(job) = self.job(index) {
                            jobs.spawn(async move { (index, job.execute(action).await) });
                        }
                    }
                }
            }
        }
        let reason = fence?;
        lock(&self.agent.metrics).set_lease_role(Role::Fenced);
        let exit_status = self.agent.self_fence(reason).await?;
        Some(RunEnd::Fenced { exit_status })
    }

    fn record_completion(&self, completion: &LeaseCompletion) {
        let mut metrics = lock(&self.agent.metrics);
        match completion {
            LeaseCompletion::Renew(result) => metrics.record_renewal(CommandResult::from(*result)),
            LeaseCompletion::Preempt(result) => {
                metrics.record_preempt(CommandResult::from(*result))
            }
            _ => {}
        }
    }

    fn lease_role_changed(&self, role: Role, leases: &[Lease]) {
        lock(&self.agent.metrics).set_lease_role(role);
        let text = match role {
            Role::Holder { promoted: true } => {
                tracing::info!("holding every LU: the service may run");
                "lease: holder".to_owned()
            }
            Role::Holder { promoted: false } => "lease: holder, confirming".to_owned(),
            Role::Standby => format!(
                "lease: standby ({} of {} LU(s) held)",
                leases
                    .iter()
                    .filter(|l| matches!(l.role(), Role::Holder { .. }))
                    .count(),
                leases.len()
            ),
            Role::Fenced => "lease: fenced".to_owned(),
        };
        if !self.agent.is_fenced() {
            self.agent.notifier.status(&text);
        }
    }

    fn lease_status(&self, leases: &[Lease]) {
        {
            let mut status = lock(&self.agent.status);
            status.checks += 1;
            if !self.agent.is_fenced() {
                status.state = match node_role(leases) {
                    Role::Holder { promoted: true } => State::Holder,
                    Role::Fenced => State::Fenced,
                    _ => State::Standby,
                };
            }
            for ((lu, lease), shown) in self
                .agent
                .table
                .lus
                .iter()
                .zip(leases)
                .zip(status.lus.iter_mut())
            {
                shown.id.clone_from(&lu.id);
                shown.paths = lu.shown_paths();
                shown.lease_key = Some(lease.own_key().to_string());
                shown.verdict = match lease.role() {
                    Role::Holder { promoted: true } => "holder".to_owned(),
                    Role::Holder { promoted: false } => "holder, confirming".to_owned(),
                    Role::Standby => "standby".to_owned(),
                    Role::Fenced => "fenced".to_owned(),
                };
            }
        }
        self.agent.publish();
    }

    async fn stop_lease(&mut self, leases: &[Lease]) -> RunEnd {
        tracing::info!("stopping");
        self.agent.notifier.stopping();
        lock(&self.agent.status).state = State::Stopping;
        self.agent.publish();
        if self.agent.settings.unregister_on_exit && !self.agent.is_fenced() {
            // Unregistering the holder's key also releases its reservation (SPC-4): a clean
            // hand-over, the standby reserves after a lease.
            let keys: Vec<(usize, Key)> = leases
                .iter()
                .enumerate()
                .map(|(i, l)| (i, l.own_key()))
                .filter(|(_, k)| !k.is_zero())
                .collect();
            self.agent.unregister_everywhere(&keys).await;
        }
        self.agent.close_watchdog();
        RunEnd::Stopped
    }

    /// A reload in lease mode may not touch the lease: its timings and devices are what the
    /// other nodes rely on. Anything else is applied.
    fn reload_lease(&mut self, new: Settings) {
        if self.agent.is_fenced() {
            tracing::warn!("SIGHUP: fenced; nothing changes until the agent is restarted");
            return;
        }
        if new.mode != self.agent.settings.mode
            || new.devices != self.agent.settings.devices
            || new.check_interval != self.agent.settings.check_interval
        {
            tracing::error!(
                "SIGHUP: [lease], [[device]] and check_interval change only with a restart (stop \
                 the service first); configuration not reloaded"
            );
            return;
        }
        let new = self.agent.apply_common(new);
        self.agent.settings = new;
        tracing::info!("SIGHUP: configuration reloaded");
    }

    /// `--once`: the reservation and keys of every LU; nothing is registered.
    pub(in crate::daemon) async fn once_lease(agent: &'a mut Agent) -> bool {
        LeaseDriver {
            agent,
            rtype: ReservationType::WriteExclusive,
            epochs: Arc::new(AsyncMutex::new(EpochStore {
                path: PathBuf::new(),
                durable: None,
            })),
        }
        .once()
        .await
    }

    /// The look of `--once`. Its jobs only read (READ RESERVATION, READ KEYS), so their
    /// reservation type and epoch store are never used.
    async fn once(&mut self) -> bool {
        self.agent
            .table
            .refresh(&self.agent.host, self.agent.check_deadline())
            .await;
        let mut all = true;
        for index in 0..self.agent.table.lus.len() {
            let Some(job) = self.job(index) else {
                continue;
            };
            let holder = job.read_reservation().await;
            let keys = self.agent.exec.read_keys_any(&job.device, &job.paths).await;
            let mut status = lock(&self.agent.status);
            let shown = &mut status.lus[index];
            shown.id.clone_from(&self.agent.table.lus[index].id);
            shown.paths = self.agent.table.lus[index].shown_paths();
            match (holder, keys) {
                (Ok(holder), Ok((keys, _, _))) => {
                    shown.keys = keys.keys.iter().map(Key::to_string).collect();
                    shown.verdict = match holder {
                        Some(key) => match LeaseKey::decode(key) {
                            Some(lk) => format!("held by node {} (key {key})", lk.node()),
                            None => format!("held by key {key} (not a lease key)"),
                        },
                        None => "no reservation".to_owned(),
                    };
                }
                (Err(e), _) | (_, Err(e)) => {
                    all = false;
                    shown.verdict = format!("unreadable: {e}");
                }
            }
        }
        lock(&self.agent.status).state = State::Standby;
        self.agent.publish();
        all
    }
}
