//! Text and JSON rendering of per-device results. The JSON shape is an interface: scripts parse
//! it, so fields are only ever added.

use std::fmt::Write as _;
use std::path::PathBuf;

use serde_json::{Map, Value, json};

use crate::pr::{Capabilities, FullStatus, PrOutAction, ReadKeys, ReadReservation, Reservation};
use crate::transport::{CommandError, PrOutReport};

/// The result of one command on one device.
#[derive(Debug)]
pub enum Outcome {
    Keys(ReadKeys),
    Reservation(ReadReservation),
    Capabilities(Capabilities),
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
    pub outcome: Outcome,
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
            Err(e) => eprintln!("prfence: {e}"),
        }
    }
}

fn reservation_json(r: &Reservation) -> Value {
    json!({ "key": r.key.to_string(), "type": r.rtype.short_name(), "scope": scope_name(r) })
}

fn scope_name(r: &Reservation) -> String {
    match r.scope {
        crate::pr::Scope::LogicalUnit => "lu".to_string(),
        crate::pr::Scope::Other(code) => format!("0x{code:x}"),
    }
}

pub fn to_json(device: &std::path::Path, result: &Result<Reported, CommandError>) -> Value {
    let mut object = Map::new();
    object.insert("device".into(), json!(device.display().to_string()));
    match result {
        Err(e) => {
            object.insert("ok".into(), json!(false));
            object.insert(
                "error".into(),
                json!({
                    "kind": e.kind,
                    "message": e.to_string(),
                    "sense": e.sense_text(),
                    "command": e.command.to_string(),
                    "status": e.status.map(|s| s.to_string()),
                }),
            );
        }
        Ok(Reported {
            outcome,
            unit_attentions,
        }) => {
            object.insert("ok".into(), json!(true));
            object.insert("unit_attentions".into(), json!(unit_attentions));
            match outcome {
                Outcome::Keys(k) => {
                    object.insert("generation".into(), json!(k.generation));
                    let keys: Vec<String> = k.keys.iter().map(ToString::to_string).collect();
                    object.insert("keys".into(), json!(keys));
                }
                Outcome::Reservation(r) => {
                    object.insert("generation".into(), json!(r.generation));
                    object.insert(
                        "reservation".into(),
                        r.reservation.as_ref().map_or(Value::Null, reservation_json),
                    );
                }
                Outcome::Capabilities(c) => {
                    object.insert("capabilities".into(), capabilities_json(c));
                }
                Outcome::FullStatus(f) => {
                    object.insert("generation".into(), json!(f.generation));
                    let registrations: Vec<Value> = f
                        .registrations
                        .iter()
                        .map(|r| {
                            json!({
                                "key": r.key.to_string(),
                                "holder": r.holder,
                                "type": r.rtype.filter(|_| r.holder).map(|t| t.short_name()),
                                "all_target_ports": r.all_tg_pt,
                                "relative_target_port": r.relative_target_port,
                                "transport_id": r.transport_id.to_string(),
                            })
                        })
                        .collect();
                    object.insert("registrations".into(), json!(registrations));
                }
                Outcome::Done { action, report } => {
                    object.insert("action".into(), json!(action.name()));
                    object.insert(
                        "confirmed_by_reread".into(),
                        json!(report.confirmed_by_reread),
                    );
                }
            }
        }
    }
    Value::Object(object)
}

fn capabilities_json(c: &Capabilities) -> Value {
    json!({
        "replace_lost_reservation": c.rlr_c,
        "compatible_reservation_handling": c.crh,
        "specify_initiator_ports": c.sip_c,
        "all_target_ports": c.atp_c,
        "persist_through_power_loss": c.ptpl_c,
        "persist_through_power_loss_active": c.ptpl_a,
        "allow_commands": c.allow_commands,
        "types": c.supported_types.as_ref().map(|ts| ts.iter().map(|t| t.short_name()).collect::<Vec<_>>()),
    })
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

fn outcome_text(device: &std::path::Path, outcome: &Outcome) -> String {
    let d = device.display();
    let mut s = String::new();
    // Writing to a String cannot fail; the results are ignored on purpose.
    match outcome {
        Outcome::Keys(k) if k.keys.is_empty() => {
            let _ = writeln!(s, "{d}: generation {}, no keys registered", k.generation);
        }
        Outcome::Keys(k) => {
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
        Outcome::Reservation(r) => match &r.reservation {
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
                    scope_name(res)
                );
            }
        },
        Outcome::Capabilities(c) => {
            let _ = writeln!(s, "{d}:");
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
        Outcome::FullStatus(f) => {
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
                let _ = writeln!(
                    s,
                    "  {} {} port {}{}{}",
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
        Outcome::Done { action, report } => {
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
