//! One [`Host`] double for every front end's tests: a node whose storage is model devices.
//! Discovery answers from the paths attached to it (as sysfs would after a login), an open
//! reaches the path's model device through the real SCSI transport, corosync answers from the
//! replies given to it (or there is none), sleeps and reboots are recorded instead of done, and
//! helpers run for real.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::discover::{DeviceError, DiscoverError, Lu, LuId, PathInfo, Resolution, Unidentified};
use crate::exec::ScsiPr;
use crate::host::Host;
use crate::keys::KeyError;
use crate::process::RunError;
use crate::spc_model::ModelDevice;
use crate::transport::{Command, CommandError, ErrorKind, Policy, PrTransport};

/// One path of the node: the LU it reaches, what discovery says of it, the device behind it.
#[derive(Clone)]
struct Attached {
    lu: LuId,
    info: PathInfo,
    /// None once unplugged: discovery still lists the path, its open fails.
    device: Option<ModelDevice>,
}

/// A node over model devices (see the module docs). Shared: tests change its storage while a
/// front end runs on it, as sysfs changes under a running agent.
#[derive(Default)]
pub struct ModelHost {
    paths: Mutex<Vec<Attached>>,
    corosync: Mutex<HashMap<String, String>>,
    /// Corosync queries that must be under way at once before any is answered (0: none).
    corosync_meeting: AtomicUsize,
    /// Corosync queries begun, and its signal.
    corosync_begun: (Mutex<usize>, Condvar),
    /// Every corosync-cmapctl run's arguments, in the order they began.
    corosync_runs: Mutex<Vec<Vec<String>>>,
    /// corosync-cmapctl fails when given more than one argument (a wrapper that takes one).
    corosync_one_argument: AtomicBool,
    hostname: Option<String>,
    not_ready_backoff: Option<Duration>,
    slept: Mutex<Vec<Duration>>,
    reboots: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ModelHost {
    /// A node with no storage, no corosync and no host name.
    pub fn new() -> Self {
        ModelHost::default()
    }

    /// The node's host name.
    pub fn with_hostname(mut self, name: &str) -> Self {
        self.hostname = Some(name.to_owned());
        self
    }

    /// Opens with this NOT READY backoff instead of the caller's (tests that inject NOT READY
    /// need not wait out the real one).
    pub fn with_not_ready_backoff(mut self, backoff: Duration) -> Self {
        self.not_ready_backoff = Some(backoff);
        self
    }

    /// corosync-cmapctl's answer to `arg` (`totem.cluster_name`, `nodelist`); an empty answer
    /// is an answer. Without one, the query fails as on a node without corosync.
    pub fn set_corosync(&self, arg: &str, answer: &str) {
        lock(&self.corosync).insert(arg.to_owned(), answer.to_owned());
    }

    /// From now on corosync-cmapctl fails when given more than one argument, as a wrapper
    /// written for one query at a time may.
    pub fn corosync_takes_one_argument(&self) {
        self.corosync_one_argument.store(true, Ordering::SeqCst);
    }

    /// The arguments of every corosync-cmapctl run so far, in the order they began.
    pub fn corosync_runs(&self) -> Vec<Vec<String>> {
        lock(&self.corosync_runs).clone()
    }

    /// From now on each corosync query waits until `n` have begun, and fails, saying so, when
    /// they do not within 5 s: a test that queries run side by side.
    pub fn corosync_queries_meet(&self, n: usize) {
        self.corosync_meeting.store(n, Ordering::SeqCst);
    }

    /// Adds path `info` to LU `lu`, opened as `device`; a path with the same node (`info.dev`)
    /// is replaced (a re-login), and the LU's paths keep their order otherwise.
    pub fn attach(&self, lu: LuId, info: PathInfo, device: ModelDevice) {
        let mut paths = lock(&self.paths);
        let new = Attached {
            lu,
            info,
            device: Some(device),
        };
        match paths.iter_mut().find(|p| p.info.dev == new.info.dev) {
            Some(old) => *old = new,
            None => paths.push(new),
        }
    }

    /// Removes the path whose node is `dev` (the device vanished).
    pub fn detach(&self, dev: &Path) {
        lock(&self.paths).retain(|p| p.info.dev != dev);
    }

    /// Makes the open of `dev` fail while discovery still lists it (a node that cannot be
    /// opened: EMFILE, EPERM, a device node gone before sysfs noticed).
    pub fn unplug(&self, dev: &Path) {
        for path in lock(&self.paths).iter_mut().filter(|p| p.info.dev == dev) {
            path.device = None;
        }
    }

    /// The model device behind `dev`, if it is attached and plugged.
    pub fn device(&self, dev: &Path) -> Option<ModelDevice> {
        lock(&self.paths)
            .iter()
            .find(|p| p.info.dev == dev)
            .and_then(|p| p.device.clone())
    }

    /// Every sleep asked of the node, in order.
    pub fn slept(&self) -> Vec<Duration> {
        lock(&self.slept).clone()
    }

    /// How many reboots the node was asked for.
    pub fn reboots(&self) -> usize {
        self.reboots.load(Ordering::SeqCst)
    }

    /// The LUs of the paths that `device` names (as given, or the path's own node), by LU in
    /// the order first attached.
    fn lus_of(&self, device: &Path) -> Vec<Lu> {
        let mut lus: Vec<Lu> = Vec::new();
        for path in lock(&self.paths)
            .iter()
            .filter(|p| p.info.given == device || p.info.dev == device)
        {
            match lus.iter_mut().find(|lu| lu.id == path.lu) {
                Some(lu) => lu.paths.push(path.info.clone()),
                None => lus.push(Lu {
                    id: path.lu.clone(),
                    paths: vec![path.info.clone()],
                }),
            }
        }
        lus
    }
}

impl Host for ModelHost {
    /// Each device must name a path (else [`DiscoverError::NothingToFence`]); one LU per device.
    fn resolve(&self, devices: &[PathBuf]) -> Result<Vec<Lu>, DiscoverError> {
        devices
            .iter()
            .map(|device| {
                self.lus_of(device)
                    .into_iter()
                    .next()
                    .ok_or(DiscoverError::NothingToFence)
            })
            .collect()
    }

