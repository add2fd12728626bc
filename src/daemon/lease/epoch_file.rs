//! The lease epoch state file: the highest key epoch this node may have used, written durably
//! (temporary file, fsync, rename, fsync of the directory) *before* a key from a new block is
//! sent, so a crash can never lead to an epoch being used twice (P3, no ABA; `lease` docs).

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum EpochFileError {
    #[error("{}: cannot read the lease epoch state file: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: holds {text:?}, not an epoch (a decimal number); it is written atomically, so \
         something else wrote it: remove it only if this node's keys are gone from every LU",
        path.display()
    )]
    Corrupt { path: PathBuf, text: String },
    #[error("{}: cannot write the lease epoch durably: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The epoch in the file, `None` if there is no file (first start, or lost).
pub fn read(path: &Path) -> Result<Option<u64>, EpochFileError> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| EpochFileError::Corrupt {
                path: path.to_path_buf(),
                text,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EpochFileError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Replaces the file's content with `epoch`, durably: after this returns, a power loss leaves
/// either the old or the new value, and the new one once the rename is on disk.
pub fn write_durably(path: &Path, epoch: u64) -> Result<(), EpochFileError> {
    // The mode `File::create` gave it before (0666 less the umask).
    let mode = crate::atomic_file::MODE_DEFAULT;
    crate::atomic_file::write_atomic(path, format!("{epoch}\n").as_bytes(), mode).map_err(
        |source| EpochFileError::Write {
            path: path.to_path_buf(),
            source,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_missing_and_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease-epoch");
        assert_eq!(read(&path).unwrap(), None);
        write_durably(&path, 1_700_000_001_023).unwrap();
        assert_eq!(read(&path).unwrap(), Some(1_700_000_001_023));
        write_durably(&path, 5).unwrap();
        assert_eq!(read(&path).unwrap(), Some(5));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        std::fs::write(&path, "five").unwrap();
        assert!(matches!(read(&path), Err(EpochFileError::Corrupt { .. })));
        let e = write_durably(&dir.path().join("missing/lease-epoch"), 1).unwrap_err();
        assert!(e.to_string().contains("create the temporary file"), "{e}");
    }
}
