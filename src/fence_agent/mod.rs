//! The ClusterLabs Fence Agent API side of `fence_pr`, a drop-in for fence_scsi. This module and
//! its pure parts: parsing, validation, key derivation, the key store format, metadata and exit
//! codes. [`run`] executes an [`FencePrRequest`] with the engine; `src/main.rs` becomes the agent
//! when invoked as `fence_pr`.
//!
//! Input: with no arguments, `name=value` lines on stdin (what Pacemaker sends); with any
//! argument, the command line only (see [`wants_stdin`]). Names, getopt letters, defaults and
//! aliases are fence_scsi 4.12.1's (plus `mpath_register_method` from fence-agents HEAD), checked
//! against the installed agent; `nodename` overrides `plug`/`port` as in fence_scsi (the API
//! document says the opposite; fence_scsi is what clusters run).
//!
//! Keys: [`keys`] derives fence_scsi's keys (`key_value=id|hash`) and a native 64-bit scheme
//! (`key_value=native`, a prfence extension) documented there.
//!
//! Exit codes: 0 success (and `status` ON), 1 any failure, 2 `status` OFF. fence-agents maps every
//! failure to 1, so does this module.
//!
//! Pacemaker notes for the engine: `reboot` is refused (storage fencing must not advertise it;
//! pacemaker-fenced maps reboot to off when metadata lacks it). Because the metadata advertises
//! `list`, pacemaker-fenced defaults to `pcmk_host_check=dynamic-list` when neither
//! `pcmk_host_list` nor `pcmk_host_map` is set, and fences a node only if `list` prints its name:
//! `list` must print every corosync node ([`render_list`] over [`keys::Nodelist::node_names`]).
//! fence_scsi hides `list` for that reason and gets `status`-based checking instead.
//! Pacemaker passes no timeout to the agent: it kills it at `pcmk_<action>_timeout` and retries a
//! failed run (up to 2 times) while 30 % of that time is left. Under pacemaker-fenced
//! (`PCMK_service`), fence-agents disables its own per-command timeouts
//! ([`Options::command_timeout`] follows that rule; the engine may still bound each SCSI command).
//!
//! `validate-all` is [`parse`]: success means exit 0; an error lists every problem found and
//! exits 1. (fence_scsi exits 0 from validate-all even after printing errors; measured.)
//!
//! Deliberate differences from fence_scsi, all where fence_scsi misbehaves: flags set to `0` on
//! stdin are off (fence_scsi turns them on); keys accept `0x` and any case (fence_scsi mangles
//! `0x` and compares case-sensitively); `0x00`-style zero keys are refused (fence_scsi strips them
//! to an empty key); `option=` is the API's deprecated alias of `action` (fence_scsi ignores it);
//! `devices` splits on commas and whitespace (fence-agents HEAD; 4.12.1 only on commas);
//! `nodeid` from Pacemaker is accepted; `key_value=native` is added.

pub mod metadata;
mod options;
pub mod run;
pub mod store;
mod table;

use std::path::PathBuf;
use std::time::Duration;

pub use crate::keys::KeyError;
use crate::keys::{self, KeyScheme};
use crate::ops::UnreachableData;
pub use options::InputMode;

use options::{RawOptions, RawValue};

/// Fence Agent API actions fence_pr performs. `reboot` is not one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Unfence: register this node's key (run on the target itself).
    On,
    /// Fence: remove the target's key.
    Off,
    /// Is the target's key registered? Exit 0 ON, 2 OFF.
    Status,
    /// Health of the agent and the devices.
    Monitor,
    List,
    ListStatus,
    Metadata,
    /// fence-agents prints metadata for man page generation; accepted, not advertised.
    Manpage,
    ValidateAll,
}

