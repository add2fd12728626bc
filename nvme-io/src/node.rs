//! Which nodes this crate opens ([`dev_node`]: judged from stat(2) before the open, so that a
//! typo in a device list never opens, say, /dev/watchdog, which arms on open), by this crate's
//! own rule. `sg-io` has the same gate with its own rule (it also takes SCSI generic nodes).

use std::fs::{File, OpenOptions};
use std::path::Path;

use dev_node::{NodeKind, Refusal};

use crate::NvmeError as Error;

/// The nodes this crate's ioctls are sent to, its invariant: block devices only. The block PR
/// ioctls (IOC_PR_*) are block-layer ioctls, and NVMe passthrough is sent to the namespace's
/// block device. The NVMe character devices (/dev/ngXnY, /dev/nvmeX) take passthrough but not
/// the PR ioctls, and discovery never hands one here (they are not under /sys/class/block, and
/// the engine sends only `nvmeXnY` names to NVMe); like every other character device they are
/// refused before they are opened (see the module).
fn takes_block_ioctls(kind: NodeKind) -> bool {
    matches!(kind, NodeKind::Block { .. })
}

/// Opens `path` with `options` if it names a node [`takes_block_ioctls`] accepts
/// ([`dev_node::open_checked`]: a refused node is never opened).
pub(crate) fn open_checked(path: &Path, options: &OpenOptions) -> Result<File, Error> {
    dev_node::open_checked(path, options, takes_block_ioctls).map_err(|refusal| {
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
    fn only_block_devices_take_the_block_ioctls() {
        assert!(takes_block_ioctls(NodeKind::Block {
            major: 259,
            minor: 0
        }));
        for refused in [
            NodeKind::Char {
                major: 10,
                minor: 130,
            },
            NodeKind::Char {
                major: 21,
                minor: 0,
            },
            NodeKind::Char {
                major: 240,
                minor: 0,
            },
            NodeKind::File,
            NodeKind::Directory,
            NodeKind::Fifo,
            NodeKind::Socket,
            NodeKind::Other,
        ] {
            assert!(!takes_block_ioctls(refused), "{refused}");
        }
    }
}
