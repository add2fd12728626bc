//! TransportIDs (SPC-4 7.6.4): how PR data names an initiator port, for READ FULL STATUS,
//! SPEC_I_PT registration and REGISTER AND MOVE.

use std::fmt;
use std::str::FromStr;

use super::error::{DecodeError, TransportIdError};
use super::host_id::HostId;
use super::wire;

const PROTOCOL_FC: u8 = 0x0;
const PROTOCOL_ISCSI: u8 = 0x5;
const PROTOCOL_SAS: u8 = 0x6;
/// SPC "no specific protocol": how an NVMe host identifier is encoded, since SPC has no NVMe one.
const PROTOCOL_NONE: u8 = 0xf;
const NVME_HOSTID_PREFIX: &str = "nvme-hostid:";
/// Every protocol but iSCSI uses a fixed 24-byte TransportID.
const FIXED_LEN: usize = 24;
const ISCSI_HEADER_LEN: usize = 4;
/// SPC: the iSCSI ADDITIONAL LENGTH shall be at least 20 (LIO ignores this; we accept less).
const ISCSI_MIN_ADDITIONAL_LEN: usize = 20;
/// RFC 7143: an iSCSI name is at most 223 bytes.
const ISCSI_NAME_MAX: usize = 223;
/// An ISID is 6 bytes: at most 12 hex digits.
const ISID_MAX_DIGITS: usize = 12;
const ISID_SEPARATOR: &str = ",i,0x";

/// An initiator port (or device) as SCSI persistent reservations name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TransportId {
    /// Fibre Channel: the N_Port world-wide name.
    FibreChannel { n_port_name: u64 },
    /// SAS: the initiator port's SAS address.
    Sas { address: u64 },
    /// iSCSI: the initiator name, plus the ISID (hex digits without `0x`) when the TransportID
    /// names one port (format 01b) rather than the whole initiator device (format 00b).
    Iscsi { name: String, isid: Option<String> },
    /// An NVMe registrant: NVMe reservations name a host by its Host Identifier (128 bits, or
    /// 64 in the original Report format), not by a port. Not a SCSI TransportID: it never comes
    /// from SCSI data and cannot be sent in a SCSI command ([`TransportId::validate`] refuses
    /// it). Shown as `nvme-hostid:` and the identifier: a UUID (Linux host ids are UUIDs), or
    /// `0x` and 16 hex digits for a 64-bit one.
    NvmeHostId { host_id: HostId },
    /// Any other protocol or format, kept verbatim: `bytes` is the TransportID after byte 0.
    Other {
        protocol_id: u8,
        format: u8,
        bytes: Vec<u8>,
    },
}

impl TransportId {
    /// An iSCSI TransportID, validated (see [`TransportId::validate`]).
    pub fn iscsi(name: impl Into<String>, isid: Option<String>) -> Result<Self, TransportIdError> {
        let id = TransportId::Iscsi {
            name: name.into(),
            isid,
        };
        id.validate()?;
        Ok(id)
    }

    /// The PROTOCOL IDENTIFIER (low 4 bits of byte 0).
    pub fn protocol_id(&self) -> u8 {
        match self {
            TransportId::FibreChannel { .. } => PROTOCOL_FC,
            TransportId::Sas { .. } => PROTOCOL_SAS,
            TransportId::Iscsi { .. } => PROTOCOL_ISCSI,
            TransportId::NvmeHostId { .. } => PROTOCOL_NONE,
            TransportId::Other { protocol_id, .. } => protocol_id & 0x0f,
        }
    }

    /// The FORMAT CODE (top 2 bits of byte 0).
    pub fn format(&self) -> u8 {
        match self {
            TransportId::FibreChannel { .. }
            | TransportId::Sas { .. }
            | TransportId::NvmeHostId { .. } => 0,
            TransportId::Iscsi { isid, .. } => u8::from(isid.is_some()),
            TransportId::Other { format, .. } => format & 0x03,
        }
    }

