//! NVMe reservations (NVMe base specification, "Reservations"; the NVM command set's
//! Reservation Register, Report, Acquire and Release): the command dwords, the data each
//! command sends, and the extended Reservation Status data structure a Report returns.
//!
//! The engine speaks SCSI's operations; this module is the dictionary between them. Two
//! differences matter to callers:
//! - NVMe numbers reservation types 1-6 where SCSI uses 1, 3, 5, 6, 7, 8
//!   ([`nvme_rtype`], [`scsi_type`]).
//! - NVMe data is little-endian, and registrants are named by a 128-bit host identifier, not a
//!   SCSI TransportID (see [`TransportId::NvmeHostId`]).

use super::error::DecodeError;
pub use super::host_id::HostId;
use super::key::Key;
use super::transport_id::TransportId;
use super::types::ReservationType;
use super::wire;

/// Reservation Register (NVM command set opcode).
pub const RESERVATION_REGISTER: u8 = 0x0d;
/// Reservation Report.
pub const RESERVATION_REPORT: u8 = 0x0e;
/// Reservation Acquire.
pub const RESERVATION_ACQUIRE: u8 = 0x11;
/// Reservation Release.
pub const RESERVATION_RELEASE: u8 = 0x15;

/// Identify (admin opcode) with CNS 0: the Identify Namespace data structure.
pub const IDENTIFY: u8 = 0x06;
/// Identify Namespace's size.
pub const IDENTIFY_LEN: usize = 4096;
/// RESCAP: byte 31 of Identify Namespace.
const RESCAP_OFFSET: usize = 31;

/// Ignore Existing Key (bit 3 of cdw10 in Register, Acquire and Release).
const IEKEY: u32 = 1 << 3;

/// The extended Reservation Status header (EDS=1).
pub const REPORT_HEADER_LEN: usize = 64;
/// One Registered Controller extended data structure.
pub const REPORT_DESCRIPTOR_LEN: usize = 64;
/// Report cdw11 bit 0: Extended Data Structure (128-bit host identifiers). Linux nvmet answers
/// a Report without it with Host Identifier Inconsistent Format.
pub const REPORT_CDW11_EDS: u32 = 1;

/// The NVMe RTYPE of a SCSI reservation type.
pub fn nvme_rtype(rtype: ReservationType) -> u8 {
    match rtype {
        ReservationType::WriteExclusive => 1,
        ReservationType::ExclusiveAccess => 2,
        ReservationType::WriteExclusiveRegistrantsOnly => 3,
        ReservationType::ExclusiveAccessRegistrantsOnly => 4,
        ReservationType::WriteExclusiveAllRegistrants => 5,
        ReservationType::ExclusiveAccessAllRegistrants => 6,
    }
}

/// The SCSI reservation type of an NVMe RTYPE (or of a Linux `pr_type`, numbered the same);
/// `None` for 0 (no reservation) and undefined codes.
pub fn scsi_type(rtype: u8) -> Option<ReservationType> {
    ReservationType::ALL
        .into_iter()
        .find(|&t| nvme_rtype(t) == rtype)
}

/// Reservation Register Action (RREGA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    Register = 0,
    Unregister = 1,
    Replace = 2,
}

/// Reservation Acquire Action (RACQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    Acquire = 0,
    Preempt = 1,
    PreemptAndAbort = 2,
}

/// Reservation Release Action (RRELA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    Release = 0,
    Clear = 1,
}

fn iekey(ignore: bool) -> u32 {
    if ignore { IEKEY } else { 0 }
}

/// Reservation Register cdw10. CPTPL (bits 31:30) is left 00b, "no change": persistence is the
/// target's setting (Linux nvmet ignores CPTPL entirely).
pub fn register_cdw10(action: RegisterAction, ignore_key: bool) -> u32 {
    action as u32 | iekey(ignore_key)
}

/// Reservation Acquire cdw10.
pub fn acquire_cdw10(action: AcquireAction, ignore_key: bool, rtype: ReservationType) -> u32 {
    action as u32 | iekey(ignore_key) | u32::from(nvme_rtype(rtype)) << 8
}

