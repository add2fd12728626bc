//! The model against SPC-4 rules and libiscsi's `iscsi-test-cu` PR checklist.

use super::*;
use crate::pr::RegisterMove;

use ReservationType::{
    ExclusiveAccess as EA, ExclusiveAccessAllRegistrants as EAAR,
    ExclusiveAccessRegistrantsOnly as EARO, WriteExclusive as WE,
    WriteExclusiveAllRegistrants as WEAR, WriteExclusiveRegistrantsOnly as WERO,
};

const ALL: [ReservationType; 6] = [WE, EA, WERO, EARO, WEAR, EAAR];
const K1: Key = Key::new(0x1111);
const K2: Key = Key::new(0x2222);
const K3: Key = Key::new(0x3333);
const CONFLICT: Result<(), ModelError> = Err(ModelError::Scsi(ScsiFailure::ReservationConflict));

fn iqn(host: &str, isid: &str) -> TransportId {
    TransportId::Iscsi {
        name: format!("iqn.2026-11.test:{host}"),
        isid: Some(isid.to_owned()),
    }
}

fn scsi_err(failure: ScsiFailure) -> Result<(), ModelError> {
    Err(ModelError::Scsi(failure))
}

fn ua_err(ua: UnitAttention) -> Result<(), ModelError> {
    Err(ModelError::Scsi(ua.to_failure()))
}

/// An LU with three initiators a, b, c on target port 1.
fn rig(quirks: Quirks) -> (ModelLu, Nexus, Nexus, Nexus) {
    let mut lu = ModelLu::new(quirks);
    let a = lu.connect(iqn("a", "023d0001"), 1);
    let b = lu.connect(iqn("b", "023d0001"), 1);
    let c = lu.connect(iqn("c", "023d0001"), 1);
    (lu, a, b, c)
}

fn out(action: PrOutAction, key: Key, sa_key: Key, rtype: Option<ReservationType>) -> PrOut {
    PrOut {
        action,
        rtype,
        key,
        sa_key,
        aptpl: false,
        all_tg_pt: false,
        spec_i_pt: Vec::new(),
        register_move: None,
    }
}

fn register(key: Key, sa_key: Key) -> PrOut {
    out(PrOutAction::Register, key, sa_key, None)
}

fn reserve(key: Key, rtype: ReservationType) -> PrOut {
    out(PrOutAction::Reserve, key, Key::ZERO, Some(rtype))
}

fn release(key: Key, rtype: ReservationType) -> PrOut {
    out(PrOutAction::Release, key, Key::ZERO, Some(rtype))
}

fn clear(key: Key) -> PrOut {
    out(PrOutAction::Clear, key, Key::ZERO, None)
}

fn preempt(key: Key, sa_key: Key, rtype: ReservationType) -> PrOut {
    out(PrOutAction::Preempt, key, sa_key, Some(rtype))
}

fn keys(lu: &mut ModelLu, nexus: Nexus) -> Vec<Key> {
    lu.read_keys(nexus).unwrap().keys
}

/// Registers a with K1 and b with K2 (c stays unregistered), then a reserves `rtype`.
fn reserved(quirks: Quirks, rtype: ReservationType) -> (ModelLu, Nexus, Nexus, Nexus) {
    let (mut lu, a, b, c) = rig(quirks);
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(b, &register(Key::ZERO, K2)).unwrap();
    lu.pr_out(a, &reserve(K1, rtype)).unwrap();
    (lu, a, b, c)
}

// ----- access matrix (SPC-4 table 'allowed commands'; libiscsi ProutReserve.Access*) -----

#[test]
fn access_matrix_all_types_roles_and_directions() {
    // (type, registered read, registered write, unregistered read, unregistered write)
    let table = [
        (WE, true, false, true, false),
        (EA, false, false, false, false),
        (WERO, true, true, true, false),
        (EARO, true, true, false, false),
        (WEAR, true, true, true, false),
        (EAAR, true, true, false, false),
    ];
    for ((rtype, reg_read, reg_write, unreg_read, unreg_write), quirks) in table
        .into_iter()
        .flat_map(|row| [(row, Quirks::spc4()), (row, Quirks::lio())])
    {
        let (mut lu, holder, registered, unregistered) = reserved(quirks, rtype);
        let cases = [
            (holder, Io::Read, true),
            (holder, Io::Write, true),
            (registered, Io::Read, reg_read),
            (registered, Io::Write, reg_write),
            (unregistered, Io::Read, unreg_read),
            (unregistered, Io::Write, unreg_write),
        ];
        for (nexus, io, allowed) in cases {
            let expected = if allowed { Ok(()) } else { CONFLICT };
            assert_eq!(
                lu.access(nexus, io),
                expected,
                "{rtype:?} {nexus:?} {io:?} {quirks:?}"
            );
        }
    }
}

#[test]
fn without_reservation_everyone_may_read_and_write() {
    let (mut lu, a, _, c) = rig(Quirks::spc4());
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    for nexus in [a, c] {
        assert_eq!(lu.access(nexus, Io::Read), Ok(()));
        assert_eq!(lu.access(nexus, Io::Write), Ok(()));
    }
}

