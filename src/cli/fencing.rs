//! `prfence unfence | fence | status`: the fencing engine ([`crate::ops`]) on the devices named,
//! grouped into LUs, with a verdict per LU as text or JSON.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::Arc;

use crate::fence_agent::store::{KeyStore, LuRecord};
use crate::host::Host;
use crate::ops::{
    self, Arbitration, Limits, LuDone, LuReport, LuTarget, Outcome, OwnInitiator, PathUse, Report,
    RequestError, TieBreak, UnfenceBy, targets,
};
use crate::pr::Key;
use crate::transport::Policy;

use super::args::{Fence, FencingDevices, TieBreakArg};
use super::exit::{ExitStatus, json_with_exit};
use super::paths::{CliPath, make_room, opener};
use super::progress::{print_progress, show_progress};

/// Which engine command to run.
pub enum FencingCommand<'a> {
    Unfence(&'a FencingDevices),
    Fence(&'a Fence),
    Status(&'a FencingDevices),
}

/// Runs a fencing command on `host`'s devices and prints its report; returns the exit status.
pub fn execute(
    action: FencingCommand<'_>,
    json: bool,
    policy: Policy,
    host: &Arc<dyn Host>,
) -> ExitStatus {
    let (named, key, deadline) = match &action {
        FencingCommand::Unfence(d) | FencingCommand::Status(d) => (*d, d.key, d.deadline),
        FencingCommand::Fence(f) => (&f.target, f.target.key, f.target.deadline),
    };
    // Coordinators are LUs like the others to unfence and status; a fence races on them apart.
    let coordinated = !named.coordinators.is_empty();
    let devices: Vec<PathBuf> = match &action {
        FencingCommand::Fence(_) => named.devices.clone(),
        _ => named
            .devices
            .iter()
            .chain(&named.coordinators)
            .cloned()
            .collect(),
    };
    // Devices that vanished become node-local LUs: status and unfence report them as dead paths,
    // fence sends nothing while one is present (the arbiter could not be named, P2); devices
    // the admin must replace (a partition, an LVM volume, a virtio disk) are a usage error.
    let resolving = std::time::Instant::now();
    // Where a measured tie-break starts counting: the fence's own start, discovery included.
    let started = std::time::Instant::now();
    let resolution = match host.resolve_each(&devices) {
        Ok(resolution) => {
            tracing::debug!(
                "{} devices resolved to {} LUs and {} unidentified in {:?}",
                devices.len(),
                resolution.lus.len(),
                resolution.unidentified.len(),
                resolving.elapsed()
            );
            resolution
        }
        Err(e) => {
            eprintln!("prfence: {e}");
            return ExitStatus::Usage;
        }
    };
    let arbitration = match &action {
        FencingCommand::Fence(f) if coordinated => match host.resolve_each(&named.coordinators) {
            Ok(coordinators) => {
                for unknown in &coordinators.unidentified {
                    eprintln!(
                        "prfence: warning: coordinator {}; not identified: counted as lost, \
                             sent nothing",
                        unknown.error
                    );
                }
                Arbitration::Coordinators {
                    lus: targets(&coordinators, false, &opener(host, policy)),
                    unreachable_data: f.unreachable_data,
                }
            }
            Err(e) => {
                eprintln!("prfence: coordinators: {e}");
                return ExitStatus::Usage;
            }
        },
        _ => Arbitration::FirstLu,
    };
    for unknown in &resolution.unidentified {
        if coordinated {
            eprintln!(
                "prfence: warning: {}; not identified: a dead path",
                unknown.error
            );
        } else {
            eprintln!(
                "prfence: warning: {}; not identified: a dead path (fence sends nothing while \
                 it is named: it could be the arbiter)",
                unknown.error
            );
        }
    }
    let initiators = OwnInitiator::of_resolution(&resolution, |p| host.path_sysfs(p).nvme_host_id);
    let lus: Vec<LuTarget<CliPath>> = targets(&resolution, false, &opener(host, policy));
    let (deciders, decider_paths) = match &arbitration {
        Arbitration::Coordinators { lus: c, .. } => {
            (c.len(), c.iter().map(|lu| lu.paths.len()).sum())
        }
        Arbitration::FirstLu => (0, 0),
    };
    make_room(
        lus.len() + deciders,
        lus.iter().map(|lu| lu.paths.len()).sum::<usize>() + decider_paths,
    );
    let limits = Limits {
        // what is left of it: discovery and the worker's start-up count (--deadline bounds what
        // the caller waits for)
        deadline: crate::worker::left_of(deadline),
        tie_break: match &action {
            FencingCommand::Fence(f) => match f.tie_break {
                TieBreakArg::Auto => TieBreak::Measured {
                    since: started,
                    cap: ops::TIE_BREAK_CAP,
                },
                TieBreakArg::Seconds(wait) if wait.is_zero() => TieBreak::Off,
                TieBreakArg::Seconds(wait) => TieBreak::Fixed(wait),
            },
            FencingCommand::Unfence(_) | FencingCommand::Status(_) => TieBreak::Off,
        },
    };
    // Progress goes to stderr, so the report on stdout stays what scripts parse.
    let progress = show_progress(std::io::stderr().is_terminal(), json);
    let mut observer = |done: LuDone<'_>| {
        if progress {
            print_progress(&done);
        }
    };
    // LUs that time out may still have a command in the kernel; the engine does not wait for
    // them, and the process exits without them.
    let result: Result<Report, RequestError> = match action {
        // The admin's explicit way back (P3): it registers even where the key was preempted,
        // and adds the LUs to fence_pr's record of this boot first, so that a fence_pr `on` after
        // a later fence of this node is refused.
        FencingCommand::Unfence(_) => {
            match LuRecord::load(&KeyStore::from_environment(), key.get()) {
                Ok(record) => {
                    let by = UnfenceBy::Admin(Arc::new(record));
                    ops::unfence_observed(lus, key, by, &initiators, limits, &mut observer)
                }
                Err(e) => {
                    eprintln!("prfence: {e}");
                    return ExitStatus::Failure;
                }
            }
        }
        FencingCommand::Status(_) => ops::status_observed(lus, key, limits, &mut observer),
        FencingCommand::Fence(f) => {
            ops::fence_arbitrated_observed(lus, arbitration, key, f.victim, limits, &mut observer)
        }
    };
    match result {
        Ok(report) => {
            print_report(&report, json);
            exit_status(report.outcome)
        }
        Err(e) => {
            eprintln!("prfence: {e}");
            ExitStatus::Usage
        }
    }
}

/// The one mapping from the engine's outcome to the admin CLI's exit status (the engine has no
/// exit codes: each front end owns its own; `fence_pr` maps outcomes to the Fence Agent API's).
fn exit_status(outcome: Outcome) -> ExitStatus {
    match outcome {
        Outcome::Success => ExitStatus::Success,
        Outcome::Off => ExitStatus::Off,
        Outcome::ThisNodeFenced => ExitStatus::ThisNodeFenced,
        Outcome::Partial | Outcome::Failure => ExitStatus::Failure,
    }
}

fn print_report(report: &Report, json: bool) {
    if json {
        println!("{}", to_json(report));
    } else {
        print!("{}", to_text(report));
    }
}

/// The report as JSON, with the exit status added and the engine's failures in the CLI's words.
pub fn to_json(report: &Report) -> serde_json::Value {
    json_with_exit(&advised(report), exit_status(report.outcome))
}

/// The report as the CLI shows it: every failed command with the CLI's advice.
fn advised(report: &Report) -> Report {
    report.clone().advised(crate::hints::cli)
}

fn key_list(keys: &[Key]) -> String {
    if keys.is_empty() {
        return "none".to_string();
    }
    keys.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

fn lu_text(out: &mut String, lu: &LuReport) {
    let _ = writeln!(
        out,
        "  {} {}: {}",
        if lu.ok { "OK  " } else { "FAIL" },
        lu.lu,
        lu.verdict
    );
    if let Some(keys) = &lu.keys {
        let _ = writeln!(out, "       keys: {}", key_list(keys));
    }
    match &lu.reservation {
        Some(r) => {
            let _ = writeln!(out, "       reservation: {} {}", r.key, r.rtype);
        }
        None if lu.keys.is_some() => {
            let _ = writeln!(out, "       reservation: none");
        }
        None => {}
    }
    if let Some(generation) = lu.generation {
        let _ = writeln!(out, "       generation: {generation}");
    }
    for path in &lu.paths {
        let state = match path.state {
            PathUse::Ok => "ok",
            PathUse::Unused => "unused",
            PathUse::Dead => "dead",
            PathUse::Failed => "failed",
        };
        let _ = write!(out, "       path {}: {state}", path.device);
        if let Some(error) = &path.error {
            let _ = write!(out, " ({error})");
        }
        out.push('\n');
    }
    for note in &lu.notes {
        let _ = writeln!(out, "       note: {note}");
    }
    if let Some(error) = &lu.error {
        let _ = writeln!(out, "       error: {error}");
    }
}

/// The report in words, the engine's failures in the CLI's words.
pub fn to_text(report: &Report) -> String {
    let report = advised(report);
    let mut out = format!("{}: {}\n", report.command, report.summary);
    for lu in &report.lus {
        lu_text(&mut out, lu);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::host::SystemHost;

    use super::*;

    #[test]
    fn engine_outcomes_map_to_the_documented_exit_codes() {
        let codes = [
            (Outcome::Success, 0),
            (Outcome::Failure, 1),
            (Outcome::Partial, 1),
            (Outcome::Off, 2),
            (Outcome::ThisNodeFenced, 4),
        ];
        for (outcome, code) in codes {
            assert_eq!(exit_status(outcome).code(), code, "{outcome:?}");
        }
    }

    #[test]
    fn status_over_unopenable_devices_fails_and_names_them() {
        let args = FencingDevices {
            key: Key::new(0xa),
            deadline: std::time::Duration::from_secs(5),
            coordinators: Vec::new(),
            devices: vec![PathBuf::from("/nonexistent/sdz")],
        };
        let host: Arc<dyn Host> = Arc::new(SystemHost::new());
        let status = execute(
            FencingCommand::Status(&args),
            true,
            Policy::default(),
            &host,
        );
        assert_eq!(status, ExitStatus::Failure);
    }

    #[test]
    fn a_device_the_admin_must_replace_is_a_usage_error_a_vanished_one_is_not() {
        // A loop device is a block device but not SCSI: the admin must name another device.
        // (Skipped where the host has none; this host has no SCSI devices to fence.)
        let loop0 = PathBuf::from("/dev/loop0");
        if !loop0.exists() || !std::path::Path::new("/sys/class/block/loop0").exists() {
            return;
        }
        let args = FencingDevices {
            key: Key::new(0xa),
            deadline: std::time::Duration::from_secs(5),
            coordinators: Vec::new(),
            devices: vec![PathBuf::from("/nonexistent/sdz"), loop0],
        };
        let host: Arc<dyn Host> = Arc::new(SystemHost::new());
        assert_eq!(
            execute(
                FencingCommand::Unfence(&args),
                true,
                Policy::default(),
                &host
            ),
            ExitStatus::Usage
        );
    }
}
