//! Running a scenario under a schedule, and choosing schedules: random (biased towards the
//! interleavings that matter), PCT (probabilistic concurrency testing: random thread priorities
//! with a few priority changes, which finds bugs of small depth with a known probability),
//! exhaustive (every schedule of a small scenario, depth first), and replay (a recorded list of
//! picks). A schedule is the list of picks the run made; with the scenario it reproduces the run.

use std::sync::Arc;
use std::time::Duration;

use prfence_engine::exec::{NvmePr, ScsiPr};
use prfence_engine::ops::{self, Limits};
use prfence_engine::pr::Key;
use prfence_engine::spc_model::{ModelDevice, Quirks};
use prfence_engine::testing::nvmet::{Fake, Kernel};
use prfence_engine::testing::{Cluster, Medium, Port, TargetModel};
use prfence_engine::transport::{Policy, PrTransport};

use crate::check::{Checker, Violation};
use crate::rng::Rng;
use crate::scenario::{Scenario, Target};
use crate::sched::{Fault, Grant, MS, Nanos, NodeClock, Sim, Tid};
use crate::world::{SimEvent, World};

/// What a pick decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Which pending command the target executes next, or (the last option, when there is
    /// one) that time moves on to the next timer.
    Next,
    /// Which fault the command gets ([`Fault::ALL`]).
    Fault,
    /// Whether a command whose timeout expired was applied anyway (1) or not (0).
    Applied,
}

/// One decision of a run: `value` out of `0..options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub kind: Kind,
    pub value: usize,
    pub options: usize,
}

/// What the chooser may look at for a [`Kind::Next`] pick: the thread behind each command
/// option, and whether the last option moves time on.
pub struct PickOptions<'a> {
    pub threads: &'a [Tid],
    pub advance: bool,
    /// How far time would move (true nanoseconds).
    pub advance_by: Nanos,
}

pub trait Chooser {
    fn pick(&mut self, kind: Kind, n: usize, options: &PickOptions<'_>) -> usize;

    /// Whether the run is to tell [`Chooser::stepped`] what each step touched (it costs).
    fn wants_footprints(&self) -> bool {
        false
    }

    /// What the step of the last [`Kind::Next`] pick touched.
    fn stepped(&mut self, _footprint: Footprint) {}

    /// Whether the last pick found every option already covered: the run stops there.
    fn pruned(&self) -> bool {
        false
    }
}

/// What one step touched, for the exhaustive search's reduction ([`independent`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footprint {
    /// Time moved on (timers fired, faults happened), or threads of more than one node had a
    /// turn.
    pub global: bool,
    pub touched: crate::world::Touched,
    /// It logged an event the checker acts on (anything but a command that added no key), or a
    /// thread panicked.
    pub checked: bool,
    /// It changed some LU's keys, reservation or generation.
    pub keys_changed: bool,
    /// It started threads (which are numbered in the order they start).
    pub started_threads: bool,
    /// The threads it woke: an operation's own thread hearing from one of its LUs' threads.
    pub woken: Vec<Tid>,
}

/// The state before a step, to tell its [`Footprint`] after it.
struct Mark {
    advance: bool,
    log: usize,
    snapshot: Vec<(Vec<Key>, Option<prfence_engine::pr::ReservationType>, u32)>,
    threads: usize,
}

impl Mark {
    /// Clears what the threads and the world noted so far, and marks the state.
    fn new(world: &World, advance: bool) -> Mark {
        let _ = world.take_touched();
        let threads = world.sim.take_phase().threads;
        Mark {
            advance,
            log: world.log().len(),
            snapshot: world.cluster().snapshot(),
            threads,
        }
    }

    fn footprint(self, world: &World) -> Footprint {
        let phase = world.sim.take_phase();
        let checked = world.log()[self.log..]
            .iter()
            .any(|e| !matches!(e, SimEvent::Command { added, .. } if added.is_empty()))
            || !world.sim.lock().panics.is_empty();
        Footprint {
            global: self.advance || phase.nodes.count_ones() > 1,
            touched: world.take_touched(),
            checked,
            keys_changed: world.cluster().snapshot() != self.snapshot,
            started_threads: phase.threads > self.threads,
            woken: phase.woken,
        }
    }
}

/// Uniform choices, except that time moves on only now and then (commands are fast next to
/// the timers), and faults are rare.
pub struct Random {
    rng: Rng,
}