impl Action {
    /// Parses an action name, case-insensitively, with fence-agents' aliases: `enable` = on,
    /// `disable` = off, `meta-data` = metadata. `reboot` is refused like any unknown action.
    pub fn parse(text: &str) -> Result<Action, FencePrError> {
        Ok(match text.to_ascii_lowercase().as_str() {
            "on" | "enable" => Action::On,
            "off" | "disable" => Action::Off,
            "status" => Action::Status,
            "monitor" => Action::Monitor,
            "list" => Action::List,
            "list-status" => Action::ListStatus,
            "metadata" | "meta-data" => Action::Metadata,
            "manpage" => Action::Manpage,
            "validate-all" => Action::ValidateAll,
            other => return Err(FencePrError::UnrecognisedAction(other.to_owned())),
        })
    }

    /// Whether the action sends commands to devices, which can get stuck in the kernel: then
    /// fence_pr runs it in a worker process ([`crate::worker`]).
    pub fn touches_devices(self) -> bool {
        match self {
            Action::On | Action::Off | Action::Status | Action::Monitor | Action::ListStatus => {
                true
            }
            Action::List | Action::Metadata | Action::Manpage | Action::ValidateAll => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Action::On => "on",
            Action::Off => "off",
            Action::Status => "status",
            Action::Monitor => "monitor",
            Action::List => "list",
            Action::ListStatus => "list-status",
            Action::Metadata => "metadata",
            Action::Manpage => "manpage",
            Action::ValidateAll => "validate-all",
        }
    }

    /// Actions that need a target (a node name or a key).
    fn needs_target(self) -> bool {
        matches!(
            self,
            Action::On | Action::Off | Action::Status | Action::ValidateAll
        )
    }
}

/// `mpath_register_method` (fence-agents HEAD): register on each path of a dm-multipath device
/// or on the multipath device itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MpathRegisterMethod {
    #[default]
    Multi,
    Single,
}

/// The fence_scsi parameters this agent acts on, typed; `build` checks and drops the others.
/// Defaults are fence_scsi's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The node to act on: `nodename` if given, else `plug`/`port` (fence_scsi's precedence).
    pub plug: Option<String>,
    /// `nodeid`: the target's corosync nodeid, which Pacemaker passes with fence actions when it
    /// knows it (not a fence_scsi parameter). Used by `key_value=native` instead of the nodelist.
    pub nodeid: Option<u32>,
    /// `devices`, split on commas and whitespace. Empty means "find shared VG devices with vgs",
    /// as fence_scsi does; the engine fails with "No devices found" if that finds none.
    pub devices: Vec<PathBuf>,
    /// `coordinators`, split as `devices`: empty (the arbiter LU decides `off`), or 3 or 5 LUs
    /// whose majority decides it; `on` registers on them too.
    pub coordinators: Vec<PathBuf>,
    /// `unreachable_data`: with coordinators, whether `off` fails on a data LU no path answers
    /// (the default) or reports it unfenced.
    pub unreachable_data: UnreachableData,
    /// `key`, if given (hex, non-zero).
    pub key: Option<u64>,
    pub key_value: KeyScheme,
    pub aptpl: bool,
    pub mpath_register_method: MpathRegisterMethod,
    pub logfile: Option<PathBuf>,
    pub corosync_cmap_path: PathBuf,
    pub vgs_path: PathBuf,
    pub quiet: bool,
    /// 0 = not verbose. From `verbose_level`, else the number of `-v`, else 1 for `verbose=1`.
    pub verbose_level: u32,
    pub debug_file: Option<PathBuf>,
    /// Wait before `off` (fence-agents delays only off/reboot).
    pub delay: Duration,
    pub power_timeout: Duration,
    pub power_wait: Duration,
    /// True when `disable_timeout` is true, or unset and `PCMK_service=pacemaker-fenced`.
    pub disable_timeout: bool,
    pub separator: String,
    pub help: bool,
    pub version: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            plug: None,
            nodeid: None,
            devices: Vec::new(),
            coordinators: Vec::new(),
            unreachable_data: UnreachableData::Fail,
            key: None,
            key_value: KeyScheme::FenceScsiId,
            aptpl: false,
            mpath_register_method: MpathRegisterMethod::Multi,
            logfile: None,
            corosync_cmap_path: PathBuf::from(crate::keys::COROSYNC_CMAPCTL),
            vgs_path: PathBuf::from("/sbin/vgs"),
            quiet: false,
            verbose_level: 0,
            debug_file: None,
            delay: Duration::ZERO,
            power_timeout: Duration::from_secs(20),
            power_wait: Duration::ZERO,
            disable_timeout: false,
            separator: ",".to_owned(),
            help: false,
            version: false,
        }
    }
}

