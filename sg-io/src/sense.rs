//! Sense data (SPC-4 §4.4): fixed format (response codes 70h/71h) and descriptor format (72h/73h).

use std::fmt;
use std::fmt::Write as _;

/// How the device laid out the sense data.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum SenseFormat {
    /// Response code 70h (current) or 71h (deferred).
    Fixed,
    /// Response code 72h (current) or 73h (deferred).
    Descriptor,
}

/// Decoded sense data.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Sense {
    pub format: SenseFormat,
    /// The error belongs to an earlier command (71h/73h), not the one that returned it.
    pub deferred: bool,
    pub key: SenseKey,
    pub asc: u8,
    pub ascq: u8,
    /// The INFORMATION field when the device marked it valid (e.g. the failing LBA).
    pub information: Option<u64>,
    /// The sense-key specific field when the device marked it valid (SKSV).
    pub key_specific: Option<SenseKeySpecific>,
}

const FIXED_CURRENT: u8 = 0x70;
const FIXED_DEFERRED: u8 = 0x71;
const DESCRIPTOR_CURRENT: u8 = 0x72;
const DESCRIPTOR_DEFERRED: u8 = 0x73;
const DESCRIPTOR_INFORMATION: u8 = 0x00;
const DESCRIPTOR_SENSE_KEY_SPECIFIC: u8 = 0x02;
const VALID: u8 = 0x80;

impl Sense {
    /// Decodes sense bytes as returned by the device. `None` when empty, of an unknown or vendor
    /// response code, or too short to hold a sense key. Fields beyond a truncated buffer read as
    /// absent (ASC/ASCQ as 0).
    pub fn parse(bytes: &[u8]) -> Option<Sense> {
        match bytes.first()? & 0x7f {
            code @ (FIXED_CURRENT | FIXED_DEFERRED) => {
                Self::parse_fixed(bytes, code == FIXED_DEFERRED)
            }
            code @ (DESCRIPTOR_CURRENT | DESCRIPTOR_DEFERRED) => {
                Self::parse_descriptor(bytes, code == DESCRIPTOR_DEFERRED)
            }
            _ => None,
        }
    }

    fn parse_fixed(bytes: &[u8], deferred: bool) -> Option<Sense> {
        let key = SenseKey(bytes.get(2)? & 0x0f);
        // Byte 7 (ADDITIONAL SENSE LENGTH) bounds what the device meant to send.
        let len = match bytes.get(7) {
            Some(&additional) => bytes.len().min(8 + usize::from(additional)),
            None => bytes.len(),
        };
        let bytes = &bytes[..len];
        let information = match bytes.get(3..7) {
            Some(&[a, b, c, d]) if bytes[0] & VALID != 0 => {
                Some(u64::from(u32::from_be_bytes([a, b, c, d])))
            }
            _ => None,
        };
        let key_specific = match bytes.get(15..18) {
            Some(&[a, b, c]) if a & VALID != 0 => Some(SenseKeySpecific([a & 0x7f, b, c])),
            _ => None,
        };
        Some(Sense {
            format: SenseFormat::Fixed,
            deferred,
            key,
            asc: bytes.get(12).copied().unwrap_or(0),
            ascq: bytes.get(13).copied().unwrap_or(0),
            information,
            key_specific,
        })
    }

    fn parse_descriptor(bytes: &[u8], deferred: bool) -> Option<Sense> {
        let key = SenseKey(bytes.get(1)? & 0x0f);
        let mut sense = Sense {
            format: SenseFormat::Descriptor,
            deferred,
            key,
            asc: bytes.get(2).copied().unwrap_or(0),
            ascq: bytes.get(3).copied().unwrap_or(0),
            information: None,
            key_specific: None,
        };
        let end = match bytes.get(7) {
            Some(&additional) => bytes.len().min(8 + usize::from(additional)),
            None => return Some(sense),
        };
        let mut rest = bytes.get(8..end).unwrap_or_default();
        // Each descriptor: type, ADDITIONAL LENGTH, then that many bytes; stop at a truncated one.
        while let [kind, additional, ..] = *rest {
            let Some(descriptor) = rest.get(..2 + usize::from(additional)) else {
                break;
            };
            match (kind, descriptor) {
                (DESCRIPTOR_INFORMATION, &[_, 0x0a, flags, _, a, b, c, d, e, f, g, h])
                    if flags & VALID != 0 =>
                {
                    sense.information = Some(u64::from_be_bytes([a, b, c, d, e, f, g, h]));
                }
                (DESCRIPTOR_SENSE_KEY_SPECIFIC, &[_, 0x06, _, _, a, b, c, _]) if a & VALID != 0 => {
                    sense.key_specific = Some(SenseKeySpecific([a & 0x7f, b, c]));
                }
                _ => {}
            }
            rest = &rest[descriptor.len()..];
        }
        Some(sense)
    }

