//! Pins the admin CLI's output: representative results of every command, rendered as text and as
//! JSON, compared with the exact strings scripts and people see. Refactors of the renderers must
//! keep these byte-identical.

use std::path::{Path, PathBuf};

use sg_io::{ScsiStatus, Sense};

use crate::ops::{LuReport, Outcome, PathReport, PathUse, Report, ReservationView, Verdict};
use crate::pr::{
    Capabilities, FullStatus, Key, PrInAction, PrOutAction, ReadKeys, ReadReservation,
    Registration, Reservation, ReservationType, Scope, TransportId,
};
use crate::transport::{
    Command, CommandError, ErrorKind, PrOutReport, ScsiDetail, TransportDetail,
};

use super::fencing;
use super::render::{Answer, Reported, to_json, to_text};

const DEV: &str = "/dev/sdb";

fn reported(outcome: Answer) -> Reported {
    Reported {
        outcome,
        unit_attentions: Vec::new(),
    }
}

fn text(outcome: Answer) -> String {
    to_text(Path::new(DEV), &reported(outcome))
}

fn json(outcome: Answer) -> String {
    to_json(Path::new(DEV), &Ok(reported(outcome))).to_string()
}

fn iscsi(name: &str, isid: Option<&str>) -> TransportId {
    TransportId::Iscsi {
        name: name.to_string(),
        isid: isid.map(str::to_string),
    }
}

fn keys(list: &[u64]) -> Answer {
    Answer::Keys(ReadKeys {
        generation: 7,
        keys: list.iter().map(|&k| Key::new(k)).collect(),
    })
}

#[test]
fn keys_output_is_pinned() {
    assert_eq!(
        text(keys(&[])),
        "/dev/sdb: generation 7, no keys registered\n"
    );
    assert_eq!(
        text(keys(&[0xa, 0xbeef])),
        "/dev/sdb: generation 7, 2 key(s) registered\n  0x000000000000000a\n  0x000000000000beef\n"
    );
    assert_eq!(
        json(keys(&[])),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"generation":7,"keys":[]}"#
    );
    assert_eq!(
        json(keys(&[0xa, 0xbeef])),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"generation":7,"keys":["0x000000000000000a","0x000000000000beef"]}"#
    );
}

fn reservation(r: Option<(u64, ReservationType, Scope)>) -> Answer {
    Answer::Reservation(ReadReservation {
        generation: 3,
        reservation: r.map(|(key, rtype, scope)| Reservation {
            key: Key::new(key),
            rtype,
            scope,
        }),
    })
}

#[test]
fn reservation_output_is_pinned() {
    assert_eq!(
        text(reservation(None)),
        "/dev/sdb: generation 3, no reservation\n"
    );
    assert_eq!(
        json(reservation(None)),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"generation":3,"reservation":null}"#
    );
    let lu = reservation(Some((
        0xb,
        ReservationType::WriteExclusiveRegistrantsOnly,
        Scope::LogicalUnit,
    )));
    assert_eq!(
        text(lu),
        "/dev/sdb: generation 3, reserved by key 0x000000000000000b, type wero (Write Exclusive, Registrants Only), scope lu\n"
    );
    let lu = reservation(Some((
        0xb,
        ReservationType::WriteExclusiveRegistrantsOnly,
        Scope::LogicalUnit,
    )));
    assert_eq!(
        json(lu),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"generation":3,"reservation":{"key":"0x000000000000000b","type":"wero","scope":"lu"}}"#
    );
    let other = || {
        reservation(Some((
            0,
            ReservationType::ExclusiveAccessAllRegistrants,
            Scope::Other(0xc),
        )))
    };
    assert_eq!(
        text(other()),
        "/dev/sdb: generation 3, reserved by key 0x0000000000000000, type eaar (Exclusive Access, All Registrants), scope 0xc\n"
    );
    assert_eq!(
        json(other()),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"generation":3,"reservation":{"key":"0x0000000000000000","type":"eaar","scope":"0xc"}}"#
    );
}

