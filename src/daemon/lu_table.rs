//! The agent's view of its storage: every configured LU as currently discovered.
//!
//! - The [`Host`] resolves configured devices to their LUs and paths (and opens the paths). A
//!   node uses [`crate::host::SystemHost`] (sysfs discovery, SG_IO or NVMe ioctls through a
//!   read-only open); unit tests plug in the SPC model, so the whole driver runs without a SCSI
//!   stack.
//! - [`LuTable`] is the current view of every configured LU: re-discovered each tick (sysfs only,
//!   no PR command; the host may answer from the previous tick while sysfs shows no change),
//!   paths keyed by device and iSCSI session so a re-login is a *change*.
//! - [`PathHandle`] is one path: its lazily opened device and whether a command is outstanding
//!   on it; [`super::executor`] runs the commands.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::config::DeviceSettings;
use super::status::PathStatus;
use crate::discover::{DiscoverError, Lu, LuId, Repeated};
use crate::host::Host;
use crate::ops::OwnInitiator;
use crate::transport::Protocol;
use crate::transport::{CommandError, Policy, PrTransport};

/// One path of an LU as discovery reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathSpec {
    /// The node the agent opens: a SCSI path's sg node (`/dev/sg2`) where it has one, else its
    /// block node (`/dev/sdc`), or the NVMe namespace. Through the sg node a command stuck on a
    /// hung path does not hold the agent's exit (discover::PathInfo::generic): a stopped agent
    /// exits at once, not when the kernel gives the command up (open-iscsi: 120 s).
    pub dev: PathBuf,
    /// Kernel name (`sdc`), used in logs, metrics and the watch state.
    pub name: String,
    /// The SCSI device state is `running`.
    pub live: bool,
    /// The iSCSI session carrying the path (`session3`): a new session is a new I_T nexus.
    pub session: Option<String>,
    /// SCSI registers each path (I_T nexus); NVMe registers the host once for all its paths.
    pub protocol: Protocol,
    /// Who this node is to the target on this path (its iSCSI initiator name, its NVMe host
    /// id), where known: READ FULL STATUS names registrants so.
    pub initiator: Option<OwnInitiator>,
}

/// One LU: its identifier (the same on every node) and this node's paths to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuSpec {
    pub id: LuId,
    pub paths: Vec<PathSpec>,
}

/// One configured device's LU and paths, from its discovery. One device is one LU: a multipath
/// map over different LUs is refused by discovery.
fn lu_spec(
    found: Result<Vec<Lu>, DiscoverError>,
    host: &dyn Host,
) -> Result<LuSpec, DiscoverError> {
    let lu = found?
        .into_iter()
        .next()
        .ok_or(DiscoverError::NothingToFence)?;
    Ok(LuSpec {
        id: lu.id,
        paths: lu
            .paths
            .into_iter()
            .map(|p| {
                let initiator = OwnInitiator::of_path(&p, || host.path_sysfs(&p).nvme_host_id);
                PathSpec {
                    live: p.is_live(),
                    dev: p.generic.unwrap_or(p.dev),
                    name: p.name,
                    session: p.transport.map(|t| t.session),
                    protocol: p.protocol,
                    initiator,
                }
            })
            .collect(),
    })
}

/// One path with its (lazily opened) device and whether a command is outstanding on it.
#[derive(Clone)]
pub struct PathHandle {
    /// Shared, not copied: every check hands each LU's first path to a reader thread.
    pub spec: Arc<PathSpec>,
    device: Arc<Mutex<Option<Arc<dyn PrTransport>>>>,
    busy: Arc<AtomicBool>,
    /// The device was dropped after a failure ([`PathHandle::forget`]) since the last fresh
    /// discovery of its LU: the node may now be another device, so the LU is discovered
    /// afresh before it is opened again.
    forgotten: Arc<AtomicBool>,
}