    /// ASC and ASCQ together.
    pub fn additional(&self) -> AdditionalSense {
        AdditionalSense(u16::from_be_bytes([self.asc, self.ascq]))
    }

    /// For ILLEGAL REQUEST: which CDB or parameter-list byte (and bit) the device objected to.
    pub fn field_pointer(&self) -> Option<FieldPointer> {
        if self.key != SenseKey::ILLEGAL_REQUEST {
            return None;
        }
        self.key_specific.map(SenseKeySpecific::field_pointer)
    }

    /// For NOT READY or NO SENSE: progress of the operation in progress, as a fraction of 65536.
    pub fn progress(&self) -> Option<u16> {
        if self.key != SenseKey::NOT_READY && self.key != SenseKey::NO_SENSE {
            return None;
        }
        self.key_specific.map(SenseKeySpecific::progress)
    }

    /// Raw sense bytes as space-separated hex ("70 00 06 …"), for error messages and logs.
    pub fn to_hex(bytes: &[u8]) -> String {
        let mut hex = String::with_capacity(bytes.len() * 3);
        for (i, byte) in bytes.iter().enumerate() {
            if i > 0 {
                hex.push(' ');
            }
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }
}

/// "UNIT ATTENTION, 2Ah/05h registrations preempted", plus the deferred flag, INFORMATION and the
/// field pointer when present.
impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, {:02X}h/{:02X}h", self.key, self.asc, self.ascq)?;
        if let Some(description) = self.additional().description() {
            write!(f, " {description}")?;
        }
        if self.deferred {
            f.write_str(" (deferred error)")?;
        }
        if let Some(information) = self.information {
            write!(f, ", information 0x{information:x}")?;
        }
        if let Some(pointer) = self.field_pointer() {
            write!(f, ", {pointer}")?;
        }
        Ok(())
    }
}

/// The three SENSE KEY SPECIFIC bytes with the SKSV bit cleared; their meaning depends on the key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SenseKeySpecific(pub [u8; 3]);

impl SenseKeySpecific {
    /// The ILLEGAL REQUEST interpretation.
    pub fn field_pointer(self) -> FieldPointer {
        let [flags, high, low] = self.0;
        FieldPointer {
            in_cdb: flags & 0x40 != 0,
            byte: u16::from_be_bytes([high, low]),
            bit: (flags & 0x08 != 0).then_some(flags & 0x07),
        }
    }

    /// The NOT READY / NO SENSE interpretation (PROGRESS INDICATION).
    pub fn progress(self) -> u16 {
        u16::from_be_bytes([self.0[1], self.0[2]])
    }
}

/// Where an ILLEGAL REQUEST points.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct FieldPointer {
    /// In the CDB (true) or in the parameter list sent with the command (false).
    pub in_cdb: bool,
    pub byte: u16,
    pub bit: Option<u8>,
}

impl fmt::Display for FieldPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = if self.in_cdb { "CDB" } else { "parameter list" };
        write!(f, "invalid field at {place} byte {}", self.byte)?;
        if let Some(bit) = self.bit {
            write!(f, " bit {bit}")?;
        }
        Ok(())
    }
}

/// Sense key (SPC-4 table 48).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct SenseKey(pub u8);