impl Options {
    /// The bound for one device command: `None` (unbounded) when timeouts are disabled, as under
    /// pacemaker-fenced, which kills the agent at the operation timeout itself; otherwise
    /// `power_timeout`, with 0 meaning unbounded (fence-agents' rule).
    pub fn command_timeout(&self) -> Option<Duration> {
        (!self.disable_timeout && !self.power_timeout.is_zero()).then_some(self.power_timeout)
    }
}

/// A validated request: what to do and with which options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencePrRequest {
    /// When `options.help` or `options.version` is set the action was not validated (fence-agents
    /// answers those first) and is `off` if it was invalid. Order of precedence for the caller:
    /// help, then metadata/manpage, then version.
    pub action: Action,
    pub options: Options,
    pub mode: InputMode,
    /// Debug-level notes: unknown stdin names, unused arguments, ignored values.
    pub notes: Vec<String>,
}

/// Errors before any device is touched. Messages begin like fence-agents' so logs grep the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FencePrError {
    #[error("Parse error: {0}; see --help")]
    Parse(String),
    #[error(
        "Failed: Unrecognised action '{0}'; valid: on, off, status, monitor, list, list-status, metadata, validate-all (no reboot: storage fencing cannot power-cycle)"
    )]
    UnrecognisedAction(String),
    #[error("Failed: nodename or key is required; set nodename/plug to the node to act on, or key")]
    TargetRequired,
    #[error("Failed: key-value has to be 'id', 'hash' or 'native' (got {0:?})")]
    KeyValue(String),
    #[error("Failed: mpath-register-method has to be 'multi' or 'single' (got {0:?})")]
    MpathRegisterMethod(String),
    #[error(
        "Failed: The value you have entered for --{option} is not a valid time in seconds ({value:?})"
    )]
    NotSeconds { option: &'static str, value: String },
    #[error(
        "Failed: The value you have entered for --{option} is too large ({value} s); the most is {MAX_TIME_SECS} s (about 49 days: SG_IO and Pacemaker count milliseconds in 32 bits)"
    )]
    TimeTooLarge { option: &'static str, value: u64 },
    #[error("Failed: The value you have entered for --{option} is not a valid integer ({value:?})")]
    NotInteger { option: &'static str, value: String },
    #[error(
        "Failed: {count} devices given; at most {MAX_DEVICES} per request: split them across several fence devices (stonith resources)",
        MAX_DEVICES = crate::MAX_DEVICES
    )]
    TooManyDevices { count: usize },
    #[error(
        "Failed: {count} coordinators given; give 3 (one per failure domain) or 5, an odd number \
         so that two nodes cannot both hold a majority, the same on every node, or none (the \
         arbiter LU decides)"
    )]
    CoordinatorCount { count: usize },
    #[error("Failed: unreachable-data has to be 'fail' or 'report' (got {0:?})")]
    UnreachableData(String),
    #[error(
        "Failed: unreachable-data=report needs coordinators: without them the arbiter LU decides \
         and every LU must be fenced"
    )]
    UnreachableDataWithoutCoordinators,
    #[error(
        "Failed: argument {index} is not valid UTF-8 ({lossy:?}); options and device paths must be UTF-8"
    )]
    ArgumentNotUtf8 { index: usize, lossy: String },
    #[error("Failed: line {line} of stdin is not valid UTF-8; send UTF-8 name=value lines")]
    StdinNotUtf8 { line: usize },
    #[error(
        "Failed: line {line} of stdin holds the control character U+{code:04X}; options are \
         printable text (a NUL or an escape sequence would reach the logs and the terminal as it \
         is)"
    )]
    StdinControlCharacter { line: usize, code: u32 },
    #[error(
        "Failed: argument {index} holds the control character U+{code:04X}; options and device \
         paths are printable text"
    )]
    ArgumentControlCharacter { index: usize, code: u32 },
    #[error(
        "Failed: line {line} of stdin is longer than {MAX_STDIN_LINE} bytes; no option needs that much (devices: at most {MAX_DEVICES} paths)",
        MAX_DEVICES = crate::MAX_DEVICES
    )]
    StdinLineTooLong { line: usize },
    #[error(
        "Failed: stdin holds more than {MAX_STDIN_BYTES} bytes of options; send only the name=value lines the agent takes"
    )]
    StdinTooLarge,
    #[error("Failed: reading options from stdin: {0}")]
    StdinRead(String),
    #[error("{0}")]
    Key(#[from] KeyError),
    #[error(
        "Failed: keys cannot be same. You can not fence yourself (key 0x{0:x} is this node's own key)."
    )]
    SelfFence(u64),
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Several(Vec<FencePrError>),
}

