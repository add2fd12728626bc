//! Executing an [`FencePrRequest`] with the fencing engine ([`crate::ops`]): what `fence_pr` does
//! for each Fence Agent API action. Everything the node provides (corosync, sysfs discovery,
//! opening devices, sleeping) comes through the engine's [`Host`] and the key store, together
//! a [`FenceNode`], so the logic runs on SPC-model LUs in tests and on SG_IO devices in
//! production ([`SystemHost`]).
//!
//! Behaviour, action by action (fence_scsi 4.12.1 facts checked in /usr/sbin/fence_scsi):
//! - `on` (unfence, run by Pacemaker on the target itself): the key is `key`, else the key of
//!   `nodename`/`plug` derived as fence_scsi does. It is written to the key store first (as
//!   fence_scsi's `set_key`), then registered on every path of every LU with a reservation made
//!   where none exists, and verified. Each device of an LU that verified is appended to the
//!   store's `.dev` file (as fence_scsi's `dev_write`). `aptpl` sets APTPL on the REGISTERs.
//! - `off`: waits `delay`, then removes the target's key (the victim) using this node's own key
//!   as fence_scsi does: the key `on` stored in `/var/run/cluster.key` (`get_key()`; fence_scsi
//!   does not ask corosync for it). No stored key means this node was never unfenced and cannot
//!   preempt: failure. The victim equal to the own key is refused ("keys cannot be same").
//!   The engine fences the arbiter LU first; "this node was fenced" (our key is gone from the
//!   arbiter) is a failure like any other (exit 1, the API has no other code) and is logged as
//!   such, so an admin reading the log knows this node lost the race.
//! - `status`: ON (exit 0) if the target's key is registered on ANY LU, OFF (2) if every LU was
//!   read and none has it, else failure (1). Rationale: a node whose key is still on one LU can
//!   still write there, so calling it OFF would tell Pacemaker and the admin it is fenced when it
//!   is not. ON on only some LUs is logged as a warning naming the LUs. This is fence_scsi's
//!   semantic; Pacemaker's `pcmk_host_check=status` treats 0 and 2 alike ("can fence").
//! - `monitor`: probes every LU instead of fence_scsi's binary checks: each LU must answer READ
//!   KEYS through some path, must not refuse persistent reservations (REPORT CAPABILITIES must
//!   not say WERO is unsupported; a target without REPORT CAPABILITIES is accepted since READ KEYS
//!   worked), and this node's stored key must be registered (else this node cannot fence: it
//!   was fenced or never unfenced). A dead path of an LU that answers elsewhere is a warning on
//!   stderr, not a failure, so Pacemaker does not bounce the device for a degraded path
//!   (fence-agents PR #548). No stored key is a failure, as in fence_scsi.
//! - `list`: every node of the corosync nodelist (never empty: an empty list would make
//!   Pacemaker's dynamic-list check refuse to fence anyone, so it is a failure). `list-status`:
//!   each node with ON/OFF/UNKNOWN by the `status` rule.
//! - `metadata`/`manpage`: the XML. `validate-all`: the parse succeeded, so exit 0.
//! - `power_wait` is slept after a successful `on`/`off`; `suppress_errors` has no effect (in
//!   fence_scsi it only silences a missing `.dev` file in `monitor`, which fence_pr never reads);
//!   `retry_on`, `login_timeout`, `shell_timeout`, `stonith_status_sleep` have nothing to act on.
//!
//! Timeouts: each SCSI command is bounded by `power_timeout` unless timeouts are disabled
//! (`disable_timeout`, set automatically under pacemaker-fenced), in which case the transport's
//! default ([`Policy::DEFAULT_TIMEOUT`], 10 s) bounds it: SG_IO always needs a bound, and a
//! bounded command lets the engine move to another path within Pacemaker's timeout. The whole
//! run (delay, corosync queries, discovery, engine) aims to finish within [`RUN_BUDGET`], below
//! Pacemaker's default 60 s `pcmk_off_timeout`; the engine always gets at least
//! [`MIN_ENGINE_DEADLINE`], so a long `delay` needs a longer Pacemaker timeout (warned).
//!
//! Devices: `devices`, resolved by discovery (a dm-multipath map stands for its paths; a device
//! that vanished is a node-local LU: a dead path for on, status and monitor, while off sends
//! nothing, as the arbiter could not be named; a partition, an LVM volume or a non-SCSI disk
//! fails the request). No `devices`: the PVs of clustered or shared
//! VGs (`vgs_path`), as fence_scsi. `mpath_register_method=multi` (default) uses every path of
//! each LU; `single` uses one path per LU (the first live one), so registration and reservation
//! go through that path only and a dead path fails the LU. `readonly` changes nothing: devices
//! are always opened read-only (SG_IO needs no write access, and a read-only open does not
//! trigger udev change events, the reason fence_scsi added the option).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::metadata::metadata_xml;
use super::store::{KeyStore, LuRecord};
use super::{Action, FencePrExit, FencePrRequest, MpathRegisterMethod, Options};
use crate::discover::{DiscoverError, LuId, PathInfo, Resolution};
use crate::host::{Host, SystemHost};
use crate::keys::{self, KeyError, Nodelist};
use crate::ops::{
    self, Arbitration, Limits, LuReport, LuTarget, Outcome, PathUse, Report, TieBreak, Verdict,
};
use crate::ops::{OpenPath, Opener, OwnInitiator, targets};
use crate::pr::{Key, PrOutAction};
use crate::transport::{CommandError, ErrorKind, Policy, PrRequest, PrTransport, Reply};

