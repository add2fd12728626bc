//! Lease rules with a fake clock (`t0 + offset`) against the SPC-4 model (`spc_model`, the one
//! every engine unit test uses), one path per node.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::pr::{PrOut, ReservationType};
use crate::spc_model::{Holder, Io, ModelLu, Nexus, Quirks, ScsiFailure, iscsi_initiator};

fn node(id: u16) -> NonZeroU16 {
    NonZeroU16::new(id).unwrap()
}

fn lkey(n: u16, epoch: u64) -> Key {
    LeaseKey::new(node(n), epoch).unwrap().key()
}

fn config(n: u16) -> LeaseConfig {
    LeaseConfig {
        node: node(n),
        renew: Duration::from_secs(2),
        lease: Duration::from_secs(10),
        margin: Duration::from_secs(2),
        check_interval: Duration::from_secs(1),
        watchdog_timeout: None,
    }
}

fn ms(t0: Instant, millis: u64) -> Instant {
    t0 + Duration::from_millis(millis)
}

fn s(t0: Instant, secs: u64) -> Instant {
    t0 + Duration::from_secs(secs)
}

/// The LU: the same SPC-4 model every engine test runs against, one path (I_T nexus) per node.
/// Lease actions reach it as the PR commands the driver sends for them.
struct Target {
    lu: ModelLu,
    nexus: BTreeMap<u16, Nexus>,
}

impl Default for Target {
    fn default() -> Self {
        Target {
            lu: ModelLu::new(Quirks::spc4()),
            nexus: BTreeMap::new(),
        }
    }
}

/// The lease tests' reservation type (the agent's default).
const TYPE: ReservationType = ReservationType::WriteExclusive;

impl Target {
    fn held_by(n: u16, key: Key) -> Target {
        let mut target = Target::default();
        target.register(n, key);
        target.out(n, &PrOut::reserve(key, TYPE)).unwrap();
        target
    }

    /// Node `n`'s path, connected on first use.
    fn path(&mut self, n: u16) -> Nexus {
        if let Some(nexus) = self.nexus.get(&n) {
            return *nexus;
        }
        let nexus = self
            .lu
            .connect(iscsi_initiator(&format!("node{n}"), "1"), 1);
        self.nexus.insert(n, nexus);
        nexus
    }

    /// One PR OUT from node `n`, unit attentions consumed first (the driver retries them).
    fn out(&mut self, n: u16, request: &PrOut) -> Result<(), CommandFailure> {
        let nexus = self.path(n);
        while self.lu.take_unit_attention(nexus).is_some() {}
        self.lu.pr_out(nexus, request).map_err(|e| match e.scsi() {
            Some(ScsiFailure::ReservationConflict) => CommandFailure::Conflict,
            _ => CommandFailure::Failed,
        })
    }

    /// REGISTER AND IGNORE EXISTING KEY from node `n` (a join, or a holder's renew landing).
    fn register(&mut self, n: u16, key: Key) {
        self.out(n, &PrOut::register_ignore(key)).unwrap();
    }

    fn keys(&self) -> Vec<Key> {
        self.lu.registrations().iter().map(|r| r.key).collect()
    }

    fn holder_key(&self) -> Option<Key> {
        match self.lu.holder()? {
            Holder::Nexus(nexus) => self.lu.registered_key(nexus),
            Holder::AllRegistrants => None,
        }
    }

    /// Whether the target accepts a WRITE from node `n`.
    fn may_write(&mut self, n: u16) -> bool {
        let nexus = self.path(n);
        while self.lu.take_unit_attention(nexus).is_some() {}
        self.lu.access(nexus, Io::Write).is_ok()
    }

