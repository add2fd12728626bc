//! Opening a SCSI device and running one command on it.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ioctl::{self, Buffer, Unrepresentable};
use crate::node;
use crate::{DriverStatus, Error, HostStatus, ScsiStatus, Sense};

/// Longest CDB accepted. SG_IO's `cmd_len` is a `u8`, but Linux block devices take at most 16 bytes
/// (`BLK_MAX_CDB`) and no command this workspace sends is longer.
pub const MAX_CDB_LEN: usize = 16;

/// Sense buffer handed to the kernel: the SPC maximum (8 + 244 additional bytes).
const SENSE_BUFFER_LEN: usize = 252;

/// How to open the device node. SG_IO (including PERSISTENT RESERVE OUT) works on a read-only fd
/// for a process with CAP_SYS_RAWIO; read-write is needed by unprivileged callers of write commands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OpenMode {
    ReadOnly,
    ReadWrite,
}

/// An open SCSI block device (/dev/sdX) or SCSI generic device (/dev/sgN).
#[derive(Debug)]
pub struct Device {
    fd: OwnedFd,
    path: PathBuf,
}

/// The data phase of a command.
#[derive(Debug)]
pub enum DataTransfer<'a> {
    None,
    ToDevice(&'a [u8]),
    FromDevice(&'a mut [u8]),
}

/// A command the kernel delivered and completed (the ioctl returned 0). The command itself may
/// still have failed: look at [`Completion::is_good`], the statuses and the sense.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Completion {
    pub status: ScsiStatus,
    pub host_status: HostStatus,
    pub driver_status: DriverStatus,
    /// Exactly the sense bytes the kernel wrote (`sb_len_wr`).
    pub sense_bytes: Vec<u8>,
    /// Bytes of the data buffer not transferred. Only meaningful for a good completion: the lab saw
    /// a timed-out INQUIRY report 0 with nothing transferred.
    pub resid: usize,
    /// As measured by the kernel (millisecond resolution). Includes error handling: a command with
    /// a 2 s timeout came back after 7 s in the lab.
    pub duration: Duration,
}

impl Completion {
    /// Decoded sense; `None` if there was none or it is not in a format this crate knows.
    pub fn sense(&self) -> Option<Sense> {
        Sense::parse(&self.sense_bytes)
    }

    /// Status GOOD with no host or driver error. DRIVER_SENSE is tolerated: it can accompany GOOD
    /// when the device volunteers sense data (e.g. a recovered error).
    pub fn is_good(&self) -> bool {
        let driver = self.driver_status.code();
        self.status == ScsiStatus::GOOD
            && self.host_status == HostStatus::DID_OK
            && (driver == DriverStatus::OK || driver == DriverStatus::SENSE)
    }

    /// The raw sense bytes as hex ("70 00 06 …"), empty if none.
    pub fn sense_hex(&self) -> String {
        Sense::to_hex(&self.sense_bytes)
    }
}

