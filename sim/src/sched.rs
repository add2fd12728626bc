//! The scheduler: simulated threads that run one at a time, simulated time, and the commands
//! they wait on.
//!
//! Every simulated thread is an OS thread, but only the one holding the turn runs; the others
//! wait on their own condition variable. A thread gives the turn on (to the next runnable
//! thread, or back to the scheduler) when it waits for something: a PR command or a write
//! (`submit`), the clock (`park` with a deadline), another thread (`park` until `unpark`), or
//! the end. Between two turns nothing else runs, so the
//! engine's code between two waits is one atomic step, and a run is a pure function of the
//! choices the explorer makes at each decision point (which submitted command the target
//! executes next, or that time moves on to the next timer).
//!
//! The engine reaches this scheduler through `prfence_engine::runtime::simulated`, installed on
//! every simulated thread: its clock, sleeps and threads (the LU fan-out) are ours.

use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use prfence_engine::runtime::simulated::{self, Scheduler, ThreadId};

/// A simulated thread's index.
pub type Tid = usize;

/// Simulated time since the start, in nanoseconds (one clock for the whole simulation; each
/// node's own clock runs from it at its own rate).
pub type Nanos = u64;

pub const MS: Nanos = 1_000_000;
pub const SECOND: Nanos = 1_000_000_000;

/// What a thread is doing, as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadState {
    /// Ready to run (or running).
    Runnable,
    /// Waiting until `unpark` or until its node's clock reaches `until`.
    Parked {
        until: Option<Nanos>,
    },
    /// Waiting for the target to execute command `id`.
    Submitted {
        id: u64,
    },
    /// The command was given an outcome; the thread runs next to carry it out.
    Granted(Grant),
    /// Carried out a command while its node is paused: runs again when the node resumes.
    Held,
    Done,
}

/// How a submitted command ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// The target executes it now, with `fault` applied.
    Execute { fault: Fault },
    /// Its timeout expired first; `applied`: the target executed it anyway (the response was
    /// lost), or never saw it.
    TimedOut { applied: bool },
}

/// A fault the explorer injects into one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    None,
    /// Executed, but the reply is lost: the initiator sees a transport failure.
    LostResponse,
    /// Answered NOT READY without executing (the target is busy).
    NotReady,
    /// Executed, then answered NOT READY (LIO with a missing APTPL directory).
    NotReadyAfter,
    /// A unit attention (power on) reported instead of executing.
    UnitAttention,
}

impl Fault {
    /// Every fault, in the order the explorer numbers them.
    pub const ALL: [Fault; 5] = [
        Fault::None,
        Fault::LostResponse,
        Fault::NotReady,
        Fault::NotReadyAfter,
        Fault::UnitAttention,
    ];
}

/// A command waiting for the target.
#[derive(Debug, Clone)]
pub struct Pending {
    pub id: u64,
    pub thread: Tid,
    pub node: usize,
    /// For the trace and the explorer's independence: the LU it goes to.
    pub lu: usize,
    pub what: String,
    /// Node-clock time at which the initiator gives up on it.
    pub deadline: Option<Nanos>,
    /// Writes' second half: the data reaching the medium; never faulted.
    pub landing: bool,
}

/// A node's clock and whether it runs.
#[derive(Debug, Clone)]
pub struct NodeClock {
    /// The node's monotonic clock, in nanoseconds since the start.
    pub clock: Nanos,
    /// How fast its clock runs: parts per million off true time.
    pub ppm: i64,
    pub paused: bool,
    /// Whether its clock stops while the node is paused (a frozen VM's CLOCK_MONOTONIC may or may
    /// not run on).
    pub clock_stops_when_paused: bool,
}

impl NodeClock {
    fn advance(&mut self, true_ns: Nanos) {
        if self.paused && self.clock_stops_when_paused {
            return;
        }
        let scaled = i128::from(true_ns) * i128::from(1_000_000 + self.ppm) / 1_000_000;
        self.clock = self
            .clock
            .saturating_add(u64::try_from(scaled.max(0)).unwrap_or(u64::MAX));
    }

    /// True nanoseconds until this clock reads `at` (rounded up), if it runs.
    fn true_until(&self, at: Nanos) -> Option<Nanos> {
        if self.paused && self.clock_stops_when_paused {
            return None;
        }
        let left = i128::from(at.saturating_sub(self.clock));
        let rate = i128::from(1_000_000 + self.ppm);
        if rate <= 0 {
            return None;
        }
        let ns = (left * 1_000_000 + rate - 1) / rate;
        u64::try_from(ns).ok()
    }
}

