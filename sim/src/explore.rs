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
    );
    for &node in &scenario.booting {
        world.boot(node);
    }
    for (id, action) in scenario.actions.iter().copied().enumerate() {
        let w = Arc::clone(&world);
        let label: Arc<str> = Arc::from(format!("n{} {}", action.node, action.op));
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
    if checker.violations.is_empty() {
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

/// Every schedule of `scenario`, depth first, up to `limit` runs: how many there are (when the
/// search finished) and the first that broke a property.
pub struct Exhaustive {
    pub schedules: usize,
    pub complete: bool,
    pub failure: Option<(Vec<usize>, ScheduleRun)>,
}

/// The schedule after `run`'s in depth-first order: its last pick that has an untried option, one
/// further; `None` when every pick took its last option.
pub fn next_prefix(run: &ScheduleRun) -> Option<Vec<usize>> {
    let i = run
        .picks
        .iter()
        .rposition(|pick| pick.value + 1 < pick.options)?;
    let mut prefix: Vec<usize> = run.picks[..i].iter().map(|p| p.value).collect();
    prefix.push(run.picks[i].value + 1);
    Some(prefix)
}

pub fn exhaustive(scenario: &Scenario, limit: usize) -> Exhaustive {
    let mut prefix: Vec<usize> = Vec::new();
    let mut schedules = 0;
    loop {
        let result = run(scenario, &mut Replay::new(prefix.clone()));
        schedules += 1;
        if result.failed() {
            let picks = result.picks.iter().map(|p| p.value).collect();
            return Exhaustive {
                schedules,
                complete: false,
                failure: Some((picks, result)),
            };
        }
        let Some(next) = next_prefix(&result) else {
            return Exhaustive {
                schedules,
                complete: true,
                failure: None,
            };
        };
        prefix = next;
        if schedules >= limit {
            return Exhaustive {
                schedules,
                complete: false,
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
