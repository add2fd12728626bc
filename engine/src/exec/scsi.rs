//! SCSI execution policy: persistent-reservation operations over any [`ScsiDevice`], with the
//! retry and classification rules in one place (NOT READY's in `exec::retry`, shared with
//! NVMe).
//!
//! Rules (issue #3, "execution policy"):
//! - UNIT ATTENTION means the command was not executed: retry it, a bounded number of times, and
//!   return what the attention said in the reply's events (2Ah/05h tells a node it was preempted).
//! - NOT READY is transient: PR IN is retried with backoff. A PR OUT answered NOT READY may have
//!   been applied anyway (LIO does this), so before retrying we re-read the target and stop if
//!   the request's effect is already visible; a blind retry could conflict with our own change.
//! - Everything else is classified into an [`ErrorKind`] and returned with the full evidence.
//! - PR IN responses are never trusted for their length: when ADDITIONAL LENGTH says more data
//!   exists than was allocated, the command is re-issued once with a larger (bounded) allocation.
//! - A REGISTER keeps the LU's persist-through-power-loss state unless it asks for APTPL itself
//!   ([`ScsiPr::keeping_ptpl`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sg_io::{
    AdditionalSense, Completion, DataTransfer, Device, DriverStatus, HostStatus, ScsiStatus,
    SenseKey,
};

use crate::pr::{
    self, Capabilities, DecodeError, FullStatus, PrInAction, PrOut, PrOutAction, ReadKeys,
    ReadReservation,
};
use crate::transport::{
    Command, CommandError, ErrorKind, Event, Policy, PrAnswer, PrOutReport, PrRequest, PrTransport,
    Reply, ScsiDetail, TransportDetail,
};

use super::retry::{Retried, Step, effect_visible, retry_not_ready};

/// Something that executes one SCSI command: a real SG_IO device, or a model in unit tests.
pub trait ScsiDevice: Send + Sync {
    fn path(&self) -> &Path;
    fn execute(
        &self,
        cdb: &[u8],
        data: DataTransfer<'_>,
        timeout: Duration,
    ) -> Result<Completion, sg_io::Error>;
}

impl ScsiDevice for Device {
    fn path(&self) -> &Path {
        Device::path(self)
    }
    fn execute(
        &self,
        cdb: &[u8],
        data: DataTransfer<'_>,
        timeout: Duration,
    ) -> Result<Completion, sg_io::Error> {
        Device::execute(self, cdb, data, timeout)
    }
}

/// First allocation for each PR IN action: enough for the common case in one round trip
/// (READ KEYS: 127 keys; READ FULL STATUS: a few dozen iSCSI registrations).
fn initial_allocation(action: PrInAction) -> u16 {
    match action {
        PrInAction::ReadKeys => 1024,
        PrInAction::ReadReservation => 24,
        PrInAction::ReportCapabilities => 8,
        PrInAction::ReadFullStatus => 8192,
    }
}

/// A path to a logical unit, spoken to with SCSI persistent-reservation commands.
#[derive(Debug)]
pub struct ScsiPr<D> {
    device: D,
    policy: Policy,
}

impl ScsiPr<Device> {
    /// Opens a device node for persistent-reservation commands. Read-only is enough for SG_IO
    /// (with CAP_SYS_RAWIO) and does not trigger udev change events on close.
    pub fn open(path: &Path, policy: Policy) -> Result<Self, CommandError> {
        let device = Device::open(path, sg_io::OpenMode::ReadOnly).map_err(|e| {
            CommandError::without_completion(path, Command::Open, ErrorKind::Open, e.to_string())
        })?;
        Ok(ScsiPr::new(device, policy))
    }
}

/// What one command attempt came to after classification.
enum Attempt {
    Good(usize),
    UnitAttention(AdditionalSense),
    NotReady,
    Failed(CommandError),
}

