//! The model behind the [`ScsiDevice`] seam: CDBs and parameter lists in, completions with
//! status and fixed-format sense out, so unit tests exercise the real codec and execution policy.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sg_io::{Completion, DataTransfer, DriverStatus, HostStatus, ScsiStatus};

use super::{ModelError, ModelLu, Nexus, ScsiFailure};
use crate::exec::ScsiDevice;
use crate::pr::{self, PrInAction};

/// One initiator's path to a modelled LU, as a device node would be.
#[derive(Debug, Clone)]
pub struct ModelDevice {
    lu: Arc<Mutex<ModelLu>>,
    nexus: Nexus,
    path: PathBuf,
}

impl ModelDevice {
    pub fn new(lu: Arc<Mutex<ModelLu>>, nexus: Nexus, path: impl Into<PathBuf>) -> Self {
        ModelDevice {
            lu,
            nexus,
            path: path.into(),
        }
    }

    pub fn nexus(&self) -> Nexus {
        self.nexus
    }

    fn lu(&self) -> MutexGuard<'_, ModelLu> {
        // A test that panicked while holding the lock has failed already; keep its state.
        self.lu
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn completion(
    status: ScsiStatus,
    host_status: HostStatus,
    sense_bytes: Vec<u8>,
    resid: usize,
) -> Completion {
    let driver_status = if sense_bytes.is_empty() {
        DriverStatus::OK
    } else {
        DriverStatus::SENSE
    };
    Completion {
        status,
        host_status,
        driver_status,
        sense_bytes,
        resid,
        duration: Duration::ZERO,
    }
}

/// Fixed-format (70h) sense, as LIO sends it.
fn fixed_sense(key: u8, asc: u8, ascq: u8) -> Vec<u8> {
    let mut sense = vec![0u8; 18];
    sense[0] = 0x70;
    sense[2] = key;
    sense[7] = 10;
    sense[12] = asc;
    sense[13] = ascq;
    sense
}

fn failed(error: ModelError, requested: usize) -> Completion {
    match error {
        ModelError::Scsi(ScsiFailure::ReservationConflict) => completion(
            ScsiStatus::RESERVATION_CONFLICT,
            HostStatus::DID_OK,
            Vec::new(),
            requested,
        ),
        ModelError::Scsi(ScsiFailure::CheckCondition { key, asc, ascq }) => completion(
            ScsiStatus::CHECK_CONDITION,
            HostStatus::DID_OK,
            fixed_sense(key, asc, ascq),
            requested,
        ),
        ModelError::Timeout | ModelError::Hung(_) => completion(
            ScsiStatus::GOOD,
            HostStatus::TIME_OUT,
            Vec::new(),
            requested,
        ),
        ModelError::TransportDown => completion(
            ScsiStatus::GOOD,
            HostStatus::TRANSPORT_DISRUPTED,
            Vec::new(),
            requested,
        ),
    }
}

fn illegal_request_invalid_field() -> Completion {
    failed(ModelError::Scsi(ScsiFailure::invalid_field_in_cdb()), 0)
}

impl ScsiDevice for ModelDevice {
    fn path(&self) -> &Path {
        &self.path
    }

    fn execute(
        &self,
        cdb: &[u8],
        data: DataTransfer<'_>,
        timeout: Duration,
    ) -> Result<Completion, sg_io::Error> {
        let (completion, hang) = self.execute_unlocked(cdb, data, timeout);
        // A hung command blocks this caller only: the LU's lock is already released.
        if let Some(hang) = hang {
            std::thread::sleep(hang);
        }
        Ok(completion)
    }
}

impl ModelDevice {
    /// The completion, and how long the caller hangs before it sees it ([`ModelError::Hung`]).
    fn execute_unlocked(
        &self,
        cdb: &[u8],
        data: DataTransfer<'_>,
        _timeout: Duration,
    ) -> (Completion, Option<Duration>) {
        let hang = |e: &ModelError| match e {
            ModelError::Hung(duration) => Some(*duration),
            _ => None,
        };
        match (cdb.first().copied(), data) {
            (Some(pr::PR_IN_OPCODE), DataTransfer::FromDevice(buffer)) => {
                let Ok((action, _allocation)) = pr::decode_pr_in_cdb(cdb) else {
                    return (illegal_request_invalid_field(), None);
                };
                let mut lu = self.lu();
                let response = match action {
                    PrInAction::ReadKeys => lu.read_keys(self.nexus).map(|r| r.encode()),
                    PrInAction::ReadReservation => {
                        lu.read_reservation(self.nexus).map(|r| r.encode())
                    }
                    PrInAction::ReportCapabilities => {
                        lu.report_capabilities(self.nexus).map(|r| r.encode())
                    }
                    PrInAction::ReadFullStatus => {
                        lu.read_full_status(self.nexus).map(|r| r.encode())
                    }
                };
                drop(lu);
                match response {
                    Ok(bytes) => {
                        // Like a target: send what fits in the allocation, say nothing about the rest.
                        let n = bytes.len().min(buffer.len());
                        if let (Some(dst), Some(src)) = (buffer.get_mut(..n), bytes.get(..n)) {
                            dst.copy_from_slice(src);
                        }
                        let done = completion(
                            ScsiStatus::GOOD,
                            HostStatus::DID_OK,
                            Vec::new(),
                            buffer.len() - n,
                        );
                        (done, None)
                    }
                    Err(e) => (failed(e, buffer.len()), hang(&e)),
                }
            }
            (Some(pr::PR_OUT_OPCODE), DataTransfer::ToDevice(parameters)) => {
                let Ok(request) = pr::decode_pr_out(cdb, parameters) else {
                    return (illegal_request_invalid_field(), None);
                };
                let result = self.lu().pr_out(self.nexus, &request);
                match result {
                    Ok(()) => (
                        completion(ScsiStatus::GOOD, HostStatus::DID_OK, Vec::new(), 0),
                        None,
                    ),
                    Err(e) => (failed(e, 0), hang(&e)),
                }
            }
            _ => (
                failed(
                    ModelError::Scsi(ScsiFailure::illegal_request_invalid_opcode()),
                    0,
                ),
                None,
            ),
        }
    }
}