/// The whole run should end within this, below Pacemaker's default 60 s fence timeout.
pub const RUN_BUDGET: Duration = Duration::from_secs(50);
/// The least the engine is given, however long the delay and the corosync queries took.
pub const MIN_ENGINE_DEADLINE: Duration = Duration::from_secs(10);

/// What fence_pr uses of the node: the [`Host`] (corosync, discovery, opening devices,
/// sleeping) and the key store, which is fence_pr's own file (fence_scsi's format), not the
/// node's.
pub struct FenceNode {
    host: Arc<dyn Host>,
    store: KeyStore,
}

impl FenceNode {
    pub fn new(host: Arc<dyn Host>, store: KeyStore) -> FenceNode {
        FenceNode { host, store }
    }

    /// The real node, with the node's store ([`KeyStore::from_environment`]).
    pub fn from_environment() -> FenceNode {
        FenceNode::new(Arc::new(SystemHost::new()), KeyStore::from_environment())
    }

    /// Output of `corosync-cmapctl <args…>` (with `options.corosync_cmap_path`).
    fn cmapctl(&self, options: &Options, args: &[&str]) -> Result<String, KeyError> {
        self.host
            .cmapctl(&options.corosync_cmap_path, args, helper_timeout(options))
    }

    /// Lenient discovery of the given devices ([`Host::resolve_each`]).
    fn resolve(&self, devices: &[PathBuf]) -> Result<Resolution, DiscoverError> {
        self.host.resolve_each(devices)
    }

    /// LVM autodiscovery, lenient ([`Host::resolve_lvm_each`]).
    fn resolve_lvm(&self, options: &Options) -> Result<Resolution, DiscoverError> {
        self.host
            .resolve_lvm_each(&options.vgs_path, helper_timeout(options))
    }

    /// Opens a device for PR commands; called on the engine's workers, on each path's first
    /// command, so a blocking open counts against the action's deadline.
    fn opener(&self, policy: Policy) -> Opener<Arc<dyn PrTransport>> {
        let host = Arc::clone(&self.host);
        Arc::new(move |device| host.open(device, policy))
    }

    /// The NVMe host id sysfs gives for an NVMe path ([`Host::path_sysfs`]).
    fn nvme_host_id(&self, path: &PathInfo) -> Option<String> {
        self.host.path_sysfs(path).nvme_host_id
    }

    fn store(&self) -> &KeyStore {
        &self.store
    }

    fn sleep(&self, duration: Duration) {
        self.host.sleep(duration);
    }
}

/// The bound for `corosync-cmapctl` and `vgs`: `power_timeout`, or [`HELPER_TIMEOUT`] when
/// timeouts are disabled. fence_scsi leaves them unbounded under pacemaker-fenced; a bound turns
/// a hung helper into a logged failure instead of a kill at Pacemaker's timeout.
fn helper_timeout(options: &Options) -> Option<Duration> {
    Some(options.command_timeout().unwrap_or(HELPER_TIMEOUT))
}

/// See `helper_timeout`; fence-agents' default `power_timeout`.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(20);

/// A failure before or outside the engine, logged with fence-agents' "Failed:" wording.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(String);

impl Failed {
    fn from(e: impl std::fmt::Display) -> Failed {
        Failed(e.to_string())
    }
}

/// A path as the agent uses it: REGISTERs carry APTPL when `aptpl` is set (for `on`). Shared,
/// so `monitor`'s REPORT CAPABILITIES probes use the same (lazily opened) device as the engine.
#[derive(Debug)]
pub struct FencePrPath<T> {
    inner: Arc<OpenPath<T>>,
    aptpl: bool,
}

impl<T> FencePrPath<T> {
    fn share(&self) -> Self {
        FencePrPath {
            inner: Arc::clone(&self.inner),
            aptpl: self.aptpl,
        }
    }
}

impl<T: PrTransport> PrTransport for FencePrPath<T> {
    fn device(&self) -> &Path {
        self.inner.device()
    }
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        let persisted;
        let request = match request {
            // Unregistering (service action key 0) never asks to persist anything.
            PrRequest::Out(out)
                if self.aptpl
                    && matches!(
                        out.action,
                        PrOutAction::Register | PrOutAction::RegisterAndIgnoreExistingKey
                    )
                    && !out.sa_key.is_zero() =>
            {
                persisted = out.clone().with_aptpl(true);
                PrRequest::Out(&persisted)
            }
            other => other,
        };
        self.inner.execute(request)
    }
}

/// The engine's targets for this request plus, per LU identifier, the device names given for it
/// (what `on` records in the `.dev` file).
struct Targets<T> {
    lus: Vec<LuTarget<FencePrPath<T>>>,
    /// The `coordinators`, apart (empty: the first LU of `lus` is the arbiter).
    coordinators: Vec<LuTarget<FencePrPath<T>>>,
    given: HashMap<LuId, Vec<PathBuf>>,
    /// This node's identities on the paths ([`OwnInitiator::of_resolution`]).
    initiators: Vec<OwnInitiator>,
}

/// The devices of a run, opened.
type OpenTargets = Targets<Arc<dyn PrTransport>>;

