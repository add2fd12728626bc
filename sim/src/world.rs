//! The simulated cluster: the target models (an [`engine::testing::Cluster`]), each node's paths
//! as devices whose every command waits for the scheduler (the gate), the writers, and the log
//! of everything that reached the target, which the checker reads.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nvme_io::{NvmeCommand, NvmeCompletion, NvmeStatus, PrKeys, PrReservation, PrResult, PrType};
use prfence_engine::discover::LuId;
use prfence_engine::exec::{NvmeDevice, NvmePr, ScsiDevice, ScsiPr};
use prfence_engine::ops::{BootRecord, LuTarget, UnfenceBy, UnreachableData};
use prfence_engine::pr::Key;
use prfence_engine::spc_model::{
    CommandFilter, Injected, Injection, Io, ModelDevice, ScsiFailure, Timing, UnitAttention,
};
use prfence_engine::testing::nvmet::{Fake, Kernel};
use prfence_engine::testing::{Cluster, Medium, MemoryRecord, Port};
use prfence_engine::transport::{Policy, PrTransport};
use sg_io::{Completion, DataTransfer, DriverStatus, HostStatus, ScsiStatus};

use crate::sched::{Fault, Grant, Nanos, Sim};

/// Something that happened, in the order it happened.
#[derive(Debug, Clone)]
pub enum SimEvent {
    /// A command reached the target (or timed out on the way).
    Command {
        time: Nanos,
        node: usize,
        label: Arc<str>,
        lu: usize,
        path: usize,
        what: String,
        outcome: String,
        fault: Option<String>,
        /// Keys registered on the LU afterwards that were not before, and the reverse.
        added: Vec<Key>,
        removed: Vec<Key>,
    },
    /// A write was admitted (or refused) by the target's access check.
    Write {
        time: Nanos,
        node: usize,
        lu: usize,
        path: usize,
        admitted: bool,
        /// The index in the log of the admission, for a write's landing (its data reaching the
        /// medium, later).
        landing_of: Option<usize>,
    },
    OpStart {
        time: Nanos,
        node: usize,
        id: usize,
        op: Op,
    },
    OpEnd {
        time: Nanos,
        node: usize,
        id: usize,
        op: Op,
        outcome: Outcome,
        summary: String,
        /// A fence that succeeded with data LUs reported not fenced (`unreachable=report`):
        /// their indexes.
        unfenced: Vec<usize>,
    },
    /// A fault outside any one command: a re-login, a power cycle, a pause.
    Injected { time: Nanos, what: Happening },
    /// A lease agent's standby preempted `victim` (the holder's key) on `lu`: from here on the
    /// victim's node may not write there (P1) nor its key come back (P3).
    LeasePreempted {
        time: Nanos,
        node: usize,
        lu: usize,
        victim: Key,
    },
    /// A lease agent's machine changed role on `lu`.
    LeaseRole {
        time: Nanos,
        node: usize,
        lu: usize,
        role: String,
    },
    /// A lease agent self-fenced: its node stops (its writer too).
    SelfFenced {
        time: Nanos,
        node: usize,
        reason: String,
    },
}

pub use prfence_engine::ops::Outcome;

/// What a node does (one engine operation, or a loop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Unfence,
    /// fence_pr's `on` run again in the same boot (Pacemaker re-unfencing a node, perhaps one it
    /// has just fenced): an unfence told that the node registered on every LU before (scenarios
    /// start unfenced), so it refuses where the key was preempted since.
    Rejoin,
    Fence {
        victim: usize,
    },
    /// A fence repeated after an earlier one of the same victim succeeded (P4: no side effects).
    Refence {
        victim: usize,
    },
    Status,
    Heal,
    /// The node agent in lease mode (`prfence agent`, [lease]): one lease machine per LU, run
    /// until the horizon or until it self-fences.
    Lease,
    /// The node agent in watch mode: the watch machine over READ KEYS per LU and path probes,
    /// heal where it asks for one, until the horizon or until it self-fences.
    Watch,
    /// Not prfence: a bare REGISTER AND IGNORE EXISTING KEY of the node's key on every path, as
    /// a careless admin's sg_persist would send. Only the checker's own tests use it, to show
    /// that a key brought back behind a fence is caught.
    Register,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Unfence => f.write_str("unfence"),
            Op::Rejoin => f.write_str("rejoin"),
            Op::Fence { victim } => write!(f, "fence(n{victim})"),
            Op::Refence { victim } => write!(f, "refence(n{victim})"),
            Op::Status => f.write_str("status"),
            Op::Heal => f.write_str("heal"),
            Op::Register => f.write_str("register"),
            Op::Lease => f.write_str("lease"),
            Op::Watch => f.write_str("watch"),
        }
    }
}

/// A fault that is not one command's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Happening {
    /// An iSCSI re-login: the path reaches the LU through a new I_T nexus.
    Relogin {
        node: usize,
        lu: usize,
        path: usize,
    },
    /// The LU loses its PR state (power cycle without APTPL).
    PowerCycle {
        lu: usize,
    },
    Pause {
        node: usize,
    },
    Resume {
        node: usize,
    },
    /// The node's devices of the LU vanish (a logout, a LUN removed): its discovery can no longer
    /// identify the LU, so an operation started from here on names it by a device path, and every
    /// command through those paths fails at once.
    Vanish {
        node: usize,
        lu: usize,
    },
    /// The LU's array is unreachable from the node (its portal blocked, the array lost): every
    /// command of the node's to it comes back as a dead path's, the LU still identified.
    Cut {
        node: usize,
        lu: usize,
    },
}

