//! Watch mode, driven: every `check_interval`, re-discover the paths (sysfs), READ KEYS once per
//! LU on one live path (every LU in one batch), probe each path's registration only when the
//! [`WatchState`] asks ([`LuVerdict::InspectPaths`]), feed the decision back, and carry it out.
//!
//! Arming: the agent judges nothing until one of this node's paths has been seen holding our key
//! on every LU ([`ArmCheck`]: listed is not enough, a node deriving the same key lists it too;
//! fence_pr's unfencing registers it when the cluster starts; fence_scsi_check likewise checks
//! only devices that were unfenced). Until then a missing key is "waiting for registration",
//! the hardware watchdog is not opened, and nothing is fenced. A node fenced while its agent was
//! down is still refused by the target (P5); it is only not stopped by the agent.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::key::{OurKey, resolve_key};
use super::own_initiators::OwnInitiatorLooks;
use super::{
    ArmCheck, Arming, CommandFailure, Decision, FenceReason, LuKeys, LuName, LuVerdict,
    Observation, PathId, ProbedPath, WatchConfig, WatchState,
};
use crate::daemon::agent::{Agent, Control, RunEnd};
use crate::daemon::config::{ModeSettings, Settings};
use crate::daemon::executor::{Executor, KeysRead, first_live};
use crate::daemon::heal::{heal_lu, report_heal};
use crate::daemon::lock;
use crate::daemon::lu_table::{LuEntry, LuTable, PathHandle};
use crate::daemon::metrics::CommandResult;
use crate::daemon::status::{KeyNotOnEveryLu, State, WatchdogState};
use crate::discover::LuId;
use crate::fence_agent::store::KeyStore;
use crate::ops::{LastingPartialKeys, probe_registration};
use crate::pr::{Key, PrOutAction, ReadKeys};
use crate::transport::{Command, CommandError, ErrorKind, Event};
use crate::whoami::WhoAmIError;

/// What one LU's check found.
pub(in crate::daemon) struct LuCheck {
    keys: Result<ReadKeys, CommandError>,
    /// The target told a path its registration was preempted (2Ah/05h).
    preempted_unit_attention: bool,
    /// Per-path registration, when probed.
    registrations: Option<Vec<ProbedPath>>,
    /// A probe was wanted and no path answered it ([`LuKeys::probe_failed`]).
    probe_failed: bool,
}

/// Whether a check probes an LU's paths after its READ KEYS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::daemon) enum Probe {
    No,
    Yes,
    /// Only if the read lists our key: before arming, the first look at our own paths comes in
    /// the check that first sees our key, so arming waits for no extra check, and a node waiting
    /// for its unfencing sends no PR OUT.
    IfListed,
}

impl Probe {
    fn wanted(self, keys: &ReadKeys, key: Key) -> bool {
        match self {
            Probe::No => false,
            Probe::Yes => true,
            Probe::IfListed => keys.keys.contains(&key),
        }
    }
}

/// A READ KEYS on one live path (`first`: the first live path's, already read), then, if
/// `probe` wants it of the keys read, the per-path probes, every live path at once: at most
/// [`crate::daemon::config::CHECK_SLOTS`] command slots.
async fn check_lu(
    exec: Arc<Executor>,
    device: PathBuf,
    paths: Vec<PathHandle>,
    key: Key,
    probe: Probe,
    first: Option<(usize, KeysRead)>,
) -> LuCheck {
    let read = match first {
        Some((index, read)) => exec.read_keys_after(&paths, index, read).await,
        None => exec.read_keys_any(&device, &paths).await,
    };
    let (keys, preempted_unit_attention) = match read {
        Ok((keys, _, events)) => (
            Ok(keys),
            events.iter().any(Event::is_registration_preempted),
        ),
        Err(e) => (Err(e), false),
    };
    let wanted = keys.as_ref().is_ok_and(|k| probe.wanted(k, key));
    let registrations = if wanted {
        let mut probes = JoinSet::new();
        for (index, path) in paths.iter().enumerate().filter(|(_, p)| p.spec.live) {
            let (exec, path) = (Arc::clone(&exec), path.clone());
            probes.spawn(async move {
                let probed = exec
                    .run(&path, Command::PrOut(PrOutAction::Register), move |t| {
                        probe_registration(t, key)
                    })
                    .await;
                (index, path.spec.name.clone(), probed)
            });
        }
        let mut probed = Vec::new();
        while let Some(joined) = probes.join_next().await {
            if let Ok(one) = joined {
                probed.push(one);
            }
        }
        probed.sort_by_key(|(index, _, _)| *index);
        let mut found = Vec::new();
        for (_, name, result) in probed {
            match result {
                Ok(registered) => found.push(ProbedPath {
                    path: PathId(name),
                    registered,
                }),
                Err(e) => {
                    tracing::warn!(path = %name, error = %e, "cannot probe the path's registration")
                }
            }
        }
        // Nothing probed: leave the audit due rather than record an empty one.
        (!found.is_empty()).then_some(found)
    } else {
        None
    };
    LuCheck {
        keys,
        preempted_unit_attention,
        probe_failed: wanted && registrations.is_none(),
        registrations,
    }
}