/// Executes `request` (help and version are the caller's: they print before logging starts).
/// Writes the action's output (metadata, list, "Success: …", "Status: …") to `out` and logs the
/// rest through `tracing`. Returns the exit code.
pub fn execute(
    request: &FencePrRequest,
    system: &FenceNode,
    agent_name: &str,
    out: &mut dyn Write,
) -> FencePrExit {
    // the supervisor's start: the budget is what Pacemaker waits for
    let started = crate::worker::started();
    for note in &request.notes {
        tracing::debug!("{note}");
    }
    let result = match request.action {
        Action::Metadata | Action::Manpage => {
            print(out, &metadata_xml(agent_name)).map(|()| FencePrExit::Success)
        }
        Action::ValidateAll => {
            tracing::info!("validate-all: the options are valid");
            Ok(FencePrExit::Success)
        }
        Action::List => list(request, system, out),
        Action::ListStatus => list_status(request, system, out, started),
        Action::Monitor => monitor(request, system, started),
        Action::Status => status(request, system, out, started),
        Action::On => unfence(request, system, out, started),
        Action::Off => fence(request, system, out, started),
    };
    match result {
        Ok(code) => code,
        Err(Failed(message)) => {
            for line in message.lines() {
                if line.starts_with("Failed") {
                    tracing::error!("{line}");
                } else {
                    tracing::error!("Failed: {line}");
                }
            }
            FencePrExit::Error
        }
    }
}

fn print(out: &mut dyn Write, text: &str) -> Result<(), Failed> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| Failed(format!("writing the output: {e}")))
}

/// The per-command policy (see the module docs).
fn policy(options: &Options) -> Policy {
    Policy {
        timeout: options.command_timeout().unwrap_or(Policy::DEFAULT_TIMEOUT),
        ..Policy::default()
    }
}

fn limits(started: Instant) -> Limits {
    let left = RUN_BUDGET.saturating_sub(started.elapsed());
    if left < MIN_ENGINE_DEADLINE {
        tracing::warn!(
            "{:?} of the {RUN_BUDGET:?} budget already spent (delay, corosync, discovery); the \
             engine still gets {MIN_ENGINE_DEADLINE:?}: make Pacemaker's timeout for this action \
             longer than delay + 50 s",
            started.elapsed()
        );
    }
    Limits {
        deadline: left.max(MIN_ENGINE_DEADLINE),
        ..Limits::default()
    }
}

/// Resolves the devices (or LVM) and opens every path.
fn lu_targets(options: &Options, system: &FenceNode, aptpl: bool) -> Result<OpenTargets, Failed> {
    let resolution = if options.devices.is_empty() {
        tracing::debug!(
            "no devices given: looking for PVs of clustered or shared VGs with {}",
            options.vgs_path.display()
        );
        system
            .resolve_lvm(options)
            .map_err(|e| Failed(format!("No devices found: {e}")))?
    } else {
        system.resolve(&options.devices).map_err(Failed::from)?
    };
    for unknown in &resolution.unidentified {
        tracing::warn!(
            "{}; not identified: a dead path for on, status and monitor, and off sends nothing \
             while it is named (it could be the arbiter)",
            unknown.error
        );
    }
    // For comparing nodes after the fact (P2: every node must name the same LUs).
    tracing::info!(
        "LU set: {}",
        crate::ops::LuSet::of(
            resolution
                .lus
                .iter()
                .map(|lu| Some(lu.id.clone()))
                .chain(resolution.unidentified.iter().map(|_| None))
        )
    );
    let mut given: HashMap<LuId, Vec<PathBuf>> = HashMap::new();
    name_given(&mut given, &resolution);
    let mut initiators = OwnInitiator::of_resolution(&resolution, |p| system.nvme_host_id(p));
    let open = |resolution: &Resolution| open_lus(options, system, aptpl, resolution);
    let lus = open(&resolution);
    let coordinators = if options.coordinators.is_empty() {
        Vec::new()
    } else {
        let resolution = system
            .resolve(&options.coordinators)
            .map_err(|e| Failed(format!("coordinators: {e}")))?;
        for unknown in &resolution.unidentified {
            tracing::warn!(
                "coordinator {}; not identified: counted as lost by off, which sends it nothing",
                unknown.error
            );
        }
        name_given(&mut given, &resolution);
        initiators.extend(OwnInitiator::of_resolution(&resolution, |p| {
            system.nvme_host_id(p)
        }));
        open(&resolution)
    };
    for unknown in &resolution.unidentified {
        if let Some(lu) = lus
            .iter()
            .find(|lu| lu.paths.iter().any(|p| p.device() == unknown.device))
        {
            given
                .entry(lu.id.clone())
                .or_default()
                .push(unknown.device.clone());
        }
    }
    // Pacemaker starts fence_pr with pacemaker.service's limits (soft 1024 by default).
    let all = || lus.iter().chain(&coordinators);
    if let Err(e) = crate::descriptors::fit(all().count(), all().map(|lu| lu.paths.len()).sum()) {
        tracing::warn!(
            "{e}: the paths beyond it fail to open (EMFILE); {}",
            e.raise_in("pacemaker.service")
        );
    }
    Ok(Targets {
        lus,
        coordinators,
        given,
        initiators,
    })
}

/// Adds to `given` the names each LU of `resolution` was given by (what `on` records).
fn name_given(given: &mut HashMap<LuId, Vec<PathBuf>>, resolution: &Resolution) {
    for lu in &resolution.lus {
        let names = given.entry(lu.id.clone()).or_default();
        for path in &lu.paths {
            if !names.contains(&path.given) {
                names.push(path.given.clone());
            }
        }
    }
}

