//! In-memory model of one SCSI logical unit's persistent-reservation state (SPC-4 §5.7, §6.15,
//! §6.16), for unit tests of the fencing engine only. The LIO lab is the real proof; this model
//! exists so engine tests can be fast and deterministic, which only helps if it is faithful.
//!
//! - [`ModelLu::connect`] / [`ModelLu::disconnect`] / [`ModelLu::relogin`] /
//!   [`ModelLu::power_cycle`] drive the transport side; a [`Nexus`] is one I_T nexus (initiator
//!   port identity × target port).
//! - [`ModelLu::pr_out`], [`ModelLu::read_keys`], [`ModelLu::read_reservation`],
//!   [`ModelLu::report_capabilities`], [`ModelLu::read_full_status`], [`ModelLu::access`],
//!   [`ModelLu::test_unit_ready`], [`ModelLu::inquiry`] and [`ModelLu::request_sense`] are
//!   commands: each first reports (and consumes) a pending unit attention, except INQUIRY and
//!   REQUEST SENSE.
//! - Where LIO deviates from SPC-4, [`Quirks`] selects the behaviour ([`Quirks::spc4`] or
//!   [`Quirks::lio`]).
//! - Faults the engine must survive (lost responses, transport loss, "applied but reported as
//!   failed") are injected per nexus with [`ModelLu::inject`] / [`ModelLu::fail_next`].
//!
//! Not modelled: tasks (PREEMPT AND ABORT aborts nothing), SPC-2 RESERVE/RELEASE, scopes other
//! than LU_SCOPE (the codec's `PrOut` carries none), REPLACE LOST RESERVATION, LIO's ACL rules
//! for SPEC_I_PT / ALL_TG_PT / REGISTER AND MOVE destinations (any TransportID is accepted), and
//! LIO's refusal to unregister an ALL_TG_PT group member while another member holds the
//! reservation.

mod device;
mod failure;
mod lu;
#[cfg(test)]
mod tests;

use crate::pr::{
    Capabilities, FullStatus, Key, PrInAction, PrOut, PrOutAction, ReadKeys, ReadReservation,
    Registration, Reservation, ReservationType, Scope, TransportId,
};

pub use device::ModelDevice;
pub use failure::{Injected, ModelError, ScsiFailure, UnitAttention};
pub use lu::ModelLu;

/// The lab-style iSCSI initiator port `iqn.2026-11.lab:<node>` with ISID `isid`: the one fixture
/// every unit test names its nodes' paths with.
pub fn iscsi_initiator(node: &str, isid: &str) -> TransportId {
    TransportId::Iscsi {
        name: format!("iqn.2026-11.lab:{node}"),
        isid: Some(isid.to_owned()),
    }
}

/// One I_T nexus (initiator port × target port) known to a [`ModelLu`]. Opaque handle; only valid
/// for the `ModelLu` that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nexus(u32);

/// An ordinary medium-access command, for the reservation access check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Io {
    /// e.g. READ(10): blocked only by exclusive-access types.
    Read,
    /// e.g. WRITE(10): blocked by every type unless the nexus may write.
    Write,
}

/// A command as seen by the fault injector, so a fault can target e.g. only REGISTER.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelCommand {
    PrOut(PrOutAction),
    PrIn(PrInAction),
    Io(Io),
    TestUnitReady,
    Inquiry,
    RequestSense,
}

impl ModelCommand {
    /// SPC-4 §5.9 / SAM-5: these commands neither report nor clear a pending unit attention
    /// (REQUEST SENSE reports it as its data instead).
    fn is_unit_attention_exempt(self) -> bool {
        matches!(self, ModelCommand::Inquiry | ModelCommand::RequestSense)
    }

    fn is_persistent_reserve(self) -> bool {
        matches!(self, ModelCommand::PrOut(_) | ModelCommand::PrIn(_))
    }
}

/// Which commands an injected fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommandFilter {
    Any,
    AnyPrOut,
    AnyPrIn,
    Only(ModelCommand),
}

impl CommandFilter {
    fn matches(self, command: ModelCommand) -> bool {
        match self {
            CommandFilter::Any => true,
            CommandFilter::AnyPrOut => matches!(command, ModelCommand::PrOut(_)),
            CommandFilter::AnyPrIn => matches!(command, ModelCommand::PrIn(_)),
            CommandFilter::Only(only) => only == command,
        }
    }
}

/// When an injected fault strikes relative to the command's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timing {
    /// The command never reaches the device server: no state change, no UA consumed.
    InsteadOfExecuting,
    /// The command is fully processed (state changed, UA consumed), then the reply is replaced by
    /// the fault: a lost response, or LIO's "REGISTER applied but answered NOT READY".
    AfterExecuting,
}

/// A pending fault: the next `count` matching commands on one nexus fail with `fault`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    pub fault: Injected,
    pub timing: Timing,
    pub filter: CommandFilter,
    pub count: u32,
}