impl std::fmt::Display for Happening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Happening::Relogin { node, lu, path } => {
                write!(
                    f,
                    "n{node} path {path} to LU{lu} logs in again (new I_T nexus)"
                )
            }
            Happening::PowerCycle { lu } => {
                write!(f, "LU{lu} power-cycled without APTPL (PR state lost)")
            }
            Happening::Pause { node } => write!(f, "n{node} paused"),
            Happening::Resume { node } => write!(f, "n{node} resumes"),
            Happening::Vanish { node, lu } => {
                write!(
                    f,
                    "n{node}'s devices of LU{lu} vanish (unidentifiable, dead)"
                )
            }
            Happening::Cut { node, lu } => {
                write!(f, "LU{lu}'s array becomes unreachable from n{node}")
            }
        }
    }
}

/// The simulated cluster.
pub struct World {
    pub sim: Arc<Sim>,
    cluster: Mutex<Cluster>,
    log: Mutex<Vec<SimEvent>>,
    /// Engine operations still running (the writers stop after the last one).
    ops_running: Mutex<usize>,
    /// Nodes whose agent self-fenced (their writers stop).
    self_fenced: Mutex<Vec<usize>>,
    /// Each lease agent's machines' roles, `[node][lu]`: holder (promoted) or not.
    pub holders: Mutex<Vec<Vec<bool>>>,
    pub policy: Policy,
    /// The keys of the nodes, by node.
    pub keys: Vec<Key>,
    /// (node, LU) whose devices vanished ([`Happening::Vanish`]).
    vanished: Mutex<Vec<(usize, usize)>>,
    /// (node, LU) cut off from each other ([`Happening::Cut`]).
    cut: Mutex<Vec<(usize, usize)>>,
    /// The LUs that hold data: the first ones; the rest are coordinators, which decide fences
    /// and are never written.
    data_lus: usize,
    /// A fence's fixed tie-break (`--tie-break SECS`); None: measured, the product's default.
    tie_break: Option<Duration>,
    /// What a coordinated fence does with a data LU out of its reach (`unreachable=report`).
    unreachable_data: UnreachableData,
    /// Each node's fence_pr record of its boot: the LUs its `on` registered on. A node set up
    /// unfenced ran its `on` before the run; a booting node's record starts empty.
    records: Vec<Arc<MemoryRecord>>,
    /// What the current step has touched, when the exhaustive search asks ([`World::trace`]).
    touched: Mutex<Option<Touched>>,
}