impl FencePrError {
    /// Every failure exits 1, as in fence-agents.
    pub fn exit_code(&self) -> FencePrExit {
        FencePrExit::Error
    }
}

/// Fence Agent API exit statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencePrExit {
    /// Success; for `status`, ON (key registered).
    Success = 0,
    /// Any failure, including a timeout.
    Error = 1,
    /// `status` only: reachable, key not registered.
    Off = 2,
}

impl FencePrExit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<FencePrExit> for std::process::ExitCode {
    fn from(code: FencePrExit) -> Self {
        std::process::ExitCode::from(code.code())
    }
}

/// The environment the parse depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// `PCMK_service`; `pacemaker-fenced` turns on `disable_timeout` unless it is set.
    pub pcmk_service: Option<String>,
}

impl Environment {
    pub fn from_process() -> Environment {
        Environment {
            pcmk_service: std::env::var("PCMK_service").ok(),
        }
    }
}

/// The most seconds a time option (`delay`, `power_timeout`, …) takes: `u32::MAX` milliseconds,
/// SG_IO's timeout field and Pacemaker's timers, rounded down to whole seconds (about 49 days).
pub const MAX_TIME_SECS: u64 = (u32::MAX as u64 - 1) / 1000;

/// The longest stdin line, newline excluded: what the kernel lets one command-line argument
/// carry (MAX_ARG_STRLEN), so `devices=` holds as much as `--devices=` can, e.g.
/// [`crate::MAX_DEVICES`] paths of 127 bytes. Pacemaker's lines are far shorter.
pub const MAX_STDIN_LINE: usize = 128 * 1024;

/// The most stdin bytes read in all, so no input can make the agent hold more than this.
pub const MAX_STDIN_BYTES: usize = 1024 * 1024;

/// The command-line arguments as UTF-8, or which one is not (`std::env::args` would panic).
/// `args` excludes `argv[0]`; `index` in the error counts from 1.
pub fn args_from_os<I>(args: I) -> Result<Vec<String>, FencePrError>
where
    I: IntoIterator<Item = std::ffi::OsString>,
{
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| {
            let arg = arg
                .into_string()
                .map_err(|arg| FencePrError::ArgumentNotUtf8 {
                    index: i + 1,
                    lossy: arg.to_string_lossy().into_owned(),
                })?;
            match control_character(&arg) {
                Some(code) => Err(FencePrError::ArgumentControlCharacter { index: i + 1, code }),
                None => Ok(arg),
            }
        })
        .collect()
}

