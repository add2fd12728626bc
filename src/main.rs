//! `prfence` (admin CLI) and, when invoked as `fence_pr`, the Fence Agent API. A thin shell over
//! the library: argument parsing, logging set-up and the exit status.

use std::process::ExitCode;

use clap::Parser;
use prfence::cli::{self, Cli, Cmd};

fn init_tracing(verbosity: u8) {
    let default = match verbosity {
        0 => "warn",
        1 => "prfence=debug",
        _ => "prfence=trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("PRFENCE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The agent sets up its own logging from its configuration file.
    if !matches!(cli.command, Cmd::Agent(_)) {
        init_tracing(cli.verbose);
    }
    ExitCode::from(cli::execute(&cli).code())
}
