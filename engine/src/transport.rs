//! The seam between the fencing logic and the wire: one path to one logical unit, spoken to in
//! persistent-reservation operations rather than raw command bytes.
//!
//! The operations are SCSI's (READ KEYS, PREEMPT AND ABORT…) because that is what the engine
//! reasons in, but nothing here names a CDB or a sense buffer beyond the error report, so an NVMe
//! reservation transport (or the kernel's IOC_PR_* ioctls) can implement the same trait later.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use sg_io::{DriverStatus, HostStatus, ScsiStatus, Sense};

use crate::pr::{
    Capabilities, FullStatus, PrInAction, PrOut, PrOutAction, ReadKeys, ReadReservation,
};

/// One path (I_T nexus) to a logical unit that can carry persistent-reservation commands.
///
/// Calls block; async callers run them on a blocking pool. Implementations retry what is safe
/// to retry and classify what is not (see [`crate::exec`] for the SCSI policy).
pub trait PrTransport: Send + Sync {
    /// The path as the user named it, for messages.
    fn device(&self) -> &Path;
    /// PERSISTENT RESERVE IN / READ KEYS.
    fn read_keys(&self) -> Result<ReadKeys, CommandError>;
    /// PERSISTENT RESERVE IN / READ RESERVATION.
    fn read_reservation(&self) -> Result<ReadReservation, CommandError>;
    /// PERSISTENT RESERVE IN / REPORT CAPABILITIES.
    fn report_capabilities(&self) -> Result<Capabilities, CommandError>;
    /// PERSISTENT RESERVE IN / READ FULL STATUS.
    fn read_full_status(&self) -> Result<FullStatus, CommandError>;
    /// PERSISTENT RESERVE OUT with the given service action and parameters.
    fn pr_out(&self, request: &PrOut) -> Result<PrOutReport, CommandError>;
}

/// What a successful PERSISTENT RESERVE OUT went through before it succeeded. (Unit attentions
/// consumed on the way are kept by the transport: [`crate::exec::ScsiPr::take_unit_attentions`].)
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PrOutReport {
    /// The target answered NOT READY but a re-read showed the command had taken effect (LIO
    /// applies REGISTER and then fails it when its APTPL directory is missing).
    pub confirmed_by_reread: bool,
}

/// The command a failure belongs to, for messages and JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Opening the device node, before any command.
    Open,
    PrIn(PrInAction),
    PrOut(PrOutAction),
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Open => f.write_str("open"),
            Command::PrIn(a) => write!(f, "PERSISTENT RESERVE IN ({})", a.name()),
            Command::PrOut(a) => write!(f, "PERSISTENT RESERVE OUT ({})", a.name()),
        }
    }
}

/// How a command failed. Each kind calls for a different reaction, so callers match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Status RESERVATION CONFLICT: another nexus holds the LU, or our key is not (any longer)
    /// registered on this path.
    ReservationConflict,
    /// ILLEGAL REQUEST, invalid command operation code: the LU has no persistent reservations.
    NotSupported,
    /// ILLEGAL REQUEST, invalid field in the CDB or parameter list: this service action, type or
    /// flag is not supported, or the request contradicts the LU's state (e.g. release type).
    InvalidField,
    /// Unit attentions kept coming after the retry budget.
    UnitAttention,
    /// NOT READY after the retry budget.
    NotReady,
    /// No completion within the command timeout.
    Timeout,
    /// The path failed below SCSI: the ioctl, the host adapter or the transport.
    Transport,
    /// The device could not be opened, or the kernel refused this caller the command (EPERM or
    /// EACCES from SG_IO: no CAP_SYS_RAWIO).
    Open,
    /// The target answered with data that does not parse.
    Malformed,
    /// Any other CHECK CONDITION or status.
    Failed,
}

