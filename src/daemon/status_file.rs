//! The status file (`--status-file`): the [`Status`] as JSON, rewritten when what it says
//! changes (every self-fence step does) and at least every [`REWRITE_EVERY`]; its modification
//! time is set after every check, so its age tells when the agent last ended one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::stat::{UtimensatFlags, utimensat};
use nix::sys::time::TimeSpec;
use serde_json::Value;
use tokio::time::Instant;

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

/// How long the file goes at most without a rewrite while nothing in it changes but the counters
/// (`checks`, `updated_unix`): a reader that only parses it sees `updated_unix` move this often.
pub const REWRITE_EVERY: Duration = Duration::from_secs(30);

/// The status file and what was last written to it. Serialising and writing the whole document
/// after every check cost about 1 KB of JSON per LU path per second, to repeat what the file
/// already said in the steady state; an unchanged document costs one `utimensat` instead.
pub struct StatusFile {
    pub path: PathBuf,
    /// The document last written (with its `updated_unix`) and when; `None` before the first
    /// write and after a failed one, so that the next publish writes.
    last: Option<(Status, Instant)>,
}

impl StatusFile {
    pub fn new(path: PathBuf) -> StatusFile {
        StatusFile { path, last: None }
    }

    /// Publishes the current `status` after a check or a self-fence step: written when
    /// [`Self::due`], else touched; a file removed meanwhile is written again at once. The
    /// status lock is held only to compare and copy, not while writing.
    pub fn publish(&mut self, status: &std::sync::Mutex<Status>) -> std::io::Result<()> {
        let changed = {
            let status = super::lock(status);
            self.due(&status).then(|| status.clone())
        };
        match changed {
            Some(status) => self.write(status),
            None => self
                .touch()
                .or_else(|_| self.write(super::lock(status).clone())),
        }
    }

    /// Whether `status` is to be written: it says something the file does not (beyond the
    /// counters), or the file was last written [`REWRITE_EVERY`] ago or more, or never.
    pub fn due(&self, status: &Status) -> bool {
        self.last.as_ref().is_none_or(|(last, at)| {
            at.elapsed() >= REWRITE_EVERY || !last.same_but_counters(status)
        })
    }

    /// Writes `status` with `updated_unix` now ([`write()`]).
    pub fn write(&mut self, mut status: Status) -> std::io::Result<()> {
        self.last = None;
        status.updated_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|since| since.as_secs());
        write(&self.path, &status)?;
        self.last = Some((status, Instant::now()));
        Ok(())
    }

    /// Sets the file's modification (and access) time to now: a check ended and the document
    /// still says what the file says. After an error (the file removed meanwhile) [`Self::due`]
    /// holds until a write.
    pub fn touch(&mut self) -> std::io::Result<()> {
        utimensat(
            None,
            &self.path,
            &TimeSpec::UTIME_NOW,
            &TimeSpec::UTIME_NOW,
            UtimensatFlags::FollowSymlink,
        )
        .map_err(|e| {
            self.last = None;
            std::io::Error::from(e)
        })
    }
}

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

    /// Issue 48: the document is written when it changes (or every 30 s), the file only touched
    /// when nothing but the counters moved, and a touch that fails (the file removed) makes the
    /// next publish write it again.
    #[tokio::test(start_paused = true)]
    async fn the_file_is_rewritten_on_a_change_or_after_thirty_seconds_and_touched_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        let read = || -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
        };
        let long_ago = || {
            let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(old)
                .unwrap();
            old
        };
        let mut file = super::StatusFile::new(path.clone());
        let mut status = Status::new("watch", &crate::daemon::status::tests::one_lu());
        assert!(file.due(&status), "never written");
        file.write(status.clone()).unwrap();
        assert_eq!(read()["checks"], 0);

        status.checks += 1;
        assert!(!file.due(&status), "only the count moved");
        let old = long_ago();
        file.touch().unwrap();
        assert!(std::fs::metadata(&path).unwrap().modified().unwrap() > old);
        assert_eq!(read()["checks"], 0, "touched, not rewritten");

        status.lus[0].verdict = "fenced".to_owned();
        assert!(file.due(&status), "a verdict changed");
        file.write(status.clone()).unwrap();
        assert_eq!(read()["lus"][0]["verdict"], "fenced");
        assert_eq!(read()["checks"], 1);

        status.checks += 1;
        tokio::time::advance(super::REWRITE_EVERY - std::time::Duration::from_millis(1)).await;
        assert!(!file.due(&status));
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        assert!(file.due(&status), "30 s since the last write");
        file.write(status.clone()).unwrap();
        assert_eq!(read()["checks"], 2);

        std::fs::remove_file(&path).unwrap();
        assert!(file.touch().is_err());
        assert!(
            file.due(&status),
            "the file is gone: written at the next publish"
        );
        file.write(status).unwrap();
        assert_eq!(read()["checks"], 2);
    }

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
