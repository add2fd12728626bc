//! clap definitions. The help text is the manual: keep it accurate.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::ops::UnreachableData;
use crate::pr::{Key, ReservationType, TransportId};

/// Exit statuses, shown in `--help` and in docs/cli.md.
pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  every device succeeded; fence, unfence: every LU verified; status: the key is
     registered on every LU
  1  a device or LU failed, timed out or was skipped (other than only reservation
     conflicts); status: the key is registered on some LUs only, or an LU could not be
     read (the output says which)
  2  usage error; status: every LU was read and none has the key (\"off\", as fence_scsi)
  3  the only failures were reservation conflicts (another node holds the LU, or this
     path's key is not registered)
  4  fence: this node was fenced: its key is gone from the arbiter LU (the first by LU
     identifier), so it lost the race or was never unfenced. Found first, no other LU was
     touched; found when the arbiter is read again after the other LUs, fence had registered
     nothing of its own anywhere";

#[derive(Debug, Parser)]
#[command(
    name = "prfence",
    version,
    about = "SCSI-3 and NVMe persistent reservations and fencing, without sg_persist",
    long_about = "Reads and changes SCSI-3 persistent reservations (SPC-4 PERSISTENT RESERVE \
IN/OUT) through the Linux SG_IO ioctl, and NVMe reservations through the kernel's block PR \
ioctls and NVMe passthrough. Every command takes one or more devices (/dev/sdX, /dev/sgN, \
/dev/nvmeXnY) and works on them concurrently; results come back in argument order. NVMe speaks \
the same operations with three exceptions: no REGISTER AND MOVE, no SPEC_I_PT or ALL_TG_PT (a \
host registers on all its controllers at once), and APTPL is the target's setting.\n\n\
Keys are hexadecimal, with or without 0x, 1 to 16 digits, and are always printed as 0x and 16 \
lowercase digits. Types: wero (default), we, ea, earo, wear, eaar, or their SPC codes 1-8.",
    after_help = EXIT_STATUS_HELP
)]
pub struct Cli {
    /// Print JSON: one array with an object per device (admin commands), or one object with a
    /// report per LU (unfence, fence, status).
    #[arg(long, global = true)]
    pub json: bool,

    /// Per-command timeout in seconds (default 10).
    #[arg(long, global = true, value_name = "SECS", value_parser = parse_timeout, default_value = "10")]
    pub timeout: Duration,

    /// Log what is sent and retried on stderr (-v debug, -vv trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// List the registered keys (PR IN READ KEYS).
    Keys(Devices),
    /// Show the reservation, if any (PR IN READ RESERVATION).
    Reservation(Devices),
    /// Show what the device supports (PR IN REPORT CAPABILITIES).
    Capabilities(Devices),
    /// Show every registration with its initiator and port (PR IN READ FULL STATUS).
    FullStatus(Devices),
    /// Register a key on this path (REGISTER, or REGISTER AND IGNORE EXISTING KEY).
    Register(Register),
    /// Remove this path's registration (REGISTER with service action key 0).
    Unregister(Unregister),
    /// Take a reservation with a registered key (RESERVE).
    Reserve(ReserveArgs),
    /// Give up a reservation this path holds (RELEASE).
    Release(ReserveArgs),
    /// Remove every registration and the reservation (CLEAR).
    Clear(KeyedDevices),
    /// Remove another key's registrations and take over its reservation (PREEMPT [AND ABORT]).
    Preempt(PreemptArgs),
    /// Register a key for another initiator and move the reservation to it (REGISTER AND MOVE).
    RegisterMove(RegisterMoveArgs),
    /// Let this node write: register its key on every path of every LU (REGISTER AND IGNORE
    /// EXISTING KEY), reserve (wero) where no reservation exists, verify. The only command that
    /// registers a key that was preempted. Each LU is first added to fence_pr's record of this
    /// boot (/var/run/cluster.lus, or FENCE_PR_STORE's stem), so fence_pr's `on` refuses the node
    /// once it is fenced again.
    Unfence(FencingDevices),
    /// Fence another node: remove its key from every LU (PREEMPT AND ABORT, or PREEMPT where
    /// the target refuses it) and verify. The first LU by identifier decides alone: if this
    /// node's key is gone there, no other LU is touched and the exit status is 4 (also when
    /// it vanishes there during the fence). fence never registers this node's key: an LU where
    /// it is gone is left alone.
    Fence(Fence),
    /// Is this node's key registered on all, some or none of the LUs? (Read only.)
    Status(FencingDevices),
    /// Run the node agent (watch or lease mode) from a configuration file.
    Agent(AgentArgs),
    /// Is every LU ready to fence? Paths, PR support, capabilities, registrations and which
    /// paths carry this node's key, the reservation, orphans, with what to do about each problem.
    /// Read only: sends nothing but PERSISTENT RESERVE IN.
    Doctor(Doctor),
}