impl Random {
    pub fn new(seed: u64) -> Self {
        Random {
            rng: Rng::new(seed),
        }
    }
}

impl Chooser for Random {
    fn pick(&mut self, kind: Kind, n: usize, options: &PickOptions<'_>) -> usize {
        match kind {
            Kind::Next if options.advance && n > 1 => {
                // A short wait (a tie-break, a backoff, a writer's pause) now and then; a long
                // one (a command or deadline timing out) rarely.
                let odds = if options.advance_by <= 2 * crate::sched::SECOND {
                    12
                } else {
                    400
                };
                if self.rng.chance(1, odds) {
                    n - 1
                } else {
                    self.rng.below(n - 1)
                }
            }
            Kind::Fault => {
                if self.rng.chance(1, 15) {
                    1 + self.rng.below(n.saturating_sub(1))
                } else {
                    0
                }
            }
            _ => self.rng.below(n),
        }
    }
}

/// PCT: every thread gets a random priority when first seen; the highest-priority thread's
/// command runs; at `depth - 1` random steps the thread that ran is demoted below all others.
/// Time moves on when only timers are left, or as a low-priority pseudo-thread.
pub struct Pct {
    rng: Rng,
    priorities: Vec<Option<u64>>,
    change_points: Vec<usize>,
    step: usize,
    lowest: u64,
}

impl Pct {
    pub fn new(seed: u64, depth: usize, steps: usize) -> Self {
        let mut rng = Rng::new(seed);
        let change_points = (0..depth.saturating_sub(1))
            .map(|_| rng.below(steps.max(1)))
            .collect();
        Pct {
            rng,
            priorities: Vec::new(),
            change_points,
            step: 0,
            lowest: 1 << 40,
        }
    }

    fn priority(&mut self, tid: Tid) -> u64 {
        if self.priorities.len() <= tid {
            self.priorities.resize(tid + 1, None);
        }
        if let Some(p) = self.priorities[tid] {
            return p;
        }
        let p = (1 << 41) + self.rng.next_u64() % (1 << 40);
        self.priorities[tid] = Some(p);
        p
    }
}

impl Chooser for Pct {
    fn pick(&mut self, kind: Kind, n: usize, options: &PickOptions<'_>) -> usize {
        match kind {
            Kind::Next => {
                self.step += 1;
                let commands = options.threads.len();
                if commands == 0 {
                    return 0;
                }
                let odds = if options.advance_by <= 2 * crate::sched::SECOND {
                    20
                } else {
                    400
                };
                if options.advance && self.rng.chance(1, odds) {
                    return n - 1;
                }
                let best = (0..commands)
                    .max_by_key(|&i| self.priority(options.threads[i]))
                    .unwrap_or(0);
                if self.change_points.contains(&self.step) {
                    let tid = options.threads[best];
                    self.lowest -= 1;
                    self.priorities[tid] = Some(self.lowest);
                }
                best
            }
            Kind::Fault => {
                if self.rng.chance(1, 15) {
                    1 + self.rng.below(n.saturating_sub(1))
                } else {
                    0
                }
            }
            Kind::Applied => self.rng.below(n),
        }
    }
}

/// Replays recorded picks (each clamped to the options there are now), then picks 0.
pub struct Replay {
    picks: Vec<usize>,
    at: usize,
}

impl Replay {
    pub fn new(picks: Vec<usize>) -> Self {
        Replay { picks, at: 0 }
    }
}

impl Chooser for Replay {
    fn pick(&mut self, _: Kind, n: usize, _: &PickOptions<'_>) -> usize {
        let value = self.picks.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        value.min(n.saturating_sub(1))
    }
}

/// The result of one run.
pub struct ScheduleRun {
    pub violations: Vec<Violation>,
    pub picks: Vec<Pick>,
    pub log: Vec<SimEvent>,
    pub steps: usize,
    /// The run hit the step bound before every thread was done.
    pub unfinished: bool,
    /// The chooser stopped the run early: what lies ahead is covered elsewhere.
    pub pruned: bool,
    pub writes_admitted: usize,
    pub writes_refused: usize,
    pub in_flight_landings: usize,
}

impl ScheduleRun {
    pub fn failed(&self) -> bool {
        !self.violations.is_empty()
    }
}

