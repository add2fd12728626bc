//! Reading one LU, PR IN only: the I/O half of doctor.

use crate::discover::LuId;
use crate::pr::{Capabilities, FullStatus, ReadKeys, ReadReservation};
use crate::transport::{CommandError, ErrorKind, PrTransport};

use super::{DoctorPath, PathFacts};
use crate::ops::{Failure, LuTarget};

/// A PR IN command that failed: how, and the failure itself (the command's error kept as data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub kind: ErrorKind,
    pub message: Failure,
}

impl From<CommandError> for ReadError {
    fn from(e: CommandError) -> Self {
        ReadError {
            kind: e.kind,
            message: e.into(),
        }
    }
}

/// One path's READ KEYS, beside the device and what this node knows about the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathReply {
    pub device: String,
    pub facts: PathFacts,
    pub keys: Result<ReadKeys, ReadError>,
}

/// Every reply one LU gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LuReplies {
    pub lu: LuId,
    /// Per path, in the order given.
    pub paths: Vec<PathReply>,
    /// The other reads, through the first path that answered READ KEYS (None: not asked).
    pub reservation: Option<Result<ReadReservation, ReadError>>,
    pub capabilities: Option<Result<Capabilities, ReadError>>,
    pub full_status: Option<Result<FullStatus, ReadError>>,
}

/// Reads one LU: READ KEYS on every path (so each path's reachability is seen), then READ
/// RESERVATION, REPORT CAPABILITIES and READ FULL STATUS through the first path that answered.
pub fn gather<T: PrTransport>(target: &LuTarget<DoctorPath<T>>) -> LuReplies {
    let paths: Vec<PathReply> = target
        .paths
        .iter()
        .map(|p| PathReply {
            device: p.device().display().to_string(),
            facts: p.facts.clone(),
            keys: p.read_keys().map_err(ReadError::from),
        })
        .collect();
    let first = paths
        .iter()
        .position(|p| p.keys.is_ok())
        .and_then(|i| target.paths.get(i));
    LuReplies {
        lu: target.id.clone(),
        reservation: first.map(|p| p.read_reservation().map_err(ReadError::from)),
        capabilities: first.map(|p| p.report_capabilities().map_err(ReadError::from)),
        full_status: first.map(|p| p.read_full_status().map_err(ReadError::from)),
        paths,
    }
}

/// The replies of an LU that was not read (timed out, or no thread for it): every path failed
/// with `why`.
pub(super) fn unread<T: PrTransport>(target: &LuTarget<DoctorPath<T>>, why: &str) -> LuReplies {
    LuReplies {
        lu: target.id.clone(),
        paths: target
            .paths
            .iter()
            .map(|p| PathReply {
                device: p.device().display().to_string(),
                facts: p.facts.clone(),
                keys: Err(ReadError {
                    kind: ErrorKind::Timeout,
                    message: why.into(),
                }),
            })
            .collect(),
        reservation: None,
        capabilities: None,
        full_status: None,
    }
}
