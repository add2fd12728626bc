//! Discovery: from the device names an admin gives to the logical units (LUs) to fence and the
//! paths that reach each one: SCSI I_T nexuses, or NVMe namespaces. Reads sysfs (and runs `vgs`
//! for LVM autodiscovery); sends no PR command.
//!
//! Accepted names: `/dev/sdX`, `/dev/sgN`, a dm-multipath map (`/dev/dm-N`, `/dev/mapper/NAME`)
//! which expands to its SCSI paths (`/sys/block/dm-N/slaves/*`), and any symlink to one of them
//! (`/dev/disk/by-id/…`). Refused with an error that says what to give instead: partitions
//! (`/dev/sdb1`: a reservation belongs to the whole LU, and fencing "a partition" would fence
//! every partition of that disk, which an admin should say explicitly — fence_scsi is documented
//! with whole devices too), device-mapper devices that are not multipath maps (LVM, crypt), and
//! disks that are neither SCSI nor NVMe (virtio-blk).
//!
//! NVMe: a namespace block device `/dev/nvmeXnY` (or a by-id link to it) is one path
//! ([`Protocol::Nvme`]). With native NVMe multipath that node is the multipath head and the
//! kernel picks the controller, so it is the only path prfence sees; the hidden per-controller
//! devices (`nvmeXcYnZ`) are refused with the head's name. Its identity is the namespace's
//! `wwid` attribute (`uuid.…`, `eui.…`, `nvme.…`: built by the kernel from the namespace's
//! identifiers, the same on every host), else its `uuid`, `nguid` or `eui` attribute in the
//! kernel's order; its state is the controller's (`device/state`: `live`, `connecting`,
//! `resetting`, `deleting`, `dead`), or for a multipath head the best of its paths'
//! controllers (`multipath/*/device/state`). Only LVM autodiscovery ([`Discovery::resolve_pvs`]) maps a
//! PV on a partition to its whole disk, because PVs on partitions are common and the admin did
//! not name them.
//!
//! Identity: an LU is identified by its designator as Linux exposes it in
//! `/sys/block/sdX/device/wwid` (e.g. `naa.6001405…` on LIO), falling back to decoding the cached
//! VPD page 83h ([`vpd`]). The designator comes from the target, so every node computes the same
//! [`LuId`] for the same LU whatever its local names are. Paths with the same id are grouped into
//! one [`Lu`], whether they came from a multipath map or were given as separate `/dev/sdX` (two
//! iSCSI sessions of one node without dm-multipath). The engine is always given ONE node's
//! devices; in the lab both "nodes" live in one guest, so node A's `/dev/sdb` and node B's
//! `/dev/sdc` are the same LU with the same id — grouping them would be wrong only if both nodes'
//! devices were mixed in one call, which nothing does.
//!
//! Order: [`Discovery::resolve`] returns LUs sorted by the byte order of the id string. Every
//! node therefore sees the same order, and the first LU is the arbiter (issue #4).
//!
//! Path state comes from `/sys/block/sdX/device/state`; a path that is not `running` is still
//! returned (with its state) so the engine can report it and use another path of the same LU.
//!
//! All sysfs and /dev access goes through [`Discovery`]'s two roots, so tests run on fake trees.

mod facts;
pub mod lvm;
mod repeat;
mod vpd;

#[cfg(test)]
mod tests;

pub use facts::PathSysfs;
pub use repeat::Repeated;

use crate::transport::Protocol;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// A logical unit's identifier. A designator (VPD page 83h, as Linux formats it: `naa.…`,
/// `eui.…`, `t10.…`, `uuid.…`, or a SCSI name string) names the LU alike on every node; when none
/// could be read, the device's absolute path names it, but only on this node: another node may
/// call the same LU something else, so such an LU can never be the arbiter (P2).
///
/// Ordered designators first, each kind by its text: the arbiter is the first LU, so one
/// unidentifiable device never becomes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LuId {
    /// The LU's designator, the same on every node.
    Designator(Box<str>),
    /// An absolute device path, standing in for a designator that could not be read.
    NodeLocal(Box<str>),
}

impl LuId {
    /// The identifier text: the designator, or the device path.
    pub fn as_str(&self) -> &str {
        match self {
            LuId::Designator(text) | LuId::NodeLocal(text) => text,
        }
    }

    /// Whether this names the LU only on this node (a device path, not a designator).
    pub fn is_node_local(&self) -> bool {
        matches!(self, LuId::NodeLocal(_))
    }

    /// The node-local identifier of `device`: its absolute path (relative to `/` if the
    /// working directory cannot be read).
    pub fn node_local(device: &Path) -> Self {
        let path = std::path::absolute(device).unwrap_or_else(|_| Path::new("/").join(device));
        LuId::NodeLocal(path.display().to_string().into())
    }

