//! The agent's metrics and their Prometheus text exposition (format 0.0.4), hand-written: a
//! dozen series do not need a metrics framework. Plain data, no locking and no clock: the driver
//! keeps it behind its own lock and passes `now` when rendering.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::failure::CommandFailure;
use super::status::{Role, SelfFenceSteps, State, WatchdogState};

/// The PR command a latency or conflict belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CommandKind {
    ReadKeys,
    ReadReservation,
    ReadFullStatus,
    Register,
    Reserve,
    Preempt,
}

impl CommandKind {
    fn label(self) -> &'static str {
        match self {
            CommandKind::ReadKeys => "read_keys",
            CommandKind::ReadReservation => "read_reservation",
            CommandKind::ReadFullStatus => "read_full_status",
            CommandKind::Register => "register",
            CommandKind::Reserve => "reserve",
            CommandKind::Preempt => "preempt",
        }
    }
}

/// How an LU check, renew or preempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CommandResult {
    Ok,
    /// Our key was not on the LU (checks only).
    KeyMissing,
    Conflict,
    Unreachable,
    Timeout,
    Failed,
}

impl CommandResult {
    fn label(self) -> &'static str {
        match self {
            CommandResult::Ok => "ok",
            CommandResult::KeyMissing => "key_missing",
            CommandResult::Conflict => "conflict",
            CommandResult::Unreachable => "unreachable",
            CommandResult::Timeout => "timeout",
            CommandResult::Failed => "failed",
        }
    }
}

impl From<CommandFailure> for CommandResult {
    fn from(e: CommandFailure) -> CommandResult {
        match e {
            CommandFailure::Conflict => CommandResult::Conflict,
            CommandFailure::Unreachable => CommandResult::Unreachable,
            CommandFailure::Timeout => CommandResult::Timeout,
            CommandFailure::Failed => CommandResult::Failed,
        }
    }
}

impl<T> From<Result<T, CommandFailure>> for CommandResult {
    fn from(r: Result<T, CommandFailure>) -> CommandResult {
        r.map_or_else(CommandResult::from, |_| CommandResult::Ok)
    }
}

/// Upper bounds (seconds) of the command latency buckets: 0.5 ms (a local target) to 10 s.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Clone, PartialEq)]
struct Histogram {
    /// Per bucket of [`LATENCY_BUCKETS`], not cumulative; the last slot is above every bound.
    counts: [u64; LATENCY_BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: [0; LATENCY_BUCKETS.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, seconds: f64) {
        let slot = LATENCY_BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[slot] += 1;
        self.sum += seconds;
        self.count += 1;
    }
}

/// Sets `lu`'s value in `map`, allocating its name only the first time.
fn set<T>(map: &mut BTreeMap<String, T>, lu: &str, value: T) {
    match map.get_mut(lu) {
        Some(slot) => *slot = value,
        None => {
            map.insert(lu.to_owned(), value);
        }
    }
}

/// Everything `/metrics` shows.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// By LU, then outcome: looked up by the LU's name without allocating (issue 48: three
    /// `String`s per LU per check were a measurable share of the check's own CPU).
    checks: BTreeMap<String, BTreeMap<CommandResult, u64>>,
    keys_seen: BTreeMap<String, u64>,
    last_good_check: BTreeMap<String, Option<Instant>>,
    renewals: BTreeMap<CommandResult, u64>,
    preempts: BTreeMap<CommandResult, u64>,
    conflicts: BTreeMap<CommandKind, u64>,
    heals: BTreeMap<String, u64>,
    latency: BTreeMap<CommandKind, Histogram>,
    fenced: bool,
    lease_role: Option<Role>,
    http_evicted: u64,
    status_file_errors: u64,
    blocked_paths: usize,
    keys_not_on_every_lu: usize,
    watchdog: WatchdogState,
    self_fence: Option<SelfFenceSteps>,
    state: State,
}

impl Metrics {
    /// Metrics for the configured LUs (so an LU never read well shows up as such).
    pub fn new(lus: impl IntoIterator<Item = String>) -> Metrics {
        Metrics {
            checks: BTreeMap::new(),
            keys_seen: BTreeMap::new(),
            last_good_check: lus.into_iter().map(|lu| (lu, None)).collect(),
            renewals: BTreeMap::new(),
            preempts: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            heals: BTreeMap::new(),
            latency: BTreeMap::new(),
            fenced: false,
            lease_role: None,
            http_evicted: 0,
            status_file_errors: 0,
            blocked_paths: 0,
            keys_not_on_every_lu: 0,
            watchdog: WatchdogState::NotConfigured,
            self_fence: None,
            state: State::Starting,
        }
    }

