//! `prfence doctor`: the devices (or the agent configuration's) grouped into LUs, this node's
//! facts about each path read from sysfs, the engine's read-only diagnosis
//! ([`crate::ops::doctor`]) rendered in words or JSON.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use crate::daemon::config::{ModeSettings, Settings};
use crate::daemon::watch::key::{resolve_key, store_problem};
use crate::discover::{LuId, PathInfo, PathSysfs};
use crate::fence_agent::store::KeyStore;
use crate::host::Host;
use crate::ops::doctor::{
    self, Diagnosis, DoctorPath, LuDiagnosis, PathFacts, PathRegistration, Severity, Support,
    TargetKind,
};
use crate::ops::{LuTarget, OpenPath};
use crate::pr::Key;
use crate::transport::{Policy, Protocol};

use super::args::Doctor;
use super::exit::{ExitStatus, json_with_exit};
use super::paths::{CliPath, opener};

type DoctorDevice = DoctorPath<CliPath>;

/// What doctor examines: the devices, this node's key, and what makes that key doubtful.
type Examined = (Vec<PathBuf>, Option<Key>, Option<String>);

/// The devices and key to examine: from the arguments, or from the agent's configuration, its
/// key derived as the agent derives it (asking corosync through `host`); then what makes that
/// key doubtful, as the agent would show it (corosync not answering, the host name, corosync
/// and the key store disagreeing about who this node is: [`crate::whoami`]).
fn devices_and_key(
    args: &Doctor,
    host: &Arc<dyn Host>,
    store: &KeyStore,
) -> Result<Examined, String> {
    let Some(file) = &args.config else {
        return Ok((args.devices.clone(), args.key, None));
    };
    let text = std::fs::read_to_string(file).map_err(|e| {
        format!(
            "{}: {e}; give the agent's configuration file",
            file.display()
        )
    })?;
    let settings = Settings::from_toml_str(&text).map_err(|e| {
        format!(
            "{}: {e}; check it with `prfence agent --check-config`",
            file.display()
        )
    })?;
    let (configured, problem) = match &settings.mode {
        ModeSettings::Watch(w) if args.key.is_none() => {
            match resolve_key(&w.key, settings.command_timeout, host.as_ref()) {
                Ok(our) => (Some(our.key), store_problem(&our, store)),
                Err(e) => (None, Some(format!("this node's key: {e}"))),
            }
        }
        ModeSettings::Watch(_) | ModeSettings::Lease(_) => (None, None),
    };
    Ok((
        settings.devices.iter().map(|d| d.path.clone()).collect(),
        args.key.or(configured),
        problem,
    ))
}

/// What this node knows about one path: its iSCSI initiator port and the target's kind, from
/// discovery and what sysfs says about the path (`sysfs`, read through the [`Host`]).
fn facts(path: &PathInfo, sysfs: PathSysfs) -> PathFacts {
    let not_running = (!path.is_live()).then(|| path.state.to_string());
    if path.protocol == Protocol::Nvme {
        // No SCSI host, vendor or iSCSI session to look up: NVMe registers the host (its host
        // id, READ FULL STATUS's nvme-hostid) on every controller at once.
        return PathFacts {
            not_running,
            nvme_host_id: sysfs.nvme_host_id,
            target: Some(TargetKind::Unknown),
            ..PathFacts::default()
        };
    }
    let PathSysfs {
        host_driver: proc_name,
        vendor,
        ..
    } = sysfs;
    let lio = vendor.as_deref() == Some("LIO-ORG");
    let target = match (lio, proc_name.as_deref(), &path.transport) {
        (true, Some("tcm_loopback"), _) => TargetKind::LioTcmLoop,
        (true, _, Some(_)) => TargetKind::LioIscsi,
        (true, _, None) => TargetKind::Lio,
        (false, ..) => TargetKind::Unknown,
    };
    let session = path.transport.as_ref();
    let (isid, isid_source) = match session {
        Some(s) if s.isid.is_some() => (s.isid.clone(), Some("kernel".to_string())),
        Some(s) if proc_name.as_deref() == Some("iscsi_tcp") => match open_iscsi_isid(&s.session) {
            Some(isid) => (
                Some(isid),
                Some(format!(
                    "inferred: open-iscsi's software sessions (iscsi_tcp) use 00023d followed \
                         by the session number ({})",
                    s.session
                )),
            ),
            None => (None, None),
        },
        _ => (None, None),
    };
    PathFacts {
        initiator: session
            .map(|s| s.initiator.clone())
            .filter(|i| !i.is_empty()),
        isid,
        isid_source,
        not_running,
        nvme_host_id: None,
        target: Some(target),
        target_name: session.map(|s| s.target.clone()).filter(|t| !t.is_empty()),
    }
}

