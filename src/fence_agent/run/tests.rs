//! The agent's actions on SPC-model LUs (`ScsiPr<ModelDevice>`, LIO quirks) through the real
//! engine, with corosync, discovery, the key store and sleeping faked by [`ModelSystem`] (the
//! shared [`ModelHost`] and a store in a temporary directory).

use std::sync::{Arc, Mutex};

use super::*;
use crate::discover::{LuId, PathInfo, PathState as SysfsState};
use crate::exec::ScsiPr;
use crate::fence_agent::{Environment, parse};
use crate::keys::{self, NativeKey};
use crate::pr::{PrOut, TransportId};
use crate::spc_model::{ModelDevice, ModelLu, Nexus, Quirks};
use crate::testing::ModelHost;
use crate::transport::Protocol;

const CMAP_NAME: &str = "totem.cluster_name (str) = lab\n";
const CMAP_NODES: &str = "nodelist.local_node_pos (u32) = 0\n\
nodelist.node.0.name (str) = node1\n\
nodelist.node.0.nodeid (u32) = 1\n\
nodelist.node.0.ring0_addr (str) = 10.0.0.1\n\
nodelist.node.1.name (str) = node2\n\
nodelist.node.1.nodeid (u32) = 2\n\
nodelist.node.1.ring0_addr (str) = 10.0.0.2\n";

/// A path of one node to one modelled LU, as discovery would report it.
#[derive(Clone)]
struct ModelPathSpec {
    dev: PathBuf,
    lu: usize,
    nexus: Nexus,
}

/// One node's view: its paths to the shared LUs (on its [`ModelHost`], which also answers for
/// corosync and records sleeps), its own key store.
struct ModelSystem {
    paths: Vec<ModelPathSpec>,
    host: Arc<ModelHost>,
    store: KeyStore,
    _dir: tempfile::TempDir,
}

impl ModelPathSpec {
    fn nexus_index(&self) -> String {
        format!("{:?}", self.nexus)
            .chars()
            .filter(char::is_ascii_digit)
            .collect()
    }
}

/// A VPD page 83h with one NAA designator, different per LU.
fn designator(lu: usize) -> Vec<u8> {
    let mut naa = [0u8; 16];
    naa[0] = 0x60;
    naa[1] = 0x01;
    naa[2] = 0x40;
    naa[3] = 0x50;
    naa[15] = u8::try_from(lu).unwrap();
    // Designator: code set binary, association LU, type NAA, length 16.
    let mut page = vec![0x00, 0x83, 0x00, 20, 0x01, 0x03, 0x00, 16];
    page.extend_from_slice(&naa);
    page
}

/// Shared LUs; nodes connect to them with `paths` paths each.
struct Cluster {
    lus: Arc<Vec<Arc<Mutex<ModelLu>>>>,
}

impl Cluster {
    fn new(count: usize) -> Cluster {
        Cluster {
            lus: Arc::new(
                (0..count)
                    .map(|_| Arc::new(Mutex::new(ModelLu::new(Quirks::lio()))))
                    .collect(),
            ),
        }
    }