/// A run gives up after this many decisions (a livelock is not a safety violation, but it is
/// reported).
pub const MAX_STEPS: usize = 20_000;

/// The keys the nodes fence with: node `i` has `0xa + i`.
pub fn node_key(node: usize) -> Key {
    Key::new(0xa + node as u64)
}

fn model(target: Target) -> TargetModel {
    match target {
        Target::Lio => TargetModel::Scsi(Quirks::lio()),
        Target::Spc4 => TargetModel::Scsi(Quirks::spc4()),
        Target::Nvmet => TargetModel::Nvmet {
            linux_preempt: true,
        },
    }
}

/// The per-command policy of the simulated nodes: the defaults, or for lease agents the
/// command timeout lease mode needs (no longer than `renew`).
fn policy(scenario: Option<&Scenario>) -> Policy {
    let lease = scenario.is_some_and(|s| s.actions.iter().any(|a| a.op == crate::world::Op::Lease));
    Policy {
        timeout: if lease {
            Duration::from_secs(1)
        } else {
            Policy::DEFAULT_TIMEOUT
        },
        ..Policy::default()
    }
}

/// Every node but the booting ones unfenced before the run starts, through the engine on the
/// models directly (ordinary threads: this is set-up, not under test).
fn unfence_all(cluster: &Cluster, keys: &[Key], booting: &[usize]) {
    for (node, &key) in keys.iter().enumerate() {
        if booting.contains(&node) {
            continue;
        }
        let targets = cluster.targets(node, |spec| -> Arc<dyn PrTransport> {
            match (spec.medium, spec.port) {
                (Medium::Scsi(lu), Port::Nexus(nexus)) => Arc::new(ScsiPr::new(
                    ModelDevice::new(lu, nexus, spec.device),
                    policy(None),
                )),
                (Medium::Nvme(ns), Port::Host(host)) => Arc::new(NvmePr::new(
                    Fake::new(ns, host, spec.device, Kernel::CURRENT),
                    policy(None),
                )),
                _ => unreachable!("a cluster pairs SCSI LUs with nexuses and NVMe with hosts"),
            }
        });
        let _ = ops::unfence(targets, key, Limits::default());
    }
}

