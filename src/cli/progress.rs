//! Progress of `fence`, `unfence` and `status` on a terminal: one line per LU on stderr as it
//! finishes, so an admin watching a fence over hundreds of LUNs sees it move. stdout (the report,
//! pinned by the output tests) is never touched.

use std::fmt::Write as _;
use std::io::Write as _;

use crate::ops::LuDone;

/// The one decision whether to show progress: only to a person watching stderr, and never when
/// the output is for a program (`--json`).
pub(super) fn show_progress(stderr_is_terminal: bool, json: bool) -> bool {
    stderr_is_terminal && !json
}

/// `[  3/200] naa.6001405…: victim removed (0.41 s)`; the count is padded to the total's width so
/// the lines align, the arbiter says so, and a LU that never ran (skipped) has no time.
pub(super) fn progress_line(done: &LuDone<'_>) -> String {
    let width = done.total.to_string().len();
    let mut line = format!("[{:>width$}/{}] {}", done.done, done.total, done.report.lu);
    if done.arbiter {
        line.push_str(" (arbiter)");
    }
    let _ = write!(line, ": {}", done.report.verdict);
    if let Some(took) = done.took {
        let _ = write!(line, " ({:.2} s)", took.as_secs_f64());
    }
    line
}

/// Prints one progress line. A write error is ignored: progress is a courtesy, and failing
/// (eprintln! panics) would stop a fence midway.
pub(super) fn print_progress(done: &LuDone<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{}", progress_line(done));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ops::{LuReport, Verdict};

    fn report(lu: &str, verdict: Verdict) -> LuReport {
        LuReport {
            lu: lu.into(),
            ok: true,
            verdict,
            paths: Vec::new(),
            keys: None,
            reservation: None,
            generation: None,
            notes: Vec::new(),
            error: None,
        }
    }

    fn line(
        lu: &str,
        verdict: Verdict,
        (done, total): (usize, usize),
        arbiter: bool,
        took: Option<Duration>,
    ) -> String {
        progress_line(&LuDone {
            report: &report(lu, verdict),
            done,
            total,
            arbiter,
            took,
        })
    }

    #[test]
    fn progress_only_on_a_terminal_and_never_with_json() {
        assert!(show_progress(true, false));
        assert!(!show_progress(true, true));
        assert!(!show_progress(false, false));
        assert!(!show_progress(false, true));
    }

    #[test]
    fn a_progress_line_counts_names_the_lu_and_says_what_became_of_it() {
        let id = "naa.6001405a1b2c3d4e5f60718293a4b5c";
        assert_eq!(
            line(
                id,
                Verdict::VictimRemoved,
                (1, 16),
                true,
                Some(Duration::from_millis(412))
            ),
            "[ 1/16] naa.6001405a1b2c3d4e5f60718293a4b5c (arbiter): victim removed (0.41 s)"
        );
        assert_eq!(
            line(
                id,
                Verdict::AlreadyFenced,
                (12, 16),
                false,
                Some(Duration::from_millis(7))
            ),
            "[12/16] naa.6001405a1b2c3d4e5f60718293a4b5c: victim already fenced (0.01 s)"
        );
        assert_eq!(
            line(
                "/dev/sdq",
                Verdict::TimedOut,
                (200, 200),
                false,
                Some(Duration::from_secs(50))
            ),
            "[200/200] /dev/sdq: timed out (50.00 s)"
        );
        assert_eq!(
            line(id, Verdict::Skipped, (3, 3), false, None),
            "[3/3] naa.6001405a1b2c3d4e5f60718293a4b5c: skipped"
        );
        assert_eq!(
            line(
                id,
                Verdict::NotRegistered,
                (1, 1),
                false,
                Some(Duration::ZERO)
            ),
            "[1/1] naa.6001405a1b2c3d4e5f60718293a4b5c: not registered (0.00 s)"
        );
    }
}
