//! The agent as a process: `prfence agent`'s entry point (configuration, key, `--check-config`,
//! `--once`), the one place the mode is dispatched ([`run`], [`once`]), the signal and control
//! wiring, and the metrics endpoint's server task. The services both modes share ([`Agent`]) are
//! in [`super::agent`].

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::agent::{
    Agent, AgentParts, Control, EXIT_CONFIG, EXIT_FAILURE, EXIT_ONCE_PROBLEM, RunEnd,
};
use super::config::{
    KeySpec, ModeSettings, Settings, UNIT_WATCHDOG_SEC, check_dir_trust, check_file_trust,
    notify_socket_set,
};
use super::lease::driver::LeaseDriver;
use super::lock;
use super::os::logging::LogHandle;
use super::os::notify::Notifier;
use super::os::watchdog::Pinned;
use super::watch::driver::WatchDriver;
use super::watch::key::{OurKey, resolve_key};
use crate::fence_agent::store::KeyStore;
use crate::host::{Host, SystemHost};
use crate::pr::Key;

/// The service watchdog the agent runs under: `$WATCHDOG_USEC` when systemd set it for this
/// process (`$WATCHDOG_PID`, when set, names it), else [`UNIT_WATCHDOG_SEC`].
pub fn service_watchdog() -> Duration {
    let for_us = std::env::var("WATCHDOG_PID")
        .ok()
        .is_none_or(|pid| pid.trim() == std::process::id().to_string());
    std::env::var("WATCHDOG_USEC")
        .ok()
        .filter(|_| for_us)
        .and_then(|usec| usec.parse::<u64>().ok())
        .filter(|&usec| usec > 0)
        .map_or(UNIT_WATCHDOG_SEC, Duration::from_micros)
}

/// Reads and validates the configuration file. `notify_socket_set`: whether `NOTIFY_SOCKET` is
/// set ([`notify_socket_set`]), which decides an unset `[systemd] notify`. A file that someone
/// other than root and our own user can write is refused ([`check_file_trust`]).
pub fn load_settings(path: &Path, notify_socket_set: bool) -> Result<Settings, String> {
    let text = read_trusted(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let settings =
        Settings::from_toml_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    settings
        .check_service_watchdog(
            service_watchdog(),
            settings.sd_notify.enabled(notify_socket_set),
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(settings)
}

/// Reads `path` once its owner and mode are known to be safe, both taken from the open file
/// (fstat), so the file judged is the file read, and once no directory on its real path (links
/// resolved) lets anyone else replace it.
///
/// Only a regular file of at most [`MAX_CONFIG_BYTES`] is read: the open does not wait (a FIFO
/// would hold the start, or a SIGHUP's reload, until someone writes to it), and the read does
/// not grow without bound.
fn read_trusted(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let running = nix::unistd::geteuid().as_raw();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(
            "not a regular file (a FIFO, a device or a directory); name the configuration file \
             itself"
                .to_owned(),
        );
    }
    check_trusted(path, &meta, running)?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "longer than {MAX_CONFIG_BYTES} bytes; a configuration of the most devices the \
             agent takes (1024) is about 100 KiB"
        ));
    }
    Ok(text)
}