/// Checks every LU until `until`: the first live path of each in one batch
/// ([`Executor::read_keys_each`]), then, concurrently, each LU whose read failed (its other
/// paths) or whose paths are to be probed. Results in table order. An LU still pending at
/// `until` is a timed-out read (its blocked call keeps only its own thread and path busy).
pub(in crate::daemon) async fn check_all(
    exec: &Arc<Executor>,
    table: &LuTable,
    key: Key,
    probe: &[Probe],
    until: Instant,
) -> Vec<LuCheck> {
    // Every LU's first live path in one batch; an LU goes on alone only when that read failed
    // or its paths are to be probed.
    let firsts: Vec<Option<usize>> = table.lus.iter().map(|lu| first_live(&lu.paths)).collect();
    let batch: Vec<PathHandle> = table
        .lus
        .iter()
        .zip(&firsts)
        .filter_map(|(lu, first)| first.map(|index| lu.paths[index].clone()))
        .collect();
    let first_slot = until.min(Instant::now() + exec.command_slot());
    let mut reads = exec.read_keys_each(batch, first_slot).await.into_iter();
    let mut results: Vec<Option<LuCheck>> = Vec::with_capacity(table.lus.len());
    results.resize_with(table.lus.len(), || None);
    let mut jobs = JoinSet::new();
    for (index, lu) in table.lus.iter().enumerate() {
        let probe = probe.get(index).copied().unwrap_or(Probe::No);
        let first = match firsts[index] {
            Some(path) => reads.next().map(|read| (path, read)),
            None => None,
        };
        let first = match first {
            Some((_, Ok((keys, events)))) if !probe.wanted(&keys, key) => {
                results[index] = Some(LuCheck {
                    keys: Ok(keys),
                    preempted_unit_attention: events.iter().any(Event::is_registration_preempted),
                    registrations: None,
                    probe_failed: false,
                });
                continue;
            }
            first => first,
        };
        if let (true, Some(e)) = (lu.paths.is_empty(), &lu.discover_error) {
            let e = CommandError::without_completion(
                &lu.device,
                Command::PrIn(crate::pr::PrInAction::ReadKeys),
                ErrorKind::Transport,
                format!("no path: {e}"),
            );
            results[index] = Some(LuCheck {
                keys: Err(e),
                preempted_unit_attention: false,
                registrations: None,
                probe_failed: false,
            });
            continue;
        }
        let (exec, device, paths) = (Arc::clone(exec), lu.device.clone(), lu.paths.clone());
        jobs.spawn(async move {
            (
                index,
                check_lu(exec, device, paths, key, probe, first).await,
            )
        });
    }
    loop {
        match tokio::time::timeout_at(until, jobs.join_next()).await {
            Ok(Some(Ok((index, check)))) => {
                results[index] = Some(check);
            }
            Ok(Some(Err(_))) => {}
            Ok(None) => break,
            Err(_) => {
                jobs.abort_all();
                break;
            }
        }
    }
    results
        .into_iter()
        .zip(&table.lus)
        .map(|(result, lu)| {
            result.unwrap_or_else(|| LuCheck {
                keys: Err(CommandError::without_completion(
                    &lu.device,
                    Command::PrIn(crate::pr::PrInAction::ReadKeys),
                    ErrorKind::Timeout,
                    "no path answered within the check's budget (check_budget)",
                )),
                preempted_unit_attention: false,
                registrations: None,
                probe_failed: false,
            })
        })
        .collect()
}

/// What one check saw of each LU, as the watch core takes it. `paths_changed` says whether an
/// LU's paths count as changed since the last check (so that every path is probed).
fn observations(
    table: &LuTable,
    checks: &[LuCheck],
    paths_changed: impl Fn(&LuEntry, &LuCheck) -> bool,
) -> Vec<Observation> {
    table
        .lus
        .iter()
        .zip(checks)
        .map(|(lu, check)| Observation {
            lu: LuName(lu.name.clone()),
            result: match &check.keys {
                Ok(keys) => Ok(LuKeys {
                    keys: keys.keys.clone(),
                    path_count: lu.registrations_expected(),
                    paths: check.registrations.clone(),
                    paths_changed: paths_changed(lu, check),
                    generation: keys.generation,
                    probe_failed: check.probe_failed,
                }),
                Err(e) => Err(CommandFailure::of(e)),
            },
        })
        .collect()
}

/// What the watch loop keeps between checks.
struct WatchRun {
    key: Key,
    /// `None` until armed (our key seen on every LU).
    state: Option<WatchState>,
    /// Per LU: probe every path at the next check.
    inspect: Vec<bool>,
    /// Until armed, per LU: whether this node's own paths hold our key.
    arm_checks: Vec<ArmCheck>,
    /// Per LU: the last verdict logged (logged again only when it changes).
    last_verdicts: Vec<String>,
    /// The last "waiting for registration" message logged.
    waiting: String,
}

impl WatchRun {
    fn new(key: Key, lus: usize) -> WatchRun {
        WatchRun {
            key,
            state: None,
            inspect: vec![false; lus],
            arm_checks: vec![ArmCheck::default(); lus],
            last_verdicts: vec![String::new(); lus],
            waiting: String::new(),
        }
    }
}

/// Why one LU keeps the watch from arming.
enum NotArmed {
    /// Our key is not listed.
    Unregistered,
    /// Listed; this node's paths are being probed.
    Checking,
    /// Listed, held by no path of this node ([`Arming::HeldElsewhere`]).
    HeldElsewhere,
    /// The LU cannot be read: why.
    Unreadable(String),
}

/// What our key (`key`) listed but held by none of this node's paths means, and what to do.
fn held_elsewhere(key: &str) -> String {
    format!(
        "key {key} is listed, but none of this node's paths holds it: another node registered \
         the same key (two nodes derive one key: a node left the middle of the corosync \
         nodelist; see docs/operations.md), or this node's session logged in again since its \
         unfencing. `prfence unfence` repairs the second and refuses the first, naming the holder"
    )
}

/// The status text of a key not known: waiting for corosync, or why not.
fn key_problem_text(e: &WhoAmIError) -> String {
    match e {
        WhoAmIError::NoCorosync(_) | WhoAmIError::NoKey(_) => {
            format!("waiting for corosync to tell this node's key: {e}")
        }
        WhoAmIError::Conflict(_) => format!("this node's key is in doubt: {e}"),
    }
}

/// Watch mode with `key.derive`, before the key is known: asks corosync at every check (one
/// bounded corosync-cmapctl run) until it tells our key, and returns it. Meanwhile the agent is
/// up (READY after the first attempt, the service watchdog fed), judges nothing and opens no
/// watchdog: the state is `waiting_for_registration` while corosync does not answer or does
/// not know this node, `degraded` when the host name and corosync disagree; the cause is in the
/// status (`key_problem`) and logged once per change. SIGHUP applies a new configuration
/// (another key.node, say); SIGTERM stops.
pub(in crate::daemon) async fn wait_for_key(agent: &mut Agent) -> Result<OurKey, RunEnd> {
    let mut interval = ticker(agent.settings.check_interval);
    let mut ready = false;
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            control = agent.control.recv() => match control {
                Some(Control::Reload(settings)) => {
                    agent.notifier.reloading();
                    if let Some(period) = reload_unarmed(agent, *settings).await {
                        interval = ticker(period);
                    }
                    agent.notifier.ready("reloaded");
                    continue;
                }
                Some(Control::Stop) | None => {
                    tracing::info!("stopping");
                    agent.notifier.stopping();
                    lock(&agent.status).state = State::Stopping;
                    agent.publish();
                    return Err(RunEnd::Stopped);
                }
            },
        }
        let ModeSettings::Watch(watch) = &agent.settings.mode else {
            return Err(RunEnd::Failed(
                "waiting for a key outside watch mode".to_owned(),
            ));
        };
        let (spec, timeout, host) = (
            watch.key.clone(),
            agent.settings.command_timeout,
            Arc::clone(&agent.host),
        );
        let resolved =
            tokio::task::spawn_blocking(move || resolve_key(&spec, timeout, host.as_ref())).await;
        let problem = match resolved {
            Ok(Ok(our)) => {
                if let Some(identity) = &our.identity {
                    tracing::info!(key = %our.key, node = %identity.node, from = %identity.basis, "this node's key");
                }
                lock(&agent.status).key_problem = None;
                return Ok(our);
            }
            Ok(Err(e)) => e,
            Err(e) => WhoAmIError::NoKey(format!("the key's derivation did not finish: {e}")),
        };
        let text = key_problem_text(&problem);
        let conflict = matches!(problem, WhoAmIError::Conflict(_));
        if text != last {
            if conflict {
                tracing::error!(problem = %text, "not armed");
            } else {
                tracing::warn!(problem = %text, "not armed; asking again at every check");
            }
            last.clone_from(&text);
        }
        {
            let mut status = lock(&agent.status);
            status.state = if conflict {
                State::Degraded
            } else {
                State::WaitingForRegistration
            };
            status.own_key = None;
            status.key_problem = Some(text.clone());
            status.checks += 1;
            for shown in &mut status.lus {
                shown.verdict = "not armed: this node's key is not known yet".to_owned();
            }
        }
        agent.publish();
        agent.notifier.status(&text);
        agent.notifier.watchdog();
        if !ready {
            ready = true;
            agent.notifier.ready(&text);
        }
    }
}

