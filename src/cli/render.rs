//! Text and JSON rendering of per-device results. The JSON shape is an interface: scripts parse
//! it, so fields are only ever added.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;

use crate::pr::{
    Capabilities, FullStatus, Key, PrOutAction, ReadKeys, ReadReservation, ReservationType, Scope,
    TransportId,
};
use crate::transport::{CommandError, ErrorKind, PrOutReport};

use super::hints;

/// The result of one command on one device.
#[derive(Debug)]
pub enum Answer {
    Keys(ReadKeys),
    Reservation(ReadReservation),
    Capabilities(Capabilities),
    /// An NVMe namespace's: built from Identify Namespace (RESCAP), which has no field for most
    /// of what REPORT CAPABILITIES says; rendered with a note that says so.
    NvmeCapabilities(Capabilities),
    FullStatus(FullStatus),
    Done {
        action: PrOutAction,
        report: PrOutReport,
    },
}

/// An outcome with the unit attentions consumed on the way (a read can be the first command a
/// preempted node sends, and then the 2Ah/05h it consumed is the news).
#[derive(Debug)]
pub struct Reported {
    pub outcome: Answer,
    pub unit_attentions: Vec<String>,
}

pub fn print(json: bool, devices: &[PathBuf], results: &[Result<Reported, CommandError>]) {
    if json {
        let array: Vec<Value> = devices
            .iter()
            .zip(results)
            .map(|(d, r)| to_json(d, r))
            .collect();
        println!("{}", Value::Array(array));
        return;
    }
    for (device, result) in devices.iter().zip(results) {
        match result {
            Ok(reported) => print!("{}", to_text(device, reported)),
            Err(e) => eprintln!("prfence: {}", hints::hinted(e)),
        }
    }
}

/// One device's entry in the JSON array. Field names and order are the interface; they differ
/// from the codec types' own (e.g. `type`, `all_target_ports`), so these views borrow from them.
#[derive(Serialize)]
#[serde(untagged)]
enum DeviceJson<'a> {
    Failed {
        device: String,
        ok: bool,
        error: ErrorJson,
    },
    Done {
        device: String,
        ok: bool,
        unit_attentions: &'a [String],
        #[serde(flatten)]
        outcome: OutcomeJson<'a>,
    },
}

#[derive(Serialize)]
struct ErrorJson {
    kind: ErrorKind,
    message: String,
    sense: Option<String>,
    command: String,
    status: Option<String>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum OutcomeJson<'a> {
    /// The codec's own shape: `generation`, `keys`.
    Keys(&'a ReadKeys),
    Reservation {
        generation: u32,
        reservation: Option<ReservationJson>,
    },
    Capabilities {
        capabilities: CapabilitiesJson<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<&'static str>,
    },
    FullStatus {
        generation: u32,
        registrations: Vec<RegistrationJson<'a>>,
    },
    Done {
        action: &'static str,
        confirmed_by_reread: bool,
    },
}

#[derive(Serialize)]
struct ReservationJson {
    key: Key,
    #[serde(rename = "type")]
    rtype: ReservationType,
    scope: Scope,
}

#[derive(Serialize)]
struct CapabilitiesJson<'a> {
    replace_lost_reservation: bool,
    compatible_reservation_handling: bool,
    specify_initiator_ports: bool,
    all_target_ports: bool,
    persist_through_power_loss: bool,
    persist_through_power_loss_active: bool,
    allow_commands: u8,
    types: Option<&'a [ReservationType]>,
}

#[derive(Serialize)]
struct RegistrationJson<'a> {
    key: Key,
    holder: bool,
    /// Only the holder's type means anything.
    #[serde(rename = "type")]
    rtype: Option<ReservationType>,
    all_target_ports: bool,
    relative_target_port: u16,
    transport_id: &'a TransportId,
}

/// What an NVMe namespace's capabilities are, said where they are shown.
const NVME_CAPABILITIES: &str = "NVMe has no REPORT CAPABILITIES: the types and persist through \
     power loss come from Identify Namespace (RESCAP); NVMe has no all target ports, specify \
     initiator ports, compatible reservation handling, replace lost reservation or allow \
     commands (a registration covers every controller of a host), shown as no and 0";

fn outcome_json(outcome: &Answer) -> OutcomeJson<'_> {
    match outcome {
        Answer::Keys(k) => OutcomeJson::Keys(k),
        Answer::Reservation(r) => OutcomeJson::Reservation {
            generation: r.generation,
            reservation: r.reservation.as_ref().map(|res| ReservationJson {
                key: res.key,
                rtype: res.rtype,
                scope: res.scope,
            }),
        },
        Answer::Capabilities(c) | Answer::NvmeCapabilities(c) => OutcomeJson::Capabilities {
            note: matches!(outcome, Answer::NvmeCapabilities(_)).then_some(NVME_CAPABILITIES),
            capabilities: CapabilitiesJson {
                replace_lost_reservation: c.rlr_c,
                compatible_reservation_handling: c.crh,
                specify_initiator_ports: c.sip_c,
                all_target_ports: c.atp_c,
                persist_through_power_loss: c.ptpl_c,
                persist_through_power_loss_active: c.ptpl_a,
                allow_commands: c.allow_commands,
                types: c.supported_types.as_deref(),
            },
        },
        Answer::FullStatus(f) => OutcomeJson::FullStatus {
            generation: f.generation,
            registrations: f
                .registrations
                .iter()
                .map(|r| RegistrationJson {
                    key: r.key,
                    holder: r.holder,
                    rtype: r.rtype.filter(|_| r.holder),
                    all_target_ports: r.all_tg_pt,
                    relative_target_port: r.relative_target_port,
                    transport_id: &r.transport_id,
                })
                .collect(),
        },
        Answer::Done { action, report } => OutcomeJson::Done {
            action: action.name(),
            confirmed_by_reread: report.confirmed_by_reread,
        },
    }
}

