//! `prfence agent` configuration: TOML text in, validated typed [`Settings`] out.
//!
//! Reading the file is the caller's job; this module is pure so every rule is unit-tested.
//! Every error names the offending field (`lease.renew`, `device[2].path`, …) and, for timing
//! rules, states the rule and why it exists. The fully commented example is
//! `packaging/prfence-agent.toml`; a test parses it so it can never drift from this code.

use std::net::SocketAddr;
use std::num::NonZeroU16;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub mod reference;
pub mod timing;
mod value;

pub use value::parse_duration;
use value::{ConfigDuration, KeyDerive, KeyValue, LogFormat, Mode, Parsed, PathAudit, or_default};

use crate::keys::KeyScheme;
use crate::pr::Key;

/// A configuration the agent refused, with the field and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration is not valid TOML or has an unknown or mistyped field: {0}")]
    Syntax(String),
    #[error("{field}: {problem}")]
    Field { field: String, problem: String },
    #[error("timing rule violated: {rule}")]
    Timing { rule: String },
}

fn field_error(field: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        problem: problem.into(),
    }
}

/// Why a configuration file or the self-fence program is not trusted: `self_fence.command` runs
/// from it as root, so whoever can change the file can run anything as root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UntrustedFile {
    #[error(
        "mode {mode:04o} lets {who} write it, and self_fence.command runs from it as root; run \
         `chmod go-w {path}`"
    )]
    Writable {
        path: String,
        mode: u32,
        who: &'static str,
    },
    #[error(
        "owned by uid {owner}, neither root nor the agent's uid {running}: that user could change \
         what runs as self_fence.command; run `chown root: {path}` and `chmod 0600 {path}`"
    )]
    ForeignOwner {
        path: String,
        owner: u32,
        running: u32,
    },
    #[error(
        "it is in directory {dir} (mode {mode:04o}, uid {owner}), where {who} can replace it, and \
         self_fence.command runs from it as root; keep the file in a directory only root (or \
         the agent's user) can write, e.g. /etc/prfence, or run `chmod go-w {dir}`"
    )]
    ReplaceableIn {
        dir: String,
        mode: u32,
        owner: u32,
        who: &'static str,
    },
}

/// Whether the configuration file `path` (its `mode` and `owner` uid, from the open file) may be
/// trusted by an agent running as uid `running`: nobody but root and the agent's own user may be
/// able to write it. Group and others may read it (0644 is fine: the file holds no secret).
pub fn check_file_trust(
    path: &Path,
    mode: u32,
    owner: u32,
    running: u32,
) -> Result<(), UntrustedFile> {
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => Some("group and others"),
        (true, false) => Some("its group"),
        (false, true) => Some("others"),
        (false, false) => None,
    };
    if let Some(who) = who {
        return Err(UntrustedFile::Writable {
            path: path.display().to_string(),
            mode: mode & 0o7777,
            who,
        });
    }
    if owner != 0 && owner != running {
        return Err(UntrustedFile::ForeignOwner {
            path: path.display().to_string(),
            owner,
            running,
        });
    }
    Ok(())
}

