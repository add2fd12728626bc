//! The NVMe host identifier: what NVMe reservations register (a host, not a port), named by both
//! the NVMe codec ([`crate::nvme`]) and the registrations shown beside SCSI's
//! ([`crate::TransportId::NvmeHostId`]).

/// A host identifier as a Report gives it: 128 bits in the extended format, 64 in the original.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostId {
    Extended([u8; 16]),
    Basic(u64),
}

impl std::fmt::Display for HostId {
    /// The 128-bit form as a UUID (Linux host ids are UUIDs), the 64-bit one as `0x` and hex.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostId::Extended(bytes) => bytes.iter().enumerate().try_for_each(|(i, byte)| {
                if matches!(i, 4 | 6 | 8 | 10) {
                    f.write_str("-")?;
                }
                write!(f, "{byte:02x}")
            }),
            HostId::Basic(id) => write!(f, "0x{id:016x}"),
        }
    }
}

impl serde::Serialize for HostId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