/// The shared objects one step reached, as bits: LU `l` is bit `l`, node `n`'s boot record bit
/// `lus + n` (the only state an operation's threads share besides the LUs and their fan-out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Touched {
    pub read: u64,
    /// Those whose state the step changed (a subset of `read`).
    pub changed: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl World {
    pub fn new(
        sim: Arc<Sim>,
        cluster: Cluster,
        keys: Vec<Key>,
        policy: Policy,
        tie_break: Option<Duration>,
        coordinators: usize,
        unreachable_data: UnreachableData,
    ) -> Arc<World> {
        let data_lus = cluster.lus.len().saturating_sub(coordinators);
        let records = keys
            .iter()
            .map(|_| {
                Arc::new(MemoryRecord::of(
                    (0..cluster.lus.len()).map(|lu| LuId::Designator(Cluster::lu_id(lu).into())),
                ))
            })
            .collect();
        Arc::new(World {
            sim,
            cluster: Mutex::new(cluster),
            log: Mutex::new(Vec::new()),
            ops_running: Mutex::new(0),
            self_fenced: Mutex::new(Vec::new()),
            holders: Mutex::new(Vec::new()),
            policy,
            keys,
            vanished: Mutex::new(Vec::new()),
            cut: Mutex::new(Vec::new()),
            data_lus,
            tie_break,
            unreachable_data,
            records,
            touched: Mutex::new(None),
        })
    }

    /// From now on, note what each step touches ([`World::take_touched`]).
    pub fn trace(&self) {
        *lock(&self.touched) = Some(Touched::default());
    }

    /// What was touched since the last call (nothing when not tracing).
    pub fn take_touched(&self) -> Touched {
        lock(&self.touched)
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn tracing(&self) -> bool {
        lock(&self.touched).is_some()
    }

    fn touch(&self, object: usize, changed: bool) {
        if let Some(t) = lock(&self.touched).as_mut() {
            t.read |= 1 << object;
            if changed {
                t.changed |= 1 << object;
            }
        }
    }

    /// `medium`'s whole state when tracing, to tell whether a command changed it (a unit
    /// attention consumed as much as a key removed).
    fn state_of(&self, medium: &Medium) -> Option<String> {
        self.tracing().then(|| match medium {
            Medium::Scsi(l) => format!("{:?}", *lock(l)),
            Medium::Nvme(n) => format!("{:?}", *lock(n)),
        })
    }

    /// Node `node` starts its boot: unregistered, its fence_pr record empty.
    pub fn boot(&self, node: usize) {
        if let Some(record) = self.records.get(node) {
            record.clear();
        }
    }

    /// Whether node `node`'s devices of LU `lu` vanished.
    pub fn vanished(&self, node: usize, lu: usize) -> bool {
        lock(&self.vanished).contains(&(node, lu))
    }

    /// Whether LU `lu` is unreachable from node `node`.
    pub fn cut(&self, node: usize, lu: usize) -> bool {
        lock(&self.cut).contains(&(node, lu))
    }

    /// The data LUs are `0..data_lus()`; the coordinators follow them.
    pub fn data_lus(&self) -> usize {
        self.data_lus
    }

    pub fn cluster(&self) -> MutexGuard<'_, Cluster> {
        lock(&self.cluster)
    }

    pub fn log(&self) -> MutexGuard<'_, Vec<SimEvent>> {
        lock(&self.log)
    }

    pub fn record(&self, event: SimEvent) {
        lock(&self.log).push(event);
    }

    pub fn key(&self, node: usize) -> Key {
        self.keys.get(node).copied().unwrap_or(Key::ZERO)
    }

    /// The node whose key this is.
    pub fn owner(&self, key: Key) -> Option<usize> {
        self.keys.iter().position(|&k| k == key)
    }

    pub fn ops_running(&self) -> usize {
        *lock(&self.ops_running)
    }

    /// Node `node`'s view of the LUs: every path a gated device. An LU whose devices vanished
    /// is named by its first device path, as the CLI's discovery names a device it cannot
    /// identify (`ops::targets`).
    pub fn targets(self: &Arc<Self>, node: usize) -> Vec<LuTarget<Arc<dyn PrTransport>>> {
        let mut targets = self.paths_of(node);
        let vanished = lock(&self.vanished);
        for lu in vanished
            .iter()
            .filter(|(n, _)| *n == node)
            .map(|(_, lu)| *lu)
        {
            if let Some(target) = targets.iter_mut().find(|t| t.id == Cluster::lu_id(lu)) {
                target.id = LuId::NodeLocal(Cluster::device(node, lu, 0).into());
            }
        }
        drop(vanished);
        targets
    }

    fn paths_of(self: &Arc<Self>, node: usize) -> Vec<LuTarget<Arc<dyn PrTransport>>> {
        let cluster = self.cluster();
        cluster.targets(node, |spec| -> Arc<dyn PrTransport> {
            let gate = Gate {
                world: Arc::clone(self),
                lu: spec.lu,
                node: spec.node,
                path: spec.path,
                device: spec.device.clone(),
            };
            match (spec.medium, spec.port) {
                (Medium::Nvme(ns), Port::Host(host)) => Arc::new(NvmePr::new(
                    NvmeGate {
                        fake: Fake::new(ns, host, spec.device, Kernel::CURRENT),
                        gate,
                    },
                    self.policy,
                )),
                _ => Arc::new(ScsiPr::new(gate, self.policy)),
            }
        })
    }

    /// The data LUs and the coordinators of `targets`: fences race on the coordinators, every
    /// other operation works on all the LUs (fence_pr's `on` registers on the coordinators too).
    #[allow(clippy::type_complexity)]
    fn apart(
        &self,
        targets: Vec<LuTarget<Arc<dyn PrTransport>>>,
    ) -> (
        Vec<LuTarget<Arc<dyn PrTransport>>>,
        Vec<LuTarget<Arc<dyn PrTransport>>>,
    ) {
        targets
            .into_iter()
            .partition(|t| !self.is_coordinator(&t.id))
    }

    /// Whether `id` names one of the coordinators.
    fn is_coordinator(&self, id: &LuId) -> bool {
        let total = self.cluster().lus.len();
        (self.data_lus..total).any(|lu| *id == Cluster::lu_id(lu))
    }

    /// Runs one engine operation as node `node`, at `at` on its clock, logging its start and
    /// end. Called on a simulated thread.
    pub fn run_op(self: &Arc<Self>, node: usize, id: usize, op: Op, at: Nanos) {
        *lock(&self.ops_running) += 1;
        prfence_engine::runtime::sleep(Duration::from_nanos(at));
        let now = self.sim.now();
        self.record(SimEvent::OpStart {
            time: now,
            node,
            id,
            op,
        });
        let own = self.key(node);
        let limits = prfence_engine::ops::Limits {
            tie_break: match self.tie_break {
                Some(wait) => prfence_engine::ops::TieBreak::Fixed(wait),
                None => prfence_engine::ops::TieBreak::measured_from_now(),
            },
            ..prfence_engine::ops::Limits::default()
        };
        let targets = self.targets(node);
        let result = match op {
            Op::Unfence | Op::Rejoin => {
                let record: Arc<dyn BootRecord> = match self.records.get(node) {
                    Some(record) => Arc::new(TracedRecord {
                        record: Arc::clone(record),
                        world: Arc::clone(self),
                        object: self.cluster().lus.len() + node,
                    }),
                    None => Arc::new(MemoryRecord::default()),
                };
                let by = if op == Op::Rejoin {
                    UnfenceBy::Rejoin(record)
                } else {
                    UnfenceBy::Admin(record)
                };
                let initiators = lock(&self.cluster).own_initiators(node);
                prfence_engine::ops::unfence_observed(
                    targets,
                    own,
                    by,
                    &initiators,
                    limits,
                    &mut |_| {},
                )
            }
            Op::Fence { victim } | Op::Refence { victim } => {
                let (data, coordinators) = self.apart(targets);
                let arbitration = if coordinators.is_empty() {
                    prfence_engine::ops::Arbitration::FirstLu
                } else {
                    prfence_engine::ops::Arbitration::Coordinators {
                        lus: coordinators,
                        unreachable_data: self.unreachable_data,
                    }
                };
                prfence_engine::ops::fence_arbitrated_observed(
                    data,
                    arbitration,
                    own,
                    self.key(victim),
                    limits,
                    &mut |_| {},
                )
            }
            Op::Status => prfence_engine::ops::status(targets, own, limits),
            Op::Heal => prfence_engine::ops::heal(targets, own, limits),
            Op::Lease => {
                self.run_lease_agent(node);
                Err(prfence_engine::ops::RequestError::NoLus)
            }
            Op::Watch => {
                self.run_watch_agent(node);
                Err(prfence_engine::ops::RequestError::NoLus)
            }
            Op::Register => {
                for lu in &targets {
                    for path in &lu.paths {
                        let _ = path.pr_out(&prfence_engine::pr::PrOut::register_ignore(own));
                    }
                }
                Err(prfence_engine::ops::RequestError::NoLus)
            }
        };
        let (outcome, summary, unfenced) = match result {
            Ok(report) => {
                let unfenced = match op {
                    Op::Fence { .. } | Op::Refence { .. } if report.outcome == Outcome::Success => {
                        report
                            .lus
                            .iter()
                            .filter(|r| !r.ok)
                            .filter_map(|r| {
                                (0..self.data_lus).find(|&lu| r.lu == Cluster::lu_id(lu))
                            })
                            .collect()
                    }
                    _ => Vec::new(),
                };
                (report.outcome, report.summary, unfenced)
            }
            Err(e) => (Outcome::Failure, e.to_string(), Vec::new()),
        };
        self.record(SimEvent::OpEnd {
            time: self.sim.now(),
            node,
            id,
            op,
            outcome,
            summary,
            unfenced,
        });
        *lock(&self.ops_running) -= 1;
    }

    /// A writer on node `node`: every `interval` on its clock, one write through each path of
    /// each LU, until no engine operation is running any more (then one last round).
    pub fn run_writer(self: &Arc<Self>, node: usize, interval: Duration) {
        let (lus, paths) = {
            let c = self.cluster();
            (
                self.data_lus,
                (0..self.data_lus)
                    .map(|l| c.paths(l, node))
                    .collect::<Vec<_>>(),
            )
        };
        let mut last = false;
        loop {
            for lu in 0..lus {
                for path in 0..paths.get(lu).copied().unwrap_or(0) {
                    self.write(node, lu, path);
                }
            }
            if last {
                break;
            }
            prfence_engine::runtime::sleep(interval);
            last = self.ops_running() == 0 || lock(&self.self_fenced).contains(&node);
        }
    }

    /// One O_DIRECT write: admitted or refused by the target, then (if admitted) its data lands.
    fn write(&self, node: usize, lu: usize, path: usize) {
        if self.cut(node, lu) {
            return;
        }
        let grant = self.sim.submit(
            lu,
            format!("WRITE via path {path}"),
            Some(self.policy.timeout),
            false,
        );
        let admitted = match grant {
            Grant::Execute { .. } => {
                let cluster = self.cluster();
                let port = cluster.ports[lu][node][path];
                let before = self.state_of(&cluster.lus[lu]);
                let admitted = match (&cluster.lus[lu], port) {
                    (Medium::Scsi(l), Port::Nexus(nexus)) => {
                        lock(l).access(nexus, Io::Write).is_ok()
                    }
                    (Medium::Nvme(n), Port::Host(host)) => lock(n).may_write(host),
                    _ => false,
                };
                self.touch(lu, before != self.state_of(&cluster.lus[lu]));
                admitted
            }
            Grant::TimedOut { .. } => false,
        };
        let index = {
            let mut log = self.log();
            log.push(SimEvent::Write {
                time: self.sim.now(),
                node,
                lu,
                path,
                admitted,
                landing_of: None,
            });
            log.len() - 1
        };
        self.sim.after_command();
        if admitted {
            // The data reaches the medium later: a PREEMPT AND ABORT in between may or may not
            // stop it (LIO: only if the victim held the reservation when it was admitted).
            let _ = self
                .sim
                .submit(lu, format!("WRITE lands via path {path}"), None, true);
            self.record(SimEvent::Write {
                time: self.sim.now(),
                node,
                lu,
                path,
                admitted: true,
                landing_of: Some(index),
            });
            self.sim.after_command();
        }
    }

    /// A fault outside the commands, applied by the scheduler between steps.
    pub fn happen(&self, what: Happening) {
        match what {
            Happening::Relogin { node, lu, path } => self.cluster().relogin(lu, node, path),
            Happening::PowerCycle { lu } => self.cluster().power_cycle(lu),
            Happening::Pause { node } => self.sim.set_paused(node, true),
            Happening::Resume { node } => self.sim.set_paused(node, false),
            Happening::Vanish { node, lu } => lock(&self.vanished).push((node, lu)),
            Happening::Cut { node, lu } => lock(&self.cut).push((node, lu)),
        }
        self.record(SimEvent::Injected {
            time: self.sim.now(),
            what,
        });
    }
}

