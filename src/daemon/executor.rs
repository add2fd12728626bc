//! The one place a PR command is run for the agent.
//!
//! [`Executor::run`] runs one command on one path on the blocking pool, bounded by
//! `command_timeout`; [`Executor::read_keys_each`] runs the watch check's first READ KEYS of
//! every LU from a few blocking threads in turn, with the same claim, bound and metrics. A
//! path's device is opened on first use and reopened after an open or transport failure (a path
//! that came back is usually a new device node). A path whose previous command (or open) still
//! hangs in the kernel is not given another one, so a hung path holds at most one blocking
//! thread ([`PathHandle::is_blocked`]); likewise one discovery
//! ([`super::lu_table::LuTable::refresh`]) and one heal per LU at a time.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::lock;
use super::lu_table::PathHandle;
use super::metrics::{self, Metrics};
use crate::discover::LuId;
use crate::hints;
use crate::host::Host;
use crate::pr::{PrInAction, PrOutAction, ReadKeys};
use crate::transport::{
    Command, CommandError, ErrorKind, Event, Policy, PrAnswer, PrRequest, PrTransport, Reply,
};

/// Runs PR commands on paths: bounded, on the blocking pool, with latency and conflict metrics.
pub struct Executor {
    host: Arc<dyn Host>,
    policy: Policy,
    metrics: Arc<Mutex<Metrics>>,
    /// LUs with a heal under way (its blocking work may outlive the check that started it).
    healing: Arc<Mutex<HashSet<LuId>>>,
}