fn capabilities(types: Option<Vec<ReservationType>>) -> Answer {
    Answer::Capabilities(Capabilities {
        rlr_c: false,
        crh: true,
        sip_c: true,
        atp_c: true,
        ptpl_c: true,
        tmv: types.is_some(),
        allow_commands: 1,
        ptpl_a: false,
        supported_types: types,
    })
}

#[test]
fn nvme_capabilities_say_where_they_come_from() {
    let nvme = Answer::NvmeCapabilities(Capabilities {
        rlr_c: false,
        crh: false,
        sip_c: false,
        atp_c: false,
        ptpl_c: false,
        tmv: true,
        allow_commands: 0,
        ptpl_a: false,
        supported_types: Some(vec![ReservationType::WriteExclusiveRegistrantsOnly]),
    });
    let shown = text(nvme);
    assert!(
        shown.starts_with("/dev/sdb:\n  (NVMe has no REPORT CAPABILITIES: the types and persist through power loss come from Identify Namespace (RESCAP);")
            && shown.ends_with("  allow commands: 0\n  types: wero\n"),
        "{shown}"
    );
}

#[test]
fn capabilities_output_is_pinned() {
    let types = || {
        Some(vec![
            ReservationType::WriteExclusive,
            ReservationType::ExclusiveAccess,
            ReservationType::WriteExclusiveRegistrantsOnly,
        ])
    };
    assert_eq!(
        text(capabilities(types())),
        "/dev/sdb:\n  persist through power loss: capable yes, active no\n  all target ports: yes\n  specify initiator ports: yes\n  compatible reservation handling: yes\n  replace lost reservation: no\n  allow commands: 1\n  types: we ea wero\n"
    );
    assert_eq!(
        json(capabilities(types())),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"capabilities":{"replace_lost_reservation":false,"compatible_reservation_handling":true,"specify_initiator_ports":true,"all_target_ports":true,"persist_through_power_loss":true,"persist_through_power_loss_active":false,"allow_commands":1,"types":["we","ea","wero"]}}"#
    );
    assert_eq!(
        text(capabilities(None)),
        "/dev/sdb:\n  persist through power loss: capable yes, active no\n  all target ports: yes\n  specify initiator ports: yes\n  compatible reservation handling: yes\n  replace lost reservation: no\n  allow commands: 1\n  types: not reported\n"
    );
    assert_eq!(
        json(capabilities(None)),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"capabilities":{"replace_lost_reservation":false,"compatible_reservation_handling":true,"specify_initiator_ports":true,"all_target_ports":true,"persist_through_power_loss":true,"persist_through_power_loss_active":false,"allow_commands":1,"types":null}}"#
    );
}

fn full_status() -> Answer {
    Answer::FullStatus(FullStatus {
        generation: 12,
        registrations: vec![
            Registration {
                key: Key::new(0xa),
                all_tg_pt: false,
                holder: true,
                scope: Some(Scope::LogicalUnit),
                rtype: Some(ReservationType::WriteExclusiveRegistrantsOnly),
                relative_target_port: 1,
                transport_id: iscsi("iqn.2024-01.example:node1", Some("23d000000")),
            },
            Registration {
                key: Key::new(0xb),
                all_tg_pt: true,
                holder: true,
                scope: None,
                rtype: None,
                relative_target_port: 2,
                transport_id: TransportId::Sas {
                    address: 0x5000_c500_1234_5678,
                },
            },
            Registration {
                key: Key::new(0xc),
                all_tg_pt: false,
                holder: false,
                scope: Some(Scope::LogicalUnit),
                rtype: Some(ReservationType::WriteExclusive),
                relative_target_port: 3,
                transport_id: TransportId::FibreChannel {
                    n_port_name: 0x2100_0024_ff00_0001,
                },
            },
        ],
    })
}