/// A node's boot record as the engine's unfence uses it, noting each use for the exhaustive
/// search: two unfences of one node share it.
struct TracedRecord {
    record: Arc<MemoryRecord>,
    world: Arc<World>,
    object: usize,
}

impl BootRecord for TracedRecord {
    fn contains(&self, lu: &LuId) -> bool {
        self.world.touch(self.object, false);
        self.record.contains(lu)
    }

    fn add(&self, lu: &LuId) -> Result<(), String> {
        self.world.touch(self.object, true);
        self.record.add(lu)
    }
}

/// One node's path to one LU, whose every command waits for the scheduler.
pub struct Gate {
    world: Arc<World>,
    lu: usize,
    node: usize,
    path: usize,
    device: PathBuf,
}

impl Gate {
    /// Whether the LU is cut off from this node ([`Happening::Cut`]): then `what` is logged as
    /// never reaching the target, and fails as a dead path's command does.
    fn cut_off(&self, what: &str) -> bool {
        if !self.world.cut(self.node, self.lu) {
            return false;
        }
        self.log_command(
            what.to_owned(),
            "unreachable (the LU's array is cut off from this node)".to_owned(),
            None,
            (Vec::new(), Vec::new()),
        );
        true
    }

    /// Logs one command of this path's: what, the target's answer, its injected fault, and the
    /// keys it (added, removed).
    fn log_command(
        &self,
        what: String,
        outcome: String,
        fault: Option<String>,
        (added, removed): (Vec<Key>, Vec<Key>),
    ) {
        self.world.record(SimEvent::Command {
            time: self.world.sim.now(),
            node: self.node,
            label: self.world.sim.label(),
            lu: self.lu,
            path: self.path,
            what,
            outcome,
            fault,
            added,
            removed,
        });
    }