/// The first control character of `text` (tab allowed: fence-agents' own options may carry
/// it), which no option of fence_pr takes and which must not reach a log or a terminal as it is.
fn control_character(text: &str) -> Option<u32> {
    text.chars()
        .find(|&c| c.is_control() && c != '\t')
        .map(u32::from)
}

/// Reads the stdin options without ever holding more than [`MAX_STDIN_LINE`] bytes of one line or
/// [`MAX_STDIN_BYTES`] in all; a longer line, more input or bytes that are not UTF-8 are errors
/// (naming the line, counted from 1).
pub fn read_stdin<R: std::io::BufRead>(mut reader: R) -> Result<String, FencePrError> {
    use std::io::{BufRead as _, Read as _};
    let mut text = String::new();
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        // One byte past the limit tells a line that is too long from one that just fits.
        let limit = u64::try_from(MAX_STDIN_LINE + 2).unwrap_or(u64::MAX);
        let read = (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut line)
            .map_err(|e| FencePrError::StdinRead(e.to_string()))?;
        if read == 0 {
            break;
        }
        let content = line
            .strip_suffix(b"\n")
            .map_or(&line[..], |l| l.strip_suffix(b"\r").unwrap_or(l));
        if content.len() > MAX_STDIN_LINE {
            return Err(FencePrError::StdinLineTooLong { line: number });
        }
        if text.len() + line.len() > MAX_STDIN_BYTES {
            return Err(FencePrError::StdinTooLarge);
        }
        let valid =
            std::str::from_utf8(&line).map_err(|_| FencePrError::StdinNotUtf8 { line: number })?;
        // The line's own ending (\n, \r\n) is no content.
        let content = valid.trim_end_matches(['\n', '\r']);
        if let Some(code) = control_character(content) {
            return Err(FencePrError::StdinControlCharacter { line: number, code });
        }
        text.push_str(valid);
    }
    Ok(text)
}

/// Whether the caller must read stdin: only when there are no arguments (`argv[0]` excluded).
pub fn wants_stdin<S: AsRef<str>>(args: &[S]) -> bool {
    args.is_empty()
}

/// Parses and validates a request. `args` excludes `argv[0]`; `stdin` is the text read from stdin
/// when [`wants_stdin`] says so (pass `None` otherwise; it is ignored in command-line mode).
pub fn parse<S: AsRef<str>>(
    args: &[S],
    stdin: Option<&str>,
    env: &Environment,
) -> Result<FencePrRequest, FencePrError> {
    let (raw, mode) = if wants_stdin(args) {
        (options::parse_stdin(stdin.unwrap_or("")), InputMode::Stdin)
    } else {
        (options::parse_command_line(args)?, InputMode::CommandLine)
    };
    build(raw, mode, env)
}

/// `key`'s value as text. Keys are the table's stdin names (a misspelt one would read as never
/// given, so debug builds, the tests among them, check it).
fn text<'a>(raw: &'a RawOptions, key: &str) -> Option<&'a str> {
    debug_assert!(table::OPTIONS.iter().any(|o| o.key == key), "{key}");
    match raw.values.get(key) {
        Some(RawValue::Text(t)) => Some(t.as_str()),
        _ => None,
    }
}

fn non_empty<'a>(raw: &'a RawOptions, key: &str) -> Option<&'a str> {
    text(raw, key).filter(|t| !t.is_empty())
}

fn flag(raw: &RawOptions, key: &str) -> bool {
    debug_assert!(table::OPTIONS.iter().any(|o| o.key == key), "{key}");
    matches!(raw.values.get(key), Some(RawValue::Flag(true)))
}

/// fence-agents checks seconds and integers with Python's `int()`; negative values are refused
/// here because no timeout or count can be negative.
fn parse_count(value: &str) -> Option<u64> {
    value.trim().parse::<u64>().ok()
}