impl<D: ScsiDevice> ScsiPr<D> {
    pub fn new(device: D, policy: Policy) -> Self {
        ScsiPr { device, policy }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Runs one command once and classifies the completion.
    fn attempt(&self, command: Command, cdb: &[u8], data: DataTransfer<'_>) -> Attempt {
        let requested = match &data {
            DataTransfer::None => 0,
            DataTransfer::ToDevice(b) => b.len(),
            DataTransfer::FromDevice(b) => b.len(),
        };
        let completion = match self.device.execute(cdb, data, self.policy.timeout) {
            Ok(c) => c,
            Err(e) => {
                let kind = match &e {
                    sg_io::Error::Open { .. } => ErrorKind::Open,
                    // not a path failure: the kernel refused this caller (CAP_SYS_RAWIO)
                    sg_io::Error::Ioctl { source, .. }
                        if matches!(
                            source.raw_os_error(),
                            Some(nix::libc::EPERM | nix::libc::EACCES)
                        ) =>
                    {
                        ErrorKind::Open
                    }
                    _ => ErrorKind::Transport,
                };
                return Attempt::Failed(CommandError::without_completion(
                    self.device.path(),
                    command,
                    kind,
                    e.to_string(),
                ));
            }
        };
        classify(
            self.device.path(),
            command,
            &completion,
            requested,
            self.policy.timeout,
        )
    }

    /// Runs a command, consuming unit attentions (into `events`) and retrying NOT READY under
    /// the one rule ([`retry_not_ready`]); `on_not_ready` decides whether a NOT READY answer
    /// should be retried (`Ok(false)`) or counts as done (`Ok(true)`, returned as `Ok(None)`: no
    /// data, confirmed by re-reading).
    fn run(
        &self,
        command: Command,
        cdb: &[u8],
        mut buffer: Option<&mut [u8]>,
        parameters: Option<&[u8]>,
        on_not_ready: impl FnMut(&mut Vec<Event>) -> Result<bool, CommandError>,
        events: &mut Vec<Event>,
    ) -> Result<Option<usize>, CommandError> {
        let mut unit_attentions = 0;
        let attempt = |events: &mut Vec<Event>| {
            let data = match (&mut buffer, parameters) {
                (Some(buf), _) => DataTransfer::FromDevice(buf),
                (None, Some(p)) => DataTransfer::ToDevice(p),
                (None, None) => DataTransfer::None,
            };
            match self.attempt(command, cdb, data) {
                Attempt::Good(n) => Step::Done(n),
                Attempt::Failed(e) => Step::Failed(e),
                Attempt::UnitAttention(ua) => {
                    tracing::debug!(device = %self.device.path().display(), %command, unit_attention = %ua, "unit attention consumed; retrying");
                    events.push(Event::UnitAttention(ua));
                    unit_attentions += 1;
                    if unit_attentions > self.policy.unit_attention_retries {
                        return Step::Failed(CommandError::without_completion(
                            self.device.path(),
                            command,
                            ErrorKind::UnitAttention,
                            format!("{unit_attentions} unit attentions in a row, the last {ua}"),
                        ));
                    }
                    Step::Again
                }
                Attempt::NotReady => Step::NotReady(()),
            }
        };
        let exhausted = |()| {
            CommandError::without_completion(
                self.device.path(),
                command,
                ErrorKind::NotReady,
                format!(
                    "still NOT READY after {} retries",
                    self.policy.not_ready_retries
                ),
            )
        };
        let retried = retry_not_ready(
            &self.policy,
            self.device.path(),
            command,
            events,
            attempt,
            on_not_ready,
            exhausted,
        )?;
        Ok(match retried {
            Retried::Completed(received) => Some(received),
            Retried::AlreadyApplied => None,
        })
    }

    /// PR IN with re-issue when the target has more data than fit.
    fn pr_in<T>(
        &self,
        action: PrInAction,
        decode: impl Fn(&[u8]) -> Result<T, DecodeError>,
        events: &mut Vec<Event>,
    ) -> Result<T, CommandError> {
        let command = Command::PrIn(action);
        let mut allocation = initial_allocation(action);
        // Bounded: each round must grow the allocation, and it cannot pass the 16-bit field, so a
        // target whose answer keeps changing is decoded as it stands after a few rounds.
        for _ in 0..MAX_PR_IN_ROUNDS {
            let mut buffer = vec![0u8; usize::from(allocation)];
            let cdb = pr::pr_in_cdb(action, allocation);
            let received = self
                .run(
                    command,
                    &cdb,
                    Some(&mut buffer),
                    None,
                    |_| Ok(false),
                    events,
                )?
                .unwrap_or(0);
            let data = buffer.get(..received).unwrap_or(&buffer);
            let grown = pr::next_allocation_length(action, usize::from(allocation), data)
                .map(|next| u16::try_from(next).unwrap_or(u16::MAX))
                .filter(|next| *next > allocation);
            match grown {
                Some(next) => {
                    tracing::debug!(device = %self.device.path().display(), %command, next, "response larger than the allocation; re-issuing");
                    allocation = next;
                }
                None => {
                    return decode(data).map_err(|e| {
                        CommandError::without_completion(
                            self.device.path(),
                            command,
                            ErrorKind::Malformed,
                            e.to_string(),
                        )
                    });
                }
            }
        }
        Err(CommandError::without_completion(
            self.device.path(),
            command,
            ErrorKind::Malformed,
            "the response kept growing past every allocation length offered",
        ))
    }
}

/// How many times one PR IN may be issued while its response keeps outgrowing the allocation.
const MAX_PR_IN_ROUNDS: usize = 4;

impl<D: ScsiDevice> ScsiPr<D> {
    /// The request with APTPL set when it registers a key without asking for APTPL and the LU
    /// persists through power loss now (PTPL_A of REPORT CAPABILITIES, read just before); `None`
    /// to send it as it is. Why: the APTPL bit of the last REGISTER or REGISTER AND IGNORE
    /// EXISTING KEY decides for every registration of the LU whether it survives a power loss
    /// (SPC-4's APTPL bit; LIO does so), so a REGISTER with APTPL=0 (an unfence, the agent's path
    /// probe, a heal, a lease renewal) would silently undo another node's `aptpl=1`, and a target
    /// restart would then forget every fence (LIO applies the bit of an unregister too). A target
    /// that cannot report its capabilities has no state to read: the request is sent as asked.
    fn keeping_ptpl(
        &self,
        request: &PrOut,
        events: &mut Vec<Event>,
    ) -> Result<Option<PrOut>, CommandError> {
        let registers = matches!(
            request.action,
            PrOutAction::Register | PrOutAction::RegisterAndIgnoreExistingKey
        );
        if !registers || request.aptpl {
            return Ok(None);
        }
        match self.pr_in(PrInAction::ReportCapabilities, Capabilities::decode, events) {
            Ok(capabilities) if capabilities.ptpl_a => Ok(Some(request.clone().with_aptpl(true))),
            Ok(_) => Ok(None),
            Err(e) if matches!(e.kind, ErrorKind::NotSupported | ErrorKind::InvalidField) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    fn pr_out_with(
        &self,
        request: &PrOut,
        events: &mut Vec<Event>,
    ) -> Result<PrOutReport, CommandError> {
        let kept = self.keeping_ptpl(request, events)?;
        let request = kept.as_ref().unwrap_or(request);
        let command = Command::PrOut(request.action);
        let encoded = request.encode().map_err(|e| {
            CommandError::without_completion(
                self.device.path(),
                command,
                ErrorKind::InvalidField,
                e.to_string(),
            )
        })?;
        let reread = |events: &mut Vec<Event>| -> Result<bool, CommandError> {
            let keys = self.pr_in(PrInAction::ReadKeys, ReadKeys::decode, events)?;
            let reservation =
                self.pr_in(PrInAction::ReadReservation, ReadReservation::decode, events)?;
            Ok(effect_visible(request, &keys, &reservation))
        };
        let completed = self.run(
            command,
            &encoded.cdb,
            None,
            Some(&encoded.parameters),
            reread,
            events,
        )?;
        Ok(PrOutReport {
            confirmed_by_reread: completed.is_none(),
            ..PrOutReport::default()
        })
    }
}

impl<D: ScsiDevice> PrTransport for ScsiPr<D> {
    fn device(&self) -> &Path {
        self.device.path()
    }

    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        let mut events = Vec::new();
        let e = &mut events;
        let answer = match request {
            PrRequest::ReadKeys => {
                PrAnswer::Keys(self.pr_in(PrInAction::ReadKeys, ReadKeys::decode, e)?)
            }
            PrRequest::ReadReservation => PrAnswer::Reservation(self.pr_in(
                PrInAction::ReadReservation,
                ReadReservation::decode,
                e,
            )?),
            PrRequest::ReportCapabilities => PrAnswer::Capabilities(self.pr_in(
                PrInAction::ReportCapabilities,
                Capabilities::decode,
                e,
            )?),
            PrRequest::ReadFullStatus => PrAnswer::FullStatus(self.pr_in(
                PrInAction::ReadFullStatus,
                FullStatus::decode,
                e,
            )?),
            PrRequest::Out(out) => PrAnswer::Out(self.pr_out_with(out, e)?),
        };
        Ok(Reply { answer, events })
    }
}

/// Turns one completion into an [`Attempt`]: the single place that decides what a status, a
/// host/driver status and a sense key mean for us.
fn classify(
    device: &Path,
    command: Command,
    completion: &Completion,
    requested: usize,
    timeout: Duration,
) -> Attempt {
    let sense = completion.sense();
    let failed = |kind: ErrorKind, message: String| {
        Attempt::Failed(CommandError {
            device: PathBuf::from(device),
            command,
            kind,
            message,
            transport: Some(TransportDetail::Scsi(ScsiDetail {
                status: completion.status,
                host_status: completion.host_status,
                driver_status: completion.driver_status,
                sense,
            })),
            hint: None,
        })
    };
    if completion.host_status == HostStatus::TIME_OUT
        || completion.driver_status == DriverStatus::TIMEOUT
    {
        return failed(
            ErrorKind::Timeout,
            format!("no completion within {} ms", timeout.as_millis()),
        );
    }
    if completion.host_status != HostStatus::DID_OK {
        return failed(
            ErrorKind::Transport,
            format!("host status {}", completion.host_status),
        );
    }
    match completion.status {
        ScsiStatus::GOOD | ScsiStatus::CONDITION_MET => {
            Attempt::Good(requested.saturating_sub(completion.resid))
        }
        ScsiStatus::RESERVATION_CONFLICT => failed(
            ErrorKind::ReservationConflict,
            "reservation conflict".to_string(),
        ),
        ScsiStatus::CHECK_CONDITION => {
            let Some(sense) = sense else {
                return failed(
                    ErrorKind::Failed,
                    "CHECK CONDITION without sense data".to_string(),
                );
            };
            let additional = sense.additional();
            match sense.key {
                SenseKey::UNIT_ATTENTION => Attempt::UnitAttention(additional),
                SenseKey::NOT_READY => Attempt::NotReady,
                SenseKey::ILLEGAL_REQUEST
                    if additional == AdditionalSense::INVALID_COMMAND_OPERATION_CODE =>
                {
                    failed(
                        ErrorKind::NotSupported,
                        "persistent reservations not supported".to_string(),
                    )
                }
                // The LU is gone from this initiator (removed, or out of its ACL): what a lost
                // path says, so the next path is tried, and not a field to fix.
                SenseKey::ILLEGAL_REQUEST
                    if additional == AdditionalSense::LOGICAL_UNIT_NOT_SUPPORTED =>
                {
                    failed(
                        ErrorKind::Transport,
                        "the target no longer offers this LU to this initiator (removed, or \
                         unmapped from its ACL)"
                            .to_string(),
                    )
                }
                SenseKey::ILLEGAL_REQUEST => failed(
                    ErrorKind::InvalidField,
                    "the target refused the request".to_string(),
                ),
                _ => failed(ErrorKind::Failed, "CHECK CONDITION".to_string()),
            }
        }
        ScsiStatus::BUSY | ScsiStatus::TASK_SET_FULL => {
            // Treated like NOT READY: the target is alive but cannot take the command now.
            Attempt::NotReady
        }
        other => failed(ErrorKind::Failed, format!("status {other}")),
    }
}

#[cfg(test)]
mod tests {
    //! The policy against the SPC model: real codec bytes, real sense bytes, injected faults.

    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::pr::{Key, ReservationType, TransportId};
    use crate::spc_model::{
        CommandFilter, Injected, Injection, ModelDevice, ModelLu, Quirks, ScsiFailure, Timing,
        UnitAttention,
    };

