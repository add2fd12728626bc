//! The one way the tools replace a file (issue #9, #10): the epoch file, the status file and the
//! fence_scsi key store all go through [`write_atomic`].
//!
//! A temporary file with a unique name (pid, a process-wide counter and the time) is created in
//! the target's directory with `O_CREAT | O_EXCL | O_NOFOLLOW` and its final mode, so a planted
//! file or symlink is never followed or reused; it is written, fsynced, renamed over the target,
//! and the directory is fsynced. A reader sees the old or the new content, never a mix, and after
//! a successful return a power loss keeps the new content. On any failure before the rename the
//! temporary is removed.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Mode of files whose readers are other users (fence_scsi's key store): what `File::create`
/// gives, `0666` less the umask.
pub const MODE_DEFAULT: u32 = 0o666;

/// How many unique names are tried before giving up (each collision is someone else's file).
const ATTEMPTS: u32 = 16;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces `path` with `bytes`, atomically and durably (see the module docs). `mode` is the new
/// file's permission bits, applied at creation (less the umask). Errors keep their kind and say
/// which step failed.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace(path, bytes, mode, false)
}

/// Like [`write_atomic`], but the new file gets exactly `mode`, whatever the umask: for a file
/// other users must read while the process runs under a strict umask (a unit's `UMask=0077`).
/// The mode is set on the temporary file, so no reader ever sees the file with another mode.
pub fn write_atomic_exact_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace(path, bytes, mode, true)
}

fn replace(path: &Path, bytes: &[u8], mode: u32, exact: bool) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let (temporary, file) = create_temporary(path, dir, mode)?;
    let written = if exact {
        // fchmod on the open descriptor: the umask only applies at creation.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| step(e, "set the mode of", &temporary))
    } else {
        Ok(())
    }
    .and_then(|()| write_and_rename(file, bytes, &temporary, path));
    if written.is_err() {
        // Best effort: the error that matters is the one returned.
        let _ = fs::remove_file(&temporary);
    }
    written?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| step(e, "fsync the directory", dir))
}

fn create_temporary(path: &Path, dir: &Path, mode: u32) -> io::Result<(PathBuf, File)> {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        let temporary = dir.join(format!(
            ".{name}.{}.{count}.{nanos:08x}.tmp",
            std::process::id()
        ));
        let opened = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(
                nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_CLOEXEC.bits(),
            )
            .open(&temporary);
        match opened {
            Ok(file) => return Ok((temporary, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(step(e, "create the temporary file", &temporary)),
        }
    }
    let e = last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists));
    Err(step(e, "create the temporary file", dir))
}

fn write_and_rename(mut file: File, bytes: &[u8], temporary: &Path, path: &Path) -> io::Result<()> {
    file.write_all(bytes)
        .map_err(|e| step(e, "write", temporary))?;
    file.sync_all()
        .map_err(|e| step(e, "fsync the temporary file", temporary))?;
    drop(file);
    fs::rename(temporary, path).map_err(|e| step(e, "rename", path))
}

fn step(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_the_content_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"one\n", 0o600).unwrap();
        write_atomic(&path, b"two\n", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two\n");
        assert_eq!(entries(dir.path()), ["f"]);
    }

    #[test]
    fn mode_is_set_at_creation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write_atomic(&path, b"x", 0o600).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // MODE_DEFAULT gives what File::create gives under the same umask.
        File::create(dir.path().join("reference")).unwrap();
        write_atomic(&path, b"x", MODE_DEFAULT).unwrap();
        let reference = fs::metadata(dir.path().join("reference")).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode(),
            reference.permissions().mode()
        );
    }

    #[test]
    fn exact_mode_is_not_narrowed_by_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        // 0664 is outside what the usual umask (022) or a unit's 077 lets through.
        write_atomic_exact_mode(&path, b"x", 0o664).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o664
        );
        assert_eq!(fs::read(&path).unwrap(), b"x");
        assert_eq!(entries(dir.path()), ["f"]);
    }

    #[test]
    fn a_symlink_at_the_old_fixed_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "untouched").unwrap();
        let path = dir.path().join("cluster.key");
        symlink(&victim, dir.path().join("cluster.key.tmp")).unwrap();
        write_atomic(&path, b"abc\n", MODE_DEFAULT).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(fs::read(&path).unwrap(), b"abc\n");
        assert!(
            fs::symlink_metadata(dir.path().join("cluster.key.tmp"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            entries(dir.path()),
            ["cluster.key", "cluster.key.tmp", "victim"]
        );
    }

    #[test]
    fn failure_in_a_missing_directory_names_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let e = write_atomic(&dir.path().join("missing/f"), b"x", 0o600).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("create the temporary file"), "{e}");
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn failed_rename_removes_the_temporary() {
        // A directory at the target makes the rename fail after the temporary was written.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), "x").unwrap();
        let e = write_atomic(&path, b"x", 0o600).unwrap_err();
        assert!(e.to_string().contains("rename"), "{e}");
        assert_eq!(entries(dir.path()), ["f"]);
    }

    #[test]
    fn read_only_directory_fails_without_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let ro = dir.path().join("ro");
        fs::create_dir(&ro).unwrap();
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
        let result = write_atomic(&ro.join("f"), b"x", 0o600);
        // root ignores the directory's mode; the point is no leftover either way.
        let left = entries(&ro);
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();
        match result {
            Ok(()) => assert_eq!(left, ["f"]),
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
                assert!(left.is_empty(), "{left:?}");
            }
        }
    }
}
