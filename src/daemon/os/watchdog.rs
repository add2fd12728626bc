//! The hardware watchdog: opened once, fed with one byte per healthy check, disarmed with the
//! magic close ('V') only on a clean SIGTERM stop when configured.
//!
//! The agent does not program the timeout: that takes the WDIOC_SETTIMEOUT ioctl, and this crate
//! has no `unsafe` (only the two ioctl crates, `sg-io` and `nvme-io`, do). It reads the device's
//! timeout from sysfs instead and refuses to start on a mismatch, because the timing rules
//! (`daemon` module docs) are checked against the configured value. Dropping a [`Watchdog`]
//! closes it *without* the magic byte, so the kernel keeps the timer running ("watchdog did not
//! stop!"): a fenced or crashed agent leaves the node to be reset.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error(
        "{device}: the device's timeout is {actual} s ({sysfs}), but watchdog.timeout is {configured} s; \
         set the driver's timeout (module parameter, e.g. softdog soft_margin={configured}, \
         iTCO_wdt heartbeat={configured}) or change watchdog.timeout"
    )]
    TimeoutMismatch {
        device: String,
        sysfs: String,
        actual: u64,
        configured: u64,
    },
    #[error(
        "{device}: cannot open the watchdog: {source}; is another daemon (watchdog, sbd) using it?"
    )]
    Open {
        device: String,
        source: std::io::Error,
    },
    #[error(
        "watchdog.device {device:?}: cannot resolve it: {source}; is the watchdog driver loaded \
         (e.g. modprobe softdog)?"
    )]
    Resolve {
        device: String,
        source: std::io::Error,
    },
    #[error(
        "watchdog.device {device:?} resolves to {resolved}, which {problem}; name a watchdog: \
         /dev/watchdog or a /dev/watchdogN listed in /sys/class/watchdog"
    )]
    NotAWatchdog {
        device: String,
        resolved: String,
        problem: String,
    },
    #[error(
        "{device} is no longer the device checked when the agent started (replaced, or the \
         watchdogs renumbered); check watchdog.device and restart the agent"
    )]
    Replaced { device: String },
    #[error("{device}: feeding the watchdog failed: {source}")]
    Write {
        device: String,
        source: std::io::Error,
    },
}

/// Compares the device's timeout (sysfs) with the configured one without opening the device
/// (opening starts it). Unreadable sysfs is logged and trusted: kernels without
/// CONFIG_WATCHDOG_SYSFS do not show it.
pub fn check_timeout(device: &Path, timeout: Duration, sys: &Path) -> Result<(), WatchdogError> {
    let name = device
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // /dev/watchdog is the legacy node of watchdog0.
    let name = if name == "watchdog" {
        "watchdog0".to_owned()
    } else {
        name
    };
    let sysfs = sys.join("class/watchdog").join(&name).join("timeout");
    match std::fs::read_to_string(&sysfs) {
        Ok(text) => {
            if let Ok(actual) = text.trim().parse::<u64>()
                && actual != timeout.as_secs()
            {
                return Err(WatchdogError::TimeoutMismatch {
                    device: device.display().to_string(),
                    sysfs: sysfs.display().to_string(),
                    actual,
                    configured: timeout.as_secs(),
                });
            }
        }
        Err(e) => tracing::warn!(
            device = %device.display(), sysfs = %sysfs.display(), error = %e,
            "cannot read the watchdog's timeout (kernel without CONFIG_WATCHDOG_SYSFS?); \
             trusting watchdog.timeout"
        ),
    }
    Ok(())
}

/// The misc device `/dev/watchdog` (the legacy node of the first watchdog): character 10:130.
pub const MISC_WATCHDOG: (u64, u64) = (10, 130);

/// What [`check_device`] found out about a configured watchdog, for [`judge_device`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// The configured path with every symlink and `..` resolved.
    pub resolved: PathBuf,
    pub char_device: bool,
    /// Major and minor device number (meaningful for a character device).
    pub rdev: (u64, u64),
    /// `<sys>/class/watchdog/<name>` exists for the resolved name.
    pub in_watchdog_class: bool,
    /// That class entry's `dev` file (`major:minor`), when it could be read.
    pub class_dev: Option<String>,
}