impl std::fmt::Debug for PathHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PathHandle")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl PathHandle {
    pub(super) fn new(spec: PathSpec) -> PathHandle {
        PathHandle {
            spec: Arc::new(spec),
            device: Arc::new(Mutex::new(None)),
            busy: Arc::new(AtomicBool::new(false)),
            forgotten: Arc::new(AtomicBool::new(false)),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<dyn PrTransport>>> {
        self.device
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn transport(
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
        self.forgotten.store(true, Ordering::SeqCst);
    }

    /// Whether the device was dropped since this was last asked; clears the mark.
    fn take_forgotten(&self) -> bool {
        self.forgotten.swap(false, Ordering::SeqCst)
    }

    /// A command or open on this path has not returned from the kernel yet (it holds one
    /// blocking thread; the path gets nothing else until it returns).
    pub fn is_blocked(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    /// Marks the path busy; `None` if it already was.
    pub(super) fn claim(&self) -> Option<BusyPath> {
        (!self.busy.swap(true, Ordering::SeqCst)).then(|| BusyPath(Arc::clone(&self.busy)))
    }
}

/// A busy mark (a path's, discovery's), cleared when the blocking call that holds it returns.
pub(super) struct BusyPath(Arc<AtomicBool>);

impl Drop for BusyPath {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// One configured LU as currently discovered.
#[derive(Debug)]
pub struct LuEntry {
    /// The configured name (logs, metrics, the watch state).
    pub name: String,
    /// The configured device.
    pub device: PathBuf,
    /// One of the coordinators (`DeviceSettings::coordinator`).
    pub coordinator: bool,
    /// The LU identifier from the first successful discovery.
    pub id: Option<LuId>,
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

    /// Whether `shown` is what [`LuEntry::shown_paths`] would make now, found without
    /// allocating (it is asked after every check of every LU, issue 48).
    pub fn shows_paths(&self, shown: &[PathStatus]) -> bool {
        shown.len() == self.paths.len()
            && shown.iter().zip(&self.paths).all(|(s, p)| {
                s.name == p.spec.name
                    && Path::new(&s.dev) == p.spec.dev
                    && s.live == p.spec.live
                    && s.session == p.spec.session
                    && s.blocked == p.is_blocked()
            })
    }

    /// The paths as the status shows them.
    pub fn shown_paths(&self) -> Vec<PathStatus> {
        self.paths
            .iter()
            .map(|p| PathStatus {
                name: p.spec.name.clone(),
                dev: p.spec.dev.display().to_string(),
                live: p.spec.live,
                session: p.spec.session.clone(),
                blocked: p.is_blocked(),
            })
            .collect()
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
    /// The LUs' devices as last given to discovery (made again when the LUs change).
    devices: Arc<[PathBuf]>,
    /// A discovery that did not return within its check's budget: its answers are taken in
    /// once it has returned, before the next discovery starts, since that one's
    /// [`Repeated::Again`] refers to them. (Asking for every LU afresh instead never caught up
    /// at 1024 LUs × 4 paths: each full discovery outran the budget again.)
    late: Option<tokio::task::JoinHandle<Vec<Found>>>,
    /// A late discovery's answers were lost (its worker panicked): the next asks afresh.
    missed: bool,
}

/// One LU's answer from a discovery: `None` when the previous one stands.
type Found = Option<Result<LuSpec, String>>;

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
                    coordinator: d.coordinator,
                    id: None,
                    paths: Vec::new(),
                    paths_changed: false,
                    discover_error: None,
                })
                .collect(),
            discovering: Arc::new(AtomicBool::new(false)),
            devices: Arc::from(Vec::new()),
            late: None,
            missed: false,
        }
    }

    /// Re-discovers every LU (sysfs only; on the blocking pool), through
    /// [`Host::resolve_repeated`]: afresh for an LU whose discovery failed last time or one of
    /// whose paths was dropped after a failure. A discovery not done by `until` (sysfs reads can
    /// block behind a device in error recovery) leaves the paths as they were; no second one
    /// starts while it runs.
    pub async fn refresh(&mut self, host: &Arc<dyn Host>, until: tokio::time::Instant) {
        if self.discovering.swap(true, Ordering::SeqCst) {
            tracing::warn!("the previous discovery has not returned yet; keeping the paths");
            return;
        }
        if let Some(late) = self.late.take() {
            match late.await {
                Ok(found) => self.take_in(found),
                Err(_) => self.missed = true,
            }
        }
        let busy = BusyPath(Arc::clone(&self.discovering));
        if self.devices.len() != self.lus.len()
            || self
                .lus
                .iter()
                .zip(self.devices.iter())
                .any(|(l, d)| l.device != *d)
        {
            self.devices = self.lus.iter().map(|l| l.device.clone()).collect();
        }
        let devices = Arc::clone(&self.devices);
        let missed = std::mem::take(&mut self.missed);
        // Cleared before the discovery starts: a path dropped while it runs asks for the next.
        let fresh: Vec<bool> = self
            .lus
            .iter()
            .map(|lu| {
                // Every path's mark is taken (no short cut): each asked for this discovery.
                let forgotten = lu.paths.iter().filter(|p| p.take_forgotten()).count() > 0;
                forgotten || missed || lu.discover_error.is_some() || lu.id.is_none()
            })
            .collect();
        // Half of the descriptors to spare (the other half is for paths that appear meanwhile)
        // keeps the paths' state files open between checks; none while an LU's paths are not
        // known yet (the first discovery, an LU out of reach), whose paths the spare must hold.
        let paths = self.size().1;
        let hold = if self.lus.iter().any(|lu| lu.id.is_none()) {
            0
        } else {
            crate::descriptors::to_spare(paths) / 2
        };
        let host = Arc::clone(host);
        let mut job = tokio::task::spawn_blocking(move || {
            let _busy = busy;
            host.resolve_repeated(&devices, &fresh, hold)
                .into_iter()
                .map(|answer| match answer {
                    Repeated::Again => None,
                    Repeated::Found(found) => {
                        Some(lu_spec(found, &*host).map_err(|e| e.to_string()))
                    }
                })
                .collect::<Vec<_>>()
        });
        let found = match tokio::time::timeout_at(until, &mut job).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                self.missed = true;
                vec![Some(Err(format!("discovery worker failed: {e}"))); self.lus.len()]
            }
            Err(_) => {
                self.late = Some(job);
                tracing::warn!(
                    "discovery did not return within the check's budget; keeping the paths"
                );
                return;
            }
        };
        self.take_in(found);
    }

    fn take_in(&mut self, found: Vec<Found>) {
        for (lu, result) in self.lus.iter_mut().zip(found) {
            match result {
                Some(result) => lu.apply(result),
                // The answer taken in last time stands: the same LU and paths.
                None => lu.paths_changed = false,
            }
        }
    }

    /// The LUs, and their paths as last discovered (each path holds a descriptor once opened).
    pub fn size(&self) -> (usize, usize) {
        (
            self.lus.len(),
            self.lus.iter().map(|lu| lu.paths.len()).sum(),
        )
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
    /// (One pass with a map: the agent asks at every check, and comparing every pair of 1024
    /// LUs was half a million comparisons.)
    pub fn duplicate(&self) -> Option<(String, String, LuId)> {
        let mut seen: std::collections::HashMap<&LuId, &str> =
            std::collections::HashMap::with_capacity(self.lus.len());
        for lu in &self.lus {
            let Some(id) = &lu.id else { continue };
            if let Some(first) = seen.insert(id, &lu.name) {
                return Some((first.to_owned(), lu.name.clone(), id.clone()));
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
        // The usual check: the same LU and paths as before, kept as they are.
        if self.id.as_ref() == Some(&spec.id)
            && self.paths.len() == spec.paths.len()
            && self
                .paths
                .iter()
                .zip(&spec.paths)
                .all(|(h, p)| *h.spec == *p)
        {
            self.paths_changed = false;
            return;
        }
        self.id = Some(spec.id);
        let before: Vec<Arc<PathSpec>> = self.paths.iter().map(|p| Arc::clone(&p.spec)).collect();
        let mut paths = Vec::with_capacity(spec.paths.len());
        for path in spec.paths {
            // Same device node and session: the same nexus, keep its open device.
            let kept = self
                .paths
                .iter()
                .find(|h| h.spec.dev == path.dev && h.spec.session == path.session);
            paths.push(match kept {
                Some(handle) => PathHandle {
                    spec: Arc::new(path),
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
                .map(|p| Arc::clone(&p.spec))
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

    #[test]
    fn two_devices_of_one_lu_are_named() {
        let mut table = LuTable::new(&[]);
        for (name, id) in [
            ("a", Some("naa.1")),
            ("b", None),
            ("c", Some("naa.2")),
            ("d", Some("naa.1")),
        ] {
            table.lus.push(LuEntry {
                name: name.to_string(),
                device: PathBuf::from(format!("/dev/{name}")),
                coordinator: false,
                id: id.map(LuId::from),
                paths: Vec::new(),
                paths_changed: false,
                discover_error: None,
            });
        }
        assert_eq!(
            table.duplicate(),
            Some(("a".to_string(), "d".to_string(), LuId::from("naa.1")))
        );
        table.lus.pop();
        assert_eq!(table.duplicate(), None);
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
                initiator: None,
            })
        };
        let lu = |paths| LuEntry {
            name: "data".to_string(),
            device: PathBuf::from("/dev/x"),
            coordinator: false,
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

    /// The status shows an LU's paths as they are: compared after every check, rebuilt when
    /// anything shown differs.
    #[test]
    fn shown_paths_are_told_apart_from_changed_ones() {
        let path = |name: &str| {
            PathHandle::new(PathSpec {
                dev: PathBuf::from(format!("/dev/{name}")),
                name: name.to_string(),
                live: true,
                session: Some("session1".to_owned()),
                protocol: Protocol::Scsi,
                initiator: None,
            })
        };
        let mut lu = LuEntry {
            name: "data".to_string(),
            device: PathBuf::from("/dev/x"),
            coordinator: false,
            id: None,
            paths: vec![path("sdb"), path("sdc")],
            paths_changed: false,
            discover_error: None,
        };
        let shown = lu.shown_paths();
        assert!(lu.shows_paths(&shown));
        Arc::make_mut(&mut lu.paths[1].spec).live = false;
        assert!(!lu.shows_paths(&shown), "a path went offline");
        Arc::make_mut(&mut lu.paths[1].spec).live = true;
        Arc::make_mut(&mut lu.paths[0].spec).session = Some("session2".to_owned());
        assert!(!lu.shows_paths(&shown), "a new session");
        Arc::make_mut(&mut lu.paths[0].spec).session = Some("session1".to_owned());
        Arc::make_mut(&mut lu.paths[0].spec).dev = PathBuf::from("/dev/sg3");
        assert!(!lu.shows_paths(&shown), "another node");
        Arc::make_mut(&mut lu.paths[0].spec).dev = PathBuf::from("/dev/sdb");
        assert!(lu.shows_paths(&shown));
        let busy = lu.paths[1].claim();
        assert!(!lu.shows_paths(&shown), "a command not returned yet");
        drop(busy);
        assert!(lu.shows_paths(&shown));
        lu.paths.pop();
        assert!(!lu.shows_paths(&shown), "a path gone");
    }
}