fn build(
    mut raw: RawOptions,
    mode: InputMode,
    env: &Environment,
) -> Result<FencePrRequest, FencePrError> {
    let mut notes = std::mem::take(&mut raw.notes);
    let mut errors = Vec::new();
    let mut o = Options {
        help: flag(&raw, "help"),
        version: flag(&raw, "version"),
        ..Options::default()
    };

    let action = match Action::parse(text(&raw, "action").unwrap_or("off")) {
        Ok(action) => action,
        Err(_) if o.help || o.version => Action::Off,
        Err(e) => return Err(e),
    };
    if o.help || o.version || matches!(action, Action::Metadata | Action::Manpage) {
        return Ok(FencePrRequest {
            action,
            options: o,
            mode,
            notes,
        });
    }

    timeouts(&raw, &mut o, &mut errors);
    logging(&raw, mode, env, &mut o, &mut notes);
    target_and_key(&raw, action, &mut o, &mut errors);
    devices_and_paths(&raw, &mut o, &mut errors);

    match errors.len() {
        0 => Ok(FencePrRequest {
            action,
            options: o,
            mode,
            notes,
        }),
        1 => Err(errors.remove(0)),
        _ => Err(FencePrError::Several(errors)),
    }
}

/// The time options: fence_pr's own and those accepted for fence_scsi compatibility.
fn timeouts(raw: &RawOptions, o: &mut Options, errors: &mut Vec<FencePrError>) {
    let mut seconds = |key: &'static str, long: &'static str, slot: &mut Duration| {
        if let Some(v) = text(raw, key) {
            match parse_count(v) {
                Some(s) if s > MAX_TIME_SECS => errors.push(FencePrError::TimeTooLarge {
                    option: long,
                    value: s,
                }),
                Some(s) => *slot = Duration::from_secs(s),
                None => errors.push(FencePrError::NotSeconds {
                    option: long,
                    value: v.to_owned(),
                }),
            }
        }
    };
    seconds("delay", "delay", &mut o.delay);
    seconds("power_timeout", "power-timeout", &mut o.power_timeout);
    seconds("power_wait", "power-wait", &mut o.power_wait);
    // Accepted for fence_scsi compatibility and rejected when malformed, as fence-agents does,
    // but not kept: shell_timeout, login_timeout, stonith_status_sleep and retry_on drive
    // fence-agents' login and retry loops, which an agent talking SG_IO directly does not have.
    // readonly, suppress_errors, sg_persist_path, sg_turs_path and plug_separator are accepted
    // by the option table alone (no value to check) and not kept either: devices are always
    // opened read-only, suppress_errors only matters for fence_scsi's `.dev` file, no sg3_utils
    // binary is run, and a request names one node, never several plugs (see run.rs).
    let mut unused = Duration::ZERO;
    seconds("shell_timeout", "shell-timeout", &mut unused);
    seconds("login_timeout", "login-timeout", &mut unused);
    seconds("stonith_status_sleep", "stonith-status-sleep", &mut unused);
    if let Some(v) = text(raw, "retry_on")
        && parse_count(v).and_then(|n| u32::try_from(n).ok()).is_none()
    {
        errors.push(FencePrError::NotInteger {
            option: "retry-on",
            value: v.to_owned(),
        });
    }
}

