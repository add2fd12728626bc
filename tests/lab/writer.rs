//! A node's application for the phantom-write tests: a shell loop writing an increasing counter
//! with O_DIRECT, in its own process group so SIGSTOP/SIGCONT reach the loop and its dd alike.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::BLOCK_SIZE;

/// Writes `"<label> write N"` to block `block` of `devices[(N-1) % len]` every ~100 ms and prints
/// `wrote N to DEV`, or `write N to DEV FAILED: <dd's error>` and exits at the first failure.
pub struct Writer {
    child: Child,
    pgid: Pid,
    lines: mpsc::Receiver<String>,
}

impl Writer {
    /// Starts the loop; `on_line` sees each line it prints (for timelines) before
    /// [`Writer::next_line`] does.
    pub fn start(
        label: &str,
        devices: &[PathBuf],
        block: u64,
        on_line: impl Fn(&str) + Send + 'static,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(!devices.is_empty(), "the writer needs a device");
        let script = r#"
            i=0
            while :; do
              i=$((i+1))
              n=$(( (i-1) % $# + 1 ))
              eval "DEV=\${$n}"
              if printf '%s write %d\n' "$LABEL" "$i" | dd of="$DEV" bs=$BS seek=$BLOCK count=1 conv=sync,notrunc oflag=direct 2>/run/lab/writer.err; then
                echo "wrote $i to $DEV"
              else
                echo "write $i to $DEV FAILED: $(grep -v records /run/lab/writer.err | head -n1)"; exit 3
              fi
              sleep 0.1
            done"#;
        let mut child = Command::new("sh")
            .args(["-c", script, "writer"])
            .args(devices)
            .env("LABEL", label)
            .env("BS", BLOCK_SIZE.to_string())
            .env("BLOCK", block.to_string())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {label}'s writer"))?;
        let pgid = Pid::from_raw(i32::try_from(child.id())?);
        let stdout = child.stdout.take().context("writer stdout")?;
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                on_line(&line);
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Writer { child, pgid, lines })
    }

    pub fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        killpg(self.pgid, signal).with_context(|| format!("{signal} to the writer"))
    }

    /// The next line the writer prints, within `within`.
    pub fn next_line(&self, within: Duration) -> anyhow::Result<String> {
        self.lines
            .recv_timeout(within)
            .with_context(|| format!("the writer said nothing for {} s", within.as_secs()))
    }
}

/// The counter of a `wrote N to DEV` line.
pub fn write_number(line: &str) -> Option<u64> {
    line.strip_prefix("wrote ")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}
