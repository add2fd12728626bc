//! Which nodes this crate opens ([`dev_node`]: judged from stat(2) before the open, so that a
//! typo in a device list never opens, say, /dev/watchdog, which arms on open), by this crate's
//! own rule.

use std::fs::{File, OpenOptions};
use std::path::Path;

use dev_node::{NodeKind, Refusal};

use crate::Error;

/// The SCSI generic driver's character major (`SCSI_GENERIC_MAJOR`, /dev/sgN).
const SCSI_GENERIC_MAJOR: u32 = 21;

/// The nodes SG_IO is sent to, this crate's invariant: a block device (the SCSI disk driver
/// takes SG_IO, and any other block driver answers ENOTTY, which does nothing), or a character
/// device of the SCSI generic driver (major 21, /dev/sgN). No other character device: opening
/// one can act by itself (see the module), and bsg nodes (/dev/bsg/…) speak sg_io_v4, not the
/// v3 header this crate sends. Files, directories, FIFOs and sockets mean nothing to SG_IO.
fn speaks_sg_io(kind: NodeKind) -> bool {
    matches!(
        kind,
        NodeKind::Block { .. }
            | NodeKind::Char {
                major: SCSI_GENERIC_MAJOR,
                ..
            }
    )
}

/// Opens `path` with `options` if it names a node [`speaks_sg_io`] accepts
/// ([`dev_node::open_checked`]: a refused node is never opened).
pub(crate) fn open_checked(path: &Path, options: &OpenOptions) -> Result<File, Error> {
    dev_node::open_checked(path, options, speaks_sg_io).map_err(|refusal| {
        let path = path.to_path_buf();
        match refusal {
            Refusal::Io(source) => Error::Open { path, source },
            Refusal::NotAccepted(kind) => Error::NotADevice { path, kind },
            Refusal::Replaced { checked, opened } => Error::Replaced {
                path,
                checked,
                opened,
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_block_devices_and_sg_nodes_speak_sg_io() {
        assert!(speaks_sg_io(NodeKind::Block {
            major: 8,
            minor: 16
        }));
        assert!(speaks_sg_io(NodeKind::Block {
            major: 253,
            minor: 0
        }));
        assert!(speaks_sg_io(NodeKind::Char {
            major: SCSI_GENERIC_MAJOR,
            minor: 2
        }));
        for refused in [
            NodeKind::Char {
                major: 10,
                minor: 130,
            },
            NodeKind::Char { major: 1, minor: 3 },
            NodeKind::File,
            NodeKind::Directory,
            NodeKind::Fifo,
            NodeKind::Socket,
            NodeKind::Other,
        ] {
            assert!(!speaks_sg_io(refused), "{refused}");
        }
    }
}
