//! The hardware watchdog: opened once, fed with one byte per healthy check, disarmed with the
//! magic close ('V') only on a clean SIGTERM stop when configured.
//!
//! The agent does not program the timeout: that takes the WDIOC_SETTIMEOUT ioctl, and this crate
//! has no `unsafe` (only `sg-io` does). It reads the device's timeout from sysfs instead and
//! refuses to start on a mismatch, because the timing rules (`daemon` module docs) are checked
//! against the configured value. Dropping a [`Watchdog`] closes it *without* the magic byte, so
//! the kernel keeps the timer running ("watchdog did not stop!"): a fenced or crashed agent
//! leaves the node to be reset.

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

/// An open, running hardware watchdog.
#[derive(Debug)]
pub struct Watchdog {
    file: File,
    device: PathBuf,
}

impl Watchdog {
    /// Checks the device's timeout under `sys` (`/sys` on a node) and opens it, which starts it.
    pub fn open(device: &Path, timeout: Duration, sys: &Path) -> Result<Watchdog, WatchdogError> {
        check_timeout(device, timeout, sys)?;
        let file = OpenOptions::new()
            .write(true)
            .open(device)
            .map_err(|source| WatchdogError::Open {
                device: device.display().to_string(),
                source,
            })?;
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

    #[test]
    fn feeds_and_disarms_with_the_magic_byte() {
        let (dir, device) = fake("10\n");
        let mut w =
            Watchdog::open(&device, Duration::from_secs(10), &dir.path().join("sys")).unwrap();
        w.feed().unwrap();
        w.feed().unwrap();
        w.disarm().unwrap();
        assert_eq!(std::fs::read(&device).unwrap(), b"11V");
    }

    #[test]
    fn dropping_never_writes_the_magic_byte() {
        let (dir, device) = fake("10");
        let mut w =
            Watchdog::open(&device, Duration::from_secs(10), &dir.path().join("sys")).unwrap();
        w.feed().unwrap();
        drop(w);
        assert_eq!(std::fs::read(&device).unwrap(), b"1");
    }

    #[test]
    fn a_device_timeout_other_than_configured_is_refused() {
        let (dir, device) = fake("60");
        let e =
            Watchdog::open(&device, Duration::from_secs(10), &dir.path().join("sys")).unwrap_err();
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