/// Paths to LUs for the fencing commands; paths to the same LU (same identifier) are grouped, and a
/// dm-multipath map stands for its SCSI paths.
#[derive(Debug, Args)]
pub struct FencingDevices {
    /// This node's key.
    #[arg(long, value_parser = parse_nonzero_key)]
    pub key: Key,
    /// Overall deadline in seconds for all LUs together; LUs still pending are reported as
    /// timed out (default 50, below Pacemaker's 60 s fence timeout).
    #[arg(long, value_name = "SECS", value_parser = parse_timeout, default_value = "50")]
    pub deadline: Duration,
    /// A coordinator LU, one device each (best its dm-multipath map), 3 or 5 of them on separate
    /// arrays, the same set on every node: `fence` then wins on a majority of them instead of
    /// on the arbiter LU, so it still wins with one array lost; `unfence` registers on them and
    /// `status` reads them as it does the other LUs.
    #[arg(long = "coordinator", value_name = "DEVICE")]
    pub coordinators: Vec<PathBuf>,
    /// Every LU: its paths (/dev/sdX, /dev/sgN), its dm-multipath map (/dev/dm-N,
    /// /dev/mapper/NAME), or an NVMe namespace (/dev/nvmeXnY; with native NVMe multipath, the
    /// head). A device that vanished is reported as a dead path (`fence` then sends nothing: it
    /// could be the arbiter); a partition, an LVM volume or a disk that is neither SCSI nor NVMe
    /// is a usage error.
    #[arg(required = true, value_name = "DEVICE")]
    pub devices: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct Fence {
    /// The key of the node to fence.
    #[arg(long, value_parser = parse_nonzero_key)]
    pub victim: Key,
    /// How long the node with the greater key waits on the arbiter LU, while both keys are
    /// registered there, before it looks again and preempts: in a mutual fence the smaller key
    /// goes first, so two PREEMPTs never cross on one LU (they can lock up an LIO target).
    /// `auto`: twice what this fence took to the arbiter's first answer, at most 1 s (the other
    /// node needs about as long to reach its PREEMPT). SECS: that long; 0 turns the wait off.
    #[arg(long, value_name = "auto|SECS", value_parser = parse_tie_break, default_value = "auto")]
    pub tie_break: TieBreakArg,
    /// With --coordinator, what a fence that won the coordinators does with a data LU no path of
    /// this node answers. `fail` (the default): the fence fails naming it. `report`: for an
    /// array you know is down, not cut off from this node alone: the fence succeeds with every
    /// data LU it reaches fenced (at least one) and names the others as not fenced; the
    /// victim's key stays on them.
    #[arg(
        long,
        value_name = "fail|report",
        value_parser = str::parse::<UnreachableData>,
        default_value = "fail",
        requires = "coordinators"
    )]
    pub unreachable_data: UnreachableData,
    #[command(flatten)]
    pub target: FencingDevices,
}

