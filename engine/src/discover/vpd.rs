//! Pure parsers for the VPD pages Linux caches in sysfs (`vpd_pg83`, `vpd_pg80`). Used only when
//! the kernel's `wwid` attribute is missing (kernels before 4.5, or a device whose page 83h the
//! kernel could not decode).

/// Designator types of VPD page 83h (SPC-4 table "Designator type") that name a logical unit.
const T10_VENDOR: u8 = 0x1;
const EUI64: u8 = 0x2;
const NAA: u8 = 0x3;
const SCSI_NAME: u8 = 0x8;

/// The LU designator of a page 83h image, formatted as Linux's `wwid` attribute formats it:
/// `naa.<hex>`, `eui.<hex>`, the SCSI name string as is, `t10.<text>`.
///
/// Only designators with association 0 (the logical unit, not a port or the target device) count.
/// Preference: NAA, then EUI-64, then SCSI name string, then T10 vendor ID; within a type, the
/// longer designator (NAA 16-byte over 8-byte). This matches the kernel's choice for every target
/// that offers an NAA designator (LIO and every array we know of do), so a node without `wwid`
/// computes the same identifier as a node with it. Returns `None` for a malformed or empty page.
pub(super) fn lu_designator(page: &[u8]) -> Option<String> {
    // Header: peripheral byte, page code 83h, 16-bit page length.
    if page.len() < 4 || page[1] != 0x83 {
        return None;
    }
    let declared = usize::from(u16::from_be_bytes([page[2], page[3]]));
    let body = page.get(4..)?;
    let body = &body[..declared.min(body.len())];

    let mut best: Option<(u8, usize, String)> = None;
    let mut rest = body;
    while rest.len() >= 4 {
        let kind = rest[1] & 0x0f;
        let association = (rest[1] >> 4) & 0x03;
        let len = usize::from(rest[3]);
        let Some(value) = rest.get(4..4 + len) else {
            break; // truncated descriptor: ignore it and anything after it
        };
        rest = &rest[4 + len..];
        if association != 0 {
            continue;
        }
        let rank = match kind {
            NAA => 4,
            EUI64 => 3,
            SCSI_NAME => 2,
            T10_VENDOR => 1,
            _ => continue,
        };
        let Some(text) = format_designator(kind, value) else {
            continue;
        };
        let better = best.as_ref().is_none_or(|(r, l, _)| (rank, len) > (*r, *l));
        if better {
            best = Some((rank, len, text));
        }
    }
    best.map(|(_, _, text)| text)
}