    /// The identifier in a sysfs `wwid` file's text (`naa.6001405…`): trailing newline, NULs
    /// and blanks dropped; `None` if nothing is left.
    pub fn from_wwid(text: &str) -> Option<Self> {
        let id = text.trim_end_matches(['\n', '\0', ' ']);
        (!id.is_empty()).then(|| LuId::Designator(id.into()))
    }

    /// The LU designator of a VPD page 83h image (as in sysfs `vpd_pg83`), formatted like the
    /// kernel's `wwid`. What discovery uses when `wwid` is missing.
    pub fn from_vpd_pg83(page: &[u8]) -> Option<Self> {
        vpd::lu_designator(page).map(|id| LuId::Designator(id.into()))
    }
}

/// An identifier as prfence prints it: text beginning with `/` is a device path (no designator
/// format begins so), anything else a designator.
impl From<String> for LuId {
    fn from(text: String) -> Self {
        if text.starts_with('/') {
            LuId::NodeLocal(text.into())
        } else {
            LuId::Designator(text.into())
        }
    }
}

impl From<&str> for LuId {
    fn from(text: &str) -> Self {
        LuId::from(text.to_owned())
    }
}

impl PartialEq<str> for LuId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<String> for LuId {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for LuId {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for LuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reports show the identifier's text.
impl serde::Serialize for LuId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// One logical unit and the paths to it (SCSI I_T nexuses, or NVMe namespace devices) that this
/// node was given (or that its multipath map has). Registration goes to every path; reserve and
/// preempt to one live path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lu {
    pub id: LuId,
    /// In the order the devices were given (a map's paths in slave-name order); never empty.
    pub paths: Vec<PathInfo>,
}

/// One path (I_T_L nexus) to an LU, or one NVMe namespace device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// The node to open: `/dev/sdX`, `/dev/sgN` or `/dev/nvmeXnY` (under the /dev root).
    pub dev: PathBuf,
    /// The argument this path came from (`/dev/mapper/mpatha`, `/dev/disk/by-id/…`, or `dev`).
    pub given: PathBuf,
    /// Kernel name of `dev` (`sdb`, `sg2`, `nvme0n1`).
    pub name: String,
    /// How the path is spoken to.
    pub protocol: Protocol,
    /// SCSI: the address host:channel:target:lun (`2:0:0:0`). NVMe: the controller (or, for a
    /// multipath head, the subsystem) and the namespace id (`nvme1:ns1`, `nvme-subsys0:ns1`).
    pub hctl: String,
    pub state: PathState,
    /// The iSCSI session carrying this path, if it is an iSCSI path.
    pub transport: Option<IscsiSession>,
    /// SCSI: the path's SCSI generic node (`/dev/sgN`), when the sg driver has one (`dev`
    /// itself when `dev` is one). SG_IO through it waits interruptibly, so a process can exit
    /// while a command is stuck on a hung path (the kernel orphans the command); through the
    /// block node the wait is uninterruptible and holds the process until the kernel gives up.
    pub generic: Option<PathBuf>,
}

/// The protocol of a device node, from its kernel name (`/dev/nvme0n1` and links to it are NVMe
/// namespaces; everything else discovery accepts is SCSI). The one place the transport is chosen
/// from ([`crate::host::SystemHost`]).
pub fn protocol_of(dev: &Path) -> Protocol {
    let real = std::fs::canonicalize(dev).unwrap_or_else(|_| dev.to_path_buf());
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match parse_nvme_name(&name) {
        Some(NvmeName::Namespace) => Protocol::Nvme,
        _ => Protocol::Scsi,
    }
}

/// What an `nvme…` kernel block name is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NvmeName {
    /// `nvme<subsys or ctrl>n<ns>`: a namespace (or a multipath head).
    Namespace,
    /// `nvme<subsys>c<ctrl>n<ns>`: a hidden per-controller path of a multipath head; the head's
    /// name is `nvme<subsys>n<ns>`.
    HiddenPath { head: String },
}

/// Parses `nvme0n1` / `nvme0c1n1`; `None` for anything else (partitions `nvme0n1p1` included,
/// which sysfs marks as partitions anyway).
fn parse_nvme_name(name: &str) -> Option<NvmeName> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let rest = name.strip_prefix("nvme")?;
    let (before_n, ns) = rest.rsplit_once('n')?;
    if !digits(ns) {
        return None;
    }
    match before_n.split_once('c') {
        None if digits(before_n) => Some(NvmeName::Namespace),
        Some((subsys, ctrl)) if digits(subsys) && digits(ctrl) => Some(NvmeName::HiddenPath {
            head: format!("nvme{subsys}n{ns}"),
        }),
        _ => None,
    }
}

impl PathInfo {
    /// Whether commands can be sent on this path now.
    pub fn is_live(&self) -> bool {
        self.state == PathState::Running
    }
}

/// `/sys/block/sdX/device/state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathState {
    Running,
    /// Set by error handling or an admin; commands fail at once.
    Offline,
    /// The transport is recovering: commands queue until it recovers or its timeout (iSCSI
    /// `recovery_tmo`, 120 s in the lab) expires — never the path to pick for reserve or preempt.
    Blocked,
    /// The transport gave up (e.g. iSCSI recovery timed out); commands fail at once.
    TransportOffline,
    /// Any other state text (`created`, `quiesce`, `cancel`, `deleted`, …) or why it was unreadable.
    Other(String),
}

