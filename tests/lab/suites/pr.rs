//! prfence's admin commands against a real LIO target (issue #3 item 5): every service action and
//! reservation type, the access matrix, the error kinds, on tcm_loop and on iSCSI.
//!
//! The proof is always the target's own state (LIO's configfs, read by the lab oracles) and what
//! the target lets a node read or write (the O_DIRECT probes), never prfence's own output. For the
//! read commands, prfence's decoded JSON is also compared with sg_persist's report of the same
//! state. Run: `cargo test --test lab_pr` (as root).

use std::time::Duration;

use std::collections::BTreeMap;

use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{Node, Topology, WriteOutcome};
use anyhow::{Context, bail, ensure};
use serde_json::Value;

/// Rounds of [`pr_out_on_two_paths_of_one_lu`].
const TWO_PATH_ROUNDS: usize = 10;

pub const SUITE: Suite = Suite {
    name: "pr",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(8 * 60),
    usual: Duration::from_secs(92),
    // CI runs each behaviour over iSCSI and the tcm_loop fabric once (register and key
    // changes); the tcm_loop twins of the rest are the long tier's (LIO's PR logic is the
    // fabric's core, and CI's 25 minutes are short), and so, since CI's machine became the
    // slower one, are docs/cli.md's examples run as written (CI keeps every example parsed,
    // tests/doc_commands.rs) and PR OUTs on two paths of one LU (CI keeps
    // fence::multipath_maps_register_and_lose_every_path).
    tests: crate::tests![
        register_and_key_changes_tcm_loop,
        register_and_key_changes_iscsi,
        register_options_iscsi,
        every_type_access_and_ownership_iscsi,
        clear_and_preempt_and_abort_iscsi,
        register_and_move_iscsi,
        no_pr_lun_is_not_supported,
        sixteen_luns_in_argument_order,
    ],
    long: crate::tests![
        cli_md_examples_as_written_iscsi,
        pr_out_on_two_paths_of_one_lu,
        every_type_access_and_ownership_tcm_loop,
        clear_and_preempt_tcm_loop,
        register_and_move_tcm_loop,
    ],
    reproducers: &[],
};

/// The six reservation types: SPC code and prfence's name.
const TYPES: [(u8, &str); 6] = [
    (1, "we"),
    (3, "ea"),
    (5, "wero"),
    (6, "earo"),
    (7, "wear"),
    (8, "eaar"),
];

fn type_name(code: u8) -> &'static str {
    TYPES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("?", |(_, n)| n)
}

fn all_registrants(code: u8) -> bool {
    matches!(code, 7 | 8)
}

/// What SPC (and libiscsi's ProutReserve.Access tests) expect a non-holder to be allowed under a
/// reservation of type `code`: (read, write).
fn non_holder_access(code: u8, registered: bool) -> (bool, bool) {
    match (code, registered) {
        (1, _) => (true, false),          // Write Exclusive: only the holder writes
        (3, _) => (false, false),         // Exclusive Access: only the holder reads or writes
        (5 | 7, true) => (true, true),    // WE registrants only / all registrants
        (5 | 7, false) => (true, false),  //   unregistered nodes may only read
        (6 | 8, true) => (true, true),    // EA registrants only / all registrants
        (6 | 8, false) => (false, false), //   unregistered nodes may do nothing
        _ => unreachable!("type {code}"),
    }
}

fn dev(t: &Topology, node: Node, lun: usize) -> String {
    t.device(node, lun).display().to_string()
}

// ---------------------------------------------------------------------------------------------
// prfence

/// Runs `prfence --json args…`: its exit code and the JSON array it printed.
fn prfence(args: &[&str]) -> anyhow::Result<(i32, Vec<Value>)> {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let run = crate::prfence(&all)?;
    let parsed = run.json()?;
    let Value::Array(results) = parsed else {
        bail!("`{}` printed {parsed}, not an array", run.command);
    };
    Ok((run.code(), results))
}

/// `prfence --json args…` must exit 0 with every device ok; returns the per-device objects.
fn prfence_ok(args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let (code, results) = prfence(args)?;
    ensure!(
        code == 0 && results.iter().all(|r| r["ok"] == true),
        "prfence {} exited {code}: {results:?}",
        args.join(" ")
    );
    Ok(results)
}

/// `prfence --json args…` on one device must exit `exit` with error kind `kind`; returns the error.
fn prfence_fails(args: &[&str], exit: i32, kind: &str) -> anyhow::Result<Value> {
    let (code, results) = prfence(args)?;
    let error = results
        .first()
        .map(|r| r["error"].clone())
        .unwrap_or_default();
    ensure!(
        code == exit && error["kind"] == kind,
        "prfence {}: expected exit {exit} and kind {kind}, got exit {code}: {results:?}",
        args.join(" ")
    );
    Ok(error)
}

fn json_key(value: &Value) -> anyhow::Result<u64> {
    let text = value
        .as_str()
        .with_context(|| format!("{value} is no key"))?;
    Ok(u64::from_str_radix(text.trim_start_matches("0x"), 16)?)
}

fn json_generation(value: &Value) -> anyhow::Result<u32> {
    let n = value["generation"]
        .as_u64()
        .with_context(|| format!("no generation in {value}"))?;
    Ok(u32::try_from(n)?)
}

