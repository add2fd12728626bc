//! The demo: the phantom write that prfence exists to stop, played on a real LIO target.
//!
//! Node A holds the LUNs (WERO) and writes a counter every ~100 ms. A freezes (SIGSTOP: a long
//! pause, a hung path). Node B fences A with `prfence preempt --abort` and writes its own data.
//! A wakes up and its next write — the phantom write — is refused by the target; the disk holds
//! B's data. Run: `cargo test --test lab_demo` (as root). It drives prfence only, never sg_persist.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod lab;

use std::fmt::Display;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use lab::{Node, Topology, WriteOutcome};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

const PRFENCE: &str = env!("CARGO_BIN_EXE_prfence");
const LUNS: usize = 2;
const KEY_A: &str = "0xa";
const KEY_B: &str = "0xb";

fn main() -> ExitCode {
    lab::main(crate::tests![phantom_write_fenced])
}

/// Prints each event with the time since the demo started.
#[derive(Clone, Copy)]
struct Timeline {
    start: Instant,
}

impl Timeline {
    fn say(&self, who: &str, what: impl Display) {
        let at = self.start.elapsed().as_secs_f64();
        println!("[{at:>7.3} s] {who:<7} {what}");
    }

    /// Runs prfence as `who`, shows the command, its result, timing and output.
    fn prfence(&self, who: &str, args: &[&str]) -> anyhow::Result<lab::Run> {
        let run = lab::run(PRFENCE, args)?;
        self.say(
            who,
            format!(
                "$ prfence {}   -> exit {} in {} ms",
                args.join(" "),
                run.code(),
                run.elapsed.as_millis()
            ),
        );
        for line in run.stdout.lines().filter(|l| !l.trim().is_empty()) {
            println!("{:>20}{line}", "");
        }
        run.ok()
    }
}

/// Node A's application: a shell loop writing an increasing counter to one disk with O_DIRECT,
/// in its own process group so SIGSTOP/SIGCONT reach the loop and its dd alike.
struct Writer {
    child: Child,
    pgid: Pid,
    lines: mpsc::Receiver<String>,
}