impl PathState {
    fn parse(text: &str) -> Self {
        match text.trim() {
            "running" => Self::Running,
            "offline" => Self::Offline,
            "blocked" => Self::Blocked,
            "transport-offline" => Self::TransportOffline,
            other => Self::Other(other.to_owned()),
        }
    }

    /// An NVMe controller's `state` attribute: `live` runs commands; `new`, `connecting` and
    /// `resetting` queue them while the controller (re)connects, like a blocked SCSI device;
    /// `deleting`, `deleting (no IO)` and `dead` fail them.
    fn parse_nvme(text: &str) -> Self {
        match text.trim() {
            "live" => Self::Running,
            "new" | "connecting" | "resetting" => Self::Blocked,
            "deleting" | "deleting (no IO)" | "dead" => Self::TransportOffline,
            other => Self::Other(other.to_owned()),
        }
    }

    /// For a path that stands for several (an NVMe multipath head): the most usable one.
    fn rank(&self) -> u8 {
        match self {
            Self::Running => 0,
            Self::Blocked => 1,
            Self::Other(_) => 2,
            Self::Offline => 3,
            Self::TransportOffline => 4,
        }
    }
}

impl fmt::Display for PathState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Offline => "offline",
            Self::Blocked => "blocked",
            Self::TransportOffline => "transport-offline",
            Self::Other(text) => text,
        })
    }
}

/// `/sys/class/iscsi_session/sessionN` of an iSCSI path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiSession {
    /// `session3`.
    pub session: String,
    /// Target IQN (`targetname`).
    pub target: String,
    /// Initiator IQN of this session (`initiatorname`; differs per iface when ifaces set one).
    pub initiator: String,
    /// open-iscsi iface (`ifacename`), if the kernel shows it.
    pub iface: Option<String>,
    /// Target portal group tag (`tpgt`).
    pub tpgt: Option<u16>,
    /// ISID, if the kernel shows it (`isid`). Linux 6.1 does not: the target identifies the
    /// initiator port by IQN + ISID, which only READ FULL STATUS reveals.
    pub isid: Option<String>,
}