/// Whether `facts` describe a watchdog under `dev` (`/dev` on a node): a character device that
/// is the misc watchdog (10:130) or one of the watchdog class (with the same numbers, when sysfs
/// tells them). `Err` says what it is instead.
pub fn judge_device(facts: &DeviceFacts, dev: &Path) -> Result<(), String> {
    if !facts.resolved.starts_with(dev) {
        return Err(format!("is not under {}", dev.display()));
    }
    if !facts.char_device {
        return Err("is not a character device".to_owned());
    }
    if facts.rdev == MISC_WATCHDOG {
        return Ok(());
    }
    let (major, minor) = facts.rdev;
    if !facts.in_watchdog_class {
        return Err(format!(
            "is character device {major}:{minor}, neither the misc watchdog (10:130) nor in the \
             watchdog class"
        ));
    }
    match facts.class_dev.as_deref().map(str::trim) {
        Some(class) if class != format!("{major}:{minor}") => Err(format!(
            "is character device {major}:{minor}, but the watchdog class says {class}"
        )),
        _ => Ok(()),
    }
}

/// Resolves `device` and checks it is a watchdog under `dev` ([`judge_device`]), reading the
/// watchdog class under `sys`, without opening it (opening starts it). Returns the resolved path.
pub fn check_device(device: &Path, dev: &Path, sys: &Path) -> Result<PathBuf, WatchdogError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let shown = || device.display().to_string();
    let resolved = std::fs::canonicalize(device).map_err(|source| WatchdogError::Resolve {
        device: shown(),
        source,
    })?;
    let metadata = std::fs::metadata(&resolved).map_err(|source| WatchdogError::Resolve {
        device: shown(),
        source,
    })?;
    let rdev = metadata.rdev();
    let class = resolved
        .file_name()
        .map(|name| sys.join("class/watchdog").join(name));
    let facts = DeviceFacts {
        char_device: metadata.file_type().is_char_device(),
        rdev: (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)),
        in_watchdog_class: class.as_deref().is_some_and(Path::exists),
        class_dev: class.and_then(|c| std::fs::read_to_string(c.join("dev")).ok()),
        resolved,
    };
    judge_device(&facts, dev).map_err(|problem| WatchdogError::NotAWatchdog {
        device: shown(),
        resolved: facts.resolved.display().to_string(),
        problem,
    })?;
    Ok(facts.resolved)
}

/// Which file a path named at start (device, inode and, for a device node, its numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    rdev: u64,
}

impl FileId {
    fn of(metadata: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: metadata.dev(),
            ino: metadata.ino(),
            rdev: metadata.rdev(),
        }
    }
}

/// The watchdog as checked at start: its resolved path and which file that was. The agent opens
/// the watchdog only later (opening starts it), and opens this one: a link or a renumbered
/// /dev/watchdogN may name another file by then, and the feed must never go anywhere else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    pub path: PathBuf,
    pub id: FileId,
}

/// [`check_device`], and the file it judged, for [`Watchdog::open`] to insist on.
pub fn pin(device: &Path, dev: &Path, sys: &Path) -> Result<Pinned, WatchdogError> {
    let path = check_device(device, dev, sys)?;
    let metadata = std::fs::metadata(&path).map_err(|source| WatchdogError::Resolve {
        device: device.display().to_string(),
        source,
    })?;
    Ok(Pinned {
        id: FileId::of(&metadata),
        path,
    })
}

/// An open, running hardware watchdog.
#[derive(Debug)]
pub struct Watchdog {
    file: File,
    device: PathBuf,
}

