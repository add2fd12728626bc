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
             hypervisor disks need PR pass-through; an NVMe namespace needs reservation support, \
             see `prfence capabilities`), or not this request (NVMe has no REGISTER AND MOVE, \
             SPEC_I_PT or ALL_TG_PT); fence with a PR-capable LU"
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
             (iscsiadm -m session, multipath -ll, nvme list-subsys) or raise --timeout"
        }
        ErrorKind::Transport => {
            "the path failed below the reservation protocol (no device, link down, host adapter \
             or NVMe controller error); check the session or controller and the device node"
        }
        ErrorKind::Open => {
            "the device could not be opened or used: the node must exist and be readable by \
             this user (group `disk`), and persistent reservations need CAP_SYS_RAWIO on SCSI \
             (SG_IO) and CAP_SYS_ADMIN on NVMe (block PR ioctls, passthrough) (root has both; or \
             setpriv/AmbientCapabilities=CAP_SYS_RAWIO or CAP_SYS_ADMIN)"
        }
        ErrorKind::Malformed => {
            "the target returned persistent-reservation data that does not parse; capture it \
             with `sg_persist -H` (NVMe: `nvme resv-report -e`) and report it"
        }
        ErrorKind::Failed => "the command failed; the sense data or NVMe status says why",
    }
}

/// `e` as the CLI shows it: with the CLI's hint.
pub fn hinted(e: &CommandError) -> CommandError {
    e.clone().hinted(hint)
}