#[test]
fn full_status_output_is_pinned() {
    assert_eq!(
        text(full_status()),
        "/dev/sdb: generation 12, 3 registration(s)\n  0x000000000000000a iqn.2024-01.example:node1,i,0x23d000000 port 1, holder (wero)\n  0x000000000000000b sas,0x5000c50012345678 port 2, all target ports, holder\n  0x000000000000000c fc,0x21000024ff000001 port 3\n"
    );
    assert_eq!(
        json(full_status()),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"generation":12,"registrations":[{"key":"0x000000000000000a","holder":true,"type":"wero","all_target_ports":false,"relative_target_port":1,"transport_id":"iqn.2024-01.example:node1,i,0x23d000000"},{"key":"0x000000000000000b","holder":true,"type":null,"all_target_ports":true,"relative_target_port":2,"transport_id":"sas,0x5000c50012345678"},{"key":"0x000000000000000c","holder":false,"type":null,"all_target_ports":false,"relative_target_port":3,"transport_id":"fc,0x21000024ff000001"}]}"#
    );
    let empty = || {
        Answer::FullStatus(FullStatus {
            generation: 0,
            registrations: Vec::new(),
        })
    };
    assert_eq!(text(empty()), "/dev/sdb: generation 0, 0 registration(s)\n");
    assert_eq!(
        json(empty()),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"generation":0,"registrations":[]}"#
    );
}

fn done(action: PrOutAction, confirmed_by_reread: bool) -> Answer {
    Answer::Done {
        action,
        report: PrOutReport {
            confirmed_by_reread,
            ..PrOutReport::default()
        },
    }
}

#[test]
fn pr_out_commands_output_is_pinned() {
    let mut texts = String::new();
    let mut jsons = String::new();
    for action in PrOutAction::ALL {
        texts.push_str(&text(done(action, false)));
        jsons.push_str(&json(done(action, false)));
        jsons.push('\n');
    }
    assert_eq!(
        texts,
        "/dev/sdb: REGISTER done\n/dev/sdb: RESERVE done\n/dev/sdb: RELEASE done\n/dev/sdb: CLEAR done\n/dev/sdb: PREEMPT done\n/dev/sdb: PREEMPT AND ABORT done\n/dev/sdb: REGISTER AND IGNORE EXISTING KEY done\n/dev/sdb: REGISTER AND MOVE done\n"
    );
    assert_eq!(
        jsons,
        concat!(
            r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"REGISTER","confirmed_by_reread":false}"#,
            "\n",
            r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"RESERVE","confirmed_by_reread":false}"#,
            "\n",
            r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"RELEASE","confirmed_by_reread":false}"#,
            "\n",
            r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"CLEAR","confirmed_by_reread":false}"#,
            "\n",
            r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"PREEMPT","confirmed_by_reread":false}"#,
            "\n",
            r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"PREEMPT AND ABORT","confirmed_by_reread":false}"#,
            "\n",
            r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"REGISTER AND IGNORE EXISTING KEY","confirmed_by_reread":false}"#,
            "\n",
            r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"REGISTER AND MOVE","confirmed_by_reread":false}"#,
            "\n",
        )
    );
    assert_eq!(
        text(done(PrOutAction::Register, true)),
        "/dev/sdb: REGISTER done (the target answered NOT READY, a re-read shows it applied)\n"
    );
    assert_eq!(
        json(done(PrOutAction::Register, true)),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":[],"action":"REGISTER","confirmed_by_reread":true}"#
    );
}

#[test]
fn unit_attentions_are_pinned() {
    let r = || Reported {
        outcome: keys(&[0xa]),
        unit_attentions: vec![
            "2Ah/03h RESERVATIONS PREEMPTED".to_string(),
            "29h/00h POWER ON".to_string(),
        ],
    };
    assert_eq!(
        to_text(Path::new(DEV), &r()),
        "/dev/sdb: generation 7, 1 key(s) registered\n  0x000000000000000a\n  unit attentions consumed: 2Ah/03h RESERVATIONS PREEMPTED, 29h/00h POWER ON\n"
    );
    assert_eq!(
        to_json(Path::new(DEV), &Ok(r())).to_string(),
        r#"{"device":"/dev/sdb","ok":true,"unit_attentions":["2Ah/03h RESERVATIONS PREEMPTED","29h/00h POWER ON"],"generation":7,"keys":["0x000000000000000a"]}"#
    );
}

