//! Status codes returned in the sg_io_hdr: SCSI status (from the target), host status (from the
//! initiator/transport, Linux `DID_*`) and driver status (Linux `DRIVER_*`).
//!
//! Newtypes with named constants rather than enums: a value this crate does not know is still
//! representable and printable.

use std::fmt;

/// SCSI status byte (SAM-5).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct ScsiStatus(pub u8);

impl ScsiStatus {
    pub const GOOD: Self = Self(0x00);
    pub const CHECK_CONDITION: Self = Self(0x02);
    pub const CONDITION_MET: Self = Self(0x04);
    pub const BUSY: Self = Self(0x08);
    pub const RESERVATION_CONFLICT: Self = Self(0x18);
    pub const TASK_SET_FULL: Self = Self(0x28);
    pub const ACA_ACTIVE: Self = Self(0x30);
    pub const TASK_ABORTED: Self = Self(0x40);

    /// The SAM name, or `None` for a value not listed above.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::GOOD => "GOOD",
            Self::CHECK_CONDITION => "CHECK CONDITION",
            Self::CONDITION_MET => "CONDITION MET",
            Self::BUSY => "BUSY",
            Self::RESERVATION_CONFLICT => "RESERVATION CONFLICT",
            Self::TASK_SET_FULL => "TASK SET FULL",
            Self::ACA_ACTIVE => "ACA ACTIVE",
            Self::TASK_ABORTED => "TASK ABORTED",
            _ => return None,
        })
    }
}

impl fmt::Display for ScsiStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} (0x{:02x})", self.0),
            None => write!(f, "unknown SCSI status 0x{:02x}", self.0),
        }
    }
}

/// Host (initiator and transport) status: Linux `DID_*` values.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct HostStatus(pub u16);

impl HostStatus {
    pub const DID_OK: Self = Self(0x00);
    pub const NO_CONNECT: Self = Self(0x01);
    pub const BUS_BUSY: Self = Self(0x02);
    pub const TIME_OUT: Self = Self(0x03);
    pub const BAD_TARGET: Self = Self(0x04);
    pub const ABORT: Self = Self(0x05);
    pub const PARITY: Self = Self(0x06);
    pub const ERROR: Self = Self(0x07);
    pub const RESET: Self = Self(0x08);
    pub const BAD_INTR: Self = Self(0x09);
    pub const PASSTHROUGH: Self = Self(0x0a);
    pub const SOFT_ERROR: Self = Self(0x0b);
    pub const IMM_RETRY: Self = Self(0x0c);
    pub const REQUEUE: Self = Self(0x0d);
    pub const TRANSPORT_DISRUPTED: Self = Self(0x0e);
    pub const TRANSPORT_FAILFAST: Self = Self(0x0f);
    pub const TARGET_FAILURE: Self = Self(0x10);
    pub const NEXUS_FAILURE: Self = Self(0x11);
    pub const ALLOC_FAILURE: Self = Self(0x12);
    pub const MEDIUM_ERROR: Self = Self(0x13);
    pub const TRANSPORT_MARGINAL: Self = Self(0x14);

    /// The Linux `DID_*` name, or `None` for a value not listed above.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::DID_OK => "DID_OK",
            Self::NO_CONNECT => "DID_NO_CONNECT",
            Self::BUS_BUSY => "DID_BUS_BUSY",
            Self::TIME_OUT => "DID_TIME_OUT",
            Self::BAD_TARGET => "DID_BAD_TARGET",
            Self::ABORT => "DID_ABORT",
            Self::PARITY => "DID_PARITY",
            Self::ERROR => "DID_ERROR",
            Self::RESET => "DID_RESET",
            Self::BAD_INTR => "DID_BAD_INTR",
            Self::PASSTHROUGH => "DID_PASSTHROUGH",
            Self::SOFT_ERROR => "DID_SOFT_ERROR",
            Self::IMM_RETRY => "DID_IMM_RETRY",
            Self::REQUEUE => "DID_REQUEUE",
            Self::TRANSPORT_DISRUPTED => "DID_TRANSPORT_DISRUPTED",
            Self::TRANSPORT_FAILFAST => "DID_TRANSPORT_FAILFAST",
            Self::TARGET_FAILURE => "DID_TARGET_FAILURE",
            Self::NEXUS_FAILURE => "DID_NEXUS_FAILURE",
            Self::ALLOC_FAILURE => "DID_ALLOC_FAILURE",
            Self::MEDIUM_ERROR => "DID_MEDIUM_ERROR",
            Self::TRANSPORT_MARGINAL => "DID_TRANSPORT_MARGINAL",
            _ => return None,
        })
    }
}

impl fmt::Display for HostStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} (0x{:02x})", self.0),
            None => write!(f, "unknown host status 0x{:02x}", self.0),
        }
    }
}

/// Driver status: Linux `DRIVER_*` code in the low nibble; older kernels put `SUGGEST_*` hints in
/// the high nibble, which [`DriverStatus::code`] masks off.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct DriverStatus(pub u16);

impl DriverStatus {
    pub const OK: Self = Self(0x00);
    pub const BUSY: Self = Self(0x01);
    pub const SOFT: Self = Self(0x02);
    pub const MEDIA: Self = Self(0x03);
    pub const ERROR: Self = Self(0x04);
    pub const INVALID: Self = Self(0x05);
    pub const TIMEOUT: Self = Self(0x06);
    pub const HARD: Self = Self(0x07);
    /// Sense data is available (set alongside CHECK CONDITION).
    pub const SENSE: Self = Self(0x08);

    /// The driver code without the suggestion bits.
    pub fn code(self) -> Self {
        Self(self.0 & 0x0f)
    }

    /// The Linux `DRIVER_*` name of [`Self::code`], or `None` for an unknown code.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.code() {
            Self::OK => "DRIVER_OK",
            Self::BUSY => "DRIVER_BUSY",
            Self::SOFT => "DRIVER_SOFT",
            Self::MEDIA => "DRIVER_MEDIA",
            Self::ERROR => "DRIVER_ERROR",
            Self::INVALID => "DRIVER_INVALID",
            Self::TIMEOUT => "DRIVER_TIMEOUT",
            Self::HARD => "DRIVER_HARD",
            Self::SENSE => "DRIVER_SENSE",
            _ => return None,
        })
    }
}

impl fmt::Display for DriverStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} (0x{:02x})", self.0),
            None => write!(f, "unknown driver status 0x{:02x}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_known_and_unknown_values() {
        assert_eq!(
            ScsiStatus::RESERVATION_CONFLICT.to_string(),
            "RESERVATION CONFLICT (0x18)"
        );
        assert_eq!(ScsiStatus(0x42).to_string(), "unknown SCSI status 0x42");
        assert_eq!(HostStatus::TIME_OUT.to_string(), "DID_TIME_OUT (0x03)");
        assert_eq!(HostStatus(0x99).to_string(), "unknown host status 0x99");
        assert_eq!(DriverStatus::SENSE.to_string(), "DRIVER_SENSE (0x08)");
        // DRIVER_SENSE | SUGGEST_RETRY from an older kernel keeps its name and shows the raw value.
        assert_eq!(DriverStatus(0x18).to_string(), "DRIVER_SENSE (0x18)");
        assert_eq!(DriverStatus(0x0e).to_string(), "unknown driver status 0x0e");
    }
}
