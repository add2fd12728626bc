//! The logical unit: registrations, reservation, PRgeneration, unit attentions, fault injection.

use std::collections::{BTreeSet, VecDeque};

use super::{
    Capabilities, FullStatus, Holder, Injected, Injection, Io, Key, ModelCommand, ModelError,
    Nexus, PrInAction, PrOut, PrOutAction, Quirks, ReadKeys, ReadReservation, Registered,
    Registration, Reservation, ReservationState, ReservationType, Scope, ScsiFailure, Timing,
    TransportId, UnitAttention,
};

#[derive(Debug, Clone)]
struct NexusState {
    initiator: TransportId,
    relative_target_port: u16,
    connected: bool,
    /// A nexus can exist before its first login: ALL_TG_PT, SPEC_I_PT and REGISTER AND MOVE
    /// register I_T nexuses that have not logged in yet.
    ever_connected: bool,
    unit_attentions: VecDeque<UnitAttention>,
    injections: VecDeque<Injection>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    /// Meaningful only for non-all-registrants types; under WEAR/EAAR every registrant holds.
    holder: Nexus,
    rtype: ReservationType,
}

/// One logical unit with SPC-4 persistent reservations. See the module docs.
#[derive(Debug, Clone)]
pub struct ModelLu {
    quirks: Quirks,
    nexuses: Vec<NexusState>,
    target_ports: BTreeSet<u16>,
    /// In registration order, which is the order READ KEYS reports.
    registrations: Vec<Registered>,
    reservation: Option<Held>,
    generation: u32,
    aptpl: bool,
}

impl ModelLu {
    pub fn new(quirks: Quirks) -> Self {
        ModelLu {
            quirks,
            nexuses: Vec::new(),
            target_ports: BTreeSet::new(),
            registrations: Vec::new(),
            reservation: None,
            generation: 0,
            aptpl: false,
        }
    }

    pub fn quirks(&self) -> Quirks {
        self.quirks
    }

    // ----- transport: nexuses, logins, target ports -----

    /// Logs `initiator` in through target port `relative_target_port`. The same initiator port
    /// identity (for iSCSI: name + ISID) on the same target port is the same I_T nexus, so its
    /// registration is still there after a disconnect; a different ISID is a new nexus.
    pub fn connect(&mut self, initiator: TransportId, relative_target_port: u16) -> Nexus {
        let nexus = self.find_or_create_nexus(&initiator, relative_target_port);
        let power_on_ua = self.quirks.power_on_ua_for_new_nexus;
        let state = self.state_mut(nexus);
        state.connected = true;
        if !state.ever_connected {
            state.ever_connected = true;
            if power_on_ua {
                push_unit_attention(state, UnitAttention::POWER_ON);
            }
        }
        nexus
    }

    /// I_T nexus loss: commands fail with [`ModelError::TransportDown`] until [`ModelLu::connect`]
    /// with the same identity. Registrations and the reservation survive (SPC-4 §5.7.2).
    pub fn disconnect(&mut self, nexus: Nexus) {
        self.state_mut(nexus).connected = false;
    }

    /// An iSCSI re-login with a new session: the old nexus disconnects and the initiator returns
    /// as a new I_T nexus with `new_isid`, so the old registration (and reservation) are orphaned,
    /// as with open-iscsi. Non-iSCSI initiators keep their identity and simply reconnect.
    pub fn relogin(&mut self, nexus: Nexus, new_isid: &str) -> Nexus {
        self.disconnect(nexus);
        let state = self.state(nexus);
        let relative_target_port = state.relative_target_port;
        let initiator = match &state.initiator {
            TransportId::Iscsi { name, .. } => TransportId::Iscsi {
                name: name.clone(),
                isid: Some(new_isid.to_owned()),
            },
            other => other.clone(),
        };
        self.connect(initiator, relative_target_port)
    }

    /// Target power cycle (or LIO device re-creation): every session drops, every nexus gets
    /// POWER ON OCCURRED (29h/00h) on its next command after reconnecting, and without APTPL the
    /// registrations, the reservation and PRgeneration are gone (PR state is RAM-only then). With
    /// APTPL they are kept, as rtslib restores them. Pending injections are dropped.
    pub fn power_cycle(&mut self) {
        for state in &mut self.nexuses {
            state.connected = false;
            state.unit_attentions.clear();
            state.injections.clear();
            state.unit_attentions.push_back(UnitAttention::POWER_ON);
        }
        if !self.aptpl {
            self.registrations.clear();
            self.reservation = None;
            self.generation = 0;
        }
    }

