//! How a PR command the agent sent failed, in the classes the watch and lease state machines
//! (and the metrics) tell apart. One enum for both modes, mapped from the transport's error in
//! one place.

use crate::transport::{CommandError, ErrorKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandFailure {
    /// RESERVATION CONFLICT.
    Conflict,
    /// No path answered (transport down, device gone, cannot open).
    Unreachable,
    /// No answer within `command_timeout`.
    Timeout,
    /// Anything else (the driver logs the sense).
    Failed,
}

impl CommandFailure {
    /// The class of a transport error.
    pub fn of(e: &CommandError) -> Self {
        match e.kind {
            ErrorKind::ReservationConflict => CommandFailure::Conflict,
            ErrorKind::Timeout => CommandFailure::Timeout,
            ErrorKind::Transport | ErrorKind::Open => CommandFailure::Unreachable,
            _ => CommandFailure::Failed,
        }
    }
}
