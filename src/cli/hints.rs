//! The admin CLI's advice for a failed command: what to check, in terms of `prfence`'s own
//! commands and flags. Attached to every error the CLI shows ([`CommandError::hinted`]).

use crate::transport::{CommandError, ErrorKind};

/// A one-line suggestion for the operator.
pub fn hint(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ReservationConflict => {
            "another initiator holds the reservation, or this path's key is not registered \
             (was this node fenced?); check with `prfence keys` and `prfence reservation`"
        }
        ErrorKind::NotSupported => {
            "the LU does not implement persistent reservations (LIO: attrib/emulate_pr=0; \
             hypervisor disks need PR pass-through); fence with a PR-capable LU"
        }
        ErrorKind::InvalidField => {
            "the target rejected a field: the service action, reservation type or flag is \
             unsupported, or does not match the LU's state; see `prfence capabilities` and \
             `prfence reservation`"
        }
        ErrorKind::UnitAttention => {
            "the LU kept reporting unit attentions (resets or state changes); retry, and \
             check the target's logs if it persists"
        }
        ErrorKind::NotReady => {
            "the LU is not ready; LIO also answers NOT READY for PR OUT from an unregistered \
             path and when its <dbroot>/pr directory is missing"
        }
        ErrorKind::Timeout => {
            "no answer within the command timeout; the path may be dead: check the session \
             (iscsiadm -m session, multipath -ll) or raise --timeout"
        }
        ErrorKind::Transport => {
            "the path failed below SCSI (no device, link down, host adapter error); check the \
             session and the device node"
        }
        ErrorKind::Open => {
            "the device could not be opened or used: the node must exist and be readable by \
             this user (group `disk`), and SG_IO for persistent reservations needs \
             CAP_SYS_RAWIO (root has it; or setpriv/AmbientCapabilities=CAP_SYS_RAWIO)"
        }
        ErrorKind::Malformed => {
            "the target returned persistent-reservation data that does not parse; capture it \
             with `sg_persist -H` and report it"
        }
        ErrorKind::Failed => "the command failed; the sense data says why",
    }
}

/// `e` as the CLI shows it: with the CLI's hint.
pub fn hinted(e: &CommandError) -> CommandError {
    e.clone().hinted(hint)
}