    fn apply(&mut self, n: u16, action: &LeaseAction) -> LeaseCompletion {
        match action {
            LeaseAction::Join { key, .. } => {
                LeaseCompletion::Join(self.out(n, &PrOut::register_ignore(*key)))
            }
            LeaseAction::ReadReservation => LeaseCompletion::Reservation(Ok(self.holder_key())),
            // The driver tries each of `from` in turn; a conflict on all means none is ours.
            LeaseAction::Renew { from, to, .. } => LeaseCompletion::Renew(
                match from
                    .iter()
                    .find(|old| self.out(n, &PrOut::register(**old, *to)).is_ok())
                {
                    Some(_) => Ok(self.holder_key()),
                    None => Err(CommandFailure::Conflict),
                },
            ),
            LeaseAction::Preempt { own, victim } => LeaseCompletion::Preempt(
                self.out(n, &PrOut::preempt_and_abort(*own, *victim, TYPE)),
            ),
            LeaseAction::Reserve { own } => {
                LeaseCompletion::Reserve(self.out(n, &PrOut::reserve(*own, TYPE)))
            }
            LeaseAction::Promoted { .. } | LeaseAction::SelfFence(_) => {
                unreachable!("not a command: {action:?}")
            }
        }
    }
}

/// Polls `lease` at `now` until quiet, running every command against `target` at once.
fn drive(n: u16, lease: &mut Lease, target: &mut Target, now: Instant) -> Vec<LeaseAction> {
    let mut seen = Vec::new();
    while let Some(action) = lease.poll(now) {
        if !matches!(
            action,
            LeaseAction::Promoted { .. } | LeaseAction::SelfFence(_)
        ) {
            let completion = target.apply(n, &action);
            lease.complete(now, completion);
        }
        seen.push(action);
    }
    seen
}

fn standby(n: u16, first_epoch: u64, target: &Target, now: Instant) -> Lease {
    let view = StartView {
        holder: target.holder_key(),
        keys: target.keys(),
    };
    Lease::new(config(n), first_epoch, None, &view, now)
}

/// A holder of `lkey(1, 5)` resumed and confirmed at `t0` (its first renew makes epoch 10).
fn confirmed_holder(target: &mut Target, t0: Instant) -> Lease {
    let view = StartView {
        holder: target.holder_key(),
        keys: vec![],
    };
    let mut holder = Lease::new(config(1), 10, None, &view, t0);
    let actions = drive(1, &mut holder, target, t0);
    assert_eq!(actions[1], LeaseAction::Promoted { key: lkey(1, 10) });
    holder
}

#[test]
fn key_layout_is_node_then_epoch() {
    let k = LeaseKey::new(node(0x0102), 0x0000_0304_0506).unwrap();
    assert_eq!(k.key(), Key::new(0x0102_0000_0304_0506));
    assert_eq!(LeaseKey::decode(k.key()), Some(k));
    assert_eq!(LeaseKey::decode(Key::new(0x0000_ffff_ffff_ffff)), None);
    assert_eq!(
        LeaseKey::decode(Key::new(u64::MAX)).unwrap().epoch(),
        EPOCH_MAX
    );
    assert!(LeaseKey::new(node(1), EPOCH_MAX + 1).is_err());
}

#[test]
fn starting_epoch_is_above_every_source() {
    let n = node(3);
    let none = EpochSources::default();
    assert_eq!(starting_epoch(n, &none), Ok(1));
    let keys = [lkey(3, 700), lkey(4, 9000), lkey(3, 650), Key::new(0x1234)];
    let sources = EpochSources {
        persisted: Some(1023),
        on_target: &keys,
        wall_clock_ms: None,
    };
    // Another node's higher epoch does not count.
    assert_eq!(starting_epoch(n, &sources), Ok(1024));
    let sources = EpochSources {
        persisted: Some(5),
        ..sources
    };
    assert_eq!(starting_epoch(n, &sources), Ok(701));
    let sources = EpochSources {
        wall_clock_ms: Some(1_800_000_000_000),
        ..sources
    };
    assert_eq!(starting_epoch(n, &sources), Ok(1_800_000_000_000));
    let exhausted = EpochSources {
        persisted: Some(EPOCH_MAX),
        ..EpochSources::default()
    };
    assert!(starting_epoch(n, &exhausted).is_err());
}

