//! The PR commands behind each [`LeaseAction`](super::LeaseAction), on one LU's live
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
//! - Preempt: READ KEYS; a newer key of the holder's node (a renew the standby has not seen)
//!   ends it as a lost CAS. Otherwise PREEMPT AND ABORT of each older key of the holder's node (a
//!   path a renew did not reach), then of the holder's key, on the first live path, which becomes
//!   the reservation holder's nexus. Reserve: RESERVE there.

use std::sync::Arc;

use prfence_engine::runtime::{self, Finished};

use super::LeaseCompletion;
use crate::daemon::failure::CommandFailure;
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
    match preempt_older_epochs(paths, own, victim, rtype) {
        Ok(Sweep::Done) => {}
        // The holder renewed since the standby last looked: its lease runs from that renew, so
        // this is the CAS lost, as if the PREEMPT of `victim` had found it gone.
        Ok(Sweep::HolderRenewed(newer)) => {
            tracing::info!(lu = %paths.lu(), %victim, %newer, "the holder renewed since it was last seen: not taking over");
            return LeaseCompletion::Preempt(Err(CommandFailure::Conflict));
        }
        Err(e) => return LeaseCompletion::Preempt(Err(CommandFailure::of(&e))),
    }
    let done = first_live(
        paths,
        Command::PrOut(PrOutAction::PreemptAndAbort),
        move |t| t.pr_out(&PrOut::preempt_and_abort(own, victim, rtype)),
    );
    LeaseCompletion::Preempt(done.map(|_| ()).map_err(|e| CommandFailure::of(&e)))
}

/// What the sweep before a takeover found.
#[derive(Debug, PartialEq, Eq)]
enum Sweep {
    /// Every older key of the holder's node is gone (or there was none).
    Done,
    /// A key of the holder's node newer than the victim is registered: a renew landed after
    /// the standby's last read.
    HolderRenewed(Key),
}

/// PREEMPT AND ABORT of each key of `victim`'s node with an older epoch than `victim`, as READ
/// KEYS lists them; nothing if a newer one is listed (epochs only grow, so it is a renew the
/// standby has not seen, and preempting it would take the LU from a holder inside its lease).
/// A key that is gone meanwhile (RESERVATION CONFLICT) is what was wanted.
fn preempt_older_epochs<P: LeasePaths>(
    paths: &P,
    own: Key,
    victim: Key,
    rtype: ReservationType,
) -> Result<Sweep, CommandError> {
    let Some(victim_lease) = LeaseKey::decode(victim) else {
        return Ok(Sweep::Done);
    };
    let keys = first_live(paths, Command::PrIn(PrInAction::ReadKeys), |t| {
        t.read_keys()
    })?;
    let of_holder: Vec<(LeaseKey, Key)> = keys
        .keys
        .into_iter()
        .filter_map(|k| LeaseKey::decode(k).map(|l| (l, k)))
        .filter(|(l, _)| l.node() == victim_lease.node())
        .collect();
    if let Some((_, newer)) = of_holder
        .iter()
        .find(|(l, _)| l.epoch() > victim_lease.epoch())
    {
        return Ok(Sweep::HolderRenewed(*newer));
    }
    let mut older: Vec<Key> = of_holder
        .into_iter()
        .filter(|(l, _)| l.epoch() < victim_lease.epoch())
        .map(|(_, k)| k)
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
    Ok(Sweep::Done)
}