    /// One check of `lu`. A check that read keys (`Ok` or `KeyMissing`) is a good read:
    /// `keys_seen` is how many registrations READ KEYS listed.
    pub fn record_check(
        &mut self,
        lu: &str,
        outcome: CommandResult,
        keys_seen: Option<u64>,
        now: Instant,
    ) {
        match self.checks.get_mut(lu) {
            Some(outcomes) => *outcomes.entry(outcome).or_default() += 1,
            None => {
                self.checks
                    .insert(lu.to_owned(), BTreeMap::from([(outcome, 1)]));
            }
        }
        if matches!(outcome, CommandResult::Ok | CommandResult::KeyMissing) {
            set(&mut self.last_good_check, lu, Some(now));
        }
        if let Some(n) = keys_seen {
            set(&mut self.keys_seen, lu, n);
        }
    }

    pub fn record_renewal(&mut self, outcome: CommandResult) {
        *self.renewals.entry(outcome).or_default() += 1;
    }

    pub fn record_preempt(&mut self, outcome: CommandResult) {
        *self.preempts.entry(outcome).or_default() += 1;
    }

    /// A RESERVATION CONFLICT answer to `command`, whatever it meant.
    pub fn record_conflict(&mut self, command: CommandKind) {
        *self.conflicts.entry(command).or_default() += 1;
    }

    pub fn record_heal(&mut self, lu: &str) {
        *self.heals.entry(lu.to_owned()).or_default() += 1;
    }

    pub fn observe_latency(&mut self, command: CommandKind, took: Duration) {
        self.latency
            .entry(command)
            .or_insert_with(Histogram::new)
            .observe(took.as_secs_f64());
    }

    /// An HTTP connection closed to make room under the connection cap (see `http.rs`).
    pub fn record_http_evicted(&mut self) {
        self.http_evicted += 1;
    }

    /// The status file could not be written (it then shows an older state: its `updated_unix`
    /// tells how old).
    pub fn record_status_file_error(&mut self) {
        self.status_file_errors += 1;
    }

    pub fn set_fenced(&mut self) {
        self.fenced = true;
    }

    /// Paths whose command or open has not returned from the kernel (one thread each).
    pub fn set_blocked_paths(&mut self, count: usize) {
        self.blocked_paths = count;
    }

    /// The node-wide state the status document shows, as `prfence_state{state=…}`.
    pub fn set_state(&mut self, state: State) {
        self.state = state;
    }

    pub fn set_keys_not_on_every_lu(&mut self, count: usize) {
        self.keys_not_on_every_lu = count;
    }

    pub fn set_watchdog(&mut self, state: WatchdogState) {
        self.watchdog = state;
    }

    pub fn set_self_fence(&mut self, steps: SelfFenceSteps) {
        self.self_fence = Some(steps);
    }

    pub fn set_lease_role(&mut self, role: Role) {
        self.lease_role = Some(role);
    }

