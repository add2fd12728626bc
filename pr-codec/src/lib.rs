//! Sans-IO codec for SCSI-3 PERSISTENT RESERVE IN/OUT (SPC-4): reservation keys and types, CDBs,
//! PR OUT parameter lists, TransportIDs and PR IN responses; and NVMe reservations ([`nvme`]):
//! command dwords, data, the extended Reservation Report.
//!
//! Everything here is pure: bytes in, typed values out, and back. The crate does no I/O, knows no
//! device, clock or async runtime, and depends only on `serde` and `thiserror`. Sending a CDB is
//! the caller's business: in prfence, `exec` does it through `sg-io`, and the `prfence` library
//! re-exports this crate as `prfence::pr`.
//!
//! Response bytes come from a target we do not control, so decoding never panics on target
//! data: it never indexes or does unchecked arithmetic (the lints below enforce it) and never
//! trusts a length field beyond the bytes actually received. The decoders are property-tested
//! (round trips) and fuzzed (`fuzz/`).
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

pub mod cdb;
pub mod error;
pub mod host_id;
pub mod key;
pub mod nvme;
pub mod params;
pub mod response;
pub mod transport_id;
pub mod types;
mod wire;

#[cfg(test)]
mod proptests;

pub use cdb::{
    PR_IN_OPCODE, PR_OUT_OPCODE, PrInAction, PrOutAction, decode_pr_in_cdb, pr_in_cdb, pr_out_cdb,
};
pub use error::{DecodeError, EncodeError, TransportIdError};
pub use key::{Key, KeyParseError};
pub use nvme::{Registrant, ReservationCapabilities, ReservationStatus};
pub use params::{Encoded, PR_OUT_BASIC_LEN, PrOut, RegisterMove, decode_pr_out};
pub use response::{
    Capabilities, FULL_STATUS_MAX_DESCRIPTOR_LEN, FullStatus, PR_IN_HEADER_LEN, ReadKeys,
    ReadReservation, Registration, Reservation, next_allocation_length, required_length,
};
pub use transport_id::TransportId;
pub use types::{Access, NexusRole, ReservationType, ReservationTypeParseError, Scope};