// Here, not in config: the configuration knows nothing of the modes that read it.
impl Settings {
    /// The watch state machine's settings, given our key resolved from [`KeySpec`](crate::daemon::config::KeySpec) (deriving
    /// it asks corosync, so it is the driver's job). `None` in lease mode.
    pub fn watch_config(&self, own_key: Key) -> Option<WatchConfig> {
        match &self.mode {
            ModeSettings::Watch(w) => Some(WatchConfig {
                own_key,
                grace: w.grace,
                missing_confirmations: w.missing_confirmations,
                heal: w.heal,
                path_audit: w.path_audit,
                coordinators: self
                    .devices
                    .iter()
                    .filter(|d| d.coordinator)
                    .map(|d| LuName(d.name.clone()))
                    .collect(),
            }),
            ModeSettings::Lease(_) => None,
        }
    }
}

/// Watch mode's driver: the agent's shared part, borrowed for the run, and what the watch loop
/// keeps between checks.
pub(in crate::daemon) struct WatchDriver<'a> {
    agent: &'a mut Agent,
    run: WatchRun,
    /// Our key and who we are, when it was derived: checked at every check against the key
    /// fence_pr's `on` stored on this node ([`KeyStore`]).
    our: OurKey,
    store: KeyStore,
    /// The last key problem logged.
    key_problem: Option<String>,
    /// Other nodes' keys on part of our LUs, and since when ([`crate::ops::keys_not_on_every_lu`]).
    partial_keys: LastingPartialKeys,
    /// Our own initiator registered with another key ([`OwnInitiatorLooks`]).
    own_initiators: OwnInitiatorLooks,
}

impl<'a> WatchDriver<'a> {
    /// Watch mode over `agent`'s LUs with our `key` (`key.value`), checked against the key
    /// store of this host's environment, not armed yet.
    pub(in crate::daemon) fn new(agent: &'a mut Agent, key: Key) -> WatchDriver<'a> {
        let our = OurKey {
            key,
            identity: None,
        };
        WatchDriver::with_store(agent, our, KeyStore::from_environment())
    }

    /// Watch mode with our key as resolved, checked against `store`.
    pub(in crate::daemon) fn with_store(
        agent: &'a mut Agent,
        our: OurKey,
        store: KeyStore,
    ) -> WatchDriver<'a> {
        let lus = agent.table.lus.len();
        WatchDriver {
            agent,
            run: WatchRun::new(our.key, lus),
            our,
            store,
            key_problem: None,
            partial_keys: LastingPartialKeys::default(),
            own_initiators: OwnInitiatorLooks::default(),
        }
    }
}

