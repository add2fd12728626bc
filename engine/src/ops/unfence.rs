//! unfence: register our key on every path, create a reservation where none exists, verify.

use crate::pr::{Key, PrOut};
use crate::transport::PrTransport;

use super::heal::{Orphans, find_orphans, preempt_own_key};
use super::lu::{LuWork, Stop};
use super::{Failure, LuReport, LuTarget, Verdict};

/// P3: the only operation that registers a key without proof that it is still present. It is an
/// explicit admin or cluster action (Pacemaker's "on"), never taken automatically.
pub(super) fn unfence_lu<T: PrTransport>(target: &LuTarget<T>, own: Key) -> LuReport {
    let mut work = LuWork::new(target);
    let result = steps(&mut work, own);
    work.finish(result, &[Verdict::Unfenced])
}

fn steps<T: PrTransport>(work: &mut LuWork<'_, T>, own: Key) -> Result<Verdict, Stop> {
    let registered = register_everywhere(work, own)?;
    work.ensure_reservation(own, &registered)?;
    // Registrations left by earlier iSCSI sessions under our key (fence-agents #517).
    purge_orphans(work, own, &registered)?;
    work.verify(own, None, true)?;
    Ok(Verdict::Unfenced)
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
