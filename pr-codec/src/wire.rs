//! Bounds-checked big-endian field access: every read returns None past the end of the data.

pub(crate) fn array<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..)?.first_chunk::<N>().copied()
}

pub(crate) fn u8_at(bytes: &[u8], at: usize) -> Option<u8> {
    bytes.get(at).copied()
}

pub(crate) fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    array(bytes, at).map(u16::from_be_bytes)
}

pub(crate) fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    array(bytes, at).map(u32::from_be_bytes)
}

pub(crate) fn be64(bytes: &[u8], at: usize) -> Option<u64> {
    array(bytes, at).map(u64::from_be_bytes)
}

/// `usize` from a 32-bit wire length; saturates on (hypothetical) 16-bit targets so the
/// following bounds checks fail instead of wrapping.
pub(crate) fn len32(value: u32) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Little-endian fields: NVMe data structures.
pub(crate) fn le16(bytes: &[u8], at: usize) -> Option<u16> {
    array(bytes, at).map(u16::from_le_bytes)
}

pub(crate) fn le32(bytes: &[u8], at: usize) -> Option<u32> {
    array(bytes, at).map(u32::from_le_bytes)
}

pub(crate) fn le64(bytes: &[u8], at: usize) -> Option<u64> {
    array(bytes, at).map(u64::from_le_bytes)
}
