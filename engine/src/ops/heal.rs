//! heal: tidy this node's registrations on a LU while its key is still there, without ever
//! registering: after an iSCSI re-login a path has a new I_T nexus (new ISID) without a
//! registration, and the old one is left orphaned (fence-agents #517, PR #529/#558).
//!
//! P3 forbids heal to register the new nexus. No SPC command registers a nexus only while a key
//! is present (REGISTER AND IGNORE EXISTING KEY from an unregistered nexus always registers), so
//! a heal that checked for our key and then registered could bring the key back behind a fence
//! that ran in between (a node paused between the two commands is enough; the simulation found
//! it). Registering a path is `unfence`'s alone: an explicit act. Heal does what one atomic
//! command can: it purges the orphans by preempting our own key from the one registered path
//! (which fails, changing nothing, if our key was preempted), and it names the paths that need
//! `prfence unfence`.

use crate::pr::{Key, PrOut};
use crate::transport::{ErrorKind, PrTransport};

use super::lu::{LuWork, Stop};
use super::probe::probe_registration;
use super::{LuReport, LuTarget, Verdict};

pub(super) fn heal_lu<T: PrTransport>(target: &LuTarget<T>, own: Key) -> LuReport {
    let mut work = LuWork::new(target);
    let result = steps(&mut work, own);
    work.finish(result, &[Verdict::Healed, Verdict::Intact])
}

fn steps<T: PrTransport>(work: &mut LuWork<'_, T>, own: Key) -> Result<Verdict, Stop> {
    let (index, keys) = work.read_keys_any()?;
    if !keys.keys.contains(&own) {
        work.note_reservation(index);
        return Err(Stop::fenced(format!(
            "own key {own} is not registered on this LU; heal never registers a key that may have \
             been preempted (P3): run `prfence unfence` if this node should be back"
        )));
    }
    let (registered, unregistered) = probe_paths(work, own)?;
    let purged = match registered.as_slice() {
        [caller] => purge_orphans(work, own, *caller)?,
        _ => {
            note_orphans_left(work, own, registered.len())?;
            false
        }
    };
    work.verify(own, None, false)?;
    if !unregistered.is_empty() {
        let devices: Vec<String> = unregistered.iter().map(|&i| work.device(i)).collect();
        return Err(Stop {
            verdict: Verdict::PathsUnregistered,
            message: format!(
                "{} {} no registration of {own} (a new iSCSI session?): run `prfence unfence` on \
                 this node to register {}; heal never registers (P3)",
                devices.join(", "),
                if devices.len() == 1 { "has" } else { "have" },
                if devices.len() == 1 { "it" } else { "them" },
            )
            .into(),
        });
    }
    Ok(if purged {
        Verdict::Healed
    } else {
        Verdict::Intact
    })
}