    /// Declares a target port through which the LU is reachable, so ALL_TG_PT registrations cover
    /// it even before anyone logs in there. Ports used by [`ModelLu::connect`] are added
    /// implicitly.
    pub fn add_target_port(&mut self, relative_target_port: u16) {
        self.target_ports.insert(relative_target_port);
    }

    /// Initiator port identity and relative target port of `nexus`.
    pub fn identity(&self, nexus: Nexus) -> (&TransportId, u16) {
        let state = self.state(nexus);
        (&state.initiator, state.relative_target_port)
    }

    pub fn is_connected(&self, nexus: Nexus) -> bool {
        self.state(nexus).connected
    }

    // ----- fault injection -----

    /// Queues a fault for the next `injection.count` commands on `nexus` matching its filter.
    /// Several injections are consumed in the order they were queued.
    pub fn inject(&mut self, nexus: Nexus, injection: Injection) {
        if injection.count > 0 {
            self.state_mut(nexus).injections.push_back(injection);
        }
    }

    /// Shorthand: the next `count` commands of any kind on `nexus` fail with `fault` without
    /// reaching the device server.
    pub fn fail_next(&mut self, nexus: Nexus, fault: Injected, count: u32) {
        self.inject(
            nexus,
            Injection {
                fault,
                timing: Timing::InsteadOfExecuting,
                filter: super::CommandFilter::Any,
                count,
            },
        );
    }

    pub fn clear_injections(&mut self, nexus: Nexus) {
        self.state_mut(nexus).injections.clear();
    }

    // ----- unit attentions -----

    /// Consumes the oldest pending unit attention without going through the transport (a test
    /// shortcut; [`ModelLu::request_sense`] is the command).
    pub fn take_unit_attention(&mut self, nexus: Nexus) -> Option<UnitAttention> {
        self.state_mut(nexus).unit_attentions.pop_front()
    }

    pub fn pending_unit_attentions(&self, nexus: Nexus) -> Vec<UnitAttention> {
        self.state(nexus).unit_attentions.iter().copied().collect()
    }

    // ----- commands -----

    /// PERSISTENT RESERVE OUT.
    pub fn pr_out(&mut self, nexus: Nexus, req: &PrOut) -> Result<(), ModelError> {
        self.run(nexus, ModelCommand::PrOut(req.action), |lu| {
            lu.execute_pr_out(nexus, req)
        })
    }

    /// PERSISTENT RESERVE IN, READ KEYS.
    pub fn read_keys(&mut self, nexus: Nexus) -> Result<ReadKeys, ModelError> {
        self.run(nexus, ModelCommand::PrIn(PrInAction::ReadKeys), |lu| {
            Ok(ReadKeys {
                generation: lu.generation,
                keys: lu.registrations.iter().map(|r| r.key).collect(),
            })
        })
    }

    /// PERSISTENT RESERVE IN, READ RESERVATION (the key reads 0 under all-registrants types).
    pub fn read_reservation(&mut self, nexus: Nexus) -> Result<ReadReservation, ModelError> {
        self.run(
            nexus,
            ModelCommand::PrIn(PrInAction::ReadReservation),
            |lu| {
                let reservation = lu.reservation.map(|held| Reservation {
                    key: if held.rtype.is_all_registrants() {
                        Key::ZERO
                    } else {
                        lu.registered_key(held.holder).unwrap_or(Key::ZERO)
                    },
                    rtype: held.rtype,
                    scope: Scope::LogicalUnit,
                });
                Ok(ReadReservation {
                    generation: lu.generation,
                    reservation,
                })
            },
        )
    }

    /// PERSISTENT RESERVE IN, REPORT CAPABILITIES, with LIO's answer (CRH, SIP_C, ATP_C, PTPL_C,
    /// TMV, ALLOW COMMANDS 001b, all six types; PTPL_A follows the APTPL state).
    pub fn report_capabilities(&mut self, nexus: Nexus) -> Result<Capabilities, ModelError> {
        self.run(
            nexus,
            ModelCommand::PrIn(PrInAction::ReportCapabilities),
            |lu| {
                Ok(Capabilities {
                    rlr_c: false,
                    crh: true,
                    sip_c: true,
                    atp_c: true,
                    ptpl_c: true,
                    tmv: true,
                    allow_commands: 1,
                    ptpl_a: lu.aptpl,
                    supported_types: Some(ALL_TYPES.to_vec()),
                })
            },
        )
    }