    /// A device that names no path is unidentified (not found); the LUs are merged and sorted.
    fn resolve_each(&self, devices: &[PathBuf]) -> Result<Resolution, DiscoverError> {
        let mut lus: Vec<Lu> = Vec::new();
        let mut unidentified = Vec::new();
        for device in devices {
            let found = self.lus_of(device);
            if found.is_empty() {
                unidentified.push(Unidentified {
                    device: device.clone(),
                    error: DeviceError::NotFound {
                        device: device.clone(),
                        source: std::io::Error::from(std::io::ErrorKind::NotFound),
                    },
                });
            }
            for lu in found {
                match lus.iter_mut().find(|l| l.id == lu.id) {
                    Some(known) => {
                        for path in lu.paths {
                            if known.paths.iter().all(|k| k.dev != path.dev) {
                                known.paths.push(path);
                            }
                        }
                    }
                    None => lus.push(lu),
                }
            }
        }
        lus.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Resolution { lus, unidentified })
    }

    /// No volume groups on a model node.
    fn resolve_lvm_each(
        &self,
        _vgs: &Path,
        _timeout: Option<Duration>,
    ) -> Result<Resolution, DiscoverError> {
        Err(DiscoverError::NothingToFence)
    }

    /// A detached (or never attached) node fails to open as a vanished device does.
    fn open(&self, dev: &Path, policy: Policy) -> Result<Arc<dyn PrTransport>, CommandError> {
        let attached = lock(&self.paths).iter().any(|p| p.info.dev == dev);
        let device = self.device(dev).ok_or_else(|| {
            CommandError::without_completion(
                dev,
                Command::Open,
                ErrorKind::Open,
                if attached {
                    "no such model device (unplugged)"
                } else {
                    "No such file or directory (os error 2)"
                },
            )
        })?;
        let policy = Policy {
            not_ready_backoff: self.not_ready_backoff.unwrap_or(policy.not_ready_backoff),
            ..policy
        };
        Ok(Arc::new(ScsiPr::new(device, policy)))
    }

    /// As corosync-cmapctl does: each argument's answer in turn.
    fn cmapctl(
        &self,
        cmapctl: &Path,
        args: &[&str],
        _timeout: Option<Duration>,
    ) -> Result<String, KeyError> {
        let fail = |reason: String| KeyError::Cmapctl {
            command: crate::keys::cmapctl_command(cmapctl, args),
            reason,
            timed_out: false,
        };
        lock(&self.corosync_runs).push(args.iter().map(|a| (*a).to_owned()).collect());
        if args.len() > 1 && self.corosync_one_argument.load(Ordering::SeqCst) {
            return Err(fail("exited with status 1: one query at a time".to_owned()));
        }
        let meeting = self.corosync_meeting.load(Ordering::SeqCst);
        if meeting > 0 {
            let (begun, signal) = &self.corosync_begun;
            let mut count = lock(begun);
            *count += 1;
            signal.notify_all();
            let (count, wait) = signal
                .wait_timeout_while(count, Duration::from_secs(5), |c| *c < meeting)
                .unwrap_or_else(PoisonError::into_inner);
            if wait.timed_out() {
                return Err(fail(format!(
                    "{count} of {meeting} queries began within 5 s"
                )));
            }
        }
        let answers = lock(&self.corosync);
        args.iter()
            .map(|arg| answers.get(*arg).map(String::as_str))
            .collect::<Option<String>>()
            .ok_or_else(|| fail("no corosync on the model host".to_owned()))
    }

    fn run_bounded(
        &self,
        program: &Path,
        args: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, RunError> {
        crate::process::run_bounded(program, args, timeout)
    }

    fn hostname(&self) -> std::io::Result<String> {
        self.hostname
            .clone()
            .ok_or_else(|| std::io::Error::other("the model host has no name"))
    }

    fn sleep(&self, duration: Duration) {
        lock(&self.slept).push(duration);
    }

    fn reboot_now(&self) -> std::io::Error {
        self.reboots.fetch_add(1, Ordering::SeqCst);
        std::io::Error::other("the model host does not reboot")
    }
}
