//! The seam between the fencing logic and the wire: one path to one logical unit, spoken to in
//! persistent-reservation operations rather than raw command bytes.
//!
//! The operations are SCSI's (READ KEYS, PREEMPT AND ABORT…) because that is what the engine
//! reasons in, but nothing here depends on how they travel: what the wire said is kept in an
//! opaque [`TransportDetail`] and what the target announced on the way in [`Event`]s. Two
//! transports implement it: SCSI over SG_IO ([`crate::exec::ScsiPr`]) and NVMe over the block PR
//! ioctls and passthrough ([`crate::exec::NvmePr`]); [`Protocol`] says which a path speaks.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nvme_io::{NvmeStatus, PrStatus};
use serde::Serialize;
use sg_io::{AdditionalSense, DriverStatus, HostStatus, ScsiStatus, Sense};

use crate::pr::{
    Capabilities, FullStatus, PrInAction, PrOut, PrOutAction, ReadKeys, ReadReservation,
};

/// Which persistent-reservation protocol a path speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// SCSI-3 persistent reservations over SG_IO.
    Scsi,
    /// NVMe reservations over the block PR ioctls and NVMe passthrough.
    Nvme,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Scsi => "scsi",
            Protocol::Nvme => "nvme",
        })
    }
}

/// One path (I_T nexus) to a logical unit that can carry persistent-reservation commands.
///
/// A transport implements [`PrTransport::execute`] alone; the typed calls are built on it, so a
/// wrapper that changes one operation (APTPL on REGISTER, a delay in a test) overrides one method.
/// The typed calls drop the reply's events: a caller that acts on them (the CLI reports them, the
/// agent's watch reads 2Ah/05h) calls `execute`.
/// Calls block; async callers run them on a blocking pool. Implementations retry what is safe
/// to retry and classify what is not (see [`crate::exec`] for the SCSI policy).
pub trait PrTransport: Send + Sync {
    /// The path as the user named it, for messages.
    fn device(&self) -> &Path;

    /// The protocol this path speaks, for what a front end says about an answer (an NVMe
    /// "capabilities" answer is built from Identify Namespace, not REPORT CAPABILITIES).
    fn protocol(&self) -> Protocol {
        Protocol::Scsi
    }

    /// Runs one operation. The answer is the request's own variant (READ KEYS → `Keys`…).
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError>;

    /// PERSISTENT RESERVE IN / READ KEYS.
    fn read_keys(&self) -> Result<ReadKeys, CommandError> {
        typed(self, PrRequest::ReadKeys, |answer| match answer {
            PrAnswer::Keys(keys) => Ok(keys),
            other => Err(other),
        })
    }
    /// PERSISTENT RESERVE IN / READ RESERVATION.
    fn read_reservation(&self) -> Result<ReadReservation, CommandError> {
        typed(self, PrRequest::ReadReservation, |answer| match answer {
            PrAnswer::Reservation(reservation) => Ok(reservation),
            other => Err(other),
        })
    }
    /// PERSISTENT RESERVE IN / REPORT CAPABILITIES.
    fn report_capabilities(&self) -> Result<Capabilities, CommandError> {
        typed(self, PrRequest::ReportCapabilities, |answer| match answer {
            PrAnswer::Capabilities(capabilities) => Ok(capabilities),
            other => Err(other),
        })
    }
    /// PERSISTENT RESERVE IN / READ FULL STATUS.
    fn read_full_status(&self) -> Result<FullStatus, CommandError> {
        typed(self, PrRequest::ReadFullStatus, |answer| match answer {
            PrAnswer::FullStatus(status) => Ok(status),
            other => Err(other),
        })
    }
    /// PERSISTENT RESERVE OUT with the given service action and parameters.
    fn pr_out(&self, request: &PrOut) -> Result<PrOutReport, CommandError> {
        typed(self, PrRequest::Out(request), |answer| match answer {
            PrAnswer::Out(report) => Ok(report),
            other => Err(other),
        })
    }
}

