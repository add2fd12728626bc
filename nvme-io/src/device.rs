//! Opening an NVMe namespace block device and sending it PR ioctls and passthrough commands.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::ioctl::{self, Data, Passthru, PrType, Queue};
use crate::node;
use crate::{NvmeError, NvmeStatus, PrStatus};

/// The most keys IOC_PR_READ_KEYS accepts in one call (`PR_KEYS_MAX`); more is EINVAL.
pub const PR_KEYS_MAX: usize = 65536;

/// An open block device (an NVMe namespace `/dev/nvmeXnY`, or any block device with `pr_ops`).
///
/// Opened read-only (a read-only open does not send udev a change event on close). The kernel's
/// `blkdev_pr_allowed`: the PR OUT ioctls (register … clear) need CAP_SYS_ADMIN or an fd open
/// for writing; IOC_PR_READ_KEYS and IOC_PR_READ_RESERVATION need only a readable fd (since
/// "block: allow IOC_PR_READ_* ioctls with BLK_OPEN_READ", in 6.19-stable; their first version
/// wanted the write mode too); all of them refuse partitions. NVMe passthrough of reservation
/// commands needs CAP_SYS_ADMIN whatever the open mode.
#[derive(Debug)]
pub struct BlockDevice {
    fd: OwnedFd,
    path: PathBuf,
}

/// The data phase of a passthrough command. Its direction must match the opcode's (bits 1:0 of
/// an NVMe opcode: 01b host to controller, 10b controller to host).
#[derive(Debug)]
pub enum NvmeDataTransfer<'a> {
    None,
    ToDevice(&'a [u8]),
    FromDevice(&'a mut [u8]),
}

/// One NVMe command for passthrough: the opcode, the namespace and command dwords 10-15. The
/// data pointer and length come from the [`NvmeDataTransfer`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct NvmeCommand {
    pub opcode: u8,
    pub nsid: u32,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

/// A passthrough command the controller completed: its status (possibly an error) and the
/// completion queue entry's dword 0.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct NvmeCompletion {
    pub status: NvmeStatus,
    pub result: u32,
}

/// What IOC_PR_READ_KEYS returned besides the keys themselves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PrKeys {
    pub generation: u32,
    /// How many keys the device has. May exceed the buffer given: only
    /// `min(num_keys, buffer length)` entries were written; re-issue with a larger buffer.
    pub num_keys: u32,
}

/// What IOC_PR_READ_RESERVATION returned.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PrReservation {
    pub key: u64,
    pub generation: u32,
    /// The `pr_type` code; 0 when nothing is reserved.
    pub rtype: u32,
}

impl PrReservation {
    /// The reservation type; `None` when nothing is reserved or the code is unknown.
    pub fn pr_type(&self) -> Option<PrType> {
        PrType::from_code(self.rtype)
    }
}

/// `Ok(())`, or the device's error status.
pub type PrResult<T> = Result<T, PrStatus>;

fn pr_result<T>(status: u32, value: T) -> PrResult<T> {
    match PrStatus(status) {
        PrStatus::SUCCESS => Ok(value),
        error => Err(error),
    }
}

