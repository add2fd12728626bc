//! unfence: register our key on every path, create a reservation where none exists, verify.

use crate::pr::Key;
use crate::transport::PrTransport;

use super::fence::register_everywhere;
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