#[test]
fn errors_are_pinned() {
    let open = CommandError::without_completion(
        Path::new(DEV),
        Command::Open,
        ErrorKind::Open,
        "No such file or directory (os error 2)",
    );
    assert_eq!(
        to_json(Path::new(DEV), &Err(open)).to_string(),
        r#"{"device":"/dev/sdb","ok":false,"error":{"kind":"open","message":"/dev/sdb: open failed: No such file or directory (os error 2). Hint: the device could not be opened or used: each device argument must name a disk (/dev/sdX, /dev/sgN, /dev/nvmeXnY, or a /dev/disk/by-id or /dev/mapper link to one) readable by this user (group `disk`), and persistent reservations need CAP_SYS_RAWIO on SCSI (SG_IO) and CAP_SYS_ADMIN on NVMe (block PR ioctls, passthrough) (root has both; or setpriv/AmbientCapabilities=CAP_SYS_RAWIO or CAP_SYS_ADMIN)","sense":null,"command":"open","status":null}}"#
    );
    let mut conflict = CommandError::without_completion(
        Path::new(DEV),
        Command::PrOut(PrOutAction::Reserve),
        ErrorKind::ReservationConflict,
        "the target refused",
    );
    conflict.transport = Some(TransportDetail::Scsi(ScsiDetail::with_status(
        ScsiStatus::RESERVATION_CONFLICT,
    )));
    assert_eq!(
        to_json(Path::new(DEV), &Err(conflict)).to_string(),
        r#"{"device":"/dev/sdb","ok":false,"error":{"kind":"reservation_conflict","message":"/dev/sdb: PERSISTENT RESERVE OUT (RESERVE) failed: the target refused; status RESERVATION CONFLICT (0x18). Hint: another initiator holds the reservation, or this path's key is not registered (was this node fenced?); check with `prfence keys` and `prfence reservation`","sense":null,"command":"PERSISTENT RESERVE OUT (RESERVE)","status":"RESERVATION CONFLICT (0x18)"}}"#
    );
    let mut sensed = CommandError::without_completion(
        Path::new(DEV),
        Command::PrIn(PrInAction::ReadKeys),
        ErrorKind::InvalidField,
        "ILLEGAL REQUEST",
    );
    sensed.transport = Some(TransportDetail::Scsi(ScsiDetail {
        sense: Sense::parse(&[
            0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0,
        ]),
        ..ScsiDetail::with_status(ScsiStatus::CHECK_CONDITION)
    }));
    assert_eq!(
        to_json(Path::new(DEV), &Err(sensed)).to_string(),
        r#"{"device":"/dev/sdb","ok":false,"error":{"kind":"invalid_field","message":"/dev/sdb: PERSISTENT RESERVE IN (READ KEYS) failed: ILLEGAL REQUEST; status CHECK CONDITION (0x02); sense ILLEGAL REQUEST, 24h/00h invalid field in CDB. Hint: the target rejected a field: the service action, reservation type or flag is unsupported, or does not match the LU's state; see `prfence capabilities` and `prfence reservation`","sense":"ILLEGAL REQUEST, 24h/00h invalid field in CDB","command":"PERSISTENT RESERVE IN (READ KEYS)","status":"CHECK CONDITION (0x02)"}}"#
    );
}

fn engine_report(command: &'static str, outcome: Outcome) -> Report {
    Report {
        command,
        outcome,
        summary: "a summary for people".to_string(),
        lus: vec![
            LuReport {
                lu: "naa.6001405aaaa".into(),
                ok: true,
                verdict: Verdict::VictimRemoved,
                paths: vec![
                    PathReport {
                        device: "/dev/sdb".to_string(),
                        state: PathUse::Ok,
                        error: None,
                    },
                    PathReport {
                        device: "/dev/sdc".to_string(),
                        state: PathUse::Dead,
                        error: Some("timed out".into()),
                    },
                    PathReport {
                        device: "/dev/sdd".to_string(),
                        state: PathUse::Unused,
                        error: None,
                    },
                    PathReport {
                        device: "/dev/sde".to_string(),
                        state: PathUse::Failed,
                        error: None,
                    },
                ],
                keys: Some(vec![Key::new(0xa)]),
                reservation: Some(ReservationView {
                    key: Key::new(0xa),
                    rtype: ReservationType::WriteExclusiveRegistrantsOnly,
                }),
                generation: Some(9),
                notes: vec!["path /dev/sdc looks dead".into()],
                error: None,
            },
            LuReport {
                lu: "naa.6001405bbbb".into(),
                ok: false,
                verdict: Verdict::Failed,
                paths: vec![],
                keys: Some(vec![]),
                reservation: None,
                generation: None,
                notes: vec![],
                error: Some("it broke".into()),
            },
            LuReport {
                lu: "/dev/sdf".into(),
                ok: false,
                verdict: Verdict::Skipped,
                paths: vec![],
                keys: None,
                reservation: None,
                generation: None,
                notes: vec![],
                error: None,
            },
        ],
    }
}