/// Runs `request` and takes its answer out with `pick`, which hands back any other variant.
fn typed<T: PrTransport + ?Sized, R>(
    transport: &T,
    request: PrRequest<'_>,
    pick: impl FnOnce(PrAnswer) -> Result<R, PrAnswer>,
) -> Result<R, CommandError> {
    pick(transport.execute(request)?.answer)
        .map_err(|other| CommandError::mismatched(transport.device(), request, &other))
}

/// A shared path is a path: the agent keeps its opened devices in `Arc`s and hands the same ones
/// to the engine.
impl<T: PrTransport + ?Sized> PrTransport for Arc<T> {
    fn device(&self) -> &Path {
        (**self).device()
    }
    fn protocol(&self) -> Protocol {
        (**self).protocol()
    }
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        (**self).execute(request)
    }
}

/// One persistent-reservation operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrRequest<'a> {
    ReadKeys,
    ReadReservation,
    ReportCapabilities,
    ReadFullStatus,
    Out(&'a PrOut),
}

impl PrRequest<'_> {
    /// The command it is sent as, for messages.
    pub fn command(&self) -> Command {
        match self {
            PrRequest::ReadKeys => Command::PrIn(PrInAction::ReadKeys),
            PrRequest::ReadReservation => Command::PrIn(PrInAction::ReadReservation),
            PrRequest::ReportCapabilities => Command::PrIn(PrInAction::ReportCapabilities),
            PrRequest::ReadFullStatus => Command::PrIn(PrInAction::ReadFullStatus),
            PrRequest::Out(out) => Command::PrOut(out.action),
        }
    }
}

/// What an operation returned, one variant per [`PrRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrAnswer {
    Keys(ReadKeys),
    Reservation(ReadReservation),
    Capabilities(Capabilities),
    FullStatus(FullStatus),
    Out(PrOutReport),
}

/// A successful operation: its answer and the events the transport consumed to get it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub answer: PrAnswer,
    /// In the order they came (retries consumed them; the command itself succeeded).
    pub events: Vec<Event>,
}

impl Reply {
    /// An answer that came without events.
    pub fn quiet(answer: PrAnswer) -> Self {
        Reply {
            answer,
            events: Vec::new(),
        }
    }
}

/// Something the target announced to this path between commands: in SCSI a unit attention
/// (2Ah/05h: this nexus's registration was preempted). NVMe announces reservation changes in a
/// log page the kernel does not hand to us, so the NVMe transport ([`crate::exec::nvme`]) returns
/// none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    UnitAttention(AdditionalSense),
}

impl Event {
    /// The target says a registration of this path was removed by another node's PREEMPT.
    pub fn is_registration_preempted(&self) -> bool {
        match self {
            Event::UnitAttention(ua) => *ua == AdditionalSense::REGISTRATIONS_PREEMPTED,
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::UnitAttention(ua) => ua.fmt(f),
        }
    }
}

/// What a successful PERSISTENT RESERVE OUT went through before it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PrOutReport {
    /// The target answered NOT READY but a re-read showed the command had taken effect (LIO
    /// applies REGISTER and then fails it when its APTPL directory is missing).
    pub confirmed_by_reread: bool,
    /// The LU's keys and reservation, read in one look right after the command took effect, when
    /// the transport read them for its own reasons (the NVMe transport after a PREEMPT): a
    /// caller that has sent nothing since can verify with it instead of reading again.
    #[serde(skip)]
    pub observed: Option<(ReadKeys, ReadReservation)>,
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

/// How a command failed, whatever the transport. Each kind calls for a different reaction, so
/// callers match on it; what to tell the operator is each front end's ([`CommandError::hint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The target refused with a reservation conflict: another initiator holds the LU, or our key
    /// is not (any longer) registered on this path.
    ReservationConflict,
    /// The LU has no persistent reservations (SCSI: invalid command operation code).
    NotSupported,
    /// The target refused a field of the request: this service action, type or flag is not
    /// supported, or the request contradicts the LU's state (e.g. release type).
    InvalidField,
    /// The target kept announcing events (SCSI unit attentions) past the retry budget.
    UnitAttention,
    /// The target stayed not ready past the retry budget.
    NotReady,
    /// No completion within the command timeout.
    Timeout,
    /// The path failed below the reservation protocol: the ioctl, the host adapter, the link.
    Transport,
    /// The device could not be opened, or the kernel refused this caller the command (EPERM or
    /// EACCES from SG_IO: no CAP_SYS_RAWIO).
    Open,
    /// The target answered with data that does not parse.
    Malformed,
    /// Any other failure; the transport detail says what.
    Failed,
}