pub struct Thread {
    pub node: usize,
    /// What the thread is part of (`n2 fence(n0)`), inherited by the threads it starts.
    pub label: Arc<str>,
    pub state: ThreadState,
    wake: Arc<Condvar>,
}

/// OS threads kept between simulated threads (and runs): starting an OS thread costs more than
/// a whole step of the simulation. Each is tagged with the CPU it is kept on
/// ([`pin_to_one_cpu`]), and reused only by a run on that CPU: a run whose threads sit on two
/// CPUs pays a cross-CPU wake-up at every turn.
static POOL: Mutex<Vec<(Option<usize>, std::sync::mpsc::Sender<Job>)>> = Mutex::new(Vec::new());

/// What a pooled OS thread runs: one simulated thread, start to end.
type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on an idle pooled OS thread kept on the caller's CPU, or a new one.
fn pooled(job: Job) -> Result<(), String> {
    let cpu = PINNED.with(Cell::get);
    let idle = {
        let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
        pool.iter()
            .rposition(|(on, _)| *on == cpu)
            .map(|i| pool.swap_remove(i).1)
    };
    let job = match idle {
        Some(worker) => match worker.send(job) {
            Ok(()) => return Ok(()),
            Err(returned) => returned.0,
        },
        None => job,
    };
    let (send, receive) = std::sync::mpsc::channel::<Job>();
    send.send(job).map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("sim".to_owned())
        .stack_size(512 * 1024)
        .spawn(move || {
            // Started by a thread kept on `cpu`, it is kept there too.
            PINNED.with(|p| p.set(cpu));
            while let Ok(job) = receive.recv() {
                job();
                POOL.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((cpu, send.clone()));
            }
        })
        .map(drop)
        .map_err(|e| e.to_string())
}

pub struct Core {
    pub threads: Vec<Thread>,
    pub nodes: Vec<NodeClock>,
    pub pending: Vec<Pending>,
    /// True time since the start.
    pub now: Nanos,
    turn: Option<Tid>,
    aborting: bool,
    next_command: u64,
    /// Panics of simulated threads (the engine must not panic).
    pub panics: Vec<String>,
    /// Since the last [`Sim::take_phase`]: the nodes whose threads had a turn (bits), and the
    /// threads another thread woke (a fan-out's results reaching it).
    ran: u64,
    woken: Vec<Tid>,
}

/// What the threads did in one step ([`Sim::take_phase`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// The nodes whose threads had a turn, as bits.
    pub nodes: u64,
    /// The threads woken by another one, in order.
    pub woken: Vec<Tid>,
    /// How many threads there are (a step that starts threads numbers them).
    pub threads: usize,
}

/// The unwinding payload that ends a simulated thread at the end of a run.
struct Abort;

