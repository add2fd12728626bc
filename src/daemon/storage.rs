//! The driver's seam to the storage, and the one place a PR command is run for it.
//!
//! - [`discover_lu`] resolves a configured device to its LU and paths through the [`Host`]
//!   (which also opens the paths). A node uses [`crate::host::SystemHost`] (sysfs discovery,
//!   SG_IO through a read-only open); unit tests plug in the SPC model, so the whole driver runs
//!   without a SCSI stack.
//! - [`LuTable`] is the current view of every configured LU: re-discovered each tick (sysfs only,
//!   no SCSI command), paths keyed by device and iSCSI session so a re-login is a *change*.
//! - [`Executor::run`] runs one command on one path on the blocking pool, bounded by
//!   `command_timeout`. A path's device is opened on first use and reopened after an open or
//!   transport failure (a path that came back is usually a new device node). A path whose
//!   previous command (or open) still hangs in the kernel is not given another one, so a hung
//!   path holds at most one blocking thread ([`PathHandle::is_blocked`]); likewise one discovery
//!   and one heal per LU at a time.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::DeviceSettings;
use super::metrics::{self, Metrics};
use crate::discover::{DiscoverError, Protocol};
use crate::host::Host;
use crate::pr::{PrInAction, PrOutAction, ReadKeys};
use crate::transport::{
    Command, CommandError, ErrorKind, Event, Hinted, Policy, PrAnswer, PrRequest, PrTransport,
    Reply,
};

/// One path of an LU as discovery reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathSpec {
    /// The node opened for SG_IO (`/dev/sdc`).
    pub dev: PathBuf,
    /// Kernel name (`sdc`), used in logs, metrics and the watch state.
    pub name: String,
    /// The SCSI device state is `running`.
    pub live: bool,
    /// The iSCSI session carrying the path (`session3`): a new session is a new I_T nexus.
    pub session: Option<String>,
    /// SCSI registers each path (I_T nexus); NVMe registers the host once for all its paths.
    pub protocol: Protocol,
}

/// One LU: its identifier (the same on every node) and this node's paths to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuSpec {
    pub id: String,
    pub paths: Vec<PathSpec>,
}

/// Resolves one configured device to its LU and paths. One device is one LU: a multipath map
/// over different LUs is refused by discovery.
pub fn discover_lu(host: &dyn Host, device: &Path) -> Result<LuSpec, DiscoverError> {
    let lu = host
        .resolve(&[device.to_path_buf()])?
        .into_iter()
        .next()
        .ok_or(DiscoverError::NothingToFence)?;
    Ok(LuSpec {
        id: lu.id.to_string(),
        paths: lu
            .paths
            .into_iter()
            .map(|p| PathSpec {
                live: p.is_live(),
                dev: p.dev,
                name: p.name,
                session: p.transport.map(|t| t.session),
                protocol: p.protocol,
            })
            .collect(),
    })
}

/// One path with its (lazily opened) device and whether a command is outstanding on it.
#[derive(Clone)]
pub struct PathHandle {
    pub spec: PathSpec,
    device: Arc<Mutex<Option<Arc<dyn PrTransport>>>>,
    busy: Arc<AtomicBool>,
}