    /// PERSISTENT RESERVE IN, READ FULL STATUS: one descriptor per registered I_T nexus.
    pub fn read_full_status(&mut self, nexus: Nexus) -> Result<FullStatus, ModelError> {
        self.run(
            nexus,
            ModelCommand::PrIn(PrInAction::ReadFullStatus),
            |lu| {
                let registrations = lu
                    .registrations
                    .iter()
                    .map(|reg| {
                        let holder = lu.is_holder(reg.nexus);
                        let state = lu.state(reg.nexus);
                        Registration {
                            key: reg.key,
                            all_tg_pt: reg.all_tg_pt,
                            holder,
                            scope: holder.then_some(Scope::LogicalUnit),
                            rtype: lu.reservation.filter(|_| holder).map(|held| held.rtype),
                            relative_target_port: state.relative_target_port,
                            transport_id: state.initiator.clone(),
                        }
                    })
                    .collect();
                Ok(FullStatus {
                    generation: lu.generation,
                    registrations,
                })
            },
        )
    }

    /// A medium-access command (READ/WRITE), checked against the reservation (SPC-4 table
    /// "SPC commands that are allowed in the presence of various reservations").
    pub fn access(&mut self, nexus: Nexus, io: Io) -> Result<(), ModelError> {
        self.run(nexus, ModelCommand::Io(io), |lu| {
            if lu.access_allowed(nexus, io) {
                Ok(())
            } else {
                Err(ScsiFailure::ReservationConflict)
            }
        })
    }

    /// TEST UNIT READY: always allowed under any reservation; reports a pending unit attention.
    pub fn test_unit_ready(&mut self, nexus: Nexus) -> Result<(), ModelError> {
        self.run(nexus, ModelCommand::TestUnitReady, |_| Ok(()))
    }

    /// INQUIRY: always allowed, and leaves a pending unit attention pending.
    pub fn inquiry(&mut self, nexus: Nexus) -> Result<(), ModelError> {
        self.run(nexus, ModelCommand::Inquiry, |_| Ok(()))
    }

    /// REQUEST SENSE: returns (and consumes) the oldest pending unit attention as sense data.
    pub fn request_sense(&mut self, nexus: Nexus) -> Result<Option<UnitAttention>, ModelError> {
        self.run(nexus, ModelCommand::RequestSense, |lu| {
            Ok(lu.take_unit_attention(nexus))
        })
    }

    // ----- state inspection for tests -----

    pub fn registrations(&self) -> &[Registered] {
        &self.registrations
    }

    pub fn registered_key(&self, nexus: Nexus) -> Option<Key> {
        self.registrations
            .iter()
            .find(|r| r.nexus == nexus)
            .map(|r| r.key)
    }

    pub fn reservation(&self) -> Option<ReservationState> {
        self.reservation.map(|held| ReservationState {
            holder: if held.rtype.is_all_registrants() {
                Holder::AllRegistrants
            } else {
                Holder::Nexus(held.holder)
            },
            rtype: held.rtype,
        })
    }

    pub fn holder(&self) -> Option<Holder> {
        self.reservation().map(|r| r.holder)
    }

    /// Whether `nexus` is a reservation holder (every registrant, under WEAR/EAAR).
    pub fn is_holder(&self, nexus: Nexus) -> bool {
        match self.reservation {
            None => false,
            Some(held) if held.rtype.is_all_registrants() => self.registered_key(nexus).is_some(),
            Some(held) => held.holder == nexus,
        }
    }

    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Sets PRgeneration, e.g. near `u32::MAX` to test wrap-around handling.
    pub fn set_generation(&mut self, generation: u32) {
        self.generation = generation;
    }

    /// The APTPL state of the last registration (REPORT CAPABILITIES' PTPL_A).
    pub fn aptpl(&self) -> bool {
        self.aptpl
    }

    // ----- command plumbing -----