/// Runs `scenario` once, choosing with `chooser`, checking every property after every step.
pub fn run(scenario: &Scenario, chooser: &mut dyn Chooser) -> ScheduleRun {
    let keys: Vec<Key> = (0..scenario.nodes).map(node_key).collect();
    let cluster = Cluster::new(
        model(scenario.target),
        scenario.lus + scenario.coordinators,
        &vec![scenario.paths; scenario.nodes],
    );
    // Fencing scenarios start with every node unfenced; lease agents start from bare LUs.
    if !scenario
        .actions
        .iter()
        .any(|a| a.op == crate::world::Op::Lease)
    {
        unfence_all(&cluster, &keys, &scenario.booting);
    }
    let nodes = (0..scenario.nodes)
        .map(|n| NodeClock {
            clock: 0,
            ppm: scenario.ppm.get(n).copied().unwrap_or(0),
            paused: false,
            clock_stops_when_paused: scenario.clock_stops,
        })
        .collect();
    let sim = Sim::new(nodes);
    let world = World::new(
        Arc::clone(&sim),
        cluster,
        keys,
        policy(Some(scenario)),
        scenario.tie_break.map(Duration::from_nanos),
        scenario.coordinators,
        if scenario.unreachable_report {
            prfence_engine::ops::UnreachableData::Report
        } else {
            prfence_engine::ops::UnreachableData::Fail
        },
    );
    for &node in &scenario.booting {
        world.boot(node);
    }
    for (id, action) in scenario.actions.iter().copied().enumerate() {
        let w = Arc::clone(&world);
        let label: Arc<str> = Arc::from(crate::check::op_label(action.node, id, action.op));
        let _ = sim.start(
            action.node,
            label,
            Box::new(move || w.run_op(action.node, id, action.op, action.at)),
        );
    }
    // Lease agents run for seconds: their writers write less often, so a run stays short.
    let writes_every = if policy(Some(scenario)).timeout < Policy::DEFAULT_TIMEOUT {
        Duration::from_millis(500)
    } else {
        Duration::from_millis(100)
    };
    for &node in &scenario.writers {
        let w = Arc::clone(&world);
        let _ = sim.start(
            node,
            Arc::from(format!("n{node} writer")),
            Box::new(move || w.run_writer(node, writes_every)),
        );
    }
    let footprints = chooser.wants_footprints();
    if footprints {
        world.trace();
    }
    let mut in_flight: Option<Mark> = None;
    let mut pruned = false;
    let mut happenings = scenario.happenings.iter().copied().peekable();
    let mut checker = Checker::new();
    let mut picks = Vec::new();
    let mut steps = 0;
    let mut unfinished = false;
    let mut record = |chooser: &mut dyn Chooser, kind, n, options: &PickOptions<'_>| {
        let value = chooser.pick(kind, n, options).min(n.saturating_sub(1));
        picks.push(Pick {
            kind,
            value,
            options: n,
        });
        value
    };
    loop {
        sim.run_until_quiet();
        if let Some(mark) = in_flight.take() {
            chooser.stepped(mark.footprint(&world));
        }
        if checker.step(&world) {
            break;
        }
        let pending = sim.lock().pending.clone();
        // Faults and timeouts end at the scenario's quiet time.
        let quiet = scenario.quiet_after.is_some_and(|at| sim.now() >= at);
        let (faults, timeouts) = (scenario.faults && !quiet, scenario.timeouts && !quiet);
        let timer = sim.next_timer(timeouts);
        let mut next = match (timer, happenings.peek().map(|(t, _)| *t)) {
            (Some(a), Some(b)) => Some(a.min(b.max(sim.now()))),
            (a, b) => a.or(b.map(|b| b.max(sim.now()))),
        };
        // Without timeouts every command completes within its timeout: time may not pass the
        // first pending command's.
        if !timeouts
            && let (Some(to), Some(limit)) = (next, sim.first_command_deadline())
            && to >= limit
        {
            next = None;
        }
        if pending.is_empty() && next.is_none() {
            break;
        }
        steps += 1;
        if steps > MAX_STEPS {
            unfinished = true;
            break;
        }
        let threads: Vec<Tid> = pending.iter().map(|p| p.thread).collect();
        let options = PickOptions {
            threads: &threads,
            advance: next.is_some(),
            advance_by: next.map_or(0, |t| t.saturating_sub(sim.now())),
        };
        let n = pending.len() + usize::from(next.is_some());
        let choice = record(chooser, Kind::Next, n, &options);
        if chooser.pruned() {
            pruned = true;
            break;
        }
        if footprints {
            in_flight = Some(Mark::new(&world, choice >= pending.len()));
        }
        if let Some(command) = pending.get(choice) {
            let fault = if faults && !command.landing {
                Fault::ALL[record(chooser, Kind::Fault, Fault::ALL.len(), &options)]
            } else {
                Fault::None
            };
            sim.grant(command.id, Grant::Execute { fault });
        } else if let Some(to) = next {
            for expired in sim.advance(to, timeouts) {
                let applied = record(chooser, Kind::Applied, 2, &options) == 1;
                sim.grant_expired(expired, Grant::TimedOut { applied });
            }
            while let Some(&(at, what)) = happenings.peek() {
                if at > to {
                    break;
                }
                happenings.next();
                world.happen(what);
            }
        }
    }
    // A pruned run stopped short of its end: its end state is another run's.
    if checker.violations.is_empty() && !pruned {
        checker.finish(&world);
    }
    sim.tear_down();
    let log = world.log().clone();
    ScheduleRun {
        violations: checker.violations,
        picks,
        log,
        steps,
        unfinished,
        pruned,
        writes_admitted: checker.writes_admitted,
        writes_refused: checker.writes_refused,
        in_flight_landings: checker.in_flight_landings,
    }
}

/// The scenario and schedule of random run number `seed`.
pub fn random_run(seed: u64) -> (Scenario, ScheduleRun) {
    let mut rng = Rng::new(seed);
    let scenario = Scenario::draw(&mut rng);
    let run = seeded_run(&scenario, seed, rng.next_u64());
    (scenario, run)
}

/// One schedule of `scenario` as the random runs draw them: random for an even `seed`, PCT
/// (depth 3 over 200 steps) for an odd one, the chooser seeded with `chooser`.
pub fn seeded_run(scenario: &Scenario, seed: u64, chooser: u64) -> ScheduleRun {
    if seed.is_multiple_of(2) {
        run(scenario, &mut Random::new(chooser))
    } else {
        run(scenario, &mut Pct::new(chooser, 3, 200))
    }
}

