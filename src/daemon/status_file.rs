//! The status file (`--status-file`): the [`Status`] as JSON, rewritten after every check and
//! every self-fence step.

use std::path::Path;

use serde_json::Value;

use super::status::Status;

/// Where the kernel tells the id of the current boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's id, `None` where the kernel does not tell it.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string(BOOT_ID)
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
}

/// The reason of a self-fence that an earlier agent began in boot `boot` and did not finish, as
/// the status file at `path` recorded it (it is written before each step). `None` when there is
/// no such file, it is from another boot, it does not say fenced, or the self-fence finished.
/// The packaged unit keeps the file across restarts (`RuntimeDirectoryPreserve=yes`); a reboot
/// clears /run.
pub fn unfinished_self_fence(path: &Path, boot: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let earlier: Value = serde_json::from_str(&text).ok()?;
    let fenced = earlier["state"] == "fenced" && earlier["boot_id"] == boot;
    if !fenced || earlier["self_fence"]["finished"] == true {
        return None;
    }
    Some(
        earlier["fenced_reason"]
            .as_str()
            .unwrap_or("no reason recorded")
            .to_owned(),
    )
}

/// The status file's mode: monitoring reads it as another user, and the packaged unit's
/// `UMask=0077` would otherwise make it 0600. It holds nothing secret (keys are on the target for
/// every registrant to read).
pub const MODE: u32 = 0o644;

/// Replaces `path` with the status, atomically (readers never see half a document), with the
/// mode [`MODE`] whatever the umask.
pub fn write(path: &Path, status: &Status) -> std::io::Result<()> {
    crate::atomic_file::write_atomic_exact_mode(path, (status.to_json() + "\n").as_bytes(), MODE)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::process::Command;

    use super::super::status::Status;

    /// Set for the run of the test below in a child process: where that run writes the file.
    const CHILD_WRITES: &str = "PRFENCE_TEST_STATUS_FILE_CHILD";

    /// The packaged unit runs with `UMask=0077`, and monitoring reads the file as another user.
    /// The umask is process-wide (other tests in this binary compare modes), so the write is done
    /// by this test binary run again under `sh -c 'umask 077; exec …'`.
    #[test]
    fn the_status_file_is_0644_under_a_strict_umask() {
        let status = Status::new("watch", &crate::daemon::status::tests::one_lu());
        if let Some(path) = std::env::var_os(CHILD_WRITES) {
            super::write(Path::new(&path), &status).unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        let name = concat!(
            module_path!(),
            "::the_status_file_is_0644_under_a_strict_umask"
        );
        // The harness names tests without the crate.
        let name = name.split_once("::").unwrap().1;
        let out = Command::new("/bin/sh")
            .args([
                "-c",
                "umask 077 && exec \"$0\" --exact \"$1\" --test-threads=1",
            ])
            .arg(std::env::current_exe().unwrap())
            .arg(name)
            .env(CHILD_WRITES, &path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{mode:o}");
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(written["mode"], "watch");
    }
}
