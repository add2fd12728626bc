//! NVMe execution policy: the engine's persistent-reservation operations on an NVMe namespace,
//! through the kernel's block PR ioctls (`IOC_PR_*`) where they can say it and NVMe passthrough
//! where they cannot, with the same contract as [`super::ScsiPr`].
//!
//! Rules:
//! - One function, [`plan`], maps each SCSI PR OUT to NVMe; its doc has the table.
//! - The block ioctls are preferred: they work through native multipath (the kernel picks a
//!   live path); on a read-only open the PR OUT ones need CAP_SYS_ADMIN and the reads (6.19 and
//!   later) only a readable node, where passthrough always needs CAP_SYS_ADMIN. They take no
//!   timeout: the engine's overall deadline and its blocking pool bound them, as they bound a
//!   hung SG_IO. Passthrough commands take [`Policy::timeout`].
//! - READ KEYS uses IOC_PR_READ_KEYS (one Reservation Report on the target) and falls back to a
//!   passthrough Report on kernels without it (ENOTTY or EOPNOTSUPP). READ RESERVATION, and the
//!   keys-and-holder re-reads below, use one passthrough Report where this process may send one:
//!   the kernel's IOC_PR_READ_RESERVATION sends two (the registrant count, then the data). Where
//!   passthrough is refused (EPERM/EACCES: no CAP_SYS_ADMIN), remembered per path, the ioctls.
//! - Reports are never trusted for their length: when REGCTL (or the kernel's key count) says more
//!   exists than fit, the command is re-issued with a larger buffer, a bounded number of times.
//! - NAMESPACE NOT READY (passthrough only: the block interface folds it into an I/O error) is
//!   retried under the one NOT READY rule shared with `ScsiPr` (`exec::retry`): backoff, and
//!   a PR OUT first re-reads whether it already applied.
//! - No events: NVMe reports reservation changes in a log page (Reservation Notification) the
//!   kernel does not pass to user space. A node learns it was preempted from READ KEYS (its key
//!   is gone), which the agent's watch reads every period anyway.
//! - APTPL: NVMe persistence (CPTPL) is the target's setting; the kernel sends "no change" or
//!   "persist" on its own and Linux nvmet ignores it, so a request's APTPL is accepted and has no
//!   effect of ours.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use nvme_io::{
    BlockDevice, NvmeCommand, NvmeCompletion, NvmeDataTransfer, NvmeStatus, PR_KEYS_MAX, PrKeys,
    PrReservation, PrResult, PrStatus, PrType,
};

use crate::pr::nvme::{self as codec, ReportFormat, ReservationCapabilities, ReservationStatus};
use crate::pr::{
    Capabilities, DecodeError, FullStatus, Key, PrInAction, PrOut, PrOutAction, ReadKeys,
    ReadReservation, Registration, Reservation, ReservationType, Scope,
};
use crate::transport::{
    Command, CommandError, ErrorKind, NvmeDetail, Policy, PrAnswer, PrOutReport, PrRequest,
    PrTransport, Reply, TransportDetail,
};

use super::retry::{Retried, Step, effect_visible, retry_not_ready};

