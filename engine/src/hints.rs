//! What each front end advises after a failed command: one table, kind of failure by front end.
//! Where the advice is the same it is written once; where it points at something, it names the
//! front end's own commands, parameters or settings (`--timeout`, `power_timeout`,
//! `command_timeout`). Each front end attaches its column to the errors it shows
//! ([`crate::transport::CommandError::hinted`]).

use crate::transport::ErrorKind;

/// Who shows the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEnd {
    /// The admin CLI, `prfence`.
    Cli,
    /// The fence agent, `fence_pr`.
    FencePr,
    /// The node agent, `prfence agent`.
    NodeAgent,
}

/// A one-line suggestion for the operator of `front`.
pub fn hint(kind: ErrorKind, front: FrontEnd) -> &'static str {
    use ErrorKind as K;
    use FrontEnd as F;
    match (kind, front) {
        (K::ReservationConflict, F::Cli) => {
            "another initiator holds the reservation, or this path's key is not registered \
             (was this node fenced?); check with `prfence keys` and `prfence reservation`"
        }
        (K::ReservationConflict, F::FencePr) => {
            "another initiator holds the reservation, or this path's key is not registered (was \
             this node fenced?); compare the keys with action=list-status"
        }
        (K::ReservationConflict, F::NodeAgent) => {
            "another initiator holds the reservation, or this path's key is not registered \
             (was this node fenced?)"
        }
        (K::NotSupported, F::Cli) => {
            "the LU does not implement persistent reservations (LIO: attrib/emulate_pr=0; \
             hypervisor disks need PR pass-through; an NVMe namespace needs reservation support, \
             see `prfence capabilities`), or not this request (NVMe has no REGISTER AND MOVE, \
             SPEC_I_PT or ALL_TG_PT); fence with a PR-capable LU"
        }
        (K::NotSupported, F::FencePr) => {
            "the LU does not implement persistent reservations (LIO: attrib/emulate_pr=0; \
             hypervisor disks need PR pass-through; NVMe namespaces need reservation support); \
             list only PR-capable devices in devices="
        }
        (K::NotSupported, F::NodeAgent) => {
            "the LU does not implement persistent reservations; list only PR-capable LUs in \
             devices"
        }
        (K::InvalidField, F::Cli) => {
            "the target rejected a field: the service action, reservation type or flag is \
             unsupported, or does not match the LU's state; see `prfence capabilities` and \
             `prfence reservation`"
        }
        (K::InvalidField, F::FencePr | F::NodeAgent) => {
            "the target rejected a field: the service action, reservation type or flag is \
             unsupported, or does not match the LU's state"
        }
        (K::UnitAttention, F::Cli | F::FencePr) => {
            "the LU kept reporting unit attentions (resets or state changes); retry, and check \
             the target's logs if it persists"
        }
        (K::UnitAttention, F::NodeAgent) => {
            "the LU kept reporting unit attentions (resets or state changes); check the target's \
             logs if it persists"
        }
        (K::NotReady, _) => {
            "the LU is not ready; LIO also answers NOT READY for PR OUT from an unregistered \
             path and when its <dbroot>/pr directory is missing"
        }
        (K::Timeout, F::Cli) => {
            "no answer within the command timeout; the path may be dead: check the session \
             (iscsiadm -m session, multipath -ll, nvme list-subsys) or raise --timeout"
        }
        (K::Timeout, F::FencePr) => {
            "no answer within the command timeout; the path may be dead: check the session \
             (iscsiadm -m session, multipath -ll, nvme list-subsys) or raise power_timeout"
        }
        (K::Timeout, F::NodeAgent) => {
            "no answer within command_timeout; the path may be dead: check the session \
             (iscsiadm -m session, multipath -ll, nvme list-subsys) or raise command_timeout"
        }
        (K::Transport, _) => {
            "the path failed below the reservation protocol (no device, link down, host adapter \
             or NVMe controller error); check the session or controller and the device node"
        }
        // Also a path that names no disk (sg-io's and nvme-io's `NotADevice`, refused before
        // it is opened): the advice starts with the device list, then what opening needs.
        (K::Open, F::Cli) => {
            "the device could not be opened or used: each device argument must name a disk \
             (/dev/sdX, /dev/sgN, /dev/nvmeXnY, or a /dev/disk/by-id or /dev/mapper link to one) \
             readable by this user (group `disk`), and persistent reservations need \
             CAP_SYS_RAWIO on SCSI (SG_IO) and CAP_SYS_ADMIN on NVMe (block PR ioctls, \
             passthrough) (root has both; or setpriv/AmbientCapabilities=CAP_SYS_RAWIO or \
             CAP_SYS_ADMIN)"
        }
        (K::Open, F::FencePr) => {
            "the device node could not be opened or used: devices= must name disks (/dev/sdX, \
             /dev/sgN, /dev/nvmeXnY, or /dev/disk/by-id or /dev/mapper links to them) that exist, \
             and fence_pr must run as root (CAP_SYS_RAWIO for SCSI, CAP_SYS_ADMIN for NVMe)"
        }
        (K::Open, F::NodeAgent) => {
            "the device node could not be opened or used: each [[device]] path must name a disk \
             (/dev/sdX, /dev/sgN, /dev/nvmeXnY, or a /dev/disk/by-id or /dev/mapper link to one) \
             that exists, and the agent needs root (CAP_SYS_RAWIO for SCSI, CAP_SYS_ADMIN for \
             NVMe: the packaged unit grants only the first)"
        }
        (K::Malformed, _) => {
            "the target returned persistent-reservation data that does not parse; capture it \
             with `sg_persist -H` (NVMe: `nvme resv-report -e`) and report it"
        }
        (K::Failed, _) => "the command failed; the sense data or NVMe status says why",
    }
}

/// The admin CLI's column, as a [`crate::transport::Hints`].
pub fn cli(kind: ErrorKind) -> &'static str {
    hint(kind, FrontEnd::Cli)
}

/// fence_pr's column, as a [`crate::transport::Hints`].
pub fn fence_pr(kind: ErrorKind) -> &'static str {
    hint(kind, FrontEnd::FencePr)
}

/// The node agent's column, as a [`crate::transport::Hints`].
pub fn node_agent(kind: ErrorKind) -> &'static str {
    hint(kind, FrontEnd::NodeAgent)
}