/// The unit attentions a successful PR OUT consumed, from its JSON.
fn unit_attentions(result: &Value) -> Vec<String> {
    result["unit_attentions"]
        .as_array()
        .map(|uas| {
            uas.iter()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// sg_persist (sg3_utils): an independent reader of the same state

fn sg_persist(flag: &str, device: &str) -> anyhow::Result<String> {
    Ok(crate::run("sg_persist", ["-n", flag, device])?.ok()?.stdout)
}

/// "  PR generation=0x2, …" → 2
fn sg_generation(text: &str) -> anyhow::Result<u32> {
    let rest = text
        .split_once("PR generation=0x")
        .with_context(|| format!("no PR generation in {text:?}"))?
        .1;
    let digits: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
    Ok(u32::from_str_radix(&digits, 16)?)
}

fn sg_hex(text: &str) -> anyhow::Result<u64> {
    u64::from_str_radix(text.trim().trim_start_matches("0x"), 16)
        .with_context(|| format!("bad hex {text:?}"))
}

/// sg_persist's name of a reservation type → its SPC code.
fn sg_type(text: &str) -> anyhow::Result<u8> {
    Ok(match text.trim() {
        "Write Exclusive" => 1,
        "Exclusive Access" => 3,
        "Write Exclusive, registrants only" => 5,
        "Exclusive Access, registrants only" => 6,
        "Write Exclusive, all registrants" => 7,
        "Exclusive Access, all registrants" => 8,
        other => bail!("unknown sg_persist type {other:?}"),
    })
}

/// `sg_persist -n -k`: generation and keys.
fn sg_keys(device: &str) -> anyhow::Result<(u32, Vec<u64>)> {
    let text = sg_persist("-k", device)?;
    let keys = text
        .lines()
        .skip_while(|l| !l.contains("PR generation"))
        .skip(1)
        .map(sg_hex)
        .collect::<anyhow::Result<_>>()?;
    Ok((sg_generation(&text)?, keys))
}

/// `sg_persist -n -r`: generation and (key, type) of the reservation.
fn sg_reservation(device: &str) -> anyhow::Result<(u32, Option<(u64, u8)>)> {
    let text = sg_persist("-r", device)?;
    let generation = sg_generation(&text)?;
    if text.contains("there is NO reservation held") {
        return Ok((generation, None));
    }
    let key = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Key="))
        .with_context(|| format!("no key in {text:?}"))?;
    let rtype = text
        .lines()
        .find_map(|l| l.split_once("type: ").map(|(_, t)| t))
        .with_context(|| format!("no type in {text:?}"))?;
    ensure!(text.contains("scope: LU_SCOPE"), "not LU scope: {text:?}");
    Ok((generation, Some((sg_hex(key)?, sg_type(rtype)?))))
}

/// `sg_persist -n -c`: each field by its abbreviation (RLR_C, CRH…, "Allow Commands") and each
/// type of the type mask by SPC code.
fn sg_capabilities(device: &str) -> anyhow::Result<(BTreeMap<String, u64>, Vec<u8>)> {
    let text = sg_persist("-c", device)?;
    let mut fields = BTreeMap::new();
    let mut types = Vec::new();
    for line in text.lines().map(str::trim) {
        let Some((name, value)) = line.rsplit_once(": ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<u64>() else {
            continue;
        };
        if let Some((_, abbreviation)) = name.split_once('(') {
            fields.insert(abbreviation.trim_end_matches(')').to_owned(), value);
        } else if name == "Allow Commands" {
            fields.insert(name.to_owned(), value);
        } else if value == 1 {
            types.push(sg_type(name)?);
        }
    }
    types.sort_unstable();
    Ok((fields, types))
}

/// One registration as `sg_persist -n -s` shows it, TransportID in prfence's notation.
#[derive(Debug, PartialEq, Eq)]
struct SgRegistration {
    key: u64,
    all_target_ports: bool,
    relative_target_port: u64,
    holder: bool,
    rtype: Option<u8>,
    transport_id: String,
}

/// `sg_persist -n -s`: generation and registrations in the target's order.
fn sg_full_status(device: &str) -> anyhow::Result<(u32, Vec<SgRegistration>)> {
    let text = sg_persist("-s", device)?;
    let mut regs: Vec<SgRegistration> = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if let Some(key) = line.strip_prefix("Key=") {
            regs.push(SgRegistration {
                key: sg_hex(key)?,
                all_target_ports: false,
                relative_target_port: 0,
                holder: false,
                rtype: None,
                transport_id: String::new(),
            });
            continue;
        }
        let Some(reg) = regs.last_mut() else {
            continue;
        };
        if line == "All target ports bit set" {
            reg.all_target_ports = true;
        } else if let Some(port) = line.strip_prefix("Relative port address: ") {
            reg.relative_target_port = sg_hex(port)?;
        } else if line == "<< Reservation holder >>" {
            reg.holder = true;
        } else if let Some((_, t)) = line.split_once("type: ") {
            reg.rtype = Some(sg_type(t)?);
        } else if line == "Transport Id of initiator:" {
            let id = lines.next().context("TransportID line missing")?;
            reg.transport_id = if let Some(name) = id
                .strip_prefix("iSCSI world wide unique port id: ")
                .or_else(|| id.strip_prefix("iSCSI name: "))
            {
                name.to_owned()
            } else if let Some(address) = id.strip_prefix("SAS address: ") {
                format!("sas,0x{:016x}", sg_hex(address)?)
            } else {
                bail!("unexpected TransportID line {id:?}")
            };
        }
    }
    Ok((sg_generation(&text)?, regs))
}

// ---------------------------------------------------------------------------------------------
// read commands: prfence == sg_persist, and both == the target's configfs

/// The target's registrations as sorted (initiator, key).
fn registered(t: &Topology, lun: usize) -> anyhow::Result<Vec<(String, u64)>> {
    let mut regs: Vec<(String, u64)> = t
        .lu(lun)
        .registrations()?
        .into_iter()
        .map(|r| (r.initiator, r.key))
        .collect();
    regs.sort();
    Ok(regs)
}

fn expect_registered(t: &Topology, lun: usize, expected: &[(Node, u64)]) -> anyhow::Result<()> {
    let mut want: Vec<(String, u64)> = expected
        .iter()
        .map(|(n, k)| (t.node(*n).initiator.clone(), *k))
        .collect();
    want.sort();
    let got = registered(t, lun)?;
    ensure!(
        got == want,
        "LU {lun} registrations: target has {got:?}, expected {want:?}"
    );
    Ok(())
}

/// The target's reservation: holder's initiator and type.
fn reserved(t: &Topology, lun: usize) -> anyhow::Result<Option<(String, u8)>> {
    let lu = t.lu(lun);
    Ok(match (lu.holder()?, lu.reservation_type()?) {
        (None, None) => None,
        (Some(h), Some(code)) => Some((h.initiator, code)),
        (h, c) => bail!("LU {lun}: holder {h:?} but type {c:?}"),
    })
}

fn expect_reserved(t: &Topology, lun: usize, expected: Option<(Node, u8)>) -> anyhow::Result<()> {
    let want = expected.map(|(n, c)| (t.node(n).initiator.clone(), c));
    let got = reserved(t, lun)?;
    ensure!(
        got == want,
        "LU {lun} reservation: target has {got:?}, expected {want:?}"
    );
    Ok(())
}

/// `prfence keys` on `device` equals `sg_persist -k` and the target's configfs.
fn check_keys(t: &Topology, lun: usize, device: &str) -> anyhow::Result<()> {
    let json = prfence_ok(&["keys", device])?.remove(0);
    let mut keys: Vec<u64> = json["keys"]
        .as_array()
        .context("no keys array")?
        .iter()
        .map(json_key)
        .collect::<anyhow::Result<_>>()?;
    let (sg_gen, sg_keys) = sg_keys(device)?;
    ensure!(
        (json_generation(&json)?, &keys) == (sg_gen, &sg_keys),
        "{device}: prfence keys {json} but sg_persist says generation {sg_gen} keys {sg_keys:x?}"
    );
    keys.sort_unstable();
    let mut target: Vec<u64> = registered(t, lun)?.into_iter().map(|r| r.1).collect();
    target.sort_unstable();
    ensure!(
        keys == target && sg_gen == t.lu(lun).generation()?,
        "{device}: keys {keys:x?} gen {sg_gen}, target has {target:x?} gen {}",
        t.lu(lun).generation()?
    );
    Ok(())
}

/// `prfence reservation` on `device` equals `sg_persist -r` and the target's configfs; returns
/// the reported (key, type).
fn check_reservation(t: &Topology, lun: usize, device: &str) -> anyhow::Result<Option<(u64, u8)>> {
    let json = prfence_ok(&["reservation", device])?.remove(0);
    let ours = match &json["reservation"] {
        Value::Null => None,
        r => {
            ensure!(r["scope"] == "lu", "scope of {r}");
            let code = TYPES
                .iter()
                .find(|(_, n)| r["type"] == *n)
                .map(|(c, _)| *c)
                .with_context(|| format!("type of {r}"))?;
            Some((json_key(&r["key"])?, code))
        }
    };
    let (sg_gen, theirs) = sg_reservation(device)?;
    ensure!(
        (json_generation(&json)?, ours) == (sg_gen, theirs),
        "{device}: prfence reservation {json} but sg_persist says generation {sg_gen} {theirs:x?}"
    );
    let target = reserved(t, lun)?;
    ensure!(
        ours.map(|r| r.1) == target.as_ref().map(|r| r.1),
        "{device}: reservation {ours:x?}, target has {target:?}"
    );
    Ok(ours)
}

/// `prfence full-status` on `device` equals `sg_persist -s` and the target's configfs (each
/// registration's initiator, ISID and key; the holder flags). Returns prfence's registrations.
fn check_full_status(t: &Topology, lun: usize, device: &str) -> anyhow::Result<Vec<Value>> {
    let json = prfence_ok(&["full-status", device])?.remove(0);
    let regs = json["registrations"]
        .as_array()
        .context("no registrations")?
        .clone();
    let ours: Vec<SgRegistration> = regs
        .iter()
        .map(|r| {
            Ok(SgRegistration {
                key: json_key(&r["key"])?,
                all_target_ports: r["all_target_ports"] == true,
                relative_target_port: r["relative_target_port"].as_u64().unwrap_or(0),
                holder: r["holder"] == true,
                rtype: TYPES.iter().find(|(_, n)| r["type"] == *n).map(|(c, _)| *c),
                transport_id: r["transport_id"].as_str().unwrap_or_default().to_owned(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let (sg_gen, theirs) = sg_full_status(device)?;
    ensure!(
        json_generation(&json)? == sg_gen && ours == theirs,
        "{device}: prfence full-status {json}\nbut sg_persist says generation {sg_gen} {theirs:#?}"
    );
    // against configfs: the same (TransportID, key) set, and the holder flags
    let lu = t.lu(lun);
    let mut from_target: Vec<(String, u64)> = lu
        .registrations()?
        .into_iter()
        .map(|r| {
            let id = match (&r.fabric[..], r.isid) {
                ("loopback", _) => format!("sas,0x{}", r.initiator.trim_start_matches("naa.")),
                (_, Some(isid)) => format!("{},i,{isid}", r.initiator),
                (_, None) => r.initiator,
            };
            (id, r.key)
        })
        .collect();
    from_target.sort();
    let mut reported: Vec<(String, u64)> = ours
        .iter()
        .map(|r| (r.transport_id.clone(), r.key))
        .collect();
    reported.sort();
    ensure!(
        reported == from_target,
        "{device}: full-status lists {reported:?}, the target {from_target:?}"
    );
    let holder = lu.holder()?;
    let rtype = lu.reservation_type()?;
    for r in &ours {
        let holds = match (&holder, rtype) {
            (None, _) => false,
            (Some(_), Some(code)) if all_registrants(code) => true,
            (Some(h), _) => {
                r.transport_id.starts_with(&h.initiator)
                    || r.transport_id
                        .ends_with(h.initiator.trim_start_matches("naa."))
            }
        };
        ensure!(
            r.holder == holds && (!holds || r.rtype == rtype),
            "{device}: registration {r:?} holder flag, target holder {holder:?} type {rtype:?}"
        );
    }
    Ok(regs)
}

/// `prfence capabilities` equals `sg_persist -c`, and PTPL_A equals the target's
/// `pr/res_aptpl_active`. Returns prfence's capabilities object.
fn check_capabilities(t: &Topology, lun: usize, device: &str) -> anyhow::Result<Value> {
    let json = prfence_ok(&["capabilities", device])?.remove(0);
    let c = &json["capabilities"];
    let (fields, sg_types) = sg_capabilities(device)?;
    let pairs = [
        ("replace_lost_reservation", "RLR_C"),
        ("compatible_reservation_handling", "CRH"),
        ("specify_initiator_ports", "SIP_C"),
        ("all_target_ports", "ATP_C"),
        ("persist_through_power_loss", "PTPL_C"),
        ("persist_through_power_loss_active", "PTPL_A"),
    ];
    for (ours, theirs) in pairs {
        let sg = fields
            .get(theirs)
            .with_context(|| format!("sg_persist -c: no {theirs}"))?;
        ensure!(
            c[ours] == (*sg == 1),
            "{device}: prfence {ours}={} but sg_persist {theirs}={sg}",
            c[ours]
        );
    }
    ensure!(
        c["allow_commands"].as_u64() == fields.get("Allow Commands").copied(),
        "{device}: allow commands {} vs sg_persist {fields:?}",
        c["allow_commands"]
    );
    ensure!(
        fields.get("TMV") == Some(&1),
        "LIO reports a valid type mask"
    );
    let mut types: Vec<u8> = c["types"]
        .as_array()
        .context("no types")?
        .iter()
        .filter_map(|n| TYPES.iter().find(|(_, name)| n == *name).map(|(c, _)| *c))
        .collect();
    types.sort_unstable();
    ensure!(
        types == sg_types,
        "{device}: types {types:?} vs sg_persist {sg_types:?}"
    );
    let active = aptpl_active(t, lun)?;
    ensure!(
        c["persist_through_power_loss_active"] == active,
        "{device}: PTPL_A {} but the target's res_aptpl_active says {active}",
        c["persist_through_power_loss_active"]
    );
    Ok(c.clone())
}

/// `pr/res_aptpl_active`: "APTPL Bit Status: Activated" or "… Disabled".
fn aptpl_active(t: &Topology, lun: usize) -> anyhow::Result<bool> {
    let path = t.lu(lun).backstore.join("pr/res_aptpl_active");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(text.contains("Activated"))
}

fn expect_access(
    t: &Topology,
    node: Node,
    read: bool,
    write: bool,
    what: &str,
) -> anyhow::Result<()> {
    let verdict = |allowed: bool| {
        if allowed {
            WriteOutcome::Accepted
        } else {
            WriteOutcome::Refused
        }
    };
    let got = (t.read_probe(node, 0, 3), t.write_probe(node, 0, 3));
    ensure!(
        got == (verdict(read), verdict(write)),
        "{what}: node {} (read, write) = {got:?}, expected read {read} write {write}",
        node.letter()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// the tests

fn register_and_key_changes_tcm_loop() -> anyhow::Result<()> {
    register_and_key_changes(&Topology::tcm_loop()?)
}

fn register_and_key_changes_iscsi() -> anyhow::Result<()> {
    register_and_key_changes(&Topology::iscsi(1)?)
}

/// REGISTER (new, key change, wrong old key), REGISTER AND IGNORE EXISTING KEY, unregister, and
/// what each does to PRgeneration.
fn register_and_key_changes(t: &Topology) -> anyhow::Result<()> {
    t.settle()?;
    let (a, b) = (dev(t, Node::A, 0), dev(t, Node::B, 0));
    let lu = t.lu(0);
    let g0 = lu.generation()?;
    expect_registered(t, 0, &[])?;
    check_keys(t, 0, &a)?;
    check_capabilities(t, 0, &b)?;

    prfence_ok(&["register", "--key", "0xa", &a])?;
    expect_registered(t, 0, &[(Node::A, 0xa)])?;
    ensure!(
        lu.generation()? == g0 + 1,
        "a registration bumps PRgeneration"
    );

    prfence_ok(&["register", "--old-key", "0xa", "--key", "0xa1", &a])?;
    expect_registered(t, 0, &[(Node::A, 0xa1)])?;
    ensure!(
        lu.generation()? == g0 + 2,
        "a key change bumps PRgeneration"
    );

    let error = prfence_fails(
        &["register", "--old-key", "0x77", "--key", "0xa2", &a],
        3,
        "reservation_conflict",
    )?;
    ensure!(
        error["status"]
            .as_str()
            .unwrap_or_default()
            .contains("RESERVATION CONFLICT")
    );
    expect_registered(t, 0, &[(Node::A, 0xa1)])?;
    ensure!(
        lu.generation()? == g0 + 2,
        "a refused REGISTER leaves PRgeneration"
    );
    // registering again without naming the current key is a conflict too
    prfence_fails(
        &["register", "--key", "0xa2", &a],
        3,
        "reservation_conflict",
    )?;

    prfence_ok(&["register", "--ignore-existing", "--key", "0xa2", &a])?;
    expect_registered(t, 0, &[(Node::A, 0xa2)])?;
    ensure!(lu.generation()? == g0 + 3);

    prfence_ok(&["register", "--key", "0xb", &b])?;
    expect_registered(t, 0, &[(Node::A, 0xa2), (Node::B, 0xb)])?;
    ensure!(lu.generation()? == g0 + 4);
    check_keys(t, 0, &a)?;
    check_keys(t, 0, &b)?;

    prfence_ok(&["unregister", "--key", "0xa2", &a])?;
    expect_registered(t, 0, &[(Node::B, 0xb)])?;
    let g = lu.generation()?;
    // SPC bumps PRgeneration on unregister; LIO (6.1) does not
    ensure!(
        g == g0 + 4 || g == g0 + 5,
        "PRgeneration {g} after unregister"
    );
    println!("PRgeneration after unregister: {g} (before {})", g0 + 4);
    // the unregistered path's old key is not its key any more
    prfence_fails(
        &["unregister", "--key", "0xa2", &a],
        3,
        "reservation_conflict",
    )?;
    expect_registered(t, 0, &[(Node::B, 0xb)])?;
    check_keys(t, 0, &a)?;
    Ok(())
}

fn register_options_iscsi() -> anyhow::Result<()> {
    register_options(&Topology::iscsi(1)?)
}

/// --aptpl (res_aptpl_active, PTPL_A, the APTPL file), --all-target-ports (what LIO records),
/// the capabilities against sg_persist, a conflict and LIO's answer to a RELEASE of the wrong
/// type.
fn register_options(t: &Topology) -> anyhow::Result<()> {
    t.settle()?;
    let (a, b) = (dev(t, Node::A, 0), dev(t, Node::B, 0));
    let caps = check_capabilities(t, 0, &a)?;
    // LIO's REPORT CAPABILITIES (research §1)
    for (field, value) in [
        ("replace_lost_reservation", false),
        ("compatible_reservation_handling", true),
        ("specify_initiator_ports", true),
        ("all_target_ports", true),
        ("persist_through_power_loss", true),
        ("persist_through_power_loss_active", false),
    ] {
        ensure!(caps[field] == value, "capabilities {field}: {caps}");
    }
    ensure!(caps["types"].as_array().map(Vec::len) == Some(6), "{caps}");

    prfence_ok(&["register", "--aptpl", "--key", "0xa", &a])?;
    expect_registered(t, 0, &[(Node::A, 0xa)])?;
    ensure!(
        aptpl_active(t, 0)?,
        "--aptpl: the target's res_aptpl_active is not Activated"
    );
    let caps = check_capabilities(t, 0, &b)?;
    ensure!(caps["persist_through_power_loss_active"] == true);
    // LIO writes the registrations it must persist to <dbroot>/pr/aptpl_<unit serial>
    let dbroot = std::fs::read_to_string("/sys/kernel/config/target/dbroot")?;
    let file = format!("{}/pr/aptpl_{}", dbroot.trim(), t.lu(0).serial);
    let saved = std::fs::read_to_string(&file).with_context(|| file.clone())?;
    ensure!(
        saved.contains(&format!("initiator_node={}", t.node(Node::A).initiator))
            && saved.contains("sa_res_key=10"),
        "{file} does not hold A's registration:\n{saved}"
    );

    // SPEC_I_PT from a nexus that is already registered: INVALID FIELD IN PARAMETER LIST
    let b_port_id = format!("{},i,0x00023d000001", t.node(Node::B).initiator);
    let error = prfence_fails(
        &[
            "register",
            "--old-key",
            "0xa",
            "--key",
            "0xa",
            "--transport-id",
            &b_port_id,
            &a,
        ],
        1,
        "invalid_field",
    )?;
    ensure!(
        error["sense"]
            .as_str()
            .unwrap_or_default()
            .contains("26h/00h"),
        "{error}"
    );
    expect_registered(t, 0, &[(Node::A, 0xa)])?;

    // ALL_TG_PT: LIO records the bit (READ FULL STATUS shows it) and, the LU having one target
    // port per initiator here, registers just this I_T nexus.
    prfence_ok(&["register", "--all-target-ports", "--key", "0xb", &b])?;
    expect_registered(t, 0, &[(Node::A, 0xa), (Node::B, 0xb)])?;
    let regs = check_full_status(t, 0, &a)?;
    let atp: Vec<(u64, bool)> = regs
        .iter()
        .map(|r| Ok((json_key(&r["key"])?, r["all_target_ports"] == true)))
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        atp.contains(&(0xb, true)) && atp.contains(&(0xa, false)),
        "all_target_ports flags {atp:?}"
    );
    // res_pr_all_tgt_pts describes the holder's registration
    prfence_ok(&["reserve", "--key", "0xb", "--type", "wero", &b])?;
    expect_reserved(t, 0, Some((Node::B, 5)))?;
    let all_tgt = std::fs::read_to_string(t.lu(0).backstore.join("pr/res_pr_all_tgt_pts"))?;
    ensure!(
        all_tgt.contains("All Target Port"),
        "res_pr_all_tgt_pts: {all_tgt}"
    );
    check_reservation(t, 0, &a)?;
    check_full_status(t, 0, &b)?;

    // a conflict: A (registered) may not reserve what B holds
    let error = prfence_fails(
        &["reserve", "--key", "0xa", "--type", "wero", &a],
        3,
        "reservation_conflict",
    )?;
    ensure!(error["sense"].is_null(), "a conflict has no sense: {error}");
    expect_reserved(t, 0, Some((Node::B, 5)))?;
    // RELEASE of the wrong type: SPC says ILLEGAL REQUEST (26h/04h), LIO answers a conflict
    prfence_fails(
        &["release", "--key", "0xb", "--type", "ea", &b],
        3,
        "reservation_conflict",
    )?;
    expect_reserved(t, 0, Some((Node::B, 5)))?;
    prfence_ok(&["release", "--key", "0xb", "--type", "wero", &b])?;
    expect_reserved(t, 0, None)?;

    // LIO refuses to unregister an ALL_TG_PT registration without ALL_TG_PT: 24h
    let error = prfence_fails(&["unregister", "--key", "0xb", &b], 1, "invalid_field")?;
    ensure!(
        error["sense"]
            .as_str()
            .unwrap_or_default()
            .contains("24h/00h"),
        "{error}"
    );
    expect_registered(t, 0, &[(Node::A, 0xa), (Node::B, 0xb)])?;
    prfence_ok(&["unregister", "--all-target-ports", "--key", "0xb", &b])?;
    expect_registered(t, 0, &[(Node::A, 0xa)])?;
    Ok(())
}

fn every_type_access_and_ownership_tcm_loop() -> anyhow::Result<()> {
    every_type_access_and_ownership(&Topology::tcm_loop()?, true)
}

fn every_type_access_and_ownership_iscsi() -> anyhow::Result<()> {
    // the reads against sg_persist are topology-independent and cost time: tcm_loop does them
    every_type_access_and_ownership(&Topology::iscsi(1)?, false)
}

/// For each of the six types, A reserves: the target's type and holder; READ RESERVATION and
/// READ FULL STATUS as sg_persist sees them; B's reads and writes unregistered then registered,
/// A's as holder; RELEASE; then what happens when the holder unregisters (AR types keep the
/// reservation, and the remaining registrant can release it).
fn every_type_access_and_ownership(t: &Topology, compare_reads: bool) -> anyhow::Result<()> {
    t.settle()?;
    let (a, b) = (dev(t, Node::A, 0), dev(t, Node::B, 0));
    let lu = t.lu(0);
    for (code, name) in TYPES {
        let what = |s: &str| format!("type {name}: {s}");
        prfence_ok(&["register", "--key", "0xa", &a])?;
        let g = lu.generation()?;
        prfence_ok(&["reserve", "--key", "0xa", "--type", name, &a])?;
        expect_reserved(t, 0, Some((Node::A, code)))?;
        ensure!(
            lu.generation()? == g,
            "{}",
            what("RESERVE changed PRgeneration")
        );
        if compare_reads {
            let (r_key, _) = check_reservation(t, 0, &b)?.context("no reservation reported")?;
            // READ RESERVATION shows key 0 for the all-registrants types
            let want_key = if all_registrants(code) { 0 } else { 0xa };
            ensure!(
                r_key == want_key,
                "{}",
                what(&format!("reservation key {r_key:#x}"))
            );
        }

        let (read, write) = non_holder_access(code, false);
        expect_access(t, Node::B, read, write, &what("unregistered B"))?;
        prfence_ok(&["register", "--key", "0xb", &b])?;
        let (read, write) = non_holder_access(code, true);
        expect_access(t, Node::B, read, write, &what("registered B"))?;
        expect_access(t, Node::A, true, true, &what("holder A"))?;
        if compare_reads {
            check_full_status(t, 0, &a)?;
        }

        let g = lu.generation()?;
        prfence_ok(&["release", "--key", "0xa", "--type", name, &a])?;
        expect_reserved(t, 0, None)?;
        ensure!(
            lu.generation()? == g,
            "{}",
            what("RELEASE changed PRgeneration")
        );
        expect_access(t, Node::B, true, true, &what("after release, B"))?;

        // ownership: the holder unregisters
        prfence_ok(&["reserve", "--key", "0xa", "--type", name, &a])?;
        prfence_ok(&["unregister", "--key", "0xa", &a])?;
        expect_registered(t, 0, &[(Node::B, 0xb)])?;
        if all_registrants(code) {
            // every registrant holds an AR reservation: it stays, with B
            expect_reserved(t, 0, Some((Node::B, code)))?;
            let (read, write) = non_holder_access(code, false);
            expect_access(
                t,
                Node::A,
                read,
                write,
                &what("unregistered A under B's AR reservation"),
            )?;
            prfence_ok(&["release", "--key", "0xb", "--type", name, &b])?;
        }
        expect_reserved(t, 0, None)?;
        prfence_ok(&["unregister", "--key", "0xb", &b])?;
        expect_registered(t, 0, &[])?;
    }
    Ok(())
}

fn clear_and_preempt_tcm_loop() -> anyhow::Result<()> {
    // Plain PREEMPT: PREEMPT AND ABORT over tcm_loop never completes on Debian's 6.1. LIO runs a
    // tcm_loop command in the device's submission work item, and the abort path
    // (core_tmr_drain_state_list) flushes that same work item: the PR OUT waits for itself
    // (observed: kworker target_submission in flush_work, the SG_IO caller in blk_execute_rq, then
    // the initiator's error handler stuck in tcm_loop_issue_tmr). iSCSI submits from its own
    // thread, so the iSCSI variant below covers PREEMPT AND ABORT.
    clear_and_preempt(&Topology::tcm_loop()?, false)
}

fn clear_and_preempt_and_abort_iscsi() -> anyhow::Result<()> {
    clear_and_preempt(&Topology::iscsi(1)?, true)
}

/// CLEAR; PREEMPT [AND ABORT] removing a registration with no reservation, then taking over a
/// reservation; the preempted node's refused write and the unit attentions its next command
/// reports.
fn clear_and_preempt(t: &Topology, abort: bool) -> anyhow::Result<()> {
    t.settle()?;
    let (a, b) = (dev(t, Node::A, 0), dev(t, Node::B, 0));
    let lu = t.lu(0);
    let preempt = |victim: &str| {
        let mut args = vec![
            "preempt", "--key", "0xb", "--victim", victim, "--type", "wero",
        ];
        if abort {
            args.push("--abort");
        }
        args.push(&b);
        prfence_ok(&args)
    };
    prfence_ok(&["register", "--key", "0xa", &a])?;
    prfence_ok(&["register", "--key", "0xb", &b])?;
    prfence_ok(&["reserve", "--key", "0xa", "--type", "wero", &a])?;
    let g = lu.generation()?;
    prfence_ok(&["clear", "--key", "0xb", &b])?;
    expect_registered(t, 0, &[])?;
    expect_reserved(t, 0, None)?;
    ensure!(
        lu.generation()? == g + 1,
        "CLEAR bumps PRgeneration by exactly 1"
    );
    // read through B: a PR IN from A would consume the unit attention the next step looks for
    check_keys(t, 0, &b)?;
    check_reservation(t, 0, &b)?;
    // A's next PR OUT consumes the RESERVATIONS PREEMPTED attention CLEAR queued for it
    let result = prfence_ok(&["register", "--key", "0xa", &a])?.remove(0);
    let uas = unit_attentions(&result);
    ensure!(
        uas.iter().any(|u| u.contains("2Ah/03h")),
        "A after CLEAR: {result}"
    );

    // PREEMPT with no reservation: removes A's registration only
    prfence_ok(&["register", "--key", "0xb", &b])?;
    let g = lu.generation()?;
    preempt("0xa")?;
    expect_registered(t, 0, &[(Node::B, 0xb)])?;
    expect_reserved(t, 0, None)?;
    ensure!(
        lu.generation()? == g + 1,
        "PREEMPT bumps PRgeneration by exactly 1"
    );
    check_keys(t, 0, &b)?;
    // A's next command, a read, succeeds and says A was preempted (REGISTRATIONS PREEMPTED)
    let result = prfence_ok(&["keys", &a])?.remove(0);
    let uas = unit_attentions(&result);
    ensure!(
        uas.iter().any(|u| u.contains("2Ah/05h")),
        "A's read after PREEMPT: {result}"
    );
    prfence_ok(&["register", "--key", "0xa", &a])?;
    expect_registered(t, 0, &[(Node::A, 0xa), (Node::B, 0xb)])?;

    // PREEMPT of the holder: B takes the reservation, A's writes are refused
    prfence_ok(&["reserve", "--key", "0xa", "--type", "wero", &a])?;
    expect_access(t, Node::A, true, true, "holder A")?;
    let g = lu.generation()?;
    preempt("0xa")?;
    expect_registered(t, 0, &[(Node::B, 0xb)])?;
    expect_reserved(t, 0, Some((Node::B, 5)))?;
    ensure!(
        lu.generation()? == g + 1,
        "PREEMPT bumps PRgeneration by exactly 1"
    );
    expect_access(t, Node::A, true, false, "preempted A under B's WERO")?;
    expect_access(t, Node::B, true, true, "new holder B")?;
    check_reservation(t, 0, &a)?;
    check_full_status(t, 0, &a)?;
    // A preempting back is refused: its key is gone
    let mut args = vec![
        "preempt", "--key", "0xa", "--victim", "0xb", "--type", "wero",
    ];
    if abort {
        args.push("--abort");
    }
    args.push(&a);
    prfence_fails(&args, 3, "reservation_conflict")?;
    expect_reserved(t, 0, Some((Node::B, 5)))?;
    Ok(())
}

fn register_and_move_tcm_loop() -> anyhow::Result<()> {
    register_and_move(&Topology::tcm_loop()?)
}

fn register_and_move_iscsi() -> anyhow::Result<()> {
    register_and_move(&Topology::iscsi(1)?)
}

/// READ FULL STATUS lists both initiators (with their ISIDs on iSCSI), then REGISTER AND MOVE
/// hands A's reservation to B's TransportID as full-status reported it; and the ILLEGAL REQUEST
/// answers a move can provoke (invalid_field).
fn register_and_move(t: &Topology) -> anyhow::Result<()> {
    t.settle()?;
    let (a, b) = (dev(t, Node::A, 0), dev(t, Node::B, 0));
    let lu = t.lu(0);
    prfence_ok(&["register", "--key", "0xa", &a])?;
    prfence_ok(&["register", "--key", "0xb", &b])?;
    let regs = check_full_status(t, 0, &a)?;
    ensure!(regs.len() == 2, "{regs:?}");
    let target_regs = lu.registrations()?;
    let b_reg = target_regs
        .iter()
        .find(|r| r.initiator == t.node(Node::B).initiator)
        .context("B not registered")?;
    let b_full = regs
        .iter()
        .find(|r| r["key"] == "0x000000000000000b")
        .context("B's registration not in full-status")?;
    let b_id = b_full["transport_id"]
        .as_str()
        .context("B's TransportID")?
        .to_owned();
    // the port through which B sees the LU: tcm_loop gives each node its own target port
    let b_port = b_full["relative_target_port"].to_string();
    if let Some(isid) = &b_reg.isid {
        ensure!(
            b_id.ends_with(&format!(",i,{isid}")),
            "B's TransportID {b_id}, target ISID {isid}"
        );
    }
    println!("B's TransportID from full-status: {b_id}, relative target port {b_port}");

    // no reservation to move: LIO answers INVALID FIELD IN CDB
    let error = prfence_fails(
        &[
            "register-move",
            "--key",
            "0xa",
            "--new-key",
            "0xb",
            "--transport-id",
            &b_id,
            "--relative-target-port",
            &b_port,
            &a,
        ],
        1,
        "invalid_field",
    )?;
    ensure!(
        error["sense"]
            .as_str()
            .unwrap_or_default()
            .contains("24h/00h"),
        "{error}"
    );

    prfence_ok(&["reserve", "--key", "0xa", "--type", "wero", &a])?;
    expect_reserved(t, 0, Some((Node::A, 5)))?;
    check_full_status(t, 0, &b)?;

    // an initiator the target has no ACL for: INVALID FIELD IN PARAMETER LIST
    let stranger = if b_id.starts_with("sas,") {
        "sas,0x5001405000000ff1".to_owned()
    } else {
        b_id.replace(":node-b", ":node-x")
    };
    let error = prfence_fails(
        &[
            "register-move",
            "--key",
            "0xa",
            "--new-key",
            "0xc",
            "--transport-id",
            &stranger,
            "--relative-target-port",
            &b_port,
            &a,
        ],
        1,
        "invalid_field",
    )?;
    println!("register-move to {stranger}: {}", error["sense"]);
    ensure!(
        error["sense"]
            .as_str()
            .unwrap_or_default()
            .contains("26h/00h"),
        "{error}"
    );
    expect_reserved(t, 0, Some((Node::A, 5)))?;

    let g = lu.generation()?;
    prfence_ok(&[
        "register-move",
        "--key",
        "0xa",
        "--new-key",
        "0xb",
        "--transport-id",
        &b_id,
        "--relative-target-port",
        &b_port,
        "--type",
        "wero",
        "--unreg",
        &a,
    ])?;
    expect_reserved(t, 0, Some((Node::B, 5)))?;
    ensure!(
        lu.holder()?.and_then(|h| h.isid) == b_reg.isid,
        "the reservation went to another I_T nexus than B's: {:?}",
        lu.holder()?
    );
    expect_registered(t, 0, &[(Node::B, 0xb)])?;
    ensure!(lu.generation()? > g, "REGISTER AND MOVE bumps PRgeneration");
    expect_access(
        t,
        Node::A,
        true,
        false,
        "A after moving its reservation and unregistering",
    )?;
    expect_access(t, Node::B, true, true, "B, the new holder")?;
    check_full_status(t, 0, &b)?;
    check_reservation(t, 0, &b)?;
    Ok(())
}

/// A LU without PR: every command fails with kind not_supported and exit 1.
fn no_pr_lun_is_not_supported() -> anyhow::Result<()> {
    let t = Topology::no_pr()?;
    t.settle()?;
    let a = dev(&t, Node::A, 0);
    for args in [
        vec!["keys", a.as_str()],
        vec!["capabilities", a.as_str()],
        vec!["register", "--key", "0xa", a.as_str()],
    ] {
        let error = prfence_fails(&args, 1, "not_supported")?;
        ensure!(
            error["sense"]
                .as_str()
                .unwrap_or_default()
                .contains("20h/00h"),
            "{args:?}: {error}"
        );
    }
    let res_type = std::fs::read_to_string(t.lu(0).backstore.join("pr/res_type"))?;
    println!("no-PR LU res_type: {}", res_type.trim());
    Ok(())
}

/// keys and reservation on 16 LUNs in one command, in a scrambled order: each result is the
/// device named at its position and matches that LU's configfs state.
fn sixteen_luns_in_argument_order() -> anyhow::Result<()> {
    const LUNS: usize = 16;
    // no settle(): 32 sg_turs cost seconds under TCG, and prfence consumes unit attentions itself
    let t = Topology::iscsi(LUNS)?;
    let a_all: Vec<String> = (0..LUNS).map(|i| dev(&t, Node::A, i)).collect();
    let mut args: Vec<&str> = vec!["register", "--key", "0xa"];
    args.extend(a_all.iter().map(String::as_str));
    let results = prfence_ok(&args)?;
    ensure!(results.len() == LUNS);
    let b_odd: Vec<String> = (1..LUNS).step_by(2).map(|i| dev(&t, Node::B, i)).collect();
    let mut args: Vec<&str> = vec!["register", "--key", "0xb"];
    args.extend(b_odd.iter().map(String::as_str));
    prfence_ok(&args)?;
    for (rtype, remainder) in [("wero", 0), ("ea", 1)] {
        let devices: Vec<String> = (0..LUNS)
            .filter(|i| i % 3 == remainder)
            .map(|i| dev(&t, Node::A, i))
            .collect();
        let mut args: Vec<&str> = vec!["reserve", "--key", "0xa", "--type", rtype];
        args.extend(devices.iter().map(String::as_str));
        prfence_ok(&args)?;
    }
    for lun in 0..LUNS {
        let mut want = vec![(Node::A, 0xa)];
        if lun % 2 == 1 {
            want.push((Node::B, 0xb));
        }
        expect_registered(&t, lun, &want)?;
        let reservation = match lun % 3 {
            0 => Some((Node::A, 5)),
            1 => Some((Node::A, 3)),
            _ => None,
        };
        expect_reserved(&t, lun, reservation)?;
    }

    // 5 is coprime with 16: a permutation that is neither LUN nor device-name order
    let order: Vec<usize> = (0..LUNS).map(|i| (i * 5 + 3) % LUNS).collect();
    let devices: Vec<&str> = order.iter().map(|&i| a_all[i].as_str()).collect();
    let mut args = vec!["keys"];
    args.extend(&devices);
    let keys = prfence_ok(&args)?;
    let mut args = vec!["reservation"];
    args.extend(&devices);
    let reservations = prfence_ok(&args)?;
    ensure!(keys.len() == LUNS && reservations.len() == LUNS);
    for (position, &lun) in order.iter().enumerate() {
        for result in [&keys[position], &reservations[position]] {
            ensure!(
                result["device"] == devices[position],
                "result {position} is {}, the argument was {}",
                result["device"],
                devices[position]
            );
        }
        let mut reported: Vec<u64> = keys[position]["keys"]
            .as_array()
            .context("keys")?
            .iter()
            .map(json_key)
            .collect::<anyhow::Result<_>>()?;
        reported.sort_unstable();
        let target: Vec<u64> = registered(&t, lun)?.into_iter().map(|r| r.1).collect();
        let mut target = target;
        target.sort_unstable();
        ensure!(
            reported == target,
            "LUN {lun}: keys {reported:x?}, target {target:x?}"
        );
        ensure!(
            json_generation(&keys[position])? == t.lu(lun).generation()?,
            "LUN {lun}: generation"
        );
        let reservation = &reservations[position]["reservation"];
        let target = reserved(&t, lun)?.map(|(_, code)| type_name(code));
        ensure!(
            reservation["type"].as_str() == target,
            "LUN {lun}: reservation {reservation}, target {target:?}"
        );
    }
    // and one against sg_persist
    check_keys(&t, LUNS - 1, &a_all[LUNS - 1])?;
    check_reservation(&t, LUNS - 1, &a_all[LUNS - 1])?;
    Ok(())
}

/// A PR OUT given both paths of one LU (node A's two iSCSI sessions to each of 16 LUs, node B
/// registered too, A holding a reservation): `clear` and `register` send to the paths of one LU
/// one after another. Sent at once, two CLEARs crashed LIO on Linux 6.1 (list corruption in
/// `__core_scsi3_free_registration`, a kernel BUG: the lab stops the guest and fails the run);
/// so the target must still answer, with nothing registered after each clear and A's key on both
/// of its nexuses (and B's) after each register. The crash needs the two CLEARs to meet inside
/// the target: [`TWO_PATH_ROUNDS`] rounds of 16 LUs give it many chances.
fn pr_out_on_two_paths_of_one_lu() -> anyhow::Result<()> {
    let t = Topology::iscsi(16)?;
    let mut paths: Vec<String> = Vec::new();
    for (first, second) in t
        .node(Node::A)
        .devices()
        .iter()
        .zip(t.second_session(Node::A)?)
    {
        paths.push(first.display().to_string());
        paths.push(second.display().to_string());
    }
    let firsts: Vec<String> = paths.iter().step_by(2).cloned().collect();
    let b_paths: Vec<String> = t.node(Node::B).device_args();
    t.settle()?;
    for round in 0..TWO_PATH_ROUNDS {
        crate::prfence_with_devices(&["register", "--key", "0xa"], &paths)?.ok()?;
        crate::prfence_with_devices(&["register", "--key", "0xb"], &b_paths)?.ok()?;
        crate::prfence_with_devices(&["reserve", "--key", "0xa", "--type", "wero"], &firsts)?
            .ok()?;
        for lu in t.lus() {
            let mut keys: Vec<u64> = lu.registrations()?.iter().map(|r| r.key).collect();
            keys.sort_unstable();
            ensure!(
                keys == [0xa, 0xa, 0xb],
                "round {round}, LU {}: {keys:x?}",
                lu.index
            );
        }
        // the second path of each LU finds its key gone: LIO 6.1 answers that CLEAR NOT READY
        // and prfence's re-read shows it applied (exit 0); a target that answers RESERVATION
        // CONFLICT makes it exit 3 (only conflicts)
        let run = crate::prfence_with_devices(&["clear", "--key", "0xa"], &paths)?;
        ensure!(
            [0, 3].contains(&run.code()),
            "round {round}: clear exited {}: {}{}",
            run.code(),
            run.stdout,
            run.stderr
        );
        for lu in t.lus() {
            let keys = lu.registrations()?;
            ensure!(keys.is_empty(), "round {round}, LU {}: {keys:?}", lu.index);
            ensure!(
                lu.holder()?.is_none(),
                "round {round}, LU {}: still reserved",
                lu.index
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// docs/cli.md's examples, run

/// The state an example of docs/cli.md starts from, made with prfence on the lab's two LUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Before {
    /// No key, no reservation.
    Empty,
    /// Node A's key 0xa2 on LU 0 (the key an earlier example changed to).
    OtherKey,
    /// Node A's key 0xa on LU 0, nothing reserved.
    OneKey,
    /// Node A's key 0xa on LU 0, reserved WERO by it.
    Reserved,
    /// Nodes A and B unfenced on both LUs (0xa, 0xb; A holds the reservations).
    Both,
    /// Node A unfenced on both LUs, then its session logged out and in: its registrations are
    /// orphans (an earlier ISID), its paths registered nowhere.
    Orphaned,
}

/// After the example, on the target: LU 0's keys, registrant by registrant, and whether LU 0 is
/// reserved; `None` for an example that reads only (the state must then be `Before`'s).
type After = Option<(&'static [(Node, u64)], bool)>;

/// docs/cli.md's examples, each as the page writes it (comments and `...` dropped), with the
/// node whose paths stand for its devices, the state it starts from and what the target must
/// say after it, in the order they run. Each exits 0 but doctor's on the orphans, whose
/// output the page shows.
use Before::{Both, Empty, OneKey, Orphaned, OtherKey, Reserved};
use Node::{A, B};

#[rustfmt::skip]
const CLI_EXAMPLES: &[(&str, Node, Before, After)] = &[
    // the reads, from one state (each must leave it as it was)
    ("prfence keys /dev/sdb /dev/sdc", A, Both, None),
    ("prfence reservation /dev/sdb", A, Both, None),
    ("prfence capabilities /dev/sdb", A, Both, None),
    ("prfence full-status /dev/sdb", A, Both, None),
    ("prfence --json keys /dev/sdb", A, Both, None),
    ("prfence status --key 0xa /dev/sdb /dev/sdc", A, Both, None),
    ("prfence doctor --key 0xa /dev/sdb /dev/mapper/mpatha", A, Both, None),
    ("prfence doctor --config /etc/prfence/agent.toml", A, Both, None),
    ("prfence --json doctor --key 0xa /dev/sdb", A, Both, None),
    // the changes, each from the state it assumes
    ("prfence preempt --key 0xb --victim 0xa --abort /dev/sdb", B, Both, Some((&[(B, 0xb)], true))),
    ("prfence fence --key 0xb --victim 0xa /dev/sdd", B, Both, Some((&[(B, 0xb)], true))),
    ("prfence clear --key 0xb /dev/sdb", B, Both, Some((&[], false))),
    ("prfence register --key 0xa /dev/sdb", A, Empty, Some((&[(A, 0xa)], false))),
    ("prfence register --key 0xa2 --old-key 0xa /dev/sdb", A, OneKey, Some((&[(A, 0xa2)], false))),
    ("prfence register --key 0xa --ignore-existing /dev/sdb", A, OtherKey, Some((&[(A, 0xa)], false))),
    ("prfence unregister --key 0xa /dev/sdb", A, OneKey, Some((&[], false))),
    ("prfence reserve --key 0xa --type wero /dev/sdb", A, OneKey, Some((&[(A, 0xa)], true))),
    ("prfence release --key 0xa --type wero /dev/sdb", A, Reserved, Some((&[(A, 0xa)], false))),
    ("prfence unfence --key 0xa /dev/sdb /dev/sdc", A, Empty, Some((&[(A, 0xa)], true))),
    // the output the page shows: doctor finding the orphans of a re-login
    ("prfence doctor --key 0xa /dev/sda", A, Orphaned, None),
    // last, and to a registered nexus: kernel 6.1's LIO, moving to a nexus registered before
    // then cleared, later hit refcount warnings (use-after-free) in target_core_mod
    ("prfence register-move --key 0xa --new-key 0xc --transport-id iqn.2026-11.lab:nodeb,i,0x23d000002 /dev/sdb", A, Both, Some((&[(A, 0xa), (B, 0xc)], true))),
];

/// Makes `before` on the lab's two LUs (with prfence itself: the examples are what is tested).
fn make(t: &mut Topology, before: Before) -> anyhow::Result<()> {
    for lun in 0..2 {
        if t.lu(lun).registrations()?.is_empty() {
            continue;
        }
        let a = dev(t, Node::A, lun);
        prfence_ok(&["register", "--key", "0xf", "--ignore-existing", &a])?;
        prfence_ok(&["clear", "--key", "0xf", &a])?;
    }
    let a0 = dev(t, Node::A, 0);
    match before {
        Before::Empty => {}
        Before::OtherKey => drop(prfence_ok(&["register", "--key", "0xa2", &a0])?),
        Before::OneKey => drop(prfence_ok(&["register", "--key", "0xa", &a0])?),
        Before::Reserved => {
            prfence_ok(&["register", "--key", "0xa", &a0])?;
            prfence_ok(&["reserve", "--key", "0xa", "--type", "wero", &a0])?;
        }
        Before::Both | Before::Orphaned => {
            crate::node::unfence(t, Node::A)?;
            crate::node::unfence(t, Node::B)?;
        }
    }
    if let Before::Orphaned = before {
        t.relogin(Node::A)?;
        t.settle()?;
    }
    Ok(())
}

/// LU 0 as the target says: (registrant, key), sorted, and whether it is reserved.
fn lu0(t: &Topology) -> anyhow::Result<(Vec<(String, u64)>, bool)> {
    Ok((registered(t, 0)?, t.lu(0).holder()?.is_some()))
}

/// Issue 46: every example of docs/cli.md is run as written, the lab's devices put in for the
/// page's (/dev/sda, /dev/sdb and /dev/sdd: the node's path to LU 0, /dev/sdc and
/// /dev/mapper/mpatha: to LU 1; node B's TransportID for the page's; a configuration naming both LUs with key 0xa for
/// /etc/prfence/agent.toml), each from the state it assumes: it exits 0, and the target then
/// holds what the page says it does (or, for a read, what it held before). The page's JSON
/// example is compared with what `--json keys` prints. A new example on the page without an
/// entry here, or an entry the page no longer shows, fails the test.
fn cli_md_examples_as_written_iscsi() -> anyhow::Result<()> {
    let mut t = Topology::iscsi(2)?;
    let page = crate::doc_blocks::example_commands(crate::doc_blocks::CLI);
    let table: Vec<&str> = CLI_EXAMPLES.iter().map(|e| e.0).collect();
    let unrun: Vec<&String> = page
        .iter()
        .filter(|c| !table.contains(&c.as_str()))
        .collect();
    let gone: Vec<&&str> = table
        .iter()
        .filter(|c| !page.iter().any(|p| p == **c))
        .collect();
    ensure!(
        unrun.is_empty() && gone.is_empty(),
        "docs/cli.md's examples and this test's differ: on the page only {unrun:?}, here only \
         {gone:?}"
    );
    let config = std::env::temp_dir().join(format!("cli-md-agent-{}.toml", std::process::id()));
    let _remove = crate::RemoveOnDrop::new(&config);
    std::fs::write(
        &config,
        format!(
            "mode = \"watch\"\n[[device]]\npath = \"{}\"\n[[device]]\npath = \"{}\"\n\
             [key]\nvalue = \"0xa\"\n",
            dev(&t, Node::A, 0),
            dev(&t, Node::A, 1)
        ),
    )?;
    // node B's TransportID (its ISID, as the target knows it once B registered)
    make(&mut t, Before::Both)?;
    let b_transport_id = t
        .lu(0)
        .registrations()?
        .into_iter()
        .find(|r| r.initiator == t.node(Node::B).initiator)
        .map(|r| match r.isid {
            Some(isid) => format!("{},i,{isid}", r.initiator),
            None => r.initiator,
        })
        .context("node B not registered on LU 0")?;
    // the page's JSON example: `$ prfence --json keys /dev/sdb` and the line after it
    let page_json: Value = crate::doc_blocks::CLI
        .lines()
        .skip_while(|l| l.trim() != "$ prfence --json keys /dev/sdb")
        .nth(1)
        .map(serde_json::from_str)
        .context("docs/cli.md shows no output after `$ prfence --json keys /dev/sdb`")??;
    let mut made: Option<Before> = None;
    for &(example, node, before, after) in CLI_EXAMPLES {
        // after a read (which must change nothing, below) the state is the one it started from
        if made != Some(before) {
            make(&mut t, before)?;
        }
        made = after.is_none().then_some(before);
        let was = lu0(&t)?;
        let mut args: Vec<String> = Vec::new();
        for word in example.split_whitespace().skip(1) {
            args.push(match word {
                "/dev/sda" | "/dev/sdb" | "/dev/sdd" => dev(&t, node, 0),
                "/dev/sdc" | "/dev/mapper/mpatha" => dev(&t, node, 1),
                "/etc/prfence/agent.toml" => config.display().to_string(),
                w if w.starts_with("iqn.") => b_transport_id.clone(),
                w => w.to_owned(),
            });
        }
        let run = crate::prfence(&args)?;
        let shown = match before {
            // the page's output: not ready, the registration an orphan
            Before::Orphaned => {
                run.code() != 0
                    && run
                        .stdout
                        .contains("doctor: not ready to fence with 0x000000000000000a")
                    && run.stdout.contains("holder (ORPHAN)")
            }
            _ => run.code() == 0,
        };
        ensure!(
            shown,
            "docs/cli.md's `{example}` as `prfence {}` exited {}, not as the page says: {}{}",
            args.join(" "),
            run.code(),
            run.stdout,
            run.stderr
        );
        if example == "prfence --json keys /dev/sdb" {
            let printed: Value = serde_json::from_str(&run.stdout)?;
            let fields = |v: &Value| -> Vec<String> {
                v[0].as_object()
                    .map(|o| o.keys().cloned().collect())
                    .unwrap_or_default()
            };
            ensure!(
                fields(&printed) == fields(&page_json)
                    && printed[0]["keys"] == page_json[0]["keys"]
                    && printed[0]["ok"] == page_json[0]["ok"],
                "docs/cli.md shows {page_json}; prfence printed {printed}"
            );
        }
        let now = lu0(&t)?;
        match after {
            None => ensure!(
                now == was,
                "`{example}` only reads, yet LU 0 went from {was:?} to {now:?}"
            ),
            Some((keys, reserved)) => {
                expect_registered(&t, 0, keys)
                    .with_context(|| format!("after `{example}`, as the page says"))?;
                ensure!(
                    now.1 == reserved,
                    "after `{example}` LU 0 is reserved: {}; the page says {reserved}",
                    now.1
                );
            }
        }
        println!("  {example}: exit {}, LU 0 {now:?}", run.code());
    }
    Ok(())
}