    fn node(&self, node: &str, paths: usize) -> ModelSystem {
        let mut specs = Vec::new();
        for (lu, model) in self.lus.iter().enumerate() {
            for p in 0..paths {
                let nexus = model.lock().unwrap().connect(
                    TransportId::Iscsi {
                        name: format!("iqn.2026-11.lab:{node}"),
                        isid: Some(format!("23d00000{p}")),
                    },
                    u16::try_from(p + 1).unwrap(),
                );
                specs.push(ModelPathSpec {
                    dev: PathBuf::from(format!("/dev/{node}-lu{lu}-p{p}")),
                    lu,
                    nexus,
                });
            }
        }
        let host = ModelHost::new().with_not_ready_backoff(Duration::from_millis(1));
        host.set_corosync("totem.cluster_name", CMAP_NAME);
        host.set_corosync("nodelist", CMAP_NODES);
        for spec in &specs {
            host.attach(
                LuId::from_vpd_pg83(&designator(spec.lu)).unwrap(),
                PathInfo {
                    dev: spec.dev.clone(),
                    given: spec.dev.clone(),
                    name: spec.dev.display().to_string(),
                    protocol: Protocol::Scsi,
                    hctl: format!("{}:0:0:{}", spec.nexus_index(), spec.lu),
                    state: SysfsState::Running,
                    transport: None,
                    generic: None,
                },
                ModelDevice::new(Arc::clone(&self.lus[spec.lu]), spec.nexus, &spec.dev),
            );
        }
        let dir = tempfile::tempdir().unwrap();
        ModelSystem {
            paths: specs,
            host: Arc::new(host),
            store: KeyStore::new(dir.path().join("cluster")),
            _dir: dir,
        }
    }

    fn keys(&self, lu: usize) -> Vec<Key> {
        self.lus[lu]
            .lock()
            .unwrap()
            .registrations()
            .iter()
            .map(|r| r.key)
            .collect()
    }
}

impl ModelSystem {
    /// fence_pr's view of this node now.
    fn fence_node(&self) -> FenceNode {
        FenceNode::new(Arc::clone(&self.host) as Arc<dyn Host>, self.store.clone())
    }