#[derive(Debug, Args)]
pub struct Devices {
    /// Overall deadline in seconds for all devices together; a device whose open or command is
    /// still blocked in the kernel then is reported as timed out (default: twice --timeout).
    #[arg(long, value_name = "SECS", value_parser = parse_timeout)]
    pub deadline: Option<Duration>,
    /// Block (/dev/sdX), SCSI generic (/dev/sgN) or NVMe namespace (/dev/nvmeXnY) devices; on a
    /// dm-multipath map (/dev/mapper/NAME) the kernel passes the command to one of its paths.
    #[arg(required = true, value_name = "DEVICE")]
    pub devices: Vec<PathBuf>,
}

impl Devices {
    /// `--deadline`, or twice the per-command timeout: the open and one command, each of which
    /// may take up to `--timeout` (retries follow answers, which come quickly).
    pub fn deadline(&self, timeout: Duration) -> Duration {
        self.deadline.unwrap_or_else(|| timeout.saturating_mul(2))
    }
}

#[derive(Debug, Args)]
pub struct KeyedDevices {
    /// This path's registered key.
    #[arg(long, value_parser = parse_nonzero_key)]
    pub key: Key,
    #[command(flatten)]
    pub devices: Devices,
}

#[derive(Debug, Args)]
pub struct Register {
    /// The key to register.
    #[arg(long, value_parser = parse_nonzero_key)]
    pub key: Key,
    /// The key this path is registered with now, to change it (default: not registered).
    #[arg(long, value_parser = parse_key, conflicts_with = "ignore_existing")]
    pub old_key: Option<Key>,
    /// Replace whatever key this path has (REGISTER AND IGNORE EXISTING KEY).
    #[arg(long)]
    pub ignore_existing: bool,
    /// Ask the target to keep registrations across power loss (APTPL). Without it the LU's
    /// current state is kept: prfence reads it (REPORT CAPABILITIES) and sends it along.
    #[arg(long)]
    pub aptpl: bool,
    /// Register on every target port of this initiator (ALL_TG_PT).
    #[arg(long)]
    pub all_target_ports: bool,
    /// Also register these initiators (SPEC_I_PT), e.g. iqn.2026-11.lab:nodeb,i,0x23d000002,
    /// fc,0x5001405abcdef012 or sas,0x5001405abcdef012.
    #[arg(long = "transport-id", value_name = "TRANSPORT_ID")]
    pub transport_ids: Vec<TransportId>,
    #[command(flatten)]
    pub devices: Devices,
}

#[derive(Debug, Args)]
pub struct Unregister {
    /// This path's registered key.
    #[arg(long, value_parser = parse_nonzero_key)]
    pub key: Key,
    /// The registration was made with ALL_TG_PT (LIO refuses to remove it otherwise).
    #[arg(long)]
    pub all_target_ports: bool,
    /// Turn persist-through-power-loss on for the LU's remaining registrations. Without it the
    /// LU's current state is kept (a REGISTER's APTPL bit applies to the whole LU).
    #[arg(long)]
    pub aptpl: bool,
    #[command(flatten)]
    pub devices: Devices,
}

#[derive(Debug, Args)]
pub struct ReserveArgs {
    /// This path's registered key.
    #[arg(long, value_parser = parse_nonzero_key)]
    pub key: Key,
    /// Reservation type: wero, we, ea, earo, wear, eaar or an SPC code.
    #[arg(long = "type", default_value = "wero")]
    pub rtype: ReservationType,
    #[command(flatten)]
    pub devices: Devices,
}