/// Every schedule of `scenario`, depth first, up to `limit` runs: how many ran to their end
/// (`schedules`) or stopped early as already covered (`pruned`), whether the search finished,
/// and the first that broke a property.
pub struct Exhaustive {
    pub schedules: usize,
    pub pruned: usize,
    pub complete: bool,
    pub failure: Option<(Vec<usize>, ScheduleRun)>,
}

/// One option of a pick as the search tells it apart from one run to the next: the command
/// a thread waits for (a thread keeps its number whatever independent steps ran before it,
/// since two steps that both start threads are dependent), time moving on, or a fault's or a
/// timeout's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    Command(Tid),
    Advance,
    Value(usize),
}

/// A move and what it touched where it was explored (`None`: not known, dependent on all).
type Covered = (Move, Option<Footprint>);

/// A pick on the current path of the depth-first search.
struct Choice {
    moves: Vec<Move>,
    chosen: usize,
    /// What the chosen move's step touched, once it ran.
    footprint: Option<Footprint>,
    /// Moves whose every schedule from here is covered by a sibling subtree explored earlier
    /// (inherited from the parent), and the moves explored here already.
    sleep: Vec<Covered>,
    done: Vec<Covered>,
}

impl Choice {
    /// The sleep set of the pick after this one: every move asleep or explored here that is
    /// independent of the chosen one.
    fn asleep_after(&self, sends_commute: bool) -> Vec<Covered> {
        let Some(step) = &self.footprint else {
            return Vec::new();
        };
        self.sleep
            .iter()
            .chain(&self.done)
            .filter(|(_, f)| {
                f.as_ref()
                    .is_some_and(|f| independent(&f.eventually(), step, sends_commute))
            })
            .cloned()
            .collect()
    }

    fn covers(&self, m: Move) -> bool {
        self.sleep.iter().chain(&self.done).any(|(c, _)| *c == m)
    }
}

impl Footprint {
    /// What a move that woke a thread may touch when it runs later, in another state: by then
    /// its result may be the last that thread waits for, and the thread runs on in the same
    /// step (it logs the operation's end, or starts the next fan-out's threads).
    fn eventually(&self) -> Footprint {
        let mut f = self.clone();
        if !f.woken.is_empty() {
            f.checked = true;
            f.started_threads = true;
        }
        f
    }
}

/// Whether two steps, both possible in one state, commute: taken in either order they lead to
/// the same state (up to the order of invisible events in the log, which the checker ignores)
/// and the same verdicts, and neither changes what the other does.
///
/// - Neither moves time on (every timer, fault and happening is there) or runs threads of two
///   nodes (nothing but time wakes another node's thread: the guard makes sure).
/// - The checker's verdicts keep: neither logs an event the checker acts on (an operation's
///   start or end, a write, a key added, …) while the other does or changes keys, since those
///   events are judged against the keys on the LUs and against each other. Two steps that only
///   remove keys or change reservations, on different LUs, commute for the checker: its events
///   ignore removals, and what it checks after every step is, LU by LU, a condition on that
///   LU's keys and reservation (a fenced key registered there, two lease holders that may both
///   write there), so every state between them agrees, LU by LU, with one before or after both.
/// - Not both start threads: threads are numbered as they start, and run in that order.
/// - Neither changed an object (an LU's whole state, unit attentions included, or a node's
///   boot record) the other reached: two reads of one LU commute, a read and a PREEMPT do not.
/// - Their threads' own code reads nothing else that the other writes: a simulated thread
///   sees the world only through its commands' results, its node's clock (which no command
///   step moves), its boot record, and the results its fan-out's threads send it. Two results
///   sent to the same thread commute: the engine's fan-out keeps them by item and tells them in
///   arrival order only to an observer, which does nothing here; a lease agent, though, acts
///   on its completions in the order they come, so with one (`sends_commute` false) they do not.
///   Results sent to two different threads do not commute (they might share a node's state).
pub fn independent(a: &Footprint, b: &Footprint, sends_commute: bool) -> bool {
    let (ta, tb) = (a.touched, b.touched);
    !a.global
        && !b.global
        && !(a.checked && (b.checked || b.keys_changed))
        && !(b.checked && a.keys_changed)
        && !(a.started_threads && b.started_threads)
        && ta.changed & tb.read == 0
        && tb.changed & ta.read == 0
        && (a.woken.is_empty() || b.woken.is_empty() || (sends_commute && a.woken == b.woken))
}