#[test]
fn epochs_are_persisted_in_blocks_before_use() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut holder = Lease::new(
        config(1),
        10,
        Some(9),
        &StartView {
            holder: target.holder_key(),
            keys: vec![],
        },
        t0,
    );
    let first = drive(1, &mut holder, &mut target, t0);
    assert!(matches!(
        first[0],
        LeaseAction::Renew {
            persist_epoch: Some(1033),
            ..
        }
    ));
    let mut persisted = Vec::new();
    for step in 1..=1100u64 {
        for action in drive(1, &mut holder, &mut target, s(t0, 2 * step)) {
            if let LeaseAction::Renew {
                to,
                persist_epoch: Some(p),
                ..
            } = action
            {
                // The block covers the key being sent.
                assert!(LeaseKey::decode(to).unwrap().epoch() <= p);
                persisted.push(p);
            }
        }
    }
    // Epochs 11..=1110 were used: one more block after the first.
    assert_eq!(persisted, vec![1033 + 1024]);
}

#[test]
fn standby_joins_with_a_fresh_key_then_preempts_exactly_the_stale_key() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut sb = standby(2, 100, &target, t0);
    assert_eq!(sb.role(), Role::Standby);
    let actions = drive(2, &mut sb, &mut target, t0);
    assert_eq!(
        actions,
        vec![
            LeaseAction::Join {
                key: lkey(2, 100),
                persist_epoch: Some(100 + EPOCH_BLOCK - 1)
            },
            LeaseAction::ReadReservation
        ]
    );
    // The first read (at t0) starts the timer; the holder never renews.
    for sec in 1..10 {
        assert_eq!(
            drive(2, &mut sb, &mut target, s(t0, sec)),
            vec![LeaseAction::ReadReservation]
        );
    }
    assert!(target.may_write(1));
    let actions = drive(2, &mut sb, &mut target, s(t0, 10));
    assert_eq!(
        actions[0],
        LeaseAction::Preempt {
            own: lkey(2, 100),
            victim: lkey(1, 5)
        }
    );
    assert_eq!(actions[1], LeaseAction::ReadReservation);
    assert_eq!(actions[2], LeaseAction::Promoted { key: lkey(2, 100) });
    assert_eq!(sb.role(), Role::Holder { promoted: true });
    assert!(target.may_write(2) && !target.may_write(1));
    // Its lease runs from the PREEMPT's send time.
    assert_eq!(sb.holder_deadline(), Some(s(t0, 18)));
    // And it renews from its own key with the next epoch.
    assert!(drive(2, &mut sb, &mut target, s(t0, 11)).is_empty());
    let actions = drive(2, &mut sb, &mut target, s(t0, 12));
    assert_eq!(
        actions,
        vec![LeaseAction::Renew {
            from: vec![lkey(2, 100)],
            to: lkey(2, 101),
            persist_epoch: None
        }]
    );
}

#[test]
fn a_renewing_holder_is_never_preempted() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut holder = confirmed_holder(&mut target, t0);
    let mut sb = standby(2, 100, &target, t0);
    for tenth in 0..=600u64 {
        let now = ms(t0, tenth * 100);
        for action in drive(1, &mut holder, &mut target, now) {
            assert!(!matches!(action, LeaseAction::SelfFence(_)), "{action:?}");
        }
        for action in drive(2, &mut sb, &mut target, now) {
            assert!(
                !matches!(
                    action,
                    LeaseAction::Preempt { .. } | LeaseAction::Reserve { .. }
                ),
                "{action:?}"
            );
        }
    }
    assert!(target.may_write(1));
}

#[test]
fn holder_renewing_just_before_the_preempt_makes_the_cas_fail() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut sb = standby(2, 100, &target, t0);
    drive(2, &mut sb, &mut target, t0);
    // The standby has seen 1:5 unchanged for a lease and decides to preempt it...
    let preempt = sb.poll(s(t0, 10)).unwrap();
    assert_eq!(
        preempt,
        LeaseAction::Preempt {
            own: lkey(2, 100),
            victim: lkey(1, 5)
        }
    );
    // ...but the holder's REGISTER 1:5 -> 1:6 reaches the target first.
    target
        .out(1, &PrOut::register(lkey(1, 5), lkey(1, 6)))
        .unwrap();
    let completion = target.apply(2, &preempt);
    assert_eq!(
        completion,
        LeaseCompletion::Preempt(Err(CommandFailure::Conflict))
    );
    sb.complete(s(t0, 10), completion);
    assert_eq!(sb.role(), Role::Standby);
    assert!(target.may_write(1), "the target refused the stale preempt");
    // It backs off: no new preempt until the new key has been unchanged for a whole lease.
    for sec in 11..21 {
        for action in drive(2, &mut sb, &mut target, s(t0, sec)) {
            assert_eq!(action, LeaseAction::ReadReservation, "at {sec}s");
        }
    }
    let actions = drive(2, &mut sb, &mut target, s(t0, 21));
    assert_eq!(
        actions[0],
        LeaseAction::Preempt {
            own: lkey(2, 100),
            victim: lkey(1, 6)
        }
    );
}

