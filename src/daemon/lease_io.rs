//! The PR commands behind each [`LeaseAction`](super::lease::LeaseAction), on one LU's live
//! paths, and what they come to as a [`LeaseCompletion`]. Blocking, and generic over how a command
//! reaches a path ([`LeasePaths`]): the agent runs these on a blocking thread through its
//! bounded executor, the simulation through its gated devices, so both run the same commands.
//!
//! - Join: REGISTER AND IGNORE EXISTING KEY with the fresh key on every live path.
//! - Read reservation: READ RESERVATION on the first live path that answers.
//! - Renew: on every live path at once, REGISTER with the first of `from` the path accepts →
//!   `to`. A path that refuses every `from` key lost its registration (re-login) or was
//!   preempted; if no path took `to`, READ KEYS tells which (no `from` key left on the LU:
//!   preempted). Then READ RESERVATION: the lease holds only if it shows `to`.
//! - Preempt: READ KEYS, PREEMPT AND ABORT of each older key of the holder's node (a path a renew
//!   did not reach), then of the holder's key, on the first live path, which becomes the
//!   reservation holder's nexus. Reserve: RESERVE there.

use std::sync::Arc;

use prfence_engine::runtime::{self, Finished};

use super::failure::CommandFailure;
use super::lease::LeaseCompletion;
use crate::keys::LeaseKey;
use crate::pr::{Key, PrInAction, PrOut, PrOutAction, ReservationType};
use crate::transport::{Command, CommandError, ErrorKind, PrTransport};

/// One LU's live paths, as the lease commands reach them.
pub trait LeasePaths: Send + Sync + 'static {
    /// How many live paths there are (commands address them by index).
    fn live(&self) -> usize;
    /// Runs `f` on live path `index`, bounded; `command` names it for errors and metrics.
    fn run<T, F>(&self, index: usize, command: Command, f: F) -> Result<T, CommandError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn PrTransport) -> Result<T, CommandError> + Send + 'static;
    /// The error to report when no path is live.
    fn none(&self, command: Command) -> CommandError;
    /// The LU's name, for logs.
    fn lu(&self) -> &str;
}

/// Runs `f` on each live path in order until one answers; a conflict is the target's answer,
/// not a path problem, and is returned at once.
pub fn first_live<P, T, F>(paths: &P, command: Command, f: F) -> Result<T, CommandError>
where
    P: LeasePaths,
    T: Send + 'static,
    F: Fn(&dyn PrTransport) -> Result<T, CommandError> + Clone + Send + 'static,
{
    let mut last = None;
    for index in 0..paths.live() {
        match paths.run(index, command, f.clone()) {
            Ok(value) => return Ok(value),
            Err(e) if e.kind == ErrorKind::ReservationConflict => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| paths.none(command)))
}

pub fn read_reservation<P: LeasePaths>(paths: &P) -> Result<Option<Key>, CommandError> {
    first_live(paths, Command::PrIn(PrInAction::ReadReservation), |t| {
        t.read_reservation().map(|r| r.reservation.map(|r| r.key))
    })
}

/// Join: our fresh key on every live path (a fresh epoch was never preempted, P3).
pub fn join<P: LeasePaths>(paths: &P, key: Key) -> LeaseCompletion {
    if paths.live() == 0 {
        return LeaseCompletion::Join(Err(CommandFailure::Unreachable));
    }
    let mut result = Ok(());
    for index in 0..paths.live() {
        let done = paths.run(
            index,
            Command::PrOut(PrOutAction::RegisterAndIgnoreExistingKey),
            move |t| t.pr_out(&PrOut::register_ignore(key)),
        );
        if let Err(e) = done {
            tracing::warn!(lu = %paths.lu(), path = index, error = %e, "join: REGISTER failed");
            result = Err(CommandFailure::of(&e));
        }
    }
    LeaseCompletion::Join(result)
}

/// What a renew came to, and which live paths had none of our keys (re-login?).
pub struct Renewed {
    pub completion: LeaseCompletion,
    pub lost: Vec<usize>,
}

