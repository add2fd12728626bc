//! Lease mode: active/passive failover without a cluster manager, with the target as arbiter.
//!
//! Sans-IO, in the style of quinn-proto: the driver calls [`Lease::poll`] with its monotonic
//! `now` until it returns `None`, performs each [`LeaseAction`] at once (the `now` it polled with
//! is taken as the send time), reports each command's end with [`Lease::complete`], and sleeps
//! until [`Lease::next_wakeup`] or the next completion. At most one command is outstanding,
//! and every command must be completed (the driver bounds each by `command_timeout`); a holder's
//! deadline fires from `poll` even while its renew is still outstanding.
//!
//! # Keys: node id + epoch
//! `key = node_id << 48 | epoch` ([`LeaseKey`]): the top 16 bits name the node (1..=65535, so a
//! key is never 0), the low 48 bits are an epoch that only grows. The holder renews by
//! REGISTERing old → new (the next epoch): a change a standby can see, made atomically by the
//! target. Epochs are never reused, for two reasons:
//! - P3: a preempted key must never be registered again; a fresh epoch can never equal it.
//! - No ABA: a standby judges "the holder is alive" by "the key changed"; and its PREEMPT names
//!   the exact key it saw, so a holder that renewed meanwhile makes it fail (compare-and-swap).
//!   A key that came back would defeat both.
//!
//! The first epoch of a run is the maximum of ([`starting_epoch`]): the state file's value + 1
//! (the highest epoch that may have been used; the driver writes [`LeaseAction`]'s
//! `persist_epoch` durably *before* sending, in blocks of [`EPOCH_BLOCK`] so the disk is touched
//! once per ~1000 renewals), any epoch of our node still registered on the LU + 1, and the wall
//! clock in milliseconds since 1970 (it fits 48 bits until the year 10889; renewals, at most
//! one per 100 ms, advance the epoch slower than the clock's milliseconds). The wall clock is
//! only a fallback for a lost state file: it keeps epochs fresh unless the file is lost *and*
//! the clock went backwards, and even then safety holds (the target refuses a preempted
//! nexus's writes; a reused key costs at worst a needless failover).
//!
//! # Roles
//! - **Standby**: registers a fresh key on every path (REGISTER AND IGNORE EXISTING KEY, which
//!   gives no access under WE/EA), then reads the reservation every `check_interval`. It
//!   remembers when, on its own clock, it last saw the holder's key change (the read's
//!   completion time: the change happened no later). When the key has not changed for `lease`
//!   it PREEMPT AND ABORTs exactly that key. RESERVATION CONFLICT means the holder renewed
//!   meanwhile (the CAS lost): it backs off and restarts its timer. Success is verified by READ
//!   RESERVATION before it calls itself holder. A standby that sees no reservation at all for
//!   `lease` RESERVEs (first start of the pair; waiting `lease` lets a holder that is just
//!   restarting come back first, and of two standbys the target lets only one win).
//! - **Holder**: every `renew` sends REGISTER old → new on every path. The lease runs from the
//!   *send* time of the last renew that succeeded: the target applied it after the send, and a
//!   standby's timer starts no earlier than that, so the holder's view of its lease never ends
//!   later than the standby's. A completion-based start could be later than the apply time by
//!   the whole command latency. RESERVATION CONFLICT on renew means our key was preempted:
//!   self-fence at once. A renew that went through is followed by READ RESERVATION, which must
//!   show the new key; anything else means the reservation is gone from under us (released,
//!   cleared, or held by a nexus orphaned by a re-login): self-fence too. A timeout leaves the
//!   key uncertain (maybe applied), so the next renew also tries the unconfirmed keys as the old
//!   key; the holder keeps trying and self-fences when `lease - margin` has passed since the
//!   last good send, on its own clock.
//!
//! Under WE/EA only the I_T nexus that made the reservation is its holder (SPC-4; LIO enforces
//! it): on a multipath LU the holder's other paths are registrants without write access, so the
//! service must write through the reserving path (multipath failover policy), and a re-login of
//! that path loses the reservation (caught by the check above; the standby then takes over).
//!
//! # Why the timing is liveness only (P5)
//! If both clocks run at rates within `1 ± ρ` of true time, the holder stops after at most
//! `(lease - margin) / (1 - ρ)` true seconds and the standby preempts after at least
//! `lease / (1 + ρ)`, counted from a later start. So `margin ≥ 2ρ·lease` (plus the driver's
//! wake-up lateness and the self-fence action's run time) makes the holder stop first. If that
//! fails (a frozen VM, a clock that stops while suspended), nothing unsafe follows: PREEMPT AND
//! ABORT removes the old holder's registrations and aborts its queued commands, and the target
//! refuses every later write from it with RESERVATION CONFLICT, whatever its clock believes.