pub fn to_json(device: &std::path::Path, result: &Result<Reported, CommandError>) -> Value {
    let device = device.display().to_string();
    let entry = match result {
        Err(e) => DeviceJson::Failed {
            device,
            ok: false,
            error: ErrorJson {
                kind: e.kind,
                message: hints::hinted(e).to_string(),
                sense: e.sense_text(),
                command: e.command.to_string(),
                status: e.status_text(),
            },
        },
        Ok(Reported {
            outcome,
            unit_attentions,
        }) => DeviceJson::Done {
            device,
            ok: true,
            unit_attentions,
            outcome: outcome_json(outcome),
        },
    };
    // Every field is a string, number, bool, null or list of them: serializing cannot fail.
    serde_json::to_value(entry).unwrap_or_default()
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

pub fn to_text(device: &std::path::Path, reported: &Reported) -> String {
    let mut s = outcome_text(device, &reported.outcome);
    if !reported.unit_attentions.is_empty() {
        // Writing to a String cannot fail.
        let _ = writeln!(
            s,
            "  unit attentions consumed: {}",
            reported.unit_attentions.join(", ")
        );
    }
    s
}

fn outcome_text(device: &std::path::Path, outcome: &Answer) -> String {
    let d = device.display();
    let mut s = String::new();
    // Writing to a String cannot fail; the results are ignored on purpose.
    match outcome {
        Answer::Keys(k) if k.keys.is_empty() => {
            let _ = writeln!(s, "{d}: generation {}, no keys registered", k.generation);
        }
        Answer::Keys(k) => {
            let _ = writeln!(
                s,
                "{d}: generation {}, {} key(s) registered",
                k.generation,
                k.keys.len()
            );
            for key in &k.keys {
                let _ = writeln!(s, "  {key}");
            }
        }
        Answer::Reservation(r) => match &r.reservation {
            None => {
                let _ = writeln!(s, "{d}: generation {}, no reservation", r.generation);
            }
            Some(res) => {
                let _ = writeln!(
                    s,
                    "{d}: generation {}, reserved by key {}, type {} ({}), scope {}",
                    r.generation,
                    res.key,
                    res.rtype.short_name(),
                    res.rtype.description(),
                    res.scope
                );
            }
        },
        Answer::Capabilities(c) | Answer::NvmeCapabilities(c) => {
            let _ = writeln!(s, "{d}:");
            if matches!(outcome, Answer::NvmeCapabilities(_)) {
                let _ = writeln!(s, "  ({NVME_CAPABILITIES})");
            }
            let _ = writeln!(
                s,
                "  persist through power loss: capable {}, active {}",
                yes_no(c.ptpl_c),
                yes_no(c.ptpl_a)
            );
            let _ = writeln!(s, "  all target ports: {}", yes_no(c.atp_c));
            let _ = writeln!(s, "  specify initiator ports: {}", yes_no(c.sip_c));
            let _ = writeln!(s, "  compatible reservation handling: {}", yes_no(c.crh));
            let _ = writeln!(s, "  replace lost reservation: {}", yes_no(c.rlr_c));
            let _ = writeln!(s, "  allow commands: {}", c.allow_commands);
            match &c.supported_types {
                Some(types) => {
                    let names: Vec<&str> = types.iter().map(|t| t.short_name()).collect();
                    let _ = writeln!(s, "  types: {}", names.join(" "));
                }
                None => {
                    let _ = writeln!(s, "  types: not reported");
                }
            }
        }
        Answer::FullStatus(f) => {
            let _ = writeln!(
                s,
                "{d}: generation {}, {} registration(s)",
                f.generation,
                f.registrations.len()
            );
            for r in &f.registrations {
                let holder = match (r.holder, r.rtype) {
                    (true, Some(t)) => format!(", holder ({t})"),
                    (true, None) => ", holder".to_string(),
                    _ => String::new(),
                };
                // NVMe registers hosts, not ports: the field carries the controller id.
                let port = match r.transport_id {
                    TransportId::NvmeHostId { .. } => "controller",
                    _ => "port",
                };
                let _ = writeln!(
                    s,
                    "  {} {} {port} {}{}{}",
                    r.key,
                    r.transport_id,
                    r.relative_target_port,
                    if r.all_tg_pt {
                        ", all target ports"
                    } else {
                        ""
                    },
                    holder
                );
            }
        }
        Answer::Done { action, report } => {
            let _ = write!(s, "{d}: {} done", action.name());
            if report.confirmed_by_reread {
                let _ = write!(
                    s,
                    " (the target answered NOT READY, a re-read shows it applied)"
                );
            }
            let _ = writeln!(s);
        }
    }
    s
}