#[test]
fn holder_paused_longer_than_the_lease_is_taken_over_and_fences_on_resume() {
    for clock_ran_during_pause in [true, false] {
        let t0 = Instant::now();
        let mut target = Target::held_by(1, lkey(1, 5));
        let mut holder = confirmed_holder(&mut target, t0);
        let mut sb = standby(2, 100, &target, t0);
        for sec in 0..=2 {
            drive(1, &mut holder, &mut target, s(t0, sec));
            drive(2, &mut sb, &mut target, s(t0, sec));
        }
        // The holder (confirmed at 2 s with 1:11) freezes; the standby takes over.
        let mut took_over_at = None;
        for sec in 3..=20 {
            let actions = drive(2, &mut sb, &mut target, s(t0, sec));
            if actions
                .iter()
                .any(|a| matches!(a, LeaseAction::Promoted { .. }))
            {
                took_over_at.get_or_insert(sec);
            }
        }
        assert_eq!(took_over_at, Some(12));
        assert!(
            !target.may_write(1),
            "the target refuses the stale holder whatever its clock says"
        );
        // The holder resumes. Its own clock either ran (it fences before sending anything) or
        // stood still (it believes its lease holds, renews, and the target refuses: P5).
        // Frozen: its clock resumes at 4 s, where it stood when the VM was paused.
        let resume = if clock_ran_during_pause {
            s(t0, 21)
        } else {
            s(t0, 4)
        };
        let actions = drive(1, &mut holder, &mut target, resume);
        let expected = if clock_ran_during_pause {
            vec![LeaseAction::SelfFence(SelfFenceReason::LeaseExpired {
                since_last_good_send: Duration::from_secs(19),
            })]
        } else {
            vec![
                LeaseAction::Renew {
                    from: vec![lkey(1, 11)],
                    to: lkey(1, 12),
                    persist_epoch: None,
                },
                LeaseAction::SelfFence(SelfFenceReason::Preempted { key: lkey(1, 11) }),
            ]
        };
        assert_eq!(actions, expected);
        assert_eq!(holder.role(), Role::Fenced);
        assert!(!holder.feed_watchdog(resume));
        // Latched: nothing more, ever; late completions are ignored.
        holder.complete(resume, LeaseCompletion::Renew(Ok(Some(lkey(1, 12)))));
        assert_eq!(holder.poll(s(t0, 100)), None);
        assert_eq!(holder.next_wakeup(), None);
        // P3: the preempted key was never registered again.
        assert!(
            !target
                .keys()
                .iter()
                .any(|&k| LeaseKey::decode(k).unwrap().node().get() == 1)
        );
    }
}

#[test]
fn renew_lease_counts_from_the_send_not_the_completion() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut holder = confirmed_holder(&mut target, t0);
    let renew = holder.poll(s(t0, 2)).unwrap();
    assert!(matches!(renew, LeaseAction::Renew { .. }));
    let completion = target.apply(1, &renew);
    holder.complete(ms(t0, 3500), completion);
    assert_eq!(holder.holder_deadline(), Some(s(t0, 2 + 8)));
    // The next renew is due `renew` after the previous send.
    assert_eq!(holder.next_wakeup(), Some(s(t0, 4)));
}