#[test]
fn fencing_report_output_is_pinned() {
    let report = engine_report("fence", Outcome::Failure);
    assert_eq!(
        fencing::to_text(&report),
        "fence: a summary for people\n  OK   naa.6001405aaaa: victim removed\n       keys: 0x000000000000000a\n       reservation: 0x000000000000000a wero\n       generation: 9\n       path /dev/sdb: ok\n       path /dev/sdc: dead (timed out)\n       path /dev/sdd: unused\n       path /dev/sde: failed\n       note: path /dev/sdc looks dead\n  FAIL naa.6001405bbbb: failed\n       keys: none\n       reservation: none\n       error: it broke\n  FAIL /dev/sdf: skipped\n"
    );
    assert_eq!(
        fencing::to_json(&report).to_string(),
        r#"{"command":"fence","outcome":"failure","summary":"a summary for people","lus":[{"lu":"naa.6001405aaaa","ok":true,"verdict":"victim_removed","paths":[{"device":"/dev/sdb","state":"ok"},{"device":"/dev/sdc","state":"dead","error":"timed out"},{"device":"/dev/sdd","state":"unused"},{"device":"/dev/sde","state":"failed"}],"keys":["0x000000000000000a"],"reservation":{"key":"0x000000000000000a","type":"wero"},"generation":9,"notes":["path /dev/sdc looks dead"]},{"lu":"naa.6001405bbbb","ok":false,"verdict":"failed","paths":[],"keys":[],"reservation":null,"generation":null,"notes":[],"error":"it broke"},{"lu":"/dev/sdf","ok":false,"verdict":"skipped","paths":[],"keys":null,"reservation":null,"generation":null,"notes":[]}],"exit_status":1}"#
    );
    let mut exit_statuses = String::new();
    for outcome in [
        Outcome::Success,
        Outcome::ThisNodeFenced,
        Outcome::Off,
        Outcome::Partial,
        Outcome::Failure,
    ] {
        let mut report = engine_report("status", outcome);
        report.lus.clear();
        exit_statuses.push_str(&fencing::to_json(&report).to_string());
        exit_statuses.push('\n');
    }
    assert_eq!(
        exit_statuses,
        concat!(
            r#"{"command":"status","outcome":"success","summary":"a summary for people","lus":[],"exit_status":0}"#,
            "\n",
            r#"{"command":"status","outcome":"this_node_fenced","summary":"a summary for people","lus":[],"exit_status":4}"#,
            "\n",
            r#"{"command":"status","outcome":"off","summary":"a summary for people","lus":[],"exit_status":2}"#,
            "\n",
            r#"{"command":"status","outcome":"partial","summary":"a summary for people","lus":[],"exit_status":1}"#,
            "\n",
            r#"{"command":"status","outcome":"failure","summary":"a summary for people","lus":[],"exit_status":1}"#,
            "\n",
        )
    );
}

#[test]
fn the_device_path_is_printed_as_given() {
    let device = PathBuf::from("/dev/disk/by-id/wwn-0x6001405aaaa");
    let r = reported(keys(&[]));
    assert_eq!(
        to_text(&device, &r),
        "/dev/disk/by-id/wwn-0x6001405aaaa: generation 7, no keys registered\n"
    );
}

