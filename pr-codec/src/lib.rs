//! Sans-IO codec for PERSISTENT RESERVE IN/OUT (SPC-4): CDBs, parameter lists, responses.
//!
//! Everything here is pure: bytes in, typed values out, and back. Response bytes come from a
//! target we do not control, so decoding never indexes or does unchecked arithmetic (the lints
//! below enforce it) and never trusts a length field beyond the bytes actually received.
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

pub mod cdb;
pub mod error;
pub mod key;
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
pub use error::{DecodeError, EncodeError};
pub use key::{Key, KeyParseError};
pub use params::{Encoded, PR_OUT_BASIC_LEN, PrOut, RegisterMove, decode_pr_out};
pub use response::{
    Capabilities, FULL_STATUS_MAX_DESCRIPTOR_LEN, FullStatus, PR_IN_HEADER_LEN, ReadKeys,
    ReadReservation, Registration, Reservation, next_allocation_length, required_length,
};
pub use transport_id::{TransportId, TransportIdError};
pub use types::{Access, NexusRole, ReservationType, ReservationTypeParseError, Scope};