use std::collections::VecDeque;
use std::num::NonZeroU16;
use std::time::{Duration, Instant};

pub use super::failure::CommandFailure;
pub use super::status::Role;
use crate::pr::Key;

pub use crate::keys::{EPOCH_BITS, EPOCH_MAX, EpochExhausted, LeaseKey};

/// Epochs reserved per state-file write.
pub const EPOCH_BLOCK: u64 = 1024;

/// What a node knows at start about the epochs it used before.
#[derive(Debug, Clone, Default)]
pub struct EpochSources<'a> {
    /// The state file's value: the highest epoch that may have been used.
    pub persisted: Option<u64>,
    /// Keys registered on the LUs now (READ KEYS).
    pub on_target: &'a [Key],
    /// Milliseconds since 1970 by the wall clock, if it is believed.
    pub wall_clock_ms: Option<u64>,
}

/// The first epoch of this run: above everything this node may have used (module docs).
pub fn starting_epoch(node: NonZeroU16, sources: &EpochSources<'_>) -> Result<u64, EpochExhausted> {
    let from_target = sources
        .on_target
        .iter()
        .filter_map(|&k| LeaseKey::decode(k))
        .filter(|k| k.node() == node)
        .map(|k| k.epoch().saturating_add(1))
        .max();
    let epoch = [
        sources.persisted.map(|p| p.saturating_add(1)),
        from_target,
        sources.wall_clock_ms,
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(1);
    LeaseKey::new(node, epoch).map(LeaseKey::epoch)
}

/// The lease timings (validated by `config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub node: NonZeroU16,
    pub renew: Duration,
    pub lease: Duration,
    pub margin: Duration,
    /// How often a standby reads the reservation.
    pub check_interval: Duration,
    /// The hardware watchdog's timeout, if one is fed (see [`Lease::feed_watchdog`]).
    pub watchdog_timeout: Option<Duration>,
}

/// What the reservation looked like at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartView {
    /// READ RESERVATION's key, `None` without a reservation.
    pub holder: Option<Key>,
    /// READ KEYS.
    pub keys: Vec<Key>,
}

/// A command the driver must perform now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAction {
    /// Standby joins: REGISTER AND IGNORE EXISTING KEY with SARK = `key` on every path.
    Join {
        key: Key,
        persist_epoch: Option<u64>,
    },
    /// READ RESERVATION; report [`LeaseCompletion::Reservation`].
    ReadReservation,
    /// Holder renews: on every path REGISTER (never IGNORE, never with RK 0) RK = the first of
    /// `from` the target accepts, SARK = `to`; then READ RESERVATION. Report `Ok(reservation
    /// key)` if every path took `to`; `Conflict` only if none of `from` is on the LU any more
    /// (READ KEYS after a conflicting path tells a preempt from a path that lost its
    /// registration by re-login); otherwise the error. The reservation key must then be `to`:
    /// under WE/EA only the reserving I_T nexus is the holder, and if that nexus was orphaned
    /// by a re-login, released or cleared, the other paths still renew fine while the node can
    /// no longer write, and a standby will take over.
    Renew {
        from: Vec<Key>,
        to: Key,
        persist_epoch: Option<u64>,
    },
    /// PREEMPT AND ABORT with RK = `own`, SARK = `victim`, the configured type.
    Preempt { own: Key, victim: Key },
    /// RESERVE with RK = `own`, the configured type.
    Reserve { own: Key },
    /// Our lease is established: the service may start.
    Promoted { key: Key },
    /// Run the self-fence action now. Latched: nothing follows.
    SelfFence(SelfFenceReason),
}