/// The depth-first search over every pick, with sleep sets (Godefroid) when it may reduce.
///
/// Without reduction, every option of every pick is explored. With it (no faults and no
/// timeouts: every pick is a [`Kind::Next`], a step of its own), a move is not explored from a
/// state when it is *asleep* there: it was explored from an ancestor state (or inherited asleep
/// there), and every step taken since is [`independent`] of it. Why nothing is lost: let `t`
/// be asleep after steps `s1 … sk` from the state `S` where `t` was covered, each `si`
/// independent of `t`. Any schedule `s1 … sk t u…` reaches the state of `t s1 … sk u…`
/// (swap `t` back one step at a time), with the same verdicts (each swap is of independent
/// steps); the latter schedule starts with `t` from `S`, whose subtree was (or
/// will be) explored in full, up to its own sleeping moves, for which the same holds, by
/// induction on the order of exploration. So every verdict a pruned schedule would give, an
/// explored one gives. A move's footprint is the one it had where it ran; steps independent
/// of it cannot change it (they touch nothing it reads), except that a result it sends may
/// become the last its receiver waits for, which [`Footprint::eventually`] assumes.
struct Search {
    stack: Vec<Choice>,
    at: usize,
    reduce: bool,
    sends_commute: bool,
    /// Every move of the last pick was asleep.
    blocked: bool,
}

impl Chooser for Search {
    fn pick(&mut self, kind: Kind, n: usize, options: &PickOptions<'_>) -> usize {
        let moves: Vec<Move> = match kind {
            Kind::Next => options
                .threads
                .iter()
                .map(|&t| Move::Command(t))
                .chain(options.advance.then_some(Move::Advance))
                .collect(),
            Kind::Fault | Kind::Applied => (0..n).map(Move::Value).collect(),
        };
        assert!(
            !self.reduce || kind == Kind::Next,
            "the reduction is only for steps of one pick each"
        );
        let at = self.at;
        self.at += 1;
        if let Some(choice) = self.stack.get(at) {
            assert_eq!(choice.moves, moves, "a replayed prefix went another way");
            return choice.chosen;
        }
        let sleep = self
            .stack
            .last()
            .map_or_else(Vec::new, |c| c.asleep_after(self.sends_commute));
        let Some(chosen) = moves
            .iter()
            .position(|m| !sleep.iter().any(|(s, _)| s == m))
        else {
            self.blocked = true;
            return 0;
        };
        self.stack.push(Choice {
            moves,
            chosen,
            footprint: None,
            sleep,
            done: Vec::new(),
        });
        chosen
    }

    fn wants_footprints(&self) -> bool {
        self.reduce
    }

    fn stepped(&mut self, footprint: Footprint) {
        if let Some(choice) = self.at.checked_sub(1).and_then(|i| self.stack.get_mut(i)) {
            choice.footprint = Some(footprint);
        }
    }

    fn pruned(&self) -> bool {
        self.blocked
    }
}

impl Search {
    /// Moves on to the next schedule: the deepest pick with a move neither explored nor asleep
    /// takes it; `false` when there is none.
    fn backtrack(&mut self) -> bool {
        self.at = 0;
        self.blocked = false;
        while let Some(top) = self.stack.last_mut() {
            let explored = (top.moves[top.chosen], top.footprint.take());
            top.done.push(explored);
            if let Some(next) = (0..top.moves.len()).find(|&i| !top.covers(top.moves[i])) {
                top.chosen = next;
                return true;
            }
            self.stack.pop();
        }
        false
    }
}

/// Every schedule of `scenario` ([`search`], reduced where it may be).
pub fn exhaustive(scenario: &Scenario, limit: usize) -> Exhaustive {
    search(scenario, limit, true, &mut |_| {})
}

