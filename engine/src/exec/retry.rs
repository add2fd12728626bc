//! The NOT READY rule, one home for both transports (it is a safety rule, so it is written once).
//!
//! NOT READY (SCSI's sense key, NVMe's NAMESPACE NOT READY) is transient: the command is sent
//! again after a backoff that doubles, at most [`Policy::not_ready_retries`] times. But a PR OUT
//! answered NOT READY may have been applied anyway (LIO does this), so before every retry the
//! target is re-read, and the command counts as done when its effect is already visible
//! ([`effect_visible`]): a blind retry could conflict with our own change (a second unregister of
//! a key the first one removed, a REGISTER whose old key is gone). A PR IN cannot have applied
//! anything: its re-read is `Ok(false)`.

use std::path::Path;

use crate::pr::{PrOut, PrOutAction, ReadKeys, ReadReservation};
use crate::transport::{Command, CommandError, Policy};

/// What one attempt of a command came to, as the rule sees it.
pub(crate) enum Step<T, N> {
    /// The command completed.
    Done(T),
    /// Send it again at once (a consumed unit attention; the attempt bounds those itself).
    Again,
    /// NOT READY, with what the transport said (for the error when the retries run out).
    NotReady(N),
    Failed(CommandError),
}

/// How a command run under the rule ended.
pub(crate) enum Retried<T> {
    Completed(T),
    /// Answered NOT READY, and the re-read showed its effect applied.
    AlreadyApplied,
}

/// Runs `attempt` until it completes or fails, under the NOT READY rule: on NOT READY, asks
/// `applied` whether the command already took effect (done if so), else sleeps the backoff and
/// tries again, and gives up with `exhausted` after the policy's retries. `context` is lent to
/// both (the SCSI transport collects the unit attentions either consumes in it).
pub(crate) fn retry_not_ready<C, T, N>(
    policy: &Policy,
    device: &Path,
    command: Command,
    context: &mut C,
    mut attempt: impl FnMut(&mut C) -> Step<T, N>,
    mut applied: impl FnMut(&mut C) -> Result<bool, CommandError>,
    exhausted: impl FnOnce(N) -> CommandError,
) -> Result<Retried<T>, CommandError> {
    let mut not_ready = 0;
    let mut backoff = policy.not_ready_backoff;
    loop {
        match attempt(context) {
            Step::Done(value) => return Ok(Retried::Completed(value)),
            Step::Again => {}
            Step::Failed(e) => return Err(e),
            Step::NotReady(what) => {
                if applied(context)? {
                    return Ok(Retried::AlreadyApplied);
                }
                not_ready += 1;
                if not_ready > policy.not_ready_retries {
                    return Err(exhausted(what));
                }
                tracing::debug!(device = %device.display(), %command, ?backoff, "not ready; retrying");
                crate::runtime::sleep(backoff);
                backoff = backoff.saturating_mul(2);
            }
        }
    }
}

/// Whether the target's state already shows what `request` asked for. Used only to decide that a
/// PR OUT answered NOT READY need not be retried; it looks at the LU as a whole (READ KEYS does
/// not say which nexus holds a key), so it errs on the side of "retry".
pub fn effect_visible(request: &PrOut, keys: &ReadKeys, reservation: &ReadReservation) -> bool {
    let holds = |key| {
        reservation
            .reservation
            .as_ref()
            .is_some_and(|r| r.key == key && Some(r.rtype) == request.rtype)
    };
    match request.action {
        PrOutAction::Register | PrOutAction::RegisterAndIgnoreExistingKey => {
            if request.sa_key.is_zero() {
                !keys.keys.contains(&request.key)
            } else {
                keys.keys.contains(&request.sa_key)
            }
        }
        PrOutAction::Reserve => holds(request.key),
        PrOutAction::Release => reservation
            .reservation
            .as_ref()
            .is_none_or(|r| r.key != request.key),
        PrOutAction::Clear => keys.keys.is_empty() && reservation.reservation.is_none(),
        PrOutAction::Preempt | PrOutAction::PreemptAndAbort => {
            request.sa_key != request.key
                && !request.sa_key.is_zero()
                && !keys.keys.contains(&request.sa_key)
                && keys.keys.contains(&request.key)
        }
        PrOutAction::RegisterAndMove => {
            keys.keys.contains(&request.sa_key) && holds(request.sa_key)
        }
    }
}
