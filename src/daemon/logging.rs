//! Logging set-up from `[log]`: text for a terminal, text for journald (no timestamp, which the
//! journal adds, and a `<N>` syslog priority prefix that journald turns into the entry's
//! priority; SYSLOG_IDENTIFIER comes from the unit), or JSON lines. The level is reloadable.

use std::ffi::OsStr;
use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use super::config::{LogSettings, LogTarget};

/// Changes the level on SIGHUP.
pub struct LogHandle(reload::Handle<EnvFilter, Registry>);

impl LogHandle {
    pub fn set_level(&self, level: &str) -> Result<(), String> {
        let filter = EnvFilter::try_new(level).map_err(|e| format!("log.level {level:?}: {e}"))?;
        self.0.reload(filter).map_err(|e| e.to_string())
    }
}

/// The environment variable that overrides `log.level`.
pub const LOG_ENV: &str = "PRFENCE_LOG";

/// The filter [`LOG_ENV`] asks for, given its `value`: `None` when unset or empty, which leaves
/// `log.level` in charge (an empty value is how a unit's `Environment=PRFENCE_LOG=` clears it).
/// `--check-config` and a start both call this, so a value that a start would refuse is refused
/// before the unit's ExecStart= runs.
pub fn env_override(value: Option<&OsStr>) -> Result<Option<EnvFilter>, String> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let fix = "unset it, or use a level (error, warn, info, debug, trace) or directives such as \
               \"info,prfence=debug\"";
    let Some(directive) = value.to_str() else {
        return Err(format!("{LOG_ENV}={value:?} is not UTF-8; {fix}"));
    };
    EnvFilter::try_new(directive)
        .map(Some)
        .map_err(|e| format!("{LOG_ENV}={directive:?} is not a tracing filter ({e}); {fix}"))
}

/// Installs the global subscriber. `PRFENCE_LOG`, if set, overrides `log.level`.
pub fn init(settings: &LogSettings) -> Result<LogHandle, String> {
    let filter = match env_override(std::env::var_os(LOG_ENV).as_deref())? {
        Some(filter) => filter,
        None => EnvFilter::try_new(&settings.level)
            .map_err(|e| format!("log.level {:?}: {e}", settings.level))?,
    };
    let (filter, handle) = reload::Layer::new(filter);
    let output: Box<dyn Layer<_> + Send + Sync> = match (settings.json, settings.target) {
        (true, _) => Box::new(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(std::io::stderr),
        ),
        (false, LogTarget::Journald) => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .without_time()
                .event_format(SyslogPriority(
                    tracing_subscriber::fmt::format()
                        .with_ansi(false)
                        .without_time(),
                ))
                .with_writer(std::io::stderr),
        ),
        (false, LogTarget::Stderr) => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr),
        ),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .try_init()
        .map_err(|e| e.to_string())?;
    Ok(LogHandle(handle))
}

/// Prefixes each line with its sd-daemon(3) priority (`<3>` error … `<7>` debug).
struct SyslogPriority<F>(F);

impl<S, N, F> FormatEvent<S, N> for SyslogPriority<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let priority = match *event.metadata().level() {
            Level::ERROR => "<3>",
            Level::WARN => "<4>",
            Level::INFO => "<6>",
            Level::DEBUG | Level::TRACE => "<7>",
        };
        writer.write_str(priority)?;
        self.0.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::*;

    #[test]
    fn prfence_log_is_judged_only_when_set() {
        let judge = |value: &[u8]| env_override(Some(OsStr::from_bytes(value)));
        assert!(env_override(None).unwrap().is_none());
        assert!(judge(b"").unwrap().is_none());
        for fine in [
            &b"debug"[..],
            b"info,prfence=trace",
            b"prfence::daemon=debug",
        ] {
            assert!(judge(fine).unwrap().is_some(), "{fine:?}");
        }
        let e = judge(b"prfence=loud").unwrap_err();
        assert!(
            e.starts_with("PRFENCE_LOG=\"prfence=loud\" is not a tracing filter"),
            "{e}"
        );
        assert!(e.contains("unset it"), "{e}");
        let e = judge(b"debug\xff").unwrap_err();
        assert!(e.contains("is not UTF-8; unset it"), "{e}");
    }
}