fn format_designator(kind: u8, value: &[u8]) -> Option<String> {
    match kind {
        NAA if matches!(value.len(), 8 | 16) => Some(format!("naa.{}", hex(value))),
        EUI64 if matches!(value.len(), 8 | 12 | 16) => Some(format!("eui.{}", hex(value))),
        SCSI_NAME => printable(value),
        T10_VENDOR => printable(value).map(|t| format!("t10.{t}")),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// ASCII text without its NUL padding and trailing blanks; `None` if empty or not printable
/// (an identifier we cannot print is one we cannot compare across nodes either).
fn printable(value: &[u8]) -> Option<String> {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    let text = std::str::from_utf8(&value[..end]).ok()?.trim_end();
    (!text.is_empty() && text.chars().all(|c| c.is_ascii_graphic() || c == ' '))
        .then(|| text.to_owned())
}

/// The unit serial number of a page 80h image, trimmed; `None` if absent or malformed.
pub(super) fn unit_serial(page: &[u8]) -> Option<String> {
    if page.len() < 4 || page[1] != 0x80 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([page[2], page[3]]));
    let value = page.get(4..4 + len).or_else(|| page.get(4..))?;
    printable(value).map(|s| s.trim().to_owned())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `od -An -tx1 -v /sys/block/sda/device/vpd_pg83` of a LIO fileio LUN (Linux 6.1 lab guest,
    /// `vpd_unit_serial` = "lab-lun0"): NAA 6 (assoc 0), T10 "LIO-ORG FILEIO:lab-lun0" (assoc 0),
    /// relative target port and target port group (assoc 1), LU group (assoc 0, type 6), SCSI name
    /// of the target port "iqn...,t,0x0001" (assoc 1) and of the target "iqn..." (assoc 2).
    /// The kernel's `wwid` for it: naa.6001405ab00000000000000000000000
    pub(crate) const LIO_PG83: &[u8] = &[
        0x00, 0x83, 0x00, 0x88, 0x01, 0x03, 0x00, 0x10, 0x60, 0x01, 0x40, 0x5a, 0xb0, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x01, 0x00, 0x18, 0x4c, 0x49,
        0x4f, 0x2d, 0x4f, 0x52, 0x47, 0x20, 0x46, 0x49, 0x4c, 0x45, 0x49, 0x4f, 0x3a, 0x6c, 0x61,
        0x62, 0x2d, 0x6c, 0x75, 0x6e, 0x30, 0x00, 0x51, 0x94, 0x00, 0x04, 0x00, 0x00, 0x00, 0x01,
        0x51, 0x95, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x01, 0x06, 0x00, 0x04, 0x00, 0x00, 0x00,
        0x00, 0x53, 0x98, 0x00, 0x20, 0x69, 0x71, 0x6e, 0x2e, 0x32, 0x30, 0x32, 0x36, 0x2d, 0x31,
        0x31, 0x2e, 0x6c, 0x61, 0x62, 0x3a, 0x74, 0x61, 0x72, 0x67, 0x65, 0x74, 0x2c, 0x74, 0x2c,
        0x30, 0x78, 0x30, 0x30, 0x30, 0x31, 0x00, 0x53, 0xa8, 0x00, 0x18, 0x69, 0x71, 0x6e, 0x2e,
        0x32, 0x30, 0x32, 0x36, 0x2d, 0x31, 0x31, 0x2e, 0x6c, 0x61, 0x62, 0x3a, 0x74, 0x61, 0x72,
        0x67, 0x65, 0x74, 0x00, 0x00,
    ];
    /// `vpd_pg80` of the same LUN.
    pub(crate) const LIO_PG80: &[u8] = &[
        0x00, 0x80, 0x00, 0x09, 0x6c, 0x61, 0x62, 0x2d, 0x6c, 0x75, 0x6e, 0x30, 0x00,
    ];

    fn descriptor(code_set: u8, assoc_type: u8, value: &[u8]) -> Vec<u8> {
        let mut d = vec![code_set, assoc_type, 0, u8::try_from(value.len()).unwrap()];
        d.extend_from_slice(value);
        d
    }

    fn page(descriptors: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = descriptors.concat();
        let mut p = vec![0, 0x83];
        p.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        p.extend(body);
        p
    }

    #[test]
    fn lio_page_gives_the_kernel_wwid() {
        assert_eq!(
            lu_designator(LIO_PG83).as_deref(),
            Some("naa.6001405ab00000000000000000000000")
        );
        assert_eq!(unit_serial(LIO_PG80).as_deref(), Some("lab-lun0"));
    }

    #[test]
    fn preference_and_association() {
        let t10 = descriptor(2, 0x01, b"VENDOR  PRODUCT 1234  ");
        let name = descriptor(3, 0x08, b"iqn.2026-11.lab:lu0\0\0\0\0");
        let eui = descriptor(1, 0x02, &[0xab; 8]);
        let naa8 = descriptor(1, 0x03, &[0x50; 8]);
        let naa16 = descriptor(1, 0x03, &[0x60; 16]);
        let port_naa = descriptor(1, 0x13, &[0x21; 16]); // association 1: a target port
        assert_eq!(
            lu_designator(&page(std::slice::from_ref(&t10))).as_deref(),
            Some("t10.VENDOR  PRODUCT 1234")
        );
        assert_eq!(
            lu_designator(&page(&[t10.clone(), name.clone()])).as_deref(),
            Some("iqn.2026-11.lab:lu0")
        );
        assert_eq!(
            lu_designator(&page(&[name.clone(), eui.clone(), t10.clone()])).as_deref(),
            Some("eui.abababababababab")
        );
        assert_eq!(
            lu_designator(&page(&[
                port_naa.clone(),
                naa8.clone(),
                eui,
                naa16.clone(),
                name
            ]))
            .as_deref(),
            Some(format!("naa.{}", "60".repeat(16)).as_str())
        );
        assert_eq!(
            lu_designator(&page(&[naa8, port_naa.clone()])).as_deref(),
            Some("naa.5050505050505050")
        );
        assert_eq!(lu_designator(&page(&[port_naa])), None);
    }

    #[test]
    fn malformed_pages() {
        assert_eq!(lu_designator(&[]), None);
        assert_eq!(lu_designator(&[0, 0x80, 0, 0]), None);
        // NAA of an impossible length, and a descriptor running past the page end.
        let bad_naa = descriptor(1, 0x03, &[0x60; 5]);
        assert_eq!(lu_designator(&page(&[bad_naa])), None);
        let mut truncated = page(&[descriptor(1, 0x03, &[0x60; 16])]);
        truncated.truncate(12);
        assert_eq!(lu_designator(&truncated), None);
        // The declared page length cuts the second descriptor: only the first counts.
        let mut p = page(&[descriptor(2, 0x01, b"A"), descriptor(1, 0x03, &[0x60; 16])]);
        p[3] = 5;
        assert_eq!(lu_designator(&p).as_deref(), Some("t10.A"));
        assert_eq!(unit_serial(&[0, 0x80, 0, 3, b' ', 0, 0]), None);
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = lu_designator(&bytes);
            let _ = unit_serial(&bytes);
        }
    }
}
