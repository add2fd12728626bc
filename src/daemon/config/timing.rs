//! The agent's timing rules, one table: `Settings::check_timing` runs the checks in this order,
//! docs/agent.md shows the table (a test compares it row by row) and prfence-agent.toml(5) is
//! generated from it. None of the rules is needed for safety, which rests on the target (P5);
//! they keep the agent from fencing itself needlessly and make a stalled lease holder stop before
//! a standby takes over.

use std::time::Duration;

use super::{CHECK_SLOTS, LeaseModeSettings, ModeSettings, Settings, WatchModeSettings, feed_gap};

/// One rule, as the docs show it and as the agent enforces it.
#[derive(Debug, Clone, Copy)]
pub struct TimingRule {
    /// Which agents it binds: `both`, `watch`, `lease` or `both, with sd_notify`.
    pub modes: &'static str,
    /// The rule, in the docs' notation (Markdown: settings in backticks).
    pub rule: &'static str,
    /// Why it exists.
    pub why: &'static str,
    pub enforced: Enforced,
}

/// Where a rule is enforced.
#[derive(Debug, Clone, Copy)]
pub enum Enforced {
    /// Where the setting is read: a value outside its range is a field error.
    WhereRead,
    /// At start and by `--check-config`, against the unit's `WatchdogSec`
    /// ([`Settings::check_service_watchdog`]): the file alone does not know it.
    AgainstTheUnit,
    /// By `Settings::check_timing`: the refusal, naming the values, if the settings break it.
    Check(fn(&Settings) -> Result<(), String>),
}

pub const TIMING_RULES: &[TimingRule] = &[
    TimingRule {
        modes: "both",
        rule: "`100ms ≤ check_interval ≤ 1h`",
        why: "the detection delay is about `check_interval × missing_confirmations`",
        enforced: Enforced::WhereRead,
    },
    TimingRule {
        modes: "both",
        rule: "`0 < command_timeout ≤ 4294967294ms`, `self_fence.command_timeout > 0`",
        why: "SG_IO carries a command's timeout in 32 bits of milliseconds; a zero timeout would \
              kill the hook before it runs",
        enforced: Enforced::WhereRead,
    },
    TimingRule {
        modes: "both",
        rule: "`watch.grace`, `lease.lease`, `self_fence.command_timeout` ≤ 1h; \
               `watch.path_audit` ≤ 1d",
        why: "longer is a typo (`\"20h\"` for `\"20s\"`): a node unsure of its registration, or a \
              fenced node's self-fence, would wait that long",
        enforced: Enforced::WhereRead,
    },
    TimingRule {
        modes: "both",
        rule: "`self_fence.command_timeout < watchdog.timeout`, with `self_fence.stop_watchdog`",
        why: "the self-fence stops feeding the watchdog before the hook starts, so the hardware \
              resets the node at most `watchdog.timeout` later: a hook allowed longer is cut by \
              the reset (it may be cut as early as `watchdog.timeout` minus the time since the \
              last feed)",
        enforced: Enforced::Check(hook_before_the_reset),
    },
    TimingRule {
        modes: "watch",
        rule: "`check_interval ≤ watch.grace`",
        why: "the grace spans a check",
        enforced: Enforced::Check(grace_covers_a_check),
    },
    TimingRule {
        modes: "watch",
        rule: "`watch.path_audit ≥ check_interval`, or `\"off\"` (the default)",
        why: "a periodic probe of every path while all looks right, besides the probes at start, \
              on a path change, on a change in the count of our registrations and every minute \
              while a path is found unregistered; a probe is a PR OUT (same-key REGISTER), so the \
              default sends none in a healthy steady state",
        enforced: Enforced::Check(path_audit_not_below_a_check),
    },
    TimingRule {
        modes: "watch",
        rule: "`command_timeout < watch.grace`",
        why: "a hung command is noticed within the grace",
        enforced: Enforced::Check(hung_command_within_grace),
    },
    TimingRule {
        modes: "watch",
        rule: "`watchdog.timeout > check_interval + 3 × (command_timeout + 200ms)`",
        why: "the watchdog is fed once a check ends while not fenced, and a check over hung paths \
              ends only at its budget (`3 × (command_timeout + 200ms)`)",
        enforced: Enforced::Check(watchdog_outlasts_a_check),
    },
    TimingRule {
        modes: "both, with sd_notify",
        rule: "the unit's `WatchdogSec > check_interval + 3 × (command_timeout + 200ms)`",
        why: "WATCHDOG=1 is sent once a check ends; checked against systemd's `$WATCHDOG_USEC` at \
              a start under systemd, else against the packaged unit's 30 s (`--check-config` runs \
              in `ExecStartPre=`, which systemd gives no `$WATCHDOG_USEC`, and applies the rule \
              unless `notify = false`)",
        enforced: Enforced::AgainstTheUnit,
    },
    TimingRule {
        modes: "lease",
        rule: "`100ms ≤ renew < lease / 2`",
        why: "the holder gets a second attempt within a lease",
        enforced: Enforced::Check(renew_twice_per_lease),
    },
    TimingRule {
        modes: "lease",
        rule: "`0 < margin < lease − renew`",
        why: "the holder stops `lease − margin` after its last successful renew was *sent*",
        enforced: Enforced::Check(margin_leaves_a_renew),
    },
    TimingRule {
        modes: "lease",
        rule: "`margin ≥ 2 × clock_drift_ppm × lease`",
        why: "the holder's deadline ends before the standby's lease, even with clocks running at \
              different rates (ρ); use seconds in practice, to cover wake-up lateness and the \
              stop hook",
        enforced: Enforced::Check(margin_covers_drift),
    },
    TimingRule {
        modes: "lease",
        rule: "`command_timeout ≤ renew`",
        why: "one renew ends before the next is due",
        enforced: Enforced::Check(renew_ends_before_the_next),
    },
    TimingRule {
        modes: "lease",
        rule: "`check_interval ≤ lease / 2`",
        why: "a standby samples the key at least twice per lease (sampling late only delays a \
              takeover)",
        enforced: Enforced::Check(standby_samples_twice),
    },
    TimingRule {
        modes: "lease",
        rule: "`self_fence.command_timeout < margin`",
        why: "the stop hook is done before a standby may act",
        enforced: Enforced::Check(hook_within_margin),
    },
    TimingRule {
        modes: "lease",
        rule: "`watchdog.timeout + renew + command_timeout + check_interval ≤ lease − margin`",
        why: "a hung holder is reset by the hardware before its lease ends",
        enforced: Enforced::Check(watchdog_before_the_lease_ends),
    },
];