/// open-iscsi builds a software session's ISID from its OUI-format qualifier 0x00023d and the
/// kernel's session number (the kernel does not show the ISID of such sessions).
fn open_iscsi_isid(session: &str) -> Option<String> {
    let number: u64 = session.strip_prefix("session")?.parse().ok()?;
    (number <= 0xff_ffff).then(|| format!("{:012x}", 0x0002_3d00_0000_u64 | number))
}

/// Runs doctor and prints its diagnosis; returns the exit status.
pub fn execute(args: &Doctor, json: bool, policy: Policy, host: &Arc<dyn Host>) -> ExitStatus {
    let (devices, key, key_problem) =
        match devices_and_key(args, host, &KeyStore::from_environment()) {
            Ok(found) => found,
            Err(message) => {
                eprintln!("prfence: {message}");
                return ExitStatus::Usage;
            }
        };
    if devices.is_empty() {
        eprintln!("prfence: no devices given (the configuration lists none)");
        return ExitStatus::Usage;
    }
    // Opened on first use, inside doctor's deadline (an open blocks during SCSI error recovery).
    let open = opener(host, policy);
    let lus_of = |devices: &[PathBuf]| -> Result<Vec<LuTarget<DoctorDevice>>, String> {
        let resolution = host.resolve_each(devices).map_err(|e| e.to_string())?;
        let mut lus: Vec<LuTarget<DoctorDevice>> = resolution
            .lus
            .iter()
            .map(|lu| LuTarget {
                id: lu.id.clone(),
                paths: lu
                    .paths
                    .iter()
                    .map(|p| DoctorPath {
                        transport: OpenPath::new(&p.dev, Arc::clone(&open)),
                        facts: facts(p, host.path_sysfs(p)),
                    })
                    .collect(),
            })
            .collect();
        for unknown in &resolution.unidentified {
            eprintln!("prfence: warning: {}", unknown.error);
            lus.push(LuTarget {
                id: LuId::node_local(&unknown.device),
                paths: vec![DoctorPath {
                    transport: OpenPath::new(&unknown.device, Arc::clone(&open)),
                    facts: PathFacts::default(),
                }],
            });
        }
        Ok(lus)
    };
    let (lus, coordinators) = match (lus_of(&devices), lus_of(&args.coordinators)) {
        (Ok(lus), Ok(coordinators)) => (lus, coordinators),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("prfence: {e}");
            return ExitStatus::Usage;
        }
    };
    let all = || lus.iter().chain(&coordinators);
    super::paths::make_room(all().count(), all().map(|lu| lu.paths.len()).sum());
    // An LU still being read at the deadline is left behind; the process exits without it.
    let result = doctor::doctor_coordinated(
        lus,
        coordinators,
        key,
        crate::worker::left_of(args.deadline),
    );
    match result {
        Ok(diagnosis) => {
            // The failed reads in the CLI's words, now that they are shown.
            let diagnosis = diagnosis.advised(crate::hints::cli);
            let mut status = exit_status(&diagnosis);
            // The agent would not arm on a key in doubt: neither is this node ready.
            if let Some(problem) = &key_problem {
                eprintln!("prfence: NOT READY: {problem}");
                status = ExitStatus::Failure;
            }
            if json {
                println!("{}", json_with_exit(&diagnosis, status));
            } else {
                print!("{}", to_text(&diagnosis));
            }
            status
        }
        Err(e) => {
            eprintln!("prfence: {e}");
            ExitStatus::Usage
        }
    }
}

fn exit_status(diagnosis: &Diagnosis) -> ExitStatus {
    if diagnosis.ready {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    }
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

fn support(s: Support) -> &'static str {
    match s {
        Support::Supported => "yes",
        Support::NotSupported => "not supported",
        Support::Unknown => "unknown",
    }
}