impl Device {
    /// Opens `path` non-blocking (an sg node must not wait for the device) and close-on-exec,
    /// if it is a block device or an sg node ([`Error::NotADevice`] otherwise, without opening
    /// it: see [`NodeKind`](crate::NodeKind)).
    pub fn open(path: impl AsRef<Path>, access: OpenMode) -> Result<Device, Error> {
        let path = path.as_ref();
        let file = node::open_checked(
            path,
            OpenOptions::new()
                .read(true)
                .write(access == OpenMode::ReadWrite)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC),
        )?;
        Ok(Device {
            fd: file.into(),
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `cdb` and waits (blocking the thread) for its completion or `timeout`, after which the
    /// kernel aborts the command and completes it with host status DID_TIME_OUT (returns after the
    /// abort, so later than `timeout`).
    ///
    /// `timeout` is rounded up to whole milliseconds and must be between 1 ms and `u32::MAX - 1` ms
    /// (`u32::MAX` means "no timeout" to the kernel and is refused).
    ///
    /// With [`DataTransfer::FromDevice`], only the first `len - resid` bytes were written by the
    /// device; the rest of the buffer is left as it was. On an sg node a signal can interrupt the
    /// wait (`Error::Ioctl` with EINTR): the command may still run, so do not assume it did not.
    pub fn execute(
        &self,
        cdb: &[u8],
        data: DataTransfer<'_>,
        timeout: Duration,
    ) -> Result<Completion, Error> {
        if cdb.is_empty() || cdb.len() > MAX_CDB_LEN {
            return Err(Error::InvalidRequest {
                reason: format!("CDB is {} bytes; it must be 1 to {MAX_CDB_LEN}", cdb.len()),
            });
        }
        let timeout_ms = timeout_millis(timeout)?;
        let buffer = match data {
            DataTransfer::None => Buffer::None,
            DataTransfer::ToDevice(data) => Buffer::ToDevice(data),
            DataTransfer::FromDevice(data) => Buffer::FromDevice(data),
        };
        let mut sense = [0u8; SENSE_BUFFER_LEN];
        let raw = ioctl::sg_io(self.fd.as_fd(), cdb, buffer, &mut sense, timeout_ms)
            .map_err(|unrepresentable| Error::InvalidRequest {
                reason: match unrepresentable {
                    Unrepresentable::CdbLength(len) => format!("CDB of {len} bytes"),
                    Unrepresentable::DataLength(len) => {
                        format!("data buffer of {len} bytes exceeds u32::MAX")
                    }
                },
            })?
            .map_err(|source| Error::Ioctl {
                path: self.path.clone(),
                source,
            })?;
        Ok(Completion {
            status: ScsiStatus(raw.status),
            host_status: HostStatus(raw.host_status),
            driver_status: DriverStatus(raw.driver_status),
            sense_bytes: sense[..raw.sense_len].to_vec(),
            // A negative residual has no meaning; the kernel never reports one for SG_IO.
            resid: usize::try_from(raw.resid).unwrap_or(0),
            duration: Duration::from_millis(u64::from(raw.duration_ms)),
        })
    }
}

fn timeout_millis(timeout: Duration) -> Result<u32, Error> {
    let invalid = || Error::InvalidRequest {
        reason: format!(
            "timeout {timeout:?}: it must be between 1 ms and {} ms",
            u32::MAX - 1
        ),
    };
    let millis = timeout.as_nanos().div_ceil(1_000_000);
    match u32::try_from(millis) {
        Ok(0 | u32::MAX) | Err(_) => Err(invalid()),
        Ok(millis) => Ok(millis),
    }
}

/// Why opening a device node failed, when the reason is one an operator can act on.
pub(crate) fn open_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => {
            " (the device node's file permission must let this user open it for reading: its group, usually `disk`, or CAP_DAC_OVERRIDE)"
        }
        _ => "",
    }
}

