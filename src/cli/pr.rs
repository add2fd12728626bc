//! The single PR commands (`prfence keys | reservation | capabilities | full-status | register |
//! unregister | reserve | release | clear | preempt | register-move`): one command on every device
//! named, all at once under one deadline, reported in argument order.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::host::Host;
use crate::pr::{PrInAction, PrOut, RegisterMove};
use crate::transport::{
    Command, CommandError, ErrorKind, Policy, PrAnswer, PrRequest, PrTransport, Protocol,
};
use prfence_engine::runtime::{self, Finished};

use super::args::{Cmd, Devices};
use super::exit::ExitStatus;
use super::render::{self, Answer, Reported};

/// What to do on each device, resolved from the arguments once.
#[derive(Debug, Clone)]
pub(super) enum Request {
    ReadKeys,
    ReadReservation,
    ReportCapabilities,
    ReadFullStatus,
    Out(PrOut),
}

impl Request {
    /// The command sent, for errors that come before or instead of its completion.
    pub(super) fn command(&self) -> Command {
        match self {
            Request::ReadKeys => Command::PrIn(PrInAction::ReadKeys),
            Request::ReadReservation => Command::PrIn(PrInAction::ReadReservation),
            Request::ReportCapabilities => Command::PrIn(PrInAction::ReportCapabilities),
            Request::ReadFullStatus => Command::PrIn(PrInAction::ReadFullStatus),
            Request::Out(out) => Command::PrOut(out.action),
        }
    }
}

/// The request and the devices it goes to, with their options.
pub(super) fn request_of(command: &Cmd) -> Option<(Request, &Devices)> {
    Some(match command {
        Cmd::Keys(d) => (Request::ReadKeys, d),
        Cmd::Reservation(d) => (Request::ReadReservation, d),
        Cmd::Capabilities(d) => (Request::ReportCapabilities, d),
        Cmd::FullStatus(d) => (Request::ReadFullStatus, d),
        Cmd::Register(r) => {
            let out = if r.ignore_existing {
                PrOut::register_ignore(r.key)
            } else {
                PrOut::register(r.old_key.unwrap_or(crate::pr::Key::ZERO), r.key)
            };
            let out = out
                .with_aptpl(r.aptpl)
                .with_all_tg_pt(r.all_target_ports)
                .with_spec_i_pt(r.transport_ids.clone());
            (Request::Out(out), &r.devices)
        }
        Cmd::Unregister(u) => (
            Request::Out(
                PrOut::register(u.key, crate::pr::Key::ZERO)
                    .with_all_tg_pt(u.all_target_ports)
                    .with_aptpl(u.aptpl),
            ),
            &u.devices,
        ),
        Cmd::Reserve(r) => (Request::Out(PrOut::reserve(r.key, r.rtype)), &r.devices),
        Cmd::Release(r) => (Request::Out(PrOut::release(r.key, r.rtype)), &r.devices),
        Cmd::Clear(c) => (Request::Out(PrOut::clear(c.key)), &c.devices),
        Cmd::Preempt(p) => {
            let out = if p.abort {
                PrOut::preempt_and_abort(p.key, p.victim, p.rtype)
            } else {
                PrOut::preempt(p.key, p.victim, p.rtype)
            };
            (Request::Out(out), &p.devices)
        }
        Cmd::RegisterMove(m) => {
            let target = RegisterMove {
                unreg: m.unreg,
                relative_target_port: m.relative_target_port,
                transport_id: m.transport_id.clone(),
            };
            let out =
                PrOut::register_and_move(m.key, m.new_key, m.rtype, target).with_aptpl(m.aptpl);
            (Request::Out(out), &m.devices)
        }
        Cmd::Unfence(_) | Cmd::Fence(_) | Cmd::Status(_) | Cmd::Agent(_) | Cmd::Doctor(_) => {
            return None;
        }
    })
}

/// Runs a single PR command on `host`'s devices and prints the results; returns the exit status
/// (`None`: `command` is not a single PR command).
pub fn execute(
    command: &Cmd,
    json: bool,
    timeout: Duration,
    policy: Policy,
    host: Arc<dyn Host>,
) -> Option<ExitStatus> {
    let (request, devices) = request_of(command)?;
    let command = request.command();
    let request = Arc::new(request);
    let results = run_concurrently(
        &devices.devices,
        devices.deadline(timeout),
        command,
        move |path| perform(&request, host.as_ref(), path, policy),
    );
    render::print(json, &devices.devices, &results);
    Some(ExitStatus::of(&results))
}

