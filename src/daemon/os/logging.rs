//! Logging set-up from `[log]`: text for a terminal, text for journald (no timestamp, which the
//! journal adds, and a `<N>` syslog priority prefix that journald turns into the entry's
//! priority; SYSLOG_IDENTIFIER comes from the unit), or JSON lines. The level is reloadable.

use std::ffi::OsStr;
use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use crate::daemon::config::{LogSettings, LogTarget};

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

/// Log lines waiting for the writer thread at most; past it lines are dropped and counted.
const QUEUE_LINES: usize = 4096;

/// Log lines go to stderr from a thread of their own through a bounded queue: a stalled journald
/// (its stream socket full) then blocks that thread, never the agent's two runtime workers, which
/// check the LUs and feed the watchdog; a reset for a slow journal would be a surprise. A full
/// queue drops lines and counts them; the count is written once the writer catches up.
#[derive(Clone)]
pub struct LineQueue {
    lines: SyncSender<Vec<u8>>,
    state: Arc<QueueState>,
}

#[derive(Default)]
struct QueueState {
    /// Queued and not yet written.
    pending: AtomicUsize,
    /// Dropped since the writer last said so.
    dropped: AtomicU64,
}

impl LineQueue {
    /// Starts the writer thread, writing into `sink`.
    pub fn start(sink: impl Write + Send + 'static) -> std::io::Result<LineQueue> {
        let (lines, incoming) = std::sync::mpsc::sync_channel(QUEUE_LINES);
        let state = Arc::new(QueueState::default());
        let shared = Arc::clone(&state);
        std::thread::Builder::new()
            .name("log-writer".to_owned())
            .spawn(move || write_lines(&incoming, sink, &shared))?;
        Ok(LineQueue { lines, state })
    }

    /// Waits up to `within` for the queued lines to be written (before an exit or a reboot).
    pub fn flush(&self, within: Duration) {
        let until = Instant::now() + within;
        while self.state.pending.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn send(&self, line: Vec<u8>) {
        self.state.pending.fetch_add(1, Ordering::SeqCst);
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            self.lines.try_send(line)
        {
            self.state.pending.fetch_sub(1, Ordering::SeqCst);
            self.state.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn write_lines(incoming: &Receiver<Vec<u8>>, mut sink: impl Write, state: &QueueState) {
    for line in incoming {
        let dropped = state.dropped.swap(0, Ordering::SeqCst);
        if dropped > 0 {
            // A write error has nowhere to go: the line is lost either way.
            let _ = writeln!(
                sink,
                "<4>prfence agent: {dropped} log line(s) dropped: the log's reader (journald) \
                 did not keep up"
            );
        }
        let _ = sink.write_all(&line);
        state.pending.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One event's formatted text, queued whole when the formatter is done with it.
pub struct QueuedLine {
    text: Vec<u8>,
    queue: LineQueue,
}

impl Write for QueuedLine {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for QueuedLine {
    fn drop(&mut self) {
        if !self.text.is_empty() {
            self.queue.send(std::mem::take(&mut self.text));
        }
    }
}

impl<'a> MakeWriter<'a> for LineQueue {
    type Writer = QueuedLine;
    fn make_writer(&'a self) -> QueuedLine {
        QueuedLine {
            text: Vec::new(),
            queue: self.clone(),
        }
    }
}

/// The agent's log queue, once [`init`] ran.
static QUEUE: OnceLock<LineQueue> = OnceLock::new();

/// Waits up to `within` for queued log lines to reach stderr (nothing to do before [`init`]).
pub fn flush(within: Duration) {
    if let Some(queue) = QUEUE.get() {
        queue.flush(within);
    }
}

/// Installs the global subscriber. `PRFENCE_LOG`, if set, overrides `log.level`.
pub fn init(settings: &LogSettings) -> Result<LogHandle, String> {
    let filter = match env_override(std::env::var_os(LOG_ENV).as_deref())? {
        Some(filter) => filter,
        None => EnvFilter::try_new(&settings.level)
            .map_err(|e| format!("log.level {:?}: {e}", settings.level))?,
    };
    let (filter, handle) = reload::Layer::new(filter);
    let queue = LineQueue::start(std::io::stderr())
        .map_err(|e| format!("cannot start the log writer thread: {e}"))?;
    // A second init fails at try_init below, as before; the first queue stays the one flushed.
    let _ = QUEUE.set(queue.clone());
    let output: Box<dyn Layer<_> + Send + Sync> = match (settings.json, settings.target) {
        (true, _) => Box::new(tracing_subscriber::fmt::layer().json().with_writer(queue)),
        (false, LogTarget::Journald) => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .without_time()
                .event_format(SyslogPriority(
                    tracing_subscriber::fmt::format()
                        .with_ansi(false)
                        .without_time(),
                ))
                .with_writer(queue),
        ),
        (false, LogTarget::Stderr) => Box::new(
            tracing_subscriber::fmt::layer()
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(queue),
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

    /// Whether the gate is open, and what went through it.
    type GateState = std::sync::Mutex<(bool, Vec<u8>)>;

    /// A sink that blocks every write until opened, as stderr does when journald stops reading
    /// its stream socket; what it was given once open.
    #[derive(Clone, Default)]
    struct Gate(Arc<(GateState, std::sync::Condvar)>);

    impl Gate {
        fn open(&self) {
            self.0.0.lock().unwrap().0 = true;
            self.0.1.notify_all();
        }
        fn written(&self) -> String {
            String::from_utf8_lossy(&self.0.0.lock().unwrap().1).into_owned()
        }
    }

    impl Write for Gate {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let (lock, opened) = &*self.0;
            let mut state = opened
                .wait_while(lock.lock().unwrap(), |(open, _)| !*open)
                .unwrap();
            state.1.extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A reader that stopped reading (a stalled journald) blocks the writer thread only: 10 000
    /// lines are queued or dropped without waiting; once the reader reads again every line is
    /// either written or counted in a drop report.
    #[test]
    fn a_stalled_reader_never_blocks_the_logging_thread() {
        let gate = Gate::default();
        let queue = LineQueue::start(gate.clone()).unwrap();
        let logging = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                for n in 0..10_000 {
                    let mut line = queue.make_writer();
                    writeln!(line, "line {n}").unwrap();
                }
            })
        };
        let until = Instant::now() + Duration::from_secs(20);
        while !logging.is_finished() {
            assert!(
                Instant::now() < until,
                "logging blocked behind the stalled reader"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The writer holds one line, the queue QUEUE_LINES: the rest could only be dropped.
        let pending = queue.state.pending.load(Ordering::SeqCst);
        assert!(pending >= QUEUE_LINES, "{pending} lines pending");
        gate.open();
        queue.flush(Duration::from_secs(10));
        writeln!(queue.make_writer(), "after").unwrap();
        queue.flush(Duration::from_secs(10));
        // A drop report goes out before the next line the writer takes, so "after" carries out
        // the last one.
        let text = gate.written();
        let written = text.lines().filter(|l| l.starts_with("line ")).count() as u64;
        let reported: u64 = text
            .lines()
            .filter_map(|l| l.strip_prefix("<4>prfence agent: "))
            .filter_map(|l| l.split(' ').next()?.parse::<u64>().ok())
            .sum();
        assert!(reported > 0, "no drop count written");
        assert_eq!(
            written + reported,
            10_000,
            "{written} written, {reported} reported dropped"
        );
        assert!(
            text.ends_with("after\n"),
            "{}",
            &text[text.len().saturating_sub(200)..]
        );
    }

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