    const A: Key = Key::new(0xa);
    const B: Key = Key::new(0xb);
    const WERO: ReservationType = ReservationType::WriteExclusiveRegistrantsOnly;

    fn iscsi(name: &str) -> TransportId {
        crate::spc_model::iscsi_initiator(name, "0x23d000001")
    }

    fn quick() -> Policy {
        Policy {
            not_ready_backoff: Duration::from_millis(1),
            ..Policy::default()
        }
    }

    struct Setup {
        lu: Arc<Mutex<ModelLu>>,
        a: ScsiPr<ModelDevice>,
        b: ScsiPr<ModelDevice>,
    }

    fn setup(quirks: Quirks) -> Setup {
        let mut lu = ModelLu::new(quirks);
        let na = lu.connect(iscsi("nodea"), 1);
        let nb = lu.connect(iscsi("nodeb"), 1);
        let lu = Arc::new(Mutex::new(lu));
        Setup {
            a: ScsiPr::new(ModelDevice::new(Arc::clone(&lu), na, "/dev/sda"), quick()),
            b: ScsiPr::new(ModelDevice::new(Arc::clone(&lu), nb, "/dev/sdb"), quick()),
            lu,
        }
    }

    /// Another node's REGISTER with APTPL made the LU persist through power loss: this node's
    /// REGISTERs without APTPL (a first registration, a re-registration of the same key as the
    /// agent's probe sends, an unregister) keep it so; with APTPL off they leave it off; asking
    /// for APTPL still sets it.
    #[test]
    fn a_register_without_aptpl_keeps_the_lus_persistence() {
        let s = setup(Quirks::lio());
        let persists = || s.lu.lock().unwrap().aptpl();
        s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
        s.a.pr_out(&PrOut::register(Key::ZERO, A)).unwrap();
        assert!(!persists(), "off stays off");
        s.b.pr_out(&PrOut::register(B, B).with_aptpl(true)).unwrap();
        assert!(persists());
        s.a.pr_out(&PrOut::register(A, A)).unwrap();
        assert!(persists(), "the probe's re-registration turned APTPL off");
        s.a.pr_out(&PrOut::unregister(A)).unwrap();
        assert!(persists(), "an unregister turned APTPL off");
        s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
        assert!(persists(), "a first registration turned APTPL off");
        let caps = s.a.pr_in(
            PrInAction::ReportCapabilities,
            Capabilities::decode,
            &mut Vec::new(),
        );
        assert!(caps.unwrap().ptpl_a);
    }