#[test]
fn renew_timeouts_retry_with_uncertain_keys_and_fence_at_lease_minus_margin() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut holder = confirmed_holder(&mut target, t0);
    // Confirmed at t0 with 1:10. The renew at 2 s applied but its answer was lost; the one at
    // 4 s never reached the target.
    let a = holder.poll(s(t0, 2)).unwrap();
    target.apply(1, &a);
    holder.complete(
        ms(t0, 3000),
        LeaseCompletion::Renew(Err(CommandFailure::Timeout)),
    );
    let b = holder.poll(s(t0, 4)).unwrap();
    assert_eq!(
        b,
        LeaseAction::Renew {
            from: vec![lkey(1, 10), lkey(1, 11)],
            to: lkey(1, 12),
            persist_epoch: None
        }
    );
    holder.complete(
        ms(t0, 5000),
        LeaseCompletion::Renew(Err(CommandFailure::Unreachable)),
    );
    let c = holder.poll(s(t0, 6)).unwrap();
    assert_eq!(
        c,
        LeaseAction::Renew {
            from: vec![lkey(1, 10), lkey(1, 12), lkey(1, 11)],
            to: lkey(1, 13),
            persist_epoch: None
        }
    );
    assert!(holder.feed_watchdog(ms(t0, 7999)));
    // Still outstanding at the deadline: lease - margin = 8 s after the last good send (t0).
    assert_eq!(holder.poll(ms(t0, 7999)), None);
    assert_eq!(holder.next_wakeup(), Some(s(t0, 8)));
    assert_eq!(
        holder.poll(s(t0, 8)),
        Some(LeaseAction::SelfFence(SelfFenceReason::LeaseExpired {
            since_last_good_send: Duration::from_secs(8)
        }))
    );
}

#[test]
fn uncertain_keys_let_a_later_renew_succeed() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut holder = confirmed_holder(&mut target, t0);
    let a = holder.poll(s(t0, 2)).unwrap();
    target.apply(1, &a); // applied, answer lost
    holder.complete(
        ms(t0, 2500),
        LeaseCompletion::Renew(Err(CommandFailure::Timeout)),
    );
    let actions = drive(1, &mut holder, &mut target, s(t0, 4));
    assert_eq!(actions.len(), 1);
    assert_eq!(holder.own_key(), lkey(1, 12));
    assert_eq!(holder.holder_deadline(), Some(s(t0, 12)));
}

#[test]
fn resumed_holder_renews_its_old_key_first_and_fences_if_it_was_preempted() {
    let t0 = Instant::now();
    let old = lkey(1, 40);
    let stray = lkey(1, 41); // a path renewed when the previous run stopped
    let mut target = Target::held_by(1, old);
    let view = StartView {
        holder: Some(old),
        keys: vec![old, stray, lkey(2, 3), stray],
    };
    let mut holder = Lease::new(config(1), 42, None, &view, t0);
    assert_eq!(holder.role(), Role::Holder { promoted: false });
    let actions = drive(1, &mut holder, &mut target, t0);
    assert_eq!(
        actions,
        vec![
            LeaseAction::Renew {
                from: vec![old, stray],
                to: lkey(1, 42),
                persist_epoch: Some(42 + 1023)
            },
            LeaseAction::Promoted { key: lkey(1, 42) }
        ]
    );
    // Preempted while it was down: its first renew conflicts.
    let mut target = Target::held_by(2, lkey(2, 9));
    let mut holder = Lease::new(config(1), 42, None, &view, t0);
    let actions = drive(1, &mut holder, &mut target, t0);
    assert_eq!(
        actions[1],
        LeaseAction::SelfFence(SelfFenceReason::Preempted { key: old })
    );
}

#[test]
fn standby_acquires_a_free_lu_after_a_lease_and_one_of_two_wins() {
    let t0 = Instant::now();
    let mut target = Target::default();
    let mut a = standby(1, 1, &target, t0);
    let mut b = standby(2, 1, &target, t0);
    for sec in 0..10 {
        for action in drive(1, &mut a, &mut target, s(t0, sec))
            .into_iter()
            .chain(drive(2, &mut b, &mut target, s(t0, sec)))
        {
            assert!(
                matches!(
                    action,
                    LeaseAction::Join { .. } | LeaseAction::ReadReservation
                ),
                "{action:?}"
            );
        }
    }
    let won = drive(1, &mut a, &mut target, s(t0, 10));
    assert_eq!(won[0], LeaseAction::Reserve { own: lkey(1, 1) });
    assert_eq!(won.last(), Some(&LeaseAction::Promoted { key: lkey(1, 1) }));
    // b decides in the same instant, but the target already has a holder.
    let lost = drive(2, &mut b, &mut target, s(t0, 10));
    assert_eq!(lost, vec![LeaseAction::Reserve { own: lkey(2, 1) }]);
    assert_eq!(b.role(), Role::Standby);
    assert!(target.may_write(1) && !target.may_write(2));
}