/// Verbosity and whether fence-agents' overall timeout is off (as under Pacemaker's fenced).
fn logging(
    raw: &RawOptions,
    mode: InputMode,
    env: &Environment,
    o: &mut Options,
    notes: &mut Vec<String>,
) {
    // verbose_level: explicit, else the -v count, else verbose=1 on stdin (fence-agents).
    let verbose_default = match mode {
        InputMode::CommandLine => raw.verbose_count,
        InputMode::Stdin => u32::from(flag(raw, "verbose")),
    };
    o.verbose_level = match text(raw, "verbose_level") {
        None => verbose_default,
        Some(v) => parse_count(v).and_then(|n| u32::try_from(n).ok()).unwrap_or_else(|| {
            notes.push(format!(
                "Parse error: Option 'verbose_level' must be an integer greater than or equal to 0 (got {v:?}). Setting verbose_level to 0."
            ));
            0
        }),
    };

    o.disable_timeout = match text(raw, "disable_timeout") {
        Some(v) => options::parse_bool(v) == Some(true),
        None => env.pcmk_service.as_deref() == Some("pacemaker-fenced"),
    };
}

/// Who is acted on (node name, node id or key) and how a node's key is made.
fn target_and_key(
    raw: &RawOptions,
    action: Action,
    o: &mut Options,
    errors: &mut Vec<FencePrError>,
) {
    o.plug = non_empty(raw, "nodename")
        .or_else(|| non_empty(raw, "port"))
        .map(str::to_owned);
    if let Some(v) = non_empty(raw, "nodeid") {
        match v.trim().parse::<u32>() {
            Ok(id) if id != 0 => o.nodeid = Some(id),
            _ => errors.push(FencePrError::NotInteger {
                option: "nodeid",
                value: v.to_owned(),
            }),
        }
    }
    if let Some(k) = non_empty(raw, "key") {
        match keys::parse_key(k) {
            Ok(key) => o.key = Some(key),
            Err(e) => errors.push(e.into()),
        }
    }
    if action.needs_target()
        && o.plug.is_none()
        && o.key.is_none()
        && non_empty(raw, "key").is_none()
    {
        errors.push(FencePrError::TargetRequired);
    }
    if let Some(v) = text(raw, "key_value") {
        o.key_value = match v {
            "id" => KeyScheme::FenceScsiId,
            "hash" => KeyScheme::FenceScsiHash,
            "native" => KeyScheme::Native,
            _ => {
                errors.push(FencePrError::KeyValue(v.to_owned()));
                KeyScheme::FenceScsiId
            }
        };
    }
    if let Some(v) = text(raw, "mpath_register_method") {
        o.mpath_register_method = match v {
            "multi" => MpathRegisterMethod::Multi,
            "single" => MpathRegisterMethod::Single,
            _ => {
                errors.push(FencePrError::MpathRegisterMethod(v.to_owned()));
                MpathRegisterMethod::Multi
            }
        };
    }
}

