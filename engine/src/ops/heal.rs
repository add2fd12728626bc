//! heal: repair this node's registrations on a LU while its key is still there, e.g. after an
//! iSCSI re-login gave a path a new I_T nexus (new ISID) and left the old registration orphaned
//! (fence-agents #517, PR #529/#558).

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
    let mut changed = false;
    let mut now_registered = registered.clone();
    if !unregistered.is_empty() {
        now_registered.extend(guarded_register(work, own, &registered, &unregistered)?);
        changed = true;
    }
    changed |= purge_orphans(work, own, &now_registered)?;
    work.verify(own, None, false)?;
    Ok(if changed {
        Verdict::Healed
    } else {
        Verdict::Intact
    })
}

/// Which live paths are registered with our key ([`probe_registration`]).
fn probe_paths<T: PrTransport>(
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

/// P3: registers our key on `targets` only with proof that the key is still on the LU, and checks
/// that proof again afterwards; if it failed meanwhile (someone preempted us between the check and
/// the REGISTER), the new registrations are withdrawn and the LU reports this node fenced.
///
/// The proof is a `witness` path still registered with our key (re-stating the key from it
/// succeeds only while it is registered), or, with no witness, the orphaned registrations that
/// READ FULL STATUS shows under our key: a PREEMPT of our key removes them all.
pub(super) fn guarded_register<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    witnesses: &[usize],
    targets: &[usize],
) -> Result<Vec<usize>, Stop> {
    let before = if witnesses.is_empty() {
        let count = count_own_registrations(work, own)?;
        if count == 0 {
            return Err(Stop::fenced(format!(
                "own key {own} disappeared from the LU before it could be re-registered"
            )));
        }
        Some(count)
    } else {
        None
    };
    let mut added = Vec::new();
    for &index in targets {
        if work
            .on(index, |p| p.pr_out(&PrOut::register_ignore(own)))
            .is_ok()
        {
            added.push(index);
        }
    }
    let still_present = match before {
        None => witness_still_registered(work, own, witnesses)?,
        Some(count) => count_own_registrations(work, own)? >= count + added.len(),
    };
    if !still_present {
        for &index in &added {
            // Removing our own key never weakens anyone's fence; a failure is in the path report.
            let _ = work.on(index, |p| p.pr_out(&PrOut::register(own, Key::ZERO)));
        }
        return Err(Stop::fenced(format!(
            "own key {own} was preempted while paths were being re-registered; the new \
             registrations were withdrawn (P3)"
        )));
    }
    if !added.is_empty() {
        let devices: Vec<String> = added.iter().map(|&i| work.device(i)).collect();
        work.notes.push(format!(
            "registered {own} on {} (the nexus had no registration: new iSCSI session?)",
            devices.join(", ")
        ));
    }
    Ok(added)
}

fn witness_still_registered<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    witnesses: &[usize],
) -> Result<bool, Stop> {
    for &index in witnesses {
        match work.on(index, |p| probe_registration(p, own)) {
            Ok(true) => return Ok(true),
            Ok(false) => {
                work.mark_answered(index);
                return Ok(false);
            }
            Err(_) if work.is_dead_path(index) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(Stop::failed(
        "every path that was registered died while re-registering the others; rerun heal",
    ))
}

fn count_own_registrations<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
) -> Result<usize, Stop> {
    let (_, status) = work.on_any(|p| p.read_full_status()).map_err(|stop| {
        Stop::failed(format!(
            "no path of this node is registered, and without READ FULL STATUS heal cannot prove \
             that {own} was not preempted meanwhile ({}); run `prfence unfence` to re-register \
             explicitly",
            stop.message
        ))
    })?;
    Ok(status.registrations.iter().filter(|r| r.key == own).count())
}

/// Removes registrations under our key that belong to none of our current paths (earlier iSCSI
/// sessions): READ FULL STATUS counts our key's registrations, and any beyond one per registered
/// live path are orphans. They are purged by preempting our own key from one registered path,
/// which removes every other registration with it (our other paths too, fence-agents PR #594, so
/// those are re-registered under [`guarded_register`]). Only while we hold the reservation: SPC
/// then spares the caller's registration, whereas preempting a non-holder's key would remove the
/// caller's too and drop our key from the LU for a moment. Returns whether anything changed.
pub(super) fn purge_orphans<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    registered: &[usize],
) -> Result<bool, Stop> {
    let live: Vec<usize> = registered
        .iter()
        .copied()
        .filter(|&i| !work.is_dead_path(i))
        .collect();
    let Some(&caller) = live.first() else {
        return Ok(false);
    };
    let Some(path) = work.target.paths.get(caller) else {
        return Ok(false);
    };
    // Not recorded as a path failure: a target without READ FULL STATUS is not a broken path.
    let status = match path.read_full_status() {
        Ok(status) => status,
        Err(e) => {
            work.notes.push(format!(
                "READ FULL STATUS unavailable ({}); orphaned registrations not checked",
                why_unavailable(e.kind)
            ));
            return Ok(false);
        }
    };
    let ours = status.registrations.iter().filter(|r| r.key == own).count();
    let orphans = ours.saturating_sub(live.len());
    if orphans == 0 {
        return Ok(false);
    }
    let held = work.on(caller, |p| p.read_reservation())?.reservation;
    let Some(held) = held.filter(|r| r.key == own && !r.rtype.is_all_registrants()) else {
        work.notes.push(format!(
            "{orphans} registration(s) with {own} belong to no current path (earlier iSCSI \
             sessions, or another node with the same key); left in place because this node does \
             not hold the reservation"
        ));
        return Ok(false);
    };
    match work.on(caller, |p| p.pr_out(&PrOut::preempt(own, own, held.rtype))) {
        Ok(_) => {}
        // The caller was registered a moment ago; only a preemption of our key (or a CLEAR)
        // unregisters it, and that removed every registration we had, so nothing we still hold
        // was there before it: give it all up.
        Err(e) if e.kind == ErrorKind::ReservationConflict => {
            work.mark_answered(caller);
            work.withdraw(own);
            return Err(Stop::fenced(format!(
                "own key {own} was preempted while purging orphaned registrations (PREEMPT from                  {} answered RESERVATION CONFLICT)",
                work.device(caller)
            )));
        }
        Err(e) => return Err(e.into()),
    }
    let others: Vec<usize> = live.iter().copied().filter(|&i| i != caller).collect();
    guarded_register(work, own, &[caller], &others)?;
    work.notes.push(format!(
        "purged {orphans} orphaned registration(s) of {own} by preempting it from {}",
        work.device(caller)
    ));
    Ok(true)
}

/// Why an optional command did not answer, in the few words a report note has room for.
fn why_unavailable(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotSupported | ErrorKind::InvalidField => "the target does not support it",
        ErrorKind::Timeout | ErrorKind::Transport | ErrorKind::Open => "the path failed",
        _ => "the target refused it",
    }
}