/// A completed command, reported to [`Lease::complete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseCompletion {
    Join(Result<(), CommandFailure>),
    Reservation(Result<Option<Key>, CommandFailure>),
    /// The reservation key read after the REGISTERs (see [`LeaseAction::Renew`]).
    Renew(Result<Option<Key>, CommandFailure>),
    Preempt(Result<(), CommandFailure>),
    Reserve(Result<(), CommandFailure>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelfFenceReason {
    /// A renew met RESERVATION CONFLICT: `key` was preempted.
    Preempted { key: Key },
    /// No renew succeeded for `lease - margin` on our clock.
    LeaseExpired { since_last_good_send: Duration },
    /// The renew went through but the reservation is not held by our new key any more.
    ReservationLost { key: Key, holder: Option<Key> },
    /// No fresh key can be made (see [`EpochExhausted`]).
    EpochsExhausted,
}

impl std::fmt::Display for SelfFenceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SelfFenceReason::Preempted { key } => {
                write!(
                    f,
                    "renew refused with RESERVATION CONFLICT: key {key} was preempted"
                )
            }
            SelfFenceReason::LeaseExpired {
                since_last_good_send,
            } => write!(
                f,
                "no successful renew for {since_last_good_send:?} (lease - margin): storage \
                 unreachable or too slow"
            ),
            SelfFenceReason::ReservationLost { key, holder } => match holder {
                Some(holder) => write!(
                    f,
                    "renewed to {key}, but the reservation is held by {holder}: this node can no \
                     longer write"
                ),
                None => write!(
                    f,
                    "renewed to {key}, but the LU has no reservation any more"
                ),
            },
            SelfFenceReason::EpochsExhausted => write!(f, "no fresh lease key epoch left"),
        }
    }
}

#[derive(Debug, Clone)]
enum Phase {
    Joining {
        next_attempt: Instant,
        in_flight: bool,
    },
    Watching {
        /// The holder's key at the last good read (`None` inside: no reservation); outer
        /// `None`: not read yet since (re)entering this phase.
        last_seen: Option<Option<Key>>,
        changed_at: Instant,
        next_read: Instant,
        in_flight: bool,
    },
    Acquiring {
        sent_at: Instant,
    },
    Verifying {
        acquire_sent: Instant,
        next_read: Instant,
        in_flight: bool,
    },
    Holding {
        confirmed: Key,
        /// Keys of renews that ended without an answer (maybe applied), newest last.
        unconfirmed: Vec<Key>,
        last_good_send: Instant,
        next_renew: Instant,
        in_flight: Option<(Key, Instant)>,
        promoted: bool,
    },
    Fenced,
}

/// The lease state machine of one node for one LU (the driver runs one per LU and treats a
/// [`LeaseAction::SelfFence`] from any of them as node-wide).
#[derive(Debug, Clone)]
pub struct Lease {
    config: LeaseConfig,
    phase: Phase,
    /// Our registered standby key (the key we acquire with).
    own: Key,
    next_epoch: u64,
    persisted_through: Option<u64>,
    /// Send time of our last PREEMPT/RESERVE (the earliest moment it can have taken effect).
    last_acquire_sent: Option<Instant>,
    started: Instant,
    queue: VecDeque<LeaseAction>,
}