    /// Checks what `encode` cannot represent faithfully: iSCSI names and ISIDs that are empty,
    /// too long, or would be ambiguous on the wire or in [`fmt::Display`], and `Other` values
    /// whose bytes do not have their protocol's length.
    pub fn validate(&self) -> Result<(), TransportIdError> {
        let fail = |reason| {
            Err(TransportIdError {
                input: self.to_string(),
                reason,
            })
        };
        match self {
            TransportId::FibreChannel { .. } | TransportId::Sas { .. } => Ok(()),
            TransportId::NvmeHostId { .. } => {
                fail("an NVMe host identifier is not a SCSI TransportID; it cannot be sent")
            }
            TransportId::Iscsi { name, isid } => {
                if name.is_empty() {
                    return fail("empty iSCSI name");
                }
                if name.len() > ISCSI_NAME_MAX {
                    return fail("iSCSI name longer than 223 bytes");
                }
                if name
                    .chars()
                    .any(|c| c == ',' || c.is_whitespace() || c.is_control())
                {
                    return fail("iSCSI name contains a comma, whitespace or a control character");
                }
                match isid {
                    Some(isid) if isid.is_empty() || isid.len() > ISID_MAX_DIGITS => {
                        fail("ISID must have 1 to 12 hex digits")
                    }
                    Some(isid) if !isid.bytes().all(|b| b.is_ascii_hexdigit()) => {
                        fail("ISID is not hexadecimal")
                    }
                    _ => Ok(()),
                }
            }
            TransportId::Other {
                protocol_id,
                format,
                bytes,
            } => {
                if *protocol_id > 0x0f || *format > 0x03 {
                    return fail("protocol identifier above 0xf or format code above 3");
                }
                let consistent = if *protocol_id == PROTOCOL_ISCSI {
                    wire::be16(bytes, 1).is_some_and(|additional| {
                        Some(usize::from(additional)) == bytes.len().checked_sub(3)
                    })
                } else {
                    bytes.len() == FIXED_LEN - 1
                };
                if consistent {
                    Ok(())
                } else {
                    fail("byte count does not match the protocol's TransportID length")
                }
            }
        }
    }

    /// The wire form. Values that fail [`TransportId::validate`] are encoded as best it can
    /// (over-long iSCSI names get a saturated length); `PrOut::encode` validates first.
    pub fn encode(&self) -> Vec<u8> {
        let byte0 = (self.format() << 6) | self.protocol_id();
        match self {
            TransportId::FibreChannel { n_port_name } => {
                let mut out = vec![0; FIXED_LEN];
                out.splice(0..1, [byte0]);
                out.splice(8..16, n_port_name.to_be_bytes());
                out
            }
            TransportId::Sas { address } => {
                let mut out = vec![0; FIXED_LEN];
                out.splice(0..1, [byte0]);
                out.splice(4..12, address.to_be_bytes());
                out
            }
            // Not a wire form any target sends: a "no specific protocol" TransportID carrying
            // the id, so a FullStatus with NVMe registrants still encodes (tests, models).
            TransportId::NvmeHostId { host_id } => {
                let wide = match host_id {
                    HostId::Extended(bytes) => *bytes,
                    HostId::Basic(id) => u128::from(*id).to_be_bytes(),
                };
                let mut out = vec![0; FIXED_LEN];
                out.splice(0..1, [byte0]);
                out.splice(8..24, wide);
                out
            }
            TransportId::Iscsi { name, isid } => {
                let mut text = name.clone();
                if let Some(isid) = isid {
                    text.push_str(ISID_SEPARATOR);
                    text.push_str(isid);
                }
                let mut payload = text.into_bytes();
                payload.push(0); // null terminator
                let padded = payload
                    .len()
                    .max(ISCSI_MIN_ADDITIONAL_LEN)
                    .next_multiple_of(4);
                payload.resize(padded, 0);
                let additional = u16::try_from(payload.len()).unwrap_or(u16::MAX);
                let [hi, lo] = additional.to_be_bytes();
                let mut out = vec![byte0, 0, hi, lo];
                out.append(&mut payload);
                out
            }
            TransportId::Other { bytes, .. } => {
                let mut out = Vec::with_capacity(bytes.len().saturating_add(1));
                out.push(byte0);
                out.extend_from_slice(bytes);
                out
            }
        }
    }

