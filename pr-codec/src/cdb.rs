//! PERSISTENT RESERVE IN (5Eh) and OUT (5Fh) command descriptor blocks.

use super::error::DecodeError;
use super::types::ReservationType;
use super::wire;

pub const PR_IN_OPCODE: u8 = 0x5e;
pub const PR_OUT_OPCODE: u8 = 0x5f;

/// PERSISTENT RESERVE IN service actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum PrInAction {
    ReadKeys = 0,
    ReadReservation = 1,
    ReportCapabilities = 2,
    ReadFullStatus = 3,
}

impl PrInAction {
    pub const ALL: [Self; 4] = [
        Self::ReadKeys,
        Self::ReadReservation,
        Self::ReportCapabilities,
        Self::ReadFullStatus,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.code() == code)
    }

    /// The SPC name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::ReadKeys => "READ KEYS",
            Self::ReadReservation => "READ RESERVATION",
            Self::ReportCapabilities => "REPORT CAPABILITIES",
            Self::ReadFullStatus => "READ FULL STATUS",
        }
    }
}

/// PERSISTENT RESERVE OUT service actions (REPLACE LOST RESERVATION is not implemented: LIO
/// rejects it and fencing does not need it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum PrOutAction {
    Register = 0,
    Reserve = 1,
    Release = 2,
    Clear = 3,
    Preempt = 4,
    PreemptAndAbort = 5,
    RegisterAndIgnoreExistingKey = 6,
    RegisterAndMove = 7,
}

impl PrOutAction {
    pub const ALL: [Self; 8] = [
        Self::Register,
        Self::Reserve,
        Self::Release,
        Self::Clear,
        Self::Preempt,
        Self::PreemptAndAbort,
        Self::RegisterAndIgnoreExistingKey,
        Self::RegisterAndMove,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.code() == code)
    }

    /// The SPC name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Register => "REGISTER",
            Self::Reserve => "RESERVE",
            Self::Release => "RELEASE",
            Self::Clear => "CLEAR",
            Self::Preempt => "PREEMPT",
            Self::PreemptAndAbort => "PREEMPT AND ABORT",
            Self::RegisterAndIgnoreExistingKey => "REGISTER AND IGNORE EXISTING KEY",
            Self::RegisterAndMove => "REGISTER AND MOVE",
        }
    }
}

/// A PERSISTENT RESERVE IN CDB: byte 1 service action, bytes 7–8 allocation length.
pub fn pr_in_cdb(action: PrInAction, allocation_length: u16) -> [u8; 10] {
    let [len_hi, len_lo] = allocation_length.to_be_bytes();
    [
        PR_IN_OPCODE,
        action.code(),
        0,
        0,
        0,
        0,
        0,
        len_hi,
        len_lo,
        0,
    ]
}

/// Parses a PERSISTENT RESERVE IN CDB into its service action and allocation length (for a fake
/// target).
pub fn decode_pr_in_cdb(cdb: &[u8]) -> Result<(PrInAction, u16), DecodeError> {
    let opcode = wire::u8_at(cdb, 0);
    let (Some(service_action), Some(allocation_length)) = (wire::u8_at(cdb, 1), wire::be16(cdb, 7))
    else {
        return Err(DecodeError::Truncated {
            needed: 10,
            got: cdb.len(),
        });
    };
    if opcode != Some(PR_IN_OPCODE) {
        return Err(DecodeError::malformed(
            "PERSISTENT RESERVE IN CDB",
            format!("opcode {:#04x}, expected 0x5e", opcode.unwrap_or(0)),
        ));
    }
    let code = service_action & 0x1f;
    let action = PrInAction::from_code(code).ok_or(DecodeError::UnknownServiceAction {
        what: "PERSISTENT RESERVE IN",
        code,
    })?;
    Ok((action, allocation_length))
}

/// A PERSISTENT RESERVE OUT CDB: byte 1 service action, byte 2 SCOPE (always LU_SCOPE) | TYPE,
/// bytes 5–8 parameter list length. A missing type is sent as 0, which SPC says the service
/// actions that take no type ignore.
pub fn pr_out_cdb(
    action: PrOutAction,
    rtype: Option<ReservationType>,
    parameter_list_length: u32,
) -> [u8; 10] {
    let [l0, l1, l2, l3] = parameter_list_length.to_be_bytes();
    let scope_type = rtype.map_or(0, ReservationType::code);
    [
        PR_OUT_OPCODE,
        action.code(),
        scope_type,
        0,
        0,
        l0,
        l1,
        l2,
        l3,
        0,
    ]
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn pr_in_cdb_layout() {
        assert_eq!(
            pr_in_cdb(PrInAction::ReadFullStatus, 0x1234),
            [0x5e, 3, 0, 0, 0, 0, 0, 0x12, 0x34, 0]
        );
        assert_eq!(
            decode_pr_in_cdb(&pr_in_cdb(PrInAction::ReadKeys, 8)),
            Ok((PrInAction::ReadKeys, 8))
        );
    }

    #[test]
    fn pr_in_cdb_rejects_bad_input() {
        assert!(matches!(
            decode_pr_in_cdb(&[0x5e, 0]),
            Err(DecodeError::Truncated { needed: 10, got: 2 })
        ));
        assert!(matches!(
            decode_pr_in_cdb(&[0x5f, 0, 0, 0, 0, 0, 0, 0, 8, 0]),
            Err(DecodeError::Malformed { .. })
        ));
        assert_eq!(
            decode_pr_in_cdb(&[0x5e, 4, 0, 0, 0, 0, 0, 0, 8, 0]),
            Err(DecodeError::UnknownServiceAction {
                what: "PERSISTENT RESERVE IN",
                code: 4
            })
        );
    }

    #[test]
    fn pr_out_cdb_layout_matches_sg_persist() {
        // sg_persist --out --preempt-abort -T 5: 5f 05 05 00 00 00 00 00 18 00
        assert_eq!(
            pr_out_cdb(
                PrOutAction::PreemptAndAbort,
                Some(ReservationType::WriteExclusiveRegistrantsOnly),
                24
            ),
            [0x5f, 5, 5, 0, 0, 0, 0, 0, 0x18, 0]
        );
        assert_eq!(
            pr_out_cdb(PrOutAction::Register, None, 0x0102_0304),
            [0x5f, 0, 0, 0, 0, 1, 2, 3, 4, 0]
        );
    }

    #[test]
    fn action_names_and_codes() {
        assert_eq!(PrOutAction::PreemptAndAbort.name(), "PREEMPT AND ABORT");
        for a in PrOutAction::ALL {
            assert_eq!(PrOutAction::from_code(a.code()), Some(a));
        }
        for a in PrInAction::ALL {
            assert_eq!(PrInAction::from_code(a.code()), Some(a));
        }
        assert_eq!(PrOutAction::from_code(8), None);
    }
}