/// One device that could not be resolved, or an inconsistency between devices.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "{}: {source}; give an existing device node (/dev/sdX, /dev/sgN, /dev/dm-N, \
         /dev/mapper/NAME or a /dev/disk/by-id link)",
        device.display()
    )]
    NotFound {
        device: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} ({name}): no {name} under {}/class/block or {}/class/scsi_generic; is it a device node?",
        device.display(), sys.display(), sys.display()
    )]
    NoSysfs {
        device: PathBuf,
        name: String,
        sys: PathBuf,
    },
    #[error(
        "{} is a partition of {}; persistent reservations act on the whole LU: give {}",
        device.display(), parent.display(), parent.display()
    )]
    Partition { device: PathBuf, parent: PathBuf },
    #[error(
        "{} ({name}) is a device-mapper device but not a multipath map (dm uuid {uuid:?}); give \
         the multipath map or the SCSI disks under it",
        device.display()
    )]
    NotMultipath {
        device: PathBuf,
        name: String,
        uuid: String,
    },
    #[error(
        "{} ({name}) is neither a SCSI device nor an NVMe namespace (no {name}/device/scsi_device \
         and no {name}/nsid in sysfs); fencing needs SCSI or NVMe persistent reservations \
         (virtio-blk and other disks are not supported)",
        device.display()
    )]
    NotScsi { device: PathBuf, name: String },
    #[error(
        "{} ({name}) is being removed: its SCSI device has already left sysfs (a session logout \
         or a LUN removal under way); check the sessions (iscsiadm -m session, multipath -ll)",
        device.display()
    )]
    Removing { device: PathBuf, name: String },
    #[error(
        "{} ({name}) is one controller's path of an NVMe multipath namespace; reservations go \
         through the multipath head: give {}",
        device.display(), head.display()
    )]
    NvmePath {
        device: PathBuf,
        name: String,
        head: PathBuf,
    },
    #[error(
        "{} ({name}) is a multipath map without paths (its sysfs slaves directory is empty); \
         check `multipath -ll`",
        device.display()
    )]
    NoPaths { device: PathBuf, name: String },
    #[error(
        "{} ({name}, {hctl}): no LU identifier (SCSI: neither device/wwid nor an LU designator \
         in device/vpd_pg83; NVMe: no wwid, uuid, nguid or eui); the target does not identify \
         the LU, it cannot be fenced by identity",
        device.display()
    )]
    NoIdentity {
        device: PathBuf,
        name: String,
        hctl: String,
    },
    #[error(
        "{} ({name}): multipath map over different LUs ({}); fix the multipath configuration",
        device.display(), ids.join(", ")
    )]
    MixedMap {
        device: PathBuf,
        name: String,
        ids: Vec<String>,
    },
    #[error(
        "LU identifier {id} is reported by two LUs: {} has serial {first_serial:?}, {} has serial \
         {second_serial:?}; the target assigns identifiers badly (LIO builds its NAA from the hex \
         digits of vpd_unit_serial only) — give the LUs serials that differ in hex digits",
        first.display(), second.display()
    )]
    IdCollision {
        id: LuId,
        first: PathBuf,
        first_serial: String,
        second: PathBuf,
        second_serial: String,
    },
    #[error("{} ({name}): reading {}: {source}", device.display(), path.display())]
    Sysfs {
        device: PathBuf,
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl DeviceError {
    /// The device could not be identified because it (or its sysfs entry) is gone or unreadable,
    /// or the target gives no LU designator: nothing an admin configured wrongly. The lenient
    /// resolution ([`Discovery::resolve_each`]) keeps such a device as a node-local LU, which
    /// the engine handles as a dead path (a fence of several LUs sends nothing while one is
    /// present: it could be the arbiter). Every other error (a
    /// partition, a non-multipath dm device, a non-SCSI disk, a broken map, an identifier
    /// collision) needs the admin to change what is given.
    pub fn is_unidentifiable(&self) -> bool {
        matches!(
            self,
            Self::NotFound { .. }
                | Self::NoSysfs { .. }
                | Self::Sysfs { .. }
                | Self::NoPaths { .. }
                | Self::NoIdentity { .. }
                | Self::Removing { .. }
        )
    }
}

/// A device [`Discovery::resolve_each`] could not identify (see
/// [`DeviceError::is_unidentifiable`]).
#[derive(Debug)]
pub struct Unidentified {
    /// The node to try anyway: the device as given, or the path without an identifier.
    pub device: PathBuf,
    pub error: DeviceError,
}

/// The lenient resolution: the LUs identified, and the devices that could not be.
#[derive(Debug, Default)]
pub struct Resolution {
    /// Sorted by [`LuId`], as [`Discovery::resolve`] returns them.
    pub lus: Vec<Lu>,
    pub unidentified: Vec<Unidentified>,
}

/// Discovery failed: every problem found, not just the first.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("{}", join(.0))]
    Devices(Vec<DeviceError>),
    #[error(transparent)]
    Lvm(#[from] lvm::LvmError),
    #[error("no devices given and no clustered or shared LVM volume group found; set `devices`")]
    NothingToFence,
}

fn join(errors: &[DeviceError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `device` (a disk's `device` link) resolves to a SCSI device directory, named by its
/// host:channel:target:lun.
fn is_hctl_dir(device: &Path) -> bool {
    std::fs::canonicalize(device).is_ok_and(|dir| {
        dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            let parts: Vec<&str> = n.split(':').collect();
            parts.len() == 4
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
    })
}

/// Resolves `devices` on this system (`/sys`, `/dev`); see [`Discovery::resolve`].
pub fn resolve(devices: &[PathBuf]) -> Result<Vec<Lu>, DiscoverError> {
    Discovery::system().resolve(devices)
}

/// Discovery over a sysfs root and a /dev root (`/sys` and `/dev` on a real system). Clones
/// share what was learned of iSCSI sessions ([`Discovery::iscsi_session`]) and the answers
/// [`Discovery::resolve_repeated`] may give again.
#[derive(Debug, Clone)]
pub struct Discovery {
    sys: PathBuf,
    dev: PathBuf,
    /// iSCSI sessions already read, by name. The kernel numbers sessions from a counter it never
    /// winds back (`sessionN`, N = ++iscsi_session_nr), and a session's parameters are set at
    /// its login, before its LUs appear: a name seen complete stands for the same session for
    /// good. Before [`Discovery::resolve_repeated`] the agent re-discovered every LU at every
    /// check, and these five attributes were about a third of its system calls.
    sessions: Arc<Mutex<HashMap<String, IscsiSession>>>,
    /// `/dev/mapper` resolved, once it exists (device-mapper creates it once and keeps it).
    mapper: Arc<OnceLock<PathBuf>>,
    /// The previous answers of [`Discovery::resolve_repeated`].
    repeated: Arc<Mutex<repeat::Memo>>,
}

/// Sessions remembered at most; past it the memory starts again (a node whose sessions log in
/// again and again gets a new name each time).
const SESSIONS_KEPT: usize = 4096;

/// `path` with every symlink resolved, as `std::fs::canonicalize` (realpath) gives it, in three
/// system calls whatever its depth: the kernel walks the path once (an O_PATH open, which opens
/// no device) and names where it arrived (`/proc/self/fd`). realpath asks about each component
/// in turn, a dozen calls for a SCSI device's sysfs directory. Without /proc, realpath.
fn real_path(path: &Path) -> std::io::Result<PathBuf> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH)
        .open(path)?;
    match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        // Removed since the open: as realpath would have found it.
        Ok(real) if real.as_os_str().as_encoded_bytes().ends_with(b" (deleted)") => Err(
            std::io::Error::new(std::io::ErrorKind::NotFound, "removed while being resolved"),
        ),
        Ok(real) if real.is_absolute() => Ok(real),
        _ => std::fs::canonicalize(path),
    }
}

/// A sysfs attribute's contents: one read, as the kernel hands an attribute (a text one is at
/// most a page, a VPD page less) out whole; longer files (a fake tree's) are read to the end.
fn read_sysfs(path: &Path) -> std::io::Result<Vec<u8>> {
    read_open(&mut std::fs::File::open(path)?)
}

/// [`read_sysfs`] of a file already open.
fn read_open(file: &mut std::fs::File) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = vec![0u8; 4096];
    let len = loop {
        match file.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => break read?,
        }
    };
    if len == buf.len() {
        file.read_to_end(&mut buf)?;
    } else {
        buf.truncate(len);
    }
    Ok(buf)
}