impl Lease {
    /// Starts a node. `first_epoch` comes from [`starting_epoch`]; `persisted` is the state
    /// file's value. If the reservation is held by a key of our own node (the agent restarted
    /// and left its registrations in place), the node resumes as holder by renewing that key at
    /// once; its lease then runs from this start, not from the previous run's last renew, so
    /// the service must be stopped with the agent (the unit's `PartOf=`) for the "holder stops
    /// first" property to survive a restart. Otherwise it joins as standby.
    pub fn new(
        config: LeaseConfig,
        first_epoch: u64,
        persisted: Option<u64>,
        view: &StartView,
        now: Instant,
    ) -> Lease {
        let ours = |k: &Key| LeaseKey::decode(*k).is_some_and(|lk| lk.node() == config.node);
        let phase = match view.holder {
            Some(holder) if ours(&holder) => Phase::Holding {
                confirmed: holder,
                unconfirmed: view
                    .keys
                    .iter()
                    .copied()
                    .filter(|k| ours(k) && *k != holder)
                    .fold(Vec::new(), |mut keys, k| {
                        if !keys.contains(&k) {
                            keys.push(k);
                        }
                        keys
                    }),
                last_good_send: now,
                next_renew: now,
                in_flight: None,
                promoted: false,
            },
            _ => Phase::Joining {
                next_attempt: now,
                in_flight: false,
            },
        };
        let own = match &phase {
            Phase::Holding { confirmed, .. } => *confirmed,
            _ => Key::new(0),
        };
        Lease {
            config,
            phase,
            own,
            next_epoch: first_epoch,
            persisted_through: persisted,
            last_acquire_sent: None,
            started: now,
            queue: VecDeque::new(),
        }
    }

    pub fn role(&self) -> Role {
        match &self.phase {
            Phase::Holding { promoted, .. } => Role::Holder {
                promoted: *promoted,
            },
            Phase::Fenced => Role::Fenced,
            _ => Role::Standby,
        }
    }

    /// Our current key (0 before the first join).
    pub fn own_key(&self) -> Key {
        match &self.phase {
            Phase::Holding { confirmed, .. } => *confirmed,
            _ => self.own,
        }
    }