/// The largest configuration file read: 1 MiB.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Whether whoever can change the file at `path` (its metadata `meta`, following links) is root or
/// `running`: the file itself ([`check_file_trust`]) and every directory on its real path (links
/// resolved; [`check_dir_trust`]). What the agent runs as root, or reads its hook from, must pass.
fn check_trusted(path: &Path, meta: &std::fs::Metadata, running: u32) -> Result<(), String> {
    check_file_trust(path, meta.mode(), meta.uid(), running).map_err(|e| e.to_string())?;
    let real = std::fs::canonicalize(path).map_err(|e| e.to_string())?;
    for dir in real.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        check_dir_trust(dir, meta.mode(), meta.uid(), running).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `prfence agent`: the process entry point. Returns the exit status.
pub fn agent_main(
    config: &Path,
    check_config: bool,
    once: bool,
    status_file: Option<PathBuf>,
) -> u8 {
    // A running agent takes SIGHUP (reload), SIGTERM and SIGINT (stop) from its first moment:
    // they wait, blocked, until its handlers are up ([`forward_signals`]), instead of ending the
    // process by their default action during the start, which can take seconds (discovery).
    // Blocked here, before any thread exists, so that every thread inherits the mask.
    if !check_config && !once {
        hold_control_signals(SigmaskHow::SIG_BLOCK);
    }
    // --check-config (the unit's ExecStartPre=, which systemd may run without NOTIFY_SOCKET)
    // judges the file as the unit's main process will run: with NOTIFY_SOCKET set.
    let socket_set =
        check_config || notify_socket_set(std::env::var_os("NOTIFY_SOCKET").as_deref());
    let settings = match load_settings(config, socket_set) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("prfence agent: {e}");
            return EXIT_CONFIG;
        }
    };
    // PRFENCE_LOG stands in for log.level, so it is judged with the file: --check-config (the
    // unit's ExecStartPre=, same environment) must refuse what the start would.
    if let Err(e) =
        super::os::logging::env_override(std::env::var_os(super::os::logging::LOG_ENV).as_deref())
    {
        eprintln!("prfence agent: {e}");
        return EXIT_CONFIG;
    }
    // What the configuration names on this host, checked the same way for --check-config and
    // for a start: a watchdog that is no watchdog (2), missing in lease mode (1), or a
    // self-fence program that cannot run (2), stops both (watch mode starts without a missing
    // watchdog, degraded, and judges it once it appears). --once opens no watchdog and runs no self-fence, so it
    // still looks at the LUs.
    let watchdog_pin = if once {
        None
    } else {
        match check_host(config, &settings, Path::new("/dev"), Path::new("/sys")) {
            Ok(pin) => pin,
            Err(status) => return status,
        }
    };
    if check_config {
        for warning in settings.warnings() {
            println!("{}: note: {warning}", config.display());
        }
        println!(
            "{}: valid ({} mode, {} device(s), check every {:?}, each check within {:?}, \
             WatchdogSec {:?})",
            config.display(),
            settings.mode.name(),
            settings.devices.len(),
            settings.check_interval,
            super::config::check_budget(settings.command_timeout),
            service_watchdog(),
        );
        return 0;
    }
    // --once is run by hand or by a test: its log goes to the terminal.
    let log_settings = if once {
        super::config::LogSettings {
            target: super::config::LogTarget::Stderr,
            json: false,
            level: settings.log.level.clone(),
        }
    } else {
        settings.log.clone()
    };
    let log = {
        match super::os::logging::init(&log_settings) {
            Ok(handle) => Some(handle),
            Err(e) => {
                eprintln!("prfence agent: {e}");
                return EXIT_CONFIG;
            }
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("prfence agent: cannot start the runtime: {e}");
            return EXIT_FAILURE;
        }
    };
    let status = runtime.block_on(serve(
        settings,
        config.to_path_buf(),
        once,
        status_file,
        log,
        socket_set,
        watchdog_pin,
    ));
    // A command hung in the kernel must not hold up the exit (and a fenced node must go).
    runtime.shutdown_timeout(Duration::from_secs(1));
    // Nor a stalled journal: its last lines get a second.
    super::os::logging::flush(Duration::from_secs(1));
    status
}

/// Runs until stopped or fenced (with `exit`). `key` is our key in watch mode when known
/// (`key.value`); `None` derives it once corosync tells it ([`run_deriving`]).
pub async fn run(agent: Agent, key: Option<Key>) -> RunEnd {
    run_deriving(agent, key, KeyStore::from_environment()).await
}