    /// The text exposition, with "seconds since the last good check" computed at `now`
    /// (`+Inf` for an LU never read well).
    pub fn render(&self, now: Instant) -> String {
        let mut out = String::new();
        family(
            &mut out,
            "prfence_checks_total",
            "counter",
            "LU checks (one READ KEYS per LU and tick) by outcome.",
            self.checks.iter().flat_map(|(lu, outcomes)| {
                outcomes.iter().map(move |(outcome, n)| {
                    (
                        labels(&[("lu", lu), ("result", outcome.label())]),
                        n.to_string(),
                    )
                })
            }),
        );
        family(
            &mut out,
            "prfence_keys_seen",
            "gauge",
            "Registrations listed by the last good READ KEYS of the LU.",
            self.keys_seen
                .iter()
                .map(|(lu, n)| (labels(&[("lu", lu)]), n.to_string())),
        );
        family(
            &mut out,
            "prfence_seconds_since_last_good_check",
            "gauge",
            "Seconds since the LU was last read successfully.",
            self.last_good_check.iter().map(|(lu, at)| {
                let age = at.map_or(f64::INFINITY, |at| {
                    now.saturating_duration_since(at).as_secs_f64()
                });
                (labels(&[("lu", lu)]), number(age))
            }),
        );
        family(
            &mut out,
            "prfence_lease_renewals_total",
            "counter",
            "Lease renewals (REGISTER old key -> new key) by outcome.",
            self.renewals
                .iter()
                .map(|(o, n)| (labels(&[("result", o.label())]), n.to_string())),
        );
        family(
            &mut out,
            "prfence_lease_preempts_total",
            "counter",
            "PREEMPT AND ABORT of a stale holder by outcome (conflict: the holder had renewed).",
            self.preempts
                .iter()
                .map(|(o, n)| (labels(&[("result", o.label())]), n.to_string())),
        );
        family(
            &mut out,
            "prfence_reservation_conflicts_total",
            "counter",
            "RESERVATION CONFLICT answers by command.",
            self.conflicts
                .iter()
                .map(|(c, n)| (labels(&[("command", c.label())]), n.to_string())),
        );
        family(
            &mut out,
            "prfence_heals_total",
            "counter",
            "Heals (ops::heal) that purged orphaned registrations of our key (earlier iSCSI sessions); heal never registers a path.",
            self.heals
                .iter()
                .map(|(lu, n)| (labels(&[("lu", lu)]), n.to_string())),
        );
        family(
            &mut out,
            "prfence_http_connections_evicted_total",
            "counter",
            "HTTP connections closed unanswered because the endpoint's connection cap was full.",
            std::iter::once((String::new(), self.http_evicted.to_string())),
        );
        family(
            &mut out,
            "prfence_status_file_write_errors_total",
            "counter",
            "Writes of --status-file that failed (the file keeps an older state; its updated_unix says when it was written).",
            std::iter::once((String::new(), self.status_file_errors.to_string())),
        );
        family(
            &mut out,
            "prfence_paths_blocked",
            "gauge",
            "Paths whose last command or open has not returned from the kernel (each holds one thread; the path gets no other command meanwhile).",
            std::iter::once((String::new(), self.blocked_paths.to_string())),
        );
        family(
            &mut out,
            "prfence_state",
            "gauge",
            "The agent's state as its status document shows it (1 for the current one): watch mode is armed only once healthy or degraded; waiting_for_registration that lasts means a key nobody registers.",
            State::ALL.iter().map(|&state| {
                (
                    labels(&[("state", &snake(&state))]),
                    u8::from(state == self.state).to_string(),
                )
            }),
        );
        family(
            &mut out,
            "prfence_keys_not_on_every_lu",
            "gauge",
            "Other nodes' keys registered on some of this node's LUs and not on the others for watch.grace: a node with another LU set.",
            std::iter::once((String::new(), self.keys_not_on_every_lu.to_string())),
        );
        family(
            &mut out,
            "prfence_fenced",
            "gauge",
            "1 once this node has decided it is fenced.",
            std::iter::once((String::new(), u8::from(self.fenced).to_string())),
        );
        if self.watchdog != WatchdogState::NotConfigured {
            family(
                &mut out,
                "prfence_watchdog_up",
                "gauge",
                "1 while the configured hardware watchdog is open and its last feed worked.",
                std::iter::once((
                    String::new(),
                    u8::from(self.watchdog == WatchdogState::Ok).to_string(),
                )),
            );
            family(
                &mut out,
                "prfence_watchdog_degraded",
                "gauge",
                "1 while the configured watchdog is due but cannot be opened or fed (no hardware reset backs the agent).",
                std::iter::once((
                    String::new(),
                    u8::from(self.watchdog == WatchdogState::Degraded).to_string(),
                )),
            );
        }
        if let Some(steps) = self.self_fence {
            family(
                &mut out,
                "prfence_self_fence_step",
                "gauge",
                "The result of each self-fence step (1 for the current one).",
                [
                    ("watchdog", snake(&steps.watchdog)),
                    ("hook", snake(&steps.hook)),
                    ("reboot", snake(&steps.reboot)),
                ]
                .into_iter()
                .map(|(step, result)| {
                    (
                        labels(&[("step", step), ("result", &result)]),
                        "1".to_owned(),
                    )
                }),
            );
        }
        if let Some(role) = self.lease_role {
            family(
                &mut out,
                "prfence_lease_role",
                "gauge",
                "The node's lease role (1 for the current one).",
                [
                    ("standby", role == Role::Standby),
                    ("holder", matches!(role, Role::Holder { promoted: true })),
                    (
                        "holder_unconfirmed",
                        matches!(role, Role::Holder { promoted: false }),
                    ),
                    ("fenced", role == Role::Fenced),
                ]
                .into_iter()
                .map(|(name, on)| (labels(&[("role", name)]), u8::from(on).to_string())),
            );
        }
        let name = "prfence_command_duration_seconds";
        let _ = writeln!(out, "# HELP {name} PR command latency, send to completion.");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (command, h) in &self.latency {
            let command = command.label();
            let mut cumulative = 0;
            let bounds = LATENCY_BUCKETS.iter().copied().chain([f64::INFINITY]);
            for (bound, count) in bounds.zip(h.counts) {
                cumulative += count;
                let le = number(bound);
                let l = labels(&[("command", command), ("le", &le)]);
                let _ = writeln!(out, "{name}_bucket{l} {cumulative}");
            }
            let l = labels(&[("command", command)]);
            let _ = writeln!(out, "{name}_sum{l} {}", number(h.sum));
            let _ = writeln!(out, "{name}_count{l} {}", h.count);
        }
        out
    }
}

fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl Iterator<Item = (String, String)>,
) {
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "# HELP {name} {}",
        help.replace('\\', "\\\\").replace('\n', "\\n")
    );
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// A unit enum variant's serde name (snake_case), the same word the status shows.
fn snake(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => "unknown".to_owned(),
    }
}