/// Whether a directory on the configuration file's path (its `mode` and `owner` uid) lets
/// someone other than root and the agent's uid `running` replace the file: a rename over it needs
/// only write access to the directory. A sticky directory (/tmp) lets only the file's owner do
/// that, so it is trusted when root or `running` owns it.
pub fn check_dir_trust(
    dir: &Path,
    mode: u32,
    owner: u32,
    running: u32,
) -> Result<(), UntrustedFile> {
    let trusted_owner = owner == 0 || owner == running;
    let sticky = mode & 0o1000 != 0;
    let who = if !trusted_owner {
        Some("its owner")
    } else if sticky {
        None
    } else {
        match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => Some("group and others"),
            (true, false) => Some("its group"),
            (false, true) => Some("others"),
            (false, false) => None,
        }
    };
    match who {
        Some(who) => Err(UntrustedFile::ReplaceableIn {
            dir: dir.display().to_string(),
            mode: mode & 0o7777,
            owner,
            who,
        }),
        None => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Raw file shape (serde). Unknown fields are errors: a misspelt `grace` must not silently fall
// back to a default that changes when the node fences itself. Durations and words are typed
// ([`value`]); a value that does not parse is refused by validation, naming its field.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    mode: Parsed<Mode>,
    check_interval: Option<Parsed<ConfigDuration>>,
    command_timeout: Option<Parsed<ConfigDuration>>,
    #[serde(default)]
    unregister_on_exit: bool,
    #[serde(default)]
    device: Vec<RawDevice>,
    key: Option<RawKey>,
    watch: Option<RawWatch>,
    lease: Option<RawLease>,
    self_fence: Option<RawSelfFence>,
    watchdog: Option<RawWatchdog>,
    metrics: Option<RawMetrics>,
    log: Option<RawLog>,
    systemd: Option<RawSystemd>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    path: String,
    name: Option<String>,
    #[serde(default)]
    coordinator: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    value: Option<String>,
    derive: Option<Parsed<KeyDerive>>,
    node: Option<String>,
    key_value: Option<Parsed<KeyValue>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWatch {
    grace: Option<Parsed<ConfigDuration>>,
    missing_confirmations: Option<u32>,
    heal: Option<bool>,
    path_audit: Option<Parsed<PathAudit>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLease {
    node_id: u32,
    reservation: Option<Parsed<LeaseReservation>>,
    renew: Option<Parsed<ConfigDuration>>,
    lease: Option<Parsed<ConfigDuration>>,
    margin: Option<Parsed<ConfigDuration>>,
    clock_drift_ppm: Option<u32>,
    state_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelfFence {
    exit: Option<bool>,
    exit_status: Option<u8>,
    command: Option<Vec<String>>,
    command_timeout: Option<Parsed<ConfigDuration>>,
    reboot: Option<bool>,
    stop_watchdog: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWatchdog {
    device: String,
    timeout: Parsed<ConfigDuration>,
    magic_close: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    target: Option<Parsed<LogTarget>>,
    format: Option<Parsed<LogFormat>>,
    level: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSystemd {
    notify: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// Validated settings.

/// The validated configuration of `prfence agent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The LUs to watch or lease, in file order (each a SCSI disk, a dm-multipath device or an
    /// NVMe namespace; the daemon discovers the paths).
    pub devices: Vec<DeviceSettings>,
    /// How often each LU is read (watch mode; standby sampling in lease mode).
    pub check_interval: Duration,
    /// Bound on one PR command; a command that takes longer counts as a timeout.
    pub command_timeout: Duration,
    pub mode: ModeSettings,
    pub self_fence: SelfFenceSettings,
    pub watchdog: Option<WatchdogSettings>,
    /// Prometheus endpoint; `None` serves no metrics.
    pub metrics_listen: Option<SocketAddr>,
    pub log: LogSettings,
    /// Whether to send sd_notify READY/STOPPING/WATCHDOG (`Type=notify` in the unit).
    pub sd_notify: SdNotify,
    /// Remove our registrations on SIGTERM. Off by default: a restart must not look like, or
    /// race with, being fenced.
    pub unregister_on_exit: bool,
}

/// `[systemd] notify`: set in the file, or unset and then on exactly when `NOTIFY_SOCKET` is
/// set (by systemd, for a `Type=notify` unit such as the packaged one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdNotify {
    FollowNotifySocket,
    On,
    Off,
}

impl SdNotify {
    /// Whether the agent notifies, given whether `NOTIFY_SOCKET` is set ([`notify_socket_set`]).
    pub fn enabled(self, notify_socket_set: bool) -> bool {
        match self {
            SdNotify::FollowNotifySocket => notify_socket_set,
            SdNotify::On => true,
            SdNotify::Off => false,
        }
    }
}

/// Whether the value of `NOTIFY_SOCKET` names a socket: set and not empty.
pub fn notify_socket_set(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| !v.is_empty())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSettings {
    pub path: PathBuf,
    /// Label for logs and metrics; defaults to the path.
    pub name: String,
    /// One of the coordinators (issue 47, watch mode): our key gone from it alone does not
    /// fence, gone from a majority of them does (`watch::WatchConfig::coordinators`).
    pub coordinator: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModeSettings {
    Watch(WatchModeSettings),
    Lease(LeaseModeSettings),
}

impl ModeSettings {
    /// The mode as the configuration names it (`mode = "watch"`), for the status and logs.
    pub fn name(&self) -> &'static str {
        match self {
            ModeSettings::Watch(_) => "watch",
            ModeSettings::Lease(_) => "lease",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchModeSettings {
    pub key: KeySpec,
    /// How long an LU may go without a good check before we treat ourselves as fenced.
    pub grace: Duration,
    /// Consecutive reads that must miss our key before we call it fenced (1 = the first).
    pub missing_confirmations: u32,
    /// Purge orphaned registrations of our key where one atomic command can (never registers:
    /// a path without a registration needs `prfence unfence`, P3).
    pub heal: bool,
    /// Also probe every path's registration this often while all looks right; `None` ("off",
    /// the default): only on a change (`watch::WatchState`), since a probe is a PR OUT.
    pub path_audit: Option<Duration>,
}

/// Where our own key comes from in watch mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    Given(Key),
    /// Derived exactly as `fence_pr` derives it (the caller runs that derivation, which asks
    /// corosync). `node` defaults to the node corosync runs as
    /// here (`crate::whoami`).
    Derive {
        scheme: KeyScheme,
        node: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseModeSettings {
    pub node_id: NonZeroU16,
    pub reservation: LeaseReservation,
    pub renew: Duration,
    pub lease: Duration,
    pub margin: Duration,
    pub clock_drift_ppm: u32,
    /// Where the highest reserved key epoch is kept (see `lease` module docs).
    pub state_file: PathBuf,
}

/// The reservation type a lease holder keeps. Maps to `crate::pr::ReservationType::
/// {WriteExclusive, ExclusiveAccess}`; the registrants-only and all-registrants types are
/// refused because there every registered standby could write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseReservation {
    WriteExclusive,
    ExclusiveAccess,
}

impl std::str::FromStr for LeaseReservation {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "write-exclusive" => Ok(LeaseReservation::WriteExclusive),
            "exclusive-access" => Ok(LeaseReservation::ExclusiveAccess),
            other => Err(format!(
                "{other:?} is not \"write-exclusive\" or \"exclusive-access\" (the \
                 registrants types would let every standby write)"
            )),
        }
    }
}

/// What the agent does once it decides it is fenced (in this order: stop feeding the watchdog,
/// run the command, reboot, exit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfFenceSettings {
    pub stop_watchdog: bool,
    pub command: Option<Vec<String>>,
    pub command_timeout: Duration,
    /// `reboot(2)` immediately, without sync: dirty pages of a fenced node must not reach disk.
    pub reboot: bool,
    /// Exit with `exit_status` (distinct, so the unit's `RestartPreventExitStatus=` keeps a
    /// fenced agent down).
    pub exit_status: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogSettings {
    pub device: PathBuf,
    /// The device's timeout, which the agent checks at start (sysfs) because it cannot set
    /// it: the node resets this long after the last feed.
    pub timeout: Duration,
    /// Disarm the watchdog (magic close, 'V') when stopped cleanly by SIGTERM (default on, so
    /// that `systemctl stop`, `restart` and an orderly reboot, which stops the agent after
    /// Pacemaker, reset nothing). Off: the node resets `timeout` after any stop, unless something
    /// else feeds it. Never done when fenced; a crash or SIGKILL leaves it armed either way.
    pub magic_close: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    pub target: LogTarget,
    pub json: bool,
    /// A `tracing_subscriber::EnvFilter` directive.
    pub level: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTarget {
    Journald,
    Stderr,
}

impl std::str::FromStr for LogTarget {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "journald" => Ok(LogTarget::Journald),
            "stderr" => Ok(LogTarget::Stderr),
            other => Err(format!("{other:?} is not \"journald\" or \"stderr\"")),
        }
    }
}

/// Where `[metrics]` without `listen` serves: loopback only.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";

/// Exit status used when fenced unless configured otherwise (not 0, 1 = generic error, 2, or
/// systemd's reserved 200–242).
pub const DEFAULT_FENCED_EXIT_STATUS: u8 = 86;

/// The longest `command_timeout`: SG_IO carries a command's timeout in a u32 of milliseconds
/// (`u32::MAX` means "none"), about 49.7 days.
pub const MAX_COMMAND_TIMEOUT: Duration = Duration::from_millis(u32::MAX as u64 - 1);

/// Time allowed beyond `command_timeout` for the kernel's own timeout to fire first.
pub const TIMEOUT_SLACK: Duration = Duration::from_millis(200);

/// How long the driver waits for one command: `command_timeout` and [`TIMEOUT_SLACK`] (the
/// executor's bound; a timing rule, so it lives with the others).
pub fn command_slot(command_timeout: Duration) -> Duration {
    command_timeout.saturating_add(TIMEOUT_SLACK)
}

/// How many command slots (`command_timeout` + 200 ms each) one watch check may take: READ
/// KEYS on the first live path of each LU (all LUs at once), READ KEYS on every other live path
/// at once if the first did not answer, and the path probes, all paths at once. Heals run beside
/// the checks under their own deadline, so they never delay the watchdog's feeding.
pub const CHECK_SLOTS: u32 = 3;

/// The most one watch check may take, from its start (discovery included) to feeding the
/// watchdog. The watch loop cuts the check off there (an LU still pending counts as a timed-out
/// read) and the timing rules use it, so `--check-config` and the agent compute the same number.
pub fn check_budget(command_timeout: Duration) -> Duration {
    command_slot(command_timeout).saturating_mul(CHECK_SLOTS)
}

/// The longest two feeds of a watchdog can be apart: a check starts at most `check_interval`
/// after the previous one ended (the ticker never bursts) and ends within its budget.
pub fn feed_gap(check_interval: Duration, command_timeout: Duration) -> Duration {
    check_interval.saturating_add(check_budget(command_timeout))
}

/// `WatchdogSec=` of the packaged unit (packaging/prfence-agent.service, pinned by a test). A
/// start under systemd checks against the value systemd passes (`WATCHDOG_USEC`); without it
/// (`--check-config` in `ExecStartPre=`, a start by hand) against this one
/// ([`super::entry::service_watchdog`]).
pub const UNIT_WATCHDOG_SEC: Duration = Duration::from_secs(30);

/// The longest `watch.grace`, `lease.lease` and `self_fence.command_timeout`: the first two say
/// how long a node may go on unsure of its registration, the last how long a fenced node's
/// self-fence may wait for its hook; beyond an hour each is a typo, and none may overflow the
/// sums the timing rules and the loops make of them.
pub const MAX_LONG_DURATION: Duration = Duration::from_secs(3600);
/// The longest `watch.path_audit` period: a day.
pub const MAX_PATH_AUDIT: Duration = Duration::from_secs(24 * 3600);

/// `value` of `field`, refused above `max`.
fn at_most(field: &str, value: Duration, max: Duration) -> Result<Duration, ConfigError> {
    if value > max {
        return Err(field_error(
            field,
            format!("{value:?} is more than {max:?}; durations this long are typos"),
        ));
    }
    Ok(value)
}

const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(100);
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(3600);
const MAX_NODE_ID: u32 = u16::MAX as u32;

impl Settings {
    /// Parses and validates a configuration file's text.
    pub fn from_toml_str(text: &str) -> Result<Settings, ConfigError> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        Settings::validate(raw)
    }

    fn validate(raw: RawConfig) -> Result<Settings, ConfigError> {
        let ConfigDuration(check_interval) =
            or_default("check_interval", raw.check_interval, "2s")?;
        if !(MIN_CHECK_INTERVAL..=MAX_CHECK_INTERVAL).contains(&check_interval) {
            return Err(field_error(
                "check_interval",
                format!(
                    "{check_interval:?} is outside 100ms..1h: faster burns CPU and target \
                     bandwidth for nothing (fence_scsi_check's 20% CPU, fence-agents #313), \
                     slower detects fencing too late"
                ),
            ));
        }
        let ConfigDuration(command_timeout) =
            or_default("command_timeout", raw.command_timeout, "2s")?;
        if command_timeout.is_zero() {
            return Err(field_error("command_timeout", "must be greater than 0"));
        }
        if command_timeout > MAX_COMMAND_TIMEOUT {
            return Err(field_error(
                "command_timeout",
                format!(
                    "{command_timeout:?} is more than SG_IO can carry: at most \
                     {}ms (a u32 of milliseconds, about 49 days)",
                    MAX_COMMAND_TIMEOUT.as_millis()
                ),
            ));
        }
        let devices = validate_devices(raw.device)?;
        let mode = match raw.mode.get("mode")? {
            Mode::Watch => {
                if raw.lease.is_some() {
                    return Err(field_error(
                        "lease",
                        "a [lease] table needs mode = \"lease\"",
                    ));
                }
                ModeSettings::Watch(validate_watch(raw.key, raw.watch)?)
            }
            Mode::Lease => {
                if let Some(index) = devices.iter().position(|d| d.coordinator) {
                    return Err(field_error(
                        format!("device[{index}].coordinator"),
                        "coordinators decide fences in watch mode; lease mode's holder is decided \
                         on its LUs themselves",
                    ));
                }
                if raw.key.is_some() {
                    return Err(field_error(
                        "key",
                        "lease mode makes its own keys from lease.node_id and an epoch; remove [key]",
                    ));
                }
                if raw.watch.is_some() {
                    return Err(field_error(
                        "watch",
                        "a [watch] table needs mode = \"watch\"",
                    ));
                }
                let lease = raw.lease.ok_or_else(|| {
                    field_error("lease", "mode = \"lease\" needs a [lease] table")
                })?;
                ModeSettings::Lease(validate_lease(lease)?)
            }
        };
        let watchdog = raw.watchdog.map(validate_watchdog).transpose()?;
        let self_fence = validate_self_fence(raw.self_fence, watchdog.is_some())?;
        let metrics_listen = raw
            .metrics
            .map(|m| {
                let listen = m
                    .listen
                    .unwrap_or_else(|| DEFAULT_METRICS_LISTEN.to_owned());
                listen.parse::<SocketAddr>().map_err(|e| {
                    field_error(
                        "metrics.listen",
                        format!("{listen:?} is not an address:port ({e})"),
                    )
                })
            })
            .transpose()?;
        let log = validate_log(raw.log)?;
        let settings = Settings {
            devices,
            check_interval,
            command_timeout,
            mode,
            self_fence,
            watchdog,
            metrics_listen,
            log,
            sd_notify: match raw.systemd.and_then(|s| s.notify) {
                None => SdNotify::FollowNotifySocket,
                Some(true) => SdNotify::On,
                Some(false) => SdNotify::Off,
            },
            unregister_on_exit: raw.unregister_on_exit,
        };
        settings.check_timing()?;
        Ok(settings)
    }

    /// What the configuration allows but an admin should hear about: `--check-config` prints
    /// it, a start and a reload log it.
    pub fn warnings(&self) -> Vec<String> {
        let mut said = Vec::new();
        if let Some(listen) = self.metrics_listen
            && !listen.ip().is_loopback()
        {
            said.push(format!(
                "metrics.listen = \"{listen}\" serves /metrics and /status beyond this host, \
                 without authentication (they show this node's keys, LUs and state); the \
                 packaged unit's IPAddressAllow=localhost drops other hosts' packets unless a \
                 drop-in widens it"
            ));
        }
        if matches!(self.mode, ModeSettings::Lease(_)) && self.watchdog.is_none() {
            said.push(
                "lease mode without [watchdog]: a holder that hangs (a frozen process, a stalled \
                 kernel) is not reset; once a standby takes over, the target refuses its writes, \
                 but its services keep running until it wakes up and stops at its own deadline"
                    .to_owned(),
            );
        }
        said
    }

    /// When the agent notifies systemd (`notifying`), the unit's `WatchdogSec=` (`watchdog_sec`)
    /// must exceed the longest gap between two checks' ends ([`feed_gap`]): WATCHDOG=1 is sent
    /// once per check.
    pub fn check_service_watchdog(
        &self,
        watchdog_sec: Duration,
        notifying: bool,
    ) -> Result<(), ConfigError> {
        let gap = feed_gap(self.check_interval, self.command_timeout);
        if notifying && watchdog_sec <= gap {
            return Err(ConfigError::Timing {
                rule: format!(
                    "the unit's WatchdogSec ({watchdog_sec:?}) must exceed check_interval + the \
                     check's budget ({CHECK_SLOTS} x (command_timeout + 200ms)) = {gap:?}: \
                     WATCHDOG=1 is sent once a check ends, so systemd would kill a healthy agent \
                     whose check waits on hung paths; raise WatchdogSec= (a drop-in) or lower \
                     check_interval or command_timeout"
                ),
            });
        }
        Ok(())
    }

    /// The timing rules the file alone decides, in the table's order ([`timing::TIMING_RULES`],
    /// which says why each exists); the first one broken is the refusal.
    fn check_timing(&self) -> Result<(), ConfigError> {
        for rule in timing::TIMING_RULES {
            if let timing::Enforced::Check(check) = rule.enforced {
                check(self).map_err(|rule| ConfigError::Timing { rule })?;
            }
        }
        Ok(())
    }
}

fn validate_devices(raw: Vec<RawDevice>) -> Result<Vec<DeviceSettings>, ConfigError> {
    if raw.is_empty() {
        return Err(field_error(
            "device",
            "no [[device]] given; list every LU the node uses (path = \"/dev/mapper/…\")",
        ));
    }
    if raw.len() > crate::MAX_DEVICES {
        return Err(field_error(
            "device",
            format!(
                "{} [[device]] entries; at most {} (each LU is checked concurrently): split the \
                 LUs across agents on different nodes or group them in fewer multipath maps",
                raw.len(),
                crate::MAX_DEVICES
            ),
        ));
    }
    let mut devices: Vec<DeviceSettings> = Vec::with_capacity(raw.len());
    for (index, device) in raw.into_iter().enumerate() {
        let field = format!("device[{index}].path");
        if !device.path.starts_with("/dev/") {
            return Err(field_error(
                field,
                format!("{:?} is not under /dev/", device.path),
            ));
        }
        let name = device.name.unwrap_or_else(|| device.path.clone());
        if let Some(earlier) = devices
            .iter()
            .position(|d| d.name == name || d.path.as_os_str() == device.path.as_str())
        {
            return Err(field_error(
                field,
                format!(
                    "{:?} duplicates device[{earlier}] (same path or name)",
                    device.path
                ),
            ));
        }
        devices.push(DeviceSettings {
            path: PathBuf::from(device.path),
            name,
            coordinator: device.coordinator,
        });
    }
    let coordinators = devices.iter().filter(|d| d.coordinator).count();
    if coordinators != 0 && !crate::ops::coordinator_count_ok(coordinators) {
        return Err(field_error(
            "device",
            format!(
                "{coordinators} devices have coordinator = true; coordinators are 3 or 5 (an odd \
                 number, so that two majorities always share one), the same set on every node \
                 and in fence_pr's coordinators="
            ),
        ));
    }
    if coordinators == devices.len() {
        return Err(field_error(
            "device",
            "every [[device]] has coordinator = true: list the data LUs too (coordinators only \
             decide who survives a fence; the data LUs are what it protects)",
        ));
    }
    Ok(devices)
}

fn validate_key(raw: Option<RawKey>) -> Result<KeySpec, ConfigError> {
    let raw = raw.ok_or_else(|| {
        field_error(
            "key",
            "watch mode needs a [key] table: value = \"0x…\", or derive = \"native\" | \"fence_scsi\"",
        )
    })?;
    match (raw.value, raw.derive) {
        (Some(_), Some(_)) => Err(field_error(
            "key",
            "give either key.value or key.derive, not both",
        )),
        (None, None) => Err(field_error("key", "give key.value or key.derive")),
        (Some(value), None) => {
            if raw.node.is_some() || raw.key_value.is_some() {
                return Err(field_error(
                    "key",
                    "key.node and key.key_value only apply with key.derive",
                ));
            }
            let key: Key = value
                .parse()
                .map_err(|e| field_error("key.value", format!("{e}")))?;
            if key.is_zero() {
                return Err(field_error("key.value", "0 is not a valid reservation key"));
            }
            Ok(KeySpec::Given(key))
        }
        (None, Some(derive)) => {
            let scheme = match (derive.get("key.derive")?, raw.key_value) {
                (KeyDerive::Native, None) => KeyScheme::Native,
                (KeyDerive::Native, Some(_)) => {
                    return Err(field_error(
                        "key.key_value",
                        "only applies with derive = \"fence_scsi\"",
                    ));
                }
                (KeyDerive::FenceScsi, None) => KeyScheme::FenceScsiId,
                (KeyDerive::FenceScsi, Some(key_value)) => match key_value.get("key.key_value")? {
                    KeyValue::Id => KeyScheme::FenceScsiId,
                    KeyValue::Hash => KeyScheme::FenceScsiHash,
                },
            };
            if raw.node.as_deref().is_some_and(str::is_empty) {
                return Err(field_error("key.node", "must not be empty"));
            }
            Ok(KeySpec::Derive {
                scheme,
                node: raw.node,
            })
        }
    }
}

fn validate_watch(
    key: Option<RawKey>,
    raw: Option<RawWatch>,
) -> Result<WatchModeSettings, ConfigError> {
    let key = validate_key(key)?;
    let (grace, confirmations, heal, path_audit) = match raw {
        Some(w) => (w.grace, w.missing_confirmations, w.heal, w.path_audit),
        None => (None, None, None, None),
    };
    let missing_confirmations = confirmations.unwrap_or(2);
    if !(1..=10).contains(&missing_confirmations) {
        return Err(field_error(
            "watch.missing_confirmations",
            format!(
                "{missing_confirmations} is outside 1..10 (1 fences on the first read without \
                 our key; 2 re-reads once, which rides out a brief re-registration, \
                 fence-agents #576)"
            ),
        ));
    }
    Ok(WatchModeSettings {
        key,
        grace: at_most(
            "watch.grace",
            or_default::<ConfigDuration>("watch.grace", grace, "20s")?.0,
            MAX_LONG_DURATION,
        )?,
        missing_confirmations,
        heal: heal.unwrap_or(true),
        path_audit: or_default::<PathAudit>("watch.path_audit", path_audit, "off")?
            .0
            .map(|every| at_most("watch.path_audit", every, MAX_PATH_AUDIT))
            .transpose()?,
    })
}

fn validate_lease(raw: RawLease) -> Result<LeaseModeSettings, ConfigError> {
    let node_id = u16::try_from(raw.node_id)
        .ok()
        .and_then(NonZeroU16::new)
        .ok_or_else(|| {
            field_error(
                "lease.node_id",
                format!(
                    "{} is outside 1..{MAX_NODE_ID}: it fills the key's top 16 bits and must \
                     differ on every node sharing the LUs",
                    raw.node_id
                ),
            )
        })?;
    let reservation = or_default("lease.reservation", raw.reservation, "write-exclusive")?;
    let ConfigDuration(lease) = or_default("lease.lease", raw.lease, "15s")?;
    if lease.is_zero() {
        return Err(field_error("lease.lease", "must be greater than 0"));
    }
    let lease = at_most("lease.lease", lease, MAX_LONG_DURATION)?;
    let clock_drift_ppm = raw.clock_drift_ppm.unwrap_or(1000);
    if clock_drift_ppm > 100_000 {
        return Err(field_error(
            "lease.clock_drift_ppm",
            format!(
                "{clock_drift_ppm} ppm is a clock more than 10% off; fix the clock source \
                 (monotonic clocks are within 100 ppm) rather than the setting"
            ),
        ));
    }
    let state_file = raw
        .state_file
        .unwrap_or_else(|| "/var/lib/prfence/lease-epoch".to_owned());
    if !state_file.starts_with('/') {
        return Err(field_error("lease.state_file", "must be an absolute path"));
    }
    Ok(LeaseModeSettings {
        node_id,
        reservation,
        renew: or_default::<ConfigDuration>("lease.renew", raw.renew, "3s")?.0,
        lease,
        margin: or_default::<ConfigDuration>("lease.margin", raw.margin, "3s")?.0,
        clock_drift_ppm,
        state_file: PathBuf::from(state_file),
    })
}

fn validate_watchdog(raw: RawWatchdog) -> Result<WatchdogSettings, ConfigError> {
    if !raw.device.starts_with("/dev/watchdog") {
        return Err(field_error(
            "watchdog.device",
            format!("{:?} is not a /dev/watchdog* device", raw.device),
        ));
    }
    // `..` would leave /dev/watchdog* (the file system check at start resolves symlinks too).
    if Path::new(&raw.device)
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(field_error(
            "watchdog.device",
            format!(
                "{:?} has a \"..\" component; name the watchdog itself, e.g. /dev/watchdog0",
                raw.device
            ),
        ));
    }
    let ConfigDuration(timeout) = raw.timeout.get("watchdog.timeout")?;
    if timeout < Duration::from_secs(1) || timeout.subsec_millis() != 0 {
        return Err(field_error(
            "watchdog.timeout",
            format!("{timeout:?}: watchdog devices take whole seconds, at least 1s"),
        ));
    }
    Ok(WatchdogSettings {
        device: PathBuf::from(raw.device),
        timeout,
        magic_close: raw.magic_close.unwrap_or(true),
    })
}

fn validate_self_fence(
    raw: Option<RawSelfFence>,
    have_watchdog: bool,
) -> Result<SelfFenceSettings, ConfigError> {
    let raw = raw.unwrap_or(RawSelfFence {
        exit: None,
        exit_status: None,
        command: None,
        command_timeout: None,
        reboot: None,
        stop_watchdog: None,
    });
    if raw.exit == Some(false) && raw.exit_status.is_some() {
        return Err(field_error(
            "self_fence.exit_status",
            "set, but self_fence.exit = false",
        ));
    }
    let exit_status = match (raw.exit.unwrap_or(true), raw.exit_status) {
        (false, _) => None,
        (true, None) => Some(DEFAULT_FENCED_EXIT_STATUS),
        (true, Some(status @ (0..=2 | 200..=242))) => {
            return Err(field_error(
                "self_fence.exit_status",
                format!(
                    "{status} is ambiguous: 0 is success, 1 and 2 are generic errors, 200-242 \
                     are systemd's own; pick a distinct value and list it in the unit's \
                     RestartPreventExitStatus="
                ),
            ));
        }
        (true, Some(status)) => Some(status),
    };
    let command = match raw.command {
        Some(argv) if argv.is_empty() || !argv[0].starts_with('/') => {
            return Err(field_error(
                "self_fence.command",
                "must be a non-empty argv whose first element is an absolute path",
            ));
        }
        other => other,
    };
    let stop_watchdog = raw.stop_watchdog.unwrap_or(have_watchdog);
    if stop_watchdog && !have_watchdog {
        return Err(field_error(
            "self_fence.stop_watchdog",
            "true, but no [watchdog] is configured",
        ));
    }
    let reboot = raw.reboot.unwrap_or(false);
    if exit_status.is_none() && command.is_none() && !reboot && !stop_watchdog {
        return Err(field_error(
            "self_fence",
            "no action left: enable at least one of exit, command, reboot, stop_watchdog",
        ));
    }
    let ConfigDuration(command_timeout) =
        or_default("self_fence.command_timeout", raw.command_timeout, "2s")?;
    if command_timeout.is_zero() {
        return Err(field_error(
            "self_fence.command_timeout",
            "must be greater than 0: the hook would be killed before it could run",
        ));
    }
    let command_timeout = at_most(
        "self_fence.command_timeout",
        command_timeout,
        MAX_LONG_DURATION,
    )?;
    Ok(SelfFenceSettings {
        stop_watchdog,
        command,
        command_timeout,
        reboot,
        exit_status,
    })
}

fn validate_log(raw: Option<RawLog>) -> Result<LogSettings, ConfigError> {
    let (target, format, level) = match raw {
        Some(l) => (l.target, l.format, l.level),
        None => (None, None, None),
    };
    let target = or_default("log.target", target, "journald")?;
    let json = or_default("log.format", format, "text")? == LogFormat::Json;
    let level = level.unwrap_or_else(|| "info".to_owned());
    // An empty filter turns logging off: the self-fence and every error would go unlogged.
    if level.trim().is_empty() {
        return Err(field_error(
            "log.level",
            "is empty; leave it out for \"info\", or name a level (error, warn, info, debug, \
             trace)",
        ));
    }
    // The parser start and SIGHUP use (logging.rs), so --check-config refuses what they would.
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&level) {
        return Err(field_error(
            "log.level",
            format!(
                "{level:?} is not a tracing filter ({e}); use a level (error, warn, info, debug, \
                 trace) or directives such as \"info,prfence=debug\""
            ),
        ));
    }
    Ok(LogSettings {
        target,
        json,
        level,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::watch::LuName;

    const WATCH: &str = r#"
mode = "watch"
[[device]]
path = "/dev/mapper/mpatha"
[key]
value = "0xabc"
"#;

    const LEASE: &str = r#"
mode = "lease"
check_interval = "1s"
[[device]]
path = "/dev/sdb"
[lease]
node_id = 2
renew = "2s"
lease = "10s"
margin = "2s"
"#;

    fn timing_error(text: &str) -> String {
        match Settings::from_toml_str(text) {
            Err(ConfigError::Timing { rule }) => rule,
            other => panic!("expected a timing error, got {other:?}"),
        }
    }

    fn field_of(text: &str) -> String {
        match Settings::from_toml_str(text) {
            Err(ConfigError::Field { field, .. }) => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn a_directory_others_can_write_is_not_trusted() {
        let dir = Path::new("/srv/conf");
        let check = |mode, owner, running| check_dir_trust(dir, mode, owner, running);
        for (mode, owner, running) in [
            (0o755, 0, 0),
            (0o700, 1000, 1000),
            (0o755, 0, 1000),
            // /tmp: sticky, root's
            (0o1777, 0, 0),
            (0o41777, 0, 1000),
        ] {
            assert_eq!(check(mode, owner, running), Ok(()), "{mode:o} {owner}");
        }
        for (mode, owner, running, who) in [
            (0o775, 0, 0, "its group"),
            (0o757, 0, 0, "others"),
            (0o777, 0, 0, "group and others"),
            (0o755, 1000, 0, "its owner"),
            (0o1777, 1000, 0, "its owner"),
        ] {
            let e = check(mode, owner, running).unwrap_err();
            assert_eq!(
                e,
                UntrustedFile::ReplaceableIn {
                    dir: dir.display().to_string(),
                    mode: mode & 0o7777,
                    owner,
                    who
                },
                "{mode:o} {owner}"
            );
            assert!(e.to_string().contains("/srv/conf"), "{e}");
        }
    }

    #[test]
    fn a_file_others_can_write_or_another_user_owns_is_not_trusted() {
        let path = Path::new("/etc/prfence/agent.toml");
        let check = |mode, owner, running| check_file_trust(path, mode, owner, running);
        // Root's file and the agent's own, readable or not by others.
        for mode in [0o600, 0o644, 0o640, 0o400, 0o444, 0o100_644, 0o4755] {
            assert_eq!(check(mode, 0, 0), Ok(()), "{mode:o}");
            assert_eq!(check(mode, 1000, 1000), Ok(()), "{mode:o}");
            assert_eq!(check(mode, 0, 1000), Ok(()), "{mode:o}");
        }
        for (mode, who) in [
            (0o664, "its group"),
            (0o620, "its group"),
            (0o646, "others"),
            (0o602, "others"),
            (0o666, "group and others"),
            (0o100_666, "group and others"),
        ] {
            let e = check(mode, 0, 0).unwrap_err();
            assert_eq!(
                e,
                UntrustedFile::Writable {
                    path: path.display().to_string(),
                    mode: mode & 0o7777,
                    who
                }
            );
            let text = e.to_string();
            assert!(text.contains(&format!("mode {:04o} lets {who} write it", mode & 0o7777)));
            assert!(
                text.contains("`chmod go-w /etc/prfence/agent.toml`"),
                "{text}"
            );
        }
        // Another user's file: refused for root and for anyone else.
        for running in [0, 1000] {
            let e = check(0o600, 4242, running).unwrap_err();
            assert!(matches!(e, UntrustedFile::ForeignOwner { owner: 4242, .. }));
            assert!(
                e.to_string()
                    .contains("`chown root: /etc/prfence/agent.toml`"),
                "{e}"
            );
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3m"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in [
            "",
            "5",
            "s",
            "1.5s",
            "-1s",
            "2 s",
            "1d",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn minimal_watch_gets_defaults() {
        let s = Settings::from_toml_str(WATCH).unwrap();
        assert_eq!(s.check_interval, Duration::from_secs(2));
        assert_eq!(s.devices[0].name, "/dev/mapper/mpatha");
        let ModeSettings::Watch(w) = &s.mode else {
            panic!()
        };
        assert_eq!(w.key, KeySpec::Given(Key::new(0xabc)));
        assert_eq!(w.grace, Duration::from_secs(20));
        assert_eq!(w.missing_confirmations, 2);
        assert!(w.heal);
        let c = s.watch_config(Key::new(7)).unwrap();
        assert_eq!(
            (c.own_key, c.grace, c.path_audit),
            (Key::new(7), w.grace, None)
        );
        assert!(s.lease_config().is_none());
        assert_eq!(s.self_fence.exit_status, Some(DEFAULT_FENCED_EXIT_STATUS));
        assert!(!s.self_fence.stop_watchdog);
        assert_eq!(s.log.target, LogTarget::Journald);
        assert!(!s.unregister_on_exit);
    }

    #[test]
    fn minimal_lease() {
        let s = Settings::from_toml_str(LEASE).unwrap();
        let ModeSettings::Lease(l) = &s.mode else {
            panic!()
        };
        assert_eq!(l.node_id.get(), 2);
        let c = s.lease_config().unwrap();
        assert_eq!(
            (c.renew, c.lease, c.margin),
            (
                Duration::from_secs(2),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        assert_eq!(c.check_interval, Duration::from_secs(1));
        assert!(s.watch_config(Key::new(1)).is_none());
        assert_eq!(l.reservation, LeaseReservation::WriteExclusive);
        assert_eq!(l.state_file, PathBuf::from("/var/lib/prfence/lease-epoch"));
    }

    #[test]
    fn packaged_example_is_valid() {
        let text = include_str!("../../packaging/prfence-agent.toml");
        let s = Settings::from_toml_str(text).unwrap();
        assert!(matches!(s.mode, ModeSettings::Watch(_)));
        assert!(s.watchdog.is_some());
        // The lease example, commented out in the file, must be valid too.
        let lease: String = text
            .lines()
            .filter_map(|l| l.strip_prefix("#> "))
            .collect::<Vec<_>>()
            .join("\n");
        let s = Settings::from_toml_str(&lease).unwrap();
        assert!(matches!(s.mode, ModeSettings::Lease(_)));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err =
            Settings::from_toml_str(&format!("{WATCH}\n[watch]\ngrase = \"5s\"\n")).unwrap_err();
        assert!(
            matches!(err, ConfigError::Syntax(ref m) if m.contains("grase")),
            "{err}"
        );
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field_of(&WATCH.replace("0xabc", "0xzz")), "key.value");
        assert_eq!(field_of(&WATCH.replace("0xabc", "0")), "key.value");
        assert_eq!(
            field_of(&WATCH.replace("/dev/mapper/mpatha", "sdb")),
            "device[0].path"
        );
        assert_eq!(field_of(&WATCH.replace("\"watch\"", "\"wach\"")), "mode");
        assert_eq!(
            field_of(&format!("check_interval = \"5\"\n{WATCH}")),
            "check_interval"
        );
        assert_eq!(
            field_of(&format!("check_interval = \"10ms\"\n{WATCH}")),
            "check_interval"
        );
        assert_eq!(
            field_of(&format!(
                "{WATCH}[[device]]\npath = \"/dev/mapper/mpatha\"\n"
            )),
            "device[1].path"
        );
        assert_eq!(
            field_of(&LEASE.replace("node_id = 2", "node_id = 0")),
            "lease.node_id"
        );
        assert_eq!(
            field_of(&LEASE.replace("node_id = 2", "node_id = 65536")),
            "lease.node_id"
        );
        assert_eq!(
            field_of(&format!(
                "{LEASE}reservation = \"write-exclusive-registrants-only\"\n"
            )),
            "lease.reservation"
        );
        assert_eq!(field_of(&format!("{LEASE}[key]\nvalue = \"1\"\n")), "key");
        assert_eq!(
            field_of(&format!("{WATCH}[self_fence]\nexit_status = 1\n")),
            "self_fence.exit_status"
        );
        assert_eq!(
            field_of(&format!("{WATCH}[self_fence]\nexit = false\n")),
            "self_fence"
        );
        assert_eq!(
            field_of(&format!("{WATCH}[self_fence]\nstop_watchdog = true\n")),
            "self_fence.stop_watchdog"
        );
        assert_eq!(
            field_of(&format!("{WATCH}[self_fence]\ncommand = [\"hook\"]\n")),
            "self_fence.command"
        );
        assert_eq!(
            field_of(&format!(
                "{WATCH}[watchdog]\ndevice = \"/dev/sda\"\ntimeout = \"10s\"\n"
            )),
            "watchdog.device"
        );
        assert_eq!(
            field_of(&format!(
                "{WATCH}[watchdog]\ndevice = \"/dev/watchdog0\"\ntimeout = \"1500ms\"\n"
            )),
            "watchdog.timeout"
        );
        assert_eq!(
            field_of(&format!("{WATCH}[metrics]\nlisten = \"localhost\"\n")),
            "metrics.listen"
        );
        let s = Settings::from_toml_str(&format!("{WATCH}[metrics]\n")).unwrap();
        assert_eq!(
            s.metrics_listen,
            Some(DEFAULT_METRICS_LISTEN.parse().unwrap())
        );
        assert_eq!(
            field_of(&format!("{WATCH}[log]\nformat = \"xml\"\n")),
            "log.format"
        );
        assert_eq!(
            field_of(&format!("{WATCH}[watch]\nmissing_confirmations = 0\n")),
            "watch.missing_confirmations"
        );
        assert_eq!(
            field_of("mode = \"watch\"\n[[device]]\npath = \"/dev/sdb\"\n"),
            "key"
        );
        assert_eq!(
            field_of("mode = \"watch\"\n[key]\nvalue = \"1\"\n"),
            "device"
        );
    }

    #[test]
    fn key_derivation_specs() {
        let derive = |body: &str| {
            let s = Settings::from_toml_str(&WATCH.replace("value = \"0xabc\"", body))?;
            let ModeSettings::Watch(w) = s.mode else {
                panic!()
            };
            Ok::<_, ConfigError>(w.key)
        };
        assert_eq!(
            derive("derive = \"native\"").unwrap(),
            KeySpec::Derive {
                scheme: KeyScheme::Native,
                node: None
            }
        );
        assert_eq!(
            derive("derive = \"fence_scsi\"\nkey_value = \"hash\"\nnode = \"n1\"").unwrap(),
            KeySpec::Derive {
                scheme: KeyScheme::FenceScsiHash,
                node: Some("n1".to_owned())
            }
        );
        assert!(derive("derive = \"native\"\nkey_value = \"id\"").is_err());
        assert!(derive("value = \"1\"\nderive = \"native\"").is_err());
        assert!(derive("node = \"n1\"").is_err());
    }

    #[test]
    fn watch_timing_rules() {
        let r = timing_error(&format!(
            "check_interval = \"5s\"\n{WATCH}[watch]\ngrace = \"4s\"\n"
        ));
        assert!(
            r.contains("watch.grace") && r.contains("at least one check"),
            "{r}"
        );
        let r = timing_error(&format!("command_timeout = \"20s\"\n{WATCH}"));
        assert!(r.contains("command_timeout"), "{r}");
        let r = timing_error(&format!("{WATCH}[watch]\npath_audit = \"1s\"\n"));
        assert!(r.contains("watch.path_audit"), "{r}");
        // Defaults (check_interval 2s, command_timeout 2s): the watchdog must outlast
        // 2s + 3 x 2.2s = 8.6s, a check over hung paths included.
        let r = timing_error(&format!(
            "{WATCH}[watchdog]\ndevice = \"/dev/watchdog\"\ntimeout = \"8s\"\n"
        ));
        assert!(
            r.contains("watchdog.timeout") && r.contains("8.6s") && r.contains("still registered"),
            "{r}"
        );
        Settings::from_toml_str(&format!(
            "{WATCH}[watchdog]\ndevice = \"/dev/watchdog\"\ntimeout = \"9s\"\n"
        ))
        .unwrap();
    }

    #[test]
    fn a_check_budget_is_three_command_slots() {
        assert_eq!(
            check_budget(Duration::from_secs(2)),
            Duration::from_millis(6600)
        );
        assert_eq!(
            check_budget(Duration::from_secs(1)),
            Duration::from_millis(3600)
        );
        assert_eq!(
            feed_gap(Duration::from_millis(500), Duration::from_secs(1)),
            Duration::from_millis(4100)
        );
        // Saturates instead of overflowing at the largest command_timeout.
        assert!(check_budget(MAX_COMMAND_TIMEOUT) > MAX_COMMAND_TIMEOUT);
    }

    #[test]
    fn the_service_watchdog_must_outlast_a_check() {
        let s = Settings::from_toml_str(WATCH).unwrap();
        s.check_service_watchdog(UNIT_WATCHDOG_SEC, true).unwrap();
        let e = s
            .check_service_watchdog(Duration::from_millis(8600), true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("WatchdogSec") && e.contains("8.6s"), "{e}");
        s.check_service_watchdog(Duration::from_millis(8601), true)
            .unwrap();
        // A long interval the packaged unit would kill the agent for.
        let slow = Settings::from_toml_str(&format!(
            "check_interval = \"30s\"\n{WATCH}[watch]\ngrace = \"1m\"\npath_audit = \"1m\"\n"
        ))
        .unwrap();
        assert!(
            slow.check_service_watchdog(UNIT_WATCHDOG_SEC, true)
                .is_err()
        );
        // Without sd_notify nothing feeds systemd's watchdog, and nothing is checked.
        slow.check_service_watchdog(UNIT_WATCHDOG_SEC, false)
            .unwrap();
    }

    #[test]
    fn sd_notify_follows_notify_socket_unless_set() {
        let notify = |systemd: &str| {
            Settings::from_toml_str(&format!("{WATCH}{systemd}"))
                .unwrap()
                .sd_notify
        };
        assert_eq!(notify(""), SdNotify::FollowNotifySocket);
        assert_eq!(notify("[systemd]\n"), SdNotify::FollowNotifySocket);
        assert_eq!(notify("[systemd]\nnotify = true\n"), SdNotify::On);
        assert_eq!(notify("[systemd]\nnotify = false\n"), SdNotify::Off);
        let socket = |value: Option<&str>| notify_socket_set(value.map(std::ffi::OsStr::new));
        assert!(socket(Some("/run/systemd/notify")));
        assert!(socket(Some("@abstract")));
        assert!(!socket(Some("")));
        assert!(!socket(None));
        // Unset: on under a Type=notify unit, off elsewhere; set: as set.
        assert!(SdNotify::FollowNotifySocket.enabled(true));
        assert!(!SdNotify::FollowNotifySocket.enabled(false));
        assert!(SdNotify::On.enabled(false));
        assert!(!SdNotify::Off.enabled(true));
    }

    #[test]
    fn unit_watchdog_sec_matches_the_packaged_unit() {
        let unit = include_str!("../../packaging/prfence-agent.service");
        let line = unit
            .lines()
            .find(|l| l.starts_with("WatchdogSec="))
            .expect("the unit sets WatchdogSec");
        let value = line.trim_start_matches("WatchdogSec=");
        assert_eq!(parse_duration(value), Ok(UNIT_WATCHDOG_SEC), "{line}");
    }

    /// A reboot or `systemctl stop pacemaker` must stop the cluster's resources while the agent
    /// still watches and feeds the watchdog, and the agent must then stop disarming it: the
    /// unit starts before Pacemaker (so stops after it) and the packaged default disarms.
    #[test]
    fn the_packaged_unit_stops_the_agent_after_pacemaker_and_disarms() {
        let unit = include_str!("../../packaging/prfence-agent.service");
        let values = |key: &str| -> Vec<String> {
            unit.lines()
                .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .flat_map(|v| v.split_whitespace().map(str::to_owned))
                .collect()
        };
        assert!(values("Before").contains(&"pacemaker.service".to_owned()));
        assert!(values("After").contains(&"corosync.service".to_owned()));
        assert!(!values("After").contains(&"pacemaker.service".to_owned()));
        // Ordering only: a failed pacemaker or corosync must not stop the agent.
        for dependency in ["Requires", "BindsTo", "PartOf"] {
            assert!(values(dependency).is_empty(), "{dependency}=");
        }
        let packaged = include_str!("../../packaging/prfence-agent.toml");
        let unset = packaged.replace("magic_close = true", "");
        for text in [packaged, &unset] {
            let settings = Settings::from_toml_str(text).expect("the packaged config parses");
            assert!(settings.watchdog.is_some_and(|w| w.magic_close));
        }
    }

    #[test]
    fn lease_timing_rules() {
        let r = timing_error(&LEASE.replace("renew = \"2s\"", "renew = \"5s\""));
        assert!(
            r.contains("lease.renew") && r.contains("second renew"),
            "{r}"
        );
        let r = timing_error(&LEASE.replace("margin = \"2s\"", "margin = \"8s\""));
        assert!(
            r.contains("lease.margin") && r.contains("next renew"),
            "{r}"
        );
        let r = timing_error(&LEASE.replace("margin = \"2s\"", "margin = \"0ms\""));
        assert!(r.contains("above 0"), "{r}");
        let r = timing_error(&LEASE.replace("renew = \"2s\"", "renew = \"50ms\""));
        assert!(r.contains("at least 100ms"), "{r}");
        assert_eq!(
            field_of(&format!("{LEASE}clock_drift_ppm = 200000\n")),
            "lease.clock_drift_ppm"
        );
        let r = timing_error(&format!(
            "{}clock_drift_ppm = 100000\n",
            LEASE.replace("margin = \"2s\"", "margin = \"1s\"")
        ));
        assert!(r.contains("clock_drift_ppm"), "{r}");
        let r = timing_error(&format!("command_timeout = \"3s\"\n{LEASE}"));
        assert!(r.contains("one renew"), "{r}");
        let r = timing_error(&LEASE.replace("check_interval = \"1s\"", "check_interval = \"6s\""));
        assert!(r.contains("twice per lease"), "{r}");
        let r = timing_error(&format!(
            "{LEASE}[self_fence]\ncommand = [\"/bin/stop-app\"]\ncommand_timeout = \"2s\"\n"
        ));
        assert!(r.contains("/bin/stop-app"), "{r}");
        let r = timing_error(&format!(
            "{LEASE}[watchdog]\ndevice = \"/dev/watchdog\"\ntimeout = \"5s\"\n"
        ));
        assert!(r.contains("watchdog.timeout"), "{r}");
        // 10 - 2 = 8 >= 3 + 2 + 2 + 1
        Settings::from_toml_str(&format!(
            "{LEASE}[watchdog]\ndevice = \"/dev/watchdog\"\ntimeout = \"3s\"\n"
        ))
        .unwrap();
    }

    /// Issue #10 item 3: each value is checked against what the runtime can use.
    #[test]
    fn command_timeout_fits_sg_io() {
        let e = Settings::from_toml_str(&format!(
            "command_timeout = \"1200h\"\n{WATCH}[watch]\ngrace = \"2000h\"\n"
        ))
        .unwrap_err();
        assert!(
            matches!(&e, ConfigError::Field { field, problem }
                if field == "command_timeout" && problem.contains("4294967294ms")),
            "{e}"
        );
        assert_eq!(
            field_of(&format!("command_timeout = \"4294967295ms\"\n{WATCH}")),
            "command_timeout"
        );
        // SG_IO's largest passes the field's own check; with watch.grace at most 1h (issue 44:
        // every duration bounded) the timing rules then refuse it.
        let e = Settings::from_toml_str(&format!(
            "command_timeout = \"4294967294ms\"\n{WATCH}[watch]\ngrace = \"1h\"\n"
        ))
        .unwrap_err();
        assert!(matches!(e, ConfigError::Timing { .. }), "{e}");
        assert_eq!(
            field_of(&format!("{WATCH}[watch]\ngrace = \"2000h\"\n")),
            "watch.grace"
        );
    }

    /// Issue 44: a metrics endpoint beyond loopback is accepted, and said.
    #[test]
    fn a_metrics_endpoint_beyond_loopback_is_said() {
        let with = |listen: &str| {
            Settings::from_toml_str(&format!("{WATCH}[metrics]\nlisten = \"{listen}\"\n"))
                .unwrap()
                .warnings()
        };
        for wide in ["0.0.0.0:9464", "[::]:9464", "192.0.2.7:9464"] {
            let said = with(wide);
            assert!(
                said.len() == 1
                    && said[0].contains(wide)
                    && said[0].contains("without authentication"),
                "{said:?}"
            );
        }
        for local in ["127.0.0.1:9464", "[::1]:9464"] {
            assert_eq!(with(local), Vec::<String>::new());
        }
        assert!(
            Settings::from_toml_str(WATCH)
                .unwrap()
                .warnings()
                .is_empty()
        );
        // Lease mode without a watchdog starts, and says what it gives up.
        let said = Settings::from_toml_str(LEASE).unwrap().warnings();
        assert!(
            said.len() == 1 && said[0].contains("without [watchdog]"),
            "{said:?}"
        );
        let watched = format!("{LEASE}[watchdog]\ndevice = \"/dev/watchdog0\"\ntimeout = \"1s\"\n");
        assert!(
            Settings::from_toml_str(&watched)
                .unwrap()
                .warnings()
                .is_empty()
        );
    }

    /// Issue 44: durations the runtime adds up are bounded where they are read, and the hook fits
    /// in the time the watchdog leaves it.
    #[test]
    fn every_duration_is_bounded_and_the_hook_fits_the_watchdog() {
        let hook = "[self_fence]\ncommand = [\"/bin/true\"]\n";
        for (text, field) in [
            (format!("{WATCH}[watch]\ngrace = \"61m\"\n"), "watch.grace"),
            (
                format!("{WATCH}[watch]\npath_audit = \"25h\"\n"),
                "watch.path_audit",
            ),
            (
                format!("{WATCH}{hook}command_timeout = \"2h\"\n"),
                "self_fence.command_timeout",
            ),
            (
                format!("{WATCH}{hook}command_timeout = \"{}ms\"\n", u64::MAX),
                "self_fence.command_timeout",
            ),
            (
                LEASE.replace("lease = \"10s\"", "lease = \"2h\""),
                "lease.lease",
            ),
        ] {
            assert_eq!(field_of(&text), field, "{text}");
        }
        assert!(Settings::from_toml_str(&format!("{WATCH}[watch]\ngrace = \"1h\"\n")).is_ok());
        let watchdog = "[watchdog]\ndevice = \"/dev/watchdog0\"\ntimeout = \"10s\"\n";
        let e = timing_error(&format!(
            "{WATCH}{watchdog}{hook}command_timeout = \"10s\"\n"
        ));
        assert!(
            e.contains("self_fence.command_timeout (10s) must be below watchdog.timeout"),
            "{e}"
        );
        assert!(
            Settings::from_toml_str(&format!(
                "{WATCH}{watchdog}{hook}command_timeout = \"9s\"\n"
            ))
            .is_ok()
        );
        // Still fed during the hook: no reset to cut it.
        assert!(
            Settings::from_toml_str(&format!(
                "{WATCH}{watchdog}{hook}command_timeout = \"30s\"\nstop_watchdog = false\n"
            ))
            .is_ok()
        );
    }

    /// `n` coordinator devices, /dev/cN, as [[device]] tables.
    fn coordinators(n: usize) -> String {
        (1..=n)
            .map(|i| format!("[[device]]\npath = \"/dev/c{i}\"\ncoordinator = true\n"))
            .collect()
    }

    #[test]
    fn coordinators_are_three_or_five_beside_data_lus_in_watch_mode() {
        for n in [3, 5] {
            let s = Settings::from_toml_str(&format!("{WATCH}{}", coordinators(n))).unwrap();
            let config = s.watch_config(Key::new(0xabc)).unwrap();
            assert_eq!(config.coordinators.len(), n);
            assert_eq!(config.coordinators[0], LuName("/dev/c1".to_owned()));
            assert!(!s.devices[0].coordinator, "the data LU");
        }
        let plain = Settings::from_toml_str(WATCH).unwrap();
        assert!(
            plain
                .watch_config(Key::new(0xabc))
                .unwrap()
                .coordinators
                .is_empty()
        );
        for n in [1, 2, 4, 6] {
            let e = Settings::from_toml_str(&format!("{WATCH}{}", coordinators(n))).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Field { field, problem }
                    if field == "device" && problem.contains(&format!("{n} devices"))),
                "{n}: {e}"
            );
        }
        let only = format!(
            "mode = \"watch\"\n{}[key]\nvalue = \"0xabc\"\n",
            coordinators(3)
        );
        assert_eq!(field_of(&only), "device");
        assert_eq!(
            field_of(&format!("{LEASE}{}", coordinators(3))),
            "device[1].coordinator"
        );
    }

    #[test]
    fn self_fence_command_timeout_must_be_positive() {
        let hook = "[self_fence]\ncommand = [\"/bin/true\"]\n";
        assert_eq!(
            field_of(&format!("{WATCH}{hook}command_timeout = \"0s\"\n")),
            "self_fence.command_timeout"
        );
        assert_eq!(
            field_of(&format!("{WATCH}{hook}command_timeout = \"0ms\"\n")),
            "self_fence.command_timeout"
        );
        let s =
            Settings::from_toml_str(&format!("{WATCH}{hook}command_timeout = \"1ms\"\n")).unwrap();
        assert_eq!(s.self_fence.command_timeout, Duration::from_millis(1));
    }

    #[test]
    fn log_level_is_parsed_as_start_parses_it() {
        for good in ["info", "debug", "prfence=trace", "warn,prfence=debug"] {
            let s =
                Settings::from_toml_str(&format!("{WATCH}[log]\nlevel = \"{good}\"\n")).unwrap();
            assert_eq!(s.log.level, good);
            assert!(tracing_subscriber::EnvFilter::try_new(good).is_ok());
        }
        for bad in ["prfence=loud", "info,=", "[{", "", " "] {
            let e =
                Settings::from_toml_str(&format!("{WATCH}[log]\nlevel = \"{bad}\"\n")).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Field { field, .. } if field == "log.level"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn watchdog_device_may_not_climb_out_with_dot_dot() {
        for bad in ["/dev/watchdog/../sda", "/dev/watchdog0/../../etc/passwd"] {
            assert_eq!(
                field_of(&format!(
                    "{WATCH}[watchdog]\ndevice = \"{bad}\"\ntimeout = \"10s\"\n"
                )),
                "watchdog.device",
                "{bad}"
            );
        }
    }

    #[test]
    fn device_list_is_capped() {
        let devices = |n: usize| -> String {
            (0..n)
                .map(|i| format!("[[device]]\npath = \"/dev/sd{i}\"\n"))
                .collect()
        };
        let body = "mode = \"watch\"\n[key]\nvalue = \"0xabc\"\n";
        let s = Settings::from_toml_str(&format!("{body}{}", devices(crate::MAX_DEVICES))).unwrap();
        assert_eq!(s.devices.len(), crate::MAX_DEVICES);
        let e = Settings::from_toml_str(&format!("{body}{}", devices(crate::MAX_DEVICES + 1)))
            .unwrap_err();
        assert!(
            matches!(&e, ConfigError::Field { field, problem }
                if field == "device" && problem.contains("at most 1024")),
            "{e}"
        );
    }

    /// Every duration the file can hold (up to u64::MAX ms) goes through the timing rules'
    /// additions and multiplications without a panic: the result is settings or an error.
    #[test]
    fn extreme_durations_never_panic() {
        let huge = format!("{}ms", u64::MAX);
        let whole_secs = format!("{}ms", u64::MAX / 1000 * 1000);
        let third = format!("{}ms", u64::MAX / 3);
        let values = [
            "1ms",
            "100ms",
            "2s",
            third.as_str(),
            whole_secs.as_str(),
            huge.as_str(),
        ];
        for a in values {
            for b in values {
                let watch = format!(
                    "check_interval = \"{a}\"\ncommand_timeout = \"{b}\"\n{WATCH}[watch]\n\
                     grace = \"{b}\"\npath_audit = \"{a}\"\n[watchdog]\n\
                     device = \"/dev/watchdog\"\ntimeout = \"{a}\"\n\
                     [self_fence]\ncommand = [\"/bin/true\"]\ncommand_timeout = \"{b}\"\n"
                );
                let _ = Settings::from_toml_str(&watch);
                let lease = format!(
                    "check_interval = \"{a}\"\ncommand_timeout = \"{a}\"\nmode = \"lease\"\n\
                     [[device]]\npath = \"/dev/sdb\"\n[lease]\nnode_id = 2\n\
                     renew = \"{a}\"\nlease = \"{b}\"\nmargin = \"{a}\"\n\
                     clock_drift_ppm = 100000\n[watchdog]\ndevice = \"/dev/watchdog\"\n\
                     timeout = \"{whole_secs}\"\n[self_fence]\ncommand = [\"/bin/true\"]\n\
                     command_timeout = \"{b}\"\n"
                );
                if let Ok(s) = Settings::from_toml_str(&lease) {
                    let c = s.lease_config().unwrap();
                    assert!(c.renew.saturating_mul(2) < c.lease);
                }
            }
        }
    }
}
