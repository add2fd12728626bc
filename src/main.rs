//! `prfence` (admin CLI) and, when invoked as `fence_pr` (argv[0]'s file name, e.g. through a
//! symlink), the Fence Agent API. A thin shell over the library: argument parsing, logging set-up
//! and the exit status.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Mutex;

use clap::Parser;
use prfence::cli::{self, Cli, Cmd};
use prfence::fence_agent::{self, Environment, FencePrRequest, run};
use prfence::worker::{Role, Stdin};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// The name under which the binary acts as the fence agent.
const AGENT_NAME: &str = "fence_pr";

fn init_tracing(verbosity: u8) {
    let default = match verbosity {
        0 => "warn",
        1 => "prfence=debug",
        _ => "prfence=trace",
    };
    // Unset or empty: the default. Set but invalid: said, not silently ignored (the agent
    // refuses to start on it; a one-shot command goes on with the default).
    let filter = match std::env::var("PRFENCE_LOG") {
        Ok(text) if !text.is_empty() => tracing_subscriber::EnvFilter::try_new(&text)
            .unwrap_or_else(|e| {
                eprintln!(
                    "prfence: PRFENCE_LOG={text:?} is not a tracing filter ({e}); logging at \
                     {default:?} instead"
                );
                tracing_subscriber::EnvFilter::new(default)
            }),
        _ => tracing_subscriber::EnvFilter::new(default),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    // First: a worker sets its parent-death signal before anything else runs.
    let role = Role::detect();
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if Path::new(&argv0).file_name() == Some(AGENT_NAME.as_ref()) {
        return fence_pr_main(role);
    }
    let cli = Cli::parse();
    ExitCode::from(role.run(cli.command.touches_devices(), Stdin::Inherit, || {
        // The agent sets up its own logging from its configuration file.
        if !matches!(cli.command, Cmd::Agent(_)) {
            init_tracing(cli.verbose);
        }
        cli::execute(&cli).code()
    }))
}

/// Logging as fence-agents does it: stderr unless `quiet` (debug with `verbose`, trace with
/// `verbose_level` ≥ 2, else warnings and errors); `logfile` gets the same messages at info and
/// above and is truncated on every run (fence_scsi opens it with 'w'); `debug_file` gets
/// everything at debug and is appended to (fence-agents' FileHandler).
fn init_fence_pr_logging(request: &FencePrRequest) -> Result<(), String> {
    let options = &request.options;
    let stderr_level = match options.verbose_level {
        _ if options.quiet => LevelFilter::OFF,
        0 => LevelFilter::WARN,
        1 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    type Boxed = Box<dyn Layer<Registry> + Send + Sync>;
    let file_layer = |path: &Path, truncate: bool, level: LevelFilter| -> Result<Boxed, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(!truncate)
            .truncate(truncate)
            .open(path)
            .map_err(|e| format!("Failed: Unable to create file {}: {e}", path.display()))?;
        Ok(tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(Mutex::new(file))
            .with_filter(level)
            .boxed())
    };
    let mut layers: Vec<Boxed> = vec![
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .with_filter(stderr_level)
            .boxed(),
    ];
    if let Some(path) = options.logfile.as_deref() {
        layers.push(file_layer(path, true, LevelFilter::INFO.max(stderr_level))?);
    }
    if let Some(path) = options.debug_file.as_deref() {
        layers.push(file_layer(
            path,
            false,
            LevelFilter::DEBUG.max(stderr_level),
        )?);
    }
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| format!("Failed: cannot set up logging: {e}"))
}

fn fence_pr_main(role: Role) -> ExitCode {
    // Arguments and stdin are checked as they are read: not UTF-8, an overlong line or too much
    // input is an error (exit 1), never a panic or an unbounded allocation.
    let input = fence_agent::args_from_os(std::env::args_os().skip(1)).and_then(|args| {
        let stdin = if fence_agent::wants_stdin(&args) {
            fence_agent::read_stdin(std::io::stdin().lock())?
        } else {
            String::new()
        };
        Ok((args, stdin))
    });
    let (args, stdin) = match input {
        Ok(input) => input,
        Err(e) => {
            eprintln!("{e}");
            return e.exit_code().into();
        }
    };
    let request = match fence_agent::parse(&args, Some(&stdin), &Environment::from_process()) {
        Ok(request) => request,
        Err(e) => {
            eprintln!("{e}");
            return e.exit_code().into();
        }
    };
    if request.options.help {
        print!("{}", fence_agent::usage(AGENT_NAME));
        return fence_agent::FencePrExit::Success.into();
    }
    // fence-agents' precedence: help, then metadata/manpage, then version.
    let describes = matches!(
        request.action,
        fence_agent::Action::Metadata | fence_agent::Action::Manpage
    );
    if request.options.version && !describes {
        println!("{AGENT_NAME} {}", env!("CARGO_PKG_VERSION"));
        return fence_agent::FencePrExit::Success.into();
    }
    // The worker reads the options the supervisor read, from its stdin.
    let code = role.run(
        request.action.touches_devices(),
        Stdin::Bytes(stdin.as_bytes()),
        || {
            if let Err(e) = init_fence_pr_logging(&request) {
                eprintln!("{e}");
                return fence_agent::FencePrExit::Error.code();
            }
            let node = run::FenceNode::from_environment();
            let mut stdout = std::io::stdout().lock();
            run::execute(&request, &node, AGENT_NAME, &mut stdout).code()
        },
    );
    ExitCode::from(code)
}