    fn devices(&self) -> String {
        self.paths
            .iter()
            .map(|p| p.dev.display().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// node1 and node2 with `a_paths` and `b_paths` paths to `lus` shared LUs, both unfenced (`on`).
fn both_on(lus: usize, a_paths: usize, b_paths: usize) -> (Cluster, ModelSystem, ModelSystem) {
    let cluster = Cluster::new(lus);
    let a = cluster.node("node1", a_paths);
    let b = cluster.node("node2", b_paths);
    assert_eq!(on(&a, "node1").0, FencePrExit::Success);
    assert_eq!(on(&b, "node2").0, FencePrExit::Success);
    (cluster, a, b)
}

/// Runs the agent with stdin `lines` (what Pacemaker sends); returns exit code and stdout.
fn agent(system: &ModelSystem, lines: &str) -> (FencePrExit, String) {
    let env = Environment {
        pcmk_service: Some("pacemaker-fenced".into()),
    };
    let request = match parse::<&str>(&[], Some(lines), &env) {
        Ok(request) => request,
        Err(e) => return (e.exit_code(), e.to_string()),
    };
    let mut out = Vec::new();
    let code = execute(&request, &system.fence_node(), "fence_pr", &mut out);
    (code, String::from_utf8(out).unwrap())
}

fn on(system: &ModelSystem, node: &str) -> (FencePrExit, String) {
    agent(
        system,
        &format!("action=on\nnodename={node}\ndevices={}\n", system.devices()),
    )
}

// fence_scsi's keys for cluster "lab": md5("lab")[:4] + positional index.
fn scsi_key(position: u32) -> Key {
    let cluster = &keys::fence_scsi_hash_key_string("lab", "x")[..4];
    Key::new(u64::from_str_radix(&format!("{cluster}{position:04}"), 16).unwrap())
}

#[test]
fn on_registers_the_derived_key_reserves_and_records_key_and_devices() {
    let cluster = Cluster::new(2);
    let a = cluster.node("node1", 2);
    let (code, out) = on(&a, "node1");
    assert_eq!(code, FencePrExit::Success, "{out}");
    assert_eq!(out, "Success: Powered ON\n");
    let key = scsi_key(0);
    for lu in 0..2 {
        assert_eq!(cluster.keys(lu), vec![key, key], "two paths registered");
        assert!(cluster.lus[lu].lock().unwrap().reservation().is_some());
    }
    assert_eq!(a.store.read_key().unwrap(), Some(key.get()));
    let devs = a.store.read_devices().unwrap().unwrap();
    assert_eq!(devs.len(), 4, "{devs:?}");
    // Idempotent (P4).
    assert_eq!(on(&a, "node1").0, FencePrExit::Success);
    assert_eq!(a.store.read_devices().unwrap().unwrap().len(), 4);
}

/// Pacemaker may ask a node it has just fenced to unfence while it still runs (its default
/// fence-reaction=stop). The node's record of this boot (`<stem>.lus`) makes `on` refuse the LUs
/// it registered on before; a reboot (a new /run, so no record) is the way back.
#[test]
fn on_after_being_fenced_in_this_boot_is_refused_until_a_reboot() {
    let (cluster, a, b) = both_on(2, 1, 2);
    assert_eq!(b.store.read_lus(scsi_key(1).get()).unwrap().len(), 2);
    assert!(b.store.read_lus(scsi_key(0).get()).unwrap().is_empty());
    let off = format!("action=off\nport=node2\ndevices={}\n", a.devices());
    assert_eq!(agent(&a, &off).0, FencePrExit::Success);
    // What `execute` logs; the exit code is checked through `agent` below.
    let request = parse::<&str>(
        &[],
        Some(&format!(
            "action=on\nnodename=node2\ndevices={}\n",
            b.devices()
        )),
        &Environment::default(),
    )
    .unwrap();
    let Err(Failed(message)) = unfence(&request, &b.fence_node(), &mut Vec::new(), Instant::now())
    else {
        panic!("`on` after a fence succeeded");
    };
    assert!(
        message.contains("THIS NODE WAS FENCED") && message.contains("Reboot it"),
        "{message}"
    );
    assert!(message.contains("prfence unfence --key"), "{message}");
    assert_eq!(on(&b, "node2").0, FencePrExit::Error);
    for lu in 0..2 {
        assert_eq!(
            cluster.keys(lu),
            vec![scsi_key(0)],
            "LU {lu}: node2 must stay out"
        );
    }
    // A reboot clears /run.
    std::fs::remove_file(b.store.lus_path()).unwrap();
    assert_eq!(on(&b, "node2").0, FencePrExit::Success);
    for lu in 0..2 {
        assert_eq!(
            cluster.keys(lu),
            vec![scsi_key(0), scsi_key(1), scsi_key(1)]
        );
    }
}

#[test]
fn off_preempts_the_victim_with_the_stored_own_key_after_the_delay() {
    let (cluster, a, _) = both_on(2, 1, 1);
    let (code, out) = agent(
        &a,
        &format!(
            "action=off\nnodename=node2\ndelay=3\npower_wait=1\ndevices={}\n",
            a.devices()
        ),
    );
    assert_eq!(code, FencePrExit::Success, "{out}");
    assert_eq!(out, "Success: Powered OFF\n");
    assert_eq!(
        a.host.slept(),
        vec![Duration::from_secs(3), Duration::from_secs(1)],
        "delay before, power_wait after"
    );
    for lu in 0..2 {
        assert_eq!(cluster.keys(lu), vec![scsi_key(0)]);
    }
    // Again: already off, still success (P4).
    let (code, out) = agent(
        &a,
        &format!("action=off\nport=node2\ndevices={}\n", a.devices()),
    );
    assert_eq!(
        (code, out.as_str()),
        (FencePrExit::Success, "Success: Already OFF\n")
    );
    // status of node2 is now OFF, of node1 ON.
    let status = |node: &str| {
        agent(
            &a,
            &format!("action=status\nport={node}\ndevices={}\n", a.devices()),
        )
    };
    assert_eq!(status("node2"), (FencePrExit::Off, "Status: OFF\n".into()));
    assert_eq!(
        status("node1"),
        (FencePrExit::Success, "Status: ON\n".into())
    );
}

#[test]
fn off_without_a_stored_key_or_against_itself_fails_untouched() {
    let cluster = Cluster::new(1);
    let a = cluster.node("node1", 1);
    let b = cluster.node("node2", 1);
    assert_eq!(on(&b, "node2").0, FencePrExit::Success);
    let off = |s: &ModelSystem, node: &str| {
        agent(
            s,
            &format!("action=off\nport={node}\ndevices={}\n", s.devices()),
        )
        .0
    };
    // node1 never ran `on`: it has no key to preempt with.
    assert_eq!(off(&a, "node2"), FencePrExit::Error);
    // node2 fencing itself.
    assert_eq!(off(&b, "node2"), FencePrExit::Error);
    assert_eq!(cluster.keys(0), vec![scsi_key(1)]);
}

#[test]
fn off_and_monitor_find_the_key_fence_scsi_kept_before_2021() {
    let (cluster, mut a, _) = both_on(1, 1, 1);
    // node1 was unfenced by an older fence_scsi: its key is only in <run>/cluster/fence_scsi.key.
    let legacy = a._dir.path().join("cluster").join("fence_scsi");
    std::fs::create_dir_all(a._dir.path().join("cluster")).unwrap();
    std::fs::rename(a.store.key_path(), legacy.with_extension("key")).unwrap();
    let off = |s: &ModelSystem| {
        agent(
            s,
            &format!("action=off\nport=node2\ndevices={}\n", s.devices()),
        )
    };
    // A store without the legacy stem finds no key to preempt with.
    let (exit, err) = off(&a);
    assert_eq!(exit, FencePrExit::Error, "{err}");
    a.store = a.store.clone().with_legacy(&legacy);
    let monitor = agent(&a, &format!("action=monitor\ndevices={}\n", a.devices()));
    assert_eq!(monitor.0, FencePrExit::Success, "{}", monitor.1);
    assert_eq!(off(&a).0, FencePrExit::Success);
    assert_eq!(cluster.keys(0), vec![scsi_key(0)]);
}

#[test]
fn the_loser_of_a_fence_race_exits_1_and_touches_nothing() {
    let (cluster, a, b) = both_on(2, 1, 1);
    let off = |s: &ModelSystem, node: &str| {
        agent(
            s,
            &format!("action=off\nport={node}\ndevices={}\n", s.devices()),
        )
        .0
    };
    assert_eq!(off(&b, "node1"), FencePrExit::Success);
    assert_eq!(off(&a, "node2"), FencePrExit::Error);
    for lu in 0..2 {
        assert_eq!(cluster.keys(lu), vec![scsi_key(1)]);
    }
}

#[test]
fn status_is_on_if_the_key_is_on_any_lu_and_unknown_if_unreadable() {
    let cluster = Cluster::new(2);
    let a = cluster.node("node1", 1);
    assert_eq!(on(&a, "node1").0, FencePrExit::Success);
    // Remove node1's key from LU 1 only (as a half-finished fence would leave it).
    let nexus = a.paths.iter().find(|p| p.lu == 1).unwrap().nexus;
    cluster.lus[1]
        .lock()
        .unwrap()
        .pr_out(nexus, &PrOut::register(scsi_key(0), Key::ZERO))
        .unwrap();
    let status = agent(
        &a,
        &format!("action=status\nport=node1\ndevices={}\n", a.devices()),
    );
    assert_eq!(status, (FencePrExit::Success, "Status: ON\n".into()));
    // LU 0 through a vanished device only, LU 1 readable without the key: cannot say OFF.
    let lu1 = a
        .paths
        .iter()
        .find(|p| p.lu == 1)
        .unwrap()
        .dev
        .display()
        .to_string();
    let status = agent(
        &a,
        &format!("action=status\nport=node1\ndevices=/dev/gone,{lu1}\n"),
    );
    assert_eq!(status.0, FencePrExit::Error);
}

#[test]
fn monitor_probes_lus_warns_on_a_dead_path_and_fails_without_the_key() {
    let cluster = Cluster::new(2);
    let a = cluster.node("node1", 2);
    let monitor = |devices: &str| agent(&a, &format!("action=monitor\ndevices={devices}\n")).0;
    // Never unfenced: no key to check, as fence_scsi.
    assert_eq!(monitor(&a.devices()), FencePrExit::Error);
    assert_eq!(on(&a, "node1").0, FencePrExit::Success);
    assert_eq!(monitor(&a.devices()), FencePrExit::Success);
    // One path of LU 0 disconnected: degraded but reachable.
    let first = &a.paths[0];
    cluster.lus[first.lu]
        .lock()
        .unwrap()
        .disconnect(first.nexus);
    assert_eq!(monitor(&a.devices()), FencePrExit::Success);
    // Every path of LU 0 gone: unreachable.
    let second = &a.paths[1];
    cluster.lus[second.lu]
        .lock()
        .unwrap()
        .disconnect(second.nexus);
    assert_eq!(monitor(&a.devices()), FencePrExit::Error);
}

/// Issue 47: with LU 0 the data LU and LUs 1-3 coordinators, a coordinator lost is a warning
/// while this node's key answers on a majority of them (off still wins), a failure below it.
#[test]
fn monitor_warns_on_a_coordinator_lost_and_fails_below_a_majority() {
    let cluster = Cluster::new(4);
    let a = cluster.node("node1", 1);
    let devices = |lus: &[usize]| -> String {
        a.paths
            .iter()
            .filter(|p| lus.contains(&p.lu))
            .map(|p| p.dev.display().to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let lines = |action: &str| {
        format!(
            "action={action}\nnodename=node1\ndevices={}\ncoordinators={}\n",
            devices(&[0]),
            devices(&[1, 2, 3])
        )
    };
    assert_eq!(agent(&a, &lines("on")).0, FencePrExit::Success);
    assert_eq!(agent(&a, &lines("monitor")).0, FencePrExit::Success);
    let lose = |lu: usize| {
        let path = a.paths.iter().find(|p| p.lu == lu).unwrap();
        cluster.lus[lu].lock().unwrap().disconnect(path.nexus);
    };
    lose(3);
    assert_eq!(
        agent(&a, &lines("monitor")).0,
        FencePrExit::Success,
        "2 of 3 coordinators answer: off still wins"
    );
    lose(2);
    assert_eq!(agent(&a, &lines("monitor")).0, FencePrExit::Error);
}

#[test]
fn monitor_fails_when_this_node_was_fenced() {
    let (_, a, b) = both_on(1, 1, 1);
    let off = agent(
        &b,
        &format!("action=off\nport=node1\ndevices={}\n", b.devices()),
    );
    assert_eq!(off.0, FencePrExit::Success);
    let monitor = agent(&a, &format!("action=monitor\ndevices={}\n", a.devices()));
    assert_eq!(monitor.0, FencePrExit::Error);
}

#[test]
fn aptpl_and_single_path_registration() {
    let cluster = Cluster::new(1);
    let a = cluster.node("node1", 2);
    let (code, _) = agent(
        &a,
        &format!(
            "action=on\nport=node1\naptpl=1\nmpath_register_method=single\ndevices={}\n",
            a.devices()
        ),
    );
    assert_eq!(code, FencePrExit::Success);
    let lu = cluster.lus[0].lock().unwrap();
    assert!(lu.aptpl(), "APTPL requested with the registration");
    assert_eq!(lu.registered_key(a.paths[0].nexus), Some(scsi_key(0)));
    assert_eq!(
        lu.registered_key(a.paths[1].nexus),
        None,
        "single: one path"
    );
}

#[test]
fn a_vanished_device_stops_off_before_anything_is_sent() {
    let (cluster, a, _) = both_on(1, 1, 1);
    let mut both = vec![scsi_key(0), scsi_key(1)];
    both.sort();
    let (code, _) = agent(
        &a,
        &format!(
            "action=off\nport=node2\ndevices=/dev/gone,{}\n",
            a.devices()
        ),
    );
    // The vanished device could be the LU other nodes make the arbiter (P2): nothing is sent.
    assert_eq!(code, FencePrExit::Error);
    let mut keys = cluster.keys(0);
    keys.sort();
    assert_eq!(keys, both);
    // Without it, the same request fences.
    let (code, _) = agent(
        &a,
        &format!("action=off\nport=node2\ndevices={}\n", a.devices()),
    );
    assert_eq!(code, FencePrExit::Success);
    assert_eq!(cluster.keys(0), vec![scsi_key(0)]);
}

#[test]
fn list_prints_every_corosync_node_and_list_status_their_state() {
    let cluster = Cluster::new(1);
    let a = cluster.node("node1", 1);
    assert_eq!(on(&a, "node1").0, FencePrExit::Success);
    assert_eq!(
        agent(&a, "action=list\n"),
        (FencePrExit::Success, "node1,node1\nnode2,node2\n".into())
    );
    assert_eq!(
        agent(
            &a,
            &format!("action=list-status\ndevices={}\n", a.devices())
        ),
        (
            FencePrExit::Success,
            "node1,node1,ON\nnode2,node2,OFF\n".into()
        )
    );
    a.host.set_corosync("nodelist", "");
    assert_eq!(agent(&a, "action=list\n").0, FencePrExit::Error);
}

#[test]
fn native_keys_and_explicit_keys_are_used_as_given() {
    let cluster = Cluster::new(1);
    let a = cluster.node("node1", 1);
    let (code, _) = agent(
        &a,
        &format!(
            "action=on\nport=node1\nkey_value=native\ndevices={}\n",
            a.devices()
        ),
    );
    assert_eq!(code, FencePrExit::Success);
    assert_eq!(
        cluster.keys(0),
        vec![Key::new(NativeKey::new("lab", 1).value())]
    );
    let (code, _) = agent(
        &a,
        &format!("action=on\nkey=0xabc\ndevices={}\n", a.devices()),
    );
    assert_eq!(code, FencePrExit::Success);
    assert_eq!(a.store.read_key().unwrap(), Some(0xabc));
}

#[test]
fn metadata_and_validate_all_need_no_node() {
    let cluster = Cluster::new(1);
    let a = cluster.node("node1", 1);
    let (code, out) = agent(&a, "action=metadata\n");
    assert_eq!(code, FencePrExit::Success);
    assert!(out.starts_with("<?xml") && out.contains("fence_pr"));
    assert_eq!(
        agent(&a, "action=validate-all\nport=node1\n").0,
        FencePrExit::Success
    );
    assert_eq!(
        agent(&a, "action=reboot\nport=node1\n").0,
        FencePrExit::Error
    );
}

#[test]
fn fence_pr_hints_in_terms_of_its_own_parameters() {
    let timed_out = CommandError::without_completion(
        Path::new("/dev/sdq"),
        crate::transport::Command::PrIn(crate::pr::PrInAction::ReadKeys),
        ErrorKind::Timeout,
        "no completion within 10000 ms",
    );
    let open: Opener<ScsiPr<ModelDevice>> = Arc::new(move |_: &Path| Err(timed_out.clone()));
    let path = FencePrPath {
        inner: Arc::new(OpenPath::new(Path::new("/dev/sdq"), open)),
        aptpl: false,
    };
    let lus = vec![LuTarget {
        id: "naa.6001405aaaa".into(),
        paths: vec![path],
    }];
    let report = shown(crate::ops::status(lus, Key::new(0xa), Limits::default())).unwrap();
    let e = report.lus[0].paths[0].error.as_ref().unwrap();
    assert!(e.to_string().ends_with("or raise power_timeout"), "{e}");
    assert!(!e.to_string().contains("--timeout"), "{e}");
}

/// `monitor`'s REPORT CAPABILITIES probes end at the action's deadline: a path whose open
/// blocks (far longer than the test) costs a warning for its LU, the others answer.
#[test]
fn capability_probes_stop_waiting_at_the_deadline() {
    const HANG: Duration = Duration::from_secs(30);
    let lu = Arc::new(Mutex::new(ModelLu::new(Quirks::lio())));
    let nexus = lock_lu(&lu).connect(
        TransportId::Iscsi {
            name: "iqn.2026-11.lab:node1".to_owned(),
            isid: Some("0x1".to_owned()),
        },
        1,
    );
    let open: Opener<ScsiPr<ModelDevice>> = Arc::new(move |device: &Path| {
        if device == Path::new("/dev/sdhung") {
            std::thread::sleep(HANG);
        }
        Ok(ScsiPr::new(
            ModelDevice::new(Arc::clone(&lu), nexus, device),
            Policy::default(),
        ))
    });
    let target = |id: &str, dev: &str| LuTarget {
        id: id.into(),
        paths: vec![FencePrPath {
            inner: Arc::new(OpenPath::new(Path::new(dev), Arc::clone(&open))),
            aptpl: false,
        }],
    };
    let lus = vec![target("naa.1", "/dev/sdb"), target("naa.2", "/dev/sdhung")];
    let started = Instant::now();
    let until = started + Duration::from_millis(300);
    let found = collect_capability_probes(spawn_capability_probes(&lus), until);
    let took = started.elapsed();
    println!("REPORT CAPABILITIES on 2 LUs, one open blocked for {HANG:?}: {took:?}");
    assert!(took < Duration::from_millis(1300), "{took:?}");
    assert_eq!(found[0], None, "the model supports WERO");
    match &found[1] {
        Some(Ok(warning)) => assert!(
            warning.starts_with("naa.2") && warning.contains("deadline"),
            "{warning}"
        ),
        other => panic!("{other:?}"),
    }
}

fn lock_lu(lu: &Mutex<ModelLu>) -> std::sync::MutexGuard<'_, ModelLu> {
    lu.lock().unwrap()
}

/// node1's `off` of node2: its exit, its output and the corosync-cmapctl runs it made.
fn off_node2_from(a: &ModelSystem) -> (FencePrExit, String, Vec<Vec<String>>) {
    let before = a.host.corosync_runs().len();
    let (code, out) = agent(
        a,
        &format!("action=off\nnodename=node2\ndevices={}\n", a.devices()),
    );
    (code, out, a.host.corosync_runs()[before..].to_vec())
}

fn runs(args: &[&[&str]]) -> Vec<Vec<String>> {
    args.iter()
        .map(|run| run.iter().map(|a| (*a).to_owned()).collect())
        .collect()
}

#[test]
fn off_asks_corosync_for_the_cluster_name_and_the_nodelist_in_one_run() {
    let (cluster, a, _) = both_on(1, 1, 1);
    let (code, out, asked) = off_node2_from(&a);
    assert_eq!(code, FencePrExit::Success, "{out}");
    assert_eq!(cluster.keys(0), vec![scsi_key(0)]);
    assert_eq!(asked, runs(&[&["totem.cluster_name", "nodelist"]]));
}

#[test]
fn a_cmapctl_that_takes_one_argument_is_asked_one_query_per_run_at_once() {
    let (cluster, a, _) = both_on(1, 1, 1);
    a.host.corosync_takes_one_argument();
    // Asked one after the other, the first single query would wait for a second that never
    // begins (the refused run of both is not counted: it fails before it would wait).
    a.host.corosync_queries_meet(2);
    let (code, out, mut asked) = off_node2_from(&a);
    assert_eq!(code, FencePrExit::Success, "{out}");
    assert_eq!(cluster.keys(0), vec![scsi_key(0)]);
    asked[1..].sort();
    assert_eq!(
        asked,
        runs(&[
            &["totem.cluster_name", "nodelist"],
            &["nodelist"],
            &["totem.cluster_name"]
        ])
    );
}

/// A part the run of both printed nothing for is asked alone (a wrapper may ignore a second
/// argument); corosync's own empty answer then fails the fence as it would have.
#[test]
fn an_empty_part_of_the_run_of_both_is_asked_again_alone() {
    let (cluster, a, _) = both_on(1, 1, 1);
    a.host.set_corosync("nodelist", "");
    let (code, out, asked) = off_node2_from(&a);
    assert_eq!(code, FencePrExit::Error, "{out}");
    assert_eq!(cluster.keys(0), vec![scsi_key(0), scsi_key(1)]);
    assert_eq!(
        asked,
        runs(&[&["totem.cluster_name", "nodelist"], &["nodelist"]])
    );
}

/// [`FencePrRequest::corosync_queries`] names exactly what [`FencePrRequest::target_key`] asks.
#[test]
fn corosync_queries_are_the_ones_the_key_derivation_makes() {
    for key_value in ["id", "hash", "native"] {
        for extra in ["", "nodeid=2\n", "key=0x5\n"] {
            let lines = format!("action=off\nplug=node2\nkey_value={key_value}\n{extra}");
            let request = parse::<&str>(&[], Some(&lines), &Environment::default()).unwrap();
            let mut asked = Vec::new();
            request
                .target_key(|arg| {
                    asked.push(arg.to_owned());
                    Ok(match arg {
                        keys::CLUSTER_NAME_QUERY => CMAP_NAME.to_owned(),
                        _ => CMAP_NODES.to_owned(),
                    })
                })
                .unwrap();
            assert_eq!(asked, request.corosync_queries(), "{lines}");
        }
    }
}

/// fence-agents #289: with key_value=id a node's key is its nodelist position. node2 is removed
/// from the middle of a three-node nodelist; node3 moves to position 1 but still holds the key
/// of position 2. node1's `off` of node3 derives position 1's key: it must not report node3 off
/// while node3's key stays, whether node2's old key was left behind (the derived key is there,
/// and it is node2's) or fenced first (the derived key is nowhere: "already off").
#[test]
fn off_of_a_node_whose_position_moved_is_not_reported_done() {
    let three = "nodelist.node.0.name (str) = node1\n\
                 nodelist.node.1.name (str) = node2\n\
                 nodelist.node.2.name (str) = node3\n";
    let two = "nodelist.node.0.name (str) = node1\n\
               nodelist.node.1.name (str) = node3\n";
    for node2_fenced_first in [false, true] {
        let cluster = Cluster::new(2);
        let nodes: Vec<ModelSystem> = ["node1", "node2", "node3"]
            .iter()
            .map(|name| {
                let node = cluster.node(name, 1);
                node.host.set_corosync("nodelist", three);
                assert_eq!(on(&node, name).0, FencePrExit::Success);
                node
            })
            .collect();
        let off = |victim: &str| {
            agent(
                &nodes[0],
                &format!(
                    "action=off\nport={victim}\ndevices={}\n",
                    nodes[0].devices()
                ),
            )
        };
        if node2_fenced_first {
            assert_eq!(off("node2").0, FencePrExit::Success);
        }
        for node in &nodes {
            node.host.set_corosync("nodelist", two);
        }
        let (code, out) = off("node3");
        assert_eq!(code, FencePrExit::Error, "{out}");
        // Nor is it reported OFF by `status`, or by `list-status`.
        let status = agent(
            &nodes[0],
            &format!(
                "action=status\nport=node3\ndevices={}\n",
                nodes[0].devices()
            ),
        );
        assert_eq!(status.0, FencePrExit::Error, "{}", status.1);
        let listed = agent(
            &nodes[0],
            &format!("action=list-status\ndevices={}\n", nodes[0].devices()),
        );
        assert!(listed.1.contains("node3,node3,UNKNOWN"), "{}", listed.1);
        for lu in 0..2 {
            assert!(
                cluster.keys(lu).contains(&scsi_key(2)),
                "node3's key is still on LU {lu}: {:?}",
                cluster.keys(lu)
            );
        }
    }
}