/// The depth-first search over the schedules of `scenario`, with the sleep-set reduction when
/// `reduce` allows it (no faults, no timeouts); `each` sees every run that reached its end.
pub fn search(
    scenario: &Scenario,
    limit: usize,
    reduce: bool,
    each: &mut dyn FnMut(&ScheduleRun),
) -> Exhaustive {
    let mut search = Search {
        stack: Vec::new(),
        at: 0,
        reduce: reduce && !scenario.faults && !scenario.timeouts,
        sends_commute: !scenario
            .actions
            .iter()
            .any(|a| a.op == crate::world::Op::Lease),
        blocked: false,
    };
    let (mut schedules, mut pruned) = (0, 0);
    loop {
        let result = run(scenario, &mut search);
        if result.pruned {
            pruned += 1;
        } else {
            schedules += 1;
            each(&result);
        }
        if result.failed() {
            let picks = result.picks.iter().map(|p| p.value).collect();
            return Exhaustive {
                schedules,
                pruned,
                complete: false,
                failure: Some((picks, result)),
            };
        }
        let more = search.backtrack();
        if !more || schedules + pruned >= limit {
            return Exhaustive {
                schedules,
                pruned,
                complete: !more,
                failure: None,
            };
        }
    }
}

/// Makes a failing run smaller while it keeps breaking the same property: fewer LUs, paths,
/// nodes' actions, writers and faults, then simpler picks. Returns the smallest scenario and
/// picks found, and their run.
pub fn shrink(
    scenario: &Scenario,
    picks: &[usize],
    budget: usize,
) -> (Scenario, Vec<usize>, ScheduleRun) {
    let property = |run: &ScheduleRun| run.violations.first().map(|v| v.property);
    let mut best = (scenario.clone(), picks.to_vec());
    let mut best_run = run(&best.0, &mut Replay::new(best.1.clone()));
    let target = property(&best_run);
    let mut tries = 0;
    let still_fails = |s: &Scenario, p: &[usize], tries: &mut usize| -> Option<ScheduleRun> {
        *tries += 1;
        let r = run(s, &mut Replay::new(p.to_vec()));
        (r.failed() && property(&r) == target).then_some(r)
    };
    let mut improved = true;
    while improved && tries < budget {
        improved = false;
        for candidate in simpler_scenarios(&best.0) {
            if tries >= budget {
                break;
            }
            if let Some(r) = still_fails(&candidate, &best.1, &mut tries) {
                best.0 = candidate;
                best.1 = r.picks.iter().map(|p| p.value).collect();
                best_run = r;
                improved = true;
                break;
            }
        }
        if improved {
            continue;
        }
        // Picks: each one left out (the rest move up), last first.
        let mut i = best.1.len();
        while i > 0 && tries < budget {
            i -= 1;
            if i >= best.1.len() {
                continue;
            }
            let mut p = best.1.clone();
            p.remove(i);
            if let Some(r) = still_fails(&best.0, &p, &mut tries) {
                best.1 = p;
                best_run = r;
                improved = true;
            }
        }
        // Then each non-zero one back to 0 (the scheduler's default order), last first.
        for i in (0..best.1.len()).rev() {
            if tries >= budget {
                break;
            }
            if best.1[i] == 0 {
                continue;
            }
            let mut p = best.1.clone();
            p[i] = 0;
            if let Some(r) = still_fails(&best.0, &p, &mut tries) {
                best.1 = p;
                best_run = r;
                improved = true;
            }
        }
    }
    // Trailing zeros are what the replay picks anyway.
    while best.1.last() == Some(&0) {
        best.1.pop();
    }
    (best.0, best.1, best_run)
}

fn simpler_scenarios(s: &Scenario) -> Vec<Scenario> {
    let mut out = Vec::new();
    let mut with = |f: &dyn Fn(&mut Scenario)| {
        let mut c = s.clone();
        f(&mut c);
        if c != *s {
            out.push(c);
        }
    };
    with(&|c| c.faults = false);
    with(&|c| c.timeouts = false);
    with(&|c| c.quiet_after = None);
    for i in 0..s.happenings.len() {
        with(&|c| {
            c.happenings.remove(i);
        });
    }
    for i in 0..s.writers.len() {
        with(&|c| {
            c.writers.remove(i);
        });
    }
    for i in 0..s.actions.len() {
        with(&|c| {
            c.actions.remove(i);
        });
    }
    // With coordinators the LU indices past the data LUs name them: dropping a data LU would
    // renumber them under the scenario's happenings.
    if s.lus > 1 && s.coordinators == 0 {
        with(&|c| {
            c.lus -= 1;
            c.happenings.retain(|(_, h)| match h {
                crate::world::Happening::Relogin { lu, .. }
                | crate::world::Happening::PowerCycle { lu }
                | crate::world::Happening::Vanish { lu, .. }
                | crate::world::Happening::Cut { lu, .. } => *lu < c.lus,
                _ => true,
            });
        });
    }
    if s.paths > 1 {
        with(&|c| {
            c.paths -= 1;
            c.happenings.retain(|(_, h)| match h {
                crate::world::Happening::Relogin { path, .. } => *path < c.paths,
                _ => true,
            });
        });
    }
    with(&|c| c.ppm.iter_mut().for_each(|p| *p = 0));
    out
}