    /// Runs one command: transport state, injected faults, the opcode check (LIO rejects PR
    /// commands under `emulate_pr=0` while parsing the CDB, before looking at UAs), unit-attention
    /// delivery (SPC-4 §5.9: a pending UA is reported, and consumed, instead of executing the
    /// command), then the command itself.
    fn run<T>(
        &mut self,
        nexus: Nexus,
        command: ModelCommand,
        execute: impl FnOnce(&mut Self) -> Result<T, ScsiFailure>,
    ) -> Result<T, ModelError> {
        if !self.state(nexus).connected {
            return Err(ModelError::TransportDown);
        }
        let injected = self.take_injection(nexus, command);
        if let Some((fault, Timing::InsteadOfExecuting)) = injected {
            return Err(fault.into());
        }
        let pending_ua = if command.is_unit_attention_exempt() {
            None
        } else {
            self.state(nexus).unit_attentions.front().copied()
        };
        let outcome = if command.is_persistent_reserve() && !self.quirks.emulate_pr {
            Err(ScsiFailure::illegal_request_invalid_opcode())
        } else if let Some(ua) = pending_ua {
            self.take_unit_attention(nexus);
            Err(ua.to_failure())
        } else {
            execute(self)
        };
        match injected {
            Some((fault, _)) => Err(fault.into()),
            None => outcome.map_err(ModelError::from),
        }
    }

    fn take_injection(
        &mut self,
        nexus: Nexus,
        command: ModelCommand,
    ) -> Option<(Injected, Timing)> {
        let queue = &mut self.state_mut(nexus).injections;
        let position = queue.iter().position(|i| i.filter.matches(command))?;
        let injection = queue.get_mut(position)?;
        injection.count = injection.count.saturating_sub(1);
        let hit = (injection.fault, injection.timing);
        if injection.count == 0 {
            queue.remove(position);
        }
        Some(hit)
    }

    /// Whether a medium-access command from `nexus` would be allowed now, without sending it
    /// (no unit attention reported or consumed): for oracles that judge what a node could do.
    pub fn may_access(&self, nexus: Nexus, io: Io) -> bool {
        self.access_allowed(nexus, io)
    }

    fn access_allowed(&self, nexus: Nexus, io: Io) -> bool {
        use ReservationType::*;
        let Some(held) = self.reservation else {
            return true;
        };
        let registered = if self.quirks.access_registration_per_initiator_name {
            if held.holder == nexus {
                return true;
            }
            let holder = self.state(held.holder);
            let caller = self.state(nexus);
            if same_node_acl(holder, caller) {
                // LIO: the holder's initiator through another session. Without an ISID at
                // registration the session is the holder; with one, it is an "ISID mismatch",
                // which LIO treats as unregistered.
                if matches!(holder.initiator, TransportId::Iscsi { isid: None, .. }) {
                    return true;
                }
                false
            } else {
                self.registrations
                    .iter()
                    .any(|reg| same_node_acl(self.state(reg.nexus), caller))
            }
        } else {
            if self.is_holder(nexus) {
                return true;
            }
            self.registered_key(nexus).is_some()
        };
        match (held.rtype, io) {
            (
                WriteExclusive | WriteExclusiveRegistrantsOnly | WriteExclusiveAllRegistrants,
                Io::Read,
            ) => true,
            (WriteExclusive | ExclusiveAccess, _) => false,
            (
                WriteExclusiveRegistrantsOnly
                | ExclusiveAccessRegistrantsOnly
                | WriteExclusiveAllRegistrants
                | ExclusiveAccessAllRegistrants,
                _,
            ) => registered,
        }
    }

    // ----- PERSISTENT RESERVE OUT service actions (SPC-4 §5.7.7–§5.7.11, §6.16) -----

    fn execute_pr_out(&mut self, nexus: Nexus, req: &PrOut) -> Result<(), ScsiFailure> {
        if req.action == PrOutAction::PreemptAndAbort && !self.quirks.preempt_and_abort_supported {
            return Err(ScsiFailure::invalid_field_in_cdb());
        }
        if !req.spec_i_pt.is_empty() && req.action != PrOutAction::Register {
            return Err(ScsiFailure::invalid_field_in_parameter_list());
        }
        match req.action {
            PrOutAction::Register => self.register(nexus, req, false),
            PrOutAction::RegisterAndIgnoreExistingKey => self.register(nexus, req, true),
            PrOutAction::Reserve => self.reserve(nexus, req),
            PrOutAction::Release => self.release(nexus, req),
            PrOutAction::Clear => self.clear(nexus, req),
            PrOutAction::Preempt | PrOutAction::PreemptAndAbort => self.preempt(nexus, req),
            PrOutAction::RegisterAndMove => self.register_and_move(nexus, req),
        }
    }

