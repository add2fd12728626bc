//! SG_IO: send a SCSI command to a Linux block or sg device and get back a typed completion.
//!
//! This crate knows nothing about persistent reservations. Its unsafe code is confined to the
//! `ioctl` module; `nvme-io`'s ioctls are the only other unsafe code in the workspace.
//!
//! ```no_run
//! use std::time::Duration;
//! use sg_io::{DataTransfer, Device, OpenMode};
//!
//! let device = Device::open("/dev/sda", OpenMode::ReadOnly)?;
//! let mut inquiry = [0u8; 96];
//! let done = device.execute(
//!     &[0x12, 0, 0, 0, 96, 0],
//!     DataTransfer::FromDevice(&mut inquiry),
//!     Duration::from_secs(10),
//! )?;
//! if !done.is_good() {
//!     eprintln!("INQUIRY failed: {} {:?}", done.status, done.sense());
//! }
//! # Ok::<(), sg_io::Error>(())
//! ```

mod device;
mod ioctl;
mod node;
mod sense;
mod status;

use std::io;
use std::path::PathBuf;

pub use dev_node::NodeKind;
pub use device::{Completion, DataTransfer, Device, MAX_CDB_LEN, OpenMode};
pub use sense::{AdditionalSense, FieldPointer, Sense, SenseFormat, SenseKey, SenseKeySpecific};
pub use status::{DriverStatus, HostStatus, ScsiStatus};

/// Why a command could not be run. A command the device answered, even with an error status, is a
/// [`Completion`], not an `Error`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open {}: {source}{}", path.display(), device::open_hint(.source))]
    Open { path: PathBuf, source: io::Error },
    /// The path names something SG_IO cannot be sent to (a typo in a device list, most likely);
    /// found from stat(2), so it was never opened.
    #[error(
        "{} is {kind}, not a disk: SG_IO is sent only to a block device or a SCSI generic node \
         (/dev/sgN), so it was not opened; check the list of devices it came from",
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
    #[error("SG_IO on {} failed: {source}{}", path.display(), device::ioctl_hint(.source))]
    Ioctl { path: PathBuf, source: io::Error },
    #[error("invalid SCSI request: {reason}")]
    InvalidRequest { reason: String },
}
