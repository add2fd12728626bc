//! fence: remove the victim's key from every LU, the arbiter first and alone.

use crate::pr::Key;
use crate::transport::PrTransport;

use super::lu::{LuState, LuWork, Preempted, Stop};
use super::{LuReport, LuTarget, TieBreak, Verdict};

const FENCE_OK: &[Verdict] = &[Verdict::VictimRemoved, Verdict::AlreadyFenced];

/// P2: the single decision of who survives. The arbiter (first LU by identifier) is fenced alone:
/// the target serialises PREEMPTs, so of two nodes preempting each other exactly one finds its own
/// key still present here. A node whose key is absent touches nothing, anywhere (P2, P3): our key
/// is never registered on the arbiter by `fence`, because a loser that re-registered itself here
/// could then preempt the winner.
///
/// A mutual fence must not send two PREEMPTs to the arbiter at once (they can lock up LIO, see
/// [`TieBreak`]): while both keys are registered, the node with the greater key waits
/// `tie_break` and reads again before it preempts.
pub(super) fn fence_arbiter<T: PrTransport>(
    target: &LuTarget<T>,
    own: Key,
    victim: Key,
    tie_break: TieBreak,
) -> LuReport {
    let mut work = LuWork::new(target);
    let result = arbiter_steps(&mut work, own, victim, tie_break);
    work.finish(result, FENCE_OK)
}

/// The reads that decide (is our key here, is the victim's) are READ KEYS: they may cross the
/// other node's PREEMPT in a mutual fence, and on LIO a READ FULL STATUS crossing a PREEMPT can
/// crash the target (Linux 7.2 in the lab: it walks the registrations with their lock dropped,
/// and the PREEMPT frees the next one); READ KEYS walks them under the lock. Once our PREEMPT
/// has run here the victim can no longer change this LU, so the verifying look is READ FULL
/// STATUS, as on every LU.
fn arbiter_steps<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    victim: Key,
    tie_break: TieBreak,
) -> Result<Verdict, Stop> {
    let (_, mut keys) = work.read_keys_any()?;
    let has = |keys: &crate::pr::ReadKeys, key: Key| keys.keys.contains(&key);
    let wait = tie_break.wait(crate::runtime::now());
    if has(&keys, own) && has(&keys, victim) && own > victim && !wait.is_zero() {
        work.notes.push(format!(
            "both keys registered on the arbiter: waited {:.3} s for {victim} (the smaller key) \
             to fence first, then read the LU again (tie-break{})",
            wait.as_secs_f64(),
            match tie_break {
                TieBreak::Measured { .. } => ": twice this fence's time to the arbiter's answer",
                TieBreak::Off | TieBreak::Fixed(_) => "",
            }
        ));
        crate::runtime::sleep(wait);
        (_, keys) = work.read_keys_any()?;
    }
    if !has(&keys, own) {
        return Err(Stop::fenced(format!(
            "own key {own} is not registered on the arbiter LU: this node was fenced (it lost the \
             race, or was preempted earlier); if this node was never registered, run `prfence \
             unfence` first. No LU was touched"
        )));
    }
    let (verdict, proven) = if has(&keys, victim) {
        preempt_from_a_registered_path(work, own, victim)?
    } else {
        work.notes.push(format!(
            "victim key {victim} was not registered (P4: already fenced)"
        ));
        (Verdict::AlreadyFenced, None)
    };
    // The look that verifies (P1), and shows whether a reservation exists.
    let state = work.state_after_change()?;
    if state.has(own) && !state.has(victim) && !state.reserved() {
        reserve_and_verify(work, own, victim, proven)?;
    } else {
        work.check(&state, own, Some(victim), true)?;
    }
    Ok(verdict)
}