    /// Decodes the TransportID at the start of `bytes`; returns it and how many bytes it used.
    /// iSCSI TransportIDs that are not UTF-8 or lack their separator come back as `Other`
    /// rather than failing, so one odd registrant does not hide the others.
    pub fn decode(bytes: &[u8]) -> Result<(TransportId, usize), DecodeError> {
        let byte0 = wire::u8_at(bytes, 0).ok_or(DecodeError::Truncated { needed: 1, got: 0 })?;
        let protocol_id = byte0 & 0x0f;
        let format = byte0 >> 6;
        let len = if protocol_id == PROTOCOL_ISCSI {
            let additional = wire::be16(bytes, 2).ok_or(DecodeError::Truncated {
                needed: ISCSI_HEADER_LEN,
                got: bytes.len(),
            })?;
            ISCSI_HEADER_LEN.saturating_add(usize::from(additional))
        } else {
            FIXED_LEN
        };
        let region = bytes.get(..len).ok_or(DecodeError::Truncated {
            needed: len,
            got: bytes.len(),
        })?;
        let other = || TransportId::Other {
            protocol_id,
            format,
            bytes: region.get(1..).unwrap_or_default().to_vec(),
        };
        let id = match (protocol_id, format) {
            (PROTOCOL_FC, 0) => {
                wire::be64(region, 8).map(|n_port_name| TransportId::FibreChannel { n_port_name })
            }
            (PROTOCOL_SAS, 0) => wire::be64(region, 4).map(|address| TransportId::Sas { address }),
            (PROTOCOL_ISCSI, 0 | 1) => {
                decode_iscsi(region.get(ISCSI_HEADER_LEN..).unwrap_or_default(), format)
            }
            _ => None,
        };
        Ok((id.unwrap_or_else(other), len))
    }
}

/// The iSCSI payload: ends at the first NUL whatever ADDITIONAL LENGTH says (SPC).
fn decode_iscsi(payload: &[u8], format: u8) -> Option<TransportId> {
    let text_len = payload
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(payload.len());
    let text = std::str::from_utf8(payload.get(..text_len)?).ok()?;
    let (name, isid) = if format == 1 {
        let (name, isid) = text.split_once(ISID_SEPARATOR)?;
        (name, Some(isid.to_owned()))
    } else {
        (text, None)
    };
    if name.is_empty() {
        return None;
    }
    Some(TransportId::Iscsi {
        name: name.to_owned(),
        isid,
    })
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportId::FibreChannel { n_port_name } => write!(f, "fc,0x{n_port_name:016x}"),
            TransportId::Sas { address } => write!(f, "sas,0x{address:016x}"),
            TransportId::Iscsi { name, isid } => {
                // Names without a standard iSCSI prefix need the explicit form to parse back.
                if !has_iscsi_name_prefix(name) {
                    f.write_str("iscsi,")?;
                }
                f.write_str(name)?;
                match isid {
                    Some(isid) => write!(f, "{ISID_SEPARATOR}{isid}"),
                    None => Ok(()),
                }
            }
            TransportId::NvmeHostId { host_id } => write!(f, "{NVME_HOSTID_PREFIX}{host_id}"),
            TransportId::Other { .. } => {
                f.write_str("raw,")?;
                self.encode()
                    .iter()
                    .try_for_each(|byte| write!(f, "{byte:02x}"))
            }
        }
    }
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| text.get(prefix.len()..))
        .flatten()
}

/// RFC 7143 name types: iqn., eui., naa.
fn has_iscsi_name_prefix(text: &str) -> bool {
    ["iqn.", "eui.", "naa."]
        .iter()
        .any(|prefix| strip_prefix_ignore_case(text, prefix).is_some())
}