    /// Every service action except REGISTER from an unregistered nexus needs the nexus registered
    /// under RESERVATION KEY.
    fn require_registration(
        &self,
        nexus: Nexus,
        reservation_key: Key,
        lio_not_ready_applies: bool,
    ) -> Result<(), ScsiFailure> {
        match self.registered_key(nexus) {
            Some(key) if key == reservation_key => Ok(()),
            Some(_) => Err(ScsiFailure::ReservationConflict),
            None if lio_not_ready_applies
                && self.quirks.unregistered_without_reservation_not_ready
                && self.reservation.is_none() =>
            {
                Err(ScsiFailure::lio_communication_failure())
            }
            None => Err(ScsiFailure::ReservationConflict),
        }
    }

    fn register(
        &mut self,
        nexus: Nexus,
        req: &PrOut,
        ignore_existing_key: bool,
    ) -> Result<(), ScsiFailure> {
        let Some(current) = self.registered_key(nexus) else {
            return self.register_new(nexus, req, ignore_existing_key);
        };
        if !ignore_existing_key && req.key != current {
            return Err(ScsiFailure::ReservationConflict);
        }
        if !req.spec_i_pt.is_empty() {
            return Err(ScsiFailure::invalid_field_in_parameter_list());
        }
        let group = self.registration_group(nexus);
        let registered_on_all_ports = self
            .registrations
            .iter()
            .any(|reg| reg.nexus == nexus && reg.all_tg_pt);
        if registered_on_all_ports
            && !req.all_tg_pt
            && self.quirks.all_tg_pt_change_requires_all_tg_pt
        {
            return Err(ScsiFailure::invalid_field_in_cdb());
        }
        if req.sa_key.is_zero() {
            self.unregister(nexus, &group);
            if self.quirks.generation_bumped_on_unregister {
                self.bump_generation(1);
            }
        } else {
            for reg in &mut self.registrations {
                if group.contains(&reg.nexus) {
                    reg.key = req.sa_key;
                }
            }
            self.aptpl = req.aptpl;
            self.bump_generation(1);
        }
        Ok(())
    }

    fn register_new(
        &mut self,
        nexus: Nexus,
        req: &PrOut,
        ignore_existing_key: bool,
    ) -> Result<(), ScsiFailure> {
        if !ignore_existing_key && !req.key.is_zero() {
            return Err(ScsiFailure::ReservationConflict);
        }
        if req.sa_key.is_zero() {
            // Unregistering an unregistered nexus: GOOD, nothing changes.
            return Ok(());
        }
        let initiator = self.state(nexus).initiator.clone();
        let mut targets = self.nexuses_for(&initiator, nexus, req.all_tg_pt);
        for transport_id in &req.spec_i_pt {
            for target in self.nexuses_for(transport_id, nexus, req.all_tg_pt) {
                // A TransportID naming the caller or an already registered nexus is an error,
                // and then nothing at all is registered.
                if targets.contains(&target) || self.registered_key(target).is_some() {
                    return Err(ScsiFailure::invalid_field_in_parameter_list());
                }
                targets.push(target);
            }
        }
        // An ALL_TG_PT expansion leaves the initiator's separate registrations on other ports as
        // they are.
        targets.retain(|&target| target == nexus || self.registered_key(target).is_none());
        for &target in &targets {
            self.registrations.push(Registered {
                nexus: target,
                key: req.sa_key,
                all_tg_pt: req.all_tg_pt,
            });
        }
        self.aptpl = req.aptpl;
        let bumps = if self.quirks.generation_bumped_per_registered_nexus {
            u32::try_from(targets.len()).unwrap_or(u32::MAX)
        } else {
            1
        };
        self.bump_generation(bumps);
        Ok(())
    }