impl WatchDriver<'_> {
    pub(in crate::daemon) async fn run_watch(&mut self) -> RunEnd {
        let key = self.run.key;
        let mut interval = ticker(self.agent.settings.check_interval);
        let mut ready = false;
        lock(&self.agent.status).own_key = Some(key.to_string());
        if let Err(e) = check_watchdog_timeout(self.agent) {
            return RunEnd::Failed(e);
        }
        tracing::info!(%key, lus = self.agent.table.lus.len(), interval = ?self.agent.settings.check_interval, "watch mode");
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                control = self.agent.control.recv() => match control {
                    Some(Control::Reload(settings)) => {
                        self.agent.notifier.reloading();
                        if let Some(new_interval) = self.reload_watch(*settings).await {
                            interval = ticker(new_interval);
                        }
                        self.agent.notifier.ready("reloaded");
                        continue;
                    }
                    Some(Control::Stop) | None => return self.stop_watch(self.run.key).await,
                },
            }
            if let Some(exit_status) = self.watch_tick().await {
                return RunEnd::Fenced { exit_status };
            }
            if !ready {
                ready = true;
                let summary = format!("{:?}", lock(&self.agent.status).state);
                self.agent.notifier.ready(&summary);
            }
        }
    }

    /// One check. Returns the exit status when fenced and told to exit.
    async fn watch_tick(&mut self) -> Option<u8> {
        let key = self.run.key;
        // The whole check, discovery to the decision, ends within its budget: the watchdog is
        // fed after it, and its timeout is checked against this budget (config::feed_gap).
        let until = self.agent.check_deadline();
        self.agent.table.refresh(&self.agent.host, until).await;
        if let Some((a, b, id)) = self.agent.table.duplicate() {
            tracing::error!(first = %a, second = %b, %id, "two configured devices are the same LU; list each LU once");
        }
        let now = Instant::now();
        // Armed or not, `inspect` holds the LUs whose paths are to be probed (before arming:
        // the ones whose ArmCheck asked); before arming, an LU whose paths were never probed is
        // probed in the check that first lists our key there.
        let armed = self.run.state.is_some();
        let probe: Vec<Probe> = self
            .run
            .inspect
            .iter()
            .zip(&self.run.arm_checks)
            .map(|(&inspect, arm_check)| match (inspect, armed) {
                (true, _) => Probe::Yes,
                (false, false) if arm_check.never_probed() => Probe::IfListed,
                (false, _) => Probe::No,
            })
            .collect();
        let checks = check_all(&self.agent.exec, &self.agent.table, key, &probe, until).await;
        self.record_checks(&checks, key, now);
        // Never armed on a key in doubt: our key on the LUs may be another node's registration.
        let in_doubt = self.check_key_store();
        if self.run.state.is_none() && (in_doubt || !self.arm_if_ready(&checks, key, now)) {
            if in_doubt {
                self.show_in_doubt();
            }
            self.finish_tick(&checks);
            return None;
        }
        // Armed: the watchdog is due. Unlike lease mode (where it is fatal at start), a watchdog
        // that cannot be opened is a degraded state, shown and tried again at every check: the
        // target fences us either way (P5), the watchdog only makes the stop sure.
        self.agent.retry_watchdog();
        let watch = self.run.state.as_mut()?;
        let observations = observations(&self.agent.table, &checks, |lu, check| {
            lu.paths_changed || check.preempted_unit_attention
        });
        for (lu, check) in self.agent.table.lus.iter().zip(&checks) {
            if check.preempted_unit_attention {
                tracing::warn!(lu = %lu.name, "the target reports a registration of this node was preempted (2Ah/05h)");
            }
        }
        let decision = watch.tick(now.into_std(), observations);
        let degraded = self.apply_verdicts(&decision, &checks, key);
        self.agent.feed(decision.feed_watchdog);
        let degraded = self.publish_health(degraded || in_doubt);
        let exit = match (&decision.fenced, decision.newly_fenced) {
            (Some(reason), true) => {
                let names: Vec<String> = self
                    .agent
                    .table
                    .lus
                    .iter()
                    .map(|l| l.name.clone())
                    .collect();
                let reason = match self.own_initiators.describe(&names) {
                    Some(why) => format!("{reason} ({why})"),
                    None => reason.to_string(),
                };
                self.agent.self_fence(reason).await
            }
            _ => None,
        };
        if !self.agent.is_fenced() {
            self.agent.notifier.status(&format!(
                "{} LU(s) {}",
                self.agent.table.lus.len(),
                if degraded { "degraded" } else { "healthy" }
            ));
        }
        self.finish_tick(&checks);
        exit
    }

    /// Reads the key fence_pr's `on` stored on this node and compares it with our derived key
    /// ([`super::key::store_problem`]); shows the problem in the status, logs it once per change.
    /// Returns whether our key is in doubt.
    fn check_key_store(&mut self) -> bool {
        let problem = super::key::store_problem(&self.our, &self.store)
            .map(|p| format!("this node's key is in doubt: {p}"));
        if problem != self.key_problem {
            match &problem {
                Some(p) => tracing::error!(problem = %p, "degraded"),
                None if self.key_problem.is_some() => {
                    tracing::info!("the key store agrees with our key again")
                }
                None => {}
            }
            self.key_problem.clone_from(&problem);
        }
        let in_doubt = problem.is_some();
        lock(&self.agent.status).key_problem = problem;
        in_doubt
    }

    /// Not armed because our key is in doubt: degraded, nothing judged, no watchdog.
    fn show_in_doubt(&mut self) {
        let text = self.key_problem.clone().unwrap_or_default();
        {
            let mut status = lock(&self.agent.status);
            status.state = State::Degraded;
            for shown in &mut status.lus {
                shown.verdict = "not armed: this node's key is in doubt".to_owned();
            }
        }
        self.agent.notifier.status(&text);
        self.agent.notifier.watchdog();
    }

    /// Arms the watch once one of this node's paths holds our key on every LU (true), as
    /// [`ArmCheck`] judges it: our key listed is not enough, a node deriving the same key lists
    /// it too. Until then it says why each LU is not armed: not registered (waiting is normal
    /// until Pacemaker unfences this node), this node's paths being checked, held by another
    /// node or an old session only, or unreadable, which no unfencing cures (a descriptor limit,
    /// a missing capability, a dead path) and is said at error level at once.
    fn arm_if_ready(&mut self, checks: &[LuCheck], key: Key, now: Instant) -> bool {
        let mut causes: Vec<(usize, NotArmed)> = Vec::new();
        let mut unprobed = Vec::new();
        for (index, check) in checks.iter().enumerate() {
            let cause = match &check.keys {
                Ok(keys) => {
                    let lu_keys = LuKeys {
                        keys: keys.keys.clone(),
                        path_count: 0,
                        paths: check.registrations.clone(),
                        paths_changed: false,
                        generation: keys.generation,
                        probe_failed: check.probe_failed,
                    };
                    let Some(arm_check) = self.run.arm_checks.get_mut(index) else {
                        continue;
                    };
                    let arming = arm_check.judge(now.into_std(), key, &lu_keys);
                    if let Some(flag) = self.run.inspect.get_mut(index) {
                        *flag = arming == Arming::Probe;
                    }
                    match arming {
                        Arming::Held => continue,
                        Arming::ListedUnprobed => {
                            unprobed.push(index);
                            continue;
                        }
                        Arming::NotListed => NotArmed::Unregistered,
                        Arming::Probe | Arming::Pending => NotArmed::Checking,
                        Arming::HeldElsewhere => NotArmed::HeldElsewhere,
                    }
                }
                Err(e) => NotArmed::Unreadable(e.to_string()),
            };
            causes.push((index, cause));
        }
        let lus = &self.agent.table.lus;
        let is_coordinator = |index: usize| lus.get(index).is_some_and(|l| l.coordinator);
        let coordinators = lus.iter().filter(|l| l.coordinator).count();
        let coordinators_not_held = causes.iter().filter(|c| is_coordinator(c.0)).count();
        // A majority of the coordinators is enough: a loser's preempts may have taken our key
        // from a minority (P3: only `prfence unfence` brings it back), or one's array is down.
        // Those are watched once our key is held there ([`WatchState::with_pending`]).
        let coordinators_ok = coordinators == 0
            || coordinators - coordinators_not_held >= crate::ops::majority(coordinators);
        if causes.len() > coordinators_not_held || !coordinators_ok {
            self.show_not_armed(&causes, key);
            return false;
        }
        let pending: Vec<usize> = causes.iter().map(|c| c.0).collect();
        let Some(config) = self.agent.settings.watch_config(key) else {
            return false;
        };
        for index in unprobed {
            if let Some(lu) = self.agent.table.lus.get(index) {
                tracing::warn!(
                    lu = %lu.name,
                    "no path could be probed for its registration (on NVMe the block PR ioctls \
                     need CAP_SYS_ADMIN): armed on our key as READ KEYS lists it, without \
                     checking that it is this node's registration"
                );
            }
        }
        for &index in &pending {
            if let Some(lu) = self.agent.table.lus.get(index) {
                tracing::warn!(
                    lu = %lu.name,
                    "coordinator without our key held here (preempted by a losing node, or not \
                     reachable): armed on a majority of the coordinators; `prfence unfence` \
                     registers it again"
                );
            }
        }
        tracing::info!(%key, "our key is held on every LU: armed");
        self.run.state = Some(WatchState::with_pending(
            config,
            self.agent
                .table
                .lus
                .iter()
                .enumerate()
                .map(|(index, l)| (LuName(l.name.clone()), !pending.contains(&index))),
            now.into_std(),
        ));
        true
    }

    /// Logs (once per change), shows and notifies why the watch is not armed, for each LU in
    /// `causes`.
    fn show_not_armed(&mut self, causes: &[(usize, NotArmed)], key: Key) {
        let names = |which: fn(&NotArmed) -> bool| -> Vec<String> {
            causes
                .iter()
                .filter(|c| which(&c.1))
                .filter_map(|c| self.agent.table.lus.get(c.0).map(|l| l.name.clone()))
                .collect()
        };
        let parts = [
            (
                names(|c| matches!(c, NotArmed::Unregistered)),
                format!("waiting for key {key} on"),
            ),
            (
                names(|c| matches!(c, NotArmed::Checking)),
                "checking this node's own registration on".to_owned(),
            ),
            (
                names(|c| matches!(c, NotArmed::HeldElsewhere)),
                format!("key {key} held by no path of this node on"),
            ),
            (
                names(|c| matches!(c, NotArmed::Unreadable(_))),
                "cannot read".to_owned(),
            ),
        ];
        let text = parts
            .iter()
            .filter(|(lus, _)| !lus.is_empty())
            .map(|(lus, what)| format!("{what} {}", lus.join(", ")))
            .collect::<Vec<_>>()
            .join("; ");
        if self.run.waiting != text {
            for (index, cause) in causes {
                let Some(lu) = self.agent.table.lus.get(*index) else {
                    continue;
                };
                match cause {
                    NotArmed::Unreadable(e) => tracing::error!(
                        lu = %lu.name,
                        error = %e,
                        "not armed: the LU cannot be read, and no unfencing changes that"
                    ),
                    NotArmed::HeldElsewhere => tracing::error!(
                        lu = %lu.name,
                        "not armed: {}", held_elsewhere(&key.to_string())
                    ),
                    NotArmed::Unregistered => tracing::info!(
                        lu = %lu.name,
                        "not armed: key {key} is not registered (fence_pr's unfencing \
                         registers it); nothing is judged until it is on every LU"
                    ),
                    NotArmed::Checking => tracing::info!(
                        lu = %lu.name,
                        "not armed yet: key {key} is listed; probing this node's paths"
                    ),
                }
            }
            self.run.waiting.clone_from(&text);
        }
        {
            let mut status = lock(&self.agent.status);
            // Waiting is for a key only unfencing brings; an LU that cannot be read, or our key
            // held only by a path not ours, is a fault to look at (alerts and `--once` treat
            // degraded as one). So is this node's initiator registered with another key:
            // unfencing it would take that registration over from whoever made it.
            let other_keys = status
                .lus
                .iter()
                .any(|lu| !lu.other_keys_on_own_initiator.is_empty());
            let fault = causes
                .iter()
                .any(|(_, c)| matches!(c, NotArmed::Unreadable(_) | NotArmed::HeldElsewhere));
            status.state = if !fault && !other_keys {
                State::WaitingForRegistration
            } else {
                State::Degraded
            };
            for shown in &mut status.lus {
                shown.verdict =
                    "not armed: key held here by this node, not yet on every LU".to_owned();
            }
            for (index, cause) in causes {
                if let Some(shown) = status.lus.get_mut(*index) {
                    shown.verdict = match cause {
                        NotArmed::Unreadable(e) => format!("not armed: cannot be read: {e}"),
                        NotArmed::Unregistered => format!(
                            "not armed: key {key} not registered (fence_pr's unfencing \
                             registers it)"
                        ),
                        NotArmed::Checking => {
                            format!("not armed yet: key {key} listed; probing this node's paths")
                        }
                        NotArmed::HeldElsewhere => {
                            format!("not armed: {}", held_elsewhere(&key.to_string()))
                        }
                    };
                }
            }
        }
        self.agent.notifier.status(&text);
        self.agent.notifier.watchdog();
    }

    /// Carries out each LU's verdict: the paths to inspect at the next check, the verdict shown
    /// (and logged when it changed), a heal started. Returns whether any LU is degraded.
    fn apply_verdicts(&mut self, decision: &Decision, checks: &[LuCheck], key: Key) -> bool {
        let mut degraded = false;
        for (index, (_, verdict)) in decision.lus.iter().enumerate() {
            if let Some(flag) = self.run.inspect.get_mut(index) {
                *flag = matches!(
                    verdict,
                    LuVerdict::InspectPaths { .. }
                        | LuVerdict::CheckingOwnRegistration { probe: true }
                );
            }
            let Some(lu) = self.agent.table.lus.get(index) else {
                continue;
            };
            let error = checks.get(index).and_then(|c| c.keys.as_ref().err());
            let text = describe(verdict, error);
            if self
                .run
                .last_verdicts
                .get(index)
                .is_some_and(|v| *v != text)
            {
                if verdict.is_degraded() {
                    tracing::warn!(lu = %lu.name, verdict = %text)
                } else {
                    tracing::info!(lu = %lu.name, verdict = %text)
                }
                if let Some(slot) = self.run.last_verdicts.get_mut(index) {
                    *slot = text.clone().into_owned();
                }
            }
            degraded |= verdict.is_degraded();
            let shown = &mut lock(&self.agent.status).lus[index].verdict;
            if *shown != text {
                *shown = text.into_owned();
            }
            if let LuVerdict::Heal { .. } = verdict {
                // ops::heal probes every path itself, purges orphans where one atomic command
                // can and never registers (P3). It runs beside the checks, under its own
                // deadline (one heal per LU at a time), so a slow heal never delays the
                // watchdog's feeding.
                let id = lu
                    .id
                    .clone()
                    .unwrap_or_else(|| LuId::node_local(&lu.device));
                let (exec, paths, metrics) = (
                    Arc::clone(&self.agent.exec),
                    lu.paths.clone(),
                    Arc::clone(&self.agent.metrics),
                );
                let name = lu.name.clone();
                tokio::spawn(async move {
                    let result = heal_lu(&exec, id, &paths, key).await;
                    report_heal(&name, &result, &metrics);
                });
            }
        }
        degraded
    }

    /// Sets the agent's state from the LUs' verdicts (`degraded`) and the watchdog's, unless it
    /// is fenced. Returns whether the agent is degraded.
    fn publish_health(&self, lus_degraded: bool) -> bool {
        let mut status = lock(&self.agent.status);
        let degraded = lus_degraded
            || status.watchdog.state == WatchdogState::Degraded
            || status
                .lus
                .iter()
                .any(|lu| !lu.other_keys_on_own_initiator.is_empty());
        if !self.agent.is_fenced() {
            status.state = if degraded {
                State::Degraded
            } else {
                State::Healthy
            };
        }
        degraded
    }

    fn record_checks(&self, checks: &[LuCheck], key: Key, now: Instant) {
        let mut metrics = lock(&self.agent.metrics);
        for (lu, check) in self.agent.table.lus.iter().zip(checks) {
            let (outcome, seen) = match &check.keys {
                Ok(keys) if keys.keys.contains(&key) => (CommandResult::Ok, Some(keys.keys.len())),
                Ok(keys) => (CommandResult::KeyMissing, Some(keys.keys.len())),
                Err(e) => (CommandResult::from(CommandFailure::of(e)), None),
            };
            metrics.record_check(
                &lu.name,
                outcome,
                seen.and_then(|n| u64::try_from(n).ok()),
                now.into_std(),
            );
        }
    }

    /// Other nodes' keys on part of our LUs for `watch.grace` ([`LastingPartialKeys`]).
    fn compare_lu_sets(&mut self, checks: &[LuCheck]) -> Vec<KeyNotOnEveryLu> {
        let settle = match &self.agent.settings.mode {
            ModeSettings::Watch(watch) => watch.grace,
            ModeSettings::Lease(_) => return Vec::new(),
        };
        let read: Vec<Option<&[Key]>> = checks
            .iter()
            .map(|c| c.keys.as_ref().ok().map(|k| k.keys.as_slice()))
            .collect();
        let coordinators: Vec<bool> = self.agent.table.lus.iter().map(|l| l.coordinator).collect();
        let mut found = crate::ops::keys_not_on_every_lu(&read, self.run.key);
        found.retain(|(_, missing)| !fenced_leftover(missing, &coordinators, &read));
        let lasting = self
            .partial_keys
            .observe(Instant::now().into_std(), settle, found);
        let shown: Vec<KeyNotOnEveryLu> = lasting
            .into_iter()
            .map(|(key, missing)| KeyNotOnEveryLu {
                key: key.to_string(),
                missing_on: missing
                    .iter()
                    .filter_map(|&at| self.agent.table.lus.get(at).map(|lu| lu.name.clone()))
                    .collect(),
            })
            .collect();
        lock(&self.agent.metrics).set_keys_not_on_every_lu(shown.len());
        shown
    }

    /// Status of every LU after a check, then publish.
    fn finish_tick(&mut self, checks: &[LuCheck]) {
        let partial = self.compare_lu_sets(checks);
        let read: Vec<Option<&ReadKeys>> = checks.iter().map(|c| c.keys.as_ref().ok()).collect();
        self.own_initiators.after_check(
            &self.agent.exec,
            &self.agent.table.lus,
            &read,
            self.run.key,
        );
        let own_initiators = self.own_initiators.found();
        {
            let mut status = lock(&self.agent.status);
            if partial != status.keys_not_on_every_lu {
                log_keys_not_on_every_lu(&partial);
            }
            status.keys_not_on_every_lu = partial;
            status.checks += 1;
            for (index, ((lu, check), shown)) in self
                .agent
                .table
                .lus
                .iter()
                .zip(checks)
                .zip(status.lus.iter_mut())
                .enumerate()
            {
                shown.id.clone_from(&lu.id);
                shown.other_keys_on_own_initiator =
                    own_initiators.get(index).cloned().unwrap_or_default();
                // Rebuilt only when changed: the steady state allocates nothing here per LU.
                if let Ok(keys) = &check.keys
                    && !shows_keys(&shown.keys, &keys.keys)
                {
                    shown.keys = keys.keys.iter().map(Key::to_string).collect();
                }
                if !lu.shows_paths(&shown.paths) {
                    shown.paths = lu.shown_paths();
                }
            }
        }
        self.agent.publish();
    }

    async fn stop_watch(&mut self, key: Key) -> RunEnd {
        tracing::info!("stopping");
        self.agent.notifier.stopping();
        lock(&self.agent.status).state = State::Stopping;
        self.agent.publish();
        if self.agent.settings.unregister_on_exit && !self.agent.is_fenced() {
            let keys: Vec<(usize, Key)> =
                (0..self.agent.table.lus.len()).map(|i| (i, key)).collect();
            self.agent.unregister_everywhere(&keys).await;
        }
        self.agent.close_watchdog();
        RunEnd::Stopped
    }

    /// Applies a reload. Returns the new check interval if it changed.
    async fn reload_watch(&mut self, new: Settings) -> Option<Duration> {
        let key = self.run.key;
        let ModeSettings::Watch(new_watch) = &new.mode else {
            tracing::error!(
                "SIGHUP: the mode changes only with a restart; configuration not reloaded"
            );
            return None;
        };
        if self.agent.is_fenced() {
            tracing::warn!("SIGHUP: fenced; nothing changes until the agent is restarted");
            return None;
        }
        let ModeSettings::Watch(old_watch) = &self.agent.settings.mode else {
            return None;
        };
        let new_our = if new_watch.key == old_watch.key {
            self.our.clone()
        } else {
            let spec = new_watch.key.clone();
            let timeout = new.command_timeout;
            let host = Arc::clone(&self.agent.host);
            match tokio::task::spawn_blocking(move || resolve_key(&spec, timeout, host.as_ref()))
                .await
            {
                Ok(Ok(our)) => our,
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "SIGHUP: configuration not reloaded");
                    return None;
                }
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: configuration not reloaded");
                    return None;
                }
            }
        };
        let devices_changed = new.devices != self.agent.settings.devices;
        if devices_changed && let Err(e) = self.agent.devices_fit(&new.devices).await {
            tracing::error!(error = %e, "SIGHUP: configuration not reloaded");
            return None;
        }
        let new_key = new_our.key;
        self.our = new_our;
        // The LUs judged before the reload (by path) stay judged; one added is judged once our
        // key is on it, as every LU is at start.
        let judged_before: Vec<PathBuf> = self
            .agent
            .settings
            .devices
            .iter()
            .map(|d| d.path.clone())
            .collect();
        let interval_changed = new.check_interval != self.agent.settings.check_interval;
        let new = self.agent.apply_common(new);
        if devices_changed || new_key != key {
            tracing::warn!(key = %new_key, "SIGHUP: devices or key changed; judging the new set from now");
            let names = new_lu_set(self.agent, &new);
            lock(&self.agent.status).own_key = Some(new_key.to_string());
            let armed = self.run.state.is_some();
            self.run = WatchRun::new(new_key, names.len());
            // reads under way finish into the old looks, which are dropped with them
            self.own_initiators = OwnInitiatorLooks::default();
            // Armed before: the LUs it judged are judged at once, with the new key too (a key
            // change is the admin's act); an added LU waits for our key on it.
            if armed {
                let lus: Vec<(LuName, bool)> = new
                    .devices
                    .iter()
                    .map(|d| {
                        let added = new_key == key && !judged_before.contains(&d.path);
                        (LuName(d.name.clone()), !added)
                    })
                    .collect();
                self.run.state = new
                    .watch_config(new_key)
                    .map(|config| WatchState::with_pending(config, lus, Instant::now().into_std()));
            }
        } else if let (Some(watch), Some(config)) =
            (self.run.state.as_mut(), new.watch_config(new_key))
        {
            watch.reconfigure(config);
        }
        tracing::info!("SIGHUP: configuration reloaded");
        let interval = new.check_interval;
        self.agent.settings = new;
        interval_changed.then_some(interval)
    }

    /// `--once`: one READ KEYS per LU, no path probe (read-only); nothing healed, nothing fenced.
    pub(in crate::daemon) async fn once_watch(&mut self) -> bool {
        let key = self.run.key;
        let until = self.agent.check_deadline();
        self.agent.table.refresh(&self.agent.host, until).await;
        // Read-only: READ KEYS only. A path probe is a PERSISTENT RESERVE OUT (REGISTER key ->
        // same key), which --once must not send; the paths are judged by how often our key is
        // listed, and `prfence doctor` names the path when the count is short.
        let probe = vec![Probe::No; self.agent.table.lus.len()];
        let checks = check_all(&self.agent.exec, &self.agent.table, key, &probe, until).await;
        let Some(config) = self.agent.settings.watch_config(key) else {
            return false;
        };
        let now = Instant::now().into_std();
        let mut judge = WatchState::new(
            WatchConfig {
                missing_confirmations: 1,
                heal: false,
                ..config
            },
            self.agent.table.lus.iter().map(|l| LuName(l.name.clone())),
            now,
        );
        // --once judges what it reads now: no path counts as changed since an earlier check.
        let observations = observations(&self.agent.table, &checks, |_, _| false);
        let decision = judge.tick(now, observations);
        let verdicts: Vec<(bool, String)> = decision
            .lus
            .iter()
            .enumerate()
            .map(|(index, (_, verdict))| {
                let check = checks.get(index);
                let error = check.and_then(|c| c.keys.as_ref().err());
                let listed = check
                    .and_then(|c| c.keys.as_ref().ok())
                    .map(|k| k.keys.iter().filter(|&&k| k == key).count());
                let paths = self
                    .agent
                    .table
                    .lus
                    .get(index)
                    .map(|l| l.registrations_expected());
                once_verdict(verdict, error, listed, paths.unwrap_or(0))
            })
            .collect();
        let watchdog_ok = self.check_watchdog_once();
        let healthy = watchdog_ok && verdicts.iter().all(|(ok, _)| *ok);
        {
            let mut status = lock(&self.agent.status);
            status.own_key = Some(key.to_string());
            status.state = if healthy {
                State::Healthy
            } else {
                State::Degraded
            };
            for (shown, (_, text)) in status.lus.iter_mut().zip(verdicts) {
                shown.verdict = text;
            }
        }
        self.finish_tick(&checks);
        healthy
    }

    /// `--once`: whether the configured watchdog could be opened, without opening it (that
    /// would start it): its timeout matches and the device exists and is writable. A device
    /// held by another daemon (EBUSY) shows only at a real open. A problem is shown as a
    /// degraded watchdog and printed.
    fn check_watchdog_once(&mut self) -> bool {
        let Some(w) = self.agent.settings.watchdog.clone() else {
            return true;
        };
        let problem = match crate::daemon::os::watchdog::check_timeout(
            &w.device,
            w.timeout,
            &self.agent.sys_root,
        ) {
            Err(e) => Some(e.to_string()),
            Ok(()) => nix::unistd::access(&w.device, nix::unistd::AccessFlags::W_OK)
                .err()
                .map(|errno| {
                    format!(
                        "{}: cannot open the watchdog: {}",
                        w.device.display(),
                        std::io::Error::from(errno)
                    )
                }),
        };
        match problem {
            Some(e) => {
                eprintln!("prfence agent: watchdog degraded: {e}");
                self.agent.set_watchdog(WatchdogState::Degraded, Some(e));
                false
            }
            None => true,
        }
    }
}

