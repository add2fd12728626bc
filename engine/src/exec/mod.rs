//! The two transports, side by side: [`ScsiPr`] (SCSI-3 persistent reservations over SG_IO,
//! [`scsi`]) and [`NvmePr`] (NVMe reservations over the block PR ioctls and passthrough,
//! [`nvme`]). Each implements [`crate::transport::PrTransport`] with the same contract: encode
//! with the codec, classify every completion into an [`crate::transport::ErrorKind`], re-issue a
//! read whose answer outgrew its buffer. What both must do alike is written once: the NOT READY
//! rule (re-read whether a PR OUT already applied before retrying it) in `retry`.

pub mod nvme;
mod retry;
pub mod scsi;

pub use nvme::{NvmeDevice, NvmePr};
pub use retry::effect_visible;
pub use scsi::{ScsiDevice, ScsiPr};