/// Reservation Release cdw10. Clear takes no type (`None`).
pub fn release_cdw10(
    action: ReleaseAction,
    ignore_key: bool,
    rtype: Option<ReservationType>,
) -> u32 {
    action as u32 | iekey(ignore_key) | u32::from(rtype.map_or(0, nvme_rtype)) << 8
}

/// Reservation Register data: Current Reservation Key, New Reservation Key.
pub fn register_data(current: Key, new: Key) -> [u8; 16] {
    two_keys(current, new)
}

/// Reservation Acquire data: Current Reservation Key, Preempt Reservation Key (the victim's).
pub fn acquire_data(current: Key, preempt: Key) -> [u8; 16] {
    two_keys(current, preempt)
}

/// Reservation Release data: Current Reservation Key.
pub fn release_data(current: Key) -> [u8; 8] {
    current.get().to_le_bytes()
}

fn two_keys(first: Key, second: Key) -> [u8; 16] {
    let mut out = [0; 16];
    let (a, b) = out.split_at_mut(8);
    a.copy_from_slice(&first.get().to_le_bytes());
    b.copy_from_slice(&second.get().to_le_bytes());
    out
}

/// Reservation Report cdw10: NUMD, the buffer length in dwords minus one (0 for less than 4
/// bytes; a length beyond the 32-bit field saturates).
pub fn report_cdw10(buffer_len: usize) -> u32 {
    let dwords = buffer_len / 4;
    u32::try_from(dwords.saturating_sub(1)).unwrap_or(u32::MAX)
}

/// Which Reservation Status data structure a Report returns: EDS (cdw11 bit 0) set asks for the
/// extended one, with 128-bit host identifiers; clear, the original one, with 64-bit host
/// identifiers. A controller answers the one it cannot give with Host Identifier Inconsistent
/// Format (Linux nvmet refuses EDS=0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportFormat {
    Extended,
    Basic,
}

impl ReportFormat {
    /// Report cdw11: EDS.
    pub fn cdw11(self) -> u32 {
        match self {
            ReportFormat::Extended => REPORT_CDW11_EDS,
            ReportFormat::Basic => 0,
        }
    }

    fn header_len(self) -> usize {
        match self {
            ReportFormat::Extended => REPORT_HEADER_LEN,
            ReportFormat::Basic => BASIC_HEADER_LEN,
        }
    }

    fn descriptor_len(self) -> usize {
        match self {
            ReportFormat::Extended => REPORT_DESCRIPTOR_LEN,
            ReportFormat::Basic => BASIC_DESCRIPTOR_LEN,
        }
    }

    /// The bytes a Report of this format needs for `registrants` registrants.
    pub fn length(self, registrants: u16) -> usize {
        self.descriptor_len()
            .saturating_mul(usize::from(registrants))
            .saturating_add(self.header_len())
    }

    /// The length a Report's header says it needs (REGCTL descriptors after the header); `None`
    /// if REGCTL itself was not received.
    pub fn required_length(self, received: &[u8]) -> Option<usize> {
        wire::le16(received, 5).map(|regctl| self.length(regctl))
    }
}

/// The original (EDS=0) Reservation Status header and Registered Controller data structure.
const BASIC_HEADER_LEN: usize = 24;
const BASIC_DESCRIPTOR_LEN: usize = 24;

/// The bytes an extended Report needs for `registrants` registrants.
pub fn report_length(registrants: u16) -> usize {
    ReportFormat::Extended.length(registrants)
}

/// The length an extended Report's header says it needs; `None` if REGCTL was not received.
pub fn required_report_length(received: &[u8]) -> Option<usize> {
    ReportFormat::Extended.required_length(received)
}

/// One registrant in a Reservation Report (Registered Controller data structure, extended or
/// not).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Registrant {
    /// The controller (one per path to the subsystem), 0xFFFF when the host is registered but
    /// no controller of it is associated (dynamic controller model).
    pub cntlid: u16,
    /// RCSTS bit 0: this registrant holds the reservation (every registrant under an
    /// all-registrants type).
    pub holder: bool,
    pub key: Key,
    /// The host identifier: what NVMe registers, so every controller of one host shares it.
    pub host_id: HostId,
}

