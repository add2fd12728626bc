//! Who survives a fence (P2): the LUs that decide, and the one rule that reads their verdicts.
//!
//! By default the arbiter, the first LU by identifier, decides alone. With coordinators (issue
//! 47: an odd set of small LUs in separate failure domains, as Veritas VxFEN's coordinator
//! disks), a majority of them decides, so that a fence still wins when one array is lost
//! together with the node to fence. A single arbiter is the set of one, whose majority is one:
//! both go through [`race`].

use crate::discover::LuId;
use crate::transport::PrTransport;

use super::{LuReport, LuTarget, RequestError, Verdict};

/// The LUs that decide who survives a fence.
pub enum Arbitration<T> {
    /// The first LU by identifier, alone and before any other LU is touched.
    FirstLu,
    /// An odd set of coordinator LUs (3 or 5), apart from the data LUs: a fence wins with its
    /// own key present and its victim's gone on a majority of them.
    Coordinators {
        lus: Vec<LuTarget<T>>,
        unreachable_data: UnreachableData,
    },
}

/// What a fence that won the coordinators does with a data LU no path of this node answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnreachableData {
    /// The fence fails naming it (P1 is promised for every data LU given): the default.
    #[default]
    Fail,
    /// The admin's opt-in, for an array known to be down, not partitioned: the fence succeeds
    /// with every data LU it reaches fenced (at least one), and reports each unreachable one as
    /// not fenced. The victim's key stays there: P1 holds on the LUs reported fenced only, and
    /// on the others rests on the victim stopping (its agent self-fences on a majority of the
    /// coordinators lost). docs/concepts.md, "Coordinator LUs".
    Report,
}

impl std::str::FromStr for UnreachableData {
    type Err = String;

    /// The one spelling, for `prfence fence --unreachable-data` and fence_pr's
    /// `unreachable_data`: `fail` or `report`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "fail" => Ok(UnreachableData::Fail),
            "report" => Ok(UnreachableData::Report),
            other => Err(format!("{other:?} is neither fail nor report")),
        }
    }
}

/// The smallest and largest coordinator sets: three survive the loss of one failure domain, five
/// of two; more only lengthen every fence's race.
pub const COORDINATORS: std::ops::RangeInclusive<usize> = 3..=5;

/// What the deciders' verdicts say, after every decider has been fenced by this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Race {
    /// Own key present and the victim's gone on `won` of `of` deciders, a majority.
    Won { won: usize, of: usize },
    /// Own key gone from `gone` of `of`, a majority: another node fenced this one (or it was
    /// never unfenced there). It can no longer win, whatever the other deciders say.
    Lost { gone: usize, of: usize },
    /// Neither: `won` of `of` (unreachable or failed deciders count as not won). Nothing else may
    /// be touched; a rerun may still win.
    Undecided { won: usize, gone: usize, of: usize },
}

/// Whether `count` coordinators make a set: odd, so that two majorities always share one, and
/// within [`COORDINATORS`].
pub fn coordinator_count_ok(count: usize) -> bool {
    COORDINATORS.contains(&count) && !count.is_multiple_of(2)
}

/// The majority of `of` deciders.
pub fn majority(of: usize) -> usize {
    of / 2 + 1
}

/// P2, the one rule for both arbitrations: a node wins only where its own key is still
/// registered and its victim's is gone ([`Verdict::VictimRemoved`] or [`Verdict::AlreadyFenced`],
/// a report that is `ok`), and wins the fence only on a majority of all the deciders; an
/// unreachable decider counts as lost. On each decider the target serialises the PREEMPTs, so of
/// two nodes fencing each other at most one is left registered there; two majorities of one set
/// share a decider; so two nodes never both win, unless the victim's key came back on that
/// decider, which only an explicit unfence does (P3).
pub fn race(reports: &[LuReport]) -> Race {
    let of = reports.len();
    let won = reports.iter().filter(|r| r.ok).count();
    let gone = reports
        .iter()
        .filter(|r| r.verdict == Verdict::ThisNodeFenced)
        .count();
    if of > 0 && won >= majority(of) {
        Race::Won { won, of }
    } else if of > 0 && gone >= majority(of) {
        Race::Lost { gone, of }
    } else {
        Race::Undecided { won, gone, of }
    }
}