    #[test]
    fn register_reserve_and_read_back() {
        let s = setup(Quirks::lio());
        s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
        s.b.pr_out(&PrOut::register(Key::ZERO, B)).unwrap();
        s.a.pr_out(&PrOut::reserve(A, WERO)).unwrap();
        assert_eq!(s.b.read_keys().unwrap().keys, vec![A, B]);
        let r = s.b.read_reservation().unwrap().reservation.unwrap();
        assert_eq!((r.key, r.rtype), (A, WERO));
    }

    #[test]
    fn a_conflict_is_classified_with_its_status() {
        let s = setup(Quirks::lio());
        s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
        s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
        s.a.pr_out(&PrOut::reserve(A, WERO)).unwrap();
        let e = s.b.pr_out(&PrOut::reserve(B, WERO)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::ReservationConflict);
        assert_eq!(
            e.transport,
            Some(TransportDetail::Scsi(ScsiDetail::with_status(
                ScsiStatus::RESERVATION_CONFLICT
            )))
        );
        assert_eq!(e.device, Path::new("/dev/sdb"));
        let text = e.to_string();
        assert!(
            text.contains("/dev/sdb")
                && text.contains("RESERVE")
                && text.contains("RESERVATION CONFLICT")
                && !text.contains("Hint"),
            "the transport gives no hint: {text}"
        );
    }

