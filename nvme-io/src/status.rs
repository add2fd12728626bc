//! What the device answered: the block layer's `pr_status` and the NVMe status field.
//!
//! Newtypes with named constants rather than enums: a value this crate does not know is still
//! representable and printable.

use std::fmt;

/// A block PR ioctl's positive return value (`enum pr_status`, `<linux/pr.h>`): the device
/// answered with an error. The NVMe driver maps Reservation Conflict to
/// [`PrStatus::RESERVATION_CONFLICT`], path errors to [`PrStatus::PATH_FAILED`] and everything
/// else to [`PrStatus::IOERR`], so the NVMe status itself is lost on this interface.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct PrStatus(pub u32);

impl PrStatus {
    pub const SUCCESS: Self = Self(0);
    pub const IOERR: Self = Self(0x2);
    pub const RESERVATION_CONFLICT: Self = Self(0x18);
    pub const RETRY_PATH_FAILURE: Self = Self(0xe0000);
    pub const PATH_FAST_FAILED: Self = Self(0xf0000);
    pub const PATH_FAILED: Self = Self(0x10000);

    /// The kernel's name without `PR_STS_`, in words; `None` for a value not listed above.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::SUCCESS => "SUCCESS",
            Self::IOERR => "I/O ERROR",
            Self::RESERVATION_CONFLICT => "RESERVATION CONFLICT",
            Self::RETRY_PATH_FAILURE => "RETRY PATH FAILURE",
            Self::PATH_FAST_FAILED => "PATH FAST FAILED",
            Self::PATH_FAILED => "PATH FAILED",
            _ => return None,
        })
    }

    /// A failure of the path to the device rather than the device's answer.
    pub fn is_path_failure(self) -> bool {
        matches!(
            self,
            Self::RETRY_PATH_FAILURE | Self::PATH_FAST_FAILED | Self::PATH_FAILED
        )
    }
}

impl fmt::Display for PrStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} (PR status 0x{:x})", self.0),
            None => write!(f, "unknown PR status 0x{:x}", self.0),
        }
    }
}

/// The NVMe completion status field as the passthrough ioctl returns it: SC in bits 0-7, SCT in
/// bits 8-10, CRD in 11-12, MORE in 13, DNR in 14.
///
/// The named constants carry SCT and SC only; compare with [`NvmeStatus::code`], which drops
/// the CRD, MORE and DNR bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct NvmeStatus(pub u16);

impl NvmeStatus {
    pub const SUCCESS: Self = Self(0x000);
    // Generic command status (SCT 0).
    pub const INVALID_OPCODE: Self = Self(0x001);
    pub const INVALID_FIELD: Self = Self(0x002);
    pub const COMMAND_ID_CONFLICT: Self = Self(0x003);
    pub const DATA_TRANSFER_ERROR: Self = Self(0x004);
    pub const POWER_LOSS_ABORT: Self = Self(0x005);
    pub const INTERNAL_ERROR: Self = Self(0x006);
    pub const ABORT_REQUESTED: Self = Self(0x007);
    pub const SQ_DELETION_ABORT: Self = Self(0x008);
    pub const INVALID_NAMESPACE: Self = Self(0x00b);
    pub const HOST_ID_INCONSISTENT: Self = Self(0x018);
    pub const NAMESPACE_NOT_READY: Self = Self(0x082);
    pub const RESERVATION_CONFLICT: Self = Self(0x083);
    // Path related status (SCT 3).
    pub const INTERNAL_PATH_ERROR: Self = Self(0x300);
    pub const ANA_PERSISTENT_LOSS: Self = Self(0x301);
    pub const ANA_INACCESSIBLE: Self = Self(0x302);
    pub const ANA_TRANSITION: Self = Self(0x303);
    pub const CONTROLLER_PATH_ERROR: Self = Self(0x360);
    pub const HOST_PATH_ERROR: Self = Self(0x370);
    pub const HOST_ABORTED: Self = Self(0x371);