#[derive(Debug, Args)]
pub struct PreemptArgs {
    /// This path's registered key.
    #[arg(long, value_parser = parse_nonzero_key)]
    pub key: Key,
    /// The key to remove. 0 removes every other registration, only for wear and eaar.
    #[arg(long, value_parser = parse_key)]
    pub victim: Key,
    /// Also abort the victim's outstanding commands (PREEMPT AND ABORT): what fencing wants.
    #[arg(long)]
    pub abort: bool,
    /// Reservation type to hold afterwards if the victim held the reservation.
    #[arg(long = "type", default_value = "wero")]
    pub rtype: ReservationType,
    #[command(flatten)]
    pub devices: Devices,
}

#[derive(Debug, Args)]
pub struct RegisterMoveArgs {
    /// The reservation holder's key (this path).
    #[arg(long, value_parser = parse_nonzero_key)]
    pub key: Key,
    /// The key to register for the destination initiator, which becomes the holder.
    #[arg(long, value_parser = parse_nonzero_key)]
    pub new_key: Key,
    /// The destination initiator, e.g. iqn.2026-11.lab:nodeb,i,0x23d000002.
    #[arg(long = "transport-id", value_name = "TRANSPORT_ID")]
    pub transport_id: TransportId,
    /// Relative target port identifier through which the destination sees the LU.
    #[arg(long, default_value = "1")]
    pub relative_target_port: u16,
    /// Reservation type the destination holds.
    #[arg(long = "type", default_value = "wero")]
    pub rtype: ReservationType,
    /// Unregister this path after the move.
    #[arg(long)]
    pub unreg: bool,
    /// Persist through power loss (APTPL).
    #[arg(long)]
    pub aptpl: bool,
    #[command(flatten)]
    pub devices: Devices,
}

/// `prfence doctor`.
#[derive(Debug, Args)]
#[command(after_help = "\
Exit status:
  0  ready to fence: every LU answers, supports persistent reservations, and this node's key is
     registered on every path of every LU (so on the arbiter LU too)
  1  not ready (the output names each problem and what to do), or no key was given
  2  usage error")]
pub struct Doctor {
    /// This node's key (default: key.value of --config).
    #[arg(long, value_parser = parse_nonzero_key)]
    pub key: Option<Key>,
    /// Take the devices, and key.value if it is set, from the node agent's configuration file.
    #[arg(long, value_name = "FILE", conflicts_with = "devices")]
    pub config: Option<PathBuf>,
    /// Overall deadline in seconds for all LUs together.
    #[arg(long, value_name = "SECS", value_parser = parse_timeout, default_value = "50")]
    pub deadline: Duration,
    /// A coordinator LU, one device each, as `fence --coordinator` names them: each is checked
    /// as an LU, and the set for its size (3 or 5), each on its own iSCSI target where that
    /// shows, every key of the data LUs registered on each, and this node's key on a majority.
    #[arg(long = "coordinator", value_name = "DEVICE")]
    pub coordinators: Vec<PathBuf>,
    /// Every LU: its paths (/dev/sdX, /dev/sgN) or its dm-multipath map (/dev/dm-N,
    /// /dev/mapper/NAME).
    #[arg(value_name = "DEVICE", required_unless_present = "config")]
    pub devices: Vec<PathBuf>,
}

/// `prfence agent`.
#[derive(Debug, Args)]
#[command(after_help = "\
Signals: SIGHUP re-reads the configuration; SIGTERM stops (registrations stay unless
unregister_on_exit).

Exit status:
  0   stopped by SIGTERM; --check-config: valid; --once: every LU and path healthy
  1   could not start or run (devices, key, state file, watchdog, metrics port)
  2   invalid configuration or arguments
  3   --once found a problem (see the JSON)
  86  fenced (self_fence.exit_status)")]