fn watch(s: &Settings) -> Option<&WatchModeSettings> {
    match &s.mode {
        ModeSettings::Watch(watch) => Some(watch),
        ModeSettings::Lease(_) => None,
    }
}

fn lease(s: &Settings) -> Option<&LeaseModeSettings> {
    match &s.mode {
        ModeSettings::Lease(lease) => Some(lease),
        ModeSettings::Watch(_) => None,
    }
}

fn hook_before_the_reset(s: &Settings) -> Result<(), String> {
    match (&s.self_fence.command, &s.watchdog) {
        (Some(command), Some(wd))
            if s.self_fence.stop_watchdog && s.self_fence.command_timeout >= wd.timeout =>
        {
            Err(format!(
                "self_fence.command_timeout ({:?}) must be below watchdog.timeout ({:?}): the \
                 self-fence stops feeding the watchdog before it runs the hook ({:?}), so the \
                 node is reset within watchdog.timeout and a longer hook is cut; lower the \
                 hook's timeout, or set self_fence.stop_watchdog = false",
                s.self_fence.command_timeout, wd.timeout, command[0]
            ))
        }
        _ => Ok(()),
    }
}

fn grace_covers_a_check(s: &Settings) -> Result<(), String> {
    match watch(s) {
        Some(watch) if watch.grace < s.check_interval => Err(format!(
            "watch.grace ({:?}) must be at least check_interval ({:?}): the grace must cover at \
             least one check, or a single slow read fences the node",
            watch.grace, s.check_interval
        )),
        _ => Ok(()),
    }
}

fn path_audit_not_below_a_check(s: &Settings) -> Result<(), String> {
    match watch(s).and_then(|w| w.path_audit) {
        Some(path_audit) if path_audit < s.check_interval => Err(format!(
            "watch.path_audit ({path_audit:?}) must be at least check_interval ({:?}), or \
             \"off\": paths are audited as part of a check",
            s.check_interval
        )),
        _ => Ok(()),
    }
}

fn hung_command_within_grace(s: &Settings) -> Result<(), String> {
    match watch(s) {
        Some(watch) if s.command_timeout >= watch.grace => Err(format!(
            "command_timeout ({:?}) must be below watch.grace ({:?}): an unreachable target is \
             only noticed when a command times out",
            s.command_timeout, watch.grace
        )),
        _ => Ok(()),
    }
}

fn watchdog_outlasts_a_check(s: &Settings) -> Result<(), String> {
    let (Some(_), Some(wd)) = (watch(s), &s.watchdog) else {
        return Ok(());
    };
    let gap = feed_gap(s.check_interval, s.command_timeout);
    if wd.timeout <= gap {
        return Err(format!(
            "watchdog.timeout ({:?}) must exceed check_interval + the check's budget \
             ({CHECK_SLOTS} x (command_timeout + 200ms)) = {gap:?}: the watchdog is fed once a \
             check ends, and a check over hung paths takes its whole budget, so a shorter \
             timeout resets a node that is still registered",
            wd.timeout
        ));
    }
    Ok(())
}