impl BlockDevice {
    /// Opens `path` read-only, non-blocking and close-on-exec, if it is a block device
    /// ([`NvmeError::NotADevice`] otherwise, without opening it: see
    /// [`NodeKind`](crate::NodeKind)).
    pub fn open(path: impl AsRef<Path>) -> Result<BlockDevice, NvmeError> {
        let path = path.as_ref();
        let file = node::open_checked(
            path,
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC),
        )?;
        Ok(BlockDevice {
            fd: file.into(),
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn ioctl_error(&self, ioctl: &'static str) -> impl FnOnce(io::Error) -> NvmeError + '_ {
        move |source| NvmeError::Ioctl {
            path: self.path.clone(),
            ioctl,
            source,
        }
    }

    fn pr_out<A: ioctl::PrOutArg + ioctl::PrOutStruct>(
        &self,
        arg: &A,
    ) -> Result<PrResult<()>, NvmeError> {
        let status = ioctl::pr_out(self.fd.as_fd(), arg).map_err(self.ioctl_error(A::NAME))?;
        Ok(pr_result(status, ()))
    }

    /// IOC_PR_REGISTER: register `new` replacing `old` (0: not registered yet). With
    /// `ignore_key`, the device does not check `old`. On NVMe this is Reservation Register with
    /// RREGA = `old != 0` ? replace : register; it cannot unregister (use passthrough).
    pub fn pr_register(
        &self,
        old: u64,
        new: u64,
        ignore_key: bool,
    ) -> Result<PrResult<()>, NvmeError> {
        self.pr_out(&ioctl::PrRegistration {
            old_key: old,
            new_key: new,
            flags: if ignore_key {
                ioctl::PR_FL_IGNORE_KEY
            } else {
                0
            },
            pad: 0,
        })
    }

    /// IOC_PR_RESERVE.
    pub fn pr_reserve(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, NvmeError> {
        self.pr_out(&ioctl::Reserve(ioctl::PrReservationArg {
            key,
            rtype: rtype.code(),
            flags: 0,
        }))
    }

    /// IOC_PR_RELEASE.
    pub fn pr_release(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, NvmeError> {
        self.pr_out(&ioctl::Release(ioctl::PrReservationArg {
            key,
            rtype: rtype.code(),
            flags: 0,
        }))
    }

    /// IOC_PR_PREEMPT, or IOC_PR_PREEMPT_ABORT with `abort`: `old` is the caller's key, `new`
    /// the victim's.
    pub fn pr_preempt(
        &self,
        old: u64,
        new: u64,
        rtype: PrType,
        abort: bool,
    ) -> Result<PrResult<()>, NvmeError> {
        let arg = ioctl::PrPreempt {
            old_key: old,
            new_key: new,
            rtype: rtype.code(),
            flags: 0,
        };
        if abort {
            self.pr_out(&ioctl::PreemptAbort(arg))
        } else {
            self.pr_out(&ioctl::Preempt(arg))
        }
    }

    /// IOC_PR_CLEAR.
    pub fn pr_clear(&self, key: u64) -> Result<PrResult<()>, NvmeError> {
        self.pr_out(&ioctl::PrClear {
            key,
            flags: 0,
            pad: 0,
        })
    }

    /// IOC_PR_READ_KEYS into `keys` (at most [`PR_KEYS_MAX`] entries). Kernels without it
    /// (before about 6.19) fail with ENOTTY or EOPNOTSUPP.
    pub fn pr_read_keys(&self, keys: &mut [u64]) -> Result<PrResult<PrKeys>, NvmeError> {
        if keys.len() > PR_KEYS_MAX {
            return Err(NvmeError::InvalidRequest {
                reason: format!(
                    "a key buffer of {} entries; the kernel takes at most {PR_KEYS_MAX}",
                    keys.len()
                ),
            });
        }
        let out = ioctl::pr_read_keys(self.fd.as_fd(), keys)
            .map_err(self.ioctl_error("IOC_PR_READ_KEYS"))?;
        Ok(pr_result(
            out.status,
            PrKeys {
                generation: out.generation,
                num_keys: out.num_keys,
            },
        ))
    }

    /// IOC_PR_READ_RESERVATION. Kernels without it fail with ENOTTY or EOPNOTSUPP.
    pub fn pr_read_reservation(&self) -> Result<PrResult<PrReservation>, NvmeError> {
        let out = ioctl::pr_read_reservation(self.fd.as_fd())
            .map_err(self.ioctl_error("IOC_PR_READ_RESERVATION"))?;
        Ok(pr_result(
            out.status,
            PrReservation {
                key: out.key,
                generation: out.generation,
                rtype: out.rtype,
            },
        ))
    }

    /// NVME_IOCTL_ID: the namespace id of this block device. Fails with ENOTTY on a device that
    /// is not an NVMe namespace.
    pub fn nsid(&self) -> Result<u32, NvmeError> {
        ioctl::nvme_nsid(self.fd.as_fd()).map_err(self.ioctl_error("NVME_IOCTL_ID"))
    }

    /// NVME_IOCTL_IO_CMD: one NVM command set command on an I/O queue, waiting (blocking the
    /// thread) for its completion or `timeout` (whole milliseconds, 1 ms to `u32::MAX` ms).
    pub fn io_passthru(
        &self,
        command: &NvmeCommand,
        data: NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, NvmeError> {
        self.passthru(Queue::Io, command, data, timeout)
    }

    /// NVME_IOCTL_ADMIN_CMD: one admin command (Identify…), like [`Self::io_passthru`].
    pub fn admin_passthru(
        &self,
        command: &NvmeCommand,
        data: NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, NvmeError> {
        self.passthru(Queue::Admin, command, data, timeout)
    }

    fn passthru(
        &self,
        queue: Queue,
        command: &NvmeCommand,
        data: NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, NvmeError> {
        let timeout_ms = timeout_millis(timeout)?;
        let host_to_controller = command.opcode & 0x01 != 0;
        // The kernel writes into the buffer exactly when opcode bit 0 is clear; a borrowed
        // `&[u8]` must never be written, so the direction is checked before the ioctl.
        let data = match data {
            NvmeDataTransfer::None => Data::None,
            NvmeDataTransfer::ToDevice([]) | NvmeDataTransfer::FromDevice([]) => Data::None,
            NvmeDataTransfer::ToDevice(buf) if host_to_controller => Data::ToDevice(buf),
            NvmeDataTransfer::FromDevice(buf) if !host_to_controller => Data::FromDevice(buf),
            NvmeDataTransfer::ToDevice(_) | NvmeDataTransfer::FromDevice(_) => {
                return Err(NvmeError::InvalidRequest {
                    reason: format!(
                        "opcode {:#04x} transfers {}, the buffer goes the other way",
                        command.opcode,
                        if host_to_controller {
                            "host to controller"
                        } else {
                            "controller to host"
                        }
                    ),
                });
            }
        };
        let name = match queue {
            Queue::Admin => "NVME_IOCTL_ADMIN_CMD",
            Queue::Io => "NVME_IOCTL_IO_CMD",
        };
        let len = data_len(&data);
        if u32::try_from(len).is_err() {
            return Err(NvmeError::InvalidRequest {
                reason: format!("a data buffer of {len} bytes exceeds u32::MAX"),
            });
        }
        let out = ioctl::nvme_passthru(
            self.fd.as_fd(),
            queue,
            Passthru {
                opcode: command.opcode,
                nsid: command.nsid,
                cdw: [
                    command.cdw10,
                    command.cdw11,
                    command.cdw12,
                    command.cdw13,
                    command.cdw14,
                    command.cdw15,
                ],
                timeout_ms,
                data,
            },
        )
        .map_err(self.ioctl_error(name))?;
        Ok(NvmeCompletion {
            // The status field is 15 bits; the kernel never returns more.
            status: NvmeStatus(u16::try_from(out.status & 0x7fff).unwrap_or(u16::MAX)),
            result: out.result,
        })
    }
}

fn data_len(data: &Data<'_>) -> usize {
    match data {
        Data::None => 0,
        Data::ToDevice(b) => b.len(),
        Data::FromDevice(b) => b.len(),
    }
}

fn timeout_millis(timeout: Duration) -> Result<u32, NvmeError> {
    let millis = timeout.as_nanos().div_ceil(1_000_000);
    match u32::try_from(millis) {
        // 0 would mean "the driver's default timeout" to the kernel.
        Ok(0) | Err(_) => Err(NvmeError::InvalidRequest {
            reason: format!(
                "timeout {timeout:?}: it must be between 1 ms and {} ms",
                u32::MAX
            ),
        }),
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

/// Why an ioctl failed, in words an operator can act on.
pub(crate) fn ioctl_hint(ioctl: &str, source: &io::Error) -> &'static str {
    let passthru = ioctl.starts_with("NVME_");
    match source.raw_os_error() {
        Some(libc::ENOTTY) if passthru => " (not an NVMe device: give the namespace /dev/nvmeXnY)",
        Some(libc::ENOTTY | libc::EOPNOTSUPP) => {
            " (this kernel or device has no such persistent-reservation operation)"
        }
        Some(libc::EPERM | libc::EACCES) if passthru => {
            " (operation not permitted: NVMe passthrough of reservation commands needs CAP_SYS_ADMIN)"
        }
        Some(libc::EPERM | libc::EACCES) => {
            " (operation not permitted: block PR ioctls that change reservations need CAP_SYS_ADMIN or a device opened for writing, and all refuse partitions)"
        }
        Some(libc::EINVAL) => " (the device refused a field of the request)",
        Some(libc::ENODEV | libc::ENXIO) => {
            " (the device is gone: check the path and its controller)"
        }
        Some(libc::EIO) => {
            " (I/O error before the command completed: check the controller's connection)"
        }
        Some(libc::ETIMEDOUT) => " (the command timed out)",
        Some(libc::EINTR) => {
            " (cancelled: a timeout, a controller reset or a signal; the command may or may not have run)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_round_up_and_reject_zero_and_overflow() {
        assert_eq!(timeout_millis(Duration::from_secs(30)).ok(), Some(30_000));
        assert_eq!(timeout_millis(Duration::from_micros(1)).ok(), Some(1));
        assert!(timeout_millis(Duration::ZERO).is_err());
        assert!(timeout_millis(Duration::from_secs(u64::MAX)).is_err());
    }

    /// What `BlockDevice::open(path)` said: its error's text, or "opened".
    fn open_text(path: &Path) -> String {
        match BlockDevice::open(path) {
            Ok(_) => "opened".to_owned(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn what_is_not_a_block_device_is_refused_naming_the_path_and_what_it_is() {
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
            let err = BlockDevice::open(path).err();
            assert!(
                matches!(err, Some(NvmeError::NotADevice { .. })),
                "{}: {err:?}",
                path.display()
            );
            let text = open_text(path);
            assert!(
                text.contains(&format!("{} is {kind}", path.display()))
                    && text.contains("/dev/nvmeXnY")
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
        let text = BlockDevice::open("/nonexistent/nvme-io-test")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(text.contains("/nonexistent/nvme-io-test"), "{text}");
    }

    /// /dev/null as a `BlockDevice`, past the check [`BlockDevice::open`] makes: every ioctl on
    /// it fails with ENOTTY, as on a block device whose driver has no `pr_ops` and is no NVMe
    /// namespace (the only such fd `open` still gives), which is what the error paths below need.
    fn null_device() -> BlockDevice {
        BlockDevice {
            fd: std::fs::File::open("/dev/null").unwrap().into(),
            path: PathBuf::from("/dev/null"),
        }
    }

    #[test]
    fn a_buffer_against_the_opcodes_direction_is_refused_before_the_ioctl() {
        let device = null_device();
        let second = Duration::from_secs(1);
        // Reservation Report (0x0e) transfers controller to host: a shared buffer is refused.
        let report = NvmeCommand {
            opcode: 0x0e,
            ..NvmeCommand::default()
        };
        let err = device
            .io_passthru(&report, NvmeDataTransfer::ToDevice(&[0; 16]), second)
            .unwrap_err();
        assert!(matches!(err, NvmeError::InvalidRequest { .. }), "{err:?}");
        let register = NvmeCommand {
            opcode: 0x0d,
            ..NvmeCommand::default()
        };
        let err = device
            .io_passthru(
                &register,
                NvmeDataTransfer::FromDevice(&mut [0; 16]),
                second,
            )
            .unwrap_err();
        assert!(matches!(err, NvmeError::InvalidRequest { .. }), "{err:?}");
        let err = device
            .io_passthru(&register, NvmeDataTransfer::None, Duration::ZERO)
            .unwrap_err();
        assert!(matches!(err, NvmeError::InvalidRequest { .. }), "{err:?}");
    }

    #[test]
    fn ioctls_the_device_does_not_take_are_errors_naming_the_ioctl_and_the_path() {
        let device = null_device();
        let err = device.pr_register(0, 1, false).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("IOC_PR_REGISTER") && text.contains("/dev/null"),
            "{text}"
        );
        assert_eq!(err.raw_os_error(), Some(libc::ENOTTY));
        let err = device.nsid().unwrap_err();
        assert!(err.to_string().contains("NVME_IOCTL_ID"), "{err}");
        let mut keys = [0u64; 4];
        assert!(device.pr_read_keys(&mut keys).is_err());
        let mut too_many = vec![0u64; PR_KEYS_MAX + 1];
        assert!(matches!(
            device.pr_read_keys(&mut too_many),
            Err(NvmeError::InvalidRequest { .. })
        ));
    }

    #[test]
    fn device_can_be_shared_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<BlockDevice>();
        send_sync::<NvmeError>();
    }
}