#[test]
fn holder_on_one_port_does_not_cover_the_same_initiator_on_another_port() {
    let mut lu = ModelLu::new(Quirks::spc4());
    let a1 = lu.connect(iqn("a", "1"), 1);
    let a2 = lu.connect(iqn("a", "1"), 2);
    lu.pr_out(a1, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(a1, &reserve(K1, WE)).unwrap();
    assert_eq!(lu.access(a1, Io::Write), Ok(()));
    assert_eq!(lu.access(a2, Io::Write), CONFLICT);
}

// ----- libiscsi checklist -----

#[test]
fn libiscsi_register_simple() {
    let (mut lu, a, _, _) = rig(Quirks::lio());
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    assert_eq!(keys(&mut lu, a), vec![K1]);
    assert_eq!(lu.pr_out(a, &register(K2, K3)), CONFLICT);
    lu.pr_out(a, &register(K1, Key::ZERO)).unwrap();
    assert!(keys(&mut lu, a).is_empty());
}

#[test]
fn libiscsi_reserve_simple_every_type() {
    for rtype in ALL {
        let (mut lu, a, _, _) = reserved(Quirks::lio(), rtype);
        let expected_key = if rtype.is_all_registrants() {
            Key::ZERO
        } else {
            K1
        };
        let reservation = lu.read_reservation(a).unwrap().reservation.unwrap();
        assert_eq!(
            reservation,
            Reservation {
                key: expected_key,
                rtype,
                scope: Scope::LogicalUnit
            }
        );
        lu.pr_out(a, &release(K1, rtype)).unwrap();
        assert_eq!(lu.read_reservation(a).unwrap().reservation, None);
    }
}

#[test]
fn libiscsi_ownership_when_holder_unregisters() {
    for rtype in ALL {
        let (mut lu, a, b, _) = reserved(Quirks::lio(), rtype);
        lu.pr_out(a, &register(K1, Key::ZERO)).unwrap();
        if rtype.is_all_registrants() {
            // The reservation passes on to the remaining registrant, who may release it.
            assert_eq!(lu.holder(), Some(Holder::AllRegistrants));
            assert!(lu.is_holder(b));
            assert!(lu.pending_unit_attentions(b).is_empty());
            lu.pr_out(b, &release(K2, rtype)).unwrap();
            assert_eq!(lu.reservation(), None);
        } else {
            assert_eq!(lu.reservation(), None, "{rtype:?}");
            let expected: Vec<UnitAttention> = if matches!(rtype, WERO | EARO) {
                vec![UnitAttention::RESERVATIONS_RELEASED]
            } else {
                vec![]
            };
            assert_eq!(lu.pending_unit_attentions(b), expected, "{rtype:?}");
        }
    }
}

#[test]
fn all_registrants_reservation_ends_with_its_last_registrant() {
    let (mut lu, a, b, _) = reserved(Quirks::spc4(), EAAR);
    lu.pr_out(a, &register(K1, Key::ZERO)).unwrap();
    lu.pr_out(b, &register(K2, Key::ZERO)).unwrap();
    assert_eq!(lu.reservation(), None);
}

#[test]
fn libiscsi_clear_simple() {
    let (mut lu, a, b, _) = rig(Quirks::lio());
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(b, &register(Key::ZERO, K2)).unwrap();
    let before_reserve = lu.generation();
    lu.pr_out(a, &reserve(K1, WE)).unwrap();
    assert_eq!(
        lu.generation(),
        before_reserve,
        "RESERVE must not bump PRgeneration"
    );
    lu.pr_out(a, &clear(K1)).unwrap();
    assert_eq!(lu.generation(), before_reserve.wrapping_add(1));
    assert!(keys(&mut lu, a).is_empty());
    assert_eq!(lu.read_reservation(a).unwrap().reservation, None);
    assert_eq!(
        lu.pending_unit_attentions(b),
        vec![UnitAttention::RESERVATIONS_PREEMPTED]
    );
    assert!(lu.pending_unit_attentions(a).is_empty());
}

#[test]
fn libiscsi_preempt_removes_registration() {
    let (mut lu, a, b, _) = rig(Quirks::lio());
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(b, &register(Key::ZERO, K2)).unwrap();
    let generation = lu.generation();
    lu.pr_out(b, &preempt(K2, K1, WE)).unwrap();
    assert_eq!(keys(&mut lu, b), vec![K2]);
    assert_eq!(lu.generation(), generation.wrapping_add(1));
    assert_eq!(lu.reservation(), None, "no reservation is created");
    // The victim learns it was fenced, and TEST UNIT READY clears that.
    assert_eq!(
        lu.test_unit_ready(a),
        ua_err(UnitAttention::REGISTRATIONS_PREEMPTED)
    );
    assert_eq!(lu.test_unit_ready(a), Ok(()));
    assert_eq!(lu.test_unit_ready(b), Ok(()));
}

// ----- PRgeneration -----

#[test]
fn generation_changes_per_service_action() {
    for (quirks, unregister_bump) in [(Quirks::spc4(), 1), (Quirks::lio(), 0)] {
        let (mut lu, a, b, c) = rig(quirks);
        let mut expect = 0u32;
        let mut step = |lu: &mut ModelLu, nexus: Nexus, req: PrOut, bump: u32| {
            lu.pr_out(nexus, &req).unwrap();
            expect = expect.wrapping_add(bump);
            assert_eq!(lu.generation(), expect, "{:?} under {quirks:?}", req.action);
            assert_eq!(lu.read_keys(nexus).unwrap().generation, expect);
        };
        step(&mut lu, a, register(Key::ZERO, K1), 1);
        step(&mut lu, b, register(Key::ZERO, K2), 1);
        step(&mut lu, a, register(K1, K3), 1); // key change
        step(&mut lu, a, reserve(K3, WE), 0);
        step(&mut lu, a, reserve(K3, WE), 0); // idempotent re-reserve
        step(&mut lu, a, release(K3, WE), 0);
        // Unregistering an unregistered nexus is a GOOD no-op.
        step(&mut lu, c, register(Key::ZERO, Key::ZERO), 0);
        step(&mut lu, a, preempt(K3, K2, WE), 1);
        step(&mut lu, a, register(K3, Key::ZERO), unregister_bump);
        step(&mut lu, a, register(Key::ZERO, K1), 1);
        step(&mut lu, a, clear(K1), 1);
    }
}

#[test]
fn generation_wraps() {
    let (mut lu, a, _, _) = rig(Quirks::spc4());
    lu.set_generation(u32::MAX);
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    assert_eq!(lu.read_keys(a).unwrap().generation, 0);
}

// ----- REGISTER / REGISTER AND IGNORE EXISTING KEY -----

#[test]
fn register_from_unregistered_nexus_needs_zero_reservation_key() {
    let (mut lu, a, _, _) = rig(Quirks::spc4());
    assert_eq!(lu.pr_out(a, &register(K1, K2)), CONFLICT);
    assert!(lu.registrations().is_empty());
}

#[test]
fn register_and_ignore_existing_key_ignores_the_key() {
    let (mut lu, a, _, _) = rig(Quirks::spc4());
    let ignore = |sa_key| out(PrOutAction::RegisterAndIgnoreExistingKey, K3, sa_key, None);
    lu.pr_out(a, &ignore(K1)).unwrap();
    assert_eq!(lu.registered_key(a), Some(K1));
    lu.pr_out(a, &ignore(K2)).unwrap();
    assert_eq!(lu.registered_key(a), Some(K2));
    lu.pr_out(a, &ignore(Key::ZERO)).unwrap();
    assert_eq!(lu.registered_key(a), None);
    assert_eq!(lu.generation(), 3);
}

#[test]
fn key_change_by_holder_keeps_the_reservation_under_the_new_key() {
    let (mut lu, a, _, _) = reserved(Quirks::spc4(), WE);
    lu.pr_out(a, &register(K1, K3)).unwrap();
    let reservation = lu.read_reservation(a).unwrap().reservation.unwrap();
    assert_eq!(reservation.key, K3);
    assert_eq!(lu.holder(), Some(Holder::Nexus(a)));
}

#[test]
fn aptpl_follows_the_last_registration_and_is_reported() {
    let (mut lu, a, _, _) = rig(Quirks::spc4());
    let mut req = register(Key::ZERO, K1);
    req.aptpl = true;
    lu.pr_out(a, &req).unwrap();
    assert!(lu.aptpl());
    assert!(lu.report_capabilities(a).unwrap().ptpl_a);
    lu.pr_out(a, &register(K1, K2)).unwrap();
    assert!(!lu.report_capabilities(a).unwrap().ptpl_a);
}

#[test]
fn all_tg_pt_registers_every_target_port() {
    for (quirks, bump) in [(Quirks::spc4(), 1), (Quirks::lio(), 2)] {
        let mut lu = ModelLu::new(quirks);
        lu.add_target_port(2);
        let a1 = lu.connect(iqn("a", "1"), 1);
        let mut req = register(Key::ZERO, K1);
        req.all_tg_pt = true;
        lu.pr_out(a1, &req).unwrap();
        assert_eq!(lu.generation(), bump);
        assert_eq!(keys(&mut lu, a1), vec![K1, K1]);
        // A later login through port 2 finds itself registered.
        let a2 = lu.connect(iqn("a", "1"), 2);
        assert_eq!(lu.registered_key(a2), Some(K1));
        lu.pr_out(a1, &reserve(K1, WERO)).unwrap();
        assert_eq!(lu.access(a2, Io::Write), Ok(()));
        // Unregistering through either port removes the whole ALL_TG_PT registration; LIO
        // insists on ALL_TG_PT=1 for that.
        let mut unregister = register(K1, Key::ZERO);
        if quirks.all_tg_pt_change_requires_all_tg_pt {
            assert_eq!(
                lu.pr_out(a2, &unregister),
                scsi_err(ScsiFailure::invalid_field_in_cdb())
            );
            unregister.all_tg_pt = true;
        }
        lu.pr_out(a2, &unregister).unwrap();
        assert!(lu.registrations().is_empty());
        assert_eq!(lu.reservation(), None);
    }
}

#[test]
fn spec_i_pt_registers_the_named_initiators_too() {
    let (mut lu, a, b, _) = rig(Quirks::spc4());
    let mut req = register(Key::ZERO, K1);
    req.spec_i_pt = vec![iqn("b", "023d0001")];
    lu.pr_out(a, &req).unwrap();
    assert_eq!(lu.registered_key(a), Some(K1));
    assert_eq!(lu.registered_key(b), Some(K1));
    assert_eq!(lu.generation(), 1);
    // SPEC_I_PT from a registered nexus, or naming a registered one, is refused whole.
    let invalid = scsi_err(ScsiFailure::invalid_field_in_parameter_list());
    let mut rekey = register(K1, K2);
    rekey.spec_i_pt = vec![iqn("d", "1")];
    assert_eq!(lu.pr_out(a, &rekey), invalid);
    let mut again = register(Key::ZERO, K2);
    again.spec_i_pt = vec![iqn("b", "023d0001")];
    let c = lu.connect(iqn("c", "023d0001"), 1);
    assert_eq!(lu.pr_out(c, &again), invalid);
    assert_eq!(lu.registered_key(c), None);
    // Only REGISTER takes SPEC_I_PT.
    let mut ignore = out(
        PrOutAction::RegisterAndIgnoreExistingKey,
        Key::ZERO,
        K2,
        None,
    );
    ignore.spec_i_pt = vec![iqn("d", "1")];
    assert_eq!(lu.pr_out(c, &ignore), invalid);
}

// ----- RESERVE -----

#[test]
fn reserve_conflicts_and_idempotence() {
    let (mut lu, a, b, c) = reserved(Quirks::spc4(), WE);
    assert_eq!(
        lu.pr_out(a, &reserve(K1, WE)),
        Ok(()),
        "same holder, same type"
    );
    assert_eq!(
        lu.pr_out(a, &reserve(K1, EA)),
        CONFLICT,
        "holder, other type"
    );
    assert_eq!(
        lu.pr_out(b, &reserve(K2, WE)),
        CONFLICT,
        "another holder exists"
    );
    assert_eq!(
        lu.pr_out(b, &reserve(K1, WE)),
        CONFLICT,
        "wrong reservation key"
    );
    assert_eq!(
        lu.pr_out(c, &reserve(Key::ZERO, WE)),
        CONFLICT,
        "unregistered"
    );
    assert_eq!(lu.holder(), Some(Holder::Nexus(a)));
    assert_eq!(
        lu.pr_out(a, &out(PrOutAction::Reserve, K1, Key::ZERO, None)),
        scsi_err(ScsiFailure::invalid_field_in_cdb())
    );
}

#[test]
fn any_registrant_may_re_reserve_an_all_registrants_reservation_of_the_same_type() {
    let (mut lu, _, b, _) = reserved(Quirks::spc4(), WEAR);
    assert_eq!(lu.pr_out(b, &reserve(K2, WEAR)), Ok(()));
    assert_eq!(lu.pr_out(b, &reserve(K2, EAAR)), CONFLICT);
}

#[test]
fn lio_answers_unregistered_pr_out_without_reservation_with_not_ready() {
    let not_ready = scsi_err(ScsiFailure::lio_communication_failure());
    let (mut lu, a, _, c) = rig(Quirks::lio());
    assert_eq!(lu.pr_out(c, &reserve(Key::ZERO, WE)), not_ready);
    assert_eq!(lu.pr_out(c, &release(Key::ZERO, WE)), not_ready);
    assert_eq!(lu.pr_out(c, &clear(Key::ZERO)), not_ready);
    // PREEMPT is correct in LIO.
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    assert_eq!(lu.pr_out(c, &preempt(Key::ZERO, K1, WE)), CONFLICT);
    // With a reservation in place LIO answers RESERVATION CONFLICT.
    lu.pr_out(a, &reserve(K1, WE)).unwrap();
    assert_eq!(lu.pr_out(c, &reserve(Key::ZERO, WE)), CONFLICT);
    // SPC-4 always says RESERVATION CONFLICT.
    let (mut lu, _, _, c) = rig(Quirks::spc4());
    assert_eq!(lu.pr_out(c, &reserve(Key::ZERO, WE)), CONFLICT);
    assert_eq!(lu.pr_out(c, &clear(Key::ZERO)), CONFLICT);
}

// ----- RELEASE -----

#[test]
fn release_type_mismatch_is_invalid_release() {
    let (mut lu, a, _, _) = reserved(Quirks::spc4(), WE);
    assert_eq!(
        lu.pr_out(a, &release(K1, EA)),
        scsi_err(ScsiFailure::invalid_release())
    );
    assert_eq!(lu.holder(), Some(Holder::Nexus(a)));
}

#[test]
fn release_by_non_holder_or_without_reservation_is_a_good_no_op() {
    let (mut lu, a, b, _) = reserved(Quirks::spc4(), EA);
    assert_eq!(lu.pr_out(b, &release(K2, EA)), Ok(()));
    assert_eq!(lu.holder(), Some(Holder::Nexus(a)));
    lu.pr_out(a, &release(K1, EA)).unwrap();
    assert_eq!(lu.pr_out(a, &release(K1, EA)), Ok(()));
    assert_eq!(
        lu.pr_out(b, &release(K1, EA)),
        CONFLICT,
        "wrong key still conflicts"
    );
}

#[test]
fn release_notifies_other_registrants_only_for_ro_and_ar_types() {
    for rtype in ALL {
        let (mut lu, a, b, c) = reserved(Quirks::spc4(), rtype);
        lu.pr_out(a, &release(K1, rtype)).unwrap();
        let expected: Vec<UnitAttention> = if matches!(rtype, WE | EA) {
            vec![]
        } else {
            vec![UnitAttention::RESERVATIONS_RELEASED]
        };
        assert_eq!(lu.pending_unit_attentions(b), expected, "{rtype:?}");
        assert!(lu.pending_unit_attentions(a).is_empty());
        assert!(
            lu.pending_unit_attentions(c).is_empty(),
            "c is unregistered"
        );
    }
}

// ----- PREEMPT / PREEMPT AND ABORT -----

#[test]
fn preempting_the_holder_takes_over_with_the_new_type() {
    for action in [PrOutAction::Preempt, PrOutAction::PreemptAndAbort] {
        let (mut lu, a, b, c) = reserved(Quirks::spc4(), WE);
        // d shares the holder's key; e is an unrelated registrant.
        let d = lu.connect(iqn("d", "1"), 1);
        let e = lu.connect(iqn("e", "1"), 1);
        lu.pr_out(d, &register(Key::ZERO, K1)).unwrap();
        lu.pr_out(e, &register(Key::ZERO, K3)).unwrap();
        let generation = lu.generation();
        lu.pr_out(b, &out(action, K2, K1, Some(EARO))).unwrap();
        assert_eq!(keys(&mut lu, b), vec![K2, K3]);
        assert_eq!(
            lu.reservation(),
            Some(ReservationState {
                holder: Holder::Nexus(b),
                rtype: EARO
            })
        );
        assert_eq!(lu.generation(), generation.wrapping_add(1));
        for victim in [a, d] {
            assert_eq!(
                lu.pending_unit_attentions(victim),
                vec![UnitAttention::REGISTRATIONS_PREEMPTED]
            );
            assert_eq!(
                lu.access(victim, Io::Read),
                ua_err(UnitAttention::REGISTRATIONS_PREEMPTED)
            );
            assert_eq!(lu.access(victim, Io::Write), CONFLICT);
        }
        // The type changed, so the surviving registrant hears RESERVATIONS RELEASED.
        assert_eq!(
            lu.pending_unit_attentions(e),
            vec![UnitAttention::RESERVATIONS_RELEASED]
        );
        assert!(lu.pending_unit_attentions(b).is_empty());
        assert!(lu.pending_unit_attentions(c).is_empty());
    }
}

#[test]
fn preempting_the_holder_with_the_same_type_tells_survivors_nothing() {
    let (mut lu, a, b, c) = reserved(Quirks::spc4(), WERO);
    lu.pr_out(c, &register(Key::ZERO, K3)).unwrap();
    lu.pr_out(b, &preempt(K2, K1, WERO)).unwrap();
    assert!(lu.pending_unit_attentions(c).is_empty());
    assert_eq!(
        lu.pending_unit_attentions(a),
        vec![UnitAttention::REGISTRATIONS_PREEMPTED]
    );
}

#[test]
fn preempting_a_non_holder_removes_only_its_registrations() {
    let (mut lu, a, b, c) = reserved(Quirks::spc4(), WERO);
    lu.pr_out(c, &register(Key::ZERO, K3)).unwrap();
    let generation = lu.generation();
    // The TYPE field is ignored when only registrations are preempted.
    lu.pr_out(a, &out(PrOutAction::Preempt, K1, K3, None))
        .unwrap();
    assert_eq!(keys(&mut lu, a), vec![K1, K2]);
    assert_eq!(lu.holder(), Some(Holder::Nexus(a)));
    assert_eq!(lu.reservation().map(|r| r.rtype), Some(WERO));
    assert_eq!(lu.generation(), generation.wrapping_add(1));
    assert_eq!(
        lu.pending_unit_attentions(c),
        vec![UnitAttention::REGISTRATIONS_PREEMPTED]
    );
    assert!(lu.pending_unit_attentions(b).is_empty());
    // The fenced node can no longer write under WERO.
    lu.take_unit_attention(c);
    assert_eq!(lu.access(c, Io::Write), CONFLICT);
}

#[test]
fn preempt_refusals() {
    let (mut lu, a, b, c) = reserved(Quirks::lio(), WE);
    let invalid_list = scsi_err(ScsiFailure::invalid_field_in_parameter_list());
    assert_eq!(
        lu.pr_out(b, &preempt(K2, K3, WE)),
        CONFLICT,
        "SARK matches nothing"
    );
    assert_eq!(
        lu.pr_out(b, &preempt(K3, K1, WE)),
        CONFLICT,
        "wrong reservation key"
    );
    assert_eq!(
        lu.pr_out(c, &preempt(Key::ZERO, K1, WE)),
        CONFLICT,
        "unregistered"
    );
    assert_eq!(
        lu.pr_out(b, &preempt(K2, Key::ZERO, WE)),
        invalid_list,
        "zero SARK, WE"
    );
    assert_eq!(
        lu.pr_out(b, &out(PrOutAction::Preempt, K2, K1, None)),
        scsi_err(ScsiFailure::invalid_field_in_cdb()),
        "taking over needs a valid TYPE"
    );
    assert_eq!(lu.holder(), Some(Holder::Nexus(a)));
    lu.pr_out(a, &release(K1, WE)).unwrap();
    assert_eq!(
        lu.pr_out(b, &preempt(K2, Key::ZERO, WE)),
        invalid_list,
        "zero SARK, none"
    );
    assert_eq!(keys(&mut lu, a), vec![K1, K2]);
}

#[test]
fn zero_sark_preempt_of_all_registrants_reservation_removes_everyone_else() {
    let (mut lu, a, b, c) = reserved(Quirks::spc4(), WEAR);
    lu.pr_out(c, &register(Key::ZERO, K3)).unwrap();
    lu.pr_out(b, &preempt(K2, Key::ZERO, WE)).unwrap();
    assert_eq!(keys(&mut lu, b), vec![K2]);
    assert_eq!(
        lu.reservation(),
        Some(ReservationState {
            holder: Holder::Nexus(b),
            rtype: WE
        })
    );
    for victim in [a, c] {
        assert_eq!(
            lu.pending_unit_attentions(victim),
            vec![UnitAttention::REGISTRATIONS_PREEMPTED]
        );
    }
}

#[test]
fn keyed_preempt_under_all_registrants_removes_that_key_and_keeps_the_reservation() {
    let (mut lu, a, b, _) = reserved(Quirks::spc4(), EAAR);
    lu.pr_out(b, &preempt(K2, K1, EAAR)).unwrap();
    assert_eq!(keys(&mut lu, b), vec![K2]);
    assert_eq!(lu.holder(), Some(Holder::AllRegistrants));
    assert!(lu.is_holder(b));
    assert!(!lu.is_holder(a));
    lu.take_unit_attention(a);
    assert_eq!(lu.access(a, Io::Read), CONFLICT);
}

#[test]
fn holder_may_preempt_itself_to_change_type() {
    let (mut lu, a, b, c) = reserved(Quirks::spc4(), WE);
    // c shares a's key, as with a re-login that left an orphan under the same key.
    lu.pr_out(c, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(a, &preempt(K1, K1, EA)).unwrap();
    assert_eq!(keys(&mut lu, a), vec![K1, K2]);
    assert_eq!(
        lu.reservation(),
        Some(ReservationState {
            holder: Holder::Nexus(a),
            rtype: EA
        })
    );
    assert_eq!(
        lu.pending_unit_attentions(c),
        vec![UnitAttention::REGISTRATIONS_PREEMPTED]
    );
    assert_eq!(
        lu.pending_unit_attentions(b),
        vec![UnitAttention::RESERVATIONS_RELEASED]
    );
}

#[test]
fn preempting_your_own_key_without_reservation_unregisters_you() {
    let (mut lu, a, _, _) = rig(Quirks::spc4());
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(a, &preempt(K1, K1, WE)).unwrap();
    assert!(lu.registrations().is_empty());
    assert!(lu.pending_unit_attentions(a).is_empty());
}

#[test]
fn preempt_and_abort_unsupported_is_invalid_field_in_cdb() {
    let quirks = Quirks {
        preempt_and_abort_supported: false,
        ..Quirks::spc4()
    };
    let (mut lu, a, b, _) = reserved(quirks, WE);
    assert_eq!(
        lu.pr_out(b, &out(PrOutAction::PreemptAndAbort, K2, K1, Some(WE))),
        scsi_err(ScsiFailure::invalid_field_in_cdb())
    );
    assert_eq!(lu.holder(), Some(Holder::Nexus(a)));
    lu.pr_out(b, &preempt(K2, K1, WE)).unwrap();
    assert_eq!(lu.holder(), Some(Holder::Nexus(b)));
}

// ----- REGISTER AND MOVE -----

fn move_to(key: Key, sa_key: Key, transport_id: TransportId, unreg: bool) -> PrOut {
    let mut req = out(PrOutAction::RegisterAndMove, key, sa_key, None);
    req.register_move = Some(RegisterMove {
        unreg,
        relative_target_port: 1,
        transport_id,
    });
    req
}

#[test]
fn register_and_move_hands_the_reservation_over() {
    let (mut lu, a, _, _) = reserved(Quirks::spc4(), EA);
    let generation = lu.generation();
    lu.pr_out(a, &move_to(K1, K3, iqn("d", "1"), true)).unwrap();
    let d = lu.connect(iqn("d", "1"), 1);
    assert_eq!(lu.registered_key(d), Some(K3));
    assert_eq!(lu.registered_key(a), None);
    assert_eq!(lu.holder(), Some(Holder::Nexus(d)));
    assert_eq!(lu.reservation().map(|r| r.rtype), Some(EA));
    assert_eq!(lu.generation(), generation.wrapping_add(1));
    assert_eq!(lu.access(d, Io::Write), Ok(()));
    assert_eq!(lu.access(a, Io::Read), CONFLICT);
}

#[test]
fn register_and_move_refusals() {
    let invalid_list = scsi_err(ScsiFailure::invalid_field_in_parameter_list());
    let (mut lu, a, b, _) = reserved(Quirks::spc4(), WE);
    assert_eq!(
        lu.pr_out(b, &move_to(K2, K3, iqn("d", "1"), false)),
        CONFLICT
    );
    assert_eq!(
        lu.pr_out(a, &move_to(K1, Key::ZERO, iqn("d", "1"), false)),
        invalid_list
    );
    assert_eq!(
        lu.pr_out(a, &move_to(K1, K3, iqn("a", "023d0001"), false)),
        invalid_list
    );
    let (mut lu, a, _, _) = reserved(Quirks::spc4(), WEAR);
    assert_eq!(
        lu.pr_out(a, &move_to(K1, K3, iqn("d", "1"), false)),
        CONFLICT
    );
    let (mut lu, _, _, c) = rig(Quirks::lio());
    assert_eq!(
        lu.pr_out(c, &move_to(Key::ZERO, K3, iqn("d", "1"), false)),
        scsi_err(ScsiFailure::lio_communication_failure())
    );
}

// ----- PR IN -----

#[test]
fn read_full_status_marks_holders() {
    for rtype in [WE, EAAR] {
        let (mut lu, a, _, _) = reserved(Quirks::spc4(), rtype);
        let status = lu.read_full_status(a).unwrap();
        assert_eq!(status.generation, 2);
        let all_registrants = rtype.is_all_registrants();
        let expected = [
            (K1, iqn("a", "023d0001"), true),
            (K2, iqn("b", "023d0001"), all_registrants),
        ]
        .map(|(key, transport_id, holder)| Registration {
            key,
            all_tg_pt: false,
            holder,
            scope: holder.then_some(Scope::LogicalUnit),
            rtype: holder.then_some(rtype),
            relative_target_port: 1,
            transport_id,
        });
        assert_eq!(status.registrations, expected.to_vec());
    }
}

#[test]
fn report_capabilities_lists_all_six_types() {
    let (mut lu, a, _, _) = rig(Quirks::lio());
    let caps = lu.report_capabilities(a).unwrap();
    assert_eq!(caps.supported_types, Some(ALL.to_vec()));
    assert!(caps.allow_commands <= 5);
    assert!(caps.crh && caps.sip_c && caps.atp_c && caps.ptpl_c && caps.tmv);
    // libiscsi: every advertised type can be reserved and released.
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    for rtype in caps.supported_types.unwrap() {
        lu.pr_out(a, &reserve(K1, rtype)).unwrap();
        lu.pr_out(a, &release(K1, rtype)).unwrap();
    }
}

#[test]
fn emulate_pr_off_rejects_pr_commands_as_invalid_opcode() {
    let quirks = Quirks {
        emulate_pr: false,
        ..Quirks::lio()
    };
    let (mut lu, a, _, _) = rig(quirks);
    let invalid_opcode = ModelError::Scsi(ScsiFailure::illegal_request_invalid_opcode());
    assert_eq!(lu.pr_out(a, &register(Key::ZERO, K1)), Err(invalid_opcode));
    assert_eq!(lu.read_keys(a).unwrap_err(), invalid_opcode);
    assert_eq!(lu.read_reservation(a).unwrap_err(), invalid_opcode);
    assert_eq!(lu.report_capabilities(a).unwrap_err(), invalid_opcode);
    assert_eq!(lu.read_full_status(a).unwrap_err(), invalid_opcode);
    assert_eq!(lu.access(a, Io::Write), Ok(()));
}

// ----- unit attentions -----

#[test]
fn unit_attention_is_reported_instead_of_executing_the_command() {
    let (mut lu, a, b, _) = rig(Quirks::spc4());
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(b, &register(Key::ZERO, K2)).unwrap();
    lu.pr_out(a, &clear(K1)).unwrap();
    lu.pr_out(b, &register(Key::ZERO, K2)).unwrap_err();
    // The REGISTER above was not executed: the UA took its place and is now consumed.
    assert_eq!(lu.registered_key(b), None);
    lu.pr_out(b, &register(Key::ZERO, K2)).unwrap();
    assert_eq!(lu.registered_key(b), Some(K2));
}

#[test]
fn unit_attentions_queue_in_order_without_duplicates() {
    let (mut lu, a, b, _) = reserved(Quirks::spc4(), WERO);
    lu.pr_out(a, &release(K1, WERO)).unwrap();
    lu.pr_out(a, &reserve(K1, WERO)).unwrap();
    lu.pr_out(a, &release(K1, WERO)).unwrap();
    lu.pr_out(a, &clear(K1)).unwrap();
    assert_eq!(
        lu.pending_unit_attentions(b),
        vec![
            UnitAttention::RESERVATIONS_RELEASED,
            UnitAttention::RESERVATIONS_PREEMPTED
        ]
    );
    assert!(lu.read_keys(b).is_err());
    assert_eq!(
        lu.take_unit_attention(b),
        Some(UnitAttention::RESERVATIONS_PREEMPTED)
    );
    assert_eq!(lu.take_unit_attention(b), None);
    assert!(lu.read_keys(b).is_ok());
}

#[test]
fn power_on_unit_attention_on_first_login_only() {
    let quirks = Quirks {
        power_on_ua_for_new_nexus: true,
        ..Quirks::lio()
    };
    let mut lu = ModelLu::new(quirks);
    let a = lu.connect(iqn("a", "1"), 1);
    assert_eq!(lu.test_unit_ready(a), ua_err(UnitAttention::POWER_ON));
    assert_eq!(lu.test_unit_ready(a), Ok(()));
    lu.disconnect(a);
    let again = lu.connect(iqn("a", "1"), 1);
    assert_eq!(again, a);
    assert_eq!(lu.test_unit_ready(a), Ok(()));
    let (mut plain, a, _, _) = rig(Quirks::lio());
    assert_eq!(plain.test_unit_ready(a), Ok(()));
}

// ----- transport: logins and faults -----

#[test]
fn disconnect_keeps_registrations_and_reconnect_finds_them() {
    let (mut lu, a, _, _) = reserved(Quirks::spc4(), WE);
    lu.disconnect(a);
    assert_eq!(lu.read_keys(a).unwrap_err(), ModelError::TransportDown);
    assert_eq!(lu.access(a, Io::Write), Err(ModelError::TransportDown));
    let a_again = lu.connect(iqn("a", "023d0001"), 1);
    assert_eq!(a_again, a);
    assert_eq!(lu.access(a, Io::Write), Ok(()));
}

#[test]
fn relogin_with_new_isid_orphans_the_old_registration() {
    let (mut lu, old, _, _) = reserved(Quirks::lio(), WE);
    let new = lu.relogin(old, "023d0002");
    assert_ne!(new, old);
    assert!(!lu.is_connected(old));
    assert_eq!(lu.registered_key(old), Some(K1));
    assert_eq!(lu.holder(), Some(Holder::Nexus(old)));
    assert_eq!(lu.access(new, Io::Write), CONFLICT);
    // Recovery: register the new nexus under the same key and preempt the orphan.
    lu.pr_out(new, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(new, &preempt(K1, K1, WE)).unwrap();
    assert_eq!(lu.holder(), Some(Holder::Nexus(new)));
    assert_eq!(lu.registered_key(old), None);
    assert_eq!(lu.access(new, Io::Write), Ok(()));
    // The orphan hears about it if it ever comes back.
    let back = lu.connect(iqn("a", "023d0001"), 1);
    assert_eq!(
        lu.test_unit_ready(back),
        ua_err(UnitAttention::REGISTRATIONS_PREEMPTED)
    );
}

#[test]
fn injected_faults_before_execution_change_nothing() {
    let (mut lu, a, b, _) = rig(Quirks::spc4());
    lu.fail_next(a, Injected::Timeout, 2);
    lu.fail_next(a, Injected::TransportDown, 1);
    assert_eq!(
        lu.pr_out(a, &register(Key::ZERO, K1)),
        Err(ModelError::Timeout)
    );
    assert_eq!(lu.read_keys(a).unwrap_err(), ModelError::Timeout);
    assert_eq!(lu.test_unit_ready(a), Err(ModelError::TransportDown));
    assert_eq!(lu.registered_key(a), None);
    assert_eq!(lu.generation(), 0);
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    // Other nexuses are unaffected.
    lu.fail_next(a, Injected::Failure(ScsiFailure::ReservationConflict), 1);
    assert_eq!(lu.test_unit_ready(b), Ok(()));
    lu.clear_injections(a);
    assert_eq!(lu.test_unit_ready(a), Ok(()));
}

#[test]
fn lio_register_applied_then_not_ready_and_retry_conflicts() {
    let (mut lu, a, _, _) = rig(Quirks::lio());
    lu.inject(
        a,
        Injection {
            fault: Injected::Failure(ScsiFailure::lio_communication_failure()),
            timing: Timing::AfterExecuting,
            filter: CommandFilter::Only(ModelCommand::PrOut(PrOutAction::Register)),
            count: 1,
        },
    );
    assert!(
        lu.read_keys(a).unwrap().keys.is_empty(),
        "filter spares PR IN"
    );
    assert_eq!(
        lu.pr_out(a, &register(Key::ZERO, K1)),
        scsi_err(ScsiFailure::lio_communication_failure())
    );
    assert_eq!(lu.registered_key(a), Some(K1), "applied despite the error");
    assert_eq!(lu.pr_out(a, &register(Key::ZERO, K1)), CONFLICT);
}

#[test]
fn lost_response_after_execution() {
    let (mut lu, a, b, _) = reserved(Quirks::spc4(), WE);
    lu.inject(
        b,
        Injection {
            fault: Injected::Timeout,
            timing: Timing::AfterExecuting,
            filter: CommandFilter::AnyPrOut,
            count: 1,
        },
    );
    assert_eq!(lu.pr_out(b, &preempt(K2, K1, WE)), Err(ModelError::Timeout));
    assert_eq!(lu.holder(), Some(Holder::Nexus(b)));
    assert_eq!(lu.registered_key(a), None);
    // Re-sending the same PREEMPT now finds nothing to preempt.
    assert_eq!(lu.pr_out(b, &preempt(K2, K1, WE)), CONFLICT);
}

#[test]
fn inquiry_leaves_the_unit_attention_and_request_sense_reports_it() {
    let (mut lu, a, b, _) = rig(Quirks::spc4());
    lu.pr_out(a, &register(Key::ZERO, K1)).unwrap();
    lu.pr_out(b, &register(Key::ZERO, K2)).unwrap();
    lu.pr_out(a, &clear(K1)).unwrap();
    assert_eq!(lu.inquiry(b), Ok(()));
    assert_eq!(
        lu.request_sense(b),
        Ok(Some(UnitAttention::RESERVATIONS_PREEMPTED))
    );
    assert_eq!(lu.request_sense(b), Ok(None));
    assert_eq!(lu.test_unit_ready(b), Ok(()));
}

#[test]
fn emulate_pr_off_is_reported_before_a_pending_unit_attention() {
    let quirks = Quirks {
        emulate_pr: false,
        power_on_ua_for_new_nexus: true,
        ..Quirks::lio()
    };
    let mut lu = ModelLu::new(quirks);
    let a = lu.connect(iqn("a", "1"), 1);
    assert_eq!(
        lu.read_keys(a).unwrap_err(),
        ModelError::Scsi(ScsiFailure::illegal_request_invalid_opcode())
    );
    assert_eq!(lu.pending_unit_attentions(a), vec![UnitAttention::POWER_ON]);
}

// ----- invariants over random command sequences -----

mod invariants {
    use super::*;
    use proptest::prelude::*;

    const KEYS: [Key; 4] = [Key::ZERO, K1, K2, K3];

    #[derive(Debug, Clone)]
    struct Step {
        who: usize,
        action: PrOutAction,
        /// Use the nexus's own key as RESERVATION KEY (otherwise `key`).
        own_key: bool,
        key: Key,
        sa_key: Key,
        rtype: Option<ReservationType>,
    }

    fn step() -> impl Strategy<Value = Step> {
        let action = prop::sample::select(vec![
            PrOutAction::Register,
            PrOutAction::RegisterAndIgnoreExistingKey,
            PrOutAction::Reserve,
            PrOutAction::Release,
            PrOutAction::Clear,
            PrOutAction::Preempt,
            PrOutAction::PreemptAndAbort,
        ]);
        let key = prop::sample::select(KEYS.to_vec());
        let rtype = prop::option::weighted(0.9, prop::sample::select(ALL.to_vec()));
        (
            0..3usize,
            action,
            prop::bool::weighted(0.8),
            key.clone(),
            key,
            rtype,
        )
            .prop_map(|(who, action, own_key, key, sa_key, rtype)| Step {
                who,
                action,
                own_key,
                key,
                sa_key,
                rtype,
            })
    }

    type Snapshot = (Vec<Registered>, Option<ReservationState>, u32, bool);

    fn snapshot(lu: &ModelLu) -> Snapshot {
        (
            lu.registrations().to_vec(),
            lu.reservation(),
            lu.generation(),
            lu.aptpl(),
        )
    }

    fn check_invariants(lu: &ModelLu) {
        let regs = lu.registrations();
        assert!(regs.iter().all(|r| !r.key.is_zero()), "zero key registered");
        for (i, r) in regs.iter().enumerate() {
            assert!(
                regs[i + 1..].iter().all(|o| o.nexus != r.nexus),
                "nexus registered twice"
            );
        }
        match lu.reservation() {
            Some(ReservationState {
                holder: Holder::Nexus(n),
                rtype,
            }) => {
                assert!(!rtype.is_all_registrants());
                assert!(lu.registered_key(n).is_some(), "holder not registered");
            }
            Some(ReservationState { rtype, .. }) => {
                assert!(rtype.is_all_registrants());
                assert!(
                    !regs.is_empty(),
                    "all-registrants reservation without registrants"
                );
            }
            None => {}
        }
    }

    proptest! {
        #[test]
        fn model_invariants_hold(steps in prop::collection::vec(step(), 1..40), lio in any::<bool>()) {
            let quirks = if lio { Quirks::lio() } else { Quirks::spc4() };
            let (mut lu, a, b, c) = rig(quirks);
            let nexuses = [a, b, c];
            for step in steps {
                let nexus = nexuses[step.who];
                // Drain UAs so every command reaches the device server.
                while lu.take_unit_attention(nexus).is_some() {}
                let key = if step.own_key {
                    lu.registered_key(nexus).unwrap_or(Key::ZERO)
                } else {
                    step.key
                };
                let req = out(step.action, key, step.sa_key, step.rtype);
                let before = snapshot(&lu);
                let result = lu.pr_out(nexus, &req);
                let after = snapshot(&lu);
                if result.is_err() {
                    prop_assert_eq!(&before, &after, "a failed command changed state");
                }
                if matches!(step.action, PrOutAction::Reserve | PrOutAction::Release) {
                    prop_assert_eq!(before.2, after.2, "RESERVE/RELEASE bumped PRgeneration");
                }
                if before.0 != after.0 && quirks.generation_bumped_on_unregister {
                    prop_assert_ne!(before.2, after.2, "registrations changed silently");
                }
                check_invariants(&lu);
                for n in nexuses {
                    if lu.is_holder(n) {
                        while lu.take_unit_attention(n).is_some() {}
                        prop_assert_eq!(lu.access(n, Io::Write), Ok(()));
                        prop_assert_eq!(lu.access(n, Io::Read), Ok(()));
                    }
                }
            }
        }
    }
}

// ----- LIO deviations beyond the ones above -----

#[test]
fn lio_release_checks_key_and_type_only_for_the_holder() {
    let (mut lu, a, b, _) = reserved(Quirks::lio(), WE);
    assert_eq!(lu.pr_out(a, &release(K1, EA)), CONFLICT, "type mismatch");
    assert_eq!(
        lu.pr_out(a, &release(K2, WE)),
        CONFLICT,
        "holder, wrong key"
    );
    assert_eq!(
        lu.pr_out(b, &release(K3, WE)),
        Ok(()),
        "non-holder, wrong key"
    );
    assert_eq!(lu.holder(), Some(Holder::Nexus(a)));
    let (mut lu, _, b, _) = reserved(Quirks::spc4(), WE);
    assert_eq!(lu.pr_out(b, &release(K3, WE)), CONFLICT);
}

#[test]
fn lio_preempting_the_nominal_all_registrants_holder_takes_the_reservation() {
    // LIO: a reserved WEAR, so K1 is the nominal holder's key.
    let (mut lu, a, b, _) = reserved(Quirks::lio(), WEAR);
    lu.pr_out(b, &preempt(K2, K1, WE)).unwrap();
    assert_eq!(
        lu.reservation(),
        Some(ReservationState {
            holder: Holder::Nexus(b),
            rtype: WE
        })
    );
    assert_eq!(
        lu.pending_unit_attentions(a),
        vec![UnitAttention::REGISTRATIONS_PREEMPTED]
    );
    // SPC-4: only the registration goes; the WEAR reservation stays.
    let (mut lu, _, b, _) = reserved(Quirks::spc4(), WEAR);
    lu.pr_out(b, &preempt(K2, K1, WE)).unwrap();
    assert_eq!(lu.holder(), Some(Holder::AllRegistrants));
    assert_eq!(lu.reservation().map(|r| r.rtype), Some(WEAR));
}

#[test]
fn lio_nominal_all_registrants_holder_passes_to_the_oldest_registration() {
    let (mut lu, a, b, c) = reserved(Quirks::lio(), EAAR);
    lu.pr_out(c, &register(Key::ZERO, K3)).unwrap();
    lu.pr_out(a, &register(K1, Key::ZERO)).unwrap();
    // b (K2) is now the nominal holder, so preempting K2 takes the reservation over.
    lu.pr_out(c, &preempt(K3, K2, EA)).unwrap();
    assert_eq!(lu.holder(), Some(Holder::Nexus(c)));
    assert_eq!(lu.registered_key(b), None);
}

#[test]
fn keyed_all_registrants_preempt_of_own_key_spares_the_caller_only_in_lio() {
    for (quirks, caller_survives) in [(Quirks::lio(), true), (Quirks::spc4(), false)] {
        let (mut lu, _, b, c) = reserved(quirks, WEAR);
        lu.pr_out(c, &register(Key::ZERO, K2)).unwrap();
        lu.pr_out(b, &preempt(K2, K2, WEAR)).unwrap();
        assert_eq!(
            lu.registered_key(b).is_some(),
            caller_survives,
            "{quirks:?}"
        );
        assert_eq!(lu.registered_key(c), None, "{quirks:?}");
    }
}

#[test]
fn lio_access_check_looks_at_the_initiator_name_not_the_session() {
    // (quirks, unregistered session of registrant b may write, registered second session of
    // holder a may write)
    for (quirks, b_session_writes, a_session_writes) in
        [(Quirks::lio(), true, false), (Quirks::spc4(), false, true)]
    {
        let (mut lu, a, _, _) = reserved(quirks, WERO);
        let b_other = lu.connect(iqn("b", "023d0002"), 1);
        let a_other = lu.connect(iqn("a", "023d0002"), 1);
        lu.pr_out(a_other, &register(Key::ZERO, K3)).unwrap();
        let expect = |allowed: bool| if allowed { Ok(()) } else { CONFLICT };
        assert_eq!(
            lu.access(b_other, Io::Write),
            expect(b_session_writes),
            "{quirks:?}"
        );
        assert_eq!(
            lu.access(a_other, Io::Write),
            expect(a_session_writes),
            "{quirks:?}"
        );
        assert_eq!(lu.access(a, Io::Write), Ok(()));
    }
}

#[test]
fn power_cycle_loses_state_unless_aptpl() {
    for aptpl in [false, true] {
        let (mut lu, a, _, _) = rig(Quirks::lio());
        let mut req = register(Key::ZERO, K1);
        req.aptpl = aptpl;
        lu.pr_out(a, &req).unwrap();
        lu.pr_out(a, &reserve(K1, WERO)).unwrap();
        lu.power_cycle();
        assert_eq!(lu.test_unit_ready(a), Err(ModelError::TransportDown));
        let a = lu.connect(iqn("a", "023d0001"), 1);
        assert_eq!(
            lu.read_keys(a),
            Err(ua_err(UnitAttention::POWER_ON).unwrap_err())
        );
        let expected_keys = if aptpl { vec![K1] } else { vec![] };
        assert_eq!(lu.read_keys(a).unwrap().keys, expected_keys);
        assert_eq!(lu.holder().is_some(), aptpl);
    }
}
