//! `prfence unfence | fence | status`: the fencing engine ([`crate::ops`]) on the devices named,
//! grouped into LUs, with a verdict per LU as text or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use sg_io::Device;

use crate::exec::ScsiPr;
use crate::ops::{self, Limits, LuReport, LuTarget, Outcome, PathState, Report, RequestError};
use crate::pr::{Capabilities, FullStatus, Key, PrOut, ReadKeys, ReadReservation};
use crate::transport::{CommandError, Policy, PrOutReport, PrTransport};

use super::args::{Fence, FencingDevices};
use super::run::ExitStatus;

/// One path as the CLI opened it. A path that cannot be opened is kept, as a dead path whose
/// every command fails with the open error, so the report names it and the LU can still be
/// handled through its other paths.
#[derive(Debug)]
pub enum CliPath {
    Open(ScsiPr<Device>),
    Unopened(CommandError),
}

impl CliPath {
    fn open(path: &Path, policy: Policy) -> Self {
        match ScsiPr::open(path, policy) {
            Ok(device) => CliPath::Open(device),
            Err(e) => CliPath::Unopened(e),
        }
    }

    fn run<R>(
        &self,
        f: impl FnOnce(&ScsiPr<Device>) -> Result<R, CommandError>,
    ) -> Result<R, CommandError> {
        match self {
            CliPath::Open(device) => f(device),
            CliPath::Unopened(e) => Err(e.clone()),
        }
    }
}

impl PrTransport for CliPath {
    fn device(&self) -> &Path {
        match self {
            CliPath::Open(device) => device.device(),
            CliPath::Unopened(e) => &e.device,
        }
    }
    fn read_keys(&self) -> Result<ReadKeys, CommandError> {
        self.run(|d| d.read_keys())
    }
    fn read_reservation(&self) -> Result<ReadReservation, CommandError> {
        self.run(|d| d.read_reservation())
    }
    fn report_capabilities(&self) -> Result<Capabilities, CommandError> {
        self.run(|d| d.report_capabilities())
    }
    fn read_full_status(&self) -> Result<FullStatus, CommandError> {
        self.run(|d| d.read_full_status())
    }
    fn pr_out(&self, request: &PrOut) -> Result<PrOutReport, CommandError> {
        self.run(|d| d.pr_out(request))
    }
}

/// Groups device arguments into LUs by the kernel's `wwid` (the VPD 83h designator sysfs shows),
/// falling back to the absolute device path when it cannot be read (a device that vanished, a
/// dm device).
///
/// Stand-in until discovery lands: to be replaced by `discover::resolve` (which also expands
/// dm-multipath devices into their SCSI paths).
pub fn group_into_lus(devices: &[PathBuf]) -> Vec<(String, Vec<PathBuf>)> {
    let mut lus: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for device in devices {
        // The fallback is an absolute path, which the engine treats as node-local: never the
        // arbiter (see `ops::is_node_local_id`).
        let id = sysfs_wwid(device).unwrap_or_else(|| {
            std::path::absolute(device)
                .unwrap_or_else(|_| Path::new("/").join(device))
                .display()
                .to_string()
        });
        let paths = lus.entry(id).or_default();
        if !paths.contains(device) {
            paths.push(device.clone());
        }
    }
    lus.into_iter().collect()
}

fn sysfs_wwid(device: &Path) -> Option<String> {
    let resolved = std::fs::canonicalize(device).ok()?;
    let name = resolved.file_name()?.to_str()?;
    let candidates = [
        format!("/sys/block/{name}/device/wwid"),
        format!("/sys/class/scsi_generic/{name}/device/wwid"),
    ];
    candidates.iter().find_map(|file| {
        let text = std::fs::read_to_string(file).ok()?;
        let id = text.trim();
        (!id.is_empty()).then(|| id.to_string())
    })
}

