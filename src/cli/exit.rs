//! The admin command's exit status, and its JSON reports with the status in them.

use serde::Serialize;

use crate::transport::{CommandError, ErrorKind};

/// The process exit status of an admin command (see `args::EXIT_STATUS_HELP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Success,
    Failure,
    Usage,
    OnlyConflicts,
    /// status: the key is registered on no LU (fence_scsi's "off").
    Off,
    /// fence: this node's key is gone from the arbiter LU.
    ThisNodeFenced,
    /// `prfence agent`'s own status (see `daemon::agent`), e.g. self_fence.exit_status.
    Agent(u8),
}

impl ExitStatus {
    /// The process exit code. `Off` shares 2 with `Usage`, as fence-agents' status does.
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Failure => 1,
            ExitStatus::Usage | ExitStatus::Off => 2,
            ExitStatus::OnlyConflicts => 3,
            ExitStatus::ThisNodeFenced => 4,
            ExitStatus::Agent(code) => code,
        }
    }

    /// The overall status of per-device results.
    pub fn of<T>(results: &[Result<T, CommandError>]) -> ExitStatus {
        let mut kinds = results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .map(|e| e.kind)
            .peekable();
        if kinds.peek().is_none() {
            ExitStatus::Success
        } else if kinds.all(|k| k == ErrorKind::ReservationConflict) {
            ExitStatus::OnlyConflicts
        } else {
            ExitStatus::Failure
        }
    }
}

/// `body` as JSON with the command's `exit_status` added beside its fields, so a script reading
/// the report sees the process's status too (fence, unfence, status and doctor).
pub fn json_with_exit(body: &impl Serialize, status: ExitStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(body).unwrap_or_default();
    if let Some(object) = value.as_object_mut() {
        object.insert("exit_status".into(), serde_json::json!(status.code()));
    }
    value
}