/// The device is opened only once armed; a wrong timeout is a configuration error at start.
pub(in crate::daemon) fn check_watchdog_timeout(agent: &Agent) -> Result<(), String> {
    match &agent.settings.watchdog {
        Some(w) => {
            crate::daemon::os::watchdog::check_timeout(&w.device, w.timeout, &agent.sys_root)
                .map_err(|e| e.to_string())
        }
        None => Ok(()),
    }
}

/// A reload's new LU set: a new table, metrics and status (keeping the watchdog's state).
/// Returns the LUs' names.
fn new_lu_set(agent: &mut Agent, new: &Settings) -> Vec<String> {
    agent.table = LuTable::new(&new.devices);
    let names: Vec<String> = new.devices.iter().map(|d| d.name.clone()).collect();
    let watchdog = lock(&agent.status).watchdog.state;
    let mut metrics = crate::daemon::metrics::Metrics::new(names.clone());
    metrics.set_watchdog(watchdog);
    *lock(&agent.metrics) = metrics;
    let mut status = lock(&agent.status);
    let fresh = crate::daemon::status::Status::new("watch", &new.devices);
    let kept = std::mem::replace(&mut *status, fresh);
    // What belongs to the process, not to the LU set.
    status.watchdog = kept.watchdog;
    status.boot_id = kept.boot_id;
    names
}