/// Which engine command to run.
pub enum Action<'a> {
    Unfence(&'a FencingDevices),
    Fence(&'a Fence),
    Status(&'a FencingDevices),
}

/// Runs a fencing command and prints its report; returns the exit status.
pub fn execute(action: Action<'_>, json: bool, policy: Policy) -> ExitStatus {
    let (devices, key, deadline) = match &action {
        Action::Unfence(d) | Action::Status(d) => (&d.devices, d.key, d.deadline),
        Action::Fence(f) => (&f.target.devices, f.target.key, f.target.deadline),
    };
    let lus: Vec<LuTarget<CliPath>> = group_into_lus(devices)
        .into_iter()
        .map(|(id, paths)| LuTarget {
            id,
            paths: paths.iter().map(|p| CliPath::open(p, policy)).collect(),
        })
        .collect();
    let limits = Limits { deadline };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_time()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("prfence: cannot start the async runtime: {e}");
            return ExitStatus::Failure;
        }
    };
    let result: Result<Report, RequestError> = runtime.block_on(async {
        match action {
            Action::Unfence(_) => ops::unfence(lus, key, limits).await,
            Action::Status(_) => ops::status(lus, key, limits).await,
            Action::Fence(f) => ops::fence(lus, key, f.victim, limits).await,
        }
    });
    // LUs that timed out may still have a command in the kernel; do not wait for them.
    runtime.shutdown_background();
    match result {
        Ok(report) => {
            print_report(&report, json);
            exit_status(report.outcome)
        }
        Err(e) => {
            eprintln!("prfence: {e}");
            ExitStatus::Usage
        }
    }
}

fn exit_status(outcome: Outcome) -> ExitStatus {
    match outcome {
        Outcome::Success => ExitStatus::Success,
        Outcome::Off => ExitStatus::Off,
        Outcome::ThisNodeFenced => ExitStatus::ThisNodeFenced,
        Outcome::Partial | Outcome::Failure => ExitStatus::Failure,
    }
}

fn print_report(report: &Report, json: bool) {
    if json {
        let mut value = serde_json::to_value(report).unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "exit_status".into(),
                serde_json::json!(report.outcome.exit_code()),
            );
        }
        println!("{value}");
    } else {
        print!("{}", to_text(report));
    }
}

fn key_list(keys: &[Key]) -> String {
    if keys.is_empty() {
        return "none".to_string();
    }
    keys.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

fn lu_text(out: &mut String, lu: &LuReport) {
    let _ = writeln!(
        out,
        "  {} {}: {}",
        if lu.ok { "OK  " } else { "FAIL" },
        lu.lu,
        lu.verdict
    );
    if let Some(keys) = &lu.keys {
        let _ = writeln!(out, "       keys: {}", key_list(keys));
    }
    match &lu.reservation {
        Some(r) => {
            let _ = writeln!(out, "       reservation: {} {}", r.key, r.rtype);
        }
        None if lu.keys.is_some() => {
            let _ = writeln!(out, "       reservation: none");
        }
        None => {}
    }
    if let Some(generation) = lu.generation {
        let _ = writeln!(out, "       generation: {generation}");
    }
    for path in &lu.paths {
        let state = match path.state {
            PathState::Ok => "ok",
            PathState::Unused => "unused",
            PathState::Dead => "dead",
            PathState::Failed => "failed",
        };
        let _ = write!(out, "       path {}: {state}", path.device);
        if let Some(error) = &path.error {
            let _ = write!(out, " ({error})");
        }
        out.push('\n');
    }
    for note in &lu.notes {
        let _ = writeln!(out, "       note: {note}");
    }
    if let Some(error) = &lu.error {
        let _ = writeln!(out, "       error: {error}");
    }
}

pub fn to_text(report: &Report) -> String {
    let mut out = format!("{}: {}\n", report.command, report.summary);
    for lu in &report.lus {
        lu_text(&mut out, lu);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_without_a_wwid_are_their_own_lu_and_duplicates_merge() {
        let devices = [
            PathBuf::from("/nonexistent/b"),
            PathBuf::from("/nonexistent/a"),
            PathBuf::from("/nonexistent/b"),
        ];
        let lus = group_into_lus(&devices);
        assert_eq!(
            lus,
            vec![
                ("/nonexistent/a".to_string(), vec![devices[1].clone()]),
                ("/nonexistent/b".to_string(), vec![devices[0].clone()]),
            ]
        );
    }

    #[test]
    fn an_unopenable_path_is_a_dead_path() {
        let path = CliPath::open(Path::new("/nonexistent/sdz"), Policy::default());
        let e = path.read_keys().unwrap_err();
        assert_eq!(e.kind, crate::transport::ErrorKind::Open);
        assert_eq!(path.device(), Path::new("/nonexistent/sdz"));
    }

    #[test]
    fn status_over_unopenable_devices_fails_and_names_them() {
        let args = FencingDevices {
            key: Key::new(0xa),
            deadline: std::time::Duration::from_secs(5),
            devices: vec![PathBuf::from("/nonexistent/sdz")],
        };
        let status = execute(Action::Status(&args), true, Policy::default());
        assert_eq!(status, ExitStatus::Failure);
    }
}