    /// The I_T nexuses a registration by `initiator` covers: the caller's target port, or every
    /// target port of the LU with ALL_TG_PT.
    fn nexuses_for(
        &mut self,
        initiator: &TransportId,
        caller: Nexus,
        all_tg_pt: bool,
    ) -> Vec<Nexus> {
        let caller_port = self.state(caller).relative_target_port;
        let ports: Vec<u16> = if all_tg_pt {
            self.target_ports.iter().copied().collect()
        } else {
            vec![caller_port]
        };
        ports
            .into_iter()
            .map(|port| self.find_or_create_nexus(initiator, port))
            .collect()
    }

    /// The registrations a key change or unregistration through `nexus` affects: its own, plus
    /// the other ports' registrations made by the same ALL_TG_PT registration.
    fn registration_group(&self, nexus: Nexus) -> Vec<Nexus> {
        let Some(own) = self.registrations.iter().find(|r| r.nexus == nexus) else {
            return Vec::new();
        };
        if !own.all_tg_pt {
            return vec![nexus];
        }
        let initiator = &self.state(nexus).initiator;
        self.registrations
            .iter()
            .filter(|r| r.all_tg_pt && self.state(r.nexus).initiator == *initiator)
            .map(|r| r.nexus)
            .collect()
    }

    /// REGISTER with a zero SARK (SPC-4 §5.7.11.3): a non-all-registrants holder releases its
    /// reservation (telling the other registrants under RO types); an all-registrants
    /// reservation stays while any registrant remains.
    fn unregister(&mut self, caller: Nexus, group: &[Nexus]) {
        let released = match self.reservation {
            Some(held) if !held.rtype.is_all_registrants() && group.contains(&held.holder) => {
                Some(held)
            }
            _ => None,
        };
        self.registrations.retain(|r| !group.contains(&r.nexus));
        if let Some(held) = released {
            self.reservation = None;
            if is_registrants_only(held.rtype) {
                self.notify_registrants_except(caller, UnitAttention::RESERVATIONS_RELEASED);
            }
        }
        self.pass_on_all_registrants_reservation();
    }

    fn reserve(&mut self, nexus: Nexus, req: &PrOut) -> Result<(), ScsiFailure> {
        self.require_registration(nexus, req.key, true)?;
        let rtype = req.rtype.ok_or_else(ScsiFailure::invalid_field_in_cdb)?;
        match self.reservation {
            None => {
                self.reservation = Some(Held {
                    holder: nexus,
                    rtype,
                });
                Ok(())
            }
            Some(held) if held.rtype == rtype && self.is_holder(nexus) => Ok(()),
            Some(_) => Err(ScsiFailure::ReservationConflict),
        }
    }

    fn release(&mut self, nexus: Nexus, req: &PrOut) -> Result<(), ScsiFailure> {
        let holder_only = self.quirks.release_validated_only_for_holder;
        match self.registered_key(nexus) {
            Some(key) if key != req.key && !holder_only => {
                return Err(ScsiFailure::ReservationConflict);
            }
            Some(_) => {}
            None => return self.require_registration(nexus, req.key, true),
        }
        let Some(held) = self.reservation else {
            return Ok(());
        };
        if !self.is_holder(nexus) {
            return Ok(());
        }
        if self.registered_key(nexus) != Some(req.key) {
            return Err(ScsiFailure::ReservationConflict);
        }
        if req.rtype != Some(held.rtype) {
            return Err(if holder_only {
                ScsiFailure::ReservationConflict
            } else {
                ScsiFailure::invalid_release()
            });
        }
        self.reservation = None;
        if is_registrants_only(held.rtype) || held.rtype.is_all_registrants() {
            self.notify_registrants_except(nexus, UnitAttention::RESERVATIONS_RELEASED);
        }
        Ok(())
    }

    fn clear(&mut self, nexus: Nexus, req: &PrOut) -> Result<(), ScsiFailure> {
        self.require_registration(nexus, req.key, true)?;
        self.notify_registrants_except(nexus, UnitAttention::RESERVATIONS_PREEMPTED);
        self.registrations.clear();
        self.reservation = None;
        self.aptpl = false;
        self.bump_generation(1);
        Ok(())
    }

