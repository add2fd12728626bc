//! unfence: register our key on every path, create a reservation where none exists, verify.
//! An unfence that keeps the node's record of this boot adds each LU to it before registering
//! there; a rejoin (fence_pr's `on`) first reads the LUs already in it and registers nowhere if
//! the node was fenced since.

use std::sync::Arc;

use crate::discover::LuId;
use crate::pr::{Key, PrOut};
use crate::transport::PrTransport;

use super::heal::{Orphans, find_orphans, preempt_own_key};
use super::lu::{LuWork, Stop};
use super::own_initiators::{OwnInitiator, own_key_on_other_initiators};
use super::{Failure, LuReport, LuTarget, Verdict};

/// A node's record of the LUs it began registering its key on in this boot (fence_pr's
/// `.lus` file, kept until the node reboots). It is what tells a rejoin from a first unfence
/// (P3): see [`rejoin_check_lu`].
pub trait BootRecord: Send + Sync {
    /// Whether this node began registering on `lu` earlier in this boot.
    fn contains(&self, lu: &LuId) -> bool;
    /// Records `lu`, durably, before the first REGISTER is sent there; an error leaves the LU
    /// unregistered.
    fn add(&self, lu: &LuId) -> Result<(), String>;
}

/// Who asks for an unfence, with the node's record of its boot.
#[derive(Clone)]
pub enum UnfenceBy {
    /// An explicit unfence (the admin's `prfence unfence`): registers even where the key was
    /// preempted (P3's way back), and adds each LU to the record before its REGISTER, so that a
    /// later rejoin in this boot knows.
    Admin(Arc<dyn BootRecord>),
    /// fence_pr's `on`: registers nowhere once the key is gone from an LU of the record, and adds
    /// each other LU before its REGISTER.
    Rejoin(Arc<dyn BootRecord>),
    /// No record kept: set-ups and tests.
    Unrecorded,
}

impl UnfenceBy {
    pub(super) fn record(&self) -> Option<&dyn BootRecord> {
        match self {
            UnfenceBy::Admin(r) | UnfenceBy::Rejoin(r) => Some(r.as_ref()),
            UnfenceBy::Unrecorded => None,
        }
    }
}

/// P3: the only operation that registers a key without proof that it is still present. It is an
/// explicit admin or cluster action (Pacemaker's "on"), never taken automatically.
/// `record`: the node's record of this boot, unless it holds this LU already (a rejoin has read
/// those first, [`rejoin_check_lu`]): the LU is added to it before anything is registered.
/// `initiators`: this node's, to tell another node holding `own` here ([`refuse_if_key_shared`]);
/// empty: not checked.
pub(super) fn unfence_lu<T: PrTransport>(
    target: &LuTarget<T>,
    own: Key,
    record: Option<&dyn BootRecord>,
    initiators: &[OwnInitiator],
) -> LuReport {
    let mut work = LuWork::new(target);
    let result = steps(&mut work, own, record, initiators);
    work.finish(result, &[Verdict::Unfenced])
}

fn steps<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    record: Option<&dyn BootRecord>,
    initiators: &[OwnInitiator],
) -> Result<Verdict, Stop> {
    // First, so that an LU refused here is not in the record either: a later `on` once the
    // other node gave the key up must not take this node for fenced.
    let read = !initiators.is_empty() && refuse_if_key_shared(work, own, initiators)?;
    if let Some(record) = record {
        // The record comes first, so an `on` stopped anywhere after (killed at Pacemaker's
        // timeout, a lost reply, a fence racing its verification) leaves it naming every LU
        // where its REGISTER may have landed. One read first, so an LU this node cannot reach
        // now is not recorded and a plain rerun registers there.
        if !read {
            work.read_keys_any()?;
        }
        record.add(&work.target.id).map_err(|e| {
            Stop::failed(format!(
                "not registered: this LU could not be added to the node's record of this \
                 boot, which keeps a later `on` from registering the node once it was fenced \
                 (P3): {e}"
            ))
        })?;
    }
    let registered = register_everywhere(work, own)?;
    work.ensure_reservation(own, &registered)?;
    // Registrations left by earlier iSCSI sessions under our key (fence-agents #517).
    purge_orphans(work, own, &registered)?;
    work.verify(own, None, true)?;
    Ok(Verdict::Unfenced)
}

/// Two nodes must never hold one key: a fence of either removes both, and a fence that derives
/// the key from a name removes the other node's too or, looking for a key that moved, none of
/// the right one (fence_scsi's `key_value=id`: a node added after one was removed from the
/// middle of the nodelist takes the last position, whose key a node that moved up still holds).
/// So before anything is registered or recorded on an LU, a registration of `own` under an
/// initiator that is none of `initiators` (READ FULL STATUS) stops the unfence there. A target
/// without READ FULL STATUS is not checked (a note says so).
/// Ok(true): the LU answered and no other initiator holds `own`; Ok(false): not checked.
fn refuse_if_key_shared<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    initiators: &[OwnInitiator],
) -> Result<bool, Stop> {
    let Some((_, status)) = work.read_full_status_any()? else {
        work.notes.push(format!(
            "the target has no READ FULL STATUS: whether another node's initiator holds {own} \
             was not checked"
        ));
        return Ok(false);
    };
    let others = own_key_on_other_initiators(initiators, own, &status);
    if others.is_empty() {
        return Ok(true);
    }
    let ours: Vec<String> = initiators.iter().map(ToString::to_string).collect();
    Err(Stop::failed(format!(
        "{own} is already registered here by {}, none of this node's initiators ({}): two \
         nodes would hold one key, and a fence of one would remove both or neither; not \
         registered. Give each node its own key (with key_value=id, reboot first the nodes \
         whose nodelist position moved when a node was removed; they still hold their old \
         positions' keys)",
        others.join(", "),
        ours.join(", ")
    )))
}