/// RESERVE on the first live path (no reservation for a lease).
pub fn reserve<P: LeasePaths>(paths: &P, own: Key, rtype: ReservationType) -> LeaseCompletion {
    tracing::info!(lu = %paths.lu(), "no reservation for a lease: reserving");
    let done = first_live(paths, Command::PrOut(PrOutAction::Reserve), move |t| {
        t.pr_out(&PrOut::reserve(own, rtype))
    });
    LeaseCompletion::Reserve(done.map(|_| ()).map_err(|e| CommandFailure::of(&e)))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::exec::ScsiPr;
    use crate::spc_model::{ModelDevice, ModelLu, Nexus, Quirks, iscsi_initiator};
    use crate::transport::Policy;

    const TYPE: ReservationType = ReservationType::WriteExclusiveRegistrantsOnly;

    fn key(node: u16, epoch: u64) -> Key {
        LeaseKey::new(std::num::NonZeroU16::new(node).unwrap(), epoch)
            .unwrap()
            .key()
    }

    /// One path per node to one modelled LIO LU.
    struct Model {
        lu: Arc<Mutex<ModelLu>>,
        path: ScsiPr<ModelDevice>,
    }

    impl LeasePaths for Model {
        fn live(&self) -> usize {
            1
        }
        fn run<T, F>(&self, _index: usize, _command: Command, f: F) -> Result<T, CommandError>
        where
            T: Send + 'static,
            F: FnOnce(&dyn PrTransport) -> Result<T, CommandError> + Send + 'static,
        {
            f(&self.path)
        }
        fn none(&self, command: Command) -> CommandError {
            CommandError::without_completion(
                std::path::Path::new("lu0"),
                command,
                ErrorKind::Open,
                "no path",
            )
        }
        fn lu(&self) -> &str {
            "lu0"
        }
    }

    fn node(lu: &Arc<Mutex<ModelLu>>, name: &str) -> (Nexus, Model) {
        let nexus = lu.lock().unwrap().connect(iscsi_initiator(name, "0x1"), 1);
        let device = ModelDevice::new(Arc::clone(lu), nexus, format!("/dev/{name}"));
        let path = ScsiPr::new(device, Policy::default());
        (
            nexus,
            Model {
                lu: Arc::clone(lu),
                path,
            },
        )
    }

    /// The lab's flaky round: the holder's renew 1:5 -> 1:6 lands after the standby last read
    /// the reservation (1:5), before its takeover. The sweep must not preempt 1:6 as an "other
    /// key of the holder's node": the holder's lease runs from that renew. The takeover ends as
    /// a lost CAS and the holder keeps the LU.
    #[test]
    fn a_renew_the_standby_has_not_seen_stops_the_takeover() {
        let lu = Arc::new(Mutex::new(ModelLu::new(Quirks::lio())));
        let (holder, _) = node(&lu, "node1");
        let (standby, paths) = node(&lu, "node2");
        {
            let mut lu = lu.lock().unwrap();
            lu.pr_out(holder, &PrOut::register_ignore(key(1, 5)))
                .unwrap();
            lu.pr_out(holder, &PrOut::reserve(key(1, 5), TYPE)).unwrap();
            lu.pr_out(standby, &PrOut::register_ignore(key(2, 100)))
                .unwrap();
            // The renew the standby has not seen.
            lu.pr_out(holder, &PrOut::register(key(1, 5), key(1, 6)))
                .unwrap();
        }
        let done = preempt(&paths, key(2, 100), key(1, 5), TYPE);
        assert_eq!(
            done,
            LeaseCompletion::Preempt(Err(CommandFailure::Conflict))
        );
        let lu = paths.lu.lock().unwrap();
        assert_eq!(lu.registered_key(holder), Some(key(1, 6)));
        assert!(
            lu.is_holder(holder),
            "the holder inside its lease lost the LU"
        );
    }

    /// An older epoch left on a path stays swept before the takeover (P3), and the takeover
    /// goes through.
    #[test]
    fn an_older_epoch_is_swept_and_the_stale_holder_preempted() {
        let lu = Arc::new(Mutex::new(ModelLu::new(Quirks::lio())));
        let (holder, _) = node(&lu, "node1");
        let (holder_second_path, _) = node(&lu, "node1b");
        let (standby, paths) = node(&lu, "node2");
        {
            let mut lu = lu.lock().unwrap();
            lu.pr_out(holder, &PrOut::register_ignore(key(1, 5)))
                .unwrap();
            lu.pr_out(holder, &PrOut::reserve(key(1, 5), TYPE)).unwrap();
            // A path the last renew did not reach still carries epoch 4.
            lu.pr_out(holder_second_path, &PrOut::register_ignore(key(1, 4)))
                .unwrap();
            lu.pr_out(standby, &PrOut::register_ignore(key(2, 100)))
                .unwrap();
        }
        let done = preempt(&paths, key(2, 100), key(1, 5), TYPE);
        assert_eq!(done, LeaseCompletion::Preempt(Ok(())));
        let lu = paths.lu.lock().unwrap();
        assert_eq!(lu.registered_key(holder), None);
        assert_eq!(lu.registered_key(holder_second_path), None);
        assert!(lu.is_holder(standby));
    }
}