pub struct AgentArgs {
    /// The agent's TOML configuration (every setting: `man prfence-agent.toml`; the package
    /// installs a commented one as /etc/prfence/agent.toml).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Validate the configuration and exit.
    #[arg(long)]
    pub check_config: bool,
    /// Look once at every LU, print the status as JSON and exit. Read-only: READ KEYS only, no
    /// PERSISTENT RESERVE OUT, no watchdog opened, no self-fence action. The paths count as
    /// registered when our key is listed once per path: an earlier session's leftover
    /// registration can stand in for a path that has none, which `prfence doctor` (READ FULL
    /// STATUS, also read-only) tells apart.
    #[arg(long, conflicts_with = "check_config")]
    pub once: bool,
    /// Write the status as JSON to FILE after every check (atomically replaced).
    #[arg(long, value_name = "FILE")]
    pub status_file: Option<PathBuf>,
}

impl Cmd {
    /// Whether the command sends commands to devices, which can get stuck in the kernel: then it
    /// runs in a worker process ([`crate::worker`]). All but the agent, which does only with
    /// `--once` (the running agent is a service; `--check-config` opens none).
    pub fn touches_devices(&self) -> bool {
        match self {
            Cmd::Agent(agent) => agent.once,
            _ => true,
        }
    }

    /// The devices a command names.
    pub fn devices(&self) -> &[PathBuf] {
        match self {
            Cmd::Keys(d) | Cmd::Reservation(d) | Cmd::Capabilities(d) | Cmd::FullStatus(d) => {
                &d.devices
            }
            Cmd::Register(r) => &r.devices.devices,
            Cmd::Unregister(u) => &u.devices.devices,
            Cmd::Reserve(r) | Cmd::Release(r) => &r.devices.devices,
            Cmd::Clear(c) => &c.devices.devices,
            Cmd::Preempt(p) => &p.devices.devices,
            Cmd::RegisterMove(m) => &m.devices.devices,
            Cmd::Unfence(d) | Cmd::Status(d) => &d.devices,
            Cmd::Fence(f) => &f.target.devices,
            Cmd::Agent(_) => &[],
            Cmd::Doctor(d) => &d.devices,
        }
    }
}

/// Rejects argument combinations the target would only answer with ILLEGAL REQUEST, and more
/// devices than one run may work on ([`crate::MAX_DEVICES`]).
pub fn check(command: &Cmd) -> Result<(), String> {
    let count = command.devices().len();
    if count > crate::MAX_DEVICES {
        return Err(format!(
            "{count} devices given; at most {} per command (each gets a worker thread): run the \
             command on fewer devices at a time",
            crate::MAX_DEVICES
        ));
    }
    if let Cmd::Preempt(p) = command
        && p.victim.is_zero()
        && !p.rtype.is_all_registrants()
    {
        return Err(format!(
            "--victim 0 (remove every other registration) is only valid with an all-registrants \
             type (wear, eaar), not {}",
            p.rtype
        ));
    }
    if let Cmd::RegisterMove(m) = command
        && matches!(&m.transport_id, TransportId::Iscsi { isid: None, .. })
    {
        // Not refused (SPC allows it), but LIO then registers a nexus no session uses.
        eprintln!(
            "prfence: warning: {} names an iSCSI initiator without an ISID; the target may move \
             the reservation to a registration that no session of it uses. Give NAME,i,0xISID \
             as `prfence full-status` shows it",
            m.transport_id
        );
    }
    Ok(())
}

fn parse_key(s: &str) -> Result<Key, String> {
    s.parse::<Key>().map_err(|e| e.to_string())
}

/// Key 0 means "no key" in SPC; where a real key is needed it is refused up front rather than
/// sent and answered with a conflict.
fn parse_nonzero_key(s: &str) -> Result<Key, String> {
    let key = parse_key(s)?;
    if key.is_zero() {
        return Err("key 0 means \"no key\" here; use a non-zero key".to_string());
    }
    Ok(key)
}

/// The least time a command or a deadline can be given: SG_IO takes its timeout in whole
/// milliseconds and reads 0 as "the kernel's default" (tens of seconds), so anything shorter
/// would silently become the default rather than a shorter bound.
pub const MIN_TIME: Duration = Duration::from_millis(1);