    /// PREEMPT and PREEMPT AND ABORT (SPC-4 §5.7.11.4; no tasks to abort in the model).
    fn preempt(&mut self, nexus: Nexus, req: &PrOut) -> Result<(), ScsiFailure> {
        self.require_registration(nexus, req.key, false)?;
        let sark = req.sa_key;
        let Some(held) = self.reservation else {
            if sark.is_zero() {
                return Err(ScsiFailure::invalid_field_in_parameter_list());
            }
            return self.preempt_registrations_only(nexus, sark, false);
        };
        let nominal = self.quirks.all_registrants_nominal_holder;
        if held.rtype.is_all_registrants() {
            if sark.is_zero() {
                // Everyone else goes and the caller takes the reservation.
                let victims = self.registered_nexuses_where(|reg| reg.nexus != nexus);
                return self.take_over(nexus, req, held, &victims);
            }
            if !(nominal && self.registered_key(held.holder) == Some(sark)) {
                return self.preempt_registrations_only(nexus, sark, nominal);
            }
        } else {
            if sark.is_zero() {
                return Err(ScsiFailure::invalid_field_in_parameter_list());
            }
            if self.registered_key(held.holder) != Some(sark) {
                return self.preempt_registrations_only(nexus, sark, false);
            }
        }
        // SARK is the holder's key: its registrations (but not the caller's) go.
        let victims = self.registered_nexuses_where(|reg| reg.key == sark && reg.nexus != nexus);
        self.take_over(nexus, req, held, &victims)
    }

    /// Removes `victims` and reserves for the caller with the requested TYPE; the survivors hear
    /// RESERVATIONS RELEASED if the type changed.
    fn take_over(
        &mut self,
        nexus: Nexus,
        req: &PrOut,
        previous: Held,
        victims: &[Nexus],
    ) -> Result<(), ScsiFailure> {
        let rtype = req.rtype.ok_or_else(ScsiFailure::invalid_field_in_cdb)?;
        self.remove_preempted(nexus, victims);
        self.reservation = Some(Held {
            holder: nexus,
            rtype,
        });
        if rtype != previous.rtype {
            self.notify_registrants_except(nexus, UnitAttention::RESERVATIONS_RELEASED);
        }
        self.bump_generation(1);
        Ok(())
    }

    /// PREEMPT whose SARK names no reservation holder: remove every registration with that key
    /// (the caller's too, if it matches, unless `spare_caller`), leave the reservation alone;
    /// TYPE is ignored.
    fn preempt_registrations_only(
        &mut self,
        nexus: Nexus,
        sark: Key,
        spare_caller: bool,
    ) -> Result<(), ScsiFailure> {
        let matched = self.registered_nexuses_where(|reg| reg.key == sark);
        if matched.is_empty() {
            return Err(ScsiFailure::ReservationConflict);
        }
        let victims: Vec<Nexus> = matched
            .into_iter()
            .filter(|&victim| !(spare_caller && victim == nexus))
            .collect();
        self.remove_preempted(nexus, &victims);
        self.pass_on_all_registrants_reservation();
        self.bump_generation(1);
        Ok(())
    }

    fn remove_preempted(&mut self, caller: Nexus, victims: &[Nexus]) {
        self.registrations.retain(|r| !victims.contains(&r.nexus));
        for &victim in victims {
            if victim != caller {
                push_unit_attention(
                    self.state_mut(victim),
                    UnitAttention::REGISTRATIONS_PREEMPTED,
                );
            }
        }
    }

    /// REGISTER AND MOVE (SPC-4 §5.7.8), basic: the holder of a non-all-registrants reservation
    /// hands it to another I_T nexus, registering that nexus with SARK if needed.
    fn register_and_move(&mut self, nexus: Nexus, req: &PrOut) -> Result<(), ScsiFailure> {
        self.require_registration(nexus, req.key, true)?;
        let Some(held) = self
            .reservation
            .filter(|held| !held.rtype.is_all_registrants() && held.holder == nexus)
        else {
            return Err(ScsiFailure::ReservationConflict);
        };
        let Some(destination) = &req.register_move else {
            return Err(ScsiFailure::invalid_field_in_parameter_list());
        };
        if req.sa_key.is_zero()
            || !self
                .target_ports
                .contains(&destination.relative_target_port)
        {
            return Err(ScsiFailure::invalid_field_in_parameter_list());
        }
        let target =
            self.find_or_create_nexus(&destination.transport_id, destination.relative_target_port);
        if target == nexus {
            return Err(ScsiFailure::invalid_field_in_parameter_list());
        }
        if self.registered_key(target).is_none() {
            self.registrations.push(Registered {
                nexus: target,
                key: req.sa_key,
                all_tg_pt: false,
            });
        }
        self.reservation = Some(Held {
            holder: target,
            rtype: held.rtype,
        });
        if destination.unreg {
            self.registrations.retain(|r| r.nexus != nexus);
        }
        self.aptpl = req.aptpl;
        self.bump_generation(1);
        Ok(())
    }

