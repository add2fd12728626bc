//! Which nodes the ioctl crates (`sg-io`, `nvme-io`) open: judged before the open, from stat(2)
//! alone, because opening some character devices acts by itself (opening /dev/watchdog arms it,
//! and closing it without the magic character then resets the node). A typo in a device list must
//! never do that. Each crate states which kinds it speaks to (its own invariant) and words its own
//! refusal; the judging and the open are here, once.

use std::fmt;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

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
    pub fn of(meta: &Metadata) -> NodeKind {
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

/// Why [`open_checked`] opened nothing, or closed what it opened unused.
#[derive(Debug)]
pub enum Refusal {
    /// stat(2) or open(2) failed.
    Io(io::Error),
    /// The path names a kind the caller does not speak to: never opened.
    NotAccepted(NodeKind),
    /// The node open is not the one judged before (replaced between the two): closed unused.
    Replaced { checked: NodeKind, opened: NodeKind },
}

/// Opens `path` with `options` if `accepts` the node it names. Judged with stat(2) before the
/// open (following links, as /dev/disk/by-id and /dev/mapper names are), so a refused node is
/// never opened; then with fstat(2) on the new fd, so a node replaced by another between the two
/// is closed unused rather than spoken to.
pub fn open_checked(
    path: &Path,
    options: &OpenOptions,
    accepts: fn(NodeKind) -> bool,
) -> Result<File, Refusal> {
    let checked = NodeKind::of(&std::fs::metadata(path).map_err(Refusal::Io)?);
    if !accepts(checked) {
        return Err(Refusal::NotAccepted(checked));
    }
    let file = options.open(path).map_err(Refusal::Io)?;
    same_node(checked, &file)?;
    Ok(file)
}

/// `file` (just opened) is the node `checked` found.
fn same_node(checked: NodeKind, file: &File) -> Result<(), Refusal> {
    let opened = NodeKind::of(&file.metadata().map_err(Refusal::Io)?);
    if opened != checked {
        return Err(Refusal::Replaced { checked, opened });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_node_other_than_the_one_checked_is_refused_after_the_open() {
        let file = File::open("/dev/null").unwrap();
        let null = NodeKind::Char { major: 1, minor: 3 };
        assert!(same_node(null, &file).is_ok());
        let checked = NodeKind::Block { major: 8, minor: 0 };
        match same_node(checked, &file) {
            Err(Refusal::Replaced { checked: c, opened }) => {
                assert_eq!((c, opened), (checked, null));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_kind_is_never_opened() {
        let refuse_all = |_: NodeKind| false;
        let mut options = OpenOptions::new();
        options.read(true);
        match open_checked(Path::new("/dev/null"), &options, refuse_all) {
            Err(Refusal::NotAccepted(kind)) => {
                assert_eq!(kind.to_string(), "a character device 1:3");
            }
            other => panic!("{other:?}"),
        }
        let accept_all = |_: NodeKind| true;
        assert!(open_checked(Path::new("/dev/null"), &options, accept_all).is_ok());
        assert!(matches!(
            open_checked(Path::new("/nonexistent/dev-node"), &options, accept_all),
            Err(Refusal::Io(_))
        ));
    }
}