/// A reload while our key is not known yet ([`wait_for_key`]): nothing is judged,
/// so the new settings simply replace the old (the key is asked for with the new ones at the
/// next check). Returns the new check interval if it changed.
pub(in crate::daemon) async fn reload_unarmed(
    agent: &mut Agent,
    new: Settings,
) -> Option<Duration> {
    if !matches!(new.mode, ModeSettings::Watch(_)) {
        tracing::error!("SIGHUP: the mode changes only with a restart; configuration not reloaded");
        return None;
    }
    if new.devices != agent.settings.devices
        && let Err(e) = agent.devices_fit(&new.devices).await
    {
        tracing::error!(error = %e, "SIGHUP: configuration not reloaded");
        return None;
    }
    let interval_changed = new.check_interval != agent.settings.check_interval;
    let new = agent.apply_common(new);
    if new.devices != agent.settings.devices {
        new_lu_set(agent, &new);
    }
    tracing::info!("SIGHUP: configuration reloaded");
    let interval = new.check_interval;
    agent.settings = new;
    interval_changed.then_some(interval)
}

pub(in crate::daemon) fn ticker(period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(period);
    // A late check is not made up for with a burst.
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    interval
}

/// A verdict in words, for logs and the status.
fn describe(verdict: &LuVerdict, error: Option<&CommandError>) -> Cow<'static, str> {
    Cow::Owned(match verdict {
        // The steady state's verdict, after every check of every LU: not allocated.
        LuVerdict::Healthy => return Cow::Borrowed("healthy"),
        LuVerdict::InspectPaths { unregistered } if unregistered.is_empty() => {
            "key present; probing every path's registration".to_owned()
        }
        // One wording for the finding, whether the heal runs this tick (it logs what it purged),
        // the finding stands between audits, or the paths are probed again: logged once.
        LuVerdict::InspectPaths {
            unregistered: paths,
        }
        | LuVerdict::Heal { paths }
        | LuVerdict::Orphaned { paths } => format!(
            "paths without our registration (re-login?): {}; run `prfence unfence` on this node \
             to register them (the agent never does)",
            join(paths)
        ),
        LuVerdict::KeyMissing { reads } => {
            format!("our key is missing ({reads} read(s) in a row); reading again")
        }
        LuVerdict::Unreachable { .. } => match error {
            Some(e) => format!("unreadable: {e}"),
            None => "unreadable".to_owned(),
        },
        LuVerdict::Fenced => "fenced".to_owned(),
        LuVerdict::WaitingForRegistration => "our key not yet on it (added by a reload, or a \
                                              coordinator a losing node preempted): not judged \
                                              until `prfence unfence` (or fence_pr's `on`) \
                                              registers it"
            .to_owned(),
        LuVerdict::CheckingOwnRegistration { .. } => {
            "added by a reload, our key listed on it: probing this node's paths before it is \
             judged"
                .to_owned()
        }
        LuVerdict::HeldElsewhere => {
            format!("added by a reload, not judged: {}", held_elsewhere("ours"))
        }
        LuVerdict::CoordinatorLost {
            reason: FenceReason::Unreachable { for_, .. },
        } => format!(
            "coordinator unreadable for {}s: counts as lost in a fence's race (it never fences \
             this node); {}",
            for_.as_secs(),
            match error {
                Some(e) => e.to_string(),
                None => "no answer".to_owned(),
            }
        ),
        LuVerdict::CoordinatorLost { .. } => "coordinator lost: our key is gone from it (a \
                                               losing node's preempt, or another node's fence); \
                                               a majority of the coordinators lost fences this \
                                               node; `prfence unfence` registers it again"
            .to_owned(),
    })
}

