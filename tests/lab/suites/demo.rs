//! The demo: the phantom write that prfence exists to stop, played on a real LIO target.
//!
//! Both nodes join (`prfence unfence`: A first, so A holds the LUNs, WERO) and A writes a counter
//! every ~100 ms. A freezes (SIGSTOP: a long pause, a hung path). Node B fences A with one
//! `prfence fence` over all LUNs and writes its own data. A wakes up and its next write — the
//! phantom write — is refused by the target; the disk holds B's data. Run: `cargo test --test
//! lab_demo` (as root). It drives prfence only, never sg_persist.

use std::fmt::Display;
use std::time::{Duration, Instant};

use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{Node, Topology, WriteOutcome, Writer};
use anyhow::{Context, bail, ensure};
use nix::sys::signal::Signal;

const LUNS: usize = 2;
const KEY_A: &str = "0xa";
const KEY_B: &str = "0xb";

pub const SUITE: Suite = Suite {
    name: "demo",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(4 * 60),
    usual: Duration::from_secs(6),
    tests: crate::tests![phantom_write_fenced],
    long: &[],
    reproducers: &[],
};

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
    fn prfence(&self, who: &str, args: &[&str]) -> anyhow::Result<crate::CommandRun> {
        let run = crate::prfence(args)?;
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

    /// [`Timeline::prfence`] with owned arguments (a command over a list of devices).
    fn prfence_all(&self, who: &str, args: &[String]) -> anyhow::Result<crate::CommandRun> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.prfence(who, &args)
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
            crate::secs(t.setup_time()),
            a_devices.join(" "),
            b_devices.join(" ")
        ),
    );

    let with_devices = |args: &[&'static str], devices: &[String]| -> Vec<String> {
        args.iter()
            .map(|a| (*a).to_owned())
            .chain(devices.iter().cloned())
            .collect()
    };
    tl.prfence_all(
        "node A",
        &with_devices(&["unfence", "--key", KEY_A], &a_devices),
    )?;
    tl.prfence_all(
        "node B",
        &with_devices(&["unfence", "--key", KEY_B], &b_devices),
    )?;
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
        let mut keys: Vec<u64> = lu.registrations()?.iter().map(|r| r.key).collect();
        keys.sort_unstable();
        ensure!(
            keys == [0xa, 0xb],
            "LU {} has keys {keys:?} after both unfenced",
            lu.index
        );
    }
    tl.say(
        "target",
        "keys 0xa and 0xb registered; A holds every LU (Write Exclusive, Registrants Only)",
    );

    let writer = Writer::start("node A", &t.node(Node::A).devices()[..1], 0, move |line| {
        tl.say("node A", format!("writer: {line}"));
    })?;
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
    tl.prfence_all(
        "node B",
        &with_devices(&["fence", "--key", KEY_B, "--victim", KEY_A], &b_devices),
    )?;
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
    match t.write_block(Node::B, 0, 0, &crate::block_data(b_data)) {
        WriteOutcome::Accepted => tl.say("node B", format!("wrote \"{b_data}\" to LUN 0 block 0")),
        other => bail!("node B's write after the fence: {other:?}"),
    }

    writer.signal(Signal::SIGCONT)?;
    tl.say("node A", "THAWED (SIGCONT): its stale write goes out");
    // A write that had completed just before the freeze may only be reported now; any other
    // "wrote" would be a phantom write (the disk check below would see it too).
    let frozen_at = crate::write_number(&last_write).context("the writer's last line")?;
    let mut verdict = writer.next_line(Duration::from_secs(60))?;
    if crate::write_number(&verdict) == Some(frozen_at + 1) {
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
        let text = crate::block_text(&t.read_block(node, 0, 0)?);
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

    tl.prfence_all(
        "node B",
        &with_devices(&["status", "--key", KEY_B], &b_devices),
    )?;
    tl.say("demo", "phantom write refused, the data on disk is B's");
    Ok(())
}