/// [`read_sysfs`] for a text attribute.
fn read_attr(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_sysfs(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Entry names of a directory, sorted (sysfs order is not stable across boots).
fn entry_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

/// What to do with a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Partitions {
    Refuse,
    WholeDevice,
}

/// A path found, before grouping.
struct Found {
    path: PathInfo,
    id: Option<LuId>,
    serial: Option<String>,
}

impl Discovery {
    /// Discovery on fake trees: `sys` stands for `/sys`, `dev` for `/dev`.
    pub fn new(sys: impl Into<PathBuf>, dev: impl Into<PathBuf>) -> Self {
        Self {
            sys: sys.into(),
            dev: dev.into(),
            sessions: Arc::default(),
            mapper: Arc::default(),
            repeated: Arc::default(),
        }
    }

    /// Discovery on this system.
    pub fn system() -> Self {
        Self::new("/sys", "/dev")
    }

    /// The LUs behind `devices`, sorted by [`LuId`] (the first is the arbiter), each with its
    /// paths. Partitions are refused. Every device is examined; the error lists every problem.
    pub fn resolve(&self, devices: &[PathBuf]) -> Result<Vec<Lu>, DiscoverError> {
        Ok(self.resolve_with(devices, Partitions::Refuse, false)?.lus)
    }

    /// Like [`Self::resolve`], but a device that cannot be identified (vanished, sysfs gone, no
    /// designator: [`DeviceError::is_unidentifiable`]) does not fail the others: it is returned
    /// in [`Resolution::unidentified`]. Errors an admin must fix still fail, naming every one.
    /// What fencing uses, so one dead device cannot stop the fencing of the LUs that can be
    /// identified.
    pub fn resolve_each(&self, devices: &[PathBuf]) -> Result<Resolution, DiscoverError> {
        self.resolve_with(devices, Partitions::Refuse, true)
    }

    /// Like [`Self::resolve`] for PVs found by LVM: a PV on a partition stands for its whole
    /// disk (or multipath map).
    pub fn resolve_pvs(&self, pvs: &[PathBuf]) -> Result<Vec<Lu>, DiscoverError> {
        Ok(self.resolve_with(pvs, Partitions::WholeDevice, false)?.lus)
    }

    /// fence_scsi's behaviour with no `devices`: the PVs of clustered or shared VGs
    /// ([`lvm::shared_pvs`] with `vgs`), resolved with [`Self::resolve_pvs`].
    pub fn resolve_lvm(
        &self,
        vgs: &Path,
        timeout: Option<std::time::Duration>,
    ) -> Result<Vec<Lu>, DiscoverError> {
        let pvs = lvm::shared_pvs(vgs, timeout)?;
        if pvs.is_empty() {
            return Err(DiscoverError::NothingToFence);
        }
        self.resolve_pvs(&pvs)
    }

    /// [`Self::resolve_lvm`] with [`Self::resolve_each`]'s leniency: a PV that vanished (vgs
    /// shows `[unknown]`, or the node is gone) is returned in [`Resolution::unidentified`]
    /// instead of failing the other PVs.
    pub fn resolve_lvm_each(
        &self,
        vgs: &Path,
        timeout: Option<std::time::Duration>,
    ) -> Result<Resolution, DiscoverError> {
        let pvs = lvm::shared_pvs(vgs, timeout)?;
        if pvs.is_empty() {
            return Err(DiscoverError::NothingToFence);
        }
        self.resolve_with(&pvs, Partitions::WholeDevice, true)
    }

    fn resolve_with(
        &self,
        devices: &[PathBuf],
        partitions: Partitions,
        lenient: bool,
    ) -> Result<Resolution, DiscoverError> {
        let mut errors = Vec::new();
        let mut unidentified = Vec::new();
        let mut found = Vec::new();
        for device in devices {
            match self.expand(device, partitions) {
                Ok(paths) => found.extend(paths),
                Err(error) if lenient && error.is_unidentifiable() => {
                    unidentified.push(Unidentified {
                        device: device.clone(),
                        error,
                    })
                }
                Err(e) => errors.push(e),
            }
        }
        let mut lus: BTreeMap<LuId, (Lu, Option<(PathBuf, String)>)> = BTreeMap::new();
        for Found { path, id, serial } in found {
            let Some(id) = id else {
                let error = DeviceError::NoIdentity {
                    device: path.given,
                    name: path.name,
                    hctl: path.hctl,
                };
                if lenient {
                    unidentified.push(Unidentified {
                        device: path.dev,
                        error,
                    });
                } else {
                    errors.push(error);
                }
                continue;
            };
            let (lu, first_serial) = lus.entry(id.clone()).or_insert_with(|| {
                (
                    Lu {
                        id: id.clone(),
                        paths: Vec::new(),
                    },
                    None,
                )
            });
            // The same I_T_L nexus given twice (e.g. /dev/sdb and its /dev/sg1) is one path.
            if lu.paths.iter().any(|p| p.hctl == path.hctl) {
                continue;
            }
            if let Some(serial) = serial {
                match first_serial {
                    Some((first, first_s)) if *first_s != serial => {
                        errors.push(DeviceError::IdCollision {
                            id,
                            first: first.clone(),
                            first_serial: first_s.clone(),
                            second: path.dev.clone(),
                            second_serial: serial,
                        });
                        continue;
                    }
                    Some(_) => {}
                    None => *first_serial = Some((path.dev.clone(), serial)),
                }
            }
            lu.paths.push(path);
        }
        if errors.is_empty() {
            Ok(Resolution {
                lus: lus.into_values().map(|(lu, _)| lu).collect(),
                unidentified,
            })
        } else {
            Err(DiscoverError::Devices(errors))
        }
    }

    /// The SCSI paths one given device stands for.
    fn expand(&self, given: &Path, partitions: Partitions) -> Result<Vec<Found>, DeviceError> {
        let name = self.kernel_name(given)?;
        self.expand_name(given, &name, partitions)
    }

    fn expand_name(
        &self,
        given: &Path,
        name: &str,
        partitions: Partitions,
    ) -> Result<Vec<Found>, DeviceError> {
        let generic = self.sys.join("class/scsi_generic").join(name);
        if generic.exists() {
            let scsi_dir = self.canonical(given, name, &generic.join("device"))?;
            return Ok(vec![self.scsi_path(given, name, &scsi_dir)]);
        }
        let block = self.sys.join("class/block").join(name);
        if !block.exists() {
            return Err(DeviceError::NoSysfs {
                device: given.to_owned(),
                name: name.to_owned(),
                sys: self.sys.clone(),
            });
        }
        if block.join("partition").exists() {
            let whole = self.canonical(given, name, &block)?;
            let parent = whole
                .parent()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            return match partitions {
                Partitions::Refuse => Err(DeviceError::Partition {
                    device: given.to_owned(),
                    parent: self.dev.join(parent),
                }),
                Partitions::WholeDevice => self.expand_name(given, &parent, partitions),
            };
        }
        if block.join("dm").is_dir() {
            return self.expand_dm(given, name, &block, partitions);
        }
        match parse_nvme_name(name) {
            Some(NvmeName::HiddenPath { head }) => {
                return Err(DeviceError::NvmePath {
                    device: given.to_owned(),
                    name: name.to_owned(),
                    head: self.dev.join(head),
                });
            }
            Some(NvmeName::Namespace) if block.join("nsid").exists() => {
                let dir = self.canonical(given, name, &block)?;
                return Ok(vec![self.nvme_path(given, name, &dir)]);
            }
            _ => {}
        }
        if !block.join("device/scsi_device").is_dir() {
            // The kernel removes a SCSI device's own class entries before its disk: in between,
            // a disk whose parent is still named H:C:T:L is a SCSI path on its way out.
            if is_hctl_dir(&block.join("device")) {
                return Err(DeviceError::Removing {
                    device: given.to_owned(),
                    name: name.to_owned(),
                });
            }
            return Err(DeviceError::NotScsi {
                device: given.to_owned(),
                name: name.to_owned(),
            });
        }
        let scsi_dir = self.canonical(given, name, &block.join("device"))?;
        Ok(vec![self.scsi_path(given, name, &scsi_dir)])
    }

    /// A dm-multipath map's paths. A kpartx partition of a map (dm uuid `partN-mpath-…`, one
    /// slave: the map) is a partition like any other.
    fn expand_dm(
        &self,
        given: &Path,
        name: &str,
        block: &Path,
        partitions: Partitions,
    ) -> Result<Vec<Found>, DeviceError> {
        let uuid = self.read(given, name, &block.join("dm/uuid"))?;
        let uuid = uuid.trim();
        let slaves = self.list(given, name, &block.join("slaves"))?;
        let is_partition = uuid.starts_with("part") && uuid.contains("-mpath-");
        if is_partition {
            let parent = slaves.first().cloned().unwrap_or_default();
            return match partitions {
                Partitions::Refuse => Err(DeviceError::Partition {
                    device: given.to_owned(),
                    parent: self.dev.join(parent),
                }),
                Partitions::WholeDevice => self.expand_name(given, &parent, partitions),
            };
        }
        if !uuid.starts_with("mpath-") {
            return Err(DeviceError::NotMultipath {
                device: given.to_owned(),
                name: name.to_owned(),
                uuid: uuid.to_owned(),
            });
        }
        if slaves.is_empty() {
            return Err(DeviceError::NoPaths {
                device: given.to_owned(),
                name: name.to_owned(),
            });
        }
        let mut found = Vec::new();
        for slave in &slaves {
            found.extend(self.expand_name(given, slave, Partitions::Refuse)?);
        }
        // A slave whose identity cannot be read now (an offline path) is still a path of the
        // map's LU; slaves naming different LUs mean a broken map.
        let mut ids: Vec<String> = found
            .iter()
            .filter_map(|f| f.id.as_ref().map(|id| id.as_str().to_owned()))
            .collect();
        ids.sort();
        ids.dedup();
        if ids.len() > 1 {
            return Err(DeviceError::MixedMap {
                device: given.to_owned(),
                name: name.to_owned(),
                ids,
            });
        }
        if let Some(id) = ids.pop() {
            for f in &mut found {
                f.id.get_or_insert_with(|| LuId::Designator(id.as_str().into()));
            }
        }
        Ok(found)
    }

    /// The kernel name (`sdb`, `sg1`, `dm-0`) of the node `given` leads to, following symlinks.
    /// A `/dev/mapper/NAME` that is a node rather than a symlink (no udev) is found by dm name.
    fn kernel_name(&self, given: &Path) -> Result<String, DeviceError> {
        let not_found = |source| DeviceError::NotFound {
            device: given.to_owned(),
            source,
        };
        let real = std::fs::canonicalize(given).map_err(not_found)?;
        let file_name = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mapper = match self.mapper.get() {
            Some(known) => Some(known.clone()),
            None => std::fs::canonicalize(self.dev.join("mapper"))
                .ok()
                .map(|found| self.mapper.get_or_init(|| found).clone()),
        };
        if mapper.is_some() && real.parent() == mapper.as_deref() {
            return self.dm_by_name(given, &file_name);
        }
        Ok(file_name)
    }

    fn dm_by_name(&self, given: &Path, dm_name: &str) -> Result<String, DeviceError> {
        let class = self.sys.join("class/block");
        for entry in self.list(given, dm_name, &class)? {
            if !entry.starts_with("dm-") {
                continue;
            }
            let name_file = class.join(&entry).join("dm/name");
            if read_attr(&name_file).is_ok_and(|n| n.trim() == dm_name) {
                return Ok(entry);
            }
        }
        Err(DeviceError::NoSysfs {
            device: given.to_owned(),
            name: dm_name.to_owned(),
            sys: self.sys.clone(),
        })
    }

    /// Reads one SCSI device's attributes. `scsi_dir` is its sysfs directory
    /// (`…/host2/session3/target2:0:0/2:0:0:0`). Missing identity is left to the caller.
    fn scsi_path(&self, given: &Path, name: &str, scsi_dir: &Path) -> Found {
        let hctl = scsi_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = |attr: &str| read_attr(&scsi_dir.join(attr));
        let bytes = |attr: &str| read_sysfs(&scsi_dir.join(attr));
        let id = text("wwid")
            .ok()
            .and_then(|w| LuId::from_wwid(&w))
            .or_else(|| bytes("vpd_pg83").ok().and_then(|p| LuId::from_vpd_pg83(&p)));
        let serial = bytes("vpd_pg80").ok().and_then(|p| vpd::unit_serial(&p));
        let state = match text("state") {
            Ok(s) => PathState::parse(&s),
            Err(e) => PathState::Other(format!("unreadable ({e})")),
        };
        Found {
            path: PathInfo {
                dev: self.dev.join(name),
                given: given.to_owned(),
                name: name.to_owned(),
                protocol: Protocol::Scsi,
                hctl,
                state,
                transport: self.iscsi_session(scsi_dir),
                generic: self.generic_node(scsi_dir),
            },
            id,
            serial,
        }
    }

    /// The sg node of the SCSI device at `scsi_dir` (`…/1:0:0:0/scsi_generic/sgN`), if the sg
    /// driver is bound to it.
    fn generic_node(&self, scsi_dir: &Path) -> Option<PathBuf> {
        std::fs::read_dir(scsi_dir.join("scsi_generic"))
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("sg"))
            .map(|n| self.dev.join(n))
    }

    /// Reads one NVMe namespace's attributes; `dir` is its sysfs directory. Missing identity is
    /// left to the caller.
    fn nvme_path(&self, given: &Path, name: &str, dir: &Path) -> Found {
        let text = |rel: &str| read_attr(&dir.join(rel)).ok();
        let hex = |rel: &str| {
            text(rel)
                .map(|t| {
                    t.chars()
                        .filter(char::is_ascii_hexdigit)
                        .collect::<String>()
                })
                .filter(|h| !h.is_empty() && h.bytes().any(|b| b != b'0'))
        };
        // The kernel's wwid, else what it builds it from, in its order and format: a UUID
        // (`uuid.…`), the NGUID, the EUI-64 (`eui.` and lowercase hex). The `uuid` attribute
        // shows the NGUID when the namespace has no UUID, so that echo is not taken for one.
        let nguid = hex("nguid");
        let id = text("wwid").and_then(|w| LuId::from_wwid(&w)).or_else(|| {
            let uuid = text("uuid")
                .map(|u| u.trim().to_ascii_lowercase())
                .filter(|u| hex("uuid").is_some_and(|h| Some(h) != nguid) && !u.is_empty());
            uuid.map(|u| LuId::Designator(format!("uuid.{u}").into()))
                .or_else(|| {
                    nguid
                        .map(|h| LuId::Designator(format!("eui.{}", h.to_ascii_lowercase()).into()))
                })
                .or_else(|| {
                    hex("eui")
                        .map(|h| LuId::Designator(format!("eui.{}", h.to_ascii_lowercase()).into()))
                })
        });
        let nsid = text("nsid")
            .map(|n| n.trim().to_owned())
            .unwrap_or_default();
        let parent = real_path(&dir.join("device"))
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default();
        let state = if dir.join("multipath").is_dir() {
            self.nvme_head_state(dir)
        } else {
            match read_attr(&dir.join("device/state")) {
                Ok(s) => PathState::parse_nvme(&s),
                Err(e) => PathState::Other(format!("unreadable ({e})")),
            }
        };
        Found {
            path: PathInfo {
                dev: self.dev.join(name),
                given: given.to_owned(),
                name: name.to_owned(),
                protocol: Protocol::Nvme,
                hctl: format!("{parent}:ns{nsid}"),
                state,
                transport: None,
                generic: None,
            },
            id,
            serial: None,
        }
    }

    /// A multipath head is usable when one of its controllers is: the best state among
    /// `multipath/<path>/device/state`.
    fn nvme_head_state(&self, dir: &Path) -> PathState {
        let paths = std::fs::read_dir(dir.join("multipath"))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| read_attr(&e.path().join("device/state")).ok())
                    .map(|s| PathState::parse_nvme(&s))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        paths
            .into_iter()
            .min_by_key(PathState::rank)
            .unwrap_or_else(|| PathState::Other("no controller paths".to_owned()))
    }

    /// The iSCSI session above a SCSI device: a `sessionN` component of its sysfs path. Read
    /// once per session name when complete (target, initiator and portal group known).
    fn iscsi_session(&self, scsi_dir: &Path) -> Option<IscsiSession> {
        let session = scsi_dir.ancestors().find_map(|a| {
            let n = a.file_name()?.to_str()?;
            let digits = n.strip_prefix("session")?;
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(n)
        })?;
        let sessions = || self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = sessions().get(session) {
            return Some(known.clone());
        }
        let dir = self.sys.join("class/iscsi_session").join(session);
        let attr = |a: &str| {
            read_attr(&dir.join(a))
                .ok()
                .map(|s| s.trim().to_owned())
                // open-iscsi leaves unset strings as "(null)".
                .filter(|s| !s.is_empty() && s != "(null)")
        };
        let found = IscsiSession {
            session: session.to_owned(),
            target: attr("targetname")?,
            initiator: attr("initiatorname").unwrap_or_default(),
            iface: attr("ifacename"),
            tpgt: attr("tpgt").and_then(|t| t.parse().ok()),
            isid: attr("isid"),
        };
        if !found.initiator.is_empty() && found.tpgt.is_some() {
            let mut known = sessions();
            if known.len() >= SESSIONS_KEPT {
                known.clear();
            }
            known.insert(session.to_owned(), found.clone());
        }
        Some(found)
    }

    fn canonical(&self, given: &Path, name: &str, path: &Path) -> Result<PathBuf, DeviceError> {
        real_path(path).map_err(|source| self.sysfs_error(given, name, path, source))
    }

    fn read(&self, given: &Path, name: &str, path: &Path) -> Result<String, DeviceError> {
        read_attr(path).map_err(|source| self.sysfs_error(given, name, path, source))
    }

    /// [`entry_names`], the device named in the error.
    fn list(&self, given: &Path, name: &str, dir: &Path) -> Result<Vec<String>, DeviceError> {
        entry_names(dir).map_err(|source| self.sysfs_error(given, name, dir, source))
    }

    fn sysfs_error(
        &self,
        given: &Path,
        name: &str,
        path: &Path,
        source: std::io::Error,
    ) -> DeviceError {
        DeviceError::Sysfs {
            device: given.to_owned(),
            name: name.to_owned(),
            path: path.to_owned(),
            source,
        }
    }
}