/// [`run`], our key (given or derived) checked against the key fence_pr's `on` stored in
/// `store`.
pub async fn run_deriving(mut agent: Agent, key: Option<Key>, store: KeyStore) -> RunEnd {
    // Killed or crashed mid-way through a self-fence in this boot (systemd's watchdog, a stop
    // during the hook): this node is fenced, and its key is gone, so the mode's loop would only
    // wait for a registration. Run the self-fence again, at once.
    if let Some(reason) = agent.unfinished_self_fence() {
        tracing::error!(%reason, "an earlier run of the agent in this boot did not finish its self-fence");
        agent
            .notifier
            .ready("fenced: finishing an earlier self-fence");
        let reason = format!("an earlier run in this boot did not finish its self-fence: {reason}");
        if let Some(exit_status) = agent.self_fence(reason).await {
            return RunEnd::Fenced { exit_status };
        }
    }
    match (&agent.settings.mode, key) {
        (ModeSettings::Watch(_), Some(key)) => {
            let our = OurKey {
                key,
                identity: None,
            };
            WatchDriver::with_store(&mut agent, our, store)
                .run_watch()
                .await
        }
        (ModeSettings::Watch(_), None) => {
            if let Err(e) = super::watch::driver::check_watchdog_timeout(&agent) {
                return RunEnd::Failed(e);
            }
            match super::watch::driver::wait_for_key(&mut agent).await {
                Ok(our) => {
                    WatchDriver::with_store(&mut agent, our, store)
                        .run_watch()
                        .await
                }
                Err(end) => end,
            }
        }
        (ModeSettings::Lease(_), _) => LeaseDriver::run_lease(&mut agent).await,
    }
}

/// One look at every LU for `--once`: prints the status and says whether all is well.
pub async fn once(mut agent: Agent, key: Option<Key>) -> u8 {
    let healthy = match key {
        Some(key) => WatchDriver::new(&mut agent, key).once_watch().await,
        None => LeaseDriver::once_lease(&mut agent).await,
    };
    println!("{}", lock(&agent.status).to_json());
    if healthy { 0 } else { EXIT_ONCE_PROBLEM }
}

/// The checks of the configuration against this host that `--check-config` and a start share:
/// the watchdog must resolve to a watchdog device under `dev` ([`check_device`]), and
/// `self_fence.command` must name a program we can execute ([`check_self_fence_program`]).
/// Prints the problem and returns the exit status: [`EXIT_FAILURE`] when the watchdog cannot be
/// resolved (the driver may not be loaded yet; watch mode only notes a missing one and starts),
/// [`EXIT_CONFIG`] for the rest.
///
/// Returns the watchdog as checked ([`Pinned`]), which is the one the agent will open.
///
/// [`check_device`]: super::os::watchdog::check_device
pub fn check_host(
    config: &Path,
    settings: &Settings,
    dev: &Path,
    sys: &Path,
) -> Result<Option<Pinned>, u8> {
    if let Err(e) = check_self_fence_program(settings) {
        eprintln!("prfence agent: {}: {e}", config.display());
        return Err(EXIT_CONFIG);
    }
    if let ModeSettings::Lease(lease) = &settings.mode
        && let Err(e) = check_state_file(&lease.state_file)
    {
        eprintln!("prfence agent: {}: {e}", config.display());
        return Err(EXIT_FAILURE);
    }
    let Some(watchdog) = &settings.watchdog else {
        return Ok(None);
    };
    match super::os::watchdog::pin(&watchdog.device, dev, sys) {
        Ok(pin) => Ok(Some(pin)),
        // Watch mode opens the watchdog only once armed, and a configured watchdog it cannot
        // open is a degraded state retried at every check: a driver not loaded (yet) must not
        // keep the agent, and so the node's watching, from starting. It is judged (pinned) when
        // it appears, before it is opened. Lease mode needs it from the start.
        Err(super::os::watchdog::WatchdogError::Resolve { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound
                && matches!(settings.mode, ModeSettings::Watch(_)) =>
        {
            println!(
                "{}: note: watchdog.device {} is not there (yet); the agent starts, shows its \
                 watchdog degraded and tries again at every check once armed; load its driver \
                 (e.g. modprobe softdog) or remove [watchdog]",
                config.display(),
                watchdog.device.display()
            );
            Ok(None)
        }
        Err(e) => {
            eprintln!("prfence agent: {}: {e}", config.display());
            Err(match e {
                super::os::watchdog::WatchdogError::NotAWatchdog { .. } => EXIT_CONFIG,
                _ => EXIT_FAILURE,
            })
        }
    }
}

/// Why `self_fence.command`'s program cannot be run. Found at start rather than when the node is
/// fenced, where the failure would only be logged.
#[derive(Debug, thiserror::Error)]
pub enum SelfFenceProgramError {
    #[error("self_fence.command: {program} does not exist; install it or correct the path")]
    Missing { program: String },
    #[error("self_fence.command: {program} cannot be examined ({error}); correct the path")]
    Inaccessible {
        program: String,
        error: std::io::Error,
    },
    #[error(
        "self_fence.command: {program} is not a regular file; name the program itself (argv[0])"
    )]
    NotAFile { program: String },
    #[error("self_fence.command: {program}: {reason}")]
    Untrusted { program: String, reason: String },
    #[error(
        "self_fence.command: {program} (mode {mode:04o}) cannot be executed by the agent \
         ({error}); run `chmod 0755 {program}` or name another program"
    )]
    NotExecutable {
        program: String,
        mode: u32,
        error: nix::Error,
    },
}