/// `--once`'s verdict on one LU, read-only: without a path probe the watch core asks to inspect
/// the paths, and --once answers from the count instead. Our key listed once per expected
/// registration counts as every path registered; fewer is a problem `prfence doctor` (READ FULL
/// STATUS, also read-only) pins to a path. Whether the LU is fine, and what to show.
fn once_verdict(
    verdict: &LuVerdict,
    error: Option<&CommandError>,
    listed: Option<usize>,
    expected: usize,
) -> (bool, String) {
    match (verdict, listed) {
        (LuVerdict::InspectPaths { unregistered }, Some(listed)) if unregistered.is_empty() => {
            if listed >= expected {
                (true, "healthy".to_owned())
            } else {
                (
                    false,
                    format!(
                        "our key is registered {listed} time(s) for {expected} path(s): a path \
                         lacks our registration (re-login?); `prfence doctor` names it, \
                         `prfence unfence` on this node registers it"
                    ),
                )
            }
        }
        _ => (
            *verdict == LuVerdict::Healthy,
            describe(verdict, error).into_owned(),
        ),
    }
}

/// Whether `shown` lists `keys` as [`Key`]'s `Display` writes them, in order (without
/// formatting them: compared after every check, issue 48).
fn shows_keys(shown: &[String], keys: &[Key]) -> bool {
    shown.len() == keys.len()
        && shown.iter().zip(keys).all(|(text, key)| {
            text.len() == 18
                && text
                    .strip_prefix("0x")
                    .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                    == Some(key.get())
        })
}