impl SenseKey {
    pub const NO_SENSE: Self = Self(0x0);
    pub const RECOVERED_ERROR: Self = Self(0x1);
    pub const NOT_READY: Self = Self(0x2);
    pub const MEDIUM_ERROR: Self = Self(0x3);
    pub const HARDWARE_ERROR: Self = Self(0x4);
    pub const ILLEGAL_REQUEST: Self = Self(0x5);
    pub const UNIT_ATTENTION: Self = Self(0x6);
    pub const DATA_PROTECT: Self = Self(0x7);
    pub const BLANK_CHECK: Self = Self(0x8);
    pub const VENDOR_SPECIFIC: Self = Self(0x9);
    pub const COPY_ABORTED: Self = Self(0xa);
    pub const ABORTED_COMMAND: Self = Self(0xb);
    pub const VOLUME_OVERFLOW: Self = Self(0xd);
    pub const MISCOMPARE: Self = Self(0xe);
    pub const COMPLETED: Self = Self(0xf);

    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::NO_SENSE => "NO SENSE",
            Self::RECOVERED_ERROR => "RECOVERED ERROR",
            Self::NOT_READY => "NOT READY",
            Self::MEDIUM_ERROR => "MEDIUM ERROR",
            Self::HARDWARE_ERROR => "HARDWARE ERROR",
            Self::ILLEGAL_REQUEST => "ILLEGAL REQUEST",
            Self::UNIT_ATTENTION => "UNIT ATTENTION",
            Self::DATA_PROTECT => "DATA PROTECT",
            Self::BLANK_CHECK => "BLANK CHECK",
            Self::VENDOR_SPECIFIC => "VENDOR SPECIFIC",
            Self::COPY_ABORTED => "COPY ABORTED",
            Self::ABORTED_COMMAND => "ABORTED COMMAND",
            Self::VOLUME_OVERFLOW => "VOLUME OVERFLOW",
            Self::MISCOMPARE => "MISCOMPARE",
            Self::COMPLETED => "COMPLETED",
            _ => return None,
        })
    }
}

impl fmt::Display for SenseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "sense key {:X}h", self.0),
        }
    }
}

/// ADDITIONAL SENSE CODE and QUALIFIER as one value, `(asc << 8) | ascq`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(transparent)]
pub struct AdditionalSense(pub u16);

impl AdditionalSense {
    pub const NO_ADDITIONAL_SENSE_INFORMATION: Self = Self(0x0000);
    pub const NOT_READY_CAUSE_NOT_REPORTABLE: Self = Self(0x0400);
    pub const NOT_READY_BECOMING_READY: Self = Self(0x0401);
    pub const LOGICAL_UNIT_COMMUNICATION_FAILURE: Self = Self(0x0800);
    pub const PARAMETER_LIST_LENGTH_ERROR: Self = Self(0x1a00);
    pub const INVALID_COMMAND_OPERATION_CODE: Self = Self(0x2000);
    pub const INVALID_FIELD_IN_CDB: Self = Self(0x2400);
    pub const LOGICAL_UNIT_NOT_SUPPORTED: Self = Self(0x2500);
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Self = Self(0x2600);
    pub const POWER_ON_RESET_OR_BUS_DEVICE_RESET: Self = Self(0x2900);
    pub const I_T_NEXUS_LOSS_OCCURRED: Self = Self(0x2907);
    pub const PARAMETERS_CHANGED: Self = Self(0x2a00);
    pub const RESERVATIONS_PREEMPTED: Self = Self(0x2a03);
    pub const RESERVATIONS_RELEASED: Self = Self(0x2a04);
    pub const REGISTRATIONS_PREEMPTED: Self = Self(0x2a05);
    pub const COMMANDS_CLEARED_BY_ANOTHER_INITIATOR: Self = Self(0x2f00);
    pub const INQUIRY_DATA_HAS_CHANGED: Self = Self(0x3f03);
    pub const REPORTED_LUNS_DATA_HAS_CHANGED: Self = Self(0x3f0e);
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: Self = Self(0x5504);

    pub fn asc(self) -> u8 {
        self.0.to_be_bytes()[0]
    }

    pub fn ascq(self) -> u8 {
        self.0.to_be_bytes()[1]
    }

    /// 29h/xx: power on, reset, or I_T nexus loss; the device lost state this initiator may rely on.
    pub fn is_power_on_reset_family(self) -> bool {
        self.asc() == 0x29
    }

    /// 2Ah/xx: parameters (mode, log, reservations, registrations, capacity…) changed.
    pub fn is_parameters_changed_family(self) -> bool {
        self.asc() == 0x2a
    }