    /// Submits `what`, carries the outcome out on the target with `execute` (given the LU's state
    /// and this path's port, and whether the command is to fail after executing), and logs it.
    fn gated<R>(
        &self,
        what: String,
        timeout: Option<Duration>,
        execute: impl FnOnce(&Medium, Port, Fault) -> R,
        timed_out: impl FnOnce() -> R,
        describe: impl FnOnce(&R) -> String,
    ) -> R {
        let grant = self.world.sim.submit(self.lu, what.clone(), timeout, false);
        let (result, fault, before, after) = {
            let cluster = self.world.cluster();
            let before = cluster.keys(self.lu);
            let medium = cluster.lus[self.lu].clone();
            let state = self.world.state_of(&medium);
            let port = cluster.ports[self.lu][self.node][self.path];
            let (result, fault) = match grant {
                Grant::Execute { fault } => (execute(&medium, port, fault), fault),
                Grant::TimedOut { applied } => {
                    if applied {
                        let _ = execute(&medium, port, Fault::None);
                    }
                    (
                        timed_out(),
                        if applied {
                            Fault::LostResponse
                        } else {
                            Fault::None
                        },
                    )
                }
            };
            let after = cluster.keys(self.lu);
            self.world
                .touch(self.lu, state != self.world.state_of(&medium));
            (result, fault, before, after)
        };
        let outcome = match grant {
            Grant::TimedOut { applied } => format!(
                "timed out ({})",
                if applied {
                    "applied, the response lost"
                } else {
                    "never reached the target"
                }
            ),
            Grant::Execute { .. } => describe(&result),
        };
        self.log_command(
            what,
            outcome,
            (fault != Fault::None).then(|| format!("{fault:?}")),
            (difference(&after, &before), difference(&before, &after)),
        );
        self.world.sim.after_command();
        result
    }
}

/// The keys in `a` beyond those in `b` (as multisets: a second registration of a key counts).
fn difference(a: &[Key], b: &[Key]) -> Vec<Key> {
    let mut rest = b.to_vec();
    a.iter()
        .filter(|k| {
            if let Some(i) = rest.iter().position(|r| r == *k) {
                rest.swap_remove(i);
                false
            } else {
                true
            }
        })
        .copied()
        .collect()
}

/// A SCSI command's injected fault, as the model's own injection.
fn scsi_injection(fault: Fault) -> Option<Injection> {
    let (fault, timing) = match fault {
        Fault::None => return None,
        Fault::LostResponse => (Injected::TransportDown, Timing::AfterExecuting),
        Fault::NotReady => (
            Injected::Failure(ScsiFailure::lio_communication_failure()),
            Timing::InsteadOfExecuting,
        ),
        Fault::NotReadyAfter => (
            Injected::Failure(ScsiFailure::lio_communication_failure()),
            Timing::AfterExecuting,
        ),
        Fault::UnitAttention => (
            Injected::Failure(UnitAttention::POWER_ON.to_failure()),
            Timing::InsteadOfExecuting,
        ),
    };
    Some(Injection {
        fault,
        timing,
        filter: CommandFilter::Any,
        count: 1,
    })
}

/// What a CDB is, in the words of the trace.
fn describe_cdb(cdb: &[u8], data: &DataTransfer<'_>) -> String {
    let action = cdb.get(1).copied().unwrap_or(0) & 0x1f;
    match cdb.first() {
        Some(0x5e) => match action {
            0 => "READ KEYS".to_owned(),
            1 => "READ RESERVATION".to_owned(),
            2 => "REPORT CAPABILITIES".to_owned(),
            3 => "READ FULL STATUS".to_owned(),
            a => format!("PR IN {a}"),
        },
        Some(0x5f) => {
            let (rk, sark) = match data {
                DataTransfer::ToDevice(p) if p.len() >= 16 => (be64(&p[0..8]), be64(&p[8..16])),
                _ => (0, 0),
            };
            let name = match action {
                0 => "REGISTER",
                1 => "RESERVE",
                2 => "RELEASE",
                3 => "CLEAR",
                4 => "PREEMPT",
                5 => "PREEMPT AND ABORT",
                6 => "REGISTER AND IGNORE EXISTING KEY",
                7 => "REGISTER AND MOVE",
                _ => "PR OUT",
            };
            format!("{name} key {rk:#x} sa-key {sark:#x}")
        }
        Some(op) => format!("opcode {op:#04x}"),
        None => "empty CDB".to_owned(),
    }
}

fn be64(b: &[u8]) -> u64 {
    b.iter().fold(0, |acc, &x| (acc << 8) | u64::from(x))
}

fn timed_out_completion() -> Completion {
    Completion {
        status: ScsiStatus::GOOD,
        host_status: HostStatus::TIME_OUT,
        driver_status: DriverStatus::OK,
        sense_bytes: Vec::new(),
        resid: 0,
        duration: Duration::ZERO,
    }
}

fn describe_completion(c: &Result<Completion, sg_io::Error>) -> String {
    match c {
        Ok(c) if c.host_status != HostStatus::DID_OK => format!("host status {}", c.host_status),
        Ok(c) if c.sense_bytes.len() > 13 => format!(
            "{} sense {:02x}/{:02x}/{:02x}",
            c.status,
            c.sense_bytes[2] & 0xf,
            c.sense_bytes[12],
            c.sense_bytes[13]
        ),
        Ok(c) => c.status.to_string(),
        Err(e) => e.to_string(),
    }
}

impl ScsiDevice for Gate {
    fn path(&self) -> &Path {
        &self.device
    }

    fn execute(
        &self,
        cdb: &[u8],
        data: DataTransfer<'_>,
        timeout: Duration,
    ) -> Result<Completion, sg_io::Error> {
        if self.world.vanished(self.node, self.lu) {
            return Err(sg_io::Error::Open {
                path: self.device.clone(),
                source: std::io::Error::from_raw_os_error(ENOENT),
            });
        }
        let what = describe_cdb(cdb, &data);
        if self.cut_off(&what) {
            return Ok(timed_out_completion());
        }
        let device = self.device.clone();
        self.gated(
            what,
            Some(timeout),
            move |medium, port, fault| {
                let (Medium::Scsi(lu), Port::Nexus(nexus)) = (medium, port) else {
                    return Ok(timed_out_completion());
                };
                if let Some(injection) = scsi_injection(fault) {
                    lock(lu).inject(nexus, injection);
                }
                ModelDevice::new(Arc::clone(lu), nexus, device).execute(cdb, data, timeout)
            },
            || Ok(timed_out_completion()),
            describe_completion,
        )
    }
}