    // ----- helpers -----

    fn registered_nexuses_where(&self, predicate: impl Fn(&Registered) -> bool) -> Vec<Nexus> {
        self.registrations
            .iter()
            .filter(|reg| predicate(reg))
            .map(|reg| reg.nexus)
            .collect()
    }

    fn notify_registrants_except(&mut self, except: Nexus, ua: UnitAttention) {
        for nexus in self.registered_nexuses_where(|reg| reg.nexus != except) {
            push_unit_attention(self.state_mut(nexus), ua);
        }
    }

    /// An all-registrants reservation outlives any one registrant: when its nominal holder goes,
    /// the oldest remaining registration takes that role (as LIO does); with the last registrant
    /// the reservation ends.
    fn pass_on_all_registrants_reservation(&mut self) {
        let Some(held) = self.reservation else {
            return;
        };
        if !held.rtype.is_all_registrants() || self.registered_key(held.holder).is_some() {
            return;
        }
        self.reservation = self.registrations.first().map(|reg| Held {
            holder: reg.nexus,
            rtype: held.rtype,
        });
    }

    fn bump_generation(&mut self, by: u32) {
        self.generation = self.generation.wrapping_add(by);
    }

    fn find_or_create_nexus(
        &mut self,
        initiator: &TransportId,
        relative_target_port: u16,
    ) -> Nexus {
        self.target_ports.insert(relative_target_port);
        if let Some(index) = self.nexuses.iter().position(|n| {
            n.relative_target_port == relative_target_port && n.initiator == *initiator
        }) {
            return nexus_at(index);
        }
        self.nexuses.push(NexusState {
            initiator: initiator.clone(),
            relative_target_port,
            connected: false,
            ever_connected: false,
            unit_attentions: VecDeque::new(),
            injections: VecDeque::new(),
        });
        nexus_at(self.nexuses.len() - 1)
    }

    /// Panics on a handle from another `ModelLu`: a bug in the test, not a SCSI condition.
    fn state(&self, nexus: Nexus) -> &NexusState {
        &self.nexuses[nexus.0 as usize]
    }

    fn state_mut(&mut self, nexus: Nexus) -> &mut NexusState {
        &mut self.nexuses[nexus.0 as usize]
    }
}

const ALL_TYPES: [ReservationType; 6] = [
    ReservationType::WriteExclusive,
    ReservationType::ExclusiveAccess,
    ReservationType::WriteExclusiveRegistrantsOnly,
    ReservationType::ExclusiveAccessRegistrantsOnly,
    ReservationType::WriteExclusiveAllRegistrants,
    ReservationType::ExclusiveAccessAllRegistrants,
];

fn is_registrants_only(rtype: ReservationType) -> bool {
    matches!(
        rtype,
        ReservationType::WriteExclusiveRegistrantsOnly
            | ReservationType::ExclusiveAccessRegistrantsOnly
    )
}

/// The same condition is not queued twice (SPC-4 §5.9 lets a device server coalesce them).
fn push_unit_attention(state: &mut NexusState, ua: UnitAttention) {
    if !state.unit_attentions.contains(&ua) {
        state.unit_attentions.push_back(ua);
    }
}

/// LIO's node ACL: one initiator name (all its iSCSI sessions) behind one target port.
fn same_node_acl(a: &NexusState, b: &NexusState) -> bool {
    let initiator_name = |state: &NexusState| match &state.initiator {
        TransportId::Iscsi { name, .. } => TransportId::Iscsi {
            name: name.clone(),
            isid: None,
        },
        other => other.clone(),
    };
    a.relative_target_port == b.relative_target_port && initiator_name(a) == initiator_name(b)
}

fn nexus_at(index: usize) -> Nexus {
    match u32::try_from(index) {
        Ok(id) => Nexus(id),
        Err(_) => panic!("more than 2^32 I_T nexuses on one model LU"),
    }
}