    /// SPC's text for common codes, lower case; `None` for codes not in this crate's table.
    pub fn description(self) -> Option<&'static str> {
        Some(match self.0 {
            0x0000 => "no additional sense information",
            0x0400 => "logical unit not ready, cause not reportable",
            0x0401 => "logical unit is in process of becoming ready",
            0x0402 => "logical unit not ready, initializing command required",
            0x0403 => "logical unit not ready, manual intervention required",
            0x0404 => "logical unit not ready, format in progress",
            0x0408 => "logical unit not ready, long write in progress",
            0x040a => "logical unit not accessible, asymmetric access state transition",
            0x040b => "logical unit not accessible, target port in standby state",
            0x040c => "logical unit not accessible, target port in unavailable state",
            0x0500 => "logical unit does not respond to selection",
            0x0800 => "logical unit communication failure",
            0x0801 => "logical unit communication time-out",
            0x0c00 => "write error",
            0x1100 => "unrecovered read error",
            0x1a00 => "parameter list length error",
            0x2000 => "invalid command operation code",
            0x2100 => "logical block address out of range",
            0x2400 => "invalid field in CDB",
            0x2500 => "logical unit not supported",
            0x2600 => "invalid field in parameter list",
            0x2601 => "parameter not supported",
            0x2602 => "parameter value invalid",
            0x2700 => "write protected",
            0x2800 => "not ready to ready change, medium may have changed",
            0x2900 => "power on, reset, or bus device reset occurred",
            0x2901 => "power on occurred",
            0x2902 => "SCSI bus reset occurred",
            0x2903 => "bus device reset function occurred",
            0x2904 => "device internal reset",
            0x2907 => "I_T nexus loss occurred",
            0x2a00 => "parameters changed",
            0x2a01 => "mode parameters changed",
            0x2a02 => "log parameters changed",
            0x2a03 => "reservations preempted",
            0x2a04 => "reservations released",
            0x2a05 => "registrations preempted",
            0x2a06 => "asymmetric access state changed",
            0x2a09 => "capacity data has changed",
            0x2c00 => "command sequence error",
            0x2f00 => "commands cleared by another initiator",
            0x3a00 => "medium not present",
            0x3f00 => "target operating conditions have changed",
            0x3f01 => "microcode has been changed",
            0x3f03 => "inquiry data has changed",
            0x3f0e => "reported luns data has changed",
            0x4400 => "internal target failure",
            0x5503 => "insufficient resources",
            0x5504 => "insufficient registration resources",
            _ => return None,
        })
    }
}