#[test]
fn engine_reports_carry_the_cli_hints_the_transport_no_longer_gives() {
    use std::sync::{Arc, Mutex};

    use crate::exec::ScsiPr;
    use crate::ops::{Limits, LuTarget};
    use crate::spc_model::{Injected, ModelDevice, ModelLu, Quirks};
    use crate::transport::Policy;

    let mut lu = ModelLu::new(Quirks::lio());
    let nexus = lu.connect(iscsi("iqn.2026-11.lab:nodea", Some("0x1")), 1);
    lu.fail_next(nexus, Injected::Timeout, 100);
    let lu = Arc::new(Mutex::new(lu));
    let path = ScsiPr::new(ModelDevice::new(lu, nexus, DEV), Policy::default());
    let targets = vec![LuTarget {
        id: "naa.6001405aaaa".into(),
        paths: vec![path],
    }];
    let report = crate::ops::status(targets, Key::new(0xa), Limits::default()).unwrap();
    // The engine keeps the error as data; the CLI advises where it shows the report.
    let json = super::fencing::to_json(&report);
    let text = super::fencing::to_text(&report);
    let error = json["lus"][0]["paths"][0]["error"].as_str().unwrap();
    assert!(
        error.ends_with(
            ". Hint: no answer within the command timeout; the path may be dead: check the \
             session (iscsiadm -m session, multipath -ll, nvme list-subsys) or raise --timeout"
        ),
        "{error}"
    );
    assert!(text.contains(error), "{text}");
    let opened = super::hints::hinted(&CommandError::without_completion(
        Path::new(DEV),
        Command::Open,
        ErrorKind::Open,
        "No such file or directory (os error 2)",
    ));
    assert!(opened.to_string().ends_with(
        "(root has both; or setpriv/AmbientCapabilities=CAP_SYS_RAWIO or CAP_SYS_ADMIN)"
    ));
}

/// `prfence doctor`'s words and JSON for one LU: node A registered through one of its two
/// sessions and holding the reservation, node B registered.
fn doctor_diagnosis() -> crate::ops::doctor::Diagnosis {
    use std::sync::{Arc, Mutex};

    use crate::exec::ScsiPr;
    use crate::ops::LuTarget;
    use crate::ops::doctor::{DoctorPath, PathFacts, TargetKind, doctor};
    use crate::pr::{PrOut, ReservationType};
    use crate::spc_model::{ModelDevice, ModelLu, Quirks};
    use crate::transport::Policy;

    let (a, b) = (Key::new(0xa), Key::new(0xb));
    let mut lu = ModelLu::new(Quirks::lio());
    let a1 = lu.connect(iscsi("iqn.2026-11.lab:nodea", Some("23d000001")), 1);
    let a2 = lu.connect(iscsi("iqn.2026-11.lab:nodea", Some("23d000002")), 1);
    let b1 = lu.connect(iscsi("iqn.2026-11.lab:nodeb", Some("23d000003")), 1);
    lu.pr_out(a1, &PrOut::register_ignore(a)).unwrap();
    lu.pr_out(
        a1,
        &PrOut::reserve(a, ReservationType::WriteExclusiveRegistrantsOnly),
    )
    .unwrap();
    lu.pr_out(b1, &PrOut::register_ignore(b)).unwrap();
    let lu = Arc::new(Mutex::new(lu));
    let path = |nexus, dev: &str, isid: &str| DoctorPath {
        transport: ScsiPr::new(
            ModelDevice::new(Arc::clone(&lu), nexus, dev),
            Policy::default(),
        ),
        facts: PathFacts {
            initiator: Some("iqn.2026-11.lab:nodea".to_string()),
            isid: Some(isid.to_string()),
            isid_source: Some("kernel".to_string()),
            not_running: None,
            nvme_host_id: None,
            target: Some(TargetKind::LioIscsi),
            target_name: Some("iqn.2026-11.lab:target".to_string()),
        },
    };
    let lus = vec![LuTarget {
        id: "naa.6001405aaaa".into(),
        paths: vec![
            path(a1, "/dev/sdb", "23d000001"),
            path(a2, "/dev/sdc", "23d000002"),
        ],
    }];
    doctor(lus, Some(a), std::time::Duration::from_secs(10)).unwrap()
}

#[test]
fn doctor_output_is_pinned() {
    let diagnosis = doctor_diagnosis();
    let text = super::doctor::to_text(&diagnosis);
    let json = serde_json::to_string(&diagnosis).unwrap();
    assert_eq!(text, DOCTOR_TEXT);
    assert_eq!(json, DOCTOR_JSON);
}