/// `{a="x",b="y"}` with values escaped as the format requires.
fn labels(pairs: &[(&str, &str)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .map(|(name, value)| {
            let value = value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{name}=\"{value}\"")
        })
        .collect();
    format!("{{{}}}", body.join(","))
}

/// Go-style float text: `+Inf`, `-Inf`, `NaN`, else Rust's shortest round-trip decimal.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_registry_renders_headers_and_never_checked_lus() {
        let m = Metrics::new(["data".to_owned()]);
        let text = m.render(Instant::now());
        assert!(text.contains("# TYPE prfence_checks_total counter\n"));
        assert!(text.contains("prfence_seconds_since_last_good_check{lu=\"data\"} +Inf\n"));
        assert!(text.contains("prfence_fenced 0\n"));
        assert!(!text.contains("prfence_lease_role"));
        assert!(text.ends_with("# TYPE prfence_command_duration_seconds histogram\n"));
    }

    #[test]
    fn counters_gauges_and_age() {
        let t0 = Instant::now();
        let mut m = Metrics::new(["a".to_owned(), "b".to_owned()]);
        m.record_check("a", CommandResult::Ok, Some(4), t0);
        m.record_check("a", CommandResult::Ok, Some(3), t0 + Duration::from_secs(1));
        m.record_check("b", CommandResult::from(CommandFailure::Timeout), None, t0);
        m.record_renewal(CommandResult::from(Ok::<(), CommandFailure>(())));
        m.record_preempt(CommandResult::from(Err::<(), _>(CommandFailure::Conflict)));
        m.record_conflict(CommandKind::Preempt);
        m.record_heal("a");
        m.set_fenced();
        m.set_lease_role(Role::Holder { promoted: true });
        let text = m.render(t0 + Duration::from_millis(3500));
        for line in [
            "prfence_checks_total{lu=\"a\",result=\"ok\"} 2",
            "prfence_checks_total{lu=\"b\",result=\"timeout\"} 1",
            "prfence_keys_seen{lu=\"a\"} 3",
            "prfence_seconds_since_last_good_check{lu=\"a\"} 2.5",
            "prfence_seconds_since_last_good_check{lu=\"b\"} +Inf",
            "prfence_lease_renewals_total{result=\"ok\"} 1",
            "prfence_lease_preempts_total{result=\"conflict\"} 1",
            "prfence_reservation_conflicts_total{command=\"preempt\"} 1",
            "prfence_heals_total{lu=\"a\"} 1",
            "prfence_fenced 1",
            "prfence_lease_role{role=\"holder\"} 1",
            "prfence_lease_role{role=\"standby\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn histogram_buckets_are_cumulative_with_sum_and_count() {
        let mut m = Metrics::new([]);
        m.observe_latency(CommandKind::ReadKeys, Duration::from_micros(300));
        m.observe_latency(CommandKind::ReadKeys, Duration::from_millis(1));
        m.observe_latency(CommandKind::ReadKeys, Duration::from_secs(30));
        let text = m.render(Instant::now());
        let bucket = |le: &str| {
            let prefix = format!(
                "prfence_command_duration_seconds_bucket{{command=\"read_keys\",le=\"{le}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("no bucket {le} in\n{text}"))
                .to_owned()
        };
        assert_eq!(bucket("0.0005"), "1");
        assert_eq!(bucket("0.001"), "2", "the bound is inclusive");
        assert_eq!(bucket("10"), "2");
        assert_eq!(bucket("+Inf"), "3");
        assert!(text.contains("prfence_command_duration_seconds_count{command=\"read_keys\"} 3\n"));
        assert!(
            text.contains("prfence_command_duration_seconds_sum{command=\"read_keys\"} 30.0013\n")
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(labels(&[("lu", "a\"b\\c\nd")]), "{lu=\"a\\\"b\\\\c\\nd\"}");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(0.25), "0.25");
    }

    #[test]
    fn every_sample_line_is_well_formed() {
        let t0 = Instant::now();
        let mut m = Metrics::new(["x y".to_owned()]);
        m.record_check("x y", CommandResult::KeyMissing, Some(0), t0);
        m.observe_latency(CommandKind::Register, Duration::from_millis(7));
        m.set_lease_role(Role::Fenced);
        for line in m.render(t0).lines() {
            if line.starts_with('#') {
                assert!(
                    line.starts_with("# HELP prfence_") || line.starts_with("# TYPE prfence_"),
                    "{line}"
                );
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(series.starts_with("prfence_"), "{line}");
            assert!(value == "+Inf" || value.parse::<f64>().is_ok(), "{line}");
            if let Some(open) = series.find('{') {
                assert!(series.ends_with('}'), "{line}");
                assert!(!series[..open].contains(' '), "{line}");
            }
        }
    }
}
