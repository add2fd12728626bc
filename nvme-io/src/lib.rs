//! The Linux block-layer persistent-reservation ioctls (`IOC_PR_*`, `<linux/pr.h>`) and NVMe
//! passthrough (`NVME_IOCTL_*`, `<linux/nvme_ioctl.h>`) on an NVMe namespace block device, with
//! typed statuses.
//!
//! Like `sg-io`, this crate knows nothing about fencing policy: it sends what it is asked and
//! says what came back. Its unsafe code is confined to the `ioctl` module, one block per ioctl.
//!
//! Three outcomes, kept apart in the types:
//! - the kernel refused or could not deliver the request (`-1`/errno): [`NvmeError`];
//! - the device answered with an error: [`PrStatus`] (block PR ioctls) or [`NvmeStatus`]
//!   (passthrough), inside `Ok`;
//! - success.
//!
//! ```no_run
//! use nvme_io::BlockDevice;
//!
//! let ns = BlockDevice::open("/dev/nvme0n1")?;
//! let mut keys = [0u64; 64];
//! match ns.pr_read_keys(&mut keys)? {
//!     Ok(read) => println!("generation {}, {} keys", read.generation, read.num_keys),
//!     Err(status) => eprintln!("READ KEYS failed: {status}"),
//! }
//! # Ok::<(), nvme_io::NvmeError>(())
//! ```

mod device;
mod ioctl;
mod node;
mod status;

use std::io;
use std::path::PathBuf;

pub use dev_node::NodeKind;
pub use device::{
    BlockDevice, NvmeCommand, NvmeCompletion, NvmeDataTransfer, PR_KEYS_MAX, PrKeys, PrReservation,
    PrResult,
};
pub use ioctl::PrType;
pub use status::{NvmeStatus, PrStatus};

/// Why a request did not reach the device, or the kernel refused it. A request the device
/// answered, even with an error, is `Ok` with a [`PrStatus`] or [`NvmeStatus`].
#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    #[error("cannot open {}: {source}{}", path.display(), device::open_hint(.source))]
    Open { path: PathBuf, source: io::Error },
    /// The path names no block device (a typo in a device list, most likely); found from
    /// stat(2), so it was never opened.
    #[error(
        "{} is {kind}, not a block device: the persistent-reservation ioctls are sent only to \
         a block device (an NVMe namespace /dev/nvmeXnY), so it was not opened; check the list \
         of devices it came from",
        path.display()
    )]
    NotADevice { path: PathBuf, kind: NodeKind },
    /// The node found at `path` when it was opened is not the one checked before: it was closed
    /// unused.
    #[error(
        "{} changed while it was opened: {checked} when checked, {opened} once open; closed \
         unused. Something is replacing device nodes: retry, and find out what",
        path.display()
    )]
    Replaced {
        path: PathBuf,
        checked: NodeKind,
        opened: NodeKind,
    },
    #[error("{ioctl} on {} failed: {source}{}", path.display(), device::ioctl_hint(.ioctl, .source))]
    Ioctl {
        path: PathBuf,
        /// The ioctl's name (`IOC_PR_REGISTER`, `NVME_IOCTL_IO_CMD`…).
        ioctl: &'static str,
        source: io::Error,
    },
    #[error("invalid NVMe request: {reason}")]
    InvalidRequest { reason: String },
}

impl NvmeError {
    /// The errno behind an open or ioctl failure.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            NvmeError::Open { source, .. } | NvmeError::Ioctl { source, .. } => {
                source.raw_os_error()
            }
            NvmeError::NotADevice { .. }
            | NvmeError::Replaced { .. }
            | NvmeError::InvalidRequest { .. } => None,
        }
    }
}