impl std::fmt::Debug for PathHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PathHandle")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl PathHandle {
    fn new(spec: PathSpec) -> PathHandle {
        PathHandle {
            spec,
            device: Arc::new(Mutex::new(None)),
            busy: Arc::new(AtomicBool::new(false)),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<dyn PrTransport>>> {
        self.device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn transport(
        &self,
        host: &dyn Host,
        policy: Policy,
    ) -> Result<Arc<dyn PrTransport>, CommandError> {
        let mut slot = self.slot();
        if let Some(open) = slot.as_ref() {
            return Ok(Arc::clone(open));
        }
        let opened = host.open(&self.spec.dev, policy)?;
        *slot = Some(Arc::clone(&opened));
        Ok(opened)
    }

    /// Drops the open device so the next command reopens it.
    pub fn forget(&self) {
        *self.slot() = None;
    }

    /// A command or open on this path has not returned from the kernel yet (it holds one
    /// blocking thread; the path gets nothing else until it returns).
    pub fn is_blocked(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    /// Marks the path busy; `None` if it already was.
    fn claim(&self) -> Option<BusyPath> {
        (!self.busy.swap(true, Ordering::SeqCst)).then(|| BusyPath(Arc::clone(&self.busy)))
    }
}

/// A busy mark (a path's, discovery's), cleared when the blocking call that holds it returns.
struct BusyPath(Arc<AtomicBool>);

impl Drop for BusyPath {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Runs PR commands on paths: bounded, on the blocking pool, with latency and conflict metrics.
pub struct Executor {
    host: Arc<dyn Host>,
    policy: Policy,
    metrics: Arc<Mutex<Metrics>>,
    /// LUs with a heal under way (its blocking work may outlive the check that started it).
    healing: Arc<Mutex<HashSet<String>>>,
}

/// An LU's heal mark, held by every path the heal opened: it is cleared when the heal's last
/// blocking call returns, not when the check that started it stops waiting.
pub struct HealGuard {
    healing: Arc<Mutex<HashSet<String>>>,
    lu: String,
}

impl Drop for HealGuard {
    fn drop(&mut self) {
        lock(&self.healing).remove(&self.lu);
    }
}

impl Executor {
    pub fn new(host: Arc<dyn Host>, timeout: Duration, metrics: Arc<Mutex<Metrics>>) -> Self {
        Executor {
            host,
            policy: Policy {
                timeout,
                ..Policy::default()
            },
            metrics,
            healing: Arc::new(Mutex::new(HashSet::new())),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.policy.timeout
    }

    /// How long [`Executor::run`] waits for one command: `command_timeout` plus the slack that
    /// lets the kernel's own timeout fire first.
    pub fn command_slot(&self) -> Duration {
        super::config::command_slot(self.policy.timeout)
    }

    /// Marks `lu` as being healed; `None` while a previous heal of it is still under way.
    pub fn begin_heal(&self, lu: &str) -> Option<HealGuard> {
        lock(&self.healing)
            .insert(lu.to_owned())
            .then(|| HealGuard {
                healing: Arc::clone(&self.healing),
                lu: lu.to_owned(),
            })
    }

    /// Runs `f` on `path`'s device. `command` names the (first) command for errors and metrics.
    pub async fn run<T, F>(
        &self,
        path: &PathHandle,
        command: Command,
        f: F,
    ) -> Result<T, CommandError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn PrTransport) -> Result<T, CommandError> + Send + 'static,
    {
        let job = self.blocking_job(path, command, f)?;
        let started = tokio::time::Instant::now();
        let result =
            match tokio::time::timeout(self.command_slot(), tokio::task::spawn_blocking(job)).await
            {
                Ok(Ok(result)) => result,
                Ok(Err(join)) => Err(CommandError::without_completion(
                    &path.spec.dev,
                    command,
                    ErrorKind::Failed,
                    format!("the command's worker failed: {join}"),
                )),
                Err(_) => Err(self.timed_out(&path.spec.dev, command)),
            };
        self.account(command, started.elapsed(), result)
    }

    /// [`Executor::run`] for code that may block (a blocking thread, or the simulation): the
    /// same claim, bound and metrics.
    pub fn run_blocking<T, F>(
        &self,
        path: &PathHandle,
        command: Command,
        f: F,
    ) -> Result<T, CommandError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn PrTransport) -> Result<T, CommandError> + Send + 'static,
    {
        let job = self.blocking_job(path, command, f)?;
        let started = prfence_engine::runtime::now();
        let until = started + self.command_slot();
        let result = match prfence_engine::runtime::run_until(until, job) {
            prfence_engine::runtime::Finished::Done { value, .. } => value,
            prfence_engine::runtime::Finished::TimedOut => {
                Err(self.timed_out(&path.spec.dev, command))
            }
            prfence_engine::runtime::Finished::Panicked
            | prfence_engine::runtime::Finished::NotStarted(_) => {
                Err(CommandError::without_completion(
                    &path.spec.dev,
                    command,
                    ErrorKind::Failed,
                    "the command's worker failed",
                ))
            }
        };
        let took = prfence_engine::runtime::now().saturating_duration_since(started);
        self.account(command, took, result)
    }

    /// The blocking half of one command on `path`: claims the path (refused while its previous
    /// command is still in the kernel), opens its device if needed, runs `f`, and forgets the
    /// device after an open or transport failure (a path that came back is a new node).
    fn blocking_job<T, F>(
        &self,
        path: &PathHandle,
        command: Command,
        f: F,
    ) -> Result<impl FnOnce() -> Result<T, CommandError> + Send + 'static, CommandError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn PrTransport) -> Result<T, CommandError> + Send + 'static,
    {
        let Some(busy) = path.claim() else {
            return Err(CommandError::without_completion(
                &path.spec.dev,
                command,
                ErrorKind::Timeout,
                "the previous command on this path has not returned from the kernel yet",
            ));
        };
        let (host, policy, handle) = (Arc::clone(&self.host), self.policy, path.clone());
        Ok(move || {
            let _busy = busy;
            let result = handle
                .transport(host.as_ref(), policy)
                .and_then(|device| f(device.as_ref()));
            if let Err(e) = &result
                && matches!(e.kind, ErrorKind::Open | ErrorKind::Transport)
            {
                handle.forget();
            }
            result
        })
    }

    fn timed_out(&self, dev: &Path, command: Command) -> CommandError {
        CommandError::without_completion(
            dev,
            command,
            ErrorKind::Timeout,
            format!(
                "no answer within {} ms (command_timeout)",
                self.policy.timeout.as_millis()
            ),
        )
    }

    /// Latency and conflict metrics, and the agent's hint on an error.
    fn account<T>(
        &self,
        command: Command,
        took: Duration,
        result: Result<T, CommandError>,
    ) -> Result<T, CommandError> {
        if let Some(label) = metric_command(command) {
            let mut m = lock(&self.metrics);
            m.observe_latency(label, took);
            if let Err(e) = &result
                && e.kind == ErrorKind::ReservationConflict
            {
                m.record_conflict(label);
            }
        }
        result.map_err(|e| e.hinted(hint))
    }

    /// Opens `paths` (those that can be) for a heal by the `ops` engine, which runs its own
    /// commands; each opened path holds `guard`. Paths with a blocked command are left out, and
    /// paths not opened within one command slot are left to the blocking pool and left out.
    pub async fn open_paths(&self, paths: &[PathHandle], guard: HealGuard) -> Vec<OpenedPath> {
        let guard = Arc::new(guard);
        let opens: Vec<_> = paths
            .iter()
            .filter_map(|p| {
                let Some(busy) = p.claim() else {
                    tracing::warn!(path = %p.spec.name, "not used: its previous command has not returned from the kernel yet");
                    return None;
                };
                let (host, policy, path) = (Arc::clone(&self.host), self.policy, p.clone());
                Some(tokio::task::spawn_blocking(move || {
                    let _busy = busy;
                    path.transport(host.as_ref(), policy).map_err(|e| {
                        path.forget();
                        (path.spec.name.clone(), Box::new(e))
                    })
                }))
            })
            .collect();
        let until = tokio::time::Instant::now() + self.command_slot();
        let mut opened = Vec::new();
        for open in opens {
            match tokio::time::timeout_at(until, open).await {
                Ok(Ok(Ok(transport))) => opened.push(OpenedPath {
                    transport: Hinted {
                        inner: transport,
                        hints: hint,
                    },
                    _heal: Arc::clone(&guard),
                }),
                Ok(Ok(Err((path, error)))) => {
                    let error = (*error).hinted(hint);
                    tracing::warn!(%path, %error, "cannot open the path");
                }
                Ok(Err(join)) => tracing::warn!(error = %join, "a path's open failed"),
                Err(_) => tracing::warn!("a path's open did not return within command_timeout"),
            }
        }
        opened
    }

    /// READ KEYS on a live path of `paths`: the first, and if it does not answer, every other at
    /// once (so a hung path costs one command slot, not one per path). Returns the keys, the
    /// index of the path that answered (the first in order among those that did), and the unit
    /// attentions it consumed.
    pub async fn read_keys_any(
        self: &Arc<Self>,
        device: &Path,
        paths: &[PathHandle],
    ) -> Result<(ReadKeys, usize, Vec<Event>), CommandError> {
        let command = Command::PrIn(PrInAction::ReadKeys);
        let mut live = paths.iter().enumerate().filter(|(_, p)| p.spec.live);
        let Some((first_index, first)) = live.next() else {
            return Err(no_live_path(device, paths, command));
        };
        let read = |exec: Arc<Executor>, path: PathHandle| async move {
            exec.run(&path, command, |t: &dyn PrTransport| {
                let reply = t.execute(PrRequest::ReadKeys)?;
                match reply.answer {
                    PrAnswer::Keys(keys) => Ok((keys, reply.events)),
                    other => Err(CommandError::mismatched(
                        t.device(),
                        PrRequest::ReadKeys,
                        &other,
                    )),
                }
            })
            .await
        };
        let mut last = match read(Arc::clone(self), first.clone()).await {
            Ok((keys, attentions)) => return Ok((keys, first_index, attentions)),
            Err(e) => e,
        };
        let mut others = tokio::task::JoinSet::new();
        for (index, path) in live {
            let job = read(Arc::clone(self), path.clone());
            others.spawn(async move { (index, job.await) });
        }
        let mut answers = Vec::new();
        while let Some(joined) = others.join_next().await {
            if let Ok(answer) = joined {
                answers.push(answer);
            }
        }
        answers.sort_by_key(|(index, _)| *index);
        for (index, result) in answers {
            match result {
                Ok((keys, attentions)) => return Ok((keys, index, attentions)),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// An opened path as the `ops` engine owns it: the agent's device, whose errors carry the
/// agent's hints, holding its heal's guard.
pub struct OpenedPath {
    transport: Hinted<Arc<dyn PrTransport>>,
    /// Dropped with the engine's last use of the path, after its blocking work returned.
    _heal: Arc<HealGuard>,
}

impl PrTransport for OpenedPath {
    fn device(&self) -> &Path {
        self.transport.device()
    }
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        self.transport.execute(request)
    }
}

/// The agent's advice for a failed command, in terms of its configuration.
pub fn hint(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ReservationConflict => {
            "another initiator holds the reservation, or this path's key is not registered \
             (was this node fenced?)"
        }
        ErrorKind::NotSupported => {
            "the LU does not implement persistent reservations; list only PR-capable LUs in \
             devices"
        }
        ErrorKind::InvalidField => {
            "the target rejected a field: the service action, reservation type or flag is \
             unsupported, or does not match the LU's state"
        }
        ErrorKind::UnitAttention => {
            "the LU kept reporting unit attentions (resets or state changes); check the target's \
             logs if it persists"
        }
        ErrorKind::NotReady => {
            "the LU is not ready; LIO also answers NOT READY for PR OUT from an unregistered \
             path and when its <dbroot>/pr directory is missing"
        }
        ErrorKind::Timeout => {
            "no answer within command_timeout; the path may be dead: check the session \
             (iscsiadm -m session, multipath -ll, nvme list-subsys) or raise command_timeout"
        }
        ErrorKind::Transport => {
            "the path failed below the reservation protocol (no device, link down, host adapter \
             or NVMe controller error); check the session or controller and the device node"
        }
        ErrorKind::Open => {
            "the device node could not be opened or used: it must exist, and the agent needs \
             root (CAP_SYS_RAWIO for SCSI, CAP_SYS_ADMIN for NVMe: the packaged unit grants only \
             the first)"
        }
        ErrorKind::Malformed => {
            "the target returned persistent-reservation data that does not parse; capture it \
             with `sg_persist -H` (NVMe: `nvme resv-report -e`) and report it"
        }
        ErrorKind::Failed => "the command failed; the sense data or NVMe status says why",
    }
}

/// The error for an LU with no running path.
pub fn no_live_path(device: &Path, paths: &[PathHandle], command: Command) -> CommandError {
    let states: Vec<String> = paths
        .iter()
        .map(|p| {
            format!(
                "{} {}",
                p.spec.name,
                if p.spec.live {
                    "running"
                } else {
                    "not running"
                }
            )
        })
        .collect();
    CommandError::without_completion(
        device,
        command,
        ErrorKind::Transport,
        if states.is_empty() {
            "no path to the LU (discovery found none)".to_owned()
        } else {
            format!("no running path ({})", states.join(", "))
        },
    )
    .hinted(hint)
}

fn metric_command(command: Command) -> Option<metrics::CommandKind> {
    Some(match command {
        Command::PrIn(PrInAction::ReadKeys) => metrics::CommandKind::ReadKeys,
        Command::PrIn(PrInAction::ReadReservation) => metrics::CommandKind::ReadReservation,
        Command::PrIn(PrInAction::ReadFullStatus) => metrics::CommandKind::ReadFullStatus,
        Command::PrOut(PrOutAction::Register | PrOutAction::RegisterAndIgnoreExistingKey) => {
            metrics::CommandKind::Register
        }
        Command::PrOut(PrOutAction::Reserve) => metrics::CommandKind::Reserve,
        Command::PrOut(PrOutAction::Preempt | PrOutAction::PreemptAndAbort) => {
            metrics::CommandKind::Preempt
        }
        _ => return None,
    })
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One configured LU as currently discovered.
#[derive(Debug)]
pub struct LuEntry {
    /// The configured name (logs, metrics, the watch state).
    pub name: String,
    /// The configured device.
    pub device: PathBuf,
    /// The LU identifier from the first successful discovery.
    pub id: Option<String>,
    pub paths: Vec<PathHandle>,
    /// A path appeared, vanished, changed state or session at the last refresh.
    pub paths_changed: bool,
    /// Why the last discovery failed (the previous paths are kept and tried).
    pub discover_error: Option<String>,
}

impl LuEntry {
    /// How many times our key is listed by READ KEYS when every path is registered: once per
    /// SCSI path (each I_T nexus registers), once for all NVMe paths together (NVMe registers
    /// the host, by host id, whatever the number of controllers it reaches the namespace by).
    pub fn registrations_expected(&self) -> usize {
        let scsi = self
            .paths
            .iter()
            .filter(|p| p.spec.protocol == Protocol::Scsi)
            .count();
        scsi + usize::from(self.paths.iter().any(|p| p.spec.protocol == Protocol::Nvme))
    }

    /// The paths in state `running`, in discovery order.
    pub fn live_paths(&self) -> Vec<PathHandle> {
        self.paths.iter().filter(|p| p.spec.live).cloned().collect()
    }
}

/// Every configured LU, in configuration order.
#[derive(Debug)]
pub struct LuTable {
    pub lus: Vec<LuEntry>,
    /// A discovery is running (it may outlive the check that started it).
    discovering: Arc<AtomicBool>,
}

impl LuTable {
    /// The configured name of LU `index`, for logs ("?" if there is none).
    pub fn name(&self, index: usize) -> &str {
        self.lus.get(index).map_or("?", |l| l.name.as_str())
    }

    pub fn new(devices: &[DeviceSettings]) -> LuTable {
        LuTable {
            lus: devices
                .iter()
                .map(|d| LuEntry {
                    name: d.name.clone(),
                    device: d.path.clone(),
                    id: None,
                    paths: Vec::new(),
                    paths_changed: false,
                    discover_error: None,
                })
                .collect(),
            discovering: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Re-discovers every LU (sysfs only; on the blocking pool). A discovery not done by `until`
    /// (sysfs reads can block behind a device in error recovery) leaves the paths as they were;
    /// no second one starts while it runs.
    pub async fn refresh(&mut self, host: &Arc<dyn Host>, until: tokio::time::Instant) {
        if self.discovering.swap(true, Ordering::SeqCst) {
            tracing::warn!("the previous discovery has not returned yet; keeping the paths");
            return;
        }
        let busy = BusyPath(Arc::clone(&self.discovering));
        let devices: Vec<PathBuf> = self.lus.iter().map(|l| l.device.clone()).collect();
        let host = Arc::clone(host);
        let job = tokio::task::spawn_blocking(move || {
            let _busy = busy;
            devices
                .iter()
                .map(|d| discover_lu(host.as_ref(), d).map_err(|e| e.to_string()))
                .collect::<Vec<_>>()
        });
        let found = match tokio::time::timeout_at(until, job).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => vec![Err(format!("discovery worker failed: {e}")); self.lus.len()],
            Err(_) => {
                tracing::warn!(
                    "discovery did not return within the check's budget; keeping the paths"
                );
                return;
            }
        };
        for (lu, result) in self.lus.iter_mut().zip(found) {
            lu.apply(result);
        }
    }

    /// Paths whose command or open has not returned from the kernel (each holds one thread).
    pub fn blocked_paths(&self) -> usize {
        self.lus
            .iter()
            .flat_map(|lu| &lu.paths)
            .filter(|p| p.is_blocked())
            .count()
    }

    /// Two configured devices must not be the same LU: its paths would be counted twice.
    pub fn duplicate(&self) -> Option<(String, String, String)> {
        for (i, a) in self.lus.iter().enumerate() {
            for b in &self.lus[i + 1..] {
                if let (Some(x), Some(y)) = (&a.id, &b.id)
                    && x == y
                {
                    return Some((a.name.clone(), b.name.clone(), x.clone()));
                }
            }
        }
        None
    }
}

impl LuEntry {
    fn apply(&mut self, result: Result<LuSpec, String>) {
        let spec = match result {
            Ok(spec) => spec,
            Err(e) => {
                if self.discover_error.as_ref() != Some(&e) {
                    tracing::warn!(
                        lu = %self.name, device = %self.device.display(), error = %e,
                        kept_paths = self.paths.len(), "discovery failed"
                    );
                }
                self.discover_error = Some(e);
                self.paths_changed = false;
                return;
            }
        };
        if let Some(id) = &self.id
            && *id != spec.id
        {
            let e = format!(
                "{} now resolves to LU {} instead of {id}; the device was replaced: restart the \
                 agent if that is intended",
                self.device.display(),
                spec.id
            );
            if self.discover_error.as_ref() != Some(&e) {
                tracing::error!(lu = %self.name, error = %e, "LU identity changed");
            }
            self.discover_error = Some(e);
            self.paths_changed = !self.paths.is_empty();
            self.paths.clear();
            return;
        }
        if self.discover_error.take().is_some() {
            tracing::info!(lu = %self.name, "discovery works again");
        }
        self.id = Some(spec.id);
        let before: Vec<PathSpec> = self.paths.iter().map(|p| p.spec.clone()).collect();
        let mut paths = Vec::with_capacity(spec.paths.len());
        for path in spec.paths {
            // Same device node and session: the same nexus, keep its open device.
            let kept = self
                .paths
                .iter()
                .find(|h| h.spec.dev == path.dev && h.spec.session == path.session);
            paths.push(match kept {
                Some(handle) => PathHandle {
                    spec: path,
                    ..handle.clone()
                },
                None => PathHandle::new(path),
            });
        }
        self.paths = paths;
        self.paths_changed = before
            != self
                .paths
                .iter()
                .map(|p| p.spec.clone())
                .collect::<Vec<_>>();
        if self.paths_changed {
            tracing::info!(
                lu = %self.name,
                paths = %self.paths.iter().map(|p| format!("{}{}{}", p.spec.name, p.spec.session.as_deref().map(|s| format!("@{s}")).unwrap_or_default(), if p.spec.live { "" } else { " (not running)" })).collect::<Vec<_>>().join(", "),
                "paths"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every device is missing.
    struct Missing;

    impl Host for Missing {
        fn resolve(&self, _devices: &[PathBuf]) -> Result<Vec<crate::discover::Lu>, DiscoverError> {
            Err(DiscoverError::NothingToFence)
        }
        fn resolve_each(
            &self,
            _devices: &[PathBuf],
        ) -> Result<crate::discover::Resolution, DiscoverError> {
            Err(DiscoverError::NothingToFence)
        }
        fn resolve_lvm_each(
            &self,
            _vgs: &Path,
            _timeout: Option<Duration>,
        ) -> Result<crate::discover::Resolution, DiscoverError> {
            Err(DiscoverError::NothingToFence)
        }
        fn open(&self, dev: &Path, _policy: Policy) -> Result<Arc<dyn PrTransport>, CommandError> {
            Err(CommandError::without_completion(
                dev,
                Command::Open,
                ErrorKind::Open,
                "No such file or directory (os error 2)",
            ))
        }
        fn cmapctl(
            &self,
            _cmapctl: &Path,
            _arg: &str,
            _timeout: Option<Duration>,
        ) -> Result<String, crate::keys::KeyError> {
            unreachable!("the executor asks no corosync")
        }
        fn run_bounded(
            &self,
            _program: &Path,
            _args: &[String],
            _timeout: Option<Duration>,
        ) -> Result<Vec<u8>, crate::process::RunError> {
            unreachable!("the executor runs no helper")
        }
        fn sleep(&self, _duration: Duration) {
            unreachable!("the executor does not sleep")
        }
        fn reboot_now(&self) -> std::io::Error {
            unreachable!("the executor does not reboot")
        }
    }

    #[test]
    fn an_nvme_namespace_is_registered_once_whatever_its_paths() {
        let path = |name: &str, protocol| {
            PathHandle::new(PathSpec {
                dev: PathBuf::from(format!("/dev/{name}")),
                name: name.to_string(),
                live: true,
                session: None,
                protocol,
            })
        };
        let lu = |paths| LuEntry {
            name: "data".to_string(),
            device: PathBuf::from("/dev/x"),
            id: None,
            paths,
            paths_changed: false,
            discover_error: None,
        };
        let scsi = lu(vec![
            path("sdb", Protocol::Scsi),
            path("sdc", Protocol::Scsi),
        ]);
        assert_eq!(scsi.registrations_expected(), 2);
        // Two controllers without native multipath: two namespace devices, one registration.
        let nvme = lu(vec![
            path("nvme0n1", Protocol::Nvme),
            path("nvme1n1", Protocol::Nvme),
        ]);
        assert_eq!(nvme.registrations_expected(), 1);
        assert_eq!(lu(Vec::new()).registrations_expected(), 0);
    }

    #[tokio::test]
    async fn the_agent_hints_in_terms_of_its_own_settings() {
        let metrics = Arc::new(Mutex::new(Metrics::new(Vec::new())));
        let exec = Executor::new(Arc::new(Missing), Duration::from_secs(1), metrics);
        let path = PathHandle::new(PathSpec {
            dev: PathBuf::from("/dev/sdq"),
            name: "sdq".to_string(),
            live: true,
            session: None,
            protocol: Protocol::Scsi,
        });
        let e = exec
            .run(&path, Command::PrIn(PrInAction::ReadKeys), |t| {
                t.read_keys()
            })
            .await
            .unwrap_err();
        assert!(e.to_string().ends_with(". Hint: the device node could not be opened or used: it must exist, and the agent needs root (CAP_SYS_RAWIO for SCSI, CAP_SYS_ADMIN for NVMe: the packaged unit grants only the first)"), "{e}");
        assert!(hint(ErrorKind::Timeout).contains("raise command_timeout"));
        let guard = exec.begin_heal("naa.1").unwrap();
        assert!(exec.open_paths(&[path], guard).await.is_empty());
    }
}