/// A Reservation Status data structure (what a Report returns).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReservationStatus {
    pub format: ReportFormat,
    pub generation: u32,
    /// The reservation held, `None` when none is (RTYPE 0).
    pub rtype: Option<ReservationType>,
    /// PTPLS: reservations persist through a power loss.
    pub ptpl: bool,
    /// One per registered controller (NVMe counts registrants by controller, so one host
    /// with two paths may appear twice with the same host id and key).
    pub registrants: Vec<Registrant>,
}

impl ReservationStatus {
    /// Decodes an extended Report (EDS=1). Fails with [`DecodeError::Truncated`] when REGCTL
    /// counts more registrants than `bytes` holds: re-issue the Report with the `needed` length.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        Self::decode_as(ReportFormat::Extended, bytes)
    }

    /// Decodes a Report of `format`, like [`Self::decode`].
    pub fn decode_as(format: ReportFormat, bytes: &[u8]) -> Result<Self, DecodeError> {
        const WHAT: &str = "NVMe Reservation Report";
        let (Some(generation), Some(rtype_code), Some(regctl), Some(ptpls)) = (
            wire::le32(bytes, 0),
            wire::u8_at(bytes, 4),
            wire::le16(bytes, 5),
            wire::u8_at(bytes, 9),
        ) else {
            return Err(DecodeError::Truncated {
                needed: format.header_len(),
                got: bytes.len(),
            });
        };
        let needed = format.length(regctl);
        let Some(body) = bytes
            .get(..needed)
            .and_then(|all| all.get(format.header_len()..))
        else {
            return Err(DecodeError::Truncated {
                needed,
                got: bytes.len(),
            });
        };
        let rtype = match rtype_code {
            0 => None,
            code => Some(scsi_type(code).ok_or(DecodeError::UnknownType { what: WHAT, code })?),
        };
        let registrants = body
            .chunks_exact(format.descriptor_len())
            .filter_map(|d| {
                let (key, host_id) = match format {
                    ReportFormat::Extended => {
                        (wire::le64(d, 8)?, HostId::Extended(wire::array(d, 16)?))
                    }
                    ReportFormat::Basic => (wire::le64(d, 16)?, HostId::Basic(wire::le64(d, 8)?)),
                };
                Some(Registrant {
                    cntlid: wire::le16(d, 0)?,
                    holder: wire::u8_at(d, 2)? & 0x01 != 0,
                    key: Key::new(key),
                    host_id,
                })
            })
            .collect();
        Ok(ReservationStatus {
            format,
            generation,
            rtype,
            ptpl: ptpls & 0x01 != 0,
            registrants,
        })
    }

    /// The Report as a controller would return it (for tests and models). A registrant whose
    /// host id does not fit the format is written with the id truncated or zero-extended.
    pub fn encode(&self) -> Vec<u8> {
        let count = u16::try_from(self.registrants.len()).unwrap_or(u16::MAX);
        let mut out = vec![0; self.format.header_len()];
        out.splice(0..4, self.generation.to_le_bytes());
        out.splice(4..5, [self.rtype.map_or(0, nvme_rtype)]);
        out.splice(5..7, count.to_le_bytes());
        out.splice(9..10, [u8::from(self.ptpl)]);
        for r in self.registrants.iter().take(usize::from(count)) {
            let mut d = vec![0; self.format.descriptor_len()];
            d.splice(0..2, r.cntlid.to_le_bytes());
            d.splice(2..3, [u8::from(r.holder)]);
            let wide = match r.host_id {
                HostId::Extended(bytes) => bytes,
                HostId::Basic(id) => u128::from(id).to_le_bytes(),
            };
            match self.format {
                ReportFormat::Extended => {
                    d.splice(8..16, r.key.get().to_le_bytes());
                    d.splice(16..32, wide);
                }
                ReportFormat::Basic => {
                    d.splice(8..16, wide.into_iter().take(8));
                    d.splice(16..24, r.key.get().to_le_bytes());
                }
            }
            out.extend(d);
        }
        out
    }

    /// The registered keys, one per registrant, in report order.
    pub fn keys(&self) -> Vec<Key> {
        self.registrants.iter().map(|r| r.key).collect()
    }
}