    #[test]
    fn unit_attentions_are_consumed_and_returned_in_the_reply() {
        let s = setup(Quirks::lio());
        s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
        s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
        s.b.pr_out(&PrOut::preempt_and_abort(B, A, WERO)).unwrap();
        // A's next command meets 2Ah/05h first; the retry succeeds and the attention comes back.
        let reply = s.a.execute(PrRequest::ReadKeys).unwrap();
        assert!(matches!(&reply.answer, PrAnswer::Keys(k) if k.keys == vec![B]));
        assert_eq!(
            reply.events,
            vec![Event::UnitAttention(
                AdditionalSense::REGISTRATIONS_PREEMPTED
            )]
        );
        assert!(reply.events[0].is_registration_preempted());
        assert!(s.a.execute(PrRequest::ReadKeys).unwrap().events.is_empty());
    }

    #[test]
    fn unit_attentions_met_by_the_reread_after_not_ready_are_in_the_pr_out_reply() {
        let s = setup(Quirks::lio());
        let nexus = s.a.device.nexus();
        s.lu.lock().unwrap().inject(
            nexus,
            Injection {
                fault: Injected::Failure(ScsiFailure::lio_communication_failure()),
                timing: Timing::AfterExecuting,
                filter: CommandFilter::AnyPrOut,
                count: 1,
            },
        );
        let ua = Injected::Failure(UnitAttention::POWER_ON.to_failure());
        s.lu.lock().unwrap().inject(
            nexus,
            Injection {
                fault: ua,
                timing: Timing::InsteadOfExecuting,
                filter: CommandFilter::AnyPrIn,
                count: 1,
            },
        );
        let reply =
            s.a.execute(PrRequest::Out(&PrOut::register(Key::ZERO, A)))
                .unwrap();
        assert!(matches!(reply.answer, PrAnswer::Out(r) if r.confirmed_by_reread));
        assert_eq!(reply.events.len(), 1, "{:?}", reply.events);
        assert!(!reply.events[0].is_registration_preempted());
    }