fn parse_hex_u64(text: &str) -> Option<u64> {
    let digits = strip_prefix_ignore_case(text, "0x").unwrap_or(text);
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

fn parse_hex_bytes(text: &str) -> Option<Vec<u8>> {
    let text = strip_prefix_ignore_case(text, "0x").unwrap_or(text);
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    text.as_bytes()
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

impl FromStr for TransportId {
    type Err = TransportIdError;

    /// sg_persist-like forms: `iqn.…`/`eui.…`/`naa.…` (optionally `iscsi,` first, optionally
    /// `,i,0x<isid>` after), `fc,<wwpn>` (or `fcp,`), `sas,<address>`, `raw,<hex bytes>`.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |reason| TransportIdError {
            input: input.to_owned(),
            reason,
        };
        let fc = strip_prefix_ignore_case(input, "fc,")
            .or_else(|| strip_prefix_ignore_case(input, "fcp,"));
        if let Some(wwpn) = fc {
            let n_port_name = parse_hex_u64(wwpn).ok_or_else(|| fail("bad FC port name"))?;
            return Ok(TransportId::FibreChannel { n_port_name });
        }
        if let Some(id) = strip_prefix_ignore_case(input, NVME_HOSTID_PREFIX) {
            let host_id = if strip_prefix_ignore_case(id, "0x").is_some() {
                parse_hex_u64(id).map(HostId::Basic)
            } else {
                let digits: String = id.chars().filter(|&c| c != '-').collect();
                parse_hex_bytes(&digits)
                    .and_then(|bytes| <[u8; 16]>::try_from(bytes).ok())
                    .map(HostId::Extended)
            };
            let host_id = host_id.ok_or_else(|| {
                fail("an NVMe host id is a UUID (32 hex digits) or 0x and up to 16 hex digits")
            })?;
            return Ok(TransportId::NvmeHostId { host_id });
        }
        if let Some(address) = strip_prefix_ignore_case(input, "sas,") {
            let address = parse_hex_u64(address).ok_or_else(|| fail("bad SAS address"))?;
            return Ok(TransportId::Sas { address });
        }
        if let Some(hex) = strip_prefix_ignore_case(input, "raw,") {
            let bytes = parse_hex_bytes(hex).ok_or_else(|| fail("bad hex bytes"))?;
            return match TransportId::decode(&bytes) {
                // Raw bytes may spell an iSCSI name that the text form could not carry.
                Ok((id, used)) if used == bytes.len() => {
                    id.validate().map_err(|err| fail(err.reason))?;
                    Ok(id)
                }
                _ => Err(fail("bytes are not exactly one TransportID")),
            };
        }
        let iscsi = strip_prefix_ignore_case(input, "iscsi,")
            .or_else(|| has_iscsi_name_prefix(input).then_some(input));
        let Some(iscsi) = iscsi else {
            return Err(fail("unknown form"));
        };
        let (name, isid) = match iscsi.split_once(ISID_SEPARATOR) {
            Some((name, isid)) => (name, Some(isid.to_owned())),
            None => (iscsi, None),
        };
        TransportId::iscsi(name, isid).map_err(|err| fail(err.reason))
    }
}