#[test]
fn acquisition_with_lost_answer_is_settled_by_read_reservation() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut sb = standby(2, 100, &target, t0);
    drive(2, &mut sb, &mut target, t0);
    let preempt = sb.poll(s(t0, 10)).unwrap();
    target.apply(2, &preempt);
    sb.complete(
        s(t0, 11),
        LeaseCompletion::Preempt(Err(CommandFailure::Timeout)),
    );
    assert_eq!(sb.poll(s(t0, 11)), Some(LeaseAction::ReadReservation));
    sb.complete(
        s(t0, 11),
        LeaseCompletion::Reservation(Err(CommandFailure::Timeout)),
    );
    assert_eq!(sb.poll(s(t0, 11)), None);
    assert_eq!(sb.poll(s(t0, 12)), Some(LeaseAction::ReadReservation));
    sb.complete(
        s(t0, 12),
        LeaseCompletion::Reservation(Ok(Some(lkey(2, 100)))),
    );
    assert_eq!(
        sb.poll(s(t0, 12)),
        Some(LeaseAction::Promoted { key: lkey(2, 100) })
    );
    // Counted from the preempt's send at 10 s.
    assert_eq!(sb.holder_deadline(), Some(s(t0, 18)));

    // Verified too late (lease - margin already over): no promotion, the holder fences.
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut sb = standby(2, 100, &target, t0);
    drive(2, &mut sb, &mut target, t0);
    sb.poll(s(t0, 10)).unwrap();
    sb.complete(
        s(t0, 11),
        LeaseCompletion::Preempt(Err(CommandFailure::Failed)),
    );
    sb.poll(s(t0, 11)).unwrap();
    sb.complete(
        s(t0, 19),
        LeaseCompletion::Reservation(Ok(Some(lkey(2, 100)))),
    );
    assert!(matches!(
        sb.poll(s(t0, 19)),
        Some(LeaseAction::SelfFence(SelfFenceReason::LeaseExpired { .. }))
    ));

    // Verified as someone else's: back to watching that key.
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut sb = standby(2, 100, &target, t0);
    drive(2, &mut sb, &mut target, t0);
    sb.poll(s(t0, 10)).unwrap();
    sb.complete(s(t0, 10), LeaseCompletion::Preempt(Ok(())));
    sb.poll(s(t0, 10)).unwrap();
    sb.complete(
        s(t0, 10),
        LeaseCompletion::Reservation(Ok(Some(lkey(3, 7)))),
    );
    assert_eq!(sb.role(), Role::Standby);
    assert_eq!(sb.poll(s(t0, 19)), Some(LeaseAction::ReadReservation));
}

#[test]
fn failed_join_retries_after_the_interval_with_a_fresh_key() {
    let t0 = Instant::now();
    let mut sb = Lease::new(config(2), 7, None, &StartView::default(), t0);
    assert!(matches!(sb.poll(t0), Some(LeaseAction::Join { .. })));
    sb.complete(t0, LeaseCompletion::Join(Err(CommandFailure::Timeout)));
    assert_eq!(sb.poll(ms(t0, 999)), None);
    assert_eq!(sb.next_wakeup(), Some(s(t0, 1)));
    assert!(
        matches!(sb.poll(s(t0, 1)), Some(LeaseAction::Join { key, persist_epoch: None }) if key == lkey(2, 8))
    );
}

#[test]
fn holder_stops_feeding_the_watchdog_a_watchdog_timeout_before_its_deadline() {
    let t0 = Instant::now();
    let mut target = Target::held_by(1, lkey(1, 5));
    let mut holder = confirmed_holder(&mut target, t0);
    holder.config.watchdog_timeout = Some(Duration::from_secs(3));
    assert!(holder.feed_watchdog(ms(t0, 4999)));
    assert!(!holder.feed_watchdog(s(t0, 5)));
    let sb = standby(2, 1, &target, t0);
    assert!(sb.feed_watchdog(s(t0, 1000)));
}