impl ErrorKind {
    /// A one-line suggestion for the operator.
    pub fn hint(self) -> &'static str {
        match self {
            ErrorKind::ReservationConflict => {
                "another initiator holds the reservation, or this path's key is not registered \
                 (was this node fenced?); check with `prfence keys` and `prfence reservation`"
            }
            ErrorKind::NotSupported => {
                "the LU does not implement persistent reservations (LIO: attrib/emulate_pr=0; \
                 hypervisor disks need PR pass-through); fence with a PR-capable LU"
            }
            ErrorKind::InvalidField => {
                "the target rejected a field: the service action, reservation type or flag is \
                 unsupported, or does not match the LU's state; see `prfence capabilities` and \
                 `prfence reservation`"
            }
            ErrorKind::UnitAttention => {
                "the LU kept reporting unit attentions (resets or state changes); retry, and \
                 check the target's logs if it persists"
            }
            ErrorKind::NotReady => {
                "the LU is not ready; LIO also answers NOT READY for PR OUT from an unregistered \
                 path and when its <dbroot>/pr directory is missing"
            }
            ErrorKind::Timeout => {
                "no answer within the command timeout; the path may be dead: check the session \
                 (iscsiadm -m session, multipath -ll) or raise --timeout"
            }
            ErrorKind::Transport => {
                "the path failed below SCSI (no device, link down, host adapter error); check the \
                 session and the device node"
            }
            ErrorKind::Open => {
                "the device could not be opened or used: the node must exist and be readable by \
                 this user (group `disk`), and SG_IO for persistent reservations needs \
                 CAP_SYS_RAWIO (root has it; or setpriv/AmbientCapabilities=CAP_SYS_RAWIO)"
            }
            ErrorKind::Malformed => {
                "the target returned persistent-reservation data that does not parse; capture it \
                 with `sg_persist -H` and report it"
            }
            ErrorKind::Failed => "the command failed; the sense data says why",
        }
    }
}

/// A command that failed on one device: which, what, how, and what the target said.
#[derive(Debug, Clone)]
pub struct CommandError {
    pub device: PathBuf,
    pub command: Command,
    pub kind: ErrorKind,
    pub status: Option<ScsiStatus>,
    pub host_status: Option<HostStatus>,
    pub driver_status: Option<DriverStatus>,
    pub sense: Option<Sense>,
    /// What went wrong in words, beyond the kind (errno, decoder message, timeout value…).
    pub detail: String,
}

impl CommandError {
    /// A failure with no SCSI completion behind it (open, ioctl, decode, fault injection).
    pub fn without_completion(
        device: &Path,
        command: Command,
        kind: ErrorKind,
        detail: impl Into<String>,
    ) -> Self {
        CommandError {
            device: device.to_path_buf(),
            command,
            kind,
            status: None,
            host_status: None,
            driver_status: None,
            sense: None,
            detail: detail.into(),
        }
    }

    /// The sense data in words, if there was any.
    pub fn sense_text(&self) -> Option<String> {
        self.sense.as_ref().map(ToString::to_string)
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} failed: ", self.device.display(), self.command)?;
        f.write_str(&self.detail)?;
        if let Some(status) = self.status {
            write!(f, "; status {status}")?;
        }
        if let Some(host) = self.host_status.filter(|h| *h != HostStatus::DID_OK) {
            write!(f, "; host status {host}")?;
        }
        if let Some(driver) = self.driver_status.filter(|d| *d != DriverStatus::OK) {
            write!(f, "; driver status {driver}")?;
        }
        if let Some(sense) = &self.sense {
            write!(f, "; sense {sense}")?;
        }
        write!(f, ". Hint: {}", self.kind.hint())
    }
}

impl std::error::Error for CommandError {}

/// Per-command limits every transport honours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// How long one command may take before it counts as a timeout.
    pub timeout: Duration,
    /// How many unit attentions in a row are consumed before giving up.
    pub unit_attention_retries: u32,
    /// How many NOT READY answers are retried (with backoff) before giving up.
    pub not_ready_retries: u32,
    /// First wait after NOT READY; doubles each time.
    pub not_ready_backoff: Duration,
}

impl Policy {
    /// The default per-command timeout: long enough for a busy array, short enough that one
    /// dead path cannot eat Pacemaker's 60 s fence timeout on its own.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            timeout: Self::DEFAULT_TIMEOUT,
            unit_attention_retries: 8,
            not_ready_retries: 5,
            not_ready_backoff: Duration::from_millis(50),
        }
    }
}
