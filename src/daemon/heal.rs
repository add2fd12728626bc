//! The heal both modes run when an LU's registrations need it: [`heal_lu`] runs `ops::heal` on
//! the LU's live paths through the executor (one heal per LU at a time), [`report_heal`] logs and
//! counts what it did.

use std::sync::Mutex;

use super::executor::Executor;
use super::lock;
use super::lu_table::PathHandle;
use super::metrics::Metrics;
use crate::discover::LuId;
use crate::ops;
use crate::pr::Key;

/// Heals one LU's registrations with `ops::heal`: it probes every path, purges stale
/// registrations of earlier sessions where one atomic command can, and names the paths without
/// a registration, which only `prfence unfence` registers (P3). Runs on
/// the LU's live paths; bounded by a few command timeouts per path.
pub(super) async fn heal_lu(
    exec: &Executor,
    lu_id: LuId,
    paths: &[PathHandle],
    key: Key,
) -> Result<ops::LuReport, String> {
    // One heal per LU at a time: a heal cut off by its deadline may still have a command in the
    // kernel, and two heals on one LU would race their own REGISTERs.
    let Some(guard) = exec.begin_heal(&lu_id) else {
        return Err("the previous heal of this LU has not finished yet".to_owned());
    };
    let live: Vec<PathHandle> = paths.iter().filter(|p| p.spec.live).cloned().collect();
    let opened = exec.open_paths(&live, guard).await;
    if opened.is_empty() {
        return Err("no live path could be opened".to_owned());
    }
    let per_path = u32::try_from(opened.len()).unwrap_or(u32::MAX);
    let limits = ops::Limits {
        deadline: exec
            .timeout()
            .saturating_mul(per_path.saturating_mul(3).saturating_add(4)),
        ..ops::Limits::default()
    };
    let lus = vec![ops::LuTarget {
        id: lu_id,
        paths: opened,
    }];
    // The engine blocks until the heal is done or its deadline passed.
    let report = tokio::task::spawn_blocking(move || ops::heal(lus, key, limits))
        .await
        .map_err(|e| format!("the heal's thread failed: {e}"))?
        .map_err(|e| e.to_string())?
        // The engine's failures in the agent's words, as they are logged and counted here.
        .advised(crate::hints::node_agent);
    report
        .lus
        .into_iter()
        .next()
        .ok_or_else(|| "the heal reported no LU".to_owned())
}

/// The report's notes, as one log field.
fn notes(report: &ops::LuReport) -> String {
    let notes: Vec<String> = report.notes.iter().map(ToString::to_string).collect();
    notes.join("; ")
}

/// The report's error, or `otherwise`.
fn error_or(report: &ops::LuReport, otherwise: &str) -> String {
    report
        .error
        .as_ref()
        .map_or_else(|| otherwise.to_owned(), ToString::to_string)
}

/// Logs a heal's result and counts it.
pub(super) fn report_heal(
    lu: &str,
    result: &Result<ops::LuReport, String>,
    metrics: &Mutex<Metrics>,
) {
    match result {
        Ok(report) => match report.verdict {
            ops::Verdict::Healed => {
                lock(metrics).record_heal(lu);
                tracing::warn!(%lu, notes = %notes(report), "registrations healed");
            }
            ops::Verdict::Intact => tracing::info!(%lu, "registrations intact"),
            ops::Verdict::PathsUnregistered => {
                if report
                    .notes
                    .iter()
                    .any(|n| n.to_string().starts_with("purged"))
                {
                    lock(metrics).record_heal(lu);
                }
                tracing::warn!(
                    %lu, error = %error_or(report, "-"),
                    notes = %notes(report),
                    "paths without our registration: run `prfence unfence` on this node"
                );
            }
            ops::Verdict::ThisNodeFenced => tracing::error!(
                %lu, error = %error_or(report, "our key is gone"),
                "heal found our key preempted; nothing re-registered (P3)"
            ),
            verdict => tracing::error!(
                %lu, %verdict, error = %error_or(report, "-"), "heal failed"
            ),
        },
        Err(e) => tracing::error!(%lu, error = %e, "heal failed"),
    }
}