#[test]
fn holder_that_renews_but_no_longer_holds_the_reservation_fences() {
    // Its reserving nexus was orphaned by a re-login (or the reservation was released or
    // cleared): the REGISTERs on its paths succeed, but READ RESERVATION shows another key.
    for (holder_after, reason_holder) in [(None, None), (Some(3), Some(lkey(3, 1)))] {
        let t0 = Instant::now();
        let mut target = Target::held_by(1, lkey(1, 5));
        let mut holder = confirmed_holder(&mut target, t0);
        // The reservation leaves node 1 (released) and, in the second case, node 3 takes it.
        target.out(1, &PrOut::release(lkey(1, 10), TYPE)).unwrap();
        if let Some(other) = holder_after {
            target.register(other, lkey(other, 1));
            target
                .out(other, &PrOut::reserve(lkey(other, 1), TYPE))
                .unwrap();
        }
        let actions = drive(1, &mut holder, &mut target, s(t0, 2));
        assert_eq!(
            actions[1],
            LeaseAction::SelfFence(SelfFenceReason::ReservationLost {
                key: lkey(1, 11),
                holder: reason_holder
            })
        );
        assert_eq!(holder.role(), Role::Fenced);
    }
}

// ---------------------------------------------------------------------------------------------
// Property: with both monotonic clocks within rate 1 ± ρ of true time and margin ≥ 2ρ·lease
// (+ the driver's wake-up step), a holder that loses its storage self-fences before the standby
// sends its PREEMPT. This is liveness (the holder stops its service first), not safety: safety
// holds without it because the target refuses the preempted holder's writes.

/// SplitMix64: deterministic latencies from the proptest seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % bound.max(1)
    }
}

struct Outstanding {
    action: LeaseAction,
    apply_at: Option<u64>,
    complete_at: u64,
    result: Option<LeaseCompletion>,
}

fn timed_out(action: &LeaseAction) -> LeaseCompletion {
    let e = Err(CommandFailure::Timeout);
    match action {
        LeaseAction::Join { .. } => LeaseCompletion::Join(e),
        LeaseAction::ReadReservation => LeaseCompletion::Reservation(Err(CommandFailure::Timeout)),
        LeaseAction::Renew { .. } => LeaseCompletion::Renew(Err(CommandFailure::Timeout)),
        LeaseAction::Preempt { .. } => LeaseCompletion::Preempt(e),
        LeaseAction::Reserve { .. } => LeaseCompletion::Reserve(e),
        other => unreachable!("{other:?}"),
    }
}

#[derive(Debug)]
struct Run {
    holder_fenced_at_us: Option<u64>,
    preempt_sent_at_us: Option<u64>,
    standby_promoted: bool,
}

