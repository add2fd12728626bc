//! The node as every front end sees it: find devices (and what sysfs says about a path), open
//! paths, ask corosync, run a bounded helper, its host name, sleep, reboot. The admin CLI,
//! fence_pr and the agent take a [`Host`] instead of calling sysfs, SG_IO, the NVMe ioctls,
//! `corosync-cmapctl` or `reboot(2)` themselves, so their tests run the real front-end logic on
//! the SPC model; a node uses [`SystemHost`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::discover::{
    DiscoverError, Discovery, Lu, PathInfo, PathSysfs, Repeated, Resolution, protocol_of,
};
use crate::exec::{NvmePr, ScsiPr};
use crate::keys::{self, KeyError};
use crate::process::{self, RunError};
use crate::transport::Protocol;
use crate::transport::{CommandError, Policy, PrTransport};

/// What a front end needs of the node it runs on.
pub trait Host: Send + Sync + 'static {
    /// Strict discovery of `devices` ([`Discovery::resolve`]): any device that cannot be
    /// resolved fails the whole call.
    fn resolve(&self, devices: &[PathBuf]) -> Result<Vec<Lu>, DiscoverError>;
    /// Lenient discovery of `devices` ([`Discovery::resolve_each`]).
    fn resolve_each(&self, devices: &[PathBuf]) -> Result<Resolution, DiscoverError>;
    /// [`Host::resolve`] of each device on its own, for a caller that asks again every few
    /// seconds (the agent's checks). The system's host says a device's previous answer stands
    /// ([`Repeated::Again`]) while sysfs shows nothing it rests on changed
    /// ([`Discovery::resolve_repeated`]); this default discovers afresh every time.
    /// `fresh[i]`: discover device `i` afresh (a caller that did not take in the previous
    /// answers asks for every device afresh). `hold`: how many descriptors the answers may keep
    /// open between calls.
    fn resolve_repeated(&self, devices: &[PathBuf], fresh: &[bool], hold: usize) -> Vec<Repeated> {
        let _ = (fresh, hold);
        devices
            .iter()
            .map(|device| Repeated::Found(self.resolve(std::slice::from_ref(device))))
            .collect()
    }
    /// LVM autodiscovery with `vgs`, lenient ([`Discovery::resolve_lvm_each`]).
    fn resolve_lvm_each(
        &self,
        vgs: &Path,
        timeout: Option<Duration>,
    ) -> Result<Resolution, DiscoverError>;
    /// What sysfs says about one path beyond discovery ([`Discovery::path_sysfs`]), for doctor;
    /// nothing on a host without sysfs (the default).
    fn path_sysfs(&self, path: &PathInfo) -> PathSysfs {
        let _ = path;
        PathSysfs::default()
    }
    /// Opens one path for PR commands. May block (it is called on a worker, inside the
    /// caller's deadline).
    fn open(&self, dev: &Path, policy: Policy) -> Result<Arc<dyn PrTransport>, CommandError>;
    /// The output of `<cmapctl> <args…>` ([`keys::query_cmapctl`]).
    fn cmapctl(
        &self,
        cmapctl: &Path,
        args: &[&str],
        timeout: Option<Duration>,
    ) -> Result<String, KeyError>;
    /// Runs a helper bounded by `timeout` ([`process::run_bounded`]); its stdout.
    fn run_bounded(
        &self,
        program: &Path,
        args: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, RunError>;
    /// This node's name as the kernel has it (`/proc/sys/kernel/hostname`, trimmed).
    fn hostname(&self) -> std::io::Result<String> {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned())
    }
    /// Blocks the calling thread for `duration`.
    fn sleep(&self, duration: Duration);
    /// Reboots at once, without syncing (a fenced node's dirty pages must not reach the LU);
    /// returns only if that failed.
    fn reboot_now(&self) -> std::io::Error;
}

/// The real node: sysfs discovery under `/sys` and `/dev`, SG_IO (SCSI) or the block PR ioctls
/// and NVMe passthrough (NVMe) through a read-only open (no udev change event on close), the
/// helpers as processes, `reboot(2)` with `RB_AUTOBOOT` (needs CAP_SYS_BOOT).
#[derive(Debug, Clone)]
pub struct SystemHost {
    discovery: Discovery,
}

impl SystemHost {
    /// This system's `/sys` and `/dev`.
    pub fn new() -> SystemHost {
        SystemHost {
            discovery: Discovery::system(),
        }
    }
}

impl Default for SystemHost {
    fn default() -> SystemHost {
        SystemHost::new()
    }
}

impl Host for SystemHost {
    fn path_sysfs(&self, path: &PathInfo) -> PathSysfs {
        self.discovery.path_sysfs(path)
    }
    fn resolve(&self, devices: &[PathBuf]) -> Result<Vec<Lu>, DiscoverError> {
        self.discovery.resolve(devices)
    }

    fn resolve_repeated(&self, devices: &[PathBuf], fresh: &[bool], hold: usize) -> Vec<Repeated> {
        self.discovery.resolve_repeated(devices, fresh, hold)
    }

    fn resolve_each(&self, devices: &[PathBuf]) -> Result<Resolution, DiscoverError> {
        self.discovery.resolve_each(devices)
    }

    fn resolve_lvm_each(
        &self,
        vgs: &Path,
        timeout: Option<Duration>,
    ) -> Result<Resolution, DiscoverError> {
        self.discovery.resolve_lvm_each(vgs, timeout)
    }

    /// An NVMe namespace gets [`NvmePr`], everything else [`ScsiPr`] ([`protocol_of`]).
    fn open(&self, dev: &Path, policy: Policy) -> Result<Arc<dyn PrTransport>, CommandError> {
        Ok(match protocol_of(dev) {
            Protocol::Nvme => Arc::new(NvmePr::open(dev, policy)?),
            Protocol::Scsi => Arc::new(ScsiPr::open(dev, policy)?),
        })
    }

    fn cmapctl(
        &self,
        cmapctl: &Path,
        args: &[&str],
        timeout: Option<Duration>,
    ) -> Result<String, KeyError> {
        keys::query_cmapctl(cmapctl, args, timeout)
    }

    fn run_bounded(
        &self,
        program: &Path,
        args: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>, RunError> {
        process::run_bounded(program, args, timeout)
    }

    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    fn reboot_now(&self) -> std::io::Error {
        match nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_AUTOBOOT) {
            Ok(never) => match never {},
            Err(errno) => std::io::Error::from(errno),
        }
    }
}