fn perform(
    request: &Request,
    host: &dyn Host,
    path: &Path,
    policy: Policy,
) -> Result<Reported, CommandError> {
    let device = host.open(path, policy)?;
    let operation = match request {
        Request::ReadKeys => PrRequest::ReadKeys,
        Request::ReadReservation => PrRequest::ReadReservation,
        Request::ReportCapabilities => PrRequest::ReportCapabilities,
        Request::ReadFullStatus => PrRequest::ReadFullStatus,
        Request::Out(out) => PrRequest::Out(out),
    };
    let reply = device.execute(operation)?;
    let outcome = match (operation, reply.answer) {
        (_, PrAnswer::Keys(keys)) => Answer::Keys(keys),
        (_, PrAnswer::Reservation(reservation)) => Answer::Reservation(reservation),
        (_, PrAnswer::Capabilities(capabilities)) if device.protocol() == Protocol::Nvme => {
            Answer::NvmeCapabilities(capabilities)
        }
        (_, PrAnswer::Capabilities(capabilities)) => Answer::Capabilities(capabilities),
        (_, PrAnswer::FullStatus(status)) => Answer::FullStatus(status),
        (PrRequest::Out(out), PrAnswer::Out(report)) => Answer::Done {
            action: out.action,
            report,
        },
        (_, answer) => return Err(CommandError::mismatched(path, operation, &answer)),
    };
    let unit_attentions = reply.events.iter().map(ToString::to_string).collect();
    Ok(Reported {
        outcome,
        unit_attentions,
    })
}

/// One worker thread per device; results in argument order, all by `deadline`. Workers are not
/// joined: a device whose open or command blocks in the kernel (SCSI error recovery) keeps only
/// its own thread and is reported as timed out at the deadline; the process exits without it.
/// A worker the system cannot start (thread or memory limits) fails its device with an error
/// instead of aborting the others.
fn run_concurrently<W>(
    devices: &[PathBuf],
    deadline: Duration,
    command: Command,
    work: W,
) -> Vec<Result<Reported, CommandError>>
where
    W: Fn(&Path) -> Result<Reported, CommandError> + Send + Sync + 'static,
{
    let until = runtime::now() + deadline;
    let finished = runtime::fan_out(devices, until, move |path| work(path), &mut |_, _, _| {});
    devices
        .iter()
        .zip(finished)
        .map(|(path, finished)| match finished {
            Finished::Done { value, .. } => value,
            Finished::TimedOut => Err(timed_out(path, command, deadline)),
            Finished::Panicked => Err(CommandError::without_completion(
                path,
                command,
                ErrorKind::Failed,
                "the device's worker thread panicked; nothing is known about the result: \
                 check the device's state before rerunning",
            )),
            Finished::NotStarted(why) => Err(spawn_failed(path, &why)),
        })
        .collect()
}

/// The error of a device still blocked at the command's deadline.
fn timed_out(path: &Path, command: Command, deadline: Duration) -> CommandError {
    CommandError::without_completion(
        path,
        command,
        ErrorKind::Timeout,
        format!(
            "no result within the deadline of {:.3} s: the open or the command is still blocked \
             in the kernel (SCSI error recovery, a hung path); check the path and rerun (a PR OUT \
             may or may not have been applied: read the state first)",
            deadline.as_secs_f64()
        ),
    )
}

/// The error of a device whose worker thread could not be started.
fn spawn_failed(path: &Path, error: &dyn std::fmt::Display) -> CommandError {
    CommandError::without_completion(
        path,
        Command::Open,
        ErrorKind::Failed,
        format!(
            "cannot start a worker thread for this device ({error}); nothing was sent: the \
             process hit a thread or memory limit (ulimit -u, ulimit -v, cgroup pids.max), so run \
             the command on fewer devices at a time"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_worker_that_cannot_start_is_a_device_error() {
        let e = spawn_failed(
            std::path::Path::new("/dev/sdq"),
            &std::io::Error::from_raw_os_error(libc::EAGAIN),
        );
        assert_eq!(e.kind, ErrorKind::Failed);
        let text = e.to_string();
        assert!(
            text.starts_with("/dev/sdq") && text.contains("fewer devices"),
            "{text}"
        );
        assert_eq!(ExitStatus::of::<()>(&[Err(e)]), ExitStatus::Failure);
    }

    #[test]
    fn a_device_blocked_in_the_kernel_times_out_alone_at_the_deadline() {
        const HANG: Duration = Duration::from_secs(30);
        let devices: Vec<PathBuf> = ["/dev/sdb", "/dev/sdhung", "/dev/sdd"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let deadline = Duration::from_millis(500);
        let started = Instant::now();
        let results = run_concurrently(
            &devices,
            deadline,
            Command::PrIn(PrInAction::ReadKeys),
            |path| {
                if path == Path::new("/dev/sdhung") {
                    // An open or ioctl that does not return (the thread is left behind).
                    std::thread::sleep(HANG);
                }
                Ok(Reported {
                    outcome: render::Answer::Keys(crate::pr::ReadKeys {
                        generation: 1,
                        keys: Vec::new(),
                    }),
                    unit_attentions: Vec::new(),
                })
            },
        );
        let took = started.elapsed();
        println!("3 devices, one blocked for {HANG:?}: {took:?} (deadline {deadline:?})");
        assert!(took < deadline + Duration::from_secs(1), "{took:?}");
        assert!(results[0].is_ok() && results[2].is_ok());
        let e = results[1].as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert_eq!(e.command, Command::PrIn(PrInAction::ReadKeys));
        let text = e.to_string();
        assert!(
            text.starts_with("/dev/sdhung") && text.contains("0.500 s") && text.contains("blocked"),
            "{text}"
        );
        assert_eq!(ExitStatus::of(&results), ExitStatus::Failure);
    }
}