/// Why an SG_IO ioctl failure happened, in words an operator can act on.
pub(crate) fn ioctl_hint(source: &io::Error) -> &'static str {
    match source.raw_os_error() {
        Some(libc::ENOTTY) => {
            " (not a SCSI device, or a partition: use the whole disk /dev/sdX or /dev/sgN)"
        }
        Some(libc::EINVAL) => {
            " (the kernel refused the request: check the CDB length and that the transfer fits the device's limits)"
        }
        // The kernel's scsi_cmd_allowed() passes only a short list of read/write commands without
        // CAP_SYS_RAWIO; whatever else is sent (persistent reservations among it) needs it.
        Some(libc::EPERM | libc::EACCES) => {
            " (operation not permitted: this SCSI command needs CAP_SYS_RAWIO; run as root or grant the capability)"
        }
        Some(libc::ENODEV | libc::ENXIO) => {
            " (the device is gone: check the path and its transport)"
        }
        Some(libc::EIO) => {
            " (I/O error before the command completed: check the device and its transport)"
        }
        Some(libc::ENOMEM) => " (the kernel could not allocate buffers for the transfer)",
        Some(libc::EINTR) => " (interrupted by a signal; the command may or may not have run)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Completion {
        Completion {
            status: ScsiStatus::GOOD,
            host_status: HostStatus::DID_OK,
            driver_status: DriverStatus::OK,
            sense_bytes: Vec::new(),
            resid: 0,
            duration: Duration::ZERO,
        }
    }

    #[test]
    fn is_good_requires_good_status_and_no_host_or_driver_error() {
        assert!(good().is_good());
        assert!(
            Completion {
                driver_status: DriverStatus::SENSE,
                ..good()
            }
            .is_good()
        );
        assert!(
            !Completion {
                status: ScsiStatus::RESERVATION_CONFLICT,
                ..good()
            }
            .is_good()
        );
        assert!(
            !Completion {
                status: ScsiStatus::CHECK_CONDITION,
                driver_status: DriverStatus::SENSE,
                ..good()
            }
            .is_good()
        );
        assert!(
            !Completion {
                host_status: HostStatus::TIME_OUT,
                ..good()
            }
            .is_good()
        );
        assert!(
            !Completion {
                driver_status: DriverStatus::TIMEOUT,
                ..good()
            }
            .is_good()
        );
    }

    #[test]
    fn reservation_conflict_is_status_only() {
        // As sg-io's smoke example saw it in the lab: LIO refusing a WRITE(10) from a preempted
        // node through /dev/sdX (sg-io/testdata/lab-capture.txt).
        let conflict = Completion {
            status: ScsiStatus::RESERVATION_CONFLICT,
            ..good()
        };
        assert!(!conflict.is_good());
        assert_eq!(conflict.sense(), None);
        assert_eq!(conflict.sense_hex(), "");
    }

    #[test]
    fn device_can_be_shared_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Device>();
        send_sync::<Completion>();
        send_sync::<Error>();
    }

    #[test]
    fn timeouts_round_up_and_reject_zero_and_overflow() {
        assert_eq!(timeout_millis(Duration::from_secs(30)).ok(), Some(30_000));
        assert_eq!(timeout_millis(Duration::from_micros(1)).ok(), Some(1));
        assert!(timeout_millis(Duration::ZERO).is_err());
        assert!(timeout_millis(Duration::from_millis(u64::from(u32::MAX))).is_err());
        assert!(timeout_millis(Duration::from_secs(u64::MAX)).is_err());
    }

    /// What `Device::open(path)` said: its error's text, or "opened".
    fn open_text(path: &Path) -> String {
        match Device::open(path, OpenMode::ReadOnly) {
            Ok(_) => "opened".to_owned(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn what_is_not_a_disk_is_refused_naming_the_path_and_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let socket = dir.path().join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        // A link is followed, as /dev/disk/by-id names are, and judged by what it leads to.
        let link = dir.path().join("by-id-typo");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        for (path, kind) in [
            (Path::new("/dev/null"), "a character device 1:3"),
            (&link, "a character device 1:3"),
            (&file, "a regular file"),
            (dir.path(), "a directory"),
            (&fifo, "a FIFO"),
            (&socket, "a socket"),
        ] {
            let err = Device::open(path, OpenMode::ReadOnly).err();
            assert!(
                matches!(err, Some(Error::NotADevice { .. })),
                "{}: {err:?}",
                path.display()
            );
            let text = open_text(path);
            assert!(
                text.contains(&format!("{} is {kind}", path.display()))
                    && text.contains("/dev/sgN")
                    && text.contains("not opened"),
                "{}: {text}",
                path.display()
            );
        }
    }

    /// Opening /dev/watchdog arms it, and closing it without the magic character resets the
    /// node: a node with its numbers must be refused from stat(2) alone. Needs root (mknod).
    #[test]
    fn a_watchdog_node_is_refused_without_being_opened() {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: making a device node (mknod) needs root");
            return;
        }
        // Should the check ever regress, the open would arm a watchdog this host has loaded.
        let misc = std::fs::read_to_string("/proc/misc").unwrap_or_default();
        if misc.lines().any(|l| l.trim() == "130 watchdog") {
            eprintln!("skipped: this host has a watchdog driver (misc 130) a regression would arm");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("watchdog");
        match mknod(
            &node,
            SFlag::S_IFCHR,
            Mode::S_IRUSR | Mode::S_IWUSR,
            makedev(10, 130),
        ) {
            Err(nix::errno::Errno::EPERM) => {
                eprintln!("skipped: mknod refused (no CAP_MKNOD in this container)");
                return;
            }
            made => made.unwrap(),
        }
        // Opened, it would fail with ENODEV (no watchdog driver here), not name the numbers.
        let text = open_text(&node);
        assert!(
            text.contains("is a character device 10:130") && text.contains("not opened"),
            "{text}"
        );
    }

    #[test]
    fn open_error_names_the_path() {
        let err = Device::open("/nonexistent/sg-io-test", OpenMode::ReadOnly).err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("/nonexistent/sg-io-test"), "{text}");
    }

    /// /dev/null as a `Device`, past the check [`Device::open`] makes: SG_IO on it fails with
    /// ENOTTY, as on a block device whose driver does not take SG_IO (the only such fd `open`
    /// still gives), which is what the ioctl error path below needs.
    fn null_device() -> Device {
        Device {
            fd: std::fs::File::open("/dev/null").unwrap().into(),
            path: PathBuf::from("/dev/null"),
        }
    }

    #[test]
    fn requests_the_header_cannot_carry_are_refused_before_the_ioctl() {
        // /dev/null is not a SCSI device, but validation must fail first.
        let device = null_device();
        let long = [0u8; MAX_CDB_LEN + 1];
        for cdb in [&[][..], &long[..]] {
            let err = device.execute(cdb, DataTransfer::None, Duration::from_secs(1));
            assert!(matches!(err, Err(Error::InvalidRequest { .. })), "{err:?}");
        }
        let err = device.execute(&[0; 6], DataTransfer::None, Duration::ZERO);
        assert!(matches!(err, Err(Error::InvalidRequest { .. })), "{err:?}");
    }

    #[test]
    fn sg_io_on_a_non_scsi_file_is_an_ioctl_error_with_a_hint() {
        let device = null_device();
        let err = device
            .execute(&[0; 6], DataTransfer::None, Duration::from_secs(1))
            .unwrap_err();
        assert!(matches!(err, Error::Ioctl { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("/dev/null") && text.contains("not a SCSI device"),
            "{text}"
        );
    }
}