impl Watchdog {
    /// Checks the device's timeout under `sys` (`/sys` on a node) and opens it, which starts it.
    /// With `expect`, the file opened must be that one ([`Pinned`]); another is closed at once
    /// (not fed; a watchdog closed without the magic byte keeps counting, which is the reset a
    /// node with a watchdog it cannot trust should get).
    pub fn open(
        device: &Path,
        timeout: Duration,
        sys: &Path,
        expect: Option<FileId>,
    ) -> Result<Watchdog, WatchdogError> {
        check_timeout(device, timeout, sys)?;
        let file = OpenOptions::new()
            .write(true)
            .open(device)
            .map_err(|source| WatchdogError::Open {
                device: device.display().to_string(),
                source,
            })?;
        if let Some(expect) = expect {
            let opened = file.metadata().map_err(|source| WatchdogError::Open {
                device: device.display().to_string(),
                source,
            })?;
            if FileId::of(&opened) != expect {
                return Err(WatchdogError::Replaced {
                    device: device.display().to_string(),
                });
            }
        }
        Ok(Watchdog {
            file,
            device: device.to_path_buf(),
        })
    }

    /// Restarts the device's countdown.
    pub fn feed(&mut self) -> Result<(), WatchdogError> {
        self.file
            .write_all(b"1")
            .map_err(|source| WatchdogError::Write {
                device: self.device.display().to_string(),
                source,
            })
    }

    /// Magic close: the driver stops the timer when 'V' is the last byte before close (unless
    /// the kernel was built with nowayout). Only for a clean, configured stop.
    pub fn disarm(mut self) -> Result<(), WatchdogError> {
        self.file
            .write_all(b"V")
            .map_err(|source| WatchdogError::Write {
                device: self.device.display().to_string(),
                source,
            })
    }