/// The run as a timeline a person can read: time, node, what, the target's answer.
pub fn timeline(run: &ScheduleRun) -> String {
    let marked: Vec<usize> = run.violations.iter().filter_map(|v| v.at).collect();
    let mut out = String::new();
    for (i, event) in run.log.iter().enumerate() {
        let mark = if marked.contains(&i) { "  <<<" } else { "" };
        let line = match event {
            SimEvent::Command {
                time,
                node,
                label,
                lu,
                path,
                what,
                outcome,
                fault,
                added,
                removed,
            } => {
                let mut s = format!(
                    "{:>9}  n{node} [{label}] LU{lu} p{path}: {what} → {outcome}",
                    ms(*time)
                );
                if let Some(f) = fault {
                    s.push_str(&format!(" (fault: {f})"));
                }
                if !added.is_empty() {
                    s.push_str(&format!(" (+{})", keys(added)));
                }
                if !removed.is_empty() {
                    s.push_str(&format!(" (-{})", keys(removed)));
                }
                s
            }
            SimEvent::Write {
                time,
                node,
                lu,
                path,
                admitted,
                landing_of,
            } => match landing_of {
                Some(_) => format!("{:>9}  n{node} write lands on LU{lu} p{path}", ms(*time)),
                None => format!(
                    "{:>9}  n{node} write on LU{lu} p{path}: {}",
                    ms(*time),
                    if *admitted { "ADMITTED" } else { "refused" }
                ),
            },
            SimEvent::OpStart { time, node, op, .. } => {
                format!("{:>9}  n{node} starts {op}", ms(*time))
            }
            SimEvent::OpEnd {
                time,
                node,
                op,
                outcome,
                summary,
                ..
            } => format!(
                "{:>9}  n{node} {op} ends: {outcome:?}: {summary}",
                ms(*time)
            ),
            SimEvent::Injected { time, what } => format!("{:>9}  ** {what}", ms(*time)),
            SimEvent::LeasePreempted {
                time,
                node,
                lu,
                victim,
            } => format!(
                "{:>9}  n{node} lease: took LU{lu} over from {:#x}",
                ms(*time),
                victim.get()
            ),
            SimEvent::LeaseRole {
                time,
                node,
                lu,
                role,
            } => format!("{:>9}  n{node} lease on LU{lu}: {role}", ms(*time)),
            SimEvent::SelfFenced { time, node, reason } => {
                format!("{:>9}  n{node} SELF-FENCES: {reason}", ms(*time))
            }
        };
        out.push_str(&format!("{i:>4} {line}{mark}\n"));
    }
    out
}

fn ms(ns: Nanos) -> String {
    format!("{}.{:03}s", ns / (1000 * MS), (ns / MS) % 1000)
}

fn keys(keys: &[Key]) -> String {
    keys.iter()
        .map(|k| format!("{:#x}", k.get()))
        .collect::<Vec<_>>()
        .join(",")
}

/// A failing run as a bug report: the property, the scenario and schedule with the command that
/// replays them, and the timeline.
pub fn report(scenario: &Scenario, picks: &[usize], run: &ScheduleRun) -> String {
    let mut out = String::new();
    for v in &run.violations {
        out.push_str(&format!("{} broken: {}\n", v.property, v.message));
    }
    let picks: Vec<String> = picks.iter().map(ToString::to_string).collect();
    out.push_str(&format!(
        "scenario: {scenario}\npicks: {}\nreplay: cargo run -p prfence-sim --release -- replay \
         --scenario '{scenario}' --picks '{}'\n\n{}",
        picks.join(","),
        picks.join(","),
        timeline(run)
    ));
    out
}