fn join(paths: &[PathId]) -> String {
    paths
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a key missing from the LUs at `missing` (indexes into `read`) is a fenced node's
/// leftover on coordinators: on none of the data LUs read, so on coordinators only. A fence
/// leaves it on the coordinators its fencer could not reach or lost to it in a race, by design
/// (docs/concepts.md, "Coordinator LUs"): not a node with another LU set.
fn fenced_leftover(missing: &[usize], coordinators: &[bool], read: &[Option<&[Key]>]) -> bool {
    let data_read = || {
        read.iter()
            .enumerate()
            .filter(|(at, keys)| keys.is_some() && !coordinators.get(*at).copied().unwrap_or(false))
            .map(|(at, _)| at)
    };
    coordinators.contains(&true)
        && data_read().next().is_some()
        && data_read().all(|at| missing.contains(&at))
}

/// Says what changed in [`Status::keys_not_on_every_lu`](crate::daemon::status::Status): each key now
/// on part of the LUs, or that none is any more.
fn log_keys_not_on_every_lu(now: &[KeyNotOnEveryLu]) {
    for k in now {
        tracing::warn!(key = %k.key, missing_on = ?k.missing_on, "another node's key is on some of this node's LUs and not on these: its LU set differs from this node's (fence_pr's devices=, the agent's [[device]]), or its registration was left half done; compare `prfence doctor` on both nodes");
    }
    if now.is_empty() {
        tracing::info!("every other node's key is on every LU again");
    }
}

#[cfg(test)]
mod tests {
    /// The status's keys are compared with the keys read without formatting them.
    #[test]
    fn shown_keys_are_compared_as_display_writes_them() {
        use crate::pr::Key;
        let keys = [Key::new(0xa), Key::new(u64::MAX)];
        let shown: Vec<String> = keys.iter().map(Key::to_string).collect();
        assert!(super::shows_keys(&shown, &keys));
        assert!(!super::shows_keys(&shown, &keys[..1]));
        assert!(!super::shows_keys(&shown, &[keys[1], keys[0]]));
        assert!(
            !super::shows_keys(&["0xa".to_owned()], &keys[..1]),
            "not as Display writes it"
        );
        assert!(super::shows_keys(&[], &[]));
    }

    use super::*;

    #[test]
    fn a_key_left_on_coordinators_alone_is_a_fenced_node_not_another_lu_set() {
        let (ours, loser, other) = (Key::new(0xa), Key::new(0xb), Key::new(0xc));
        // LUs 0 and 1 hold data, 2..=4 are coordinators. The loser's key is left on coordinator
        // 4 only; a node with another set has its key on data LU 0 and not on LU 1.
        let lus: [&[Key]; 5] = [&[ours, other], &[ours], &[ours], &[ours], &[ours, loser]];
        let read: Vec<Option<&[Key]>> = lus.iter().map(|k| Some(*k)).collect();
        let coordinators = [false, false, true, true, true];
        let found = crate::ops::keys_not_on_every_lu(&read, ours);
        let kept: Vec<Key> = found
            .iter()
            .filter(|(_, missing)| !fenced_leftover(missing, &coordinators, &read))
            .map(|(key, _)| *key)
            .collect();
        assert_eq!(kept, [other]);
        // Without coordinators every partial key is reported.
        let none = [false; 5];
        assert!(found.iter().all(|(_, m)| !fenced_leftover(m, &none, &read)));
    }
}