/// Device-server behaviours that differ between SPC-4 and real targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quirks {
    /// `attrib/emulate_pr`: when false, PR IN/OUT fail with ILLEGAL REQUEST, INVALID COMMAND
    /// OPERATION CODE (20h/00h) and nothing is ever reserved.
    pub emulate_pr: bool,
    /// When false, PREEMPT AND ABORT fails with ILLEGAL REQUEST, INVALID FIELD IN CDB (targets
    /// that cannot abort tasks).
    pub preempt_and_abort_supported: bool,
    /// SPC-4 bumps PRgeneration when a registration is removed by REGISTER with a zero SARK;
    /// LIO does not.
    pub generation_bumped_on_unregister: bool,
    /// LIO bumps PRgeneration once per I_T nexus registered (ALL_TG_PT copies, SPEC_I_PT
    /// targets); SPC-4 once per command.
    pub generation_bumped_per_registered_nexus: bool,
    /// LIO answers RESERVE, RELEASE, CLEAR and REGISTER AND MOVE from an unregistered nexus, while
    /// no reservation exists, with NOT READY, LOGICAL UNIT COMMUNICATION FAILURE (02h/08h/00h)
    /// instead of RESERVATION CONFLICT.
    pub unregistered_without_reservation_not_ready: bool,
    /// LIO refuses to re-key or unregister a registration made with ALL_TG_PT=1 unless the
    /// request sets ALL_TG_PT=1 again (ILLEGAL REQUEST, INVALID FIELD IN CDB); SPC-4 ignores the
    /// bit for a registered nexus.
    pub all_tg_pt_change_requires_all_tg_pt: bool,
    /// LIO checks RELEASE's reservation key and type only when the caller holds the reservation
    /// (a non-holder with a wrong key gets GOOD) and answers a type mismatch with RESERVATION
    /// CONFLICT; SPC-4 says RESERVATION CONFLICT for any wrong key and ILLEGAL REQUEST, INVALID
    /// RELEASE OF PERSISTENT RESERVATION (26h/04h) for a wrong type.
    pub release_validated_only_for_holder: bool,
    /// LIO keeps one registration as the nominal holder of an all-registrants reservation (the
    /// reserver; after it unregisters, the oldest remaining registration). A PREEMPT whose
    /// non-zero SARK is that registration's key then works as if it preempted a sole holder: the
    /// caller takes the reservation with the new TYPE. A keyed PREEMPT under WEAR/EAAR also never
    /// removes the caller's own registration. SPC-4 only removes the registrations with that key.
    pub all_registrants_nominal_holder: bool,
    /// LIO decides "registered" for the access check per node ACL (initiator name + target
    /// port), not per I_T nexus: another iSCSI session (ISID) of a registered initiator may
    /// access as a registrant, while a session of the holder's initiator with a different ISID
    /// counts as unregistered even if it registered itself.
    pub access_registration_per_initiator_name: bool,
    /// Queue POWER ON OCCURRED (29h/00h) for each nexus's first connection, as a target does after
    /// boot; off by default so tests only see the PR unit attentions they cause.
    pub power_on_ua_for_new_nexus: bool,
}

impl Quirks {
    /// Strict SPC-4 behaviour.
    pub const fn spc4() -> Self {
        Quirks {
            emulate_pr: true,
            preempt_and_abort_supported: true,
            generation_bumped_on_unregister: true,
            generation_bumped_per_registered_nexus: false,
            unregistered_without_reservation_not_ready: false,
            all_tg_pt_change_requires_all_tg_pt: false,
            release_validated_only_for_holder: false,
            all_registrants_nominal_holder: false,
            access_registration_per_initiator_name: false,
            power_on_ua_for_new_nexus: false,
        }
    }

    /// Linux LIO (`target_core_pr.c`, v6.1) with a core-emulated backstore.
    pub const fn lio() -> Self {
        Quirks {
            generation_bumped_on_unregister: false,
            generation_bumped_per_registered_nexus: true,
            unregistered_without_reservation_not_ready: true,
            all_tg_pt_change_requires_all_tg_pt: true,
            release_validated_only_for_holder: true,
            all_registrants_nominal_holder: true,
            access_registration_per_initiator_name: true,
            ..Quirks::spc4()
        }
    }
}

impl Default for Quirks {
    fn default() -> Self {
        Quirks::spc4()
    }
}

/// Who holds the reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holder {
    /// WE, EA, WERO, EARO: exactly one I_T nexus.
    Nexus(Nexus),
    /// WEAR, EAAR: every registered I_T nexus is a holder.
    AllRegistrants,
}

/// The reservation as the model sees it (for test assertions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReservationState {
    pub holder: Holder,
    pub rtype: ReservationType,
}

/// One registration as the model sees it (for test assertions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Registered {
    pub nexus: Nexus,
    pub key: Key,
    /// Created by a REGISTER with ALL_TG_PT=1 (key changes and unregistration apply to all of the
    /// initiator port's registrations created that way).
    pub all_tg_pt: bool,
}