/// Checks that lease mode can keep its epochs in `state_file`: if the file is there it must read
/// and parse; if its directory is there, this process must be able to write in it (the file is
/// replaced atomically: a temporary file and a rename). A missing directory is left to the start
/// (the packaged unit's `StateDirectory=` creates /var/lib/prfence), which fails saying so.
pub fn check_state_file(state_file: &Path) -> Result<(), String> {
    super::lease::epoch_file::read(state_file).map_err(|e| e.to_string())?;
    let Some(dir) = state_file.parent().filter(|d| d.is_dir()) else {
        return Ok(());
    };
    let flags = nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK;
    nix::unistd::access(dir, flags).map_err(|e| {
        format!(
            "lease.state_file {}: cannot write in {} ({e}); the agent keeps its key epochs there",
            state_file.display(),
            dir.display()
        )
    })
}

/// Checks that `self_fence.command`'s program (an absolute path, as the configuration requires)
/// is a regular file this process may execute. access(2) answers as execve(2) will: with our
/// uid and capabilities, and refusing a `noexec` mount.
pub fn check_self_fence_program(settings: &Settings) -> Result<(), SelfFenceProgramError> {
    let Some(program) = settings.self_fence.command.as_ref().and_then(|a| a.first()) else {
        return Ok(());
    };
    let shown = program.clone();
    let meta = match std::fs::metadata(program) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SelfFenceProgramError::Missing { program: shown });
        }
        Err(error) => {
            return Err(SelfFenceProgramError::Inaccessible {
                program: shown,
                error,
            });
        }
    };
    if !meta.is_file() {
        return Err(SelfFenceProgramError::NotAFile { program: shown });
    }
    // The hook runs as root when the node is fenced: whoever can change it (or replace it in
    // its directory) must be root or us, as for the configuration file that names it.
    check_trusted(Path::new(program), &meta, nix::unistd::geteuid().as_raw()).map_err(
        |reason| SelfFenceProgramError::Untrusted {
            program: shown.clone(),
            reason,
        },
    )?;
    nix::unistd::access(Path::new(program), nix::unistd::AccessFlags::X_OK).map_err(|error| {
        SelfFenceProgramError::NotExecutable {
            program: shown,
            mode: meta.mode() & 0o7777,
            error,
        }
    })
}