#[allow(clippy::too_many_arguments)]
fn simulate(
    seed: u64,
    lease_ms: u64,
    renew_ms: u64,
    margin_ms: u64,
    holder_rate: f64,
    standby_rate: f64,
    outage_ms: u64,
    max_latency_ms: u64,
) -> Run {
    const STEP_US: u64 = 1000;
    let base = Instant::now();
    let rates = [holder_rate, standby_rate];
    let local = |i: usize, t_us: u64| {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let nanos = (t_us as f64 * 1000.0 * rates[i]) as u64;
        base + Duration::from_nanos(nanos)
    };
    let timings = |n: u16| LeaseConfig {
        node: node(n),
        renew: Duration::from_millis(renew_ms),
        lease: Duration::from_millis(lease_ms),
        margin: Duration::from_millis(margin_ms),
        check_interval: Duration::from_millis(renew_ms / 2),
        watchdog_timeout: None,
    };
    let command_timeout_us = renew_ms * 1000 / 2;
    let mut rng = Rng(seed);
    let mut target = Target::held_by(1, lkey(1, 5));
    let view = StartView {
        holder: target.holder_key(),
        keys: vec![lkey(1, 5)],
    };
    let mut nodes = [
        Lease::new(timings(1), 10, None, &view, local(0, 0)),
        Lease::new(timings(2), 100, None, &view, local(1, 0)),
    ];
    let mut outstanding: [Option<Outstanding>; 2] = [None, None];
    let mut run = Run {
        holder_fenced_at_us: None,
        preempt_sent_at_us: None,
        standby_promoted: false,
    };
    let outage_us = outage_ms * 1000;
    let end_us = outage_us + 4 * lease_ms * 1000;
    let mut t = 0;
    while t <= end_us && !run.standby_promoted {
        for i in 0..2 {
            let n = u16::try_from(i + 1).unwrap();
            if let Some(o) = &mut outstanding[i] {
                if o.result.is_none() {
                    match o.apply_at {
                        Some(at) if t >= at => o.result = Some(target.apply(n, &o.action)),
                        None => o.result = Some(timed_out(&o.action)),
                        _ => {}
                    }
                }
                if t >= o.complete_at
                    && let Some(result) = o.result
                {
                    nodes[i].complete(local(i, t), result);
                    outstanding[i] = None;
                }
            }
            while let Some(action) = nodes[i].poll(local(i, t)) {
                match action {
                    LeaseAction::SelfFence(_) => {
                        assert_eq!(i, 0, "the standby never fences: {action:?}");
                        run.holder_fenced_at_us.get_or_insert(t);
                    }
                    LeaseAction::Promoted { .. } => run.standby_promoted |= i == 1,
                    command => {
                        if i == 1 && matches!(command, LeaseAction::Preempt { .. }) {
                            run.preempt_sent_at_us.get_or_insert(t);
                        }
                        assert!(outstanding[i].is_none(), "two commands outstanding");
                        let lost = i == 0 && t >= outage_us;
                        let apply_at = t + rng.below(max_latency_ms * 1000);
                        let complete_at = apply_at + rng.below(max_latency_ms * 1000);
                        outstanding[i] = Some(Outstanding {
                            action: command,
                            apply_at: (!lost).then_some(apply_at),
                            complete_at: if lost {
                                t + command_timeout_us
                            } else {
                                complete_at
                            },
                            result: None,
                        });
                    }
                }
            }
        }
        t += STEP_US;
    }
    run
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn holder_self_fences_before_the_standby_preempts(
        seed in any::<u64>(),
        lease_ms in 1000u64..6000,
        renew_div in 3u64..8,
        drift_ppm in 0u64..20_000,
        holder_skew in -1.0f64..=1.0,
        standby_skew in -1.0f64..=1.0,
        extra_margin_pct in 0u64..10,
        outage_leases in 1.0f64..3.0,
    ) {
        let rho = drift_ppm as f64 / 1e6;
        let renew_ms = lease_ms / renew_div;
        // margin >= 2·ρ·lease, plus the driver's wake-up lateness (one 1 ms step) and rounding.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let margin_ms = (2.0 * rho * lease_ms as f64).ceil() as u64 + 2 + lease_ms * extra_margin_pct / 100;
        prop_assume!(margin_ms < lease_ms - renew_ms);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let outage_ms = (outage_leases * lease_ms as f64) as u64;
        let run = simulate(
            seed, lease_ms, renew_ms, margin_ms,
            1.0 + holder_skew * rho, 1.0 + standby_skew * rho,
            outage_ms, (renew_ms / 4).max(1),
        );
        let fenced = run.holder_fenced_at_us.expect("holder never fenced");
        let preempt = run.preempt_sent_at_us.expect("standby never preempted");
        prop_assert!(run.standby_promoted, "{run:?}");
        prop_assert!(preempt > outage_ms * 1000, "a renewing holder was preempted: {run:?}");
        prop_assert!(fenced < preempt, "holder fenced at {fenced} us, standby preempted at {preempt} us");
    }
}

#[test]
fn without_the_drift_allowance_the_order_can_break() {
    // A holder clock 10% slow, a standby clock 10% fast, margin only 1 ms: the standby preempts
    // first. The target still refuses the old holder (see the pause test); only liveness suffers.
    let run = simulate(7, 5000, 1000, 1, 0.9, 1.1, 5000, 1);
    let fenced = run.holder_fenced_at_us.unwrap_or(u64::MAX);
    assert!(run.preempt_sent_at_us.unwrap() < fenced, "{run:?}");
}