/// An NVMe namespace path: the nvmet model's host device behind the gate.
pub struct NvmeGate {
    fake: Fake,
    gate: Gate,
}

fn lost(fake: &Fake, ioctl: &'static str) -> nvme_io::NvmeError {
    nvme_io::NvmeError::Ioctl {
        path: fake.path.clone(),
        ioctl,
        source: std::io::Error::from_raw_os_error(nix_eio()),
    }
}

/// EIO, without a libc dependency of our own.
fn nix_eio() -> i32 {
    5
}

/// ENOENT: the errno of an open of a device node that vanished.
const ENOENT: i32 = 2;

fn vanished_nvme(fake: &Fake, ioctl: &'static str) -> nvme_io::NvmeError {
    nvme_io::NvmeError::Ioctl {
        path: fake.path.clone(),
        ioctl,
        source: std::io::Error::from_raw_os_error(ENOENT),
    }
}

/// The kernel's NVMe I/O timeout (`nvme_core.io_timeout`, 30 s by default): the block PR ioctls
/// take no timeout of their own, so this is when one comes back failed from a dead path.
const KERNEL_IO_TIMEOUT: Duration = Duration::from_secs(30);

impl NvmeGate {
    /// A block PR ioctl: no timeout of its own (the kernel's I/O timeout applies).
    fn block<R: std::fmt::Debug>(
        &self,
        ioctl: &'static str,
        what: String,
        call: impl FnOnce(&Fake) -> Result<R, nvme_io::NvmeError>,
    ) -> Result<R, nvme_io::NvmeError> {
        let fake = &self.fake;
        if self.gate.world.vanished(self.gate.node, self.gate.lu) {
            return Err(vanished_nvme(fake, ioctl));
        }
        if self.gate.cut_off(&what) {
            return Err(lost(fake, ioctl));
        }
        self.gate.gated(
            what,
            Some(KERNEL_IO_TIMEOUT),
            |_, _, fault| {
                let result = call(fake);
                if fault == Fault::LostResponse {
                    Err(lost(fake, ioctl))
                } else {
                    result
                }
            },
            || Err(lost(fake, ioctl)),
            |r| format!("{r:?}"),
        )
    }