async fn serve(
    settings: Settings,
    config: PathBuf,
    once: bool,
    status_file: Option<PathBuf>,
    log: Option<LogHandle>,
    notify_socket_set: bool,
    watchdog_pin: Option<Pinned>,
) -> u8 {
    let host: Arc<dyn Host> = Arc::new(SystemHost::new());
    // Watch mode: a given key is known now. A derived one is waited for by the running agent
    // (corosync may start after it, [`super::watch::driver::wait_for_key`]); `--once` looks once, so it
    // asks now and fails as a start did before when corosync cannot tell the key, or when the
    // key is in doubt.
    let key = match &settings.mode {
        ModeSettings::Watch(watch) => match (&watch.key, once) {
            (KeySpec::Given(key), _) => Some(*key),
            (KeySpec::Derive { .. }, false) => None,
            (KeySpec::Derive { .. }, true) => {
                let spec = watch.key.clone();
                let timeout = settings.command_timeout;
                let host = Arc::clone(&host);
                let resolved = tokio::task::spawn_blocking(move || {
                    resolve_key(&spec, timeout, host.as_ref())
                        .map_err(|e| e.to_string())
                        .and_then(|our| {
                            match super::watch::key::store_problem(
                                &our,
                                &KeyStore::from_environment(),
                            ) {
                                Some(problem) => Err(problem),
                                None => Ok(our.key),
                            }
                        })
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
                match resolved {
                    Ok(key) => Some(key),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot resolve our key");
                        eprintln!("prfence agent: {e}");
                        return EXIT_FAILURE;
                    }
                }
            }
        },
        ModeSettings::Lease(_) => None,
    };
    let (sender, receiver) = mpsc::unbounded_channel();
    let notifier = if settings.sd_notify.enabled(notify_socket_set) && !once {
        Notifier::from_env()
    } else {
        Notifier::disabled()
    };
    let options = AgentParts {
        host,
        notifier,
        status_file,
        sys_root: PathBuf::from("/sys"),
        log,
        watchdog_pin,
        watchdog_dev: Some(PathBuf::from("/dev")),
    };
    let metrics_listen = settings.metrics_listen;
    for warning in settings.warnings() {
        tracing::warn!("{warning}");
    }
    let mut agent = match Agent::new(settings, options, receiver) {
        Ok(agent) => agent,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the self-fence thread; not starting");
            return EXIT_FAILURE;
        }
    };
    // The descriptor budget, from the paths there are now (sysfs only): an agent that would run
    // out could never read all its LUs, so never arm.
    let until = agent.check_deadline();
    agent.table.refresh(&agent.host, until).await;
    if let Err(e) = super::agent::descriptors_fit(&agent.table) {
        tracing::error!(error = %e, "not starting");
        eprintln!("prfence agent: {e}");
        return EXIT_CONFIG;
    }
    if once {
        return self::once(agent, key).await;
    }
    if let Some(address) = metrics_listen {
        match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => {
                tracing::info!(%address, "serving /metrics and /status");
                tokio::spawn(super::http::serve(
                    listener,
                    super::http::Exposed {
                        metrics: agent.metrics(),
                        status: agent.status(),
                    },
                ));
            }
            Err(e) => {
                tracing::error!(%address, error = %e, "cannot listen for metrics");
                return EXIT_FAILURE;
            }
        }
    }
    if let Err(e) = forward_signals(sender, config, notify_socket_set) {
        tracing::error!(error = %e, "cannot install signal handlers");
        return EXIT_FAILURE;
    }
    // The handlers are up: a signal held since the start is delivered now, to this thread (the
    // main one, which block_on polls this future on; every other thread keeps it blocked).
    hold_control_signals(SigmaskHow::SIG_UNBLOCK);
    let outcome = run(agent, key).await;
    if let RunEnd::Failed(e) = &outcome {
        tracing::error!(error = %e, "the agent stopped");
    }
    outcome.exit_status()
}

/// What SIGHUP reads: [`load_settings`], and a `self_fence.command` that can run, since a new
/// hook takes effect at once (watchdog changes wait for a restart, so it is not looked at).
pub(super) fn reload_settings(config: &Path, notify_socket_set: bool) -> Result<Settings, String> {
    let settings = load_settings(config, notify_socket_set)?;
    check_self_fence_program(&settings).map_err(|e| format!("{}: {e}", config.display()))?;
    Ok(settings)
}

/// Blocks (or unblocks) SIGHUP, SIGTERM and SIGINT on the calling thread.
fn hold_control_signals(how: SigmaskHow) {
    let mut set = SigSet::empty();
    for signal in [Signal::SIGHUP, Signal::SIGTERM, Signal::SIGINT] {
        set.add(signal);
    }
    if let Err(e) = pthread_sigmask(how, Some(&set), None) {
        // Only EINVAL is documented, for a bad `how`: not reachable with these arguments.
        eprintln!("prfence agent: cannot change the signal mask: {e}");
    }
}

/// SIGHUP re-reads `config` (a bad file is logged and ignored); SIGTERM and SIGINT stop.
fn forward_signals(
    sender: mpsc::UnboundedSender<Control>,
    config: PathBuf,
    notify_socket_set: bool,
) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        loop {
            let control = tokio::select! {
                _ = hangup.recv() => match reload_settings(&config, notify_socket_set) {
                    Ok(settings) => Control::Reload(Box::new(settings)),
                    Err(e) => {
                        tracing::error!(error = %e, "SIGHUP: configuration not reloaded");
                        continue;
                    }
                },
                _ = terminate.recv() => Control::Stop,
                _ = interrupt.recv() => Control::Stop,
            };
            if sender.send(control).is_err() {
                return;
            }
        }
    });
    Ok(())
}