/// The LUs of `resolution`, every path opened as this run's options say (one path per LU with
/// `mpath_register_method=single`; APTPL on the registrations of `on`).
fn open_lus(
    options: &Options,
    system: &FenceNode,
    aptpl: bool,
    resolution: &Resolution,
) -> Vec<LuTarget<FencePrPath<Arc<dyn PrTransport>>>> {
    let single = options.mpath_register_method == MpathRegisterMethod::Single;
    targets(resolution, single, &system.opener(policy(options)))
        .into_iter()
        .map(|lu| LuTarget {
            id: lu.id,
            paths: lu
                .paths
                .into_iter()
                .map(|inner| FencePrPath {
                    inner: Arc::new(inner),
                    aptpl,
                })
                .collect(),
        })
        .collect()
}

/// The key from `key` (corosync-cmapctl) and the devices resolved and opened ([`lu_targets`]),
/// side by side: each waits on something other than the CPU (a helper process; sysfs and device
/// nodes), and a fence's measured tie-break counts both. Neither sends a PR command. Each result
/// is the caller's to check, in the order it checked them when they ran one after the other.
fn key_beside_targets(
    options: &Options,
    system: &FenceNode,
    aptpl: bool,
    key: impl FnOnce() -> Result<Key, Failed>,
) -> (Result<Key, Failed>, Result<OpenTargets, Failed>) {
    std::thread::scope(|scope| {
        let targets = scope.spawn(|| lu_targets(options, system, aptpl));
        let key = key();
        let targets = targets
            .join()
            .unwrap_or_else(|_| Err(Failed("device discovery panicked".into())));
        (key, targets)
    })
}

/// Logs the engine's evidence: failures as errors, dead paths as warnings, the rest below.
/// The engine's report as fence_pr shows it (logs, `monitor`'s problems): every failed command
/// with fence_pr's advice, in terms of its own parameters.
fn shown(result: Result<Report, ops::RequestError>) -> Result<Report, Failed> {
    Ok(result
        .map_err(Failed::from)?
        .advised(crate::hints::fence_pr))
}

fn log_report(report: &Report) {
    for lu in &report.lus {
        if lu.ok {
            tracing::debug!("{} {}: {}", report.command, lu.lu, lu.verdict);
        } else if lu.verdict == Verdict::NotRegistered {
            // An answer (status OFF), not an error; monitor reports it itself.
            tracing::info!("{} {}: {}", report.command, lu.lu, lu.verdict);
        } else {
            tracing::error!(
                "{} {}: {}{}",
                report.command,
                lu.lu,
                lu.verdict,
                lu.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            );
        }
        for path in &lu.paths {
            if matches!(path.state, PathUse::Dead | PathUse::Failed) {
                tracing::warn!(
                    "{} {}: path {} {}: {}",
                    report.command,
                    lu.lu,
                    path.device,
                    if path.state == PathUse::Dead {
                        "dead"
                    } else {
                        "failed"
                    },
                    path.error
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default()
                );
            }
        }
        for note in &lu.notes {
            tracing::info!("{} {}: {note}", report.command, lu.lu);
        }
    }
    tracing::info!("{}: {}", report.command, report.summary);
}

/// Memoizes corosync queries: `list-status` derives a key per node from the same two answers.
/// Answers are kept whether they succeeded or not, so a query asked again (or answered ahead by
/// [`Corosync::ask_at_once`]) reports what its own run would have.
struct Corosync<'a> {
    system: &'a FenceNode,
    options: &'a Options,
    answers: HashMap<String, Result<String, KeyError>>,
}

impl<'a> Corosync<'a> {
    fn new(system: &'a FenceNode, options: &'a Options) -> Self {
        Corosync {
            system,
            options,
            answers: HashMap::new(),
        }
    }

    fn query(&mut self, arg: &str) -> Result<String, KeyError> {
        if let Some(answer) = self.answers.get(arg) {
            return answer.clone();
        }
        let answer = self.system.cmapctl(self.options, &[arg]);
        self.answers.insert(arg.to_owned(), answer.clone());
        answer
    }

    /// Answers the queries not answered yet with as few helper processes as it can: each waits
    /// on corosync (and costs a process start), and the key's derivation asks them one after
    /// the other. One run answers them all ([`Corosync::ask_in_one_run`]); whatever it leaves
    /// unanswered runs side by side, one process per query. A worker that cannot start or
    /// panics leaves its query to be run again when asked.
    fn ask_at_once(&mut self, args: &[&str]) {
        let unanswered = |answers: &HashMap<String, _>| -> Vec<&str> {
            args.iter()
                .copied()
                .filter(|arg| !answers.contains_key(*arg))
                .collect()
        };
        let missing = unanswered(&self.answers);
        if missing.len() > 1 {
            self.ask_in_one_run(&missing);
        }
        let missing = unanswered(&self.answers);
        let Some((first, rest)) = missing.split_first() else {
            return;
        };
        let (system, options) = (self.system, self.options);
        let (first_answer, rest_answers) = std::thread::scope(|scope| {
            let workers: Vec<_> = rest
                .iter()
                .map(|arg| {
                    std::thread::Builder::new()
                        .spawn_scoped(scope, move || system.cmapctl(options, &[arg]))
                        .ok()
                })
                .collect();
            let first_answer = system.cmapctl(options, &[first]);
            let rest_answers: Vec<_> = workers
                .into_iter()
                .map(|w| w.and_then(|w| w.join().ok()))
                .collect();
            (first_answer, rest_answers)
        });
        self.answers.insert((*first).to_owned(), first_answer);
        for (arg, answer) in rest.iter().zip(rest_answers) {
            if let Some(answer) = answer {
                self.answers.insert((*arg).to_owned(), answer);
            }
        }
    }