    #[test]
    fn endless_unit_attentions_give_up_with_their_kind() {
        let s = setup(Quirks::lio());
        let nexus = s.a.device.nexus();
        let ua = Injected::Failure(UnitAttention::POWER_ON.to_failure());
        s.lu.lock().unwrap().fail_next(nexus, ua, 100);
        let e = s.a.read_keys().unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnitAttention);
    }

    #[test]
    fn not_ready_after_apply_is_confirmed_by_rereading() {
        let s = setup(Quirks::lio());
        let nexus = s.a.device.nexus();
        s.lu.lock().unwrap().inject(
            nexus,
            Injection {
                fault: Injected::Failure(ScsiFailure::lio_communication_failure()),
                timing: Timing::AfterExecuting,
                filter: CommandFilter::AnyPrOut,
                count: 1,
            },
        );
        // A plain REGISTER retried blindly would now conflict (the key is no longer 0).
        let report = s.a.pr_out(&PrOut::register(Key::ZERO, A)).unwrap();
        assert!(report.confirmed_by_reread);
        assert_eq!(s.lu.lock().unwrap().registered_key(nexus), Some(A));
    }

    #[test]
    fn not_ready_that_did_not_apply_is_retried() {
        let s = setup(Quirks::lio());
        let nexus = s.a.device.nexus();
        s.lu.lock().unwrap().inject(
            nexus,
            Injection {
                fault: Injected::Failure(ScsiFailure::lio_communication_failure()),
                timing: Timing::InsteadOfExecuting,
                filter: CommandFilter::AnyPrOut,
                count: 2,
            },
        );
        let report = s.a.pr_out(&PrOut::register(Key::ZERO, A)).unwrap();
        assert!(!report.confirmed_by_reread);
        assert_eq!(s.lu.lock().unwrap().registered_key(nexus), Some(A));
    }

    #[test]
    fn persistent_not_ready_gives_up() {
        let s = setup(Quirks::lio());
        // LIO answers NOT READY to RESERVE from an unregistered nexus when nothing is reserved.
        let e = s.a.pr_out(&PrOut::reserve(A, WERO)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotReady);
    }

    #[test]
    fn no_persistent_reservations_is_not_supported() {
        let s = setup(Quirks {
            emulate_pr: false,
            ..Quirks::lio()
        });
        assert_eq!(s.a.read_keys().unwrap_err().kind, ErrorKind::NotSupported);
    }

    #[test]
    fn an_unsupported_service_action_is_an_invalid_field() {
        let s = setup(Quirks {
            preempt_and_abort_supported: false,
            ..Quirks::lio()
        });
        s.a.pr_out(&PrOut::register_ignore(A)).unwrap();
        s.b.pr_out(&PrOut::register_ignore(B)).unwrap();
        let e =
            s.b.pr_out(&PrOut::preempt_and_abort(B, A, WERO))
                .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidField);
        assert!(e.sense_text().is_some());
    }