/// A rejoin's first step on an LU in its record: our key still registered ([`Verdict::Registered`])
/// or not ([`refuse_if_fenced_since`]). Registers nothing.
pub(super) fn rejoin_check_lu<T: PrTransport>(target: &LuTarget<T>, own: Key) -> LuReport {
    let mut work = LuWork::new(target);
    let result = refuse_if_fenced_since(&mut work, own).map(|()| Verdict::Registered);
    work.finish(result, &[Verdict::Registered])
}

/// P3 against a cluster manager's re-unfencing: Pacemaker may run `on` for a node it has just
/// fenced, while that node still runs (its default fence-reaction=stop; the lab saw the key back
/// 0.5 s after the fence). A node that began registering here in this boot and now finds its key
/// gone was preempted since, or cannot tell that it was not: it still holds whatever it meant to
/// write then (page cache, queued I/O), so it is not registered again, here or on any other LU;
/// a reboot clears both that and fence_pr's record. That holds on an LU with no registrations at
/// all too: a target that lost its PR state (a power cycle without APTPL) or a CLEAR also erased
/// the evidence of a fence before it, and registering there let a node fenced before the loss
/// come back and fence the survivor (the simulation's seed 98449: two survivors). An `on` whose
/// REGISTER never landed (stopped after the record was written) is refused the same way: no node
/// can tell that from a fence. An unfence that starts after a fence succeeded is always refused;
/// one whose READ KEYS precedes the fence's PREEMPT may still register after it, as any unfence
/// overlapping a fence can: SPC has no command that registers only a key never preempted.
fn refuse_if_fenced_since<T: PrTransport>(work: &mut LuWork<'_, T>, own: Key) -> Result<(), Stop> {
    let (index, keys) = work.read_keys_any()?;
    if keys.keys.contains(&own) {
        return Ok(());
    }
    if keys.keys.is_empty() {
        return Err(Stop::fenced(format!(
            "own key {own} is not on this LU, where this node began registering in this boot, and \
             neither is any other key (cleared, or the target lost its PR state: a power cycle \
             without APTPL), which also erased any fence of this node before that; not \
             registered again (P3)"
        )));
    }
    work.note_reservation(index);
    Err(Stop::fenced(format!(
        "own key {own} is not on this LU, where this node began registering in this boot: it \
         was preempted since ({} other registration(s) remain), or that REGISTER never landed; \
         not registered again (P3)",
        keys.keys.len()
    )))
}

/// REGISTER AND IGNORE EXISTING KEY on every live path; returns the paths now registered.
/// Only `unfence` registers this way (P3: it is explicit).
fn register_everywhere<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
) -> Result<Vec<usize>, Stop> {
    let mut registered = Vec::new();
    let mut first_error = None;
    for index in work.live_paths() {
        match work.on(index, |p| p.pr_out(&PrOut::register_ignore(own))) {
            Ok(_) => registered.push(index),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if registered.is_empty() {
        return Err(match first_error {
            Some(e) => Stop::failed(Failure::after(
                format!("could not register {own} on any path"),
                e,
            )),
            None => Stop::failed("every path is dead"),
        });
    }
    Ok(registered)
}

/// Removes registrations under our key that belong to none of our current paths (earlier iSCSI
/// sessions): preempting our own key from one registered path removes every other registration
/// with it, our other paths' too (fence-agents PR #594), which unfence, being explicit, registers
/// again. Only while we hold the reservation: SPC then spares the caller's registration.
fn purge_orphans<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    registered: &[usize],
) -> Result<(), Stop> {
    let live: Vec<usize> = registered
        .iter()
        .copied()
        .filter(|&i| !work.is_dead_path(i))
        .collect();
    let Some(&caller) = live.first() else {
        return Ok(());
    };
    match find_orphans(work, own, caller, live.len())? {
        Orphans::None => {}
        Orphans::NotHolder(orphans) => work.notes.push(format!(
            "{orphans} registration(s) with {own} belong to no current path (earlier iSCSI \
             sessions, or another node with the same key); left in place because this node \
             does not hold the reservation"
        )),
        Orphans::Purgeable(orphans, rtype) => {
            preempt_own_key(work, own, caller, rtype)?;
            for &index in live.iter().filter(|&&i| i != caller) {
                let _ = work.on(index, |p| p.pr_out(&PrOut::register_ignore(own)));
            }
            work.notes.push(format!(
                "purged {orphans} orphaned registration(s) of {own} by preempting it from {}",
                work.device(caller)
            ));
        }
    }
    Ok(())
}