/// RESCAP, Identify Namespace byte 31: what reservations the namespace supports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReservationCapabilities {
    /// Bit 0: Persist Through Power Loss capable.
    pub ptpl: bool,
    /// Bits 1-6, one per type, as SCSI types.
    pub types: Vec<ReservationType>,
    /// Bit 7: Ignore Existing Key behaves as NVMe 1.3 and later define it.
    pub iekey: bool,
}

impl ReservationCapabilities {
    /// From RESCAP; a namespace without reservations has 0 (no types).
    pub fn from_rescap(rescap: u8) -> Self {
        let types = ReservationType::ALL
            .into_iter()
            .filter(|&t| rescap & (1 << nvme_rtype(t)) != 0)
            .collect();
        ReservationCapabilities {
            ptpl: rescap & 0x01 != 0,
            types,
            iekey: rescap & 0x80 != 0,
        }
    }

    /// From an Identify Namespace data structure.
    pub fn decode_identify(identify: &[u8]) -> Result<Self, DecodeError> {
        let rescap = wire::u8_at(identify, RESCAP_OFFSET).ok_or(DecodeError::Truncated {
            needed: RESCAP_OFFSET.saturating_add(1),
            got: identify.len(),
        })?;
        Ok(Self::from_rescap(rescap))
    }

    /// The RESCAP byte.
    pub fn rescap(&self) -> u8 {
        let types = self.types.iter().fold(0u8, |m, &t| m | 1 << nvme_rtype(t));
        types | u8::from(self.ptpl) | u8::from(self.iekey) << 7
    }
}

