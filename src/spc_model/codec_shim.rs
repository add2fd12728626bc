//! TEMPORARY SHIM — delete after the `src/pr/` codec branch is merged.
//!
//! Replicates just the `crate::pr` types the model uses, with the signatures announced for the
//! codec, so the model compiles and is tested before the merge. After the merge: delete this file,
//! drop `mod codec_shim;` in `mod.rs` and point its `use codec_shim::…` line at `crate::pr`.
//! The model relies only on `Clone + PartialEq + Debug` for `TransportId`, `Copy + Eq` for the
//! enums and `Copy + Eq + Ord + Hash` for `Key`.

// The shim mirrors the codec's announced API, not only the parts the model calls.
#![allow(dead_code)]

/// A reservation key (8 bytes on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key(u64);

impl Key {
    pub const ZERO: Key = Key(0);

    pub const fn new(value: u64) -> Self {
        Key(value)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReservationType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl ReservationType {
    pub const fn is_all_registrants(self) -> bool {
        matches!(
            self,
            ReservationType::WriteExclusiveAllRegistrants
                | ReservationType::ExclusiveAccessAllRegistrants
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    LogicalUnit,
    Other(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrOutAction {
    Register,
    Reserve,
    Release,
    Clear,
    Preempt,
    PreemptAndAbort,
    RegisterAndIgnoreExistingKey,
    RegisterAndMove,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrOut {
    pub action: PrOutAction,
    pub rtype: Option<ReservationType>,
    pub key: Key,
    pub sa_key: Key,
    pub aptpl: bool,
    pub all_tg_pt: bool,
    pub spec_i_pt: Vec<TransportId>,
    pub register_move: Option<RegisterMove>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterMove {
    pub unreg: bool,
    pub relative_target_port: u16,
    pub transport_id: TransportId,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TransportId {
    FibreChannel {
        n_port_name: u64,
    },
    Sas {
        address: u64,
    },
    Iscsi {
        name: String,
        isid: Option<String>,
    },
    Other {
        protocol_id: u8,
        format: u8,
        bytes: Vec<u8>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrInAction {
    ReadKeys,
    ReadReservation,
    ReportCapabilities,
    ReadFullStatus,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadKeys {
    pub generation: u32,
    pub keys: Vec<Key>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadReservation {
    pub generation: u32,
    pub reservation: Option<Reservation>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub key: Key,
    pub rtype: ReservationType,
    pub scope: Scope,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    pub rlr_c: bool,
    pub crh: bool,
    pub sip_c: bool,
    pub atp_c: bool,
    pub ptpl_c: bool,
    pub tmv: bool,
    pub allow_commands: u8,
    pub ptpl_a: bool,
    pub supported_types: Option<Vec<ReservationType>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullStatus {
    pub generation: u32,
    pub registrations: Vec<Registration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub key: Key,
    pub all_tg_pt: bool,
    pub holder: bool,
    pub scope: Option<Scope>,
    pub rtype: Option<ReservationType>,
    pub relative_target_port: u16,
    pub transport_id: TransportId,
}