/// Renew: REGISTER from → to on every live path at once, then READ RESERVATION.
pub fn renew<P: LeasePaths>(paths: &Arc<P>, from: &[Key], to: Key) -> Renewed {
    let failed = |e| Renewed {
        completion: LeaseCompletion::Renew(Err(e)),
        lost: Vec::new(),
    };
    if paths.live() == 0 {
        return failed(CommandFailure::Unreachable);
    }
    let items: Vec<(Arc<P>, usize, Vec<Key>)> = (0..paths.live())
        .map(|index| (Arc::clone(paths), index, from.to_vec()))
        .collect();
    // Each REGISTER is bounded by the paths' own runner: the fan-out waits for them all.
    let until = runtime::now() + std::time::Duration::from_secs(24 * 3600);
    let answers = runtime::fan_out(
        &items,
        until,
        move |(paths, index, from)| {
            let from = from.clone();
            paths.run(*index, Command::PrOut(PrOutAction::Register), move |t| {
                for old in &from {
                    match t.pr_out(&PrOut::register(*old, to)) {
                        Ok(_) => return Ok(true),
                        Err(e) if e.kind == ErrorKind::ReservationConflict => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(false)
            })
        },
        &mut |_, _, _| {},
    );
    let (mut took, mut lost, mut failure) = (0usize, Vec::new(), None);
    for (index, answer) in answers.into_iter().enumerate() {
        match answer {
            Finished::Done {
                value: Ok(true), ..
            } => took += 1,
            Finished::Done {
                value: Ok(false), ..
            } => lost.push(index),
            Finished::Done { value: Err(e), .. } => {
                tracing::warn!(lu = %paths.lu(), path = index, error = %e, "renew: REGISTER failed");
                failure = Some(CommandFailure::of(&e));
            }
            Finished::TimedOut | Finished::Panicked | Finished::NotStarted(_) => {
                failure = Some(CommandFailure::Failed);
            }
        }
    }
    if took == 0 {
        if let Some(e) = failure {
            return failed(e);
        }
        // Every path refused every old key: preempted, or every path lost its registration.
        let keys = first_live(paths.as_ref(), Command::PrIn(PrInAction::ReadKeys), |t| {
            t.read_keys()
        });
        return failed(match keys {
            Ok(keys) if !keys.keys.iter().any(|k| from.contains(k) || *k == to) => {
                CommandFailure::Conflict
            }
            Ok(_) => {
                tracing::error!(lu = %paths.lu(), "renew: every path lost its registration while our key is still on the LU (re-login of every path?)");
                CommandFailure::Failed
            }
            Err(e) => CommandFailure::of(&e),
        });
    }
    if !lost.is_empty() {
        tracing::warn!(lu = %paths.lu(), paths = ?lost, "renew: paths without our registration (re-login?)");
    }
    if let Some(e) = failure {
        return Renewed {
            completion: LeaseCompletion::Renew(Err(e)),
            lost,
        };
    }
    Renewed {
        completion: LeaseCompletion::Renew(
            read_reservation(paths.as_ref()).map_err(|e| CommandFailure::of(&e)),
        ),
        lost,
    }
}

/// PREEMPT AND ABORT `victim` (the holder's key, unchanged for a lease) on the first live path.
pub fn preempt<P: LeasePaths>(
    paths: &P,
    own: Key,
    victim: Key,
    rtype: ReservationType,
) -> LeaseCompletion {
    tracing::warn!(lu = %paths.lu(), %victim, "the holder's key has not changed for a lease: preempting it");
    // Every other key of the holder's node first: an older epoch left on a path that a renew did
    // not reach (NOT READY, a lost answer). Left there, the holder's retry of that renew would
    // register the preempted key again on that path (P3; found by the simulation, seed 1544648).
    // Removed before the takeover, that retry is refused (its nexus is no longer registered).
    if let Err(e) = preempt_older_epochs(paths, own, victim, rtype) {
        return LeaseCompletion::Preempt(Err(CommandFailure::of(&e)));
    }
    let done = first_live(
        paths,
        Command::PrOut(PrOutAction::PreemptAndAbort),
        move |t| t.pr_out(&PrOut::preempt_and_abort(own, victim, rtype)),
    );
    LeaseCompletion::Preempt(done.map(|_| ()).map_err(|e| CommandFailure::of(&e)))
}

/// PREEMPT AND ABORT of each key of `victim`'s node other than `victim` itself, as READ KEYS
/// lists them. A key that is gone meanwhile (RESERVATION CONFLICT) is what was wanted.
fn preempt_older_epochs<P: LeasePaths>(
    paths: &P,
    own: Key,
    victim: Key,
    rtype: ReservationType,
) -> Result<(), CommandError> {
    let Some(node) = LeaseKey::decode(victim).map(LeaseKey::node) else {
        return Ok(());
    };
    let keys = first_live(paths, Command::PrIn(PrInAction::ReadKeys), |t| {
        t.read_keys()
    })?;
    let mut older: Vec<Key> = keys
        .keys
        .into_iter()
        .filter(|&k| k != victim && LeaseKey::decode(k).is_some_and(|l| l.node() == node))
        .collect();
    older.sort_unstable();
    older.dedup();
    for key in older {
        tracing::warn!(lu = %paths.lu(), %key, "preempting an older key of the holder's node");
        let done = first_live(
            paths,
            Command::PrOut(PrOutAction::PreemptAndAbort),
            move |t| t.pr_out(&PrOut::preempt_and_abort(own, key, rtype)),
        );
        match done {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::ReservationConflict => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// RESERVE on the first live path (no reservation for a lease).
pub fn reserve<P: LeasePaths>(paths: &P, own: Key, rtype: ReservationType) -> LeaseCompletion {
    tracing::info!(lu = %paths.lu(), "no reservation for a lease: reserving");
    let done = first_live(paths, Command::PrOut(PrOutAction::Reserve), move |t| {
        t.pr_out(&PrOut::reserve(own, rtype))
    });
    LeaseCompletion::Reserve(done.map(|_| ()).map_err(|e| CommandFailure::of(&e)))
}