/// An NVMe namespace as the transport needs it: a real block device, or a model in unit tests.
/// The methods are [`nvme_io::BlockDevice`]'s.
pub trait NvmeDevice: Send + Sync {
    fn path(&self) -> &Path;
    fn pr_register(
        &self,
        old: u64,
        new: u64,
        ignore_key: bool,
    ) -> Result<PrResult<()>, nvme_io::NvmeError>;
    fn pr_reserve(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::NvmeError>;
    fn pr_release(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::NvmeError>;
    fn pr_preempt(
        &self,
        old: u64,
        new: u64,
        rtype: PrType,
        abort: bool,
    ) -> Result<PrResult<()>, nvme_io::NvmeError>;
    fn pr_clear(&self, key: u64) -> Result<PrResult<()>, nvme_io::NvmeError>;
    fn pr_read_keys(&self, keys: &mut [u64]) -> Result<PrResult<PrKeys>, nvme_io::NvmeError>;
    fn pr_read_reservation(&self) -> Result<PrResult<PrReservation>, nvme_io::NvmeError>;
    fn nsid(&self) -> Result<u32, nvme_io::NvmeError>;
    fn io_passthru(
        &self,
        command: &NvmeCommand,
        data: NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError>;
    fn admin_passthru(
        &self,
        command: &NvmeCommand,
        data: NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError>;
}

impl NvmeDevice for BlockDevice {
    fn path(&self) -> &Path {
        BlockDevice::path(self)
    }
    fn pr_register(
        &self,
        old: u64,
        new: u64,
        ignore_key: bool,
    ) -> Result<PrResult<()>, nvme_io::NvmeError> {
        BlockDevice::pr_register(self, old, new, ignore_key)
    }
    fn pr_reserve(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::NvmeError> {
        BlockDevice::pr_reserve(self, key, rtype)
    }
    fn pr_release(&self, key: u64, rtype: PrType) -> Result<PrResult<()>, nvme_io::NvmeError> {
        BlockDevice::pr_release(self, key, rtype)
    }
    fn pr_preempt(
        &self,
        old: u64,
        new: u64,
        rtype: PrType,
        abort: bool,
    ) -> Result<PrResult<()>, nvme_io::NvmeError> {
        BlockDevice::pr_preempt(self, old, new, rtype, abort)
    }
    fn pr_clear(&self, key: u64) -> Result<PrResult<()>, nvme_io::NvmeError> {
        BlockDevice::pr_clear(self, key)
    }
    fn pr_read_keys(&self, keys: &mut [u64]) -> Result<PrResult<PrKeys>, nvme_io::NvmeError> {
        BlockDevice::pr_read_keys(self, keys)
    }
    fn pr_read_reservation(&self) -> Result<PrResult<PrReservation>, nvme_io::NvmeError> {
        BlockDevice::pr_read_reservation(self)
    }
    fn nsid(&self) -> Result<u32, nvme_io::NvmeError> {
        BlockDevice::nsid(self)
    }
    fn io_passthru(
        &self,
        command: &NvmeCommand,
        data: NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError> {
        BlockDevice::io_passthru(self, command, data, timeout)
    }
    fn admin_passthru(
        &self,
        command: &NvmeCommand,
        data: NvmeDataTransfer<'_>,
        timeout: Duration,
    ) -> Result<NvmeCompletion, nvme_io::NvmeError> {
        BlockDevice::admin_passthru(self, command, data, timeout)
    }
}

/// The block layer's `pr_type` for a SCSI type (numbered like NVMe's RTYPE).
fn pr_type(rtype: ReservationType) -> PrType {
    match rtype {
        ReservationType::WriteExclusive => PrType::WriteExclusive,
        ReservationType::ExclusiveAccess => PrType::ExclusiveAccess,
        ReservationType::WriteExclusiveRegistrantsOnly => PrType::WriteExclusiveRegOnly,
        ReservationType::ExclusiveAccessRegistrantsOnly => PrType::ExclusiveAccessRegOnly,
        ReservationType::WriteExclusiveAllRegistrants => PrType::WriteExclusiveAllRegs,
        ReservationType::ExclusiveAccessAllRegistrants => PrType::ExclusiveAccessAllRegs,
    }
}

/// One NVMe operation a SCSI PR OUT becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmeOp {
    /// IOC_PR_REGISTER(old, new, flags): Reservation Register, RREGA = old ≠ 0 ? replace :
    /// register.
    Register {
        old: Key,
        new: Key,
        ignore_key: bool,
    },
    /// REGISTER AND IGNORE EXISTING KEY with a new key: IOC_PR_REGISTER(new, new, IGNORE)
    /// (replace, IEKEY), and when that conflicts because this host is not registered,
    /// IOC_PR_REGISTER(0, new, IGNORE) (register).
    RegisterIgnoringKey { new: Key },
    /// Passthrough Reservation Register RREGA=1 (the block interface cannot unregister).
    Unregister { key: Key, ignore_key: bool },
    /// IOC_PR_RESERVE: Reservation Acquire, RACQA=0.
    Reserve { key: Key, rtype: ReservationType },
    /// IOC_PR_RELEASE: Reservation Release, RRELA=0.
    Release { key: Key, rtype: ReservationType },
    /// IOC_PR_CLEAR: Reservation Release, RRELA=1.
    Clear { key: Key },
    /// IOC_PR_PREEMPT / IOC_PR_PREEMPT_ABORT: Reservation Acquire, RACQA=1 or 2, CRKEY = our
    /// key, PRKEY = the victim's.
    Preempt {
        key: Key,
        victim: Key,
        rtype: ReservationType,
        abort: bool,
    },
}

/// How each SCSI PR OUT is carried on NVMe: the single place this mapping is decided.
///
/// | SCSI PR OUT                                   | NVMe                                                   |
/// |-----------------------------------------------|--------------------------------------------------------|
/// | REGISTER key=0, sa_key≠0                      | IOC_PR_REGISTER(0, sa_key): Register RREGA=0            |
/// | REGISTER key≠0, sa_key≠0                      | IOC_PR_REGISTER(key, sa_key): Register RREGA=2 (replace)|
/// | REGISTER sa_key=0                             | passthrough Register RREGA=1, CRKEY=key (unregister)    |
/// | REGISTER AND IGNORE EXISTING KEY sa_key≠0     | IOC_PR_REGISTER(sa_key, sa_key, IGNORE) (replace+IEKEY), on conflict IOC_PR_REGISTER(0, sa_key, IGNORE) |
/// | REGISTER AND IGNORE EXISTING KEY sa_key=0     | passthrough Register RREGA=1 with IEKEY                 |
/// | RESERVE                                       | IOC_PR_RESERVE: Acquire RACQA=0                         |
/// | RELEASE                                       | IOC_PR_RELEASE: Release RRELA=0                         |
/// | CLEAR                                         | IOC_PR_CLEAR: Release RRELA=1                           |
/// | PREEMPT / PREEMPT AND ABORT                   | IOC_PR_PREEMPT / _ABORT: Acquire RACQA=1 / 2            |
/// | REGISTER AND MOVE                             | not supported: NVMe has no such command                 |
/// | SPEC_I_PT, ALL_TG_PT                          | not supported: NVMe registers a host (all its controllers) by host id |
/// | APTPL                                         | accepted, no effect: persistence is the target's (CPTPL) |
///
/// Types are translated (SCSI TYPE 1, 3, 5, 6, 7, 8 ↔ NVMe RTYPE 1-6) where the op is sent.
pub fn plan(request: &PrOut) -> Result<NvmeOp, &'static str> {
    if !request.spec_i_pt.is_empty() {
        return Err(
            "NVMe has no SPEC_I_PT: a host registers itself (by host id) on every controller",
        );
    }
    if request.all_tg_pt {
        return Err(
            "NVMe has no ALL_TG_PT: a registration already covers every controller of the host",
        );
    }
    let rtype = || {
        request
            .rtype
            .ok_or("this service action needs a reservation type")
    };
    Ok(match request.action {
        PrOutAction::Register if request.sa_key.is_zero() => NvmeOp::Unregister {
            key: request.key,
            ignore_key: false,
        },
        PrOutAction::Register => NvmeOp::Register {
            old: request.key,
            new: request.sa_key,
            ignore_key: false,
        },
        PrOutAction::RegisterAndIgnoreExistingKey if request.sa_key.is_zero() => {
            NvmeOp::Unregister {
                key: request.key,
                ignore_key: true,
            }
        }
        PrOutAction::RegisterAndIgnoreExistingKey => NvmeOp::RegisterIgnoringKey {
            new: request.sa_key,
        },
        PrOutAction::Reserve => NvmeOp::Reserve {
            key: request.key,
            rtype: rtype()?,
        },
        PrOutAction::Release => NvmeOp::Release {
            key: request.key,
            rtype: rtype()?,
        },
        PrOutAction::Clear => NvmeOp::Clear { key: request.key },
        PrOutAction::Preempt | PrOutAction::PreemptAndAbort => NvmeOp::Preempt {
            key: request.key,
            victim: request.sa_key,
            rtype: rtype()?,
            abort: request.action == PrOutAction::PreemptAndAbort,
        },
        PrOutAction::RegisterAndMove => {
            return Err("NVMe has no REGISTER AND MOVE");
        }
    })
}

/// First key buffer for IOC_PR_READ_KEYS, and first Report size (header and 15 registrants).
const INITIAL_KEYS: usize = 128;
const INITIAL_REPORT_REGISTRANTS: u16 = 15;
/// The most registrants a Report is read for (256 KiB). REGCTL is 16 bits, and the zeros of an
/// unfilled buffer decode as registrants, so a controller claiming 65535 must not be believed
/// into a 4 MiB read of nothing; no real cluster comes near this.
const MAX_REPORT_REGISTRANTS: u16 = 4096;
/// How many times one read may be re-issued while the answer keeps outgrowing the buffer.
const MAX_READ_ROUNDS: usize = 4;

/// A path to an NVMe namespace, spoken to with reservation commands.
#[derive(Debug)]
pub struct NvmePr<D> {
    device: D,
    policy: Policy,
    /// NVME_IOCTL_ID, asked once when a passthrough command first needs it.
    nsid: OnceLock<u32>,
    /// Set when the controller refused the extended Reservation Report.
    report_format: OnceLock<ReportFormat>,
    /// Set when the kernel refused this process a passthrough Report (EPERM/EACCES).
    passthru_refused: OnceLock<()>,
}

impl NvmePr<BlockDevice> {
    /// Opens a namespace block device read-only (enough with CAP_SYS_ADMIN, which NVMe
    /// passthrough needs anyway; no udev change event on close).
    pub fn open(path: &Path, policy: Policy) -> Result<Self, CommandError> {
        let device = BlockDevice::open(path).map_err(|e| {
            CommandError::without_completion(path, Command::Open, ErrorKind::Open, e.to_string())
        })?;
        Ok(NvmePr::new(device, policy))
    }
}

/// Which interface a refusal came from: they need different privileges.
enum Via {
    Block,
    Passthru,
}

impl<D: NvmeDevice> NvmePr<D> {
    pub fn new(device: D, policy: Policy) -> Self {
        NvmePr {
            device,
            policy,
            nsid: OnceLock::new(),
            report_format: OnceLock::new(),
            passthru_refused: OnceLock::new(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn path(&self) -> &Path {
        self.device.path()
    }

    fn error(
        &self,
        command: Command,
        kind: ErrorKind,
        message: impl Into<String>,
        detail: Option<NvmeDetail>,
    ) -> CommandError {
        CommandError {
            transport: detail.map(TransportDetail::Nvme),
            ..CommandError::without_completion(self.path(), command, kind, message)
        }
    }

    /// Classifies an errno from either interface: the single place that decides what a kernel
    /// refusal means for us. ENOTTY and EOPNOTSUPP (the kernel or the device lacks the
    /// operation) are `NotSupported` without a transport detail, which the reads take as the
    /// cue to fall back to passthrough.
    fn errno(&self, command: Command, via: Via, error: &nvme_io::NvmeError) -> CommandError {
        let (kind, why) = match error.raw_os_error() {
            Some(nix::libc::ENOTTY | nix::libc::EOPNOTSUPP) => (
                ErrorKind::NotSupported,
                "this kernel or namespace does not support the operation",
            ),
            Some(nix::libc::EPERM | nix::libc::EACCES) => (
                ErrorKind::Open,
                match via {
                    Via::Block => {
                        "block PR ioctls that change reservations need CAP_SYS_ADMIN on the \
                         read-only open prfence uses; run as root"
                    }
                    Via::Passthru => "NVMe passthrough needs CAP_SYS_ADMIN; run as root",
                },
            ),
            Some(nix::libc::EINVAL) => (
                ErrorKind::InvalidField,
                "the device refused a field (invalid field, opcode or namespace)",
            ),
            Some(nix::libc::ETIMEDOUT) => (ErrorKind::Timeout, "no completion in time"),
            Some(nix::libc::EINTR) => (
                ErrorKind::Transport,
                "cancelled by the kernel (a command timeout, a controller reset or a signal); it may or may not have run",
            ),
            None if matches!(error, nvme_io::NvmeError::InvalidRequest { .. }) => {
                (ErrorKind::Failed, "the request could not be built")
            }
            _ => (
                ErrorKind::Transport,
                "the path failed below the reservation protocol",
            ),
        };
        // nvme-io's own hint would repeat `why`; name the ioctl and the errno, then say why.
        let what = match error {
            nvme_io::NvmeError::Ioctl { ioctl, source, .. } => format!("{ioctl}: {source}"),
            other => other.to_string(),
        };
        self.error(command, kind, format!("{what}; {why}"), None)
    }

    /// Classifies a block PR ioctl's outcome.
    fn block<T>(
        &self,
        command: Command,
        ioctl: &'static str,
        outcome: Result<PrResult<T>, nvme_io::NvmeError>,
    ) -> Result<T, CommandError> {
        let status = match outcome {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(status)) => status,
            Err(e) => return Err(self.errno(command, Via::Block, &e)),
        };
        let (kind, message) = match status {
            PrStatus::RESERVATION_CONFLICT => {
                (ErrorKind::ReservationConflict, "reservation conflict")
            }
            s if s.is_path_failure() => (
                ErrorKind::Transport,
                "the path to the namespace failed (an NVMe path or transport error)",
            ),
            PrStatus::IOERR => (
                ErrorKind::Failed,
                "the namespace answered an error the block PR interface reports only as an I/O error",
            ),
            _ => (ErrorKind::Failed, "unexpected PR status"),
        };
        Err(self.error(
            command,
            kind,
            format!("{ioctl}: {message}"),
            Some(NvmeDetail::Block(status)),
        ))
    }

    /// Classifies a passthrough command's outcome (NAMESPACE NOT READY is left to the retry rule).
    fn passthru(
        &self,
        command: Command,
        what: &str,
        outcome: Result<NvmeCompletion, nvme_io::NvmeError>,
    ) -> Step<(), NvmeStatus> {
        let status = match outcome {
            Ok(done) if done.status.is_success() => return Step::Done(()),
            Ok(done) => done.status,
            Err(e) => return Step::Failed(self.errno(command, Via::Passthru, &e)),
        };
        let (kind, message) = match status.code() {
            NvmeStatus::RESERVATION_CONFLICT => {
                (ErrorKind::ReservationConflict, "reservation conflict")
            }
            NvmeStatus::NAMESPACE_NOT_READY => return Step::NotReady(status),
            NvmeStatus::INVALID_OPCODE => (
                ErrorKind::NotSupported,
                "the namespace does not support reservations",
            ),
            NvmeStatus::INVALID_FIELD
            | NvmeStatus::INVALID_NAMESPACE
            | NvmeStatus::HOST_ID_INCONSISTENT => (
                ErrorKind::InvalidField,
                "the controller refused the request",
            ),
            _ if status.is_path_error() => (
                ErrorKind::Transport,
                "a path error (the controller or its link failed)",
            ),
            _ => (ErrorKind::Failed, "the controller failed the command"),
        };
        Step::Failed(self.error(
            command,
            kind,
            format!("{what}: {message}"),
            Some(NvmeDetail::Passthru(status)),
        ))
    }

    fn nsid(&self, command: Command) -> Result<u32, CommandError> {
        if let Some(nsid) = self.nsid.get() {
            return Ok(*nsid);
        }
        let nsid = self
            .device
            .nsid()
            .map_err(|e| self.errno(command, Via::Passthru, &e))?;
        Ok(*self.nsid.get_or_init(|| nsid))
    }

    /// Runs one passthrough command, retrying NAMESPACE NOT READY under the one rule
    /// ([`retry_not_ready`]); `on_not_ready` says whether the command already took effect
    /// (`Ok(true)`: done, returned as `Ok(false)`). Returns whether the command itself completed
    /// (`true`) or a re-read confirmed it.
    fn run_passthru(
        &self,
        command: Command,
        what: &str,
        mut send: impl FnMut() -> Result<NvmeCompletion, nvme_io::NvmeError>,
        mut on_not_ready: impl FnMut() -> Result<bool, CommandError>,
    ) -> Result<bool, CommandError> {
        let retried = retry_not_ready(
            &self.policy,
            self.path(),
            command,
            &mut (),
            |()| self.passthru(command, what, send()),
            |()| on_not_ready(),
            |status| {
                self.error(
                    command,
                    ErrorKind::NotReady,
                    format!(
                        "{what}: still not ready after {} retries",
                        self.policy.not_ready_retries
                    ),
                    Some(NvmeDetail::Passthru(status)),
                )
            },
        )?;
        Ok(matches!(retried, Retried::Completed(())))
    }

    /// Reservation Report (EDS=1) through passthrough, re-issued while REGCTL says more
    /// registrants exist than fit.
    ///
    /// The extended format (128-bit host ids, which Linux nvmet requires) is asked first; a
    /// controller that refuses it with Host Identifier Inconsistent Format is asked for the
    /// original one (64-bit host ids) from then on.
    fn report(&self, command: Command) -> Result<ReservationStatus, CommandError> {
        let format = self
            .report_format
            .get()
            .copied()
            .unwrap_or(ReportFormat::Extended);
        match self.report_as(command, format) {
            Err(e) if format == ReportFormat::Extended && refused_host_id_format(&e) => {
                tracing::debug!(device = %self.path().display(), "extended Reservation Report refused; using 64-bit host ids");
                let status = self.report_as(command, ReportFormat::Basic)?;
                let _ = self.report_format.set(ReportFormat::Basic);
                Ok(status)
            }
            other => other,
        }
    }

    fn report_as(
        &self,
        command: Command,
        format: ReportFormat,
    ) -> Result<ReservationStatus, CommandError> {
        let nsid = self.nsid(command)?;
        let mut len = format.length(INITIAL_REPORT_REGISTRANTS);
        for _ in 0..MAX_READ_ROUNDS {
            let mut buffer = vec![0u8; len];
            let cmd = NvmeCommand {
                opcode: codec::RESERVATION_REPORT,
                nsid,
                cdw10: codec::report_cdw10(len),
                cdw11: format.cdw11(),
                ..NvmeCommand::default()
            };
            self.run_passthru(
                command,
                "Reservation Report",
                || {
                    self.device.io_passthru(
                        &cmd,
                        NvmeDataTransfer::FromDevice(&mut buffer),
                        self.policy.timeout,
                    )
                },
                || Ok(false),
            )?;
            match ReservationStatus::decode_as(format, &buffer) {
                Ok(status) => return Ok(status),
                Err(DecodeError::Truncated { needed, .. })
                    if needed > format.length(MAX_REPORT_REGISTRANTS) =>
                {
                    return Err(self.error(
                        command,
                        ErrorKind::Malformed,
                        format!(
                            "the Reservation Report claims a {needed}-byte answer, more than the \
                             {MAX_REPORT_REGISTRANTS} registrants this transport reads"
                        ),
                        None,
                    ));
                }
                Err(DecodeError::Truncated { needed, .. }) if needed > len => {
                    tracing::debug!(device = %self.path().display(), needed, "Reservation Report larger than the buffer; re-issuing");
                    len = needed;
                }
                Err(e) => return Err(self.malformed(command, &e)),
            }
        }
        Err(self.error(
            command,
            ErrorKind::Malformed,
            "the Reservation Report kept growing past every buffer offered",
            None,
        ))
    }

    /// One passthrough Report, or `None` where the kernel refuses this process passthrough
    /// (EPERM/EACCES), which is remembered: the caller then reads through the block ioctls.
    fn report_if_allowed(
        &self,
        command: Command,
    ) -> Result<Option<ReservationStatus>, CommandError> {
        if self.passthru_refused.get().is_some() {
            return Ok(None);
        }
        match self.report(command) {
            Ok(status) => Ok(Some(status)),
            Err(e) if e.kind == ErrorKind::Open && e.transport.is_none() => {
                tracing::debug!(device = %self.path().display(), error = %e, "passthrough refused; reading through the block PR ioctls");
                let _ = self.passthru_refused.set(());
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The keys and the reservation at one moment: one Report where allowed, else the two read
    /// ioctls (three Reports on the target).
    fn keys_and_reservation(
        &self,
        command: Command,
    ) -> Result<(ReadKeys, ReadReservation), CommandError> {
        match self.report_if_allowed(command)? {
            Some(status) => Ok((keys_of(&status), self.reservation_of(command, &status)?)),
            None => Ok((self.read_keys()?, self.read_reservation()?)),
        }
    }

    fn malformed(&self, command: Command, e: &DecodeError) -> CommandError {
        self.error(command, ErrorKind::Malformed, e.to_string(), None)
    }

    fn read_keys(&self) -> Result<ReadKeys, CommandError> {
        let command = Command::PrIn(PrInAction::ReadKeys);
        let mut capacity = INITIAL_KEYS;
        for _ in 0..MAX_READ_ROUNDS {
            let mut keys = vec![0u64; capacity];
            let read = match self.block(
                command,
                "IOC_PR_READ_KEYS",
                self.device.pr_read_keys(&mut keys),
            ) {
                Ok(read) => read,
                Err(e) if lacks_ioctl(&e) => return self.read_keys_by_report(command),
                Err(e) => return Err(e),
            };
            let count = usize::try_from(read.num_keys).unwrap_or(usize::MAX);
            if count <= capacity {
                keys.truncate(count);
                return Ok(ReadKeys {
                    generation: read.generation,
                    keys: keys.into_iter().map(Key::new).collect(),
                });
            }
            if capacity >= PR_KEYS_MAX {
                break;
            }
            tracing::debug!(device = %self.path().display(), count, "more keys than the buffer; re-issuing");
            capacity = count.min(PR_KEYS_MAX);
        }
        Err(self.error(
            command,
            ErrorKind::Malformed,
            "the key count kept growing past every buffer offered",
            None,
        ))
    }

    fn read_keys_by_report(&self, command: Command) -> Result<ReadKeys, CommandError> {
        Ok(keys_of(&self.report(command)?))
    }

    /// Under an all-registrants type the key is reported as 0, as SPC requires of READ
    /// RESERVATION (and LIO does): every registrant holds the reservation, and the engine
    /// never compares that key with its own (`ReservationType::is_all_registrants`).
    fn read_reservation(&self) -> Result<ReadReservation, CommandError> {
        let command = Command::PrIn(PrInAction::ReadReservation);
        if let Some(status) = self.report_if_allowed(command)? {
            return self.reservation_of(command, &status);
        }
        let read = match self.block(
            command,
            "IOC_PR_READ_RESERVATION",
            self.device.pr_read_reservation(),
        ) {
            Ok(read) => read,
            Err(e) if lacks_ioctl(&e) => return self.read_reservation_by_report(command),
            Err(e) => return Err(e),
        };
        let reservation = match read.rtype {
            0 => None,
            code => {
                let rtype = u8::try_from(code)
                    .ok()
                    .and_then(codec::scsi_type)
                    .ok_or_else(|| {
                        self.error(
                            command,
                            ErrorKind::Malformed,
                            format!("IOC_PR_READ_RESERVATION returned unknown type {code}"),
                            None,
                        )
                    })?;
                Some(held(rtype, Key::new(read.key)))
            }
        };
        Ok(ReadReservation {
            generation: read.generation,
            reservation,
        })
    }

    fn read_reservation_by_report(
        &self,
        command: Command,
    ) -> Result<ReadReservation, CommandError> {
        self.reservation_of(command, &self.report(command)?)
    }

    /// READ RESERVATION as a Report shows it.
    fn reservation_of(
        &self,
        command: Command,
        status: &ReservationStatus,
    ) -> Result<ReadReservation, CommandError> {
        let reservation = match status.rtype {
            None => None,
            Some(rtype) => {
                let holder = status.registrants.iter().find(|r| r.holder);
                match holder {
                    Some(h) => Some(held(rtype, h.key)),
                    None if rtype.is_all_registrants() => Some(held(rtype, Key::ZERO)),
                    None => {
                        return Err(self.error(
                            command,
                            ErrorKind::Malformed,
                            format!("the Reservation Report names type {rtype} but no holder"),
                            None,
                        ));
                    }
                }
            }
        };
        Ok(ReadReservation {
            generation: status.generation,
            reservation,
        })
    }

    /// READ FULL STATUS from the Report: one registration per registrant, named by host id; the
    /// relative target port field carries the controller id (CNTLID).
    fn read_full_status(&self) -> Result<FullStatus, CommandError> {
        let command = Command::PrIn(PrInAction::ReadFullStatus);
        let status = self.report(command)?;
        let registrations = status
            .registrants
            .iter()
            .map(|r| Registration {
                key: r.key,
                // A host's registration covers all its controllers; there is no per-port
                // registration to flag.
                all_tg_pt: false,
                holder: r.holder,
                scope: r.holder.then_some(Scope::LogicalUnit),
                rtype: if r.holder { status.rtype } else { None },
                relative_target_port: r.cntlid,
                transport_id: codec::host_transport_id(r),
            })
            .collect();
        Ok(FullStatus {
            generation: status.generation,
            registrations,
        })
    }

    /// REPORT CAPABILITIES from Identify Namespace RESCAP: NVMe has no such command. The
    /// supported types and PTPL capability are RESCAP's; PTPL activated is the Report's PTPLS.
    /// SIP_C and ATP_C are false (NVMe has neither SPEC_I_PT nor ALL_TG_PT: a host registers all
    /// its controllers at once), CRH and RLR_C have no NVMe meaning and are false, and no
    /// ALLOW COMMANDS value is reported.
    fn report_capabilities(&self) -> Result<Capabilities, CommandError> {
        let command = Command::PrIn(PrInAction::ReportCapabilities);
        let nsid = self.nsid(command)?;
        let mut identify = vec![0u8; codec::IDENTIFY_LEN];
        let cmd = NvmeCommand {
            opcode: codec::IDENTIFY,
            nsid,
            // CNS 0: Identify Namespace.
            cdw10: 0,
            ..NvmeCommand::default()
        };
        self.run_passthru(
            command,
            "Identify Namespace",
            || {
                self.device.admin_passthru(
                    &cmd,
                    NvmeDataTransfer::FromDevice(&mut identify),
                    self.policy.timeout,
                )
            },
            || Ok(false),
        )?;
        let rescap = ReservationCapabilities::decode_identify(&identify)
            .map_err(|e| self.malformed(command, &e))?;
        if rescap.types.is_empty() {
            return Err(self.error(
                command,
                ErrorKind::NotSupported,
                "Identify Namespace reports no reservation types (RESCAP 0): the namespace has no reservations",
                None,
            ));
        }
        let ptpl_a = self.report(command)?.ptpl;
        Ok(Capabilities {
            rlr_c: false,
            crh: false,
            sip_c: false,
            atp_c: false,
            ptpl_c: rescap.ptpl,
            tmv: true,
            allow_commands: 0,
            ptpl_a,
            supported_types: Some(rescap.types),
        })
    }

    fn pr_out(&self, request: &PrOut) -> Result<PrOutReport, CommandError> {
        let command = Command::PrOut(request.action);
        let op =
            plan(request).map_err(|why| self.error(command, ErrorKind::NotSupported, why, None))?;
        let done = |outcome: Result<(), CommandError>| outcome.map(|()| PrOutReport::default());
        match op {
            NvmeOp::Register {
                old,
                new,
                ignore_key,
            } => done(self.block(
                command,
                "IOC_PR_REGISTER",
                self.device.pr_register(old.get(), new.get(), ignore_key),
            )),
            NvmeOp::RegisterIgnoringKey { new } => {
                let replace = self.block(
                    command,
                    "IOC_PR_REGISTER",
                    self.device.pr_register(new.get(), new.get(), true),
                );
                match replace {
                    // Replace needs an existing registration; a host without one registers.
                    Err(e) if e.kind == ErrorKind::ReservationConflict => done(self.block(
                        command,
                        "IOC_PR_REGISTER",
                        self.device.pr_register(0, new.get(), true),
                    )),
                    other => done(other),
                }
            }
            NvmeOp::Unregister { key, ignore_key } => self.unregister(request, key, ignore_key),
            NvmeOp::Reserve { key, rtype } => done(self.block(
                command,
                "IOC_PR_RESERVE",
                self.device.pr_reserve(key.get(), pr_type(rtype)),
            )),
            NvmeOp::Release { key, rtype } => done(self.block(
                command,
                "IOC_PR_RELEASE",
                self.device.pr_release(key.get(), pr_type(rtype)),
            )),
            NvmeOp::Clear { key } => {
                done(self.block(command, "IOC_PR_CLEAR", self.device.pr_clear(key.get())))
            }
            NvmeOp::Preempt {
                key,
                victim,
                rtype,
                abort,
            } => self.preempt(command, key, victim, rtype, abort),
        }
    }

    /// IOC_PR_PREEMPT[_ABORT], and what a holder needs on Linux nvmet.
    ///
    /// NVMe (like SPC) has a PREEMPT whose PRKEY is not the holder's remove the registrants with
    /// that key and leave the reservation as it is, whoever sends it. Linux nvmet (6.13 to 7.2 at
    /// least, `nvmet_pr_preempt`) handles a PREEMPT from the reservation holder as a change of
    /// type only, whatever PRKEY says: it answers success and the victim stays registered. A fence
    /// from the node that holds the reservation would verify, find the victim, and fail.
    ///
    /// So when we held a registrants-only reservation and the victim is still registered after a
    /// successful PREEMPT, the holder turns the reservation into its all-registrants twin (WE-RO
    /// into WE-AR, EA-RO into EA-AR: the same access for registrants and for everyone else, so no
    /// host gains or loses access) by preempting itself, and preempts the victim under that type,
    /// where nvmet removes the registrants with PRKEY. Each step is one atomic command on the
    /// target, so a victim preempting us at the same time wins or loses whole (P2): if it removed
    /// our key first, our next step answers RESERVATION CONFLICT. The reservation stays
    /// all-registrants afterwards; READ RESERVATION shows it. Under Write Exclusive or Exclusive
    /// Access no twin keeps access as it was, and the target's refusal is reported instead.
    ///
    /// The look that shows the victim gone is the LU's state after the command, returned in
    /// [`PrOutReport::observed`]; after the twin's two commands there is none.
    fn preempt(
        &self,
        command: Command,
        key: Key,
        victim: Key,
        rtype: ReservationType,
        abort: bool,
    ) -> Result<PrOutReport, CommandError> {
        let preempt = |prkey: Key, rtype: ReservationType, abort: bool| {
            self.block(
                command,
                if abort {
                    "IOC_PR_PREEMPT_ABORT"
                } else {
                    "IOC_PR_PREEMPT"
                },
                self.device
                    .pr_preempt(key.get(), prkey.get(), pr_type(rtype), abort),
            )
        };
        preempt(victim, rtype, abort)?;
        if victim == key || victim.is_zero() {
            return Ok(PrOutReport::default());
        }
        let (keys, reservation) = self.keys_and_reservation(command)?;
        if !keys.keys.contains(&victim) {
            return Ok(PrOutReport {
                observed: Some((keys, reservation)),
                ..PrOutReport::default()
            });
        }
        let held_by_us = match &reservation.reservation {
            Some(r) if r.key == key && !r.rtype.is_all_registrants() => Some(r.rtype),
            _ => None,
        };
        let Some(held) = held_by_us else {
            // Not ours to compensate (another holder, a victim that registered again): the
            // engine's verification judges what the target shows.
            return Ok(PrOutReport {
                observed: Some((keys, reservation)),
                ..PrOutReport::default()
            });
        };
        let twin = match held {
            ReservationType::WriteExclusiveRegistrantsOnly => {
                ReservationType::WriteExclusiveAllRegistrants
            }
            ReservationType::ExclusiveAccessRegistrantsOnly => {
                ReservationType::ExclusiveAccessAllRegistrants
            }
            other => {
                return Err(self.error(
                    command,
                    ErrorKind::Failed,
                    format!(
                        "the target answered success but {victim} is still registered: it ignores \
                         PRKEY in a PREEMPT from the reservation holder (Linux nvmet does), and \
                         under {} no all-registrants type keeps access as it is",
                        other.short_name()
                    ),
                    None,
                ));
            }
        };
        tracing::debug!(device = %self.path().display(), %victim, from = held.short_name(), to = twin.short_name(),
            "the holder's PREEMPT left the victim registered (nvmet): preempting under the all-registrants type");
        preempt(key, twin, false)?;
        preempt(victim, twin, abort)?;
        Ok(PrOutReport::default())
    }

    /// Reservation Register RREGA=1 through passthrough. NOT READY is re-read before a retry:
    /// a retried unregister whose first attempt applied would conflict.
    fn unregister(
        &self,
        request: &PrOut,
        key: Key,
        ignore_key: bool,
    ) -> Result<PrOutReport, CommandError> {
        let command = Command::PrOut(request.action);
        let nsid = self.nsid(command)?;
        let data = codec::register_data(key, Key::ZERO);
        let cmd = NvmeCommand {
            opcode: codec::RESERVATION_REGISTER,
            nsid,
            cdw10: codec::register_cdw10(codec::RegisterAction::Unregister, ignore_key),
            ..NvmeCommand::default()
        };
        let completed = self.run_passthru(
            command,
            "Reservation Register (unregister)",
            || {
                self.device.io_passthru(
                    &cmd,
                    NvmeDataTransfer::ToDevice(&data),
                    self.policy.timeout,
                )
            },
            || {
                let (keys, reservation) = self.keys_and_reservation(command)?;
                Ok(effect_visible(request, &keys, &reservation))
            },
        )?;
        Ok(PrOutReport {
            confirmed_by_reread: !completed,
            ..PrOutReport::default()
        })
    }
}

/// READ KEYS as a Report shows it.
fn keys_of(status: &ReservationStatus) -> ReadKeys {
    ReadKeys {
        generation: status.generation,
        keys: status.keys(),
    }
}

fn held(rtype: ReservationType, key: Key) -> Reservation {
    Reservation {
        key: if rtype.is_all_registrants() {
            Key::ZERO
        } else {
            key
        },
        rtype,
        scope: Scope::LogicalUnit,
    }
}

/// The controller answered Host Identifier Inconsistent Format: it cannot report this format.
fn refused_host_id_format(e: &CommandError) -> bool {
    matches!(
        e.transport,
        Some(TransportDetail::Nvme(NvmeDetail::Passthru(status)))
            if status.code() == NvmeStatus::HOST_ID_INCONSISTENT
    )
}

/// The kernel lacks the ioctl (ENOTTY/EOPNOTSUPP, classified without a device status): a read
/// falls back to a passthrough Report.
fn lacks_ioctl(e: &CommandError) -> bool {
    e.kind == ErrorKind::NotSupported && e.transport.is_none()
}

impl<D: NvmeDevice> PrTransport for NvmePr<D> {
    fn device(&self) -> &Path {
        self.path()
    }

    fn protocol(&self) -> crate::transport::Protocol {
        crate::transport::Protocol::Nvme
    }

    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        let answer = match request {
            PrRequest::ReadKeys => PrAnswer::Keys(self.read_keys()?),
            PrRequest::ReadReservation => PrAnswer::Reservation(self.read_reservation()?),
            PrRequest::ReportCapabilities => PrAnswer::Capabilities(self.report_capabilities()?),
            PrRequest::ReadFullStatus => PrAnswer::FullStatus(self.read_full_status()?),
            PrRequest::Out(out) => PrAnswer::Out(self.pr_out(out)?),
        };
        Ok(Reply::quiet(answer))
    }
}

#[cfg(test)]
mod tests;