    /// Status Code Type (bits 8-10).
    pub fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7).to_le_bytes()[0]
    }

    /// Status Code (bits 0-7).
    pub fn sc(self) -> u8 {
        self.0.to_le_bytes()[0]
    }

    /// Command Retry Delay index (bits 11-12).
    pub fn crd(self) -> u8 {
        ((self.0 >> 11) & 0x3).to_le_bytes()[0]
    }

    /// More status information in the error log page.
    pub fn more(self) -> bool {
        self.0 & (1 << 13) != 0
    }

    /// Do Not Retry: the same command would fail again.
    pub fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// SCT and SC only: what the named constants hold.
    pub fn code(self) -> Self {
        Self(self.0 & 0x7ff)
    }

    pub fn is_success(self) -> bool {
        self.code() == Self::SUCCESS
    }

    /// Path related status (SCT 3): the command may succeed on another path or later.
    pub fn is_path_error(self) -> bool {
        self.sct() == 3
    }

    /// The NVMe base specification's name; `None` for a code not listed above.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.code() {
            Self::SUCCESS => "SUCCESS",
            Self::INVALID_OPCODE => "INVALID COMMAND OPCODE",
            Self::INVALID_FIELD => "INVALID FIELD IN COMMAND",
            Self::COMMAND_ID_CONFLICT => "COMMAND ID CONFLICT",
            Self::DATA_TRANSFER_ERROR => "DATA TRANSFER ERROR",
            Self::POWER_LOSS_ABORT => "COMMANDS ABORTED DUE TO POWER LOSS NOTIFICATION",
            Self::INTERNAL_ERROR => "INTERNAL ERROR",
            Self::ABORT_REQUESTED => "COMMAND ABORT REQUESTED",
            Self::SQ_DELETION_ABORT => "COMMAND ABORTED DUE TO SQ DELETION",
            Self::INVALID_NAMESPACE => "INVALID NAMESPACE OR FORMAT",
            Self::HOST_ID_INCONSISTENT => "HOST IDENTIFIER INCONSISTENT FORMAT",
            Self::NAMESPACE_NOT_READY => "NAMESPACE NOT READY",
            Self::RESERVATION_CONFLICT => "RESERVATION CONFLICT",
            Self::INTERNAL_PATH_ERROR => "INTERNAL PATH ERROR",
            Self::ANA_PERSISTENT_LOSS => "ASYMMETRIC ACCESS PERSISTENT LOSS",
            Self::ANA_INACCESSIBLE => "ASYMMETRIC ACCESS INACCESSIBLE",
            Self::ANA_TRANSITION => "ASYMMETRIC ACCESS TRANSITION",
            Self::CONTROLLER_PATH_ERROR => "CONTROLLER PATHING ERROR",
            Self::HOST_PATH_ERROR => "HOST PATHING ERROR",
            Self::HOST_ABORTED => "COMMAND ABORTED BY HOST",
            _ => return None,
        })
    }
}

impl fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ")?,
            None => f.write_str("unknown NVMe status ")?,
        }
        write!(f, "(SCT {:x}h SC {:02X}h", self.sct(), self.sc())?;
        if self.crd() != 0 {
            write!(f, ", CRD {}", self.crd())?;
        }
        if self.more() {
            f.write_str(", MORE")?;
        }
        if self.dnr() {
            f.write_str(", DNR")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvme_status_fields_decode() {
        let conflict = NvmeStatus(0x4083);
        assert_eq!((conflict.sct(), conflict.sc()), (0, 0x83));
        assert!(conflict.dnr() && !conflict.more());
        assert_eq!(conflict.code(), NvmeStatus::RESERVATION_CONFLICT);
        assert_eq!(
            conflict.to_string(),
            "RESERVATION CONFLICT (SCT 0h SC 83h, DNR)"
        );
        let path = NvmeStatus(0x2370 | 0x0800);
        assert_eq!((path.sct(), path.sc(), path.crd()), (3, 0x70, 1));
        assert!(path.more() && !path.dnr() && path.is_path_error());
        assert_eq!(
            path.to_string(),
            "HOST PATHING ERROR (SCT 3h SC 70h, CRD 1, MORE)"
        );
        assert_eq!(
            NvmeStatus(0x1c4).to_string(),
            "unknown NVMe status (SCT 1h SC C4h)"
        );
        assert!(NvmeStatus(0x4000).is_success());
    }

    #[test]
    fn pr_status_display_and_path_failures() {
        assert_eq!(
            PrStatus::RESERVATION_CONFLICT.to_string(),
            "RESERVATION CONFLICT (PR status 0x18)"
        );
        assert_eq!(PrStatus(0x42).to_string(), "unknown PR status 0x42");
        assert!(PrStatus::PATH_FAILED.is_path_failure());
        assert!(PrStatus::PATH_FAST_FAILED.is_path_failure());
        assert!(!PrStatus::IOERR.is_path_failure());
    }
}