    /// `corosync-cmapctl P1 P2` prints what `corosync-cmapctl P1` and `corosync-cmapctl P2`
    /// would, one after the other ([`keys::split_cmap_output`]). A part that came back empty, or
    /// a run that failed or printed something else, is left to a query of its own (a wrapper of
    /// the tool may take one argument); a run that timed out answers every query with its error:
    /// corosync itself did not answer, and asking again would only wait as long again.
    fn ask_in_one_run(&mut self, args: &[&str]) {
        match self.system.cmapctl(self.options, args) {
            Ok(output) => {
                let parts = keys::split_cmap_output(&output, args).unwrap_or_default();
                for (arg, part) in args.iter().zip(parts) {
                    if !part.is_empty() {
                        self.answers.insert((*arg).to_owned(), Ok(part));
                    }
                }
            }
            Err(
                e @ KeyError::Cmapctl {
                    timed_out: true, ..
                },
            ) => {
                for arg in args {
                    self.answers.insert((*arg).to_owned(), Err(e.clone()));
                }
            }
            Err(e) => tracing::debug!("{e}; asking one query per run"),
        }
    }

    fn key_of(&mut self, request: &FencePrRequest) -> Result<Key, Failed> {
        self.ask_at_once(request.corosync_queries());
        let key = request
            .target_key(|arg| self.query(arg))
            .map_err(Failed::from)?;
        Ok(Key::new(key))
    }

    /// With `key_value=id` derived from the nodelist, the LUs that hold keys of this cluster's
    /// tag that no node of the nodelist derives now ([`keys::id_keys_no_node_derives`]), as text
    /// for a failure; `None` when there are none or the key was not derived that way.
    fn keys_no_node_derives(
        &mut self,
        request: &FencePrRequest,
        report: &Report,
    ) -> Option<String> {
        let options = &request.options;
        if options.key.is_some()
            || options.plug.is_none()
            || options.key_value != keys::KeyScheme::FenceScsiId
        {
            return None;
        }
        let cluster = keys::parse_cluster_name(&self.query(keys::CLUSTER_NAME_QUERY).ok()?)?;
        let nodelist = Nodelist::parse(&self.query(keys::NODELIST_QUERY).ok()?);
        let found: Vec<String> = report
            .lus
            .iter()
            .filter_map(|lu| {
                let unknown =
                    keys::id_keys_no_node_derives(&cluster, &nodelist, lu.keys.as_deref()?);
                (!unknown.is_empty()).then(|| {
                    let listed: Vec<String> = unknown.iter().map(Key::to_string).collect();
                    format!("{} holds {}", lu.lu, listed.join(" "))
                })
            })
            .collect();
        (!found.is_empty()).then(|| {
            format!(
                "{}, a key of this cluster that no node of the corosync nodelist derives now",
                found.join("; ")
            )
        })
    }

    fn node_names(&mut self) -> Result<Vec<String>, Failed> {
        let nodelist = Nodelist::parse(&self.query(keys::NODELIST_QUERY).map_err(Failed::from)?);
        let names: Vec<String> = nodelist
            .node_names()
            .into_iter()
            .map(String::from)
            .collect();
        if names.is_empty() {
            return Err(Failed(format!(
                "the corosync nodelist ({} nodelist) names no node; an empty list would stop \
                 Pacemaker from fencing any node with this device",
                self.options.corosync_cmap_path.display()
            )));
        }
        Ok(names)
    }
}

fn list(
    request: &FencePrRequest,
    system: &FenceNode,
    out: &mut dyn Write,
) -> Result<FencePrExit, Failed> {
    let names = Corosync::new(system, &request.options).node_names()?;
    print(out, &super::render_list(&names, &request.options.separator))?;
    Ok(FencePrExit::Success)
}

/// The `status` rule (module docs): Some(true) ON, Some(false) OFF, None unknown.
fn status_verdict(report: &Report) -> Option<bool> {
    let on = report
        .lus
        .iter()
        .any(|lu| lu.verdict == Verdict::Registered);
    let off = report
        .lus
        .iter()
        .all(|lu| lu.verdict == Verdict::NotRegistered);
    if on {
        Some(true)
    } else if off {
        Some(false)
    } else {
        None
    }
}

fn registered_partially(report: &Report) -> Vec<&str> {
    report
        .lus
        .iter()
        .filter(|lu| lu.verdict != Verdict::Registered)
        .map(|lu| lu.lu.as_str())
        .collect()
}

fn status_of(
    options: &Options,
    system: &FenceNode,
    key: Key,
    started: Instant,
) -> Result<Report, Failed> {
    status_report(lu_targets(options, system, false)?, key, started)
}

fn status_report(targets: OpenTargets, key: Key, started: Instant) -> Result<Report, Failed> {
    let report = shown(ops::status(targets.lus, key, limits(started)))?;
    log_report(&report);
    Ok(report)
}

fn status(
    request: &FencePrRequest,
    system: &FenceNode,
    out: &mut dyn Write,
    started: Instant,
) -> Result<FencePrExit, Failed> {
    let mut corosync = Corosync::new(system, &request.options);
    let (key, targets) =
        key_beside_targets(&request.options, system, false, || corosync.key_of(request));
    let key = key?;
    let report = status_report(targets?, key, started)?;
    match off_unless_moved(status_verdict(&report), &mut corosync, request, &report) {
        Some(true) => {
            let missing = registered_partially(&report);
            if !missing.is_empty() {
                tracing::warn!(
                    "{key} is registered on some LUs only; not (or unreadable) on: {}. The node \
                     can still write where it is registered, so it is ON",
                    missing.join(", ")
                );
            }
            print(out, "Status: ON\n")?;
            Ok(FencePrExit::Success)
        }
        Some(false) => {
            print(out, "Status: OFF\n")?;
            Ok(FencePrExit::Off)
        }
        None => Err(Failed(format!(
            "cannot tell whether {key} is registered: {}",
            report.summary
        ))),
    }
}