thread_local! {
    static ME: Cell<Option<Tid>> = const { Cell::new(None) };
    /// The CPU this OS thread is kept on, if [`pin_to_one_cpu`] kept it on one.
    static PINNED: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Keeps the calling thread, and every thread it starts from now on (a run's simulated
/// threads), on one CPU: the `index`-th of those it may use, round robin. A run hands the turn
/// from thread to thread at every step, so nearly all its time is that hand-over: on one CPU a
/// plain context switch, across CPUs a wake-up of the other CPU, which in a virtual machine costs
/// about twice as much (5,000 schedules, release, one worker: 180/s unpinned, 343/s pinned).
/// Best effort: where the affinity cannot be read or set, the thread stays as it was.
pub fn pin_to_one_cpu(index: usize) {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let this_thread = Pid::from_raw(0);
    let Ok(allowed) = sched_getaffinity(this_thread) else {
        return;
    };
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&cpu| allowed.is_set(cpu).unwrap_or(false))
        .collect();
    let Some(&cpu) = cpus.get(index % cpus.len().max(1)) else {
        return;
    };
    let mut one = CpuSet::new();
    if one.set(cpu).is_ok() && sched_setaffinity(this_thread, &one).is_ok() {
        PINNED.with(|p| p.set(Some(cpu)));
    }
}

/// The simulated thread running on this OS thread, if any.
pub fn current() -> Option<Tid> {
    ME.with(Cell::get)
}

pub struct Sim {
    core: Mutex<Core>,
    /// The scheduler waits here for the turn to come back.
    back: Condvar,
    base: Instant,
    /// The simulation's own handle to itself, for the threads it starts.
    this: std::sync::Weak<Sim>,
}

impl Sim {
    pub fn new(nodes: Vec<NodeClock>) -> Arc<Sim> {
        Arc::new_cyclic(|this| Sim {
            core: Mutex::new(Core {
                threads: Vec::new(),
                nodes,
                pending: Vec::new(),
                now: 0,
                turn: None,
                aborting: false,
                next_command: 0,
                panics: Vec::new(),
                ran: 0,
                woken: Vec::new(),
            }),
            back: Condvar::new(),
            base: Instant::now(),
            this: this.clone(),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn me(&self) -> Tid {
        // Only simulated threads call in; the scheduler's own thread never does.
        current().unwrap_or(usize::MAX)
    }

    fn node_of(core: &Core, tid: Tid) -> usize {
        core.threads.get(tid).map_or(0, |t| t.node)
    }

    /// Starts a simulated thread of `node`; it runs when the scheduler gives it the turn.
    pub fn start(
        &self,
        node: usize,
        label: Arc<str>,
        job: Box<dyn FnOnce() + Send>,
    ) -> Result<Tid, String> {
        let Some(sim) = self.this.upgrade() else {
            return Err("the simulation is gone".to_owned());
        };
        let wake = Arc::new(Condvar::new());
        let tid = {
            let mut core = self.lock();
            core.threads.push(Thread {
                node,
                label: Arc::clone(&label),
                state: ThreadState::Runnable,
                wake: Arc::clone(&wake),
            });
            core.threads.len() - 1
        };
        pooled(Box::new(move || {
            ME.with(|me| me.set(Some(tid)));
            simulated::install(Arc::clone(&sim) as Arc<dyn Scheduler>);
            let started = {
                let core = sim.lock();
                sim.wait_turn(core, tid).map(drop).is_some()
            };
            if started {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                if let Err(payload) = result
                    && !payload.is::<Abort>()
                {
                    let message = payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    sim.lock().panics.push(message);
                }
            }
            simulated::uninstall();
            ME.with(|me| me.set(None));
            let mut core = sim.lock();
            if let Some(t) = core.threads.get_mut(tid) {
                t.state = ThreadState::Done;
            }
            if core.turn == Some(tid) {
                sim.pass_turn(core);
            } else {
                drop(core);
                sim.back.notify_all();
            }
        }))?;
        Ok(tid)
    }

    /// Waits until the turn is `tid`'s; `None` when the run is being torn down.
    fn wait_turn<'a>(
        &'a self,
        mut core: MutexGuard<'a, Core>,
        tid: Tid,
    ) -> Option<MutexGuard<'a, Core>> {
        let wake = core.threads.get(tid).map(|t| Arc::clone(&t.wake))?;
        loop {
            if core.aborting {
                return None;
            }
            if core.turn == Some(tid) {
                return Some(core);
            }
            core = wake.wait(core).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Hands the turn from the calling thread straight to the next runnable one, as
    /// [`Sim::run_until_quiet`] would pick it, or back to the scheduler when none is left: one
    /// wake-up per turn instead of two (the scheduler's in between), which is most of a run's
    /// time. The wake-up comes after the lock is released, so that the woken thread does not
    /// run only to wait for the lock.
    fn pass_turn(&self, mut core: MutexGuard<'_, Core>) {
        let next = if core.aborting {
            None
        } else {
            Self::runnable(&core)
        };
        core.turn = next;
        let wake = next.and_then(|tid| {
            let t = core.threads.get_mut(tid)?;
            let node = t.node;
            core.ran |= 1 << node;
            let t = core.threads.get_mut(tid)?;
            if t.state == ThreadState::Held {
                t.state = ThreadState::Runnable;
            }
            Some(Arc::clone(&t.wake))
        });
        drop(core);
        match wake {
            Some(wake) => wake.notify_all(),
            None => self.back.notify_all(),
        }
    }

    /// Gives the turn on and waits for it again; ends the thread when the run is torn down.
    fn yield_turn<'a>(&'a self, core: MutexGuard<'a, Core>) -> MutexGuard<'a, Core> {
        let me = self.me();
        self.pass_turn(core);
        match self.wait_turn(self.lock(), me) {
            Some(core) => core,
            None => std::panic::resume_unwind(Box::new(Abort)),
        }
    }

    /// Submits a command for the target and waits for its outcome.
    pub fn submit(
        &self,
        lu: usize,
        what: String,
        timeout: Option<Duration>,
        landing: bool,
    ) -> Grant {
        let me = self.me();
        let mut core = self.lock();
        let node = Self::node_of(&core, me);
        let deadline = timeout.map(|t| {
            let clock = core.nodes.get(node).map_or(0, |n| n.clock);
            clock.saturating_add(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
        });
        let id = core.next_command;
        core.next_command += 1;
        core.pending.push(Pending {
            id,
            thread: me,
            node,
            lu,
            what,
            deadline,
            landing,
        });
        if let Some(t) = core.threads.get_mut(me) {
            t.state = ThreadState::Submitted { id };
        }
        let mut core = self.yield_turn(core);
        let grant = match core.threads.get(me).map(|t| t.state.clone()) {
            Some(ThreadState::Granted(grant)) => grant,
            _ => Grant::TimedOut { applied: false },
        };
        if let Some(t) = core.threads.get_mut(me) {
            t.state = ThreadState::Runnable;
        }
        grant
    }

    /// After carrying out a granted command: a paused node's thread stops here until its node
    /// resumes (the command reached the target, the node is frozen).
    pub fn after_command(&self) {
        let me = self.me();
        let mut core = self.lock();
        let node = Self::node_of(&core, me);
        if core.nodes.get(node).is_some_and(|n| n.paused) {
            if let Some(t) = core.threads.get_mut(me) {
                t.state = ThreadState::Held;
            }
            let _core = self.yield_turn(core);
        }
    }

    /// The label of the calling simulated thread.
    pub fn label(&self) -> Arc<str> {
        let me = self.me();
        self.lock()
            .threads
            .get(me)
            .map_or_else(|| Arc::from(""), |t| Arc::clone(&t.label))
    }

    /// The calling simulated thread's node.
    pub fn node(&self) -> usize {
        let me = self.me();
        Self::node_of(&self.lock(), me)
    }

    /// Which simulated threads may run now, in a fixed order.
    fn runnable(core: &Core) -> Option<Tid> {
        core.threads.iter().position(|t| {
            let paused = core.nodes.get(t.node).is_some_and(|n| n.paused);
            match t.state {
                ThreadState::Runnable | ThreadState::Held => !paused,
                ThreadState::Granted(_) => true,
                _ => false,
            }
        })
    }

    /// Runs every thread that can run, one at a time (in [`Sim::runnable`]'s order, each
    /// handing the turn to the next), until all wait.
    pub fn run_until_quiet(&self) {
        let core = self.lock();
        if Self::runnable(&core).is_none() {
            return;
        }
        self.pass_turn(core);
        let mut core = self.lock();
        while core.turn.is_some() {
            core = self.back.wait(core).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Gives a pending command its outcome; its thread carries it out at the next run.
    pub fn grant(&self, id: u64, grant: Grant) -> Option<Pending> {
        let mut core = self.lock();
        let index = core.pending.iter().position(|p| p.id == id)?;
        let pending = core.pending.remove(index);
        if let Some(t) = core.threads.get_mut(pending.thread) {
            t.state = ThreadState::Granted(grant);
        }
        Some(pending)
    }

    /// When (true time) the next timer fires: a parked thread's deadline, or a pending command's
    /// timeout. Threads of paused nodes do not count.
    pub fn next_timer(&self, command_timeouts: bool) -> Option<Nanos> {
        let core = self.lock();
        let parked = core.threads.iter().filter_map(|t| match t.state {
            ThreadState::Parked { until: Some(until) } => {
                let node = core.nodes.get(t.node)?;
                if node.paused {
                    return None;
                }
                node.true_until(until)
            }
            _ => None,
        });
        let commands = core.pending.iter().filter_map(|p| {
            if !command_timeouts {
                return None;
            }
            let node = core.nodes.get(p.node)?;
            node.true_until(p.deadline?)
        });
        parked
            .chain(commands)
            .min()
            .map(|ns| core.now.saturating_add(ns.max(1)))
    }

    /// Moves true time to `to`: every node's clock runs on, parked threads whose deadline has
    /// come become runnable, and commands whose timeout expired are returned (the caller decides
    /// whether each was applied) .
    pub fn advance(&self, to: Nanos, command_timeouts: bool) -> Vec<Pending> {
        let mut core = self.lock();
        let delta = to.saturating_sub(core.now);
        core.now = core.now.max(to);
        for node in &mut core.nodes {
            node.advance(delta);
        }
        let clocks: Vec<Nanos> = core.nodes.iter().map(|n| n.clock).collect();
        for t in &mut core.threads {
            if let ThreadState::Parked { until: Some(until) } = t.state
                && clocks.get(t.node).is_some_and(|&c| c >= until)
            {
                t.state = ThreadState::Runnable;
            }
        }
        let (expired, kept): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut core.pending)
            .into_iter()
            .partition(|p| {
                command_timeouts
                    && p.deadline
                        .is_some_and(|d| clocks.get(p.node).is_some_and(|&c| c >= d))
            });
        core.pending = kept;
        expired
    }

    /// When (true time) the first pending command's timeout runs out.
    pub fn first_command_deadline(&self) -> Option<Nanos> {
        let core = self.lock();
        core.pending
            .iter()
            .filter_map(|p| {
                let node = core.nodes.get(p.node)?;
                node.true_until(p.deadline?)
            })
            .min()
            .map(|ns| core.now.saturating_add(ns))
    }

    /// Gives a command returned by [`Sim::advance`] its outcome.
    pub fn grant_expired(&self, expired: Pending, grant: Grant) {
        if let Some(t) = self.lock().threads.get_mut(expired.thread) {
            t.state = ThreadState::Granted(grant);
        }
    }

    pub fn set_paused(&self, node: usize, paused: bool) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            n.paused = paused;
        }
    }

    pub fn now(&self) -> Nanos {
        self.lock().now
    }

    /// What the threads did since the last call.
    pub fn take_phase(&self) -> Phase {
        let mut core = self.lock();
        Phase {
            nodes: std::mem::take(&mut core.ran),
            woken: std::mem::take(&mut core.woken),
            threads: core.threads.len(),
        }
    }

    pub fn all_done(&self) -> bool {
        self.lock()
            .threads
            .iter()
            .all(|t| matches!(t.state, ThreadState::Done))
    }

    /// Ends every thread still waiting (they unwind) and waits until all are done.
    pub fn tear_down(&self) {
        let mut core = self.lock();
        core.aborting = true;
        for t in &core.threads {
            t.wake.notify_all();
        }
        while !core.threads.iter().all(|t| t.state == ThreadState::Done) {
            core = self.back.wait(core).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let core = self.core.get_mut().unwrap_or_else(PoisonError::into_inner);
        core.aborting = true;
        for t in &core.threads {
            t.wake.notify_all();
        }
    }
}

impl Scheduler for Sim {
    fn now(&self) -> Instant {
        let me = self.me();
        let core = self.lock();
        let node = Self::node_of(&core, me);
        let clock = core.nodes.get(node).map_or(core.now, |n| n.clock);
        self.base + Duration::from_nanos(clock)
    }

    fn thread(&self) -> ThreadId {
        u64::try_from(self.me()).unwrap_or(u64::MAX)
    }

    fn park(&self, until: Option<Instant>) {
        let me = self.me();
        let mut core = self.lock();
        let until = until.map(|u| {
            u64::try_from(u.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
        });
        let node = Self::node_of(&core, me);
        if let (Some(until), Some(n)) = (until, core.nodes.get(node))
            && n.clock >= until
        {
            return;
        }
        if let Some(t) = core.threads.get_mut(me) {
            t.state = ThreadState::Parked { until };
        }
        let mut core = self.yield_turn(core);
        if let Some(t) = core.threads.get_mut(me) {
            t.state = ThreadState::Runnable;
        }
    }

    fn unpark(&self, thread: ThreadId) {
        let mut core = self.lock();
        if core.aborting {
            return;
        }
        let Ok(tid) = usize::try_from(thread) else {
            return;
        };
        if let Some(t) = core.threads.get_mut(tid)
            && matches!(t.state, ThreadState::Parked { .. })
        {
            t.state = ThreadState::Runnable;
            core.woken.push(tid);
        }
    }

    fn spawn(&self, job: Box<dyn FnOnce() + Send>) -> Result<(), String> {
        let me = self.me();
        let (node, label) = {
            let core = self.lock();
            let t = core.threads.get(me);
            (
                t.map_or(0, |t| t.node),
                t.map_or_else(|| Arc::from(""), |t| Arc::clone(&t.label)),
            )
        };
        self.start(node, label, job).map(drop)
    }
}