impl Writer {
    fn start(device: &std::path::Path, timeline: Timeline) -> anyhow::Result<Self> {
        let script = r#"
            i=0
            while :; do
              i=$((i+1))
              if printf 'node A write %d\n' "$i" | dd of="$DEV" bs=4096 count=1 conv=sync oflag=direct 2>/run/lab/writer.err; then
                echo "wrote $i"
              else
                echo "write $i FAILED: $(head -n1 /run/lab/writer.err)"; exit 3
              fi
              sleep 0.1
            done"#;
        let mut child = Command::new("sh")
            .args(["-c", script])
            .env("DEV", device)
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .context("starting node A's writer")?;
        let pgid = Pid::from_raw(i32::try_from(child.id())?);
        let stdout = child.stdout.take().context("writer stdout")?;
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                timeline.say("node A", format!("writer: {line}"));
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Writer { child, pgid, lines })
    }

    fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        killpg(self.pgid, signal).with_context(|| format!("{signal} to node A's writer"))
    }

    /// The next line the writer prints, within `within`.
    fn next_line(&self, within: Duration) -> anyhow::Result<String> {
        self.lines
            .recv_timeout(within)
            .with_context(|| format!("node A's writer said nothing for {} s", within.as_secs()))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = killpg(self.pgid, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

fn phantom_write_fenced() -> anyhow::Result<()> {
    let t = Topology::iscsi(LUNS)?;
    t.settle()?; // the power-on unit attentions of the fresh nexuses are not this demo's subject
    let tl = Timeline {
        start: Instant::now(),
    };
    let a_devices: Vec<String> = t
        .node(Node::A)
        .devices()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let b_devices: Vec<String> = t
        .node(Node::B)
        .devices()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    tl.say(
        "lab",
        format!(
            "iSCSI target with {LUNS} LUNs ready in {}; node A sees {}, node B sees {}",
            lab::secs(t.setup_time()),
            a_devices.join(" "),
            b_devices.join(" ")
        ),
    );

    for device in &a_devices {
        tl.prfence("node A", &["register", "--key", KEY_A, device])?;
        tl.prfence(
            "node A",
            &["reserve", "--key", KEY_A, "--type", "wero", device],
        )?;
    }
    let mut args = vec!["reservation"];
    args.extend(a_devices.iter().map(String::as_str));
    tl.prfence("node A", &args)?;
    for lu in t.lus() {
        let holder = lu.holder()?.map(|h| h.initiator);
        ensure!(
            holder.as_ref() == Some(&t.node(Node::A).initiator),
            "LU {} holder is {holder:?}, not A",
            lu.index
        );
        ensure!(
            lu.reservation_type()? == Some(5),
            "LU {} is not reserved WERO",
            lu.index
        );
    }
    tl.say(
        "target",
        "A holds every LU (Write Exclusive, Registrants Only), key 0xa",
    );

    let writer = Writer::start(t.device(Node::A, 0), tl)?;
    let mut last_write = String::new();
    for _ in 0..3 {
        last_write = writer.next_line(Duration::from_secs(30))?;
        ensure!(
            last_write.starts_with("wrote"),
            "node A's writer failed before the fence: {last_write}"
        );
    }
    writer.signal(Signal::SIGSTOP)?;
    tl.say(
        "node A",
        format!("FROZEN (SIGSTOP) after \"{last_write}\": its next write is already on its way"),
    );

    let fence_start = Instant::now();
    for device in &b_devices {
        tl.prfence("node B", &["register", "--key", KEY_B, device])?;
        tl.prfence(
            "node B",
            &[
                "preempt", "--abort", "--key", KEY_B, "--victim", KEY_A, "--type", "wero", device,
            ],
        )?;
    }
    let fence_time = fence_start.elapsed();
    for lu in t.lus() {
        let holder = lu.holder()?.map(|h| h.initiator);
        ensure!(
            holder.as_ref() == Some(&t.node(Node::B).initiator),
            "LU {} holder is {holder:?}, not B",
            lu.index
        );
        let keys: Vec<u64> = lu.registrations()?.iter().map(|r| r.key).collect();
        ensure!(
            keys == [0xb],
            "LU {} still has keys {keys:?} after the fence",
            lu.index
        );
    }
    tl.say(
        "target",
        format!(
            "A's key is gone, B holds every LU: A fenced in {} ms",
            fence_time.as_millis()
        ),
    );

    let b_data = "node B took over: this block is B's";
    match t.write_block(Node::B, 0, 0, &lab::block_data(b_data)) {
        WriteOutcome::Accepted => tl.say("node B", format!("wrote \"{b_data}\" to LUN 0 block 0")),
        other => bail!("node B's write after the fence: {other:?}"),
    }

    writer.signal(Signal::SIGCONT)?;
    tl.say("node A", "THAWED (SIGCONT): its stale write goes out");
    // A write that had completed just before the freeze may only be reported now; any other
    // "wrote" would be a phantom write (the disk check below would see it too).
    let frozen_at: u64 = last_write.trim_start_matches("wrote ").parse()?;
    let mut verdict = writer.next_line(Duration::from_secs(60))?;
    if verdict == format!("wrote {}", frozen_at + 1) {
        tl.say("node A", "(that write had completed before the freeze)");
        verdict = writer.next_line(Duration::from_secs(60))?;
    }
    ensure!(
        !verdict.starts_with("wrote"),
        "PHANTOM WRITE LANDED: node A {verdict} after being fenced"
    );
    ensure!(
        verdict.contains("FAILED"),
        "unexpected writer output {verdict:?}"
    );
    ensure!(
        verdict.contains("Invalid exchange"),
        "node A's write failed, but not with RESERVATION CONFLICT (EBADE): {verdict}"
    );
    tl.say("target", "refused node A's write: RESERVATION CONFLICT");
    let probe = t.write_probe(Node::A, 0, 0);
    ensure!(
        probe == WriteOutcome::Refused,
        "write probe from A after the fence: {probe:?}"
    );
    tl.say(
        "oracle",
        "a fresh O_DIRECT write from node A is refused too",
    );

    for node in Node::BOTH {
        let text = lab::block_text(&t.read_block(node, 0, 0)?);
        ensure!(
            text == b_data,
            "node {} reads {text:?} from LUN 0 block 0, not B's data",
            node.letter()
        );
    }
    tl.say(
        "oracle",
        format!("LUN 0 block 0 holds \"{b_data}\" (read back through both nodes)"),
    );

    let mut args = vec!["keys"];
    args.extend(b_devices.iter().map(String::as_str));
    tl.prfence("node B", &args)?;
    args[0] = "reservation";
    tl.prfence("node B", &args)?;
    tl.say("demo", "phantom write refused, the data on disk is B's");
    Ok(())
}