    pub fn device(&self) -> &Path {
        &self.device
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(timeout: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let sysfs = dir.path().join("sys/class/watchdog/watchdog3");
        std::fs::create_dir_all(&sysfs).unwrap();
        std::fs::write(sysfs.join("timeout"), timeout).unwrap();
        let device = dir.path().join("watchdog3");
        std::fs::write(&device, "").unwrap();
        (dir, device)
    }

    /// [`fake`]'s watchdog opened with a 10 s timeout, no identity pinned.
    fn open_fake(dir: &tempfile::TempDir, device: &Path) -> Watchdog {
        Watchdog::open(
            device,
            Duration::from_secs(10),
            &dir.path().join("sys"),
            None,
        )
        .unwrap()
    }

    #[test]
    fn feeds_and_disarms_with_the_magic_byte() {
        let (dir, device) = fake("10\n");
        let mut w = open_fake(&dir, &device);
        w.feed().unwrap();
        w.feed().unwrap();
        w.disarm().unwrap();
        assert_eq!(std::fs::read(&device).unwrap(), b"11V");
    }

    #[test]
    fn dropping_never_writes_the_magic_byte() {
        let (dir, device) = fake("10");
        let mut w = open_fake(&dir, &device);
        w.feed().unwrap();
        drop(w);
        assert_eq!(std::fs::read(&device).unwrap(), b"1");
    }

    fn facts(resolved: &str, char_device: bool, rdev: (u64, u64), class: bool) -> DeviceFacts {
        DeviceFacts {
            resolved: PathBuf::from(resolved),
            char_device,
            rdev,
            in_watchdog_class: class,
            class_dev: None,
        }
    }

    #[test]
    fn watchdogs_are_the_misc_device_or_the_watchdog_class_under_dev() {
        let dev = Path::new("/dev");
        // /dev/watchdog: misc 10:130, no class entry of its own.
        assert_eq!(
            judge_device(&facts("/dev/watchdog", true, (10, 130), false), dev),
            Ok(())
        );
        // /dev/watchdog0: the class's own character device.
        assert_eq!(
            judge_device(&facts("/dev/watchdog0", true, (247, 0), true), dev),
            Ok(())
        );
        let with_dev = DeviceFacts {
            class_dev: Some("247:0\n".to_owned()),
            ..facts("/dev/watchdog0", true, (247, 0), true)
        };
        assert_eq!(judge_device(&with_dev, dev), Ok(()));
        let problem = |f: DeviceFacts| judge_device(&f, dev).unwrap_err();
        assert!(problem(facts("/dev/sda", false, (8, 0), false)).contains("not a character"));
        assert!(problem(facts("/tmp/watchdog", true, (10, 130), false)).contains("under /dev"));
        assert!(problem(facts("/dev/null", true, (1, 3), false)).contains("1:3"));
        let e = problem(DeviceFacts {
            class_dev: Some("247:1".to_owned()),
            ..facts("/dev/watchdog0", true, (247, 0), true)
        });
        assert!(e.contains("247:1"), "{e}");
    }

    #[test]
    fn check_device_resolves_the_path_and_names_what_it_found() {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        let sys = dir.path().join("sys");
        std::fs::create_dir_all(dev.join("watchdog")).unwrap();
        std::fs::create_dir_all(sys.join("class/watchdog/watchdog0")).unwrap();
        std::fs::write(dev.join("sda"), "").unwrap();
        std::fs::write(dev.join("watchdog0"), "").unwrap();
        std::os::unix::fs::symlink(dev.join("sda"), dev.join("watchdog1")).unwrap();
        let resolved_sda = std::fs::canonicalize(dev.join("sda")).unwrap();
        for (configured, resolved) in [
            // A regular file, even with the watchdog's name and class entry.
            (dev.join("watchdog0"), dev.join("watchdog0")),
            // A symlink to a disk-like path.
            (dev.join("watchdog1"), dev.join("sda")),
            // `..` out of the watchdog directory.
            (dev.join("watchdog/../sda"), dev.join("sda")),
        ] {
            let e = check_device(&configured, &dev, &sys).unwrap_err();
            let resolved = std::fs::canonicalize(resolved).unwrap();
            assert!(
                matches!(&e, WatchdogError::NotAWatchdog { resolved: r, .. } if *r == resolved.display().to_string()),
                "{configured:?}: {e}"
            );
            assert!(e.to_string().contains("not a character device"), "{e}");
        }
        assert!(resolved_sda.ends_with("dev/sda"));
        // Missing: named, with the likely cause.
        let e = check_device(&dev.join("watchdog9"), &dev, &sys).unwrap_err();
        assert!(
            matches!(e, WatchdogError::Resolve { .. }) && e.to_string().contains("softdog"),
            "{e}"
        );
        // A real character device that is no watchdog.
        if Path::new("/dev/null").exists() {
            let e = check_device(Path::new("/dev/null"), Path::new("/dev"), &sys).unwrap_err();
            assert!(e.to_string().contains("1:3"), "{e}");
            // Outside the given /dev root.
            let e = check_device(Path::new("/dev/null"), &dev, &sys).unwrap_err();
            assert!(e.to_string().contains("is not under"), "{e}");
        }
    }

    /// The file checked at start is the one opened: another file at that path is refused and
    /// never fed.
    #[test]
    fn a_watchdog_replaced_since_start_is_refused() {
        let (dir, device) = fake("10");
        let sys = dir.path().join("sys");
        let id = FileId::of(&std::fs::metadata(&device).unwrap());
        let mut w = Watchdog::open(&device, Duration::from_secs(10), &sys, Some(id)).unwrap();
        w.feed().unwrap();
        drop(w);
        // Another file renamed over it (made while the first exists, so another inode).
        let other = dir.path().join("other");
        std::fs::write(&other, "").unwrap();
        std::fs::rename(&other, &device).unwrap();
        let e = Watchdog::open(&device, Duration::from_secs(10), &sys, Some(id)).unwrap_err();
        assert!(matches!(e, WatchdogError::Replaced { .. }), "{e}");
        assert_eq!(
            std::fs::read(&device).unwrap(),
            b"",
            "the other file was not fed"
        );
    }

    #[test]
    fn a_device_timeout_other_than_configured_is_refused() {
        let (dir, device) = fake("60");
        let e = Watchdog::open(
            &device,
            Duration::from_secs(10),
            &dir.path().join("sys"),
            None,
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("60 s") && text.contains("soft_margin=10"),
            "{text}"
        );
        assert_eq!(
            std::fs::read(&device).unwrap(),
            b"",
            "not opened, not started"
        );
    }
}
