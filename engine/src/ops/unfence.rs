//! unfence: register our key on every path, create a reservation where none exists, verify;
//! on an LU this node registered on before, first refuse if it was fenced since.

use crate::pr::{Key, PrOut};
use crate::transport::PrTransport;

use super::heal::{Orphans, find_orphans, preempt_own_key};
use super::lu::{LuWork, Stop};
use super::{Failure, LuReport, LuTarget, Verdict};

/// P3: the only operation that registers a key without proof that it is still present. It is an
/// explicit admin or cluster action (Pacemaker's "on"), never taken automatically.
/// `registered_before`: this node registered on this LU earlier and has kept its caches since (in
/// fence_pr: earlier in this boot), so a key found preempted is refused ([`refuse_if_fenced_since`]).
pub(super) fn unfence_lu<T: PrTransport>(
    target: &LuTarget<T>,
    own: Key,
    registered_before: bool,
) -> LuReport {
    let mut work = LuWork::new(target);
    let result = steps(&mut work, own, registered_before);
    work.finish(result, &[Verdict::Unfenced])
}

fn steps<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    registered_before: bool,
) -> Result<Verdict, Stop> {
    if registered_before {
        refuse_if_fenced_since(work, own)?;
    }
    let registered = register_everywhere(work, own)?;
    work.ensure_reservation(own, &registered)?;
    // Registrations left by earlier iSCSI sessions under our key (fence-agents #517).
    purge_orphans(work, own, &registered)?;
    work.verify(own, None, true)?;
    Ok(Verdict::Unfenced)
}

/// P3 against a cluster manager's re-unfencing: Pacemaker may run `on` for a node it has just
/// fenced, while that node still runs (its default fence-reaction=stop; the lab saw the key back
/// 0.5 s after the fence). A node that registered here before and now finds its key gone was
/// preempted since, or cannot tell that it was not: it still holds whatever it meant to write
/// then (page cache, queued I/O), so it is not registered again; a reboot clears both that and
/// fence_pr's record. That holds on an LU with no registrations at all too: a target that lost
/// its PR state (a power cycle without APTPL) or a CLEAR also erased the evidence of a fence
/// before it, and registering there let a node fenced before the loss come back and fence the
/// survivor (the simulation's seed 98449: two survivors). An unfence that starts after a fence
/// succeeded is always refused; one whose READ KEYS precedes the fence's PREEMPT may still
/// register after it, as any unfence overlapping a fence can: SPC has no command that registers
/// only a key never preempted.
fn refuse_if_fenced_since<T: PrTransport>(work: &mut LuWork<'_, T>, own: Key) -> Result<(), Stop> {
    let (index, keys) = work.read_keys_any()?;
    if keys.keys.contains(&own) {
        return Ok(());
    }
    if keys.keys.is_empty() {
        return Err(Stop::fenced(format!(
            "own key {own} is gone from this LU since this node registered on it, and so is every \
             other key (cleared, or the target lost its PR state: a power cycle without APTPL), \
             which also erased any fence of this node before that; not registered again (P3)"
        )));
    }
    work.note_reservation(index);
    Err(Stop::fenced(format!(
        "own key {own} was preempted since this node registered on this LU ({} other \
         registration(s) remain); not registered again (P3)",
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