const DOCTOR_TEXT: &str = r#"doctor: not ready to fence with 0x000000000000000a: problems on naa.6001405aaaa
this node can fence another: yes (its key is on the arbiter LU through a path of this node)
LU set: 1 LU, arbiter naa.6001405aaaa, fingerprint d059f9f95a2947e0 (must be the same on every node: nodes that name other LUs can pick another arbiter)
LU naa.6001405aaaa (arbiter): NOT READY
  persistent reservations: supported
  PR IN: READ KEYS yes, READ RESERVATION yes, REPORT CAPABILITIES yes, READ FULL STATUS yes (PR OUT is never sent)
  types: we ea wero earo wear eaar
  ALL_TG_PT: yes, APTPL: capable yes active no, SIP: yes, CRH: yes, ALLOW COMMANDS: 1
  PREEMPT AND ABORT: yes (REPORT CAPABILITIES has no field for PREEMPT AND ABORT and doctor never sends it; known behaviour: LIO over iSCSI performs it (queued writes of the victim are refused once it has run))
  generation 2, keys: 0x000000000000000a 0x000000000000000b
  reservation: 0x000000000000000a wero, held by iqn.2026-11.lab:nodea,i,0x23d000001
  path /dev/sdb: reachable, iqn.2026-11.lab:nodea ISID 23d000001, registered with 0x000000000000000a
  path /dev/sdc: reachable, iqn.2026-11.lab:nodea ISID 23d000002, not registered
  registration 0x000000000000000a iqn.2026-11.lab:nodea,i,0x23d000001 port 1 holder (this node: /dev/sdb)
  registration 0x000000000000000b iqn.2026-11.lab:nodeb,i,0x23d000003 port 1
  problem: path /dev/sdc is not registered (no registration for its initiator port). To do: run `prfence unfence` on this node to register every path
"#;
const DOCTOR_JSON: &str = r#"{"key":"0x000000000000000a","ready":false,"can_fence":true,"summary":"not ready to fence with 0x000000000000000a: problems on naa.6001405aaaa","lu_set":{"count":1,"arbiter":"naa.6001405aaaa","fingerprint":"d059f9f95a2947e0","unidentified":0},"lus":[{"lu":"naa.6001405aaaa","arbiter":true,"ready":false,"paths":[{"device":"/dev/sdb","reachable":true,"initiator":"iqn.2026-11.lab:nodea","isid":"23d000001","isid_source":"kernel","registered_key":"0x000000000000000a","registration":"matched"},{"device":"/dev/sdc","reachable":true,"initiator":"iqn.2026-11.lab:nodea","isid":"23d000002","isid_source":"kernel","registration":"not_registered"}],"pr_supported":true,"pr_in":{"read_keys":"supported","read_reservation":"supported","report_capabilities":"supported","read_full_status":"supported"},"capabilities":{"rlr_c":false,"crh":true,"sip_c":true,"atp_c":true,"ptpl_c":true,"tmv":true,"allow_commands":1,"ptpl_a":false,"supported_types":["we","ea","wero","earo","wear","eaar"]},"preempt_and_abort":{"supported":true,"basis":"REPORT CAPABILITIES has no field for PREEMPT AND ABORT and doctor never sends it; known behaviour: LIO over iSCSI performs it (queued writes of the victim are refused once it has run)"},"generation":2,"keys":["0x000000000000000a","0x000000000000000b"],"reservation":{"key":"0x000000000000000a","type":"wero","scope":"lu","holder":"iqn.2026-11.lab:nodea,i,0x23d000001"},"registrations":[{"key":"0x000000000000000a","initiator":"iqn.2026-11.lab:nodea,i,0x23d000001","relative_target_port":1,"all_tg_pt":false,"holder":true,"path":"/dev/sdb","orphan":false},{"key":"0x000000000000000b","initiator":"iqn.2026-11.lab:nodeb,i,0x23d000003","relative_target_port":1,"all_tg_pt":false,"holder":false,"orphan":false}],"own_key_registered":true,"findings":[{"severity":"problem","message":"path /dev/sdc is not registered (no registration for its initiator port)","remedy":"run `prfence unfence` on this node to register every path"}]}]}"#;