    fn passthru(
        &self,
        ioctl: &'static str,
        command: &NvmeCommand,
        timeout: Duration,
        call: impl FnOnce(&Fake) -> Result<NvmeCompletion, nvme_io::NvmeError>,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError> {
        let fake = &self.fake;
        if self.gate.world.vanished(self.gate.node, self.gate.lu) {
            return Err(vanished_nvme(fake, ioctl));
        }
        let what = format!(
            "{ioctl} opcode {:#04x} cdw10 {:#x}",
            command.opcode, command.cdw10
        );
        if self.gate.cut_off(&what) {
            return Err(lost(fake, ioctl));
        }
        self.gate.gated(
            what,
            Some(timeout),
            |_, _, fault| {
                let result = call(fake);
                match fault {
                    Fault::LostResponse => Err(lost(fake, ioctl)),
                    Fault::NotReady | Fault::NotReadyAfter => Ok(NvmeCompletion {
                        status: NvmeStatus::NAMESPACE_NOT_READY,
                        result: 0,
                    }),
                    Fault::None | Fault::UnitAttention => result,
                }
            },
            || {
                Err(nvme_io::NvmeError::Ioctl {
                    path: fake.path.clone(),
                    ioctl,
                    source: std::io::Error::from_raw_os_error(110),
                })
            },
            |r| format!("{r:?}"),
        )
    }
}

impl NvmeDevice for NvmeGate {
    fn path(&self) -> &Path {
        &self.gate.device
    }
    fn pr_register(
        &self,
        old: u64,
        new: u64,
        ignore: bool,
    ) -> Result<PrResult<()>, nvme_io::NvmeError> {
        self.block(
            "IOC_PR_REGISTER",
            format!("IOC_PR_REGISTER old {old:#x} new {new:#x} ignore {ignore}"),
            |f| f.pr_register(old, new, ignore),
        )
    }
    fn pr_reserve(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::NvmeError> {
        self.block(
            "IOC_PR_RESERVE",
            format!("IOC_PR_RESERVE key {key:#x} type {}", rtype.code()),
            |f| f.pr_reserve(key, rtype),
        )
    }
    fn pr_release(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::NvmeError> {
        self.block(
            "IOC_PR_RELEASE",
            format!("IOC_PR_RELEASE key {key:#x} type {}", rtype.code()),
            |f| f.pr_release(key, rtype),
        )
    }
    fn pr_preempt(
        &self,
        old: u64,
        new: u64,
        rtype: PrType,
        abort: bool,
    ) -> Result<PrResult<()>, nvme_io::NvmeError> {
        self.block(
            "IOC_PR_PREEMPT",
            format!(
                "IOC_PR_PREEMPT{} key {old:#x} victim {new:#x} type {}",
                if abort { "_ABORT" } else { "" },
                rtype.code()
            ),
            |f| f.pr_preempt(old, new, rtype, abort),
        )
    }
    fn pr_clear(&self, key: u64) -> Result<PrResult<()>, nvme_io::NvmeError> {
        self.block("IOC_PR_CLEAR", format!("IOC_PR_CLEAR key {key:#x}"), |f| {
            f.pr_clear(key)
        })
    }
    fn pr_read_keys(&self, keys: &mut [u64]) -> Result<PrResult<PrKeys>, nvme_io::NvmeError> {
        self.block("IOC_PR_READ_KEYS", "IOC_PR_READ_KEYS".to_owned(), |f| {
            f.pr_read_keys(keys)
        })
    }
    fn pr_read_reservation(&self) -> Result<PrResult<PrReservation>, nvme_io::NvmeError> {
        self.block(
            "IOC_PR_READ_RESERVATION",
            "IOC_PR_READ_RESERVATION".to_owned(),
            Fake::pr_read_reservation,
        )
    }
    fn nsid(&self) -> Result<u32, nvme_io::NvmeError> {
        self.fake.nsid()
    }
    fn io_passthru(
        &self,
        command: &NvmeCommand,
        data: nvme_io::NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError> {
        self.passthru("NVME_IOCTL_IO_CMD", command, timeout, |f| {
            f.io_passthru(command, data, timeout)
        })
    }
    fn admin_passthru(
        &self,
        command: &NvmeCommand,
        data: nvme_io::NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError> {
        self.passthru("NVME_IOCTL_ADMIN_CMD", command, timeout, |f| {
            f.admin_passthru(command, data, timeout)
        })
    }
}

/// How long a lease agent runs, on its own clock.
pub const LEASE_HORIZON: Duration = Duration::from_secs(20);

/// The lease timings of the simulated agents: valid by `config`'s rules (renew < lease / 2,
/// margin ≥ 2ρ·lease for ρ up to 2000 ppm, check_interval ≤ lease / 2, command_timeout ≤ renew).
pub fn lease_config(node: usize) -> prfence::daemon::lease::LeaseConfig {
    prfence::daemon::lease::LeaseConfig {
        node: std::num::NonZeroU16::new(u16::try_from(node + 1).unwrap_or(u16::MAX))
            .unwrap_or(std::num::NonZeroU16::MIN),
        renew: Duration::from_secs(1),
        lease: Duration::from_secs(4),
        margin: Duration::from_secs(1),
        check_interval: Duration::from_millis(500),
        watchdog_timeout: None,
    }
}

/// One LU's paths of a simulated node, for the agent's lease commands ([`commands`](prfence::daemon::lease::commands)).
struct SimPaths {
    paths: Vec<Arc<dyn PrTransport>>,
    lu: String,
}

impl prfence::daemon::lease::commands::LeasePaths for SimPaths {
    fn live(&self) -> usize {
        self.paths.len()
    }
    fn run<T, F>(
        &self,
        index: usize,
        command: prfence_engine::transport::Command,
        f: F,
    ) -> Result<T, prfence_engine::transport::CommandError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn PrTransport) -> Result<T, prfence_engine::transport::CommandError>
            + Send
            + 'static,
    {
        match self.paths.get(index) {
            Some(path) => f(path.as_ref()),
            None => Err(self.none(command)),
        }
    }
    fn none(
        &self,
        command: prfence_engine::transport::Command,
    ) -> prfence_engine::transport::CommandError {
        prfence_engine::transport::CommandError::without_completion(
            Path::new(&self.lu),
            command,
            prfence_engine::transport::ErrorKind::Transport,
            "no path",
        )
    }
    fn lu(&self) -> &str {
        &self.lu
    }
}

impl World {
    /// The node agent in lease mode, as `lease::driver` drives it: the lease machines themselves
    /// (`daemon::lease`), their commands through `lease::commands`, each action on a thread of its own
    /// and its completion reported back; a self-fence stops the node. No epoch file (no node
    /// restarts here): the first epoch comes from the keys on the target.
    fn run_lease_agent(self: &Arc<Self>, node: usize) {
        use prfence::daemon::lease::commands;
        use prfence::daemon::lease::{
            self as lease, EpochSources, Lease, LeaseAction, LeaseCompletion, Role, StartView,
        };
        use prfence_engine::runtime;

        let rtype = prfence_engine::pr::ReservationType::WriteExclusive;
        let config = lease_config(node);
        let lus: Vec<Arc<SimPaths>> = {
            let mut targets = self.targets(node);
            targets.sort_by(|a, b| a.id.cmp(&b.id));
            targets
                .into_iter()
                .map(|t| {
                    Arc::new(SimPaths {
                        paths: t.paths,
                        lu: t.id.to_string(),
                    })
                })
                .collect()
        };
        {
            let mut holders = lock(&self.holders);
            if holders.len() <= node {
                holders.resize(node + 1, Vec::new());
            }
            holders[node] = vec![false; lus.len()];
        }
        let mut views = Vec::new();
        for paths in &lus {
            let holder = commands::read_reservation(paths.as_ref()).ok().flatten();
            let keys = commands::first_live(
                paths.as_ref(),
                prfence_engine::transport::Command::PrIn(prfence_engine::pr::PrInAction::ReadKeys),
                |t| t.read_keys(),
            )
            .map(|k| k.keys)
            .unwrap_or_default();
            views.push(StartView { holder, keys });
        }
        let on_target: Vec<Key> = views.iter().flat_map(|v| v.keys.iter().copied()).collect();
        let Ok(first_epoch) = lease::starting_epoch(
            config.node,
            &EpochSources {
                persisted: None,
                on_target: &on_target,
                wall_clock_ms: None,
            },
        ) else {
            return;
        };
        let start = runtime::now();
        let mut leases: Vec<Lease> = views
            .iter()
            .map(|view| Lease::new(config.clone(), first_epoch, None, view, start))
            .collect();
        let (send, receive) = runtime::channel::<(usize, LeaseCompletion)>();
        let mut roles: Vec<Option<Role>> = vec![None; lus.len()];
        loop {
            let now = runtime::now();
            for (index, machine) in leases.iter_mut().enumerate() {
                while let Some(action) = machine.poll(now) {
                    match action {
                        LeaseAction::SelfFence(reason) => {
                            lock(&self.self_fenced).push(node);
                            lock(&self.holders)[node]
                                .iter_mut()
                                .for_each(|h| *h = false);
                            self.record(SimEvent::SelfFenced {
                                time: self.sim.now(),
                                node,
                                reason: format!("LU{index}: {reason}"),
                            });
                            return;
                        }
                        LeaseAction::Promoted { .. } => {}
                        action => {
                            let (paths, send, world) =
                                (Arc::clone(&lus[index]), send.clone(), Arc::clone(self));
                            let label = Arc::from(format!("n{node} lease LU{index}"));
                            let _ = self.sim.start(
                                node,
                                label,
                                Box::new(move || {
                                    let completion = match action {
                                        LeaseAction::Join { key, .. } => {
                                            commands::join(paths.as_ref(), key)
                                        }
                                        LeaseAction::ReadReservation => LeaseCompletion::Reservation(
                                            commands::read_reservation(paths.as_ref()).map_err(
                                                |e| {
                                                    prfence::daemon::failure::CommandFailure::of(&e)
                                                },
                                            ),
                                        ),
                                        LeaseAction::Renew { from, to, .. } => {
                                            commands::renew(&paths, &from, to).completion
                                        }
                                        LeaseAction::Preempt { own, victim } => {
                                            let done = commands::preempt(
                                                paths.as_ref(),
                                                own,
                                                victim,
                                                rtype,
                                            );
                                            if let LeaseCompletion::Preempt(Ok(())) = done {
                                                world.record(SimEvent::LeasePreempted {
                                                    time: world.sim.now(),
                                                    node,
                                                    lu: index,
                                                    victim,
                                                });
                                            }
                                            done
                                        }
                                        LeaseAction::Reserve { own } => {
                                            commands::reserve(paths.as_ref(), own, rtype)
                                        }
                                        LeaseAction::Promoted { .. }
                                        | LeaseAction::SelfFence(_) => {
                                            return;
                                        }
                                    };
                                    send.send((index, completion));
                                }),
                            );
                        }
                    }
                }
                let role = machine.role();
                if roles[index] != Some(role) {
                    roles[index] = Some(role);
                    lock(&self.holders)[node][index] = role == Role::Holder { promoted: true };
                    self.record(SimEvent::LeaseRole {
                        time: self.sim.now(),
                        node,
                        lu: index,
                        role: format!("{role:?}"),
                    });
                }
            }
            let horizon = start + LEASE_HORIZON;
            if now >= horizon {
                return;
            }
            let wake = leases
                .iter()
                .filter_map(Lease::next_wakeup)
                .fold(horizon, std::time::Instant::min);
            if let Some((index, completion)) = receive.recv_until(wake)
                && let Some(machine) = leases.get_mut(index)
            {
                machine.complete(runtime::now(), completion);
            }
        }
    }
}

impl World {
    /// The node agent in watch mode, as `watch::driver` drives it: every check interval one READ
    /// KEYS per LU (and a probe of every path when the machine asks), the watch machine itself
    /// (`daemon::watch`) judging, `ops::heal` where it asks for a heal, and a self-fence (the
    /// node's writer stops) when it decides the node was fenced. Armed from the start: the
    /// scenarios start with every node unfenced.
    fn run_watch_agent(self: &Arc<Self>, node: usize) {
        use prfence::daemon::watch::{
            LuKeys, LuName, LuVerdict, Observation, PathId, ProbedPath, WatchConfig, WatchState,
        };
        use prfence_engine::runtime;

        const CHECK_INTERVAL: Duration = Duration::from_millis(500);
        let own = self.key(node);
        let mut targets = self.targets(node);
        targets.sort_by(|a, b| a.id.cmp(&b.id));
        let config = WatchConfig {
            own_key: own,
            grace: Duration::from_secs(20),
            missing_confirmations: 2,
            heal: true,
            // The opt-in periodic probe too, so that more of its PR OUTs meet other nodes' fences.
            path_audit: Some(Duration::from_secs(60)),
            // Judged as `coordinator = true` in the agent's configuration.
            coordinators: targets
                .iter()
                .filter(|t| self.is_coordinator(&t.id))
                .map(|t| LuName(t.id.to_string()))
                .collect(),
        };
        let start = runtime::now();
        let mut state = WatchState::new(
            config,
            targets.iter().map(|t| LuName(t.id.to_string())),
            start,
        );
        let mut inspect = vec![true; targets.len()];
        while runtime::now() < start + LEASE_HORIZON {
            let mut observations = Vec::new();
            for (index, lu) in targets.iter().enumerate() {
                let keys = lu.paths.iter().find_map(|p| p.read_keys().ok());
                let result = match keys {
                    Some(keys) => {
                        let paths = inspect[index].then(|| {
                            lu.paths
                                .iter()
                                .enumerate()
                                .map(|(i, p)| ProbedPath {
                                    path: PathId(format!("p{i}")),
                                    registered: prfence_engine::ops::probe_registration(
                                        p.as_ref(),
                                        own,
                                    )
                                    .unwrap_or(true),
                                })
                                .collect()
                        });
                        Ok(LuKeys {
                            keys: keys.keys,
                            path_count: match lu.paths.first().map(|p| p.protocol()) {
                                Some(prfence_engine::transport::Protocol::Nvme) => 1,
                                _ => lu.paths.len(),
                            },
                            paths,
                            paths_changed: false,
                            generation: keys.generation,
                            probe_failed: false,
                        })
                    }
                    None => Err(prfence::daemon::failure::CommandFailure::Unreachable),
                };
                observations.push(Observation {
                    lu: LuName(lu.id.to_string()),
                    result,
                });
            }
            let decision = state.tick(runtime::now(), observations);
            if let Some(reason) = decision.fenced.as_ref().filter(|_| decision.newly_fenced) {
                lock(&self.self_fenced).push(node);
                self.record(SimEvent::SelfFenced {
                    time: self.sim.now(),
                    node,
                    reason: reason.to_string(),
                });
                return;
            }
            for (index, (_, verdict)) in decision.lus.iter().enumerate() {
                inspect[index] = matches!(verdict, LuVerdict::InspectPaths { .. });
                if let LuVerdict::Heal { .. } = verdict
                    && let Some(lu) = targets.get(index)
                {
                    let one = vec![LuTarget {
                        id: lu.id.clone(),
                        paths: lu.paths.clone(),
                    }];
                    let _ =
                        prfence_engine::ops::heal(one, own, prfence_engine::ops::Limits::default());
                }
            }
            runtime::sleep(CHECK_INTERVAL);
        }
    }
}