/// The coordinators as a fence needs them, checked against the data LUs (both normalised: sorted
/// by identifier, paths to one LU merged): an odd number within [`COORDINATORS`], none of them a
/// data LU. One not identified here (its device gone with its array) is still counted: the fence
/// counts it as lost and sends it nothing, so a majority is never easier to reach than on the
/// set every node names.
pub fn check_coordinators<T: PrTransport>(
    coordinators: &[LuTarget<T>],
    data: &[&LuId],
) -> Result<(), RequestError> {
    let count = coordinators.len();
    if !coordinator_count_ok(count) {
        return Err(RequestError::CoordinatorCount { count });
    }
    let is_data = |id: &LuId| data.contains(&id);
    if let Some(lu) = coordinators.iter().find(|c| is_data(&c.id)) {
        return Err(RequestError::CoordinatorIsData { lu: lu.id.clone() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(verdict: Verdict) -> LuReport {
        let mut r = LuReport::bare(&LuId::from("naa.1".to_owned()), &[], verdict, None);
        r.ok = matches!(verdict, Verdict::VictimRemoved | Verdict::AlreadyFenced);
        r
    }

    #[test]
    fn a_majority_of_all_the_deciders_wins_and_unreachable_ones_count_as_lost() {
        use Verdict::{
            AlreadyFenced as Gone, Failed, ThisNodeFenced as Us, TimedOut, VictimRemoved as Won,
        };
        let race_of = |v: &[Verdict]| race(&v.iter().map(|&v| report(v)).collect::<Vec<_>>());
        assert_eq!(race_of(&[Won]), Race::Won { won: 1, of: 1 });
        assert_eq!(race_of(&[Us]), Race::Lost { gone: 1, of: 1 });
        assert_eq!(
            race_of(&[TimedOut]),
            Race::Undecided {
                won: 0,
                gone: 0,
                of: 1
            }
        );
        assert_eq!(race_of(&[Won, Gone, Us]), Race::Won { won: 2, of: 3 });
        assert_eq!(
            race_of(&[Won, TimedOut, Us]),
            Race::Undecided {
                won: 1,
                gone: 1,
                of: 3
            }
        );
        assert_eq!(race_of(&[Us, TimedOut, Us]), Race::Lost { gone: 2, of: 3 });
        assert_eq!(
            race_of(&[Won, Won, Failed, TimedOut, Us]),
            Race::Undecided {
                won: 2,
                gone: 1,
                of: 5
            }
        );
        assert_eq!(
            race_of(&[Won, Won, Won, TimedOut, Us]),
            Race::Won { won: 3, of: 5 }
        );
        assert_eq!(
            race_of(&[]),
            Race::Undecided {
                won: 0,
                gone: 0,
                of: 0
            }
        );
    }

    #[test]
    fn two_nodes_never_both_win_a_set_they_both_reached() {
        // Each decider has one survivor of the two; every way to share them out.
        for of in [1usize, 3, 5] {
            for a_wins in 0u32..(1 << of) {
                let verdicts = |a: bool| -> Vec<LuReport> {
                    (0..of)
                        .map(|i| {
                            let a_here = a_wins & (1 << i) != 0;
                            report(if a_here == a {
                                Verdict::VictimRemoved
                            } else {
                                Verdict::ThisNodeFenced
                            })
                        })
                        .collect()
                };
                let (a, b) = (race(&verdicts(true)), race(&verdicts(false)));
                assert!(
                    matches!(a, Race::Won { .. }) != matches!(b, Race::Won { .. }),
                    "{of} deciders, A's {a_wins:b}: {a:?} {b:?}"
                );
            }
        }
    }
}
