//! `prfence agent` as a lab process: its configuration (lease and watch mode), its status file and
//! log, and its exit, shared by `lab_agent` (LIO) and `lab_nvme` (nvmet).

use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{PRFENCE, WORK};

/// A `[self_fence]` table that neither exits nor resets: the agent stays up and reports `fenced`
/// (its hook is /bin/true), for tests that read its state afterwards.
pub const SELF_FENCE_NO_RESET: &str =
    "exit = false\ncommand_timeout = \"1s\"\ncommand = [\"/bin/true\"]";

/// The agent's exit status when fenced (its default `self_fence.exit_status`).
pub const FENCED_EXIT: i32 = 86;

/// A running `prfence agent`, with its status file and log.
pub struct AgentProcess {
    name: String,
    status_file: PathBuf,
    log: PathBuf,
    child: Child,
    exit: Option<i32>,
}

impl AgentProcess {
    /// Starts `prfence agent --config` with `config_text` as `name`.
    pub fn start(name: &str, config_text: &str) -> anyhow::Result<AgentProcess> {
        Self::start_with_caps(name, config_text, None)
    }

    /// [`AgentProcess::start`] with only `caps` (capability names as setpriv spells them, e.g.
    /// `sys_rawio`) in its bounding set, as a unit's `CapabilityBoundingSet=` leaves root.
    pub fn start_with_caps(
        name: &str,
        config_text: &str,
        caps: Option<&[&str]>,
    ) -> anyhow::Result<AgentProcess> {
        let wrapper: Vec<String> = match caps {
            None => Vec::new(),
            Some(caps) => {
                let set: Vec<String> = std::iter::once("-all".to_owned())
                    .chain(caps.iter().map(|c| format!("+{c}")))
                    .collect();
                vec![
                    "setpriv".to_owned(),
                    "--bounding-set".to_owned(),
                    set.join(","),
                    "--".to_owned(),
                ]
            }
        };
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        Self::start_under(name, config_text, &wrapper)
    }

    /// [`AgentProcess::start`] through `wrapper` (a command that execs the agent given as its
    /// last arguments, e.g. `unshare --mount --uts SCRIPT`).
    pub fn start_under(
        name: &str,
        config_text: &str,
        wrapper: &[&str],
    ) -> anyhow::Result<AgentProcess> {
        std::fs::create_dir_all(WORK)?;
        let config = PathBuf::from(format!("{WORK}/{name}.toml"));
        let status_file = PathBuf::from(format!("{WORK}/{name}.status.json"));
        let log = PathBuf::from(format!("{WORK}/{name}.log"));
        std::fs::write(&config, config_text)?;
        let _ = std::fs::remove_file(&status_file);
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let mut command = match wrapper.split_first() {
            None => Command::new(PRFENCE),
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(PRFENCE);
                command
            }
        };
        let child = command
            .arg("agent")
            .arg("--config")
            .arg(&config)
            .arg("--status-file")
            .arg(&status_file)
            .stdout(Stdio::null())
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .context("starting prfence agent")?;
        Ok(AgentProcess {
            name: name.to_owned(),
            status_file,
            log,
            child,
            exit: None,
        })
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        kill(self.pid(), signal).with_context(|| format!("{signal} to agent {}", self.name))
    }

    /// The agent's status document (None before its first write).
    pub fn status(&self) -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(&self.status_file).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn state(&self) -> String {
        self.status()
            .and_then(|s| s["state"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// This node's lease key on the first LU (lease mode).
    pub fn lease_key(&self) -> Option<u64> {
        let status = self.status()?;
        let key = status["lus"][0]["lease_key"].as_str()?;
        u64::from_str_radix(key.trim_start_matches("0x"), 16).ok()
    }

    /// The exit status once it exited (-1: killed by a signal).
    pub fn exited(&mut self) -> Option<i32> {
        if self.exit.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exit = Some(status.code().unwrap_or(-1));
        }
        self.exit
    }

    pub fn wait_state(&mut self, state: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if self.state() == state {
                return Ok(());
            }
            if let Some(code) = self.exited() {
                bail!(
                    "agent {} exited {code} while waiting for {state:?}:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            ensure!(
                Instant::now() < deadline,
                "agent {} not {state:?} after {} s (state {:?}):\n{}",
                self.name,
                within.as_secs(),
                self.state(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_exit(&mut self, within: Duration) -> anyhow::Result<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(code) = self.exited() {
                return Ok(code);
            }
            ensure!(
                Instant::now() < deadline,
                "agent {} still running after {} s (state {:?}):\n{}",
                self.name,
                within.as_secs(),
                self.state(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(12)..].join("\n")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = kill(self.pid(), Signal::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Lease-mode timings (each a duration in milliseconds), checked by the agent at start.
#[derive(Clone, Copy)]
pub struct LeaseTimings {
    pub check_interval: u64,
    pub command_timeout: u64,
    pub renew: u64,
    pub lease: u64,
    pub margin: u64,
    pub hook_timeout: u64,
}

pub fn lease_config(node_id: u16, device: &Path, t: LeaseTimings, hook: Option<&Path>) -> String {
    let mut text = format!(
        "mode = \"lease\"\ncheck_interval = \"{}ms\"\ncommand_timeout = \"{}ms\"\n\
         [[device]]\npath = \"{}\"\nname = \"lun0\"\n\
         [lease]\nnode_id = {node_id}\nreservation = \"write-exclusive\"\n\
         renew = \"{}ms\"\nlease = \"{}ms\"\nmargin = \"{}ms\"\nstate_file = \"{WORK}/epoch-{node_id}\"\n\
         [self_fence]\ncommand_timeout = \"{}ms\"\n",
        t.check_interval,
        t.command_timeout,
        device.display(),
        t.renew,
        t.lease,
        t.margin,
        t.hook_timeout
    );
    if let Some(hook) = hook {
        // the hook records when it ran, on the shared time line
        writeln!(
            text,
            "command = [\"/bin/sh\", \"-c\", \"date +%s%N > {}\"]",
            hook.display()
        )
        .unwrap();
    }
    text.push_str("[log]\ntarget = \"stderr\"\n");
    text
}

/// Watch-mode config for `key` on `devices`; `extra` is appended (more tables).
pub fn watch_config(
    devices: &[PathBuf],
    key: &str,
    check_ms: u64,
    watch: &str,
    self_fence: &str,
    extra: &str,
) -> String {
    let mut text =
        format!("mode = \"watch\"\ncheck_interval = \"{check_ms}ms\"\ncommand_timeout = \"1s\"\n");
    for (index, device) in devices.iter().enumerate() {
        writeln!(
            text,
            "[[device]]\npath = \"{}\"\nname = \"lun{index}\"",
            device.display()
        )
        .unwrap();
    }
    write!(
        text,
        "[key]\nvalue = \"{key}\"\n[watch]\n{watch}\n[self_fence]\n{self_fence}\n{extra}\n\
         [log]\ntarget = \"stderr\"\n"
    )
    .unwrap();
    text
}

pub fn hook_line(hook: &Path) -> String {
    format!(
        "command = [\"/bin/sh\", \"-c\", \"date +%s%N > {}\"]\ncommand_timeout = \"1s\"",
        hook.display()
    )
}

pub fn read_hook(hook: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(hook)
        .with_context(|| format!("the self-fence hook did not run ({})", hook.display()))?;
    text.trim()
        .parse()
        .with_context(|| format!("bad hook time {text:?}"))
}