    /// When a holder self-fences unless a renew succeeds first.
    pub fn holder_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Holding { last_good_send, .. } => Some(self.deadline_after(*last_good_send)),
            _ => None,
        }
    }

    fn deadline_after(&self, send: Instant) -> Instant {
        send + self.config.lease.saturating_sub(self.config.margin)
    }

    /// When [`Lease::poll`] next has something to do without a completion (`None`: wait for the
    /// outstanding command, or fenced).
    pub fn next_wakeup(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Joining {
                next_attempt,
                in_flight: false,
            } => Some(*next_attempt),
            Phase::Watching {
                next_read,
                in_flight: false,
                ..
            }
            | Phase::Verifying {
                next_read,
                in_flight: false,
                ..
            } => Some(*next_read),
            Phase::Holding {
                last_good_send,
                next_renew,
                in_flight,
                ..
            } => {
                let deadline = self.deadline_after(*last_good_send);
                Some(match in_flight {
                    None => deadline.min(*next_renew),
                    Some(_) => deadline,
                })
            }
            _ => None,
        }
    }

    /// Feed the hardware watchdog now? Never once fenced. A holder stops feeding when its lease
    /// has less than the watchdog timeout left, so a hung agent is reset by the hardware before
    /// the lease ends.
    pub fn feed_watchdog(&self, now: Instant) -> bool {
        match &self.phase {
            Phase::Fenced => false,
            Phase::Holding { last_good_send, .. } => {
                let deadline = self.deadline_after(*last_good_send);
                now + self.config.watchdog_timeout.unwrap_or_default() < deadline
            }
            _ => true,
        }
    }

    /// The next action to perform now, if any. Call until `None`.
    pub fn poll(&mut self, now: Instant) -> Option<LeaseAction> {
        if let Some(action) = self.queue.pop_front() {
            return Some(action);
        }
        let lease = self.config.lease;
        let interval = self.config.check_interval;
        match &mut self.phase {
            Phase::Fenced | Phase::Acquiring { .. } => None,
            Phase::Joining {
                next_attempt,
                in_flight,
            } => {
                if *in_flight || now < *next_attempt {
                    return None;
                }
                *in_flight = true;
                match self.allocate() {
                    Ok((key, persist_epoch)) => {
                        self.own = key;
                        Some(LeaseAction::Join { key, persist_epoch })
                    }
                    Err(_) => Some(self.fence(SelfFenceReason::EpochsExhausted)),
                }
            }
            Phase::Watching {
                last_seen,
                changed_at,
                next_read,
                in_flight,
            } => {
                if *in_flight {
                    return None;
                }
                // The single place a standby decides to take over (CAS on the target).
                if let Some(holder) = *last_seen
                    && now.saturating_duration_since(*changed_at) >= lease
                {
                    self.phase = Phase::Acquiring { sent_at: now };
                    self.last_acquire_sent = Some(now);
                    return Some(match holder {
                        Some(victim) => LeaseAction::Preempt {
                            own: self.own,
                            victim,
                        },
                        None => LeaseAction::Reserve { own: self.own },
                    });
                }
                if now < *next_read {
                    return None;
                }
                *in_flight = true;
                *next_read = now + interval;
                Some(LeaseAction::ReadReservation)
            }
            Phase::Verifying {
                next_read,
                in_flight,
                ..
            } => {
                if *in_flight || now < *next_read {
                    return None;
                }
                *in_flight = true;
                *next_read = now + interval;
                Some(LeaseAction::ReadReservation)
            }
            Phase::Holding {
                confirmed,
                unconfirmed,
                last_good_send,
                next_renew,
                in_flight,
                ..
            } => {
                let since = now.saturating_duration_since(*last_good_send);
                // The single place a holder decides its lease is over (runs before any renew).
                if since >= lease.saturating_sub(self.config.margin) {
                    return Some(self.fence(SelfFenceReason::LeaseExpired {
                        since_last_good_send: since,
                    }));
                }
                if in_flight.is_some() || now < *next_renew {
                    return None;
                }
                let mut from = vec![*confirmed];
                from.extend(unconfirmed.iter().rev().copied());
                match self.allocate() {
                    Ok((to, persist_epoch)) => {
                        if let Phase::Holding { in_flight, .. } = &mut self.phase {
                            *in_flight = Some((to, now));
                        }
                        Some(LeaseAction::Renew {
                            from,
                            to,
                            persist_epoch,
                        })
                    }
                    Err(_) => Some(self.fence(SelfFenceReason::EpochsExhausted)),
                }
            }
        }
    }

    /// Reports the end of the outstanding command. A completion that does not match the phase
    /// (late, after fencing) is ignored.
    pub fn complete(&mut self, now: Instant, completion: LeaseCompletion) {
        let interval = self.config.check_interval;
        let renew = self.config.renew;
        match (&mut self.phase, completion) {
            (Phase::Joining { .. }, LeaseCompletion::Join(Ok(()))) => {
                self.phase = Phase::Watching {
                    last_seen: None,
                    changed_at: now,
                    next_read: now,
                    in_flight: false,
                };
            }
            (
                Phase::Joining {
                    next_attempt,
                    in_flight,
                },
                LeaseCompletion::Join(Err(_)),
            ) => {
                *in_flight = false;
                *next_attempt = now + interval;
            }
            (
                Phase::Watching {
                    last_seen,
                    changed_at,
                    in_flight,
                    ..
                },
                LeaseCompletion::Reservation(result),
            ) => {
                *in_flight = false;
                // A failed read neither restarts nor advances the timer: keys never repeat, so
                // the same key seen after failures really has not changed.
                if let Ok(holder) = result {
                    if holder.is_some() && holder == Some(self.own) && !self.own.is_zero() {
                        // Only our own PREEMPT/RESERVE of this run can make our fresh key the
                        // holder (one that took effect late, after a verifying read). Count the
                        // lease from its send, the earliest moment it can have taken effect.
                        let since = self.last_acquire_sent.unwrap_or(self.started);
                        self.promote(now, since);
                    } else if *last_seen != Some(holder) {
                        *last_seen = Some(holder);
                        *changed_at = now;
                    }
                }
            }
            (
                Phase::Acquiring { sent_at },
                LeaseCompletion::Preempt(result) | LeaseCompletion::Reserve(result),
            ) => {
                let acquire_sent = *sent_at;
                self.phase = match result {
                    // The CAS lost (the holder renewed) or another standby won: back off and
                    // watch again from scratch.
                    Err(CommandFailure::Conflict) => Phase::Watching {
                        last_seen: None,
                        changed_at: now,
                        next_read: now + interval,
                        in_flight: false,
                    },
                    // Success, or uncertain: READ RESERVATION decides.
                    _ => Phase::Verifying {
                        acquire_sent,
                        next_read: now,
                        in_flight: false,
                    },
                };
            }
            (
                Phase::Verifying {
                    acquire_sent,
                    in_flight,
                    ..
                },
                LeaseCompletion::Reservation(result),
            ) => {
                *in_flight = false;
                let acquire_sent = *acquire_sent;
                match result {
                    Ok(Some(holder)) if holder == self.own => self.promote(now, acquire_sent),
                    Ok(holder) => {
                        self.phase = Phase::Watching {
                            last_seen: Some(holder),
                            changed_at: now,
                            next_read: now + interval,
                            in_flight: false,
                        };
                    }
                    Err(_) => {}
                }
            }
            (
                Phase::Holding {
                    confirmed,
                    unconfirmed,
                    last_good_send,
                    next_renew,
                    in_flight,
                    promoted,
                },
                LeaseCompletion::Renew(result),
            ) => {
                let Some((to, sent_at)) = in_flight.take() else {
                    return;
                };
                *next_renew = sent_at + renew;
                match result {
                    // The single place a holder checks it still holds the reservation.
                    Ok(holder) if holder != Some(to) => {
                        let action =
                            self.fence(SelfFenceReason::ReservationLost { key: to, holder });
                        self.queue.push_back(action);
                    }
                    Ok(_) => {
                        *confirmed = to;
                        unconfirmed.clear();
                        *last_good_send = sent_at;
                        if !*promoted {
                            *promoted = true;
                            self.queue.push_back(LeaseAction::Promoted { key: to });
                        }
                    }
                    // P3: our key is gone from the LU; never re-register, stop now.
                    Err(CommandFailure::Conflict) => {
                        let key = *confirmed;
                        let action = self.fence(SelfFenceReason::Preempted { key });
                        self.queue.push_back(action);
                    }
                    Err(_) => unconfirmed.push(to),
                }
            }
            _ => {}
        }
    }

    /// Becomes holder with a lease counted from `since` (the acquiring command's send time).
    fn promote(&mut self, now: Instant, since: Instant) {
        let own = self.own;
        self.phase = Phase::Holding {
            confirmed: own,
            unconfirmed: Vec::new(),
            last_good_send: since,
            next_renew: since + self.config.renew,
            in_flight: None,
            promoted: true,
        };
        // An acquisition verified only after its lease ran out is not announced: the next poll
        // self-fences instead.
        if now < self.deadline_after(since) {
            self.queue.push_back(LeaseAction::Promoted { key: own });
        }
    }

    fn fence(&mut self, reason: SelfFenceReason) -> LeaseAction {
        self.phase = Phase::Fenced;
        self.queue.clear();
        LeaseAction::SelfFence(reason)
    }

    /// The next fresh key, and the epoch to persist first if it leaves the reserved block.
    fn allocate(&mut self) -> Result<(Key, Option<u64>), EpochExhausted> {
        let key = LeaseKey::new(self.config.node, self.next_epoch)?;
        self.next_epoch += 1;
        let persist = match self.persisted_through {
            Some(through) if through >= key.epoch() => None,
            _ => {
                let through = key.epoch().saturating_add(EPOCH_BLOCK - 1).min(EPOCH_MAX);
                self.persisted_through = Some(through);
                Some(through)
            }
        };
        Ok((key.key(), persist))
    }
}

pub mod commands;
pub(super) mod driver;
pub mod epoch_file;

#[cfg(test)]
mod tests;