fn renew_twice_per_lease(s: &Settings) -> Result<(), String> {
    let Some(lease) = lease(s) else {
        return Ok(());
    };
    if lease.renew < super::MIN_CHECK_INTERVAL {
        return Err(format!(
            "lease.renew ({:?}) must be at least 100ms: each renew is a PR OUT on every path of \
             every LU, and faster renewal only loads the target",
            lease.renew
        ));
    }
    if lease.renew.saturating_mul(2) >= lease.lease {
        return Err(format!(
            "lease.renew ({:?}) must be below lease.lease / 2 ({:?}): the holder needs a second \
             renew attempt before its lease runs out",
            lease.renew,
            lease.lease / 2
        ));
    }
    Ok(())
}

fn margin_leaves_a_renew(s: &Settings) -> Result<(), String> {
    match lease(s) {
        Some(lease) if lease.margin.is_zero() || lease.margin >= lease.lease - lease.renew => {
            Err(format!(
                "lease.margin ({:?}) must be above 0 and below lease.lease - lease.renew ({:?}): \
                 the holder self-fences at lease - margin after its last good renew, which must \
                 leave room for the next renew",
                lease.margin,
                lease.lease - lease.renew
            ))
        }
        _ => Ok(()),
    }
}

fn margin_covers_drift(s: &Settings) -> Result<(), String> {
    let Some(lease) = lease(s) else {
        return Ok(());
    };
    let drift_allowance: Duration = lease
        .lease
        .mul_f64(2.0 * f64::from(lease.clock_drift_ppm) / 1_000_000.0);
    if lease.margin < drift_allowance {
        return Err(format!(
            "lease.margin ({:?}) must be at least 2 x clock_drift_ppm x lease \
             ({drift_allowance:?}): with clocks running up to {} ppm apart, the holder's lease - \
             margin must end before the standby's lease does",
            lease.margin, lease.clock_drift_ppm
        ));
    }
    Ok(())
}

fn renew_ends_before_the_next(s: &Settings) -> Result<(), String> {
    match lease(s) {
        Some(lease) if s.command_timeout > lease.renew => Err(format!(
            "command_timeout ({:?}) must not exceed lease.renew ({:?}): one renew must end before \
             the next is due",
            s.command_timeout, lease.renew
        )),
        _ => Ok(()),
    }
}

fn standby_samples_twice(s: &Settings) -> Result<(), String> {
    match lease(s) {
        Some(lease) if s.check_interval.saturating_mul(2) > lease.lease => Err(format!(
            "check_interval ({:?}) must be at most lease.lease / 2 ({:?}): a standby samples the \
             holder's key at least twice per lease",
            s.check_interval,
            lease.lease / 2
        )),
        _ => Ok(()),
    }
}

fn hook_within_margin(s: &Settings) -> Result<(), String> {
    match (lease(s), &s.self_fence.command) {
        (Some(lease), Some(command)) if s.self_fence.command_timeout >= lease.margin => {
            Err(format!(
                "self_fence.command_timeout ({:?}) must be below lease.margin ({:?}): the hook \
                 ({:?}) runs at lease - margin and must be done before a standby may take over",
                s.self_fence.command_timeout, lease.margin, command[0]
            ))
        }
        _ => Ok(()),
    }
}

fn watchdog_before_the_lease_ends(s: &Settings) -> Result<(), String> {
    let (Some(lease), Some(wd)) = (lease(s), &s.watchdog) else {
        return Ok(());
    };
    let busy = wd.timeout + lease.renew + s.command_timeout + s.check_interval;
    if busy > lease.lease - lease.margin {
        return Err(format!(
            "watchdog.timeout + lease.renew + command_timeout + check_interval ({busy:?}) must \
             not exceed lease.lease - lease.margin ({:?}): the holder stops feeding the watchdog \
             when its lease has less than watchdog.timeout left, and a healthy holder must renew \
             before that",
            lease.lease - lease.margin
        ));
    }
    Ok(())
}

/// The table as Markdown rows (`| modes | rule | why |`), as docs/agent.md shows it.
pub fn markdown_rows() -> Vec<String> {
    TIMING_RULES
        .iter()
        .map(|r| format!("| {} | {} | {} |", r.modes, r.rule, r.why))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/agent.md's table is this one, row by row, in this order.
    #[test]
    fn the_agent_docs_show_this_table() {
        let doc = include_str!("../../../docs/agent.md");
        let section = doc
            .split("### Timing rules, and why safety never rests on them")
            .nth(1)
            .expect("agent.md has the timing rules section");
        let rows: Vec<&str> = section
            .lines()
            .skip_while(|l| !l.starts_with("| mode |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .collect();
        assert_eq!(rows, markdown_rows());
    }
}
