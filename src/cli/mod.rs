//! The `prfence` admin command line: argument definitions, per-device execution and rendering.
//!
//! Every command takes one or more devices and runs on all of them concurrently; results are
//! reported in argument order, as text or (with `--json`) one JSON array.
//!
//! This module only dispatches: `args` (the definition, and the checks clap cannot make),
//! `pr` (the single PR commands), `fencing` (unfence, fence, status), `doctor`; what they
//! share is below them: `exit` (the exit status, JSON with it), `paths` (how the CLI opens
//! a path, with its hints), `render`, `progress`, `hints`.

mod args;
mod doctor;
mod exit;
mod fencing;
mod hints;
mod paths;
mod pr;
mod progress;
mod render;

#[cfg(test)]
mod output_tests;

use std::sync::Arc;

use crate::host::{Host, SystemHost};
use crate::transport::Policy;

pub use args::{Cli, Cmd};
pub use exit::ExitStatus;

/// Runs the parsed command line and prints the results; returns the exit status.
pub fn execute(cli: &Cli) -> ExitStatus {
    if let Cmd::Agent(agent) = &cli.command {
        // The agent logs as its configuration says and has exit statuses of its own.
        return ExitStatus::Agent(crate::daemon::entry::agent_main(
            &agent.config,
            agent.check_config,
            agent.once,
            agent.status_file.clone(),
        ));
    }
    if let Err(message) = args::check(&cli.command) {
        eprintln!("prfence: {message}");
        return ExitStatus::Usage;
    }
    let policy = Policy {
        timeout: cli.timeout,
        ..Policy::default()
    };
    let host: Arc<dyn Host> = Arc::new(SystemHost::new());
    let action = match &cli.command {
        Cmd::Unfence(d) => Some(fencing::FencingCommand::Unfence(d)),
        Cmd::Fence(f) => Some(fencing::FencingCommand::Fence(f)),
        Cmd::Status(d) => Some(fencing::FencingCommand::Status(d)),
        _ => None,
    };
    if let Some(action) = action {
        return fencing::execute(action, cli.json, policy, &host);
    }
    if let Cmd::Doctor(args) = &cli.command {
        return doctor::execute(args, cli.json, policy, &host);
    }
    pr::execute(&cli.command, cli.json, cli.timeout, policy, host).unwrap_or(ExitStatus::Usage)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use std::time::Duration;

    use super::args::{self, Cmd};
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(args).unwrap()
    }

    #[test]
    fn more_devices_than_the_cap_are_a_usage_error_before_any_is_opened() {
        let many: Vec<String> = (0..=crate::MAX_DEVICES)
            .map(|i| format!("/nonexistent/sd{i}"))
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for head in [
            &["prfence", "keys"][..],
            &["prfence", "status", "--key", "1"],
            &["prfence", "fence", "--key", "1", "--victim", "2"],
        ] {
            let args: Vec<&str> = head.iter().chain(&many).copied().collect();
            let command = cli(&args).command;
            let e = args::check(&command).unwrap_err();
            assert!(
                e.contains("1025 devices") && e.contains("at most 1024"),
                "{e}"
            );
            assert_eq!(execute(&cli(&args)), ExitStatus::Usage);
        }
        let at_cap: Vec<&str> = ["prfence", "keys"]
            .iter()
            .chain(&many[1..])
            .copied()
            .collect();
        assert!(args::check(&cli(&at_cap).command).is_ok());
    }

    #[test]
    fn the_admin_deadline_defaults_to_twice_the_timeout() {
        let Cmd::Keys(d) = cli(&["prfence", "--timeout", "3", "keys", "/dev/sdb"]).command else {
            panic!("keys")
        };
        assert_eq!(d.deadline(Duration::from_secs(3)), Duration::from_secs(6));
        let Cmd::Clear(c) = cli(&[
            "prfence",
            "clear",
            "--key",
            "1",
            "--deadline",
            "7",
            "/dev/sdb",
        ])
        .command
        else {
            panic!("clear")
        };
        assert_eq!(
            c.devices.deadline(Duration::from_secs(3)),
            Duration::from_secs(7)
        );
    }
}
