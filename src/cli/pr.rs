//! The single PR commands (`prfence keys | reservation | capabilities | full-status | register |
//! unregister | reserve | release | clear | preempt | register-move`): one command on every device
//! named, all at once under one deadline, reported in argument order; a PR OUT goes to the named
//! paths of one LU one after another (see [`groups`]).

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
    let groups = groups(&request, host.as_ref(), &devices.devices);
    // Each device is open while its command runs, all at once.
    super::paths::make_room(groups.len(), devices.devices.len());
    let request = Arc::new(request);
    let results = run_concurrently(
        &devices.devices,
        groups,
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

/// Which devices one worker serves, one after another (indexes into `devices`): for a PR OUT,
/// every named path of one LU, because two PR OUTs on one LU at once through two I_T nexuses
/// crashed LIO (Linux 6.1: a CLEAR sent on both paths of an LU, list corruption in
/// `__core_scsi3_free_registration`, docs/target-notes.md); every other device alone, reads
/// included. A device discovery cannot place is alone too (its own command says what is wrong).
fn groups(request: &Request, host: &dyn Host, devices: &[PathBuf]) -> Vec<Vec<usize>> {
    let alone = || (0..devices.len()).map(|i| vec![i]).collect();
    if !matches!(request, Request::Out(_)) || devices.len() < 2 {
        return alone();
    }
    let Ok(resolution) = host.resolve_each(devices) else {
        return alone();
    };
    let lu_of = |device: &PathBuf| {
        resolution.lus.iter().position(|lu| {
            lu.paths
                .iter()
                .any(|path| path.given == *device || path.dev == *device)
        })
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of_lu: Vec<(usize, usize)> = Vec::new();
    for (index, device) in devices.iter().enumerate() {
        let lu = lu_of(device);
        match lu.and_then(|lu| group_of_lu.iter().find(|(l, _)| *l == lu)) {
            Some(&(_, group)) => groups[group].push(index),
            None => {
                if let Some(lu) = lu {
                    group_of_lu.push((lu, groups.len()));
                }
                groups.push(vec![index]);
            }
        }
    }
    groups
}

/// One worker thread per group of devices ([`groups`]), the devices of a group one after
/// another; results in argument order, all by `deadline`. Workers are not joined: a device whose
/// open or command blocks in the kernel (SCSI error recovery) keeps only its own thread (and the
/// rest of its group) and is reported as timed out at the deadline; the process exits without
/// it. A worker the system cannot start (thread or memory limits) fails its devices with an error
/// instead of aborting the others.
fn run_concurrently<W>(
    devices: &[PathBuf],
    groups: Vec<Vec<usize>>,
    deadline: Duration,
    command: Command,
    work: W,
) -> Vec<Result<Reported, CommandError>>
where
    W: Fn(&Path) -> Result<Reported, CommandError> + Send + Sync + 'static,
{
    // from the command's start: --deadline bounds what its caller waits for
    let until = crate::worker::started() + deadline;
    let items: Vec<Vec<PathBuf>> = groups
        .iter()
        .map(|group| group.iter().map(|&i| devices[i].clone()).collect())
        .collect();
    let finished = runtime::fan_out(
        &items,
        until,
        move |paths: &Vec<PathBuf>| paths.iter().map(|path| work(path)).collect::<Vec<_>>(),
        &mut |_, _, _| {},
    );
    let mut results: Vec<Option<Result<Reported, CommandError>>> =
        devices.iter().map(|_| None).collect();
    for (group, finished) in groups.iter().zip(finished) {
        match finished {
            Finished::Done { value, .. } => {
                for (&index, result) in group.iter().zip(value) {
                    results[index] = Some(result);
                }
            }
            other => {
                for &index in group {
                    let path = &devices[index];
                    results[index] = Some(Err(match &other {
                        Finished::NotStarted(why) => spawn_failed(path, why),
                        Finished::TimedOut => timed_out(path, command, deadline),
                        _ => panicked(path, command),
                    }));
                }
            }
        }
    }
    results
        .into_iter()
        .zip(devices)
        .map(|(result, path)| result.unwrap_or_else(|| Err(panicked(path, command))))
        .collect()
}

/// The error of a device whose worker panicked (or, never expected, left no result).
fn panicked(path: &Path, command: Command) -> CommandError {
    CommandError::without_completion(
        path,
        command,
        ErrorKind::Failed,
        "the device's worker thread panicked; nothing is known about the result: check the \
         device's state before rerunning",
    )
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
            vec![vec![0], vec![1], vec![2]],
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

    /// Two LUs with two paths each on a model node: sdb and sdd reach `naa.0`, sdc and sde `naa.1`.
    fn two_lus_two_paths() -> crate::testing::ModelHost {
        use std::sync::Mutex;

        use crate::discover::{LuId, PathInfo, PathState};
        use crate::spc_model::{ModelDevice, ModelLu, Quirks, iscsi_initiator};

        let host = crate::testing::ModelHost::new();
        for (lu_index, devs) in [(0, ["/dev/sdb", "/dev/sdd"]), (1, ["/dev/sdc", "/dev/sde"])] {
            let lu = Arc::new(Mutex::new(ModelLu::new(Quirks::lio())));
            for (path, dev) in devs.into_iter().enumerate() {
                let nexus = lu
                    .lock()
                    .unwrap()
                    .connect(iscsi_initiator("node-a", &format!("{path}")), 1);
                let info = PathInfo {
                    dev: PathBuf::from(dev),
                    given: PathBuf::from(dev),
                    name: dev.trim_start_matches("/dev/").to_owned(),
                    protocol: Protocol::Scsi,
                    hctl: String::new(),
                    state: PathState::Running,
                    transport: None,
                    generic: None,
                };
                host.attach(
                    LuId::from_wwid(&format!("naa.{lu_index}")).unwrap(),
                    info,
                    ModelDevice::new(Arc::clone(&lu), nexus, dev),
                );
            }
        }
        host
    }

    #[test]
    fn a_pr_out_goes_to_the_paths_of_one_lu_one_after_another_and_reads_to_all_at_once() {
        let host = two_lus_two_paths();
        let devices: Vec<PathBuf> = ["/dev/sdb", "/dev/sdc", "/dev/sdd", "/dev/sde", "/dev/sdz"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let clear = Request::Out(PrOut::clear(crate::pr::Key::new(0xa)));
        // by LU, in argument order; a device discovery does not know goes alone
        assert_eq!(
            groups(&clear, &host, &devices),
            vec![vec![0, 2], vec![1, 3], vec![4]]
        );
        let every_alone: Vec<Vec<usize>> = (0..devices.len()).map(|i| vec![i]).collect();
        assert_eq!(groups(&Request::ReadKeys, &host, &devices), every_alone);

        // within a group no two commands overlap; results stay in argument order
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = Arc::clone(&log);
        let results = run_concurrently(
            &devices[..4],
            groups(&clear, &host, &devices[..4]),
            Duration::from_secs(10),
            Command::PrIn(PrInAction::ReadKeys),
            move |path| {
                let began = Instant::now();
                std::thread::sleep(Duration::from_millis(50));
                record
                    .lock()
                    .unwrap()
                    .push((path.to_path_buf(), began, Instant::now()));
                Ok(Reported {
                    outcome: render::Answer::Keys(crate::pr::ReadKeys {
                        generation: 1,
                        keys: Vec::new(),
                    }),
                    unit_attentions: Vec::new(),
                })
            },
        );
        assert_eq!(results.len(), 4);
        assert!(results.iter().all(Result::is_ok));
        let log = log.lock().unwrap();
        let span = |dev: &str| {
            log.iter()
                .find(|(p, _, _)| p == Path::new(dev))
                .map(|&(_, began, ended)| (began, ended))
                .unwrap()
        };
        for (first, second) in [("/dev/sdb", "/dev/sdd"), ("/dev/sdc", "/dev/sde")] {
            let (a, b) = (span(first), span(second));
            assert!(a.1 <= b.0 || b.1 <= a.0, "{first} and {second} overlapped");
        }
        // the two LUs' groups ran at the same time
        let (a, b) = (span("/dev/sdb"), span("/dev/sdc"));
        assert!(a.0 < b.1 && b.0 < a.1, "the LUs ran one after another");
    }
}
