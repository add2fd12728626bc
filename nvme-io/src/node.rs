//! Which nodes this crate opens: judged before the open, from stat(2) alone, because opening
//! some character devices acts by itself (opening /dev/watchdog arms it, and closing it without
//! the magic character then resets the node). A typo in a device list must never do that.
//! `sg-io` has the same gate with its own rule (it also takes SCSI generic character nodes).

use std::fmt;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::NvmeError as Error;

/// What stat(2) says a path is, with a device node's numbers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NodeKind {
    Block {
        major: u32,
        minor: u32,
    },
    Char {
        major: u32,
        minor: u32,
    },
    File,
    Directory,
    Fifo,
    Socket,
    /// A symbolic link (only when not followed) or a type this crate does not know.
    Other,
}

impl NodeKind {
    fn of(meta: &Metadata) -> NodeKind {
        let kind = meta.file_type();
        let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
        if kind.is_block_device() {
            NodeKind::Block { major, minor }
        } else if kind.is_char_device() {
            NodeKind::Char { major, minor }
        } else if kind.is_file() {
            NodeKind::File
        } else if kind.is_dir() {
            NodeKind::Directory
        } else if kind.is_fifo() {
            NodeKind::Fifo
        } else if kind.is_socket() {
            NodeKind::Socket
        } else {
            NodeKind::Other
        }
    }
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeKind::Block { major, minor } => write!(f, "a block device {major}:{minor}"),
            NodeKind::Char { major, minor } => write!(f, "a character device {major}:{minor}"),
            NodeKind::File => f.write_str("a regular file"),
            NodeKind::Directory => f.write_str("a directory"),
            NodeKind::Fifo => f.write_str("a FIFO"),
            NodeKind::Socket => f.write_str("a socket"),
            NodeKind::Other => f.write_str("neither a file nor a device"),
        }
    }
}

/// The nodes this crate's ioctls are sent to, its invariant: block devices only. The block PR
/// ioctls (IOC_PR_*) are block-layer ioctls, and NVMe passthrough is sent to the namespace's
/// block device. The NVMe character devices (/dev/ngXnY, /dev/nvmeX) take passthrough but not
/// the PR ioctls, and discovery never hands one here (they are not under /sys/class/block, and
/// the engine sends only `nvmeXnY` names to NVMe); like every other character device they are
/// refused before they are opened (see the module).
fn takes_block_ioctls(kind: NodeKind) -> bool {
    matches!(kind, NodeKind::Block { .. })
}

/// Opens `path` with `options` if it names a node [`takes_block_ioctls`] accepts. Judged with
/// stat(2) before the open (following links, as /dev/disk/by-id and /dev/mapper names are), so a
/// refused node is never opened; then with fstat(2) on the new fd, so a node replaced by another
/// between the two is closed unused rather than spoken to.
pub(crate) fn open_checked(path: &Path, options: &OpenOptions) -> Result<File, Error> {
    let open_error = |source| Error::Open {
        path: path.to_path_buf(),
        source,
    };
    let checked = NodeKind::of(&std::fs::metadata(path).map_err(open_error)?);
    if !takes_block_ioctls(checked) {
        return Err(Error::NotADevice {
            path: path.to_path_buf(),
            kind: checked,
        });
    }
    let file = options.open(path).map_err(open_error)?;
    same_node(path, checked, &file)?;
    Ok(file)
}

/// `file` (just opened from `path`) is the node `checked` found.
fn same_node(path: &Path, checked: NodeKind, file: &File) -> Result<(), Error> {
    let opened = NodeKind::of(&file.metadata().map_err(|source| Error::Open {
        path: path.to_path_buf(),
        source,
    })?);
    if opened != checked {
        return Err(Error::Replaced {
            path: path.to_path_buf(),
            checked,
            opened,
        });
    }
    Ok(())
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

    #[test]
    fn a_node_other_than_the_one_checked_is_refused_after_the_open() {
        let file = File::open("/dev/null").unwrap();
        let null = NodeKind::Char { major: 1, minor: 3 };
        assert!(same_node(Path::new("/dev/null"), null, &file).is_ok());
        let checked = NodeKind::Block { major: 8, minor: 0 };
        let err = same_node(Path::new("/dev/sda"), checked, &file).unwrap_err();
        assert!(matches!(err, Error::Replaced { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("/dev/sda")
                && text.contains("a block device 8:0")
                && text.contains("a character device 1:3"),
            "{text}"
        );
    }
}