/// A node's key on no LU is OFF, unless it may hold another: with key_value=id, a key of this
/// cluster that no node of the nodelist derives now ([`Corosync::keys_no_node_derives`]) may be
/// its old position's. Then: unknown (logged), as `off` refuses to report it done.
fn off_unless_moved(
    verdict: Option<bool>,
    corosync: &mut Corosync<'_>,
    request: &FencePrRequest,
    report: &Report,
) -> Option<bool> {
    if verdict != Some(false) {
        return verdict;
    }
    match corosync.keys_no_node_derives(request, report) {
        Some(problem) => {
            tracing::error!(
                "cannot tell whether {} is off: its derived key is on no LU, but {problem}; \
                 it may hold one of those (its nodelist position moved)",
                request.options.plug.as_deref().unwrap_or("the node")
            );
            None
        }
        None => Some(false),
    }
}

fn list_status(
    request: &FencePrRequest,
    system: &FenceNode,
    out: &mut dyn Write,
    started: Instant,
) -> Result<FencePrExit, Failed> {
    let mut corosync = Corosync::new(system, &request.options);
    let names = corosync.node_names()?;
    let mut rows: Vec<(String, Option<bool>)> = Vec::with_capacity(names.len());
    for name in names {
        let mut per_node = request.clone();
        per_node.options.plug = Some(name.clone());
        per_node.options.key = None;
        let on = match corosync.key_of(&per_node) {
            Ok(key) => match status_of(&request.options, system, key, started) {
                Ok(report) => {
                    off_unless_moved(status_verdict(&report), &mut corosync, &per_node, &report)
                }
                Err(e) => {
                    tracing::error!("status of {name}: {e}");
                    None
                }
            },
            Err(e) => {
                tracing::error!("key of {name}: {e}");
                None
            }
        };
        rows.push((name, on));
    }
    print(
        out,
        &super::render_list_status(&rows, &request.options.separator),
    )?;
    Ok(FencePrExit::Success)
}

fn stored_key(system: &FenceNode, why: &str) -> Result<Key, Failed> {
    match system.store().read_key().map_err(Failed::from)? {
        Some(key) => Ok(Key::new(key)),
        None => {
            let legacy = system
                .store()
                .legacy_key_path()
                .map(|p| format!(" (nor \"{}\")", p.display()))
                .unwrap_or_default();
            Err(Failed(format!(
                "Failed: Cannot open file \"{}\"{legacy}: this node has no key ({why}); it is \
                 written by `on` (unfencing), which Pacemaker runs when the node joins",
                system.store().key_path().display()
            )))
        }
    }
}

fn unfence(
    request: &FencePrRequest,
    system: &FenceNode,
    out: &mut dyn Write,
    started: Instant,
) -> Result<FencePrExit, Failed> {
    let options = &request.options;
    let (key, targets) = key_beside_targets(options, system, options.aptpl, || {
        Corosync::new(system, options).key_of(request)
    });
    let key = key?;
    // fence_scsi records the key before registering, so a later `off` from this node and the
    // watchdog check know it even if registration fails halfway.
    system.store().write_key(key.get()).map_err(Failed::from)?;
    let mut targets = targets?;
    let given = targets.given;
    let initiators = targets.initiators;
    // the coordinators are LUs like the others to `on`
    targets.lus.append(&mut targets.coordinators);
    // P3: the LUs this node began registering on earlier in this boot; if its key is gone from
    // any of them it was fenced since (Pacemaker may still ask it to unfence, fence-reaction=stop)
    // and the engine registers nowhere. The engine adds each other LU before registering there.
    let record = LuRecord::load(system.store(), key.get()).map_err(Failed::from)?;
    let report = shown(ops::unfence_observed(
        targets.lus,
        key,
        ops::UnfenceBy::Rejoin(Arc::new(record)),
        &initiators,
        limits(started),
        &mut |_| {},
    ))?;
    log_report(&report);
    system
        .store()
        .add_devices(
            report
                .lus
                .iter()
                .filter(|lu| lu.verdict == Verdict::Unfenced)
                .flat_map(|lu| given.get(&lu.lu).into_iter().flatten())
                .map(PathBuf::as_path),
        )
        .map_err(Failed::from)?;
    match report.outcome {
        Outcome::Success => {}
        Outcome::ThisNodeFenced => {
            return Err(Failed(format!(
                "THIS NODE WAS FENCED after an earlier on in this boot, or cannot tell that it \
                 was not: {}. Reboot it before it rejoins: its page cache and queued I/O may \
                 still hold writes from before the fence, and a reboot also clears this record \
                 ({}). If the target lost its registrations, or that earlier on stopped before \
                 its REGISTER landed, and this node was never fenced, `prfence unfence --key \
                 {key} DEVICE...` registers it explicitly",
                report.summary,
                system.store().lus_path().display()
            )));
        }
        _ => return Err(Failed(report.summary)),
    }
    power_wait(options, system);
    print(out, "Success: Powered ON\n")?;
    Ok(FencePrExit::Success)
}