/// The most `--timeout` and `--deadline` take.
pub const MAX_TIMEOUT_SECS: f64 = 3600.0;

/// The most `--tie-break` takes.
pub const MAX_TIE_BREAK_SECS: f64 = 60.0;

/// Seconds as a finite, non-negative number (NaN, infinities, negatives and `-0` refused).
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !secs.is_finite() || secs.is_sign_negative() {
        return Err(format!(
            "{s:?} is not a finite, non-negative number of seconds"
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

/// `--tie-break`: measured by the fence itself, or a fixed number of seconds (0: off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TieBreakArg {
    Auto,
    Seconds(Duration),
}

fn parse_tie_break(s: &str) -> Result<TieBreakArg, String> {
    if s.trim() == "auto" {
        return Ok(TieBreakArg::Auto);
    }
    let wait = parse_seconds(s)?;
    // Exactly 0 turns the wait off; a tiny non-zero wait would be off by accident.
    if wait.is_zero() && s.trim().parse::<f64>().is_ok_and(|secs| secs == 0.0) {
        return Ok(TieBreakArg::Seconds(Duration::ZERO));
    }
    if wait < MIN_TIME || wait.as_secs_f64() > MAX_TIE_BREAK_SECS {
        return Err(format!(
            "the tie-break wait must be auto, 0 (off) or 0.001 to {MAX_TIE_BREAK_SECS} seconds; \
             {s:?} is outside"
        ));
    }
    Ok(TieBreakArg::Seconds(wait))
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let timeout = parse_seconds(s)?;
    if timeout < MIN_TIME || timeout.as_secs_f64() > MAX_TIMEOUT_SECS {
        return Err(format!(
            "{s:?} is outside 0.001 to {MAX_TIMEOUT_SECS} seconds: SG_IO counts whole \
             milliseconds and takes 0 as the kernel's default, so at least 1 ms"
        ));
    }
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_take_1_ms_to_an_hour() {
        assert_eq!(parse_timeout("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout("0.001"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_timeout("0.0015"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_timeout("3600"), Ok(Duration::from_secs(3600)));
        for bad in [
            "0",
            "-0",
            "0.0000000001",
            "0.0009",
            "1e-400",
            "3600.001",
            "1e300",
            "inf",
            "-inf",
            "NaN",
            "-1",
            "",
            "ten",
        ] {
            assert!(parse_timeout(bad).is_err(), "{bad:?} accepted");
        }
        let e = parse_timeout("0.0000000001").unwrap_err();
        assert!(e.contains("1 ms") && e.contains("kernel's default"), "{e}");
    }

    #[test]
    fn tie_break_is_off_or_1_ms_to_a_minute() {
        let secs = |d| Ok(TieBreakArg::Seconds(d));
        assert_eq!(parse_tie_break("auto"), Ok(TieBreakArg::Auto));
        assert_eq!(parse_tie_break("0"), secs(Duration::ZERO));
        assert_eq!(parse_tie_break("0.0"), secs(Duration::ZERO));
        assert_eq!(parse_tie_break("1"), secs(Duration::from_secs(1)));
        assert_eq!(parse_tie_break("0.001"), secs(Duration::from_millis(1)));
        assert_eq!(parse_tie_break("60"), secs(Duration::from_secs(60)));
        for bad in ["-0", "0.0000000001", "60.5", "inf", "NaN", "-1", ""] {
            assert!(parse_tie_break(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_command_line_refuses_bad_times_as_usage_errors() {
        for args in [
            &["prfence", "--timeout", "0.0000000001", "keys", "/dev/sdz"][..],
            &[
                "prfence",
                "status",
                "--key",
                "1",
                "--deadline",
                "1e-9",
                "/dev/sdz",
            ],
            &[
                "prfence",
                "fence",
                "--key",
                "1",
                "--victim",
                "2",
                "--tie-break",
                "NaN",
                "/dev/sdz",
            ],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }
}