/// An LU's heal mark, held by every path the heal opened: it is cleared when the heal's last
/// blocking call returns, not when the check that started it stops waiting.
pub struct HealGuard {
    healing: Arc<Mutex<HashSet<LuId>>>,
    lu: LuId,
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
    pub fn begin_heal(&self, lu: &LuId) -> Option<HealGuard> {
        lock(&self.healing).insert(lu.clone()).then(|| HealGuard {
            healing: Arc::clone(&self.healing),
            lu: lu.clone(),
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
        let conflict = result
            .as_ref()
            .is_err_and(|e| e.kind == ErrorKind::ReservationConflict);
        record(&mut lock(&self.metrics), command, took, conflict);
        result.map_err(|e| e.hinted(hints::node_agent))
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
                    transport,
                    _heal: Arc::clone(&guard),
                }),
                Ok(Ok(Err((path, error)))) => {
                    let error = (*error).hinted(hints::node_agent);
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
        let Some(first) = first_live(paths) else {
            return Err(no_live_path(device, paths, READ_KEYS));
        };
        let read = self.run(&paths[first], READ_KEYS, read_keys_on).await;
        self.read_keys_after(paths, first, read).await
    }

    /// [`Executor::read_keys_any`] once the first live path (`first`) was read: its answer, or
    /// every other live path at once.
    pub async fn read_keys_after(
        self: &Arc<Self>,
        paths: &[PathHandle],
        first: usize,
        read: KeysRead,
    ) -> Result<(ReadKeys, usize, Vec<Event>), CommandError> {
        let mut last = match read {
            Ok((keys, attentions)) => return Ok((keys, first, attentions)),
            Err(e) => e,
        };
        let live = paths
            .iter()
            .enumerate()
            .skip(first + 1)
            .filter(|(_, p)| p.spec.live);
        let mut others = tokio::task::JoinSet::new();
        for (index, path) in live {
            let (exec, path) = (Arc::clone(self), path.clone());
            others.spawn(async move { (index, exec.run(&path, READ_KEYS, read_keys_on).await) });
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

const READ_KEYS: Command = Command::PrIn(PrInAction::ReadKeys);

/// The first path of `paths` that is live.
pub fn first_live(paths: &[PathHandle]) -> Option<usize> {
    paths.iter().position(|p| p.spec.live)
}

/// READ KEYS on one path: the keys and the unit attentions it consumed.
fn read_keys_on(t: &dyn PrTransport) -> KeysRead {
    let reply = t.execute(PrRequest::ReadKeys)?;
    match reply.answer {
        PrAnswer::Keys(keys) => Ok((keys, reply.events)),
        other => Err(CommandError::mismatched(
            t.device(),
            PrRequest::ReadKeys,
            &other,
        )),
    }
}

/// One READ KEYS's result.
pub type KeysRead = Result<(ReadKeys, Vec<Event>), CommandError>;

/// How many blocking threads [`Executor::read_keys_each`] starts with.
const READERS: usize = 8;

/// How long [`Executor::read_keys_each`] waits for any read to finish before it adds a thread:
/// every thread may be held by a hung path.
const STALL: Duration = Duration::from_millis(100);

/// The paths [`Executor::read_keys_each`] reads, and what each gave. Readers share it without
/// a shared lock (an index taken with one atomic add, a result slot each): with shared locks per
/// read, readers finishing together waited on each other in futex calls (issue 48).
struct ReadBatch {
    paths: Vec<PathHandle>,
    /// The next index into `paths` a reader takes; at or past [`ReadBatch::CLOSED`] once the
    /// batch ended (nothing more is sent).
    next: AtomicUsize,
    /// Each locked twice at most, by its one reader and by the collector: never contended.
    results: Vec<Mutex<Option<KeysRead>>>,
    done: AtomicUsize,
    all_done: tokio::sync::Notify,
}

impl ReadBatch {
    /// Far beyond any index, and far from overflowing with every reader's later add.
    const CLOSED: usize = usize::MAX / 2;
}

/// Records one command's latency (and a RESERVATION CONFLICT answer) in `metrics`.
fn record(metrics: &mut Metrics, command: Command, took: Duration, conflict: bool) {
    if let Some(label) = metric_command(command) {
        metrics.observe_latency(label, took);
        if conflict {
            metrics.record_conflict(label);
        }
    }
}

impl Executor {
    /// READ KEYS on each of `paths` (the watch check's first read of every LU), until `until`.
    /// A few blocking threads take the paths from one queue in turn: one hand-off to a thread
    /// per thread, not per path, which was most of a check's CPU beside the commands. A hung path
    /// holds its thread while the others go on with the queue; when no read at all finished for
    /// `STALL`, a thread is added, so hung paths hold back the healthy ones by `STALL` each
    /// at most. Each read is claimed, bounded and accounted as [`Executor::run`]'s; one still
    /// running or not started at `until` is a timeout. Results in `paths` order.
    pub async fn read_keys_each(
        self: &Arc<Self>,
        paths: Vec<PathHandle>,
        until: tokio::time::Instant,
    ) -> Vec<KeysRead> {
        let count = paths.len();
        let batch = Arc::new(ReadBatch {
            next: AtomicUsize::new(0),
            results: (0..count).map(|_| Mutex::new(None)).collect(),
            paths,
            done: AtomicUsize::new(0),
            all_done: tokio::sync::Notify::new(),
        });
        let start_reader = || {
            let (exec, batch) = (Arc::clone(self), Arc::clone(&batch));
            drop(tokio::task::spawn_blocking(move || exec.read_queue(&batch)));
        };
        let mut readers = count.min(READERS);
        (0..readers).for_each(|_| start_reader());
        let mut seen = 0;
        while batch.done.load(Ordering::SeqCst) < count {
            let wake = until.min(tokio::time::Instant::now() + STALL);
            if tokio::time::timeout_at(wake, batch.all_done.notified())
                .await
                .is_ok()
            {
                continue;
            }
            if tokio::time::Instant::now() >= until {
                break;
            }
            let done = batch.done.load(Ordering::SeqCst);
            if done == seen && readers < count && batch.next.load(Ordering::SeqCst) < count {
                readers += 1;
                start_reader();
            }
            seen = done;
        }
        // Nothing more starts (indexes from `taken` on were never sent); a read still running
        // finishes on its own thread, unheard.
        let taken = batch.next.swap(ReadBatch::CLOSED, Ordering::SeqCst);
        batch
            .results
            .iter()
            .zip(&batch.paths)
            .enumerate()
            .map(|(index, (result, path))| match lock(result).take() {
                Some(result) => result,
                None if index >= taken => Err(CommandError::without_completion(
                    &path.spec.dev,
                    READ_KEYS,
                    ErrorKind::Timeout,
                    "not sent: every reader was held by a path that does not answer until the \
                     command slot ended",
                )),
                None => Err(self.timed_out(&path.spec.dev, READ_KEYS)),
            })
            .collect()
    }

    /// One reader of [`Executor::read_keys_each`]: paths from the queue until it is empty.
    /// Each read's latency goes to the metrics when their lock is free; else it waits for the
    /// lock before the reader's next read (not behind a read that may hang), so readers rarely
    /// wait on one another.
    fn read_queue(&self, batch: &ReadBatch) {
        let mut unrecorded: Option<(Duration, bool)> = None;
        loop {
            if let Some((took, conflict)) = unrecorded.take() {
                record(&mut lock(&self.metrics), READ_KEYS, took, conflict);
            }
            let index = batch.next.fetch_add(1, Ordering::SeqCst);
            let Some(path) = batch.paths.get(index) else {
                break;
            };
            let started = std::time::Instant::now();
            let result = self
                .blocking_job(path, READ_KEYS, read_keys_on)
                .and_then(|job| job());
            let conflict = result
                .as_ref()
                .is_err_and(|e| e.kind == ErrorKind::ReservationConflict);
            match self.metrics.try_lock() {
                Ok(mut metrics) => record(&mut metrics, READ_KEYS, started.elapsed(), conflict),
                Err(_) => unrecorded = Some((started.elapsed(), conflict)),
            }
            *lock(&batch.results[index]) = Some(result.map_err(|e| e.hinted(hints::node_agent)));
            if batch.done.fetch_add(1, Ordering::SeqCst) + 1 == batch.paths.len() {
                batch.all_done.notify_one();
            }
        }
    }
}

/// An opened path as the `ops` engine owns it: the agent's device, holding its heal's guard.
/// (The engine's report gets the agent's hints where the heal is logged.)
pub struct OpenedPath {
    transport: Arc<dyn PrTransport>,
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
    .hinted(hints::node_agent)
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::daemon::lu_table::PathSpec;
    use crate::testing::ModelHost;
    use crate::transport::Protocol;

    #[tokio::test]
    async fn the_agent_hints_in_terms_of_its_own_settings() {
        let metrics = Arc::new(Mutex::new(Metrics::new(Vec::new())));
        // A node where every device is missing.
        let exec = Executor::new(Arc::new(ModelHost::new()), Duration::from_secs(1), metrics);
        let path = PathHandle::new(PathSpec {
            dev: PathBuf::from("/dev/sdq"),
            name: "sdq".to_string(),
            live: true,
            session: None,
            protocol: Protocol::Scsi,
            initiator: None,
        });
        let e = exec
            .run(&path, Command::PrIn(PrInAction::ReadKeys), |t| {
                t.read_keys()
            })
            .await
            .unwrap_err();
        assert!(e.to_string().ends_with(". Hint: the device node could not be opened or used: each [[device]] path must name a disk (/dev/sdX, /dev/sgN, /dev/nvmeXnY, or a /dev/disk/by-id or /dev/mapper link to one) that exists, and the agent needs root (CAP_SYS_RAWIO for SCSI, CAP_SYS_ADMIN for NVMe: the packaged unit grants only the first)"), "{e}");
        assert!(hints::node_agent(ErrorKind::Timeout).contains("raise command_timeout"));
        let guard = exec.begin_heal(&"naa.1".into()).unwrap();
        assert!(exec.open_paths(&[path], guard).await.is_empty());
    }
}