fn fence(
    request: &FencePrRequest,
    system: &FenceNode,
    out: &mut dyn Write,
    started: Instant,
) -> Result<FencePrExit, Failed> {
    let options = &request.options;
    if !options.delay.is_zero() {
        tracing::info!("Delay {} second(s) before fencing", options.delay.as_secs());
        system.sleep(options.delay);
    }
    // A measured tie-break counts this fence's own work (corosync, discovery, the arbiter's first
    // answer), not the deliberate delay.
    let working = Instant::now();
    let mut corosync = Corosync::new(system, options);
    let (victim, targets) = key_beside_targets(options, system, false, || corosync.key_of(request));
    let victim = victim?;
    let own = stored_key(system, "needed to preempt the victim")?;
    super::check_not_self(victim.get(), own.get()).map_err(Failed::from)?;
    let targets = targets?;
    let limits = Limits {
        tie_break: TieBreak::Measured {
            since: working,
            cap: ops::TIE_BREAK_CAP,
        },
        ..limits(started)
    };
    let arbitration = if targets.coordinators.is_empty() {
        Arbitration::FirstLu
    } else {
        Arbitration::Coordinators {
            lus: targets.coordinators,
            unreachable_data: options.unreachable_data,
        }
    };
    let report = shown(ops::fence_arbitrated_observed(
        targets.lus,
        arbitration,
        own,
        victim,
        limits,
        &mut |_| {},
    ))?;
    log_report(&report);
    match report.outcome {
        Outcome::Success => {
            if let Some(problem) = corosync.keys_no_node_derives(request, &report) {
                return Err(Failed(format!(
                    "{victim} is off every LU, but {problem}. With key_value=id a node's key is \
                     its position in the corosync nodelist: a node removed from the middle of \
                     the nodelist leaves the nodes after it holding the keys of their old \
                     positions, so {} may hold one of these keys and still write; this fence is \
                     not reported done. `prfence full-status DEVICE` names the initiator of each \
                     key; fence the right one by key (`prfence fence --key {own} --victim KEY \
                     DEVICE...`) and confirm it to Pacemaker, and remove the keys of removed \
                     nodes: docs/operations.md, \"Adding or removing a node\"",
                    request.options.plug.as_deref().unwrap_or("the victim")
                )));
            }
            power_wait(options, system);
            let already = report
                .lus
                .iter()
                .all(|lu| lu.verdict == Verdict::AlreadyFenced);
            print(
                out,
                if already {
                    "Success: Already OFF\n"
                } else {
                    "Success: Powered OFF\n"
                },
            )?;
            Ok(FencePrExit::Success)
        }
        Outcome::ThisNodeFenced => Err(Failed(format!(
            "THIS NODE WAS FENCED, not {victim}: {}. It must not fence anyone; it needs `on` \
             (unfencing) after it rejoins the cluster",
            report.summary
        ))),
        _ => Err(Failed(report.summary)),
    }
}

/// fence-agents' `power_wait`: a pause after a successful `on` or `off`.
fn power_wait(options: &Options, system: &FenceNode) {
    if !options.power_wait.is_zero() {
        tracing::debug!("power_wait: {:?}", options.power_wait);
        system.sleep(options.power_wait);
    }
}

/// What REPORT CAPABILITIES says about one LU, tried on each path until one answers.
fn capabilities_problem<T: PrTransport>(lu: &LuTarget<T>) -> Option<Result<String, String>> {
    for path in &lu.paths {
        match path.report_capabilities() {
            Ok(caps) => {
                let wero = ops::FENCING_TYPE;
                return match &caps.supported_types {
                    Some(types) if !types.contains(&wero) => Some(Err(format!(
                        "{} does not support {wero} reservations (REPORT CAPABILITIES type \
                         mask); it cannot be fenced with this agent",
                        lu.id
                    ))),
                    _ => None,
                };
            }
            Err(e) if matches!(e.kind, ErrorKind::NotSupported) => {
                let e = e.hinted(crate::hints::fence_pr);
                return Some(Err(format!(
                    "{} has no persistent reservations: {e}",
                    lu.id
                )));
            }
            Err(e) if matches!(e.kind, ErrorKind::InvalidField) => {
                let e = e.hinted(crate::hints::fence_pr);
                return Some(Ok(format!(
                    "{}: REPORT CAPABILITIES is not supported ({e}); READ KEYS decides",
                    lu.id
                )));
            }
            // Dead paths show up in the status pass.
            Err(_) => {}
        }
    }
    None
}

fn monitor(
    request: &FencePrRequest,
    system: &FenceNode,
    started: Instant,
) -> Result<FencePrExit, Failed> {
    let options = &request.options;
    let own = stored_key(system, "monitor checks it is registered")?;
    let Targets {
        mut lus,
        coordinators,
        ..
    } = lu_targets(options, system, false)?;
    let coordinator_ids: Vec<LuId> = coordinators.iter().map(|c| c.id.clone()).collect();
    lus.extend(coordinators);
    let limits = limits(started);
    let until = Instant::now() + limits.deadline;
    // REPORT CAPABILITIES on every LU at once, each through its first answering path, beside
    // the engine's status pass and under the same deadline: a probe still blocked then (a hung
    // path) only costs a warning, since the status pass says whether the LU answers.
    let pending = spawn_capability_probes(&lus);
    let report = shown(ops::status(lus, own, limits))?;
    let caps = collect_capability_probes(pending, until);
    let mut problems: Vec<String> = Vec::new();
    for found in caps.into_iter().flatten() {
        match found {
            Ok(warning) => tracing::warn!("{warning}"),
            Err(problem) => problems.push(problem),
        }
    }
    let (coordinator_reports, data): (Vec<&LuReport>, Vec<&LuReport>) = report
        .lus
        .iter()
        .partition(|lu| coordinator_ids.contains(&lu.lu));
    for lu in data {
        problems.extend(monitor_problem(lu, own));
        degraded_warning(lu);
    }
    if !options.coordinators.is_empty() {
        let (warnings, problem) =
            coordinator_findings(&coordinator_reports, options.coordinators.len(), own);
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        problems.extend(problem);
        for lu in coordinator_reports {
            degraded_warning(lu);
        }
    }
    if problems.is_empty() {
        tracing::info!(
            "monitor: {} LUs reachable, {own} registered on each",
            report.lus.len()
        );
        Ok(FencePrExit::Success)
    } else {
        Err(Failed(problems.join("\n")))
    }
}