/// Which live paths are registered with our key ([`probe_registration`]).
pub(super) fn probe_paths<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
) -> Result<(Vec<usize>, Vec<usize>), Stop> {
    let (mut registered, mut unregistered) = (Vec::new(), Vec::new());
    for index in work.live_paths() {
        match work.on(index, |p| probe_registration(p, own)) {
            Ok(true) => registered.push(index),
            Ok(false) => {
                work.mark_answered(index);
                unregistered.push(index);
            }
            Err(_) if work.is_dead_path(index) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok((registered, unregistered))
}

/// What a purge found to do: the registrations under our key that belong to no current path.
pub(super) enum Orphans {
    /// None, or READ FULL STATUS could not say.
    None,
    /// This many, and this node holds a single-holder reservation of this type, so preempting our
    /// own key from a registered path removes them and keeps that path's registration.
    Purgeable(usize, crate::pr::ReservationType),
    /// This many, left alone: this node does not hold the reservation (preempting a non-holder's
    /// key would remove the caller's registration too).
    NotHolder(usize),
}

/// Counts the registrations under our key beyond one per registered live path (READ FULL
/// STATUS through `caller`), and whether this node can purge them.
pub(super) fn find_orphans<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    caller: usize,
    registered_live: usize,
) -> Result<Orphans, Stop> {
    let Some(path) = work.target.paths.get(caller) else {
        return Ok(Orphans::None);
    };
    // Not recorded as a path failure: a target without READ FULL STATUS is not a broken path.
    let status = match path.read_full_status() {
        Ok(status) => status,
        Err(e) => {
            work.notes.push(format!(
                "READ FULL STATUS unavailable ({}); orphaned registrations not checked",
                why_unavailable(e.kind)
            ));
            return Ok(Orphans::None);
        }
    };
    let ours = status.registrations.iter().filter(|r| r.key == own).count();
    let orphans = ours.saturating_sub(registered_live);
    if orphans == 0 {
        return Ok(Orphans::None);
    }
    let held = work.on(caller, |p| p.read_reservation())?.reservation;
    Ok(
        match held.filter(|r| r.key == own && !r.rtype.is_all_registrants()) {
            Some(held) => Orphans::Purgeable(orphans, held.rtype),
            None => Orphans::NotHolder(orphans),
        },
    )
}

/// Preempts our own key from `caller` (proven registered): SPC removes every other registration
/// under our key and keeps the caller's, and the reservation, now held through the caller. One
/// atomic command: if our key was preempted meanwhile, the caller is no longer registered and the
/// target refuses it with RESERVATION CONFLICT, changing nothing (P3).
pub(super) fn preempt_own_key<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    caller: usize,
    rtype: crate::pr::ReservationType,
) -> Result<(), Stop> {
    match work.on(caller, |p| p.pr_out(&PrOut::preempt(own, own, rtype))) {
        Ok(_) => Ok(()),
        Err(e) if e.kind == ErrorKind::ReservationConflict => {
            work.mark_answered(caller);
            Err(Stop::fenced(format!(
                "own key {own} was preempted while purging orphaned registrations (PREEMPT from \
                 {} answered RESERVATION CONFLICT)",
                work.device(caller)
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// Purges the orphans when `caller` is this node's only registered live path (so the self-
/// preemption takes no current registration with it). Returns whether anything changed.
fn purge_orphans<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    caller: usize,
) -> Result<bool, Stop> {
    match find_orphans(work, own, caller, 1)? {
        Orphans::None => Ok(false),
        Orphans::NotHolder(orphans) => {
            note_not_holder(work, own, orphans);
            Ok(false)
        }
        Orphans::Purgeable(orphans, rtype) => {
            preempt_own_key(work, own, caller, rtype)?;
            work.notes.push(format!(
                "purged {orphans} orphaned registration(s) of {own} by preempting it from {}",
                work.device(caller)
            ));
            Ok(true)
        }
    }
}

/// With several registered live paths, preempting our own key would remove their
/// registrations too, and heal may not register them again: the orphans are named, `unfence`
/// purges them.
fn note_orphans_left<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    registered_live: usize,
) -> Result<(), Stop> {
    let Some(&caller) = work.live_paths().first() else {
        return Ok(());
    };
    if registered_live == 0 {
        return Ok(());
    }
    match find_orphans(work, own, caller, registered_live)? {
        Orphans::None => {}
        Orphans::NotHolder(orphans) => note_not_holder(work, own, orphans),
        Orphans::Purgeable(orphans, _) => work.notes.push(format!(
            "{orphans} registration(s) with {own} belong to no current path (earlier iSCSI \
             sessions); left in place: purging them would take this node's other paths' \
             registrations with them, and heal never registers: `prfence unfence` purges them"
        )),
    }
    Ok(())
}

fn note_not_holder<T: PrTransport>(work: &mut LuWork<'_, T>, own: Key, orphans: usize) {
    work.notes.push(format!(
        "{orphans} registration(s) with {own} belong to no current path (earlier iSCSI sessions, \
         or another node with the same key); left in place because this node does not hold the \
         reservation"
    ));
}

/// Why an optional command did not answer, in the few words a report note has room for.
fn why_unavailable(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotSupported | ErrorKind::InvalidField => "the target does not support it",
        ErrorKind::Timeout | ErrorKind::Transport | ErrorKind::Open => "the path failed",
        _ => "the target refused it",
    }
}