/// "ASC/ASCQ 2Ah/05h (registrations preempted)".
impl fmt::Display for AdditionalSense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ASC/ASCQ {:02X}h/{:02X}h", self.asc(), self.ascq())?;
        if let Some(description) = self.description() {
            write!(f, " ({description})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real sense bytes, captured in the QEMU lab (Debian kernel 6.1.0-57, LIO iSCSI fileio LUNs and
    // scsi_debug) with `sg_raw -vvv` / `sg_persist -vvv` through /dev/sdX by
    // sg-io/testdata/capture-sense.sh; the console is in sg-io/testdata/lab-capture.txt. The Linux sd
    // layer passes the target's sense through unchanged: LIO answers in fixed format (D_SENSE=0),
    // scsi_debug in either, per its `dsense` parameter. The power-on UA of a new nexus is consumed by
    // the kernel's own scan, so the 29h cases come from resets (`sg_reset -d`).

    /// LIO: PERSISTENT RESERVE IN with reserved service action 05h (`5e 05 … ff 00`).
    const LIO_PR_IN_BAD_SERVICE_ACTION: [u8; 18] = [
        0x70, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x24, 0x00, 0x00,
        0x00, 0x00, 0x00,
    ];
    /// LIO: WRITE(10) from the initiator whose registration another node preempted-and-aborted;
    /// the first command after the preemption.
    const LIO_REGISTRATIONS_PREEMPTED: [u8; 18] = [
        0x70, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x2a, 0x05, 0x00,
        0x00, 0x00, 0x00,
    ];
    /// LIO: vendor-specific opcode FFh. scsi_debug answers PERSISTENT RESERVE IN with the same bytes.
    const LIO_INVALID_OPCODE: [u8; 18] = [
        0x70, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00,
        0x00, 0x00, 0x00,
    ];
    /// scsi_debug opts=2 (medium error at LBA 1234h): READ(10) of LBA 1234h, fixed format; VALID set.
    const SCSI_DEBUG_MEDIUM_ERROR_FIXED: [u8; 18] = [
        0xf0, 0x00, 0x03, 0x00, 0x00, 0x12, 0x34, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00,
        0x00, 0x00, 0x00,
    ];
    /// The same with dsense=1: descriptor format, no descriptors (scsi_debug omits the LBA).
    const SCSI_DEBUG_MEDIUM_ERROR_DESCRIPTOR: [u8; 8] = [0x72, 0x03, 0x11, 0x00, 0, 0, 0, 0x00];
    /// scsi_debug dsense=1: PERSISTENT RESERVE IN, READ KEYS.
    const SCSI_DEBUG_INVALID_OPCODE_DESCRIPTOR: [u8; 8] = [0x72, 0x05, 0x20, 0x00, 0, 0, 0, 0x00];
    /// scsi_debug dsense=1: INQUIRY `12 01 77 00 ff 00` (EVPD page 77h): sense-key specific
    /// descriptor pointing at CDB byte 2.
    const SCSI_DEBUG_INVALID_FIELD_DESCRIPTOR: [u8; 16] = [
        0x72, 0x05, 0x24, 0x00, 0x00, 0x00, 0x00, 0x08, 0x02, 0x06, 0x00, 0x00, 0xc0, 0x00, 0x02,
        0x00,
    ];
    /// scsi_debug dsense=0: the same INQUIRY, fixed format with SKSV in byte 15.
    const SCSI_DEBUG_INVALID_FIELD_FIXED: [u8; 18] = [
        0x70, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x24, 0x00, 0x00,
        0xc0, 0x00, 0x02,
    ];

    /// LIO: TEST UNIT READY after `sg_reset -d` (LUN RESET) on node A; both nodes get this.
    const LIO_BUS_DEVICE_RESET: [u8; 18] = [
        0x70, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x29, 0x03, 0x00,
        0x00, 0x00, 0x00,
    ];
    /// scsi_debug dsense=0: TEST UNIT READY after `sg_reset -d`.
    const SCSI_DEBUG_RESET_FIXED: [u8; 18] = [
        0x70, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x29, 0x00, 0x00,
        0x00, 0x00, 0x00,
    ];
    /// scsi_debug dsense=1: the same.
    const SCSI_DEBUG_RESET_DESCRIPTOR: [u8; 8] = [0x72, 0x06, 0x29, 0x00, 0, 0, 0, 0x00];

    fn parse(bytes: &[u8]) -> Sense {
        Sense::parse(bytes).unwrap_or_else(|| panic!("unparsed: {}", Sense::to_hex(bytes)))
    }

    #[test]
    fn lio_invalid_field_in_cdb() {
        let sense = parse(&LIO_PR_IN_BAD_SERVICE_ACTION);
        assert_eq!(sense.format, SenseFormat::Fixed);
        assert!(!sense.deferred);
        assert_eq!(sense.key, SenseKey::ILLEGAL_REQUEST);
        assert_eq!(sense.additional(), AdditionalSense::INVALID_FIELD_IN_CDB);
        assert_eq!(sense.information, None);
        // LIO sets no field pointer here.
        assert_eq!(sense.field_pointer(), None);
        assert_eq!(
            sense.to_string(),
            "ILLEGAL REQUEST, 24h/00h invalid field in CDB"
        );
    }

    #[test]
    fn lio_registrations_preempted() {
        let sense = parse(&LIO_REGISTRATIONS_PREEMPTED);
        assert_eq!(sense.key, SenseKey::UNIT_ATTENTION);
        assert_eq!(sense.additional(), AdditionalSense::REGISTRATIONS_PREEMPTED);
        assert!(sense.additional().is_parameters_changed_family());
        assert!(!sense.additional().is_power_on_reset_family());
        assert_eq!(
            sense.to_string(),
            "UNIT ATTENTION, 2Ah/05h registrations preempted"
        );
        assert_eq!(
            sense.additional().to_string(),
            "ASC/ASCQ 2Ah/05h (registrations preempted)"
        );
    }

    #[test]
    fn reset_unit_attentions() {
        for bytes in [
            &SCSI_DEBUG_RESET_FIXED[..],
            &SCSI_DEBUG_RESET_DESCRIPTOR[..],
        ] {
            let sense = parse(bytes);
            assert_eq!(sense.key, SenseKey::UNIT_ATTENTION);
            assert_eq!(
                sense.additional(),
                AdditionalSense::POWER_ON_RESET_OR_BUS_DEVICE_RESET
            );
            assert_eq!(
                sense.to_string(),
                "UNIT ATTENTION, 29h/00h power on, reset, or bus device reset occurred"
            );
        }
        let sense = parse(&LIO_BUS_DEVICE_RESET);
        assert_eq!(sense.format, SenseFormat::Fixed);
        assert!(sense.additional().is_power_on_reset_family());
        assert_eq!(
            sense.to_string(),
            "UNIT ATTENTION, 29h/03h bus device reset function occurred"
        );
    }

    #[test]
    fn invalid_opcode_in_both_formats() {
        for bytes in [
            &LIO_INVALID_OPCODE[..],
            &SCSI_DEBUG_INVALID_OPCODE_DESCRIPTOR[..],
        ] {
            let sense = parse(bytes);
            assert_eq!(sense.key, SenseKey::ILLEGAL_REQUEST);
            assert_eq!(
                sense.additional(),
                AdditionalSense::INVALID_COMMAND_OPERATION_CODE
            );
            assert_eq!(
                sense.to_string(),
                "ILLEGAL REQUEST, 20h/00h invalid command operation code"
            );
        }
        assert_eq!(
            parse(&SCSI_DEBUG_INVALID_OPCODE_DESCRIPTOR).format,
            SenseFormat::Descriptor
        );
    }

    #[test]
    fn medium_error_with_valid_information_fixed() {
        let sense = parse(&SCSI_DEBUG_MEDIUM_ERROR_FIXED);
        assert_eq!(sense.format, SenseFormat::Fixed);
        assert_eq!(sense.key, SenseKey::MEDIUM_ERROR);
        assert_eq!((sense.asc, sense.ascq), (0x11, 0x00));
        assert_eq!(sense.information, Some(0x1234));
        assert_eq!(
            sense.to_string(),
            "MEDIUM ERROR, 11h/00h unrecovered read error, information 0x1234"
        );
    }

    #[test]
    fn medium_error_descriptor_without_descriptors() {
        let sense = parse(&SCSI_DEBUG_MEDIUM_ERROR_DESCRIPTOR);
        assert_eq!(sense.format, SenseFormat::Descriptor);
        assert_eq!(sense.key, SenseKey::MEDIUM_ERROR);
        assert_eq!((sense.asc, sense.ascq), (0x11, 0x00));
        assert_eq!(sense.information, None);
        assert_eq!(sense.key_specific, None);
    }

    #[test]
    fn field_pointer_in_both_formats() {
        let expected = FieldPointer {
            in_cdb: true,
            byte: 2,
            bit: None,
        };
        for bytes in [
            &SCSI_DEBUG_INVALID_FIELD_FIXED[..],
            &SCSI_DEBUG_INVALID_FIELD_DESCRIPTOR[..],
        ] {
            let sense = parse(bytes);
            assert_eq!(sense.additional(), AdditionalSense::INVALID_FIELD_IN_CDB);
            assert_eq!(sense.field_pointer(), Some(expected));
            assert_eq!(
                sense.to_string(),
                "ILLEGAL REQUEST, 24h/00h invalid field in CDB, invalid field at CDB byte 2"
            );
        }
    }

    // Descriptor-format cases built from the SPC-4 layout (§4.4.2): the lab's targets do not emit
    // an information descriptor.

    #[test]
    fn descriptor_information_and_key_specific_descriptors() {
        let bytes = [
            0x73, 0x05, 0x26, 0x00, 0, 0, 0,
            20, // deferred, ILLEGAL REQUEST, 26h/00h, 20 more
            0x00, 0x0a, 0x80, 0x00, 0, 0, 0, 0x01, 0x23, 0x45, 0x67,
            0x89, // information, VALID
            0x02, 0x06, 0, 0, 0x8b, 0x00, 0x18, 0x00, // SKSV, parameter list byte 24 bit 3
        ];
        let sense = parse(&bytes);
        assert_eq!(sense.format, SenseFormat::Descriptor);
        assert!(sense.deferred);
        assert_eq!(
            sense.additional(),
            AdditionalSense::INVALID_FIELD_IN_PARAMETER_LIST
        );
        assert_eq!(sense.information, Some(0x0001_2345_6789));
        assert_eq!(
            sense.field_pointer(),
            Some(FieldPointer {
                in_cdb: false,
                byte: 24,
                bit: Some(3),
            })
        );
        assert_eq!(
            sense.to_string(),
            "ILLEGAL REQUEST, 26h/00h invalid field in parameter list (deferred error), \
             information 0x123456789, invalid field at parameter list byte 24 bit 3"
        );
    }

    #[test]
    fn descriptor_information_without_valid_bit_is_ignored() {
        let bytes = [
            0x72, 0x03, 0x11, 0x00, 0, 0, 0, 12, //
            0x00, 0x0a, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0x12, 0x34,
        ];
        assert_eq!(parse(&bytes).information, None);
    }

    #[test]
    fn descriptor_walk_skips_unknown_and_stops_at_truncation() {
        let bytes = [
            0x72, 0x06, 0x29, 0x00, 0, 0, 0,
            30, // additional length claims more than is present
            0x80, 0x02, 0xaa, 0xbb, // vendor descriptor, skipped
            0x00, 0x0a, 0x80, 0x00, 0, 0, 0, 0, 0, 0, 0, 0x07, // information 7
            0x02, 0x06, 0x80, // truncated sense-key specific descriptor
        ];
        let sense = parse(&bytes);
        assert_eq!(
            sense.additional(),
            AdditionalSense::POWER_ON_RESET_OR_BUS_DEVICE_RESET
        );
        assert!(sense.additional().is_power_on_reset_family());
        assert_eq!(sense.information, Some(7));
        assert_eq!(sense.key_specific, None);
    }

    #[test]
    fn fixed_deferred_and_truncated() {
        // 71h = deferred; the buffer ends before ASC: ASC/ASCQ read as 0.
        let sense = parse(&[0x71, 0x00, 0x04, 0x00]);
        assert!(sense.deferred);
        assert_eq!(sense.key, SenseKey::HARDWARE_ERROR);
        assert_eq!(
            sense.additional(),
            AdditionalSense::NO_ADDITIONAL_SENSE_INFORMATION
        );
        // ADDITIONAL SENSE LENGTH 4 hides ASC at byte 12 even if the buffer is longer.
        let mut short = LIO_REGISTRATIONS_PREEMPTED;
        short[7] = 4;
        assert_eq!(parse(&short).asc, 0);
    }

    #[test]
    fn not_ready_progress_indication() {
        // NOT READY 04h/04h format in progress, SKSV with progress 8000h (half done).
        let bytes = [
            0x70, 0, 0x02, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x04, 0x04, 0, 0x80, 0x80, 0x00,
        ];
        let sense = parse(&bytes);
        assert_eq!(sense.progress(), Some(0x8000));
        assert_eq!(sense.field_pointer(), None);
    }

    #[test]
    fn unknown_or_short_input_is_none() {
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x70, 0x00]), None);
        assert_eq!(Sense::parse(&[0x72]), None);
        assert_eq!(Sense::parse(&[0x7f, 0, 5, 0, 0, 0, 0, 0]), None); // vendor specific
        assert_eq!(Sense::parse(&[0x00; 18]), None);
    }

    #[test]
    fn codes_without_names_still_display() {
        let sense = parse(&[0x72, 0x0c, 0x99, 0x42, 0, 0, 0, 0]);
        assert_eq!(sense.to_string(), "sense key Ch, 99h/42h");
        assert_eq!(AdditionalSense(0x9942).to_string(), "ASC/ASCQ 99h/42h");
        assert_eq!(AdditionalSense(0x2a05).asc(), 0x2a);
        assert_eq!(AdditionalSense(0x2a05).ascq(), 0x05);
    }

    #[test]
    fn hex() {
        assert_eq!(Sense::to_hex(&[0x70, 0x00, 0x06]), "70 00 06");
        assert_eq!(Sense::to_hex(&[]), "");
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            if let Some(sense) = Sense::parse(&bytes) {
                let _ = sense.to_string();
            }
        }

        #[test]
        fn parse_never_panics_on_sense_like_input(
            code in 0x70u8..=0x73,
            rest in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            let mut bytes = vec![code];
            bytes.extend(rest);
            proptest::prop_assert!(Sense::parse(&bytes).is_some() || bytes.len() < 4);
        }
    }
}