    #[test]
    fn an_lu_unmapped_from_this_initiator_is_a_lost_path_not_a_field() {
        let s = setup(Quirks::lio());
        let na = s.a.device.nexus();
        let unmapped = ScsiFailure::CheckCondition {
            key: 0x05,
            asc: 0x25,
            ascq: 0x00,
        };
        s.lu.lock()
            .unwrap()
            .fail_next(na, Injected::Failure(unmapped), 1);
        let e = s.a.read_keys().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transport);
        assert!(e.to_string().contains("unmapped"), "{e}");
    }

    /// A device whose every SG_IO the kernel refuses with `errno`.
    struct Refusing(i32);

    impl ScsiDevice for Refusing {
        fn path(&self) -> &Path {
            Path::new("/dev/sdx")
        }

        fn execute(
            &self,
            _: &[u8],
            _: DataTransfer<'_>,
            _: Duration,
        ) -> Result<Completion, sg_io::Error> {
            Err(sg_io::Error::Ioctl {
                path: self.path().to_path_buf(),
                source: std::io::Error::from_raw_os_error(self.0),
            })
        }
    }

    #[test]
    fn a_refused_sg_io_names_the_capability_not_a_dead_path() {
        let e = ScsiPr::new(Refusing(nix::libc::EPERM), quick())
            .read_keys()
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Open);
        let text = e.to_string();
        assert!(text.contains("CAP_SYS_RAWIO"), "{text}");
        assert!(!text.contains("path failed"), "{text}");
        let e = ScsiPr::new(Refusing(nix::libc::EIO), quick())
            .read_keys()
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Transport);
    }

    #[test]
    fn timeouts_and_dead_paths_are_told_apart() {
        let s = setup(Quirks::lio());
        let (na, nb) = (s.a.device.nexus(), s.b.device.nexus());
        s.lu.lock().unwrap().fail_next(na, Injected::Timeout, 1);
        s.lu.lock()
            .unwrap()
            .fail_next(nb, Injected::TransportDown, 1);
        assert_eq!(s.a.read_keys().unwrap_err().kind, ErrorKind::Timeout);
        assert_eq!(s.b.read_keys().unwrap_err().kind, ErrorKind::Transport);
    }

    #[test]
    fn many_keys_are_read_by_reissuing_with_a_larger_allocation() {
        let mut lu = ModelLu::new(Quirks::lio());
        let mut devices = Vec::new();
        for i in 0..300u64 {
            let nexus = lu.connect(iscsi(&format!("node{i}")), 1);
            devices.push((nexus, Key::new(0x1000 + i)));
        }
        let lu = Arc::new(Mutex::new(lu));
        for (nexus, key) in &devices {
            let path = ScsiPr::new(
                ModelDevice::new(Arc::clone(&lu), *nexus, "/dev/sdx"),
                quick(),
            );
            path.pr_out(&PrOut::register_ignore(*key)).unwrap();
        }
        let reader = ScsiPr::new(
            ModelDevice::new(Arc::clone(&lu), devices[0].0, "/dev/sdx"),
            quick(),
        );
        let keys = reader.read_keys().unwrap().keys;
        assert_eq!(keys.len(), 300, "more than the first allocation's 127 keys");
        let status = reader.read_full_status().unwrap();
        assert_eq!(status.registrations.len(), 300);
    }

    #[test]
    fn effect_of_a_preempt_is_seen_only_when_the_victim_is_gone_and_we_remain() {
        let keys = |ks: &[Key]| ReadKeys {
            generation: 1,
            keys: ks.to_vec(),
        };
        let none = ReadReservation {
            generation: 1,
            reservation: None,
        };
        let request = PrOut::preempt_and_abort(B, A, WERO);
        assert!(effect_visible(&request, &keys(&[B]), &none));
        assert!(!effect_visible(&request, &keys(&[A, B]), &none));
        assert!(
            !effect_visible(&request, &keys(&[]), &none),
            "we were removed too"
        );
    }
}
