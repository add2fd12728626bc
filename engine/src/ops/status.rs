//! status: is our key registered on this LU? Reads only.

use crate::pr::Key;
use crate::transport::PrTransport;

use super::lu::{LuWork, Stop};
use super::{LuReport, LuTarget, Verdict};

pub(super) fn status_lu<T: PrTransport>(target: &LuTarget<T>, own: Key) -> LuReport {
    let mut work = LuWork::new(target);
    let result = steps(&mut work, own);
    work.finish(result, &[Verdict::Registered])
}

fn steps<T: PrTransport>(work: &mut LuWork<'_, T>, own: Key) -> Result<Verdict, Stop> {
    // Every path is asked, so a dead one shows up in the report.
    let mut answer = None;
    let mut first_error = None;
    for index in 0..work.target.paths.len() {
        match work.on(index, |p| p.read_keys()) {
            Ok(keys) => {
                answer.get_or_insert((index, keys));
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let Some((index, keys)) = answer else {
        return Err(match first_error {
            Some(e) => e.into(),
            None => Stop::failed("the LU has no paths"),
        });
    };
    work.reservation = Some(work.on(index, |p| p.read_reservation())?);
    let present = keys.keys.contains(&own);
    work.keys = Some(keys);
    Ok(if present {
        Verdict::Registered
    } else {
        Verdict::NotRegistered
    })
}