/// The steps on an LU other than the arbiter, after a read that found our key there: preempt the
/// victim if it is registered, create a reservation if none existed, and verify with one more
/// read (P1). A read that found nothing to change is the verification.
fn remove_victim<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    victim: Key,
    state: &LuState,
) -> Result<Verdict, Stop> {
    let (verdict, proven) = if state.has(victim) {
        preempt_from_a_registered_path(work, own, victim)?
    } else {
        work.notes.push(format!(
            "victim key {victim} was not registered (P4: already fenced)"
        ));
        if state.reserved() {
            // Nothing to change: the read is the evidence (P4: no command changes the LU).
            work.check(state, own, Some(victim), true)?;
            return Ok(Verdict::AlreadyFenced);
        }
        (Verdict::AlreadyFenced, None)
    };
    if !state.reserved() {
        reserve_and_verify(work, own, victim, proven)?;
    } else {
        work.verify(own, Some(victim), true)?;
    }
    Ok(verdict)
}

/// No reservation exists: create one with our key, then verify (P1). Only paths registered with
/// our key can reserve. The one the preemption went through (`proven`) is; the others are tried
/// after it (an unregistered one is refused without effect, but LIO refuses with NOT READY,
/// which costs the policy's retries).
fn reserve_and_verify<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    victim: Key,
    proven: Option<usize>,
) -> Result<(), Stop> {
    let mut candidates: Vec<usize> = proven.into_iter().collect();
    candidates.extend(work.live_paths().into_iter().filter(|&i| Some(i) != proven));
    work.ensure_reservation(own, &candidates)?;
    work.verify(own, Some(victim), true)
}

/// Tries each live path until one that is registered with our key carries the preemption;
/// returns the verdict and that path.
fn preempt_from_a_registered_path<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    victim: Key,
) -> Result<(Verdict, Option<usize>), Stop> {
    for index in work.live_paths() {
        match work.preempt(index, own, victim) {
            Ok(Preempted::Done) => return Ok((Verdict::VictimRemoved, Some(index))),
            Ok(Preempted::VictimGoneMeanwhile) => {
                work.notes.push(format!(
                    "victim key {victim} was removed by someone else meanwhile"
                ));
                return Ok((Verdict::AlreadyFenced, None));
            }
            Ok(Preempted::OwnKeyGone) => {
                return Err(Stop::fenced(format!(
                    "own key {own} was preempted while fencing {victim}: the victim fenced this \
                     node first. No other LU was touched"
                )));
            }
            Ok(Preempted::PathNotRegistered) => {
                let device = work.device(index);
                work.notes.push(format!(
                    "{device} is not registered with {own} (iSCSI re-login?); trying another path"
                ));
            }
            Err(stop) if work.is_dead_path(index) => {
                // The next path may work; the failure is in the path report.
                drop(stop);
            }
            Err(stop) => return Err(stop),
        }
    }
    Err(Stop::failed(format!(
        "no live path of this node is registered with {own} on this LU although the key is \
         present (orphaned registration after an iSCSI re-login?); `fence` never registers a key \
         (P3): run `prfence unfence --key {own}` on this node, then fence again"
    )))
}

/// After the arbiter: on an LU where our key is still registered, preempt the victim and
/// verify; where it is gone, stop as fenced and change nothing.
///
/// P3: `fence` never registers our key, here or on the arbiter. Our key is missing from an LU
/// only because someone preempted it (or this node was never unfenced there): after we won the
/// arbiter, a third node can fence us, all LUs of it verified and reported, while our fan-out is
/// still under way; registering here would bring our key back behind that node's fence (a
/// phantom write waiting to happen). A path of ours that lost its registration (an iSCSI
/// re-login) is left to `heal` and `unfence`, which register under their own rules.
pub(super) fn fence_follower<T: PrTransport>(
    target: &LuTarget<T>,
    own: Key,
    victim: Key,
) -> LuReport {
    let mut work = LuWork::new(target);
    let result = follower_steps(&mut work, own, victim);
    work.finish(result, FENCE_OK)
}

fn follower_steps<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    victim: Key,
) -> Result<Verdict, Stop> {
    let (_, state) = work.read_state()?;
    if !state.has(own) {
        return Err(Stop::fenced(format!(
            "own key {own} is not registered on this LU: another node fenced this node (or it \
             was never unfenced here); nothing was changed on this LU"
        )));
    }
    remove_victim(work, own, victim, &state)
}