/// A registrant's host identifier as a [`TransportId`], for READ FULL STATUS.
pub fn host_transport_id(registrant: &Registrant) -> TransportId {
    TransportId::NvmeHostId {
        host_id: registrant.host_id,
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use ReservationType as T;

    #[test]
    fn types_map_both_ways() {
        let pairs = [
            (T::WriteExclusive, 1),
            (T::ExclusiveAccess, 2),
            (T::WriteExclusiveRegistrantsOnly, 3),
            (T::ExclusiveAccessRegistrantsOnly, 4),
            (T::WriteExclusiveAllRegistrants, 5),
            (T::ExclusiveAccessAllRegistrants, 6),
        ];
        for (scsi, nvme) in pairs {
            assert_eq!(nvme_rtype(scsi), nvme);
            assert_eq!(scsi_type(nvme), Some(scsi));
        }
        assert_eq!(scsi_type(0), None);
        assert_eq!(scsi_type(7), None);
    }

    #[test]
    fn command_dwords() {
        assert_eq!(register_cdw10(RegisterAction::Register, false), 0);
        assert_eq!(register_cdw10(RegisterAction::Unregister, true), 0x9);
        assert_eq!(register_cdw10(RegisterAction::Replace, false), 0x2);
        assert_eq!(
            acquire_cdw10(
                AcquireAction::PreemptAndAbort,
                false,
                T::WriteExclusiveRegistrantsOnly
            ),
            0x302
        );
        assert_eq!(
            acquire_cdw10(
                AcquireAction::Acquire,
                false,
                T::ExclusiveAccessAllRegistrants
            ),
            0x600
        );
        assert_eq!(release_cdw10(ReleaseAction::Clear, false, None), 0x1);
        assert_eq!(
            release_cdw10(ReleaseAction::Release, false, Some(T::WriteExclusive)),
            0x100
        );
        assert_eq!(report_cdw10(4096), 1023);
        assert_eq!(report_cdw10(2), 0);
    }

    #[test]
    fn data_is_little_endian() {
        let data = register_data(Key::new(0x0102), Key::new(0xa0b0));
        assert_eq!(data[..8], [2, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(data[8..], [0xb0, 0xa0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(release_data(Key::new(0xff)), [0xff, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(acquire_data(Key::new(1), Key::new(2))[8], 2);
    }

    fn sample() -> ReservationStatus {
        ReservationStatus {
            format: ReportFormat::Extended,
            generation: 7,
            rtype: Some(T::WriteExclusiveRegistrantsOnly),
            ptpl: false,
            registrants: vec![
                Registrant {
                    cntlid: 1,
                    holder: true,
                    key: Key::new(0xabc),
                    host_id: HostId::Extended([0x11; 16]),
                },
                Registrant {
                    cntlid: 2,
                    holder: false,
                    key: Key::new(0xdef),
                    host_id: HostId::Extended([0x22; 16]),
                },
            ],
        }
    }

    #[test]
    fn report_decodes_at_the_specified_offsets() {
        let bytes = sample().encode();
        assert_eq!(bytes.len(), 64 + 2 * 64);
        // GEN @0, RTYPE @4, REGCTL @5-6; descriptor: CNTLID @0, RCSTS @2, RKEY @8, HOSTID @16.
        assert_eq!(bytes[0], 7);
        assert_eq!(bytes[4], 3);
        assert_eq!(bytes[5], 2);
        assert_eq!(bytes[64 + 2], 1);
        assert_eq!(bytes[64 + 8], 0xbc);
        assert_eq!(bytes[64 + 16], 0x11);
        assert_eq!(ReservationStatus::decode(&bytes), Ok(sample()));
        assert_eq!(required_report_length(&bytes), Some(192));
        assert_eq!(sample().keys(), vec![Key::new(0xabc), Key::new(0xdef)]);
    }

    #[test]
    fn the_original_report_format_has_64_bit_host_ids_before_the_key() {
        let basic = ReservationStatus {
            format: ReportFormat::Basic,
            registrants: vec![Registrant {
                cntlid: 3,
                holder: true,
                key: Key::new(0xabc),
                host_id: HostId::Basic(0x1122),
            }],
            ..sample()
        };
        let bytes = basic.encode();
        // Header 24 bytes; descriptor: CNTLID @0, RCSTS @2, HOSTID @8, RKEY @16 (24 bytes).
        assert_eq!(bytes.len(), 48);
        assert_eq!((bytes[24], bytes[26]), (3, 1));
        assert_eq!((bytes[24 + 8], bytes[24 + 9]), (0x22, 0x11));
        assert_eq!((bytes[24 + 16], bytes[24 + 17]), (0xbc, 0x0a));
        assert_eq!(
            ReservationStatus::decode_as(ReportFormat::Basic, &bytes),
            Ok(basic)
        );
        assert_eq!(HostId::Basic(0x1122).to_string(), "0x0000000000001122");
        assert_eq!(
            HostId::Extended([0xab; 16]).to_string(),
            "abababab-abab-abab-abab-abababababab"
        );
        assert_eq!(ReportFormat::Basic.cdw11(), 0);
        assert_eq!(ReportFormat::Extended.cdw11(), 1);
    }

    #[test]
    fn more_registrants_than_fit_is_truncated_with_the_length_needed() {
        let bytes = sample().encode();
        assert_eq!(
            ReservationStatus::decode(&bytes[..128]),
            Err(DecodeError::Truncated {
                needed: 192,
                got: 128
            })
        );
        // The header's count is read as soon as its bytes are there.
        assert_eq!(
            ReservationStatus::decode(&bytes[..10]),
            Err(DecodeError::Truncated {
                needed: 192,
                got: 10
            })
        );
        assert_eq!(
            ReservationStatus::decode(&bytes[..6]),
            Err(DecodeError::Truncated { needed: 64, got: 6 })
        );
        let mut unknown = bytes.clone();
        unknown[4] = 9;
        assert!(matches!(
            ReservationStatus::decode(&unknown),
            Err(DecodeError::UnknownType { code: 9, .. })
        ));
        let mut none = bytes;
        none[4] = 0;
        assert_eq!(ReservationStatus::decode(&none).unwrap().rtype, None);
    }

    #[test]
    fn rescap_bits() {
        let caps = ReservationCapabilities::from_rescap(0xff);
        assert!(caps.ptpl && caps.iekey);
        assert_eq!(caps.types, T::ALL.to_vec());
        assert_eq!(caps.rescap(), 0xff);
        let only_wero = ReservationCapabilities::from_rescap(1 << 3);
        assert_eq!(only_wero.types, vec![T::WriteExclusiveRegistrantsOnly]);
        assert!(ReservationCapabilities::decode_identify(&[0; 31]).is_err());
        let mut identify = vec![0; IDENTIFY_LEN];
        identify[31] = 0x7e;
        let caps = ReservationCapabilities::decode_identify(&identify).unwrap();
        assert_eq!((caps.types.len(), caps.ptpl, caps.iekey), (6, false, false));
    }
}