/// A REPORT CAPABILITIES probe per LU, each on a thread of its own (not joined: a hung path
/// keeps only its own thread); the LU's identifier and the receiver of its result.
type CapabilityProbe = (
    LuId,
    Result<Receiver<Option<Result<String, String>>>, String>,
);

fn spawn_capability_probes<T: PrTransport + 'static>(
    lus: &[LuTarget<FencePrPath<T>>],
) -> Vec<CapabilityProbe> {
    lus.iter()
        .map(|lu| {
            let shared = LuTarget {
                id: lu.id.clone(),
                paths: lu.paths.iter().map(FencePrPath::share).collect(),
            };
            let (send, receive) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("fence_pr-caps".to_owned())
                .spawn(move || {
                    let _ = send.send(capabilities_problem(&shared));
                });
            let probe = spawned.map(|_| receive).map_err(|e| {
                format!(
                    "{}: cannot start a thread for REPORT CAPABILITIES ({e}): the process hit a \
                     thread or memory limit; name fewer devices",
                    lu.id
                )
            });
            (lu.id.clone(), probe)
        })
        .collect()
}

/// Each probe's finding, or a warning for a probe still blocked at `until`.
fn collect_capability_probes(
    probes: Vec<CapabilityProbe>,
    until: Instant,
) -> Vec<Option<Result<String, String>>> {
    probes
        .into_iter()
        .map(|(id, probe)| match probe {
            Ok(receive) => {
                match receive.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Ok(found) => found,
                    Err(RecvTimeoutError::Timeout) => Some(Ok(format!(
                        "{id}: REPORT CAPABILITIES got no answer within the action's deadline; \
                         READ KEYS decides"
                    ))),
                    Err(RecvTimeoutError::Disconnected) => {
                        Some(Err(format!("{id}: REPORT CAPABILITIES check panicked")))
                    }
                }
            }
            Err(problem) => Some(Err(problem)),
        })
        .collect()
}

fn monitor_problem(lu: &LuReport, own: Key) -> Option<String> {
    match lu.verdict {
        Verdict::Registered => None,
        Verdict::NotRegistered => Some(format!(
            "this node's key {own} is not registered on {}: this node was fenced or never \
             unfenced, so it cannot fence others; run `on` (unfence) on this node",
            lu.lu
        )),
        _ => Some(format!(
            "{} unreachable ({}): {}",
            lu.lu,
            lu.verdict,
            lu.error
                .as_ref()
                .map_or_else(|| "no path answered".to_string(), ToString::to_string)
        )),
    }
}

/// What `monitor` says of the coordinators: `reports` of those identified, `named` given. Each
/// one this node cannot use (key gone: a losing node's preempt; no answer; not identified) is a
/// warning while this node's key answers on a majority, since `off` still wins there; below a
/// majority `off` cannot win, and the monitor fails.
fn coordinator_findings(
    reports: &[&LuReport],
    named: usize,
    own: Key,
) -> (Vec<String>, Option<String>) {
    let usable = reports
        .iter()
        .filter(|lu| lu.verdict == Verdict::Registered)
        .count();
    let mut lost: Vec<String> = reports
        .iter()
        .filter_map(|lu| monitor_problem(lu, own))
        .collect();
    let unidentified = named.saturating_sub(reports.len());
    if unidentified > 0 {
        lost.push(format!(
            "{unidentified} coordinator device(s) not identified (gone with their array?)"
        ));
    }
    let majority = ops::majority(named);
    if usable < majority {
        let problem = format!(
            "this node's key answers on {usable} of the {named} coordinators, fewer than the \
             {majority} an off needs to win: this node cannot fence. {}",
            lost.join("; ")
        );
        return (Vec::new(), Some(problem));
    }
    let left = usable - majority;
    let warnings = lost
        .into_iter()
        .map(|lost| {
            format!(
                "coordinator lost: {lost}; off still wins with {usable} of {named}, {left} more \
                 loss(es) allowed"
            )
        })
        .collect();
    (warnings, None)
}

fn degraded_warning(lu: &LuReport) {
    let bad: Vec<String> = lu
        .paths
        .iter()
        .filter(|p| matches!(p.state, PathUse::Dead | PathUse::Failed))
        .map(|p| {
            format!(
                "{} ({})",
                p.device,
                p.error
                    .as_ref()
                    .map_or_else(|| "no answer".to_string(), ToString::to_string)
            )
        })
        .collect();
    if !bad.is_empty() && lu.verdict == Verdict::Registered {
        tracing::warn!(
            "{} is degraded: path(s) {} failed; it is still reachable through another path",
            lu.lu,
            bad.join(", ")
        );
    }
}

#[cfg(test)]
mod tests;