impl serde::Serialize for TransportId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    fn iscsi(name: &str, isid: Option<&str>) -> TransportId {
        TransportId::Iscsi {
            name: name.into(),
            isid: isid.map(Into::into),
        }
    }

    #[test]
    fn fc_and_sas_layouts() {
        let fc = TransportId::FibreChannel {
            n_port_name: 0x5001_4380_0000_0001,
        };
        let bytes = fc.encode();
        assert_eq!(bytes.len(), 24);
        assert_eq!(bytes[0], 0x00);
        assert_eq!(&bytes[8..16], &[0x50, 0x01, 0x43, 0x80, 0, 0, 0, 1]);
        assert_eq!(TransportId::decode(&bytes), Ok((fc, 24)));

        let sas = TransportId::Sas {
            address: 0x5001_405a_aaaa_aa01,
        };
        let bytes = sas.encode();
        assert_eq!(bytes[0], 0x06);
        assert_eq!(&bytes[4..12], &0x5001_405a_aaaa_aa01u64.to_be_bytes());
        assert_eq!(TransportId::decode(&bytes), Ok((sas, 24)));
    }

    #[test]
    fn iscsi_encoding_is_null_terminated_padded_and_at_least_20() {
        let bytes = iscsi("iqn.a", None).encode();
        assert_eq!(bytes.len(), 24);
        assert_eq!(&bytes[..4], &[0x05, 0, 0, 20]);
        assert_eq!(&bytes[4..10], b"iqn.a\0");

        let id = iscsi("iqn.2026-11.lab:nodea", Some("23d000001"));
        let bytes = id.encode();
        assert_eq!(bytes[0], 0x45);
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(&bytes[4..40], b"iqn.2026-11.lab:nodea,i,0x23d000001\0");
        assert_eq!(TransportId::decode(&bytes), Ok((id, bytes.len())));
    }

    #[test]
    fn decodes_lio_unpadded_iscsi_transport_id() {
        // LIO: name + ",i,0x" + 12-digit ISID + NUL, padded to 4 but not to 20, and the
        // descriptor's trailing bytes belong to the next descriptor.
        let mut bytes = vec![0x45, 0, 0, 0];
        let text = b"iqn.x:n,i,0x00023d000001\0";
        let additional = text.len().next_multiple_of(4);
        bytes[3] = u8::try_from(additional).unwrap();
        bytes.extend_from_slice(text);
        bytes.resize(4 + additional, 0);
        bytes.extend_from_slice(&[0xaa; 8]);
        assert_eq!(
            TransportId::decode(&bytes),
            Ok((iscsi("iqn.x:n", Some("00023d000001")), 4 + additional))
        );
    }

    #[test]
    fn odd_iscsi_payloads_are_kept_as_other() {
        // Format 1 without separator, invalid UTF-8, empty name, reserved format 2.
        for (byte0, payload) in [
            (0x45u8, &b"iqn.x\0\0\0"[..]),
            (0x05, &[0xff, 0xfe, 0, 0][..]),
            (0x05, &[0, 0, 0, 0][..]),
            (0x85, &b"iqn.\0\0\0\0"[..]),
        ] {
            let mut bytes = vec![byte0, 0, 0, u8::try_from(payload.len()).unwrap()];
            bytes.extend_from_slice(payload);
            let (id, used) = TransportId::decode(&bytes).unwrap();
            assert_eq!(used, bytes.len());
            assert!(
                matches!(id, TransportId::Other { protocol_id: 5, .. }),
                "{id:?}"
            );
            assert_eq!(id.encode(), bytes);
        }
    }

    #[test]
    fn truncated_transport_ids_are_errors() {
        assert_eq!(
            TransportId::decode(&[]),
            Err(DecodeError::Truncated { needed: 1, got: 0 })
        );
        assert_eq!(
            TransportId::decode(&[0x05, 0]),
            Err(DecodeError::Truncated { needed: 4, got: 2 })
        );
        assert_eq!(
            TransportId::decode(&[0x05, 0, 0xff, 0xff, 0]),
            Err(DecodeError::Truncated {
                needed: 65539,
                got: 5
            })
        );
        assert_eq!(
            TransportId::decode(&[0; 23]),
            Err(DecodeError::Truncated {
                needed: 24,
                got: 23
            })
        );
    }

    #[test]
    fn parses_cli_forms() {
        assert_eq!(
            "iqn.2026-11.lab:nodea".parse(),
            Ok(iscsi("iqn.2026-11.lab:nodea", None))
        );
        assert_eq!(
            "iqn.2026-11.lab:nodea,i,0x23d000001".parse(),
            Ok(iscsi("iqn.2026-11.lab:nodea", Some("23d000001")))
        );
        assert_eq!(
            "iscsi,eui.02004567A425678D".parse(),
            Ok(iscsi("eui.02004567A425678D", None))
        );
        assert_eq!(
            "fc,0x5001438000000001".parse(),
            Ok(TransportId::FibreChannel {
                n_port_name: 0x5001_4380_0000_0001
            })
        );
        assert_eq!(
            "FCP,5001438000000001".parse(),
            Ok(TransportId::FibreChannel {
                n_port_name: 0x5001_4380_0000_0001
            })
        );
        assert_eq!(
            "sas,0x5000c50000000001".parse(),
            Ok(TransportId::Sas {
                address: 0x5000_c500_0000_0001
            })
        );
        for bad in [
            "",
            "node1",
            "fc,",
            "fc,0x12345678901234567",
            "sas,zz",
            "iqn.a,i,0x",
            "iqn.a,i,0xnothex",
            "iqn.a b",
            "raw,0",
            "raw,00",
            // Found by cargo-fuzz: iSCSI with name "\x01", which has no text form.
            "raw,3500000101",
        ] {
            let err = bad.parse::<TransportId>().unwrap_err();
            assert_eq!(err.input, bad);
        }
    }

    #[test]
    fn display_forms() {
        assert_eq!(
            iscsi("iqn.a:b", Some("23d000001")).to_string(),
            "iqn.a:b,i,0x23d000001"
        );
        assert_eq!(
            TransportId::Sas { address: 1 }.to_string(),
            "sas,0x0000000000000001"
        );
        let other = TransportId::Other {
            protocol_id: 4,
            format: 0,
            bytes: vec![0; 23],
        };
        assert_eq!(other.to_string(), format!("raw,04{}", "00".repeat(23)));
        assert_eq!(other.to_string().parse(), Ok(other));
        // Found by cargo-fuzz: a name without iqn./eui./naa. must keep its "iscsi," prefix.
        let odd: TransportId = "iscsi,I".parse().unwrap();
        assert_eq!(odd.to_string(), "iscsi,I");
        assert_eq!(odd.to_string().parse(), Ok(odd));
    }
}