/// The devices, the output options and the paths of the tools asked.
fn devices_and_paths(raw: &RawOptions, o: &mut Options, errors: &mut Vec<FencePrError>) {
    let list = |key: &str| -> Vec<PathBuf> {
        text(raw, key)
            .map(|d| {
                d.split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    o.devices = list("devices");
    o.coordinators = list("coordinators");
    if o.devices.len() + o.coordinators.len() > crate::MAX_DEVICES {
        errors.push(FencePrError::TooManyDevices {
            count: o.devices.len() + o.coordinators.len(),
        });
    }
    let count = o.coordinators.len();
    if count != 0 && !crate::ops::coordinator_count_ok(count) {
        errors.push(FencePrError::CoordinatorCount { count });
    }
    if let Some(v) = text(raw, "unreachable_data") {
        match v.parse() {
            Ok(policy) => o.unreachable_data = policy,
            Err(_) => errors.push(FencePrError::UnreachableData(v.to_owned())),
        }
    }
    if o.unreachable_data == UnreachableData::Report && count == 0 {
        errors.push(FencePrError::UnreachableDataWithoutCoordinators);
    }
    o.aptpl = flag(raw, "aptpl");
    o.quiet = flag(raw, "quiet");
    o.logfile = non_empty(raw, "logfile").map(PathBuf::from);
    o.debug_file = non_empty(raw, "debug").map(PathBuf::from);
    let path = |key: &str, slot: &mut PathBuf| {
        if let Some(v) = non_empty(raw, key) {
            *slot = PathBuf::from(v);
        }
    };
    path("corosync_cmap_path", &mut o.corosync_cmap_path);
    path("vgs_path", &mut o.vgs_path);
    if let Some(v) = text(raw, "separator") {
        o.separator = v.to_owned();
    }
}

impl FencePrRequest {
    /// The key this request acts on: `key` if given, else derived from the node name by
    /// `key_value`, asking corosync through `query` (normally [`keys::query_cmapctl`] with
    /// `options.corosync_cmap_path` and `options.command_timeout()`; a closure in tests).
    /// The corosync-cmapctl queries [`FencePrRequest::target_key`] makes, so that they can run
    /// side by side (a test pins the two together).
    pub fn corosync_queries(&self) -> &'static [&'static str] {
        if self.options.key.is_some() || self.options.plug.is_none() {
            return &[];
        }
        match (self.options.key_value, self.options.nodeid) {
            (KeyScheme::Native, Some(_)) | (KeyScheme::FenceScsiHash, _) => {
                &[keys::CLUSTER_NAME_QUERY]
            }
            (KeyScheme::Native | KeyScheme::FenceScsiId, _) => {
                &[keys::CLUSTER_NAME_QUERY, keys::NODELIST_QUERY]
            }
        }
    }

    pub fn target_key(
        &self,
        mut query: impl FnMut(&str) -> Result<String, KeyError>,
    ) -> Result<u64, FencePrError> {
        if let Some(key) = self.options.key {
            return Ok(key);
        }
        let node = self
            .options
            .plug
            .as_deref()
            .ok_or(FencePrError::TargetRequired)?;
        if let (KeyScheme::Native, Some(nodeid)) = (self.options.key_value, self.options.nodeid) {
            let cluster = keys::parse_cluster_name(&query(keys::CLUSTER_NAME_QUERY)?)
                .ok_or(KeyError::NoClusterName)?;
            return Ok(keys::NativeKey::new(&cluster, nodeid).value());
        }
        let key = keys::derive_key_via(node, self.options.key_value, query)?;
        Ok(key)
    }
}

/// fence_scsi's guard for `off`: refuse to preempt this node's own key.
pub fn check_not_self(target_key: u64, own_key: u64) -> Result<(), FencePrError> {
    if target_key == own_key {
        return Err(FencePrError::SelfFence(own_key));
    }
    Ok(())
}

/// `list` output: one `name<sep>name` line per node (fence-agents' port,alias columns), which
/// pacemaker-fenced tokenizes on commas and whitespace.
pub fn render_list<S: AsRef<str>>(names: &[S], separator: &str) -> String {
    names
        .iter()
        .map(|n| format!("{0}{separator}{0}\n", n.as_ref()))
        .collect()
}

/// `list-status` output: `name<sep>name<sep>ON|OFF|UNKNOWN` per node.
pub fn render_list_status<S: AsRef<str>>(nodes: &[(S, Option<bool>)], separator: &str) -> String {
    nodes
        .iter()
        .map(|(n, on)| {
            let status = match on {
                Some(true) => "ON",
                Some(false) => "OFF",
                None => "UNKNOWN",
            };
            format!("{0}{separator}{0}{separator}{status}\n", n.as_ref())
        })
        .collect()
}

/// `--help` text.
pub fn usage(agent_name: &str) -> String {
    let mut out =
        format!("Usage:\n\t{agent_name} [options]\n\t{agent_name} < name=value lines\nOptions:\n");
    for o in table::OPTIONS {
        let short = o.short.map(|c| format!("-{c}, ")).unwrap_or_default();
        let value = if o.takes_value { "=[value]" } else { "" };
        out.push_str(&format!(
            "   {short}--{}{value}\t(stdin: {})\n",
            o.long, o.key
        ));
    }
    out
}

#[cfg(test)]
mod tests;