/// What the wire said about a failed command, for people and JSON. Opaque to the engine, which
/// decides on [`ErrorKind`] alone. An enum rather than a boxed trait: the transports are this
/// crate's own, the detail stays `Clone`/`Eq` for tests, and an NVMe variant added here makes the
/// compiler list every place that renders one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportDetail {
    Scsi(ScsiDetail),
    Nvme(NvmeDetail),
}

/// What an NVMe namespace answered ([`crate::exec::nvme`]): through the block PR ioctls only the
/// kernel's summary (`pr_status`) comes back; through passthrough, the NVMe status itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvmeDetail {
    /// A block PR ioctl (IOC_PR_*) returned this `pr_status`.
    Block(PrStatus),
    /// An NVMe passthrough command completed with this status.
    Passthru(NvmeStatus),
}

impl fmt::Display for NvmeDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvmeDetail::Block(status) => status.fmt(f),
            NvmeDetail::Passthru(status) => write!(f, "NVMe status {status}"),
        }
    }
}

/// A SCSI completion as it came back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiDetail {
    pub status: ScsiStatus,
    pub host_status: HostStatus,
    pub driver_status: DriverStatus,
    pub sense: Option<Sense>,
}

impl ScsiDetail {
    /// A completion with `status` and nothing wrong below SCSI.
    pub fn with_status(status: ScsiStatus) -> Self {
        ScsiDetail {
            status,
            host_status: HostStatus::DID_OK,
            driver_status: DriverStatus::OK,
            sense: None,
        }
    }
}

impl TransportDetail {
    /// The command's status in words (SCSI: `RESERVATION CONFLICT (0x18)`).
    pub fn status_text(&self) -> String {
        match self {
            TransportDetail::Scsi(scsi) => scsi.status.to_string(),
            TransportDetail::Nvme(nvme) => nvme.to_string(),
        }
    }

    /// The target's explanation in words, if it gave one (SCSI: the sense data).
    pub fn sense_text(&self) -> Option<String> {
        match self {
            TransportDetail::Scsi(scsi) => scsi.sense.as_ref().map(ToString::to_string),
            // NVMe has no sense data; what more the controller knows is in its error log page.
            TransportDetail::Nvme(_) => None,
        }
    }
}

impl fmt::Display for TransportDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportDetail::Scsi(scsi) => {
                write!(f, "status {}", scsi.status)?;
                if scsi.host_status != HostStatus::DID_OK {
                    write!(f, "; host status {}", scsi.host_status)?;
                }
                if scsi.driver_status != DriverStatus::OK {
                    write!(f, "; driver status {}", scsi.driver_status)?;
                }
                if let Some(sense) = &scsi.sense {
                    write!(f, "; sense {sense}")?;
                }
                Ok(())
            }
            TransportDetail::Nvme(nvme) => write!(f, "status {nvme}"),
        }
    }
}

/// A command that failed on one device: which, what, how, and what the target said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandError {
    pub device: PathBuf,
    pub command: Command,
    pub kind: ErrorKind,
    /// What went wrong in words, beyond the kind (errno, decoder message, timeout value…).
    pub message: String,
    /// The completion behind the failure; None when there was none (open, ioctl, decode).
    pub transport: Option<TransportDetail>,
    /// A suggestion for the operator, set by the front end that shows the error
    /// ([`CommandError::hinted`], on reports `advise`); the engine and the transports never set
    /// one.
    pub hint: Option<&'static str>,
}

/// A front end's advice per error kind, in terms of its own flags or settings.
pub type Hints = fn(ErrorKind) -> &'static str;

