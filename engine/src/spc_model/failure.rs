//! How a command through the model can fail: SCSI status + sense, or transport-level faults.

use std::fmt;

/// A SCSI command outcome other than GOOD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScsiFailure {
    /// Status 18h.
    ReservationConflict,
    /// Status 02h with fixed-format sense.
    CheckCondition { key: u8, asc: u8, ascq: u8 },
}

const SENSE_KEY_NOT_READY: u8 = 0x02;
const SENSE_KEY_ILLEGAL_REQUEST: u8 = 0x05;
const SENSE_KEY_UNIT_ATTENTION: u8 = 0x06;

impl ScsiFailure {
    pub const fn unit_attention(asc: u8, ascq: u8) -> Self {
        ScsiFailure::CheckCondition {
            key: SENSE_KEY_UNIT_ATTENTION,
            asc,
            ascq,
        }
    }

    /// 05h/20h/00h INVALID COMMAND OPERATION CODE (LIO with `emulate_pr=0`).
    pub const fn illegal_request_invalid_opcode() -> Self {
        Self::illegal_request(0x20, 0x00)
    }

    /// 05h/24h/00h INVALID FIELD IN CDB.
    pub const fn invalid_field_in_cdb() -> Self {
        Self::illegal_request(0x24, 0x00)
    }

    /// 05h/26h/00h INVALID FIELD IN PARAMETER LIST.
    pub const fn invalid_field_in_parameter_list() -> Self {
        Self::illegal_request(0x26, 0x00)
    }

    /// 05h/26h/04h INVALID RELEASE OF PERSISTENT RESERVATION.
    pub const fn invalid_release() -> Self {
        Self::illegal_request(0x26, 0x04)
    }

    /// 02h/08h/00h LOGICAL UNIT COMMUNICATION FAILURE: LIO's catch-all, seen for REGISTER when
    /// `<dbroot>/pr` is missing (after the registration was applied) and for PR OUT from an
    /// unregistered nexus while no reservation exists.
    pub const fn lio_communication_failure() -> Self {
        ScsiFailure::CheckCondition {
            key: SENSE_KEY_NOT_READY,
            asc: 0x08,
            ascq: 0x00,
        }
    }

    const fn illegal_request(asc: u8, ascq: u8) -> Self {
        ScsiFailure::CheckCondition {
            key: SENSE_KEY_ILLEGAL_REQUEST,
            asc,
            ascq,
        }
    }

    /// The unit attention this failure reports, if it is one.
    pub const fn as_unit_attention(&self) -> Option<UnitAttention> {
        match *self {
            ScsiFailure::CheckCondition {
                key: SENSE_KEY_UNIT_ATTENTION,
                asc,
                ascq,
            } => Some(UnitAttention { asc, ascq }),
            _ => None,
        }
    }
}

impl fmt::Display for ScsiFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScsiFailure::ReservationConflict => f.write_str("RESERVATION CONFLICT (status 18h)"),
            ScsiFailure::CheckCondition { key, asc, ascq } => write!(
                f,
                "CHECK CONDITION, sense key {key:02X}h, ASC/ASCQ {asc:02X}h/{ascq:02X}h"
            ),
        }
    }
}

/// A unit-attention condition queued for one nexus (sense key 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnitAttention {
    pub asc: u8,
    pub ascq: u8,
}

impl UnitAttention {
    /// 29h/00h POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    pub const POWER_ON: UnitAttention = UnitAttention {
        asc: 0x29,
        ascq: 0x00,
    };
    /// 2Ah/03h RESERVATIONS PREEMPTED: the others' view of a CLEAR.
    pub const RESERVATIONS_PREEMPTED: UnitAttention = UnitAttention {
        asc: 0x2A,
        ascq: 0x03,
    };
    /// 2Ah/04h RESERVATIONS RELEASED.
    pub const RESERVATIONS_RELEASED: UnitAttention = UnitAttention {
        asc: 0x2A,
        ascq: 0x04,
    };
    /// 2Ah/05h REGISTRATIONS PREEMPTED: this nexus's registration was removed ("we were fenced").
    pub const REGISTRATIONS_PREEMPTED: UnitAttention = UnitAttention {
        asc: 0x2A,
        ascq: 0x05,
    };

    pub const fn to_failure(self) -> ScsiFailure {
        ScsiFailure::unit_attention(self.asc, self.ascq)
    }
}

/// A fault injected into the next command(s) of a nexus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Injected {
    Failure(ScsiFailure),
    /// The command (or its response) is lost; the initiator sees a timeout.
    Timeout,
    /// The path is gone (e.g. DID_TRANSPORT_DISRUPTED / DID_NO_CONNECT).
    TransportDown,
    /// The command blocks in the kernel for this long (SCSI error recovery, a silently dropped
    /// path), then completes as timed out. [`super::ModelDevice`] sleeps without holding the LU,
    /// so the other nexuses go on.
    Hang(std::time::Duration),
}

/// Why a command through the model did not complete with GOOD status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ModelError {
    #[error("{0}")]
    Scsi(ScsiFailure),
    #[error("command timed out")]
    Timeout,
    #[error("transport down (nexus disconnected)")]
    TransportDown,
    #[error("command hung for {0:?}")]
    Hung(std::time::Duration),
}

impl ModelError {
    pub const fn scsi(&self) -> Option<ScsiFailure> {
        match *self {
            ModelError::Scsi(failure) => Some(failure),
            ModelError::Timeout | ModelError::TransportDown | ModelError::Hung(_) => None,
        }
    }
}

impl From<ScsiFailure> for ModelError {
    fn from(failure: ScsiFailure) -> Self {
        ModelError::Scsi(failure)
    }
}

impl From<Injected> for ModelError {
    fn from(injected: Injected) -> Self {
        match injected {
            Injected::Failure(failure) => ModelError::Scsi(failure),
            Injected::Timeout => ModelError::Timeout,
            Injected::TransportDown => ModelError::TransportDown,
            Injected::Hang(duration) => ModelError::Hung(duration),
        }
    }
}
