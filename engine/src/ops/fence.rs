//! fence: remove the victim's key from every LU, the arbiter first and alone.

use std::time::Duration;

use crate::pr::{Key, PrOut};
use crate::transport::PrTransport;

use super::lu::{LuWork, Preempted, Stop};
use super::{LuReport, LuTarget, Verdict};

const FENCE_OK: &[Verdict] = &[Verdict::VictimRemoved, Verdict::AlreadyFenced];

/// P2: the single decision of who survives. The arbiter (first LU by identifier) is fenced alone:
/// the target serialises PREEMPTs, so of two nodes preempting each other exactly one finds its own
/// key still present here. A node whose key is absent touches nothing, anywhere (P2, P3): our key
/// is never registered on the arbiter by `fence`, because a loser that re-registered itself here
/// could then preempt the winner.
///
/// A mutual fence must not send two PREEMPTs to the arbiter at once (they can lock up LIO, see
/// [`super::TIE_BREAK`]): while both keys are registered, the node with the greater key waits
/// `tie_break` and reads again before it preempts.
pub(super) fn fence_arbiter<T: PrTransport>(
    target: &LuTarget<T>,
    own: Key,
    victim: Key,
    tie_break: Duration,
) -> LuReport {
    let mut work = LuWork::new(target);
    let result = arbiter_steps(&mut work, own, victim, tie_break);
    work.finish(result, FENCE_OK)
}

fn arbiter_steps<T: PrTransport>(
    work: &mut LuWork<'_, T>,
    own: Key,
    victim: Key,
    tie_break: Duration,
) -> Result<Verdict, Stop> {
    let (mut index, mut keys) = work.read_keys_any()?;
    if keys.keys.contains(&own)
        && keys.keys.contains(&victim)
        && own > victim
        && !tie_break.is_zero()
    {
        work.notes.push(format!(
            "both keys registered on the arbiter: waited {} s for {victim} (the smaller key) to \
             fence first, then read the keys again (tie-break)",
            tie_break.as_secs_f64()
        ));
        crate::runtime::sleep(tie_break);
        (index, keys) = work.read_keys_any()?;
    }
    if !keys.keys.contains(&own) {
        work.note_reservation(index);
        return Err(Stop::fenced(format!(
            "own key {own} is not registered on the arbiter LU: this node was fenced (it lost the \
             race, or was preempted earlier); if this node was never registered, run `prfence \
             unfence` first. No LU was touched"
        )));
    }
    let (verdict, proven) = if keys.keys.contains(&victim) {
        preempt_from_a_registered_path(work, own, victim)?
    } else {
        work.notes.push(format!(
            "victim key {victim} was not registered (P4: already fenced)"
        ));
        (Verdict::AlreadyFenced, None)
    };
    // Only paths registered with our key can reserve. The one the preemption went through is
    // proven registered; the others are tried after it (an unregistered one is refused without
    // effect, but LIO refuses with NOT READY, which costs the policy's retries).
    let mut candidates: Vec<usize> = proven.into_iter().collect();
    candidates.extend(work.live_paths().into_iter().filter(|&i| Some(i) != proven));
    work.ensure_reservation(own, &candidates)?;
    work.verify(own, Some(victim), true)?;
    Ok(verdict)
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
         present (orphaned registration after an iSCSI re-login?); `fence` never registers on the \
         arbiter: run `prfence unfence --key {own}` on this node, then fence again"
    )))
}

/// After the arbiter: make sure our key is registered on every path, preempt the victim, verify.
///
/// Registering our key here is not a P3 violation: on this LU our key can only have been
/// preempted by a node that won the arbiter against us, and that node preempted our key on the
/// arbiter first, where we just found it present. The remaining window (someone fences us after
/// our arbiter step) is closed by re-checking the arbiter after the fan-out and withdrawing
/// (see `drive::fence`).
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
    let registered = register_everywhere(work, own)?;
    let (_, keys) = work.read_keys_any()?;
    let mut verdict = Verdict::AlreadyFenced;
    if keys.keys.contains(&victim) {
        verdict = Verdict::Failed;
        for &index in &registered {
            match work.preempt(index, own, victim) {
                Ok(Preempted::Done) => verdict = Verdict::VictimRemoved,
                Ok(Preempted::VictimGoneMeanwhile) => verdict = Verdict::AlreadyFenced,
                Ok(Preempted::OwnKeyGone) => {
                    return Err(Stop::fenced(format!(
                        "own key {own} was preempted on this LU while fencing {victim}"
                    )));
                }
                Ok(Preempted::PathNotRegistered) => continue,
                Err(_) if work.is_dead_path(index) => continue,
                Err(stop) => return Err(stop),
            }
            break;
        }
        if verdict == Verdict::Failed {
            return Err(Stop::failed(format!(
                "could not preempt {victim} through any registered path"
            )));
        }
    } else {
        work.notes.push(format!(
            "victim key {victim} was not registered (P4: already fenced)"
        ));
    }
    work.ensure_reservation(own, &registered)?;
    work.verify(own, Some(victim), true)?;
    Ok(verdict)
}

/// REGISTER AND IGNORE EXISTING KEY on every live path; returns the paths now registered.
/// Callers must have proof that registering is allowed (P3): unfence by being explicit, a
/// fence follower by the arbiter's decision.
pub(super) fn register_everywhere<T: PrTransport>(
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
            Some(e) => Stop::failed(format!("could not register {own} on any path: {e}")),
            None => Stop::failed("every path is dead"),
        });
    }
    Ok(registered)
}