impl CommandError {
    /// Whether the failure says the path or the LU is gone, not merely disturbed: no answer
    /// within the timeout, the device could not be opened, the SCSI transport gave up on the
    /// path (DID_NO_CONNECT, DID_TRANSPORT_FAILFAST), or the target no longer offers the LU to
    /// this initiator (LOGICAL UNIT NOT SUPPORTED). Not a path the transport calls disrupted
    /// and recovering (DID_TRANSPORT_DISRUPTED, an NVMe ioctl's EIO): the command may have
    /// reached the target, and the next may too.
    pub fn path_gone(&self) -> bool {
        match (self.kind, &self.transport) {
            (ErrorKind::Timeout | ErrorKind::Open, _) => true,
            (ErrorKind::Transport, Some(TransportDetail::Scsi(detail))) => {
                matches!(
                    detail.host_status,
                    HostStatus::NO_CONNECT | HostStatus::TRANSPORT_FAILFAST
                ) || detail
                    .sense
                    .as_ref()
                    .is_some_and(|s| s.additional() == AdditionalSense::LOGICAL_UNIT_NOT_SUPPORTED)
            }
            _ => false,
        }
    }

    /// A failure with no completion behind it (open, ioctl, decode, fault injection).
    pub fn without_completion(
        device: &Path,
        command: Command,
        kind: ErrorKind,
        message: impl Into<String>,
    ) -> Self {
        CommandError {
            device: device.to_path_buf(),
            command,
            kind,
            message: message.into(),
            transport: None,
            hint: None,
        }
    }

    /// A transport that answered another operation than the one asked (a programming error),
    /// reported like an unparsable answer rather than trusted.
    pub fn mismatched(device: &Path, request: PrRequest<'_>, answer: &PrAnswer) -> Self {
        CommandError::without_completion(
            device,
            request.command(),
            ErrorKind::Malformed,
            format!("the transport answered {answer:?} to this request"),
        )
    }

    /// The error with the front end's hint for its kind (a hint already given is kept).
    pub fn hinted(mut self, hints: Hints) -> Self {
        self.advise(hints);
        self
    }

    /// Gives the error the front end's hint for its kind, in place (a hint already given is
    /// kept).
    pub fn advise(&mut self, hints: Hints) {
        self.hint.get_or_insert_with(|| hints(self.kind));
    }

    /// The command's status in words, if a completion came back.
    pub fn status_text(&self) -> Option<String> {
        self.transport.as_ref().map(TransportDetail::status_text)
    }

    /// The target's explanation (sense data) in words, if there was any.
    pub fn sense_text(&self) -> Option<String> {
        self.transport
            .as_ref()
            .and_then(TransportDetail::sense_text)
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} failed: ", self.device.display(), self.command)?;
        f.write_str(&self.message)?;
        if let Some(transport) = &self.transport {
            write!(f, "; {transport}")?;
        }
        if let Some(hint) = self.hint {
            write!(f, ". Hint: {hint}")?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn conflict() -> CommandError {
        CommandError {
            transport: Some(TransportDetail::Scsi(ScsiDetail::with_status(
                ScsiStatus::RESERVATION_CONFLICT,
            ))),
            ..CommandError::without_completion(
                Path::new("/dev/sdb"),
                Command::PrOut(PrOutAction::Reserve),
                ErrorKind::ReservationConflict,
                "the target refused",
            )
        }
    }

    #[test]
    fn an_error_shows_the_transport_detail_and_only_a_front_ends_hint() {
        let e = conflict();
        assert_eq!(
            e.to_string(),
            "/dev/sdb: PERSISTENT RESERVE OUT (RESERVE) failed: the target refused; status \
             RESERVATION CONFLICT (0x18)"
        );
        assert_eq!(
            e.status_text().as_deref(),
            Some("RESERVATION CONFLICT (0x18)")
        );
        assert_eq!(e.sense_text(), None);
        let first: Hints = |_| "first";
        let second: Hints = |_| "second";
        let hinted = e.hinted(first).hinted(second);
        assert!(
            hinted.to_string().ends_with("(0x18). Hint: first"),
            "{hinted}"
        );
    }
}