fn lu_text(out: &mut String, lu: &LuDiagnosis) {
    let _ = writeln!(
        out,
        "LU {}{}: {}",
        lu.lu,
        if lu.arbiter {
            " (arbiter)"
        } else if lu.coordinator {
            " (coordinator)"
        } else {
            ""
        },
        if lu.ready { "ready" } else { "NOT READY" }
    );
    let pr = match lu.pr_supported {
        Some(true) => "supported",
        Some(false) => "NOT supported",
        None => "unknown (no path answered)",
    };
    let _ = writeln!(out, "  persistent reservations: {pr}");
    let _ = writeln!(
        out,
        "  PR IN: READ KEYS {}, READ RESERVATION {}, REPORT CAPABILITIES {}, READ FULL STATUS {} \
         (PR OUT is never sent)",
        support(lu.pr_in.read_keys),
        support(lu.pr_in.read_reservation),
        support(lu.pr_in.report_capabilities),
        support(lu.pr_in.read_full_status)
    );
    if let Some(c) = &lu.capabilities {
        let types = match &c.supported_types {
            Some(types) => types
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            None => "not reported (TMV=0)".to_string(),
        };
        let _ = writeln!(out, "  types: {types}");
        let _ = writeln!(
            out,
            "  ALL_TG_PT: {}, APTPL: capable {} active {}, SIP: {}, CRH: {}, ALLOW COMMANDS: {}",
            yes_no(c.atp_c),
            yes_no(c.ptpl_c),
            yes_no(c.ptpl_a),
            yes_no(c.sip_c),
            yes_no(c.crh),
            c.allow_commands
        );
    }
    let paa = match lu.preempt_and_abort.supported {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    };
    let _ = writeln!(
        out,
        "  PREEMPT AND ABORT: {paa} ({})",
        lu.preempt_and_abort.basis
    );
    if let Some(generation) = lu.generation {
        let keys = if lu.keys.is_empty() {
            "none".to_string()
        } else {
            lu.keys
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(out, "  generation {generation}, keys: {keys}");
    }
    match &lu.reservation {
        Some(r) => {
            let _ = write!(out, "  reservation: {} {}", r.key, r.rtype);
            if let Some(holder) = &r.holder {
                let _ = write!(out, ", held by {holder}");
            }
            out.push('\n');
        }
        None if lu.generation.is_some() => out.push_str("  reservation: none\n"),
        None => {}
    }
    for path in &lu.paths {
        let _ = write!(
            out,
            "  path {}: {}",
            path.device,
            if path.reachable {
                "reachable"
            } else {
                "NOT reachable"
            }
        );
        if let Some(initiator) = &path.facts.initiator {
            let _ = write!(out, ", {initiator}");
            if let Some(isid) = &path.facts.isid {
                let _ = write!(out, " ISID {isid}");
                if path.facts.isid_source.as_deref() != Some("kernel") {
                    out.push_str(" (inferred)");
                }
            }
        }
        match (path.registration, path.registered_key, &path.unmatched) {
            (PathRegistration::Matched, Some(key), _) => {
                let _ = write!(out, ", registered with {key}");
            }
            (PathRegistration::NotRegistered, ..) => out.push_str(", not registered"),
            (_, _, why) => {
                let _ = write!(
                    out,
                    "; registration cannot be matched: {}",
                    why.as_deref().unwrap_or("unknown")
                );
            }
        }
        out.push('\n');
    }
    for r in &lu.registrations {
        let _ = write!(
            out,
            "  registration {} {} port {}",
            r.key, r.initiator, r.relative_target_port
        );
        if r.all_tg_pt {
            out.push_str(" all_tg_pt");
        }
        if r.holder {
            out.push_str(" holder");
        }
        if let Some(path) = &r.path {
            let _ = write!(out, " (this node: {path})");
        }
        if r.orphan {
            out.push_str(" (ORPHAN)");
        }
        out.push('\n');
    }
    for f in &lu.findings {
        let label = match f.severity {
            Severity::Problem => "problem",
            Severity::Warning => "warning",
            Severity::Info => "note",
        };
        let _ = write!(out, "  {label}: {}", f.message);
        if !f.remedy.is_empty() {
            let _ = write!(out, ". To do: {}", f.remedy);
        }
        out.push('\n');
    }
}

/// The diagnosis in words.
pub fn to_text(diagnosis: &Diagnosis) -> String {
    let mut out = format!("doctor: {}\n", diagnosis.summary);
    match (diagnosis.can_fence, &diagnosis.coordinators) {
        (Some(can), None) => {
            let _ = writeln!(
                out,
                "this node can fence another: {}",
                if can {
                    "yes (its key is on the arbiter LU through a path of this node)"
                } else {
                    "NO (no path of this node carries its key on the arbiter LU)"
                }
            );
        }
        (can, Some(set)) => {
            if let (Some(can), Some(on)) = (can, set.own_key_on) {
                let _ = writeln!(
                    out,
                    "this node can fence another: {} (its key is on {on} of the {} \
                     coordinators through a path of this node; a fence needs {})",
                    if can { "yes" } else { "NO" },
                    set.lu_set.count,
                    crate::ops::majority(set.lu_set.count)
                );
            }
            let _ = writeln!(
                out,
                "coordinator set: {} (must be the same on every node)",
                set.lu_set
            );
            for finding in &set.findings {
                let _ = writeln!(out, "  PROBLEM: {}; {}", finding.message, finding.remedy);
            }
        }
        (None, None) => {}
    }
    let _ = writeln!(
        out,
        "LU set: {} (must be the same on every node: nodes that name other LUs can pick another \
         arbiter)",
        diagnosis.lu_set
    );
    for lu in &diagnosis.lus {
        lu_text(&mut out, lu);
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Cmd};

    fn doctor_args(args: &[&str]) -> Result<Doctor, clap::Error> {
        match Cli::try_parse_from(args)?.command {
            Cmd::Doctor(d) => Ok(d),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn devices_or_config_but_not_both_nor_neither() {
        assert!(doctor_args(&["prfence", "doctor", "/dev/sdb"]).is_ok());
        assert!(doctor_args(&["prfence", "doctor", "--config", "/etc/x.toml"]).is_ok());
        for bad in [
            &["prfence", "doctor"][..],
            &["prfence", "doctor", "--config", "/etc/x.toml", "/dev/sdb"],
            &["prfence", "doctor", "--key", "0", "/dev/sdb"],
        ] {
            assert_eq!(doctor_args(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn the_config_gives_devices_and_key_value() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "mode = \"watch\"\n[[device]]\npath = \"/dev/sdb\"\n[[device]]\npath = \"/dev/sdc\"\n\
             [key]\nvalue = \"0xab\"\n",
        )
        .unwrap();
        let args = doctor_args(&["prfence", "doctor", "--config", file.to_str().unwrap()]).unwrap();
        let host: Arc<dyn Host> = Arc::new(crate::testing::ModelHost::new());
        let store = KeyStore::new(dir.path().join("cluster"));
        match devices_and_key(&args, &host, &store) {
            Ok((devices, key, problem)) => {
                assert_eq!(
                    devices,
                    vec![PathBuf::from("/dev/sdb"), PathBuf::from("/dev/sdc")]
                );
                assert_eq!(key, Some(Key::new(0xab)));
                assert_eq!(problem, None);
            }
            Err(e) => panic!("{e}"),
        }
        let missing =
            doctor_args(&["prfence", "doctor", "--config", "/nonexistent/a.toml"]).unwrap();
        let host: Arc<dyn Host> = Arc::new(crate::host::SystemHost::new());
        assert_eq!(
            execute(&missing, false, Policy::default(), &host),
            ExitStatus::Usage
        );
    }

    /// Doctor judges a derived key as the agent does: corosync's local node, cross-checked with
    /// the host name and the key fence_pr's `on` stored.
    #[test]
    fn the_config_s_derived_key_is_checked_as_the_agent_checks_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "mode = \"watch\"\n[[device]]\npath = \"/dev/sdb\"\n[key]\nderive = \"fence_scsi\"\n",
        )
        .unwrap();
        let args = doctor_args(&["prfence", "doctor", "--config", file.to_str().unwrap()]).unwrap();
        let store = KeyStore::new(dir.path().join("cluster"));
        let node = |name: &str| -> Arc<dyn Host> {
            let host = crate::testing::ModelHost::new().with_hostname(name);
            host.set_corosync("totem.cluster_name", "totem.cluster_name (str) = lab\n");
            host.set_corosync(
                "nodelist",
                "nodelist.local_node_pos (u32) = 1\nnodelist.node.0.name (str) = node1\n\
                 nodelist.node.1.name (str) = node2\n",
            );
            Arc::new(host)
        };
        let (_, key, problem) = devices_and_key(&args, &node("node2"), &store).unwrap();
        let key = key.expect("derived");
        assert_eq!(key.get() & 0xffff, 1);
        assert_eq!(problem, None);
        // A host named after another node: no key trusted, both names said.
        let (_, key, problem) = devices_and_key(&args, &node("node1"), &store).unwrap();
        let problem = problem.expect("a conflict");
        assert!(key.is_none() && problem.contains("\"node1\"") && problem.contains("\"node2\""));
        // The key store holds another key.
        store.write_key(key_of_node1()).unwrap();
        let (_, _, problem) = devices_and_key(&args, &node("node2"), &store).unwrap();
        assert!(problem.is_some_and(|p| p.contains("key store")));
    }

    fn key_of_node1() -> u64 {
        let list = crate::keys::Nodelist::parse("nodelist.node.0.name (str) = node1\n");
        crate::keys::derive_key("lab", &list, "node1", crate::keys::KeyScheme::FenceScsiId).unwrap()
    }

    #[test]
    fn open_iscsi_isids_follow_the_session_number() {
        assert_eq!(open_iscsi_isid("session3").as_deref(), Some("00023d000003"));
        assert_eq!(open_iscsi_isid("session"), None);
        assert_eq!(open_iscsi_isid("sessionx"), None);
    }
}
