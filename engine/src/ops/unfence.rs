//! unfence: register our key on every path, create a reservation where none exists, verify.

use crate::pr::{Key, PrOut};
use crate::transport::PrTransport;

use super::heal::purge_orphans;
use super::lu::{LuWork, Stop};
use super::{LuReport, LuTarget, Verdict};

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
            Some(e) => Stop::failed(format!("could not register {own} on any path: {e}")),
            None => Stop::failed("every path is dead"),
        });
    }
    Ok(registered)
}
