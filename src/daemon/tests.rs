//! The driver end to end over the SPC model: real codec, real execution policy, injected
//! storage, tokio's paused clock (time jumps to the next timer whenever every task waits, so a
//! 10 s lease takes milliseconds).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::agent::{Agent, AgentParts, Control, RunEnd};
use super::config::Settings;
use super::lock;
use super::os::notify::Notifier;
use super::status::{State, Status};
use crate::discover::{IscsiSession, LuId, PathInfo, PathState};
use crate::host::Host;
use crate::pr::{Key, PrOut, ReservationType};
use crate::spc_model::{Injected, ModelDevice, ModelLu, Nexus, Quirks};
use crate::testing::ModelHost;
use crate::transport::Protocol;

const KA: Key = Key::new(0xa1);
const KB: Key = Key::new(0xb2);
const WERO: ReservationType = ReservationType::WriteExclusiveRegistrantsOnly;

/// Adds (or replaces, a re-login) a path `dev` of the configured `device` on `host`, reaching
/// `lu` as `nexus` through iSCSI session `session`.
fn path(
    host: &ModelHost,
    device: &str,
    id: &str,
    lu: &Arc<Mutex<ModelLu>>,
    nexus: Nexus,
    dev: &str,
    session: &str,
) {
    path_of(host, device, id, lu, nexus, dev, session, "");
}

/// [`path`] through a session of iSCSI initiator name `initiator` (empty: not known).
#[allow(clippy::too_many_arguments)]
fn path_of(
    host: &ModelHost,
    device: &str,
    id: &str,
    lu: &Arc<Mutex<ModelLu>>,
    nexus: Nexus,
    dev: &str,
    session: &str,
    initiator: &str,
) {
    let path = PathInfo {
        dev: PathBuf::from(dev),
        given: PathBuf::from(device),
        name: dev.trim_start_matches("/dev/").to_owned(),
        protocol: Protocol::Scsi,
        hctl: String::new(),
        state: PathState::Running,
        transport: Some(IscsiSession {
            session: session.to_owned(),
            target: String::new(),
            initiator: initiator.to_owned(),
            iface: None,
            tpgt: None,
            isid: None,
        }),
        generic: None,
    };
    host.attach(
        LuId::from_wwid(id).unwrap(),
        path,
        ModelDevice::new(Arc::clone(lu), nexus, dev),
    );
}

/// Path `dev` of /dev/mapper/lu0 (LU `naa.0`) on `host`, reaching `lu` as `nexus`.
fn lu0_path(host: &ModelHost, lu: &Arc<Mutex<ModelLu>>, nexus: Nexus, dev: &str, session: &str) {
    path(host, "/dev/mapper/lu0", "naa.0", lu, nexus, dev, session);
}

/// A node with one path to `lu` (as nexus `nexus`): /dev/sd0 of /dev/mapper/lu0.
fn one_path_node(lu: &Arc<Mutex<ModelLu>>, nexus: Nexus) -> Arc<ModelHost> {
    let node = Arc::new(ModelHost::new());
    lu0_path(&node, lu, nexus, "/dev/sd0", "session1");
    node
}

use crate::spc_model::iscsi_initiator as iscsi;

fn model_lu() -> Arc<Mutex<ModelLu>> {
    Arc::new(Mutex::new(ModelLu::new(Quirks::lio())))
}

fn connect(lu: &Arc<Mutex<ModelLu>>, node: &str, isid: &str) -> Nexus {
    lock(lu).connect(iscsi(node, isid), 1)
}

fn register(lu: &Arc<Mutex<ModelLu>>, nexus: Nexus, key: Key) {
    lock(lu)
        .pr_out(nexus, &PrOut::register_ignore(key))
        .unwrap();
}

struct Running {
    task: tokio::task::JoinHandle<RunEnd>,
    control: mpsc::UnboundedSender<Control>,
    status: Arc<Mutex<Status>>,
    metrics: Arc<Mutex<super::metrics::Metrics>>,
    host: Arc<ModelHost>,
}

fn start(settings: Settings, storage: &Arc<ModelHost>, key: Option<Key>) -> Running {
    start_with_sys(settings, storage, PathBuf::from("/nonexistent"), key)
}

/// Waits (in paused time) until `what` holds, at most `within`.
async fn wait_for(
    status: &Arc<Mutex<Status>>,
    within: Duration,
    what: impl Fn(&Status) -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if what(&lock(status)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    what(&lock(status))
}

/// Waits for `what` on the real clock: the self-fence hook runs on a thread of its own, which
/// the paused test clock does not wait for (it jumps ahead while the runtime is idle).
async fn real_wait(within: Duration, what: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if what() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    what()
}

fn hook(file: &Path) -> String {
    format!(
        "command = [\"/bin/sh\", \"-c\", \"echo fenced >> {}\"]\n",
        file.display()
    )
}

fn watch_settings(devices: &[&str], self_fence: &str) -> Settings {
    let mut text =
        String::from("mode = \"watch\"\ncheck_interval = \"1s\"\ncommand_timeout = \"1s\"\n");
    for device in devices {
        text += &format!(
            "[[device]]\npath = \"{device}\"\nname = \"{}\"\n",
            device.trim_start_matches("/dev/mapper/")
        );
    }
    text += &format!(
        "[key]\nvalue = \"{KA}\"\n[watch]\ngrace = \"10s\"\npath_audit = \"1m\"\n[self_fence]\n{self_fence}"
    );
    Settings::from_toml_str(&text).unwrap()
}

fn lines(file: &Path) -> usize {
    std::fs::read_to_string(file)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Two LUs, node A registered on both through one path each, node B registered too.
struct TwoLus {
    storage: Arc<ModelHost>,
    lus: [Arc<Mutex<ModelLu>>; 2],
    b: [Nexus; 2],
}

fn two_lus() -> TwoLus {
    let (storage, lus, b) = lus(2);
    let [lu0, lu1]: [Arc<Mutex<ModelLu>>; 2] = lus.try_into().unwrap();
    TwoLus {
        storage,
        lus: [lu0, lu1],
        b: [b[0], b[1]],
    }
}

/// `n` LUs, /dev/mapper/lu0…, node A registered on each through one path (/dev/sd0…), node B
/// registered too (its nexuses returned).
fn lus(n: usize) -> (Arc<ModelHost>, Vec<Arc<Mutex<ModelLu>>>, Vec<Nexus>) {
    let storage = Arc::new(ModelHost::new());
    let lus: Vec<_> = (0..n).map(|_| model_lu()).collect();
    let mut b = Vec::new();
    for (i, lu) in lus.iter().enumerate() {
        let a = connect(lu, "nodea", "0x1");
        let nb = connect(lu, "nodeb", "0x1");
        register(lu, a, KA);
        register(lu, nb, KB);
        b.push(nb);
        let name = format!("lu{i}");
        path(
            &storage,
            &format!("/dev/mapper/{name}"),
            &format!("naa.{i}"),
            lu,
            a,
            &format!("/dev/sd{i}"),
            "session1",
        );
    }
    (storage, lus, b)
}

#[tokio::test(start_paused = true)]
async fn watch_fences_when_the_key_leaves_any_lu_and_runs_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let fenced_file = dir.path().join("fenced");
    let t = two_lus();
    let settings = watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], &hook(&fenced_file));
    let run = start(settings, &t.storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );

    // Node B preempts A on the second LU only (fence-agents #278: one LU is enough).
    let preempted_at = Instant::now();
    lock(&t.lus[1])
        .pr_out(t.b[1], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    // Timed to the decision: the hook after it runs on the real clock, while paused time
    // jumps ahead through the agent's feeds meanwhile.
    assert!(
        wait_for(&run.status, Duration::from_secs(3), |s| s.state
            == State::Fenced)
        .await
    );
    let took = preempted_at.elapsed();
    let outcome = run.task.await.unwrap();
    assert_eq!(outcome, RunEnd::Fenced { exit_status: 86 });
    assert!(
        took <= Duration::from_secs(3),
        "two confirmations at 1 s: {took:?}"
    );
    assert_eq!(lines(&fenced_file), 1, "the hook ran once");
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::Fenced);
    let reason = status.fenced_reason.unwrap();
    assert!(
        reason.contains("lu1") && reason.contains("gone"),
        "{reason}"
    );
    assert!(
        lock(&run.metrics)
            .render(Instant::now().into_std())
            .contains("prfence_fenced 1")
    );
    assert_eq!(run.host.reboots(), 0, "reboot is off by default");
}

#[tokio::test(start_paused = true)]
async fn fenced_is_latched_even_if_the_key_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let fenced_file = dir.path().join("fenced");
    let t = two_lus();
    let settings = watch_settings(
        &["/dev/mapper/lu0", "/dev/mapper/lu1"],
        &format!("{}exit = false\nreboot = true\n", hook(&fenced_file)),
    );
    let run = start(settings, &t.storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    lock(&t.lus[0])
        .pr_out(t.b[0], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Fenced)
        .await
    );
    assert!(
        real_wait(Duration::from_secs(10), || run.host.reboots() > 0).await,
        "no reboot after the hook"
    );
    assert_eq!(run.host.reboots(), 1, "reboot asked for once");
    // Someone registers our key again: the agent stays fenced and runs nothing again (P3).
    let a0 = t.storage.device(Path::new("/dev/sd0")).unwrap().nexus();
    register(&t.lus[0], a0, KA);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(lock(&run.status).state, State::Fenced);
    assert_eq!(lines(&fenced_file), 1);
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

#[tokio::test(start_paused = true)]
async fn nothing_is_judged_before_our_key_is_registered() {
    let storage = Arc::new(ModelHost::new());
    let lu = model_lu();
    let a = connect(&lu, "nodea", "0x1");
    lu0_path(&storage, &lu, a, "/dev/sd0", "session1");
    let run = start(watch_settings(&["/dev/mapper/lu0"], ""), &storage, Some(KA));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        lock(&run.status).state,
        State::WaitingForRegistration,
        "no fence at boot"
    );
    // A metric shows it too, so that an agent that is never armed can be alerted on.
    assert!(has_line(
        &run.metrics,
        "prfence_state{state=\"waiting_for_registration\"} 1"
    ));
    assert!(has_line(&run.metrics, "prfence_state{state=\"healthy\"} 0"));
    register(&lu, a, KA);
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Healthy)
        .await
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(has_line(&run.metrics, "prfence_state{state=\"healthy\"} 1"));
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
    assert_eq!(
        lock(&lu).registered_key(a),
        Some(KA),
        "registrations stay (unregister_on_exit off)"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_lu_fences_after_the_grace() {
    let t = two_lus();
    let settings = watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], "");
    let run = start(settings, &t.storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    let a1 = t.storage.device(Path::new("/dev/sd1")).unwrap().nexus();
    lock(&t.lus[1]).fail_next(a1, Injected::TransportDown, 1000);
    let lost_at = Instant::now();
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Degraded)
        .await
    );
    assert_eq!(run.task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
    let took = lost_at.elapsed();
    assert!(
        (Duration::from_secs(9)..=Duration::from_secs(12)).contains(&took),
        "grace 10 s: {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_relogin_orphan_is_found_by_the_audit_and_left_to_unfence() {
    // #517: sd1 logs in again with a new ISID; the old nexus keeps our key, so the key count
    // still matches the path count and only the per-path probe shows the new nexus unregistered.
    // The agent never registers it (P3: a fence could land between any read and a REGISTER):
    // the LU stays degraded, naming the path, until an explicit unfence registers it.
    let storage = Arc::new(ModelHost::new());
    let lu = model_lu();
    let a1 = connect(&lu, "nodea", "0x1");
    let a2 = connect(&lu, "nodea", "0x2");
    register(&lu, a1, KA);
    register(&lu, a2, KA);
    lu0_path(&storage, &lu, a1, "/dev/sd0", "session1");
    lu0_path(&storage, &lu, a2, "/dev/sd1", "session2");
    let run = start(watch_settings(&["/dev/mapper/lu0"], ""), &storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );

    let a3 = lock(&lu).relogin(a2, "0x3");
    lu0_path(&storage, &lu, a3, "/dev/sd1", "session3");
    assert_eq!(lock(&lu).registered_key(a3), None);
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Degraded
            && s.lus[0].verdict.contains("prfence unfence"))
        .await
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        lock(&lu).registered_key(a3),
        None,
        "the agent registers nothing"
    );
    // The explicit act (what `prfence unfence` sends on that path).
    register(&lu, a3, KA);
    assert!(
        wait_for(&run.status, Duration::from_secs(120), |s| s.state
            == State::Healthy)
        .await
    );
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

#[tokio::test(start_paused = true)]
async fn reload_keeps_state_and_a_new_key_is_judged_from_now() {
    let t = two_lus();
    let devices = ["/dev/mapper/lu0", "/dev/mapper/lu1"];
    let run = start(watch_settings(&devices, ""), &t.storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    let checks = lock(&run.status).checks;
    // Same devices and key: the state (checks, audit) is kept.
    let mut same = watch_settings(&devices, "");
    same.command_timeout = Duration::from_millis(500);
    run.control.send(Control::Reload(Box::new(same))).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::Healthy);
    assert!(status.checks > checks);
    // A key nobody registered: judged at once (no waiting for registration), so it fences.
    let text = "mode = \"watch\"\ncheck_interval = \"1s\"\ncommand_timeout = \"1s\"\n\
         [[device]]\npath = \"/dev/mapper/lu0\"\nname = \"lu0\"\n[key]\nvalue = \"0xc3\"\n";
    run.control
        .send(Control::Reload(Box::new(
            Settings::from_toml_str(text).unwrap(),
        )))
        .unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
}

/// Issue 23: an agent that is not armed says why, per LU: an LU it cannot read (here the open
/// fails, as EMFILE or EPERM would) is no "waiting for registration", which only unfencing ends.
#[tokio::test(start_paused = true)]
async fn not_armed_names_the_cause_per_lu() {
    let t = two_lus();
    lock(&t.lus[0])
        .pr_out(t.b[0], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    t.storage.unplug(Path::new("/dev/sd1"));
    let run = start(
        watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], ""),
        &t.storage,
        Some(KA),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = lock(&run.status).clone();
    assert_eq!(
        status.state,
        State::Degraded,
        "an unreadable LU is no wait for a key"
    );
    assert!(
        status.lus[0].verdict.starts_with("not armed: key")
            && status.lus[0].verdict.contains("not registered"),
        "{:?}",
        status.lus[0]
    );
    assert!(
        status.lus[1]
            .verdict
            .starts_with("not armed: cannot be read")
            && status.lus[1].verdict.contains("no such model device"),
        "{:?}",
        status.lus[1]
    );
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

/// Issue 23: an LU added by SIGHUP before our key is on it (the admin edits `devices` first, then
/// unfences) is not judged until the key is there: waiting is not being fenced. The LUs judged
/// before stay judged, and once registered the new LU is judged like them.
#[tokio::test(start_paused = true)]
async fn a_reload_that_adds_an_unregistered_lu_waits_for_our_key_on_it() {
    let t = two_lus();
    // B preempted A on lu1 long ago: lu1 carries no key of ours.
    lock(&t.lus[1])
        .pr_out(t.b[1], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    let run = start(
        watch_settings(&["/dev/mapper/lu0"], ""),
        &t.storage,
        Some(KA),
    );
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    let both = watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], "");
    run.control
        .send(Control::Reload(Box::new(both.clone())))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::Degraded, "{status:?}");
    assert!(
        status.lus[1].verdict.contains("added by a reload"),
        "{:?}",
        status.lus[1]
    );
    // The admin unfences this node on the new LU: from then on it is judged.
    let a1 = t.storage.device(Path::new("/dev/sd1")).unwrap().nexus();
    register(&t.lus[1], a1, KA);
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    lock(&t.lus[1])
        .pr_out(t.b[1], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
}

/// Issue 47: data LU lu0 and coordinators lu1-lu3. A losing node (B) took A's key from lu1
/// before A's agent started: it arms on the data LU and two of three coordinators, degraded. Our
/// key gone from one more coordinator fences A (2 of 3 gone); nothing was registered.
#[tokio::test(start_paused = true)]
async fn an_agent_arms_on_a_majority_of_coordinators_and_fences_on_a_majority_lost() {
    let (storage, lus, b) = lus(4);
    let preempt = |i: usize| {
        lock(&lus[i])
            .pr_out(b[i], &PrOut::preempt_and_abort(KB, KA, WERO))
            .unwrap();
    };
    preempt(1);
    let mut settings = watch_settings(
        &[
            "/dev/mapper/lu0",
            "/dev/mapper/lu1",
            "/dev/mapper/lu2",
            "/dev/mapper/lu3",
        ],
        "",
    );
    for device in &mut settings.devices[1..] {
        device.coordinator = true;
    }
    let run = start(settings, &storage, Some(KA));
    let armed = |s: &Status| {
        s.state == State::Degraded
            && s.lus[1].coordinator
            && s.lus[1].verdict.starts_with("our key not yet on it")
            && s.lus[2].verdict == "healthy"
            && s.lus[0].verdict == "healthy"
    };
    assert!(
        wait_for(&run.status, Duration::from_secs(10), armed).await,
        "{:?}",
        lock(&run.status)
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!run.task.is_finished(), "{:?}", lock(&run.status));
    preempt(3);
    assert_eq!(run.task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
    let status = lock(&run.status).clone();
    let reason = status.fenced_reason.unwrap_or_default();
    assert!(
        reason.contains("gone from 2 of the 3 coordinators (lu1, lu3)"),
        "{reason}"
    );
    let a1 = storage.device(Path::new("/dev/sd1")).unwrap().nexus();
    assert_eq!(lock(&lus[1]).registered_key(a1), None, "nothing registered");
}

/// Two nodes deriving one key (a node left the middle of the corosync nodelist, another took
/// the freed position): node B's paths hold KA, node A's none. A's agent does not arm on KA
/// listed: it is degraded and says why, and when B's KA goes A is not fenced, having never been
/// unfenced (armed, it self-fenced: rebooted a node that held nothing). Once A's own paths hold
/// KA it arms and is judged as always.
#[tokio::test(start_paused = true)]
async fn an_agent_arms_only_on_a_key_its_own_paths_hold() {
    let t = two_lus();
    let a: Vec<Nexus> = ["/dev/sd0", "/dev/sd1"]
        .iter()
        .map(|d| t.storage.device(Path::new(d)).unwrap().nexus())
        .collect();
    for (lu, (a, b)) in t.lus.iter().zip(a.iter().zip(t.b)) {
        register(lu, *a, Key::new(0));
        register(lu, b, KA);
    }
    let run = start(
        watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], ""),
        &t.storage,
        Some(KA),
    );
    let held_elsewhere = |s: &Status| {
        s.state == State::Degraded
            && s.lus
                .iter()
                .all(|lu| lu.verdict.contains("none of this node's paths holds it"))
    };
    assert!(
        wait_for(&run.status, Duration::from_secs(10), held_elsewhere).await,
        "{:?}",
        lock(&run.status)
    );
    for (lu, a) in t.lus.iter().zip(&a) {
        assert_eq!(
            lock(lu).registered_key(*a),
            None,
            "the agent registered nothing"
        );
    }
    // B's KA goes (B rebooted into its own key): A was never unfenced, so it is not fenced.
    for (lu, b) in t.lus.iter().zip(t.b) {
        register(lu, b, KB);
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        !run.task.is_finished(),
        "the agent ended: {:?}",
        lock(&run.status)
    );
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::WaitingForRegistration, "{status:?}");
    assert!(status.self_fence.is_none(), "{status:?}");
    // A's unfencing: its own paths hold KA; armed, and judged.
    for (lu, a) in t.lus.iter().zip(&a) {
        register(lu, *a, KA);
    }
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await,
        "{:?}",
        lock(&run.status)
    );
    lock(&t.lus[1])
        .pr_out(t.b[1], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
}

/// Issue 44: a hook that a reload adds runs at the self-fence. The hook's thread used to start
/// only with a hook in the configuration at start, and the self-fence skipped a hook that had no
/// thread while the status showed it running.
#[tokio::test(start_paused = true)]
async fn a_hook_added_by_a_reload_runs_at_the_self_fence() {
    let dir = tempfile::tempdir().unwrap();
    let fenced_file = dir.path().join("fenced");
    let t = two_lus();
    let devices = ["/dev/mapper/lu0", "/dev/mapper/lu1"];
    let run = start(watch_settings(&devices, ""), &t.storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    run.control
        .send(Control::Reload(Box::new(watch_settings(
            &devices,
            &hook(&fenced_file),
        ))))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    lock(&t.lus[0])
        .pr_out(t.b[0], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
    assert_eq!(lines(&fenced_file), 1, "the hook added by the reload ran");
    let steps = lock(&run.status).self_fence.unwrap();
    assert_eq!(steps.hook, super::status::HookStep::Ok, "{steps:?}");
}

fn lease_settings(dir: &Path, node: u16, fenced_file: &Path) -> Settings {
    Settings::from_toml_str(&format!(
        "mode = \"lease\"\ncheck_interval = \"1s\"\ncommand_timeout = \"1s\"\n\
         [[device]]\npath = \"/dev/mapper/lu0\"\nname = \"lu0\"\n\
         [lease]\nnode_id = {node}\nrenew = \"2s\"\nlease = \"10s\"\nmargin = \"2s\"\n\
         state_file = \"{}\"\n[self_fence]\n{}command_timeout = \"1s\"\n",
        dir.join(format!("epoch{node}")).display(),
        hook(fenced_file)
    ))
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn lease_takeover_when_the_holder_stalls() {
    let dir = tempfile::tempdir().unwrap();
    let lu = model_lu();
    let n1 = connect(&lu, "node1", "0x1");
    let n2 = connect(&lu, "node2", "0x1");
    // Each node sees the LU as its own device with its own nexus.
    let node1 = one_path_node(&lu, n1);
    let node2 = one_path_node(&lu, n2);
    let fenced1 = dir.path().join("fenced1");
    let fenced2 = dir.path().join("fenced2");

    let first = start(lease_settings(dir.path(), 1, &fenced1), &node1, None);
    // Nobody holds the LU: node 1 waits one lease (a restarting holder could come back), then
    // reserves.
    assert!(
        wait_for(&first.status, Duration::from_secs(20), |s| s.state
            == State::Holder)
        .await
    );
    let second = start(lease_settings(dir.path(), 2, &fenced2), &node2, None);
    assert!(
        wait_for(&second.status, Duration::from_secs(5), |s| s.state
            == State::Standby
            && s.lus[0]
                .lease_key
                .as_deref()
                .is_some_and(|k| k != Key::ZERO.to_string()))
        .await
    );
    // The holder keeps renewing: the standby does not take over.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(lock(&first.status).state, State::Holder);
    assert_eq!(lock(&second.status).state, State::Standby);
    let epoch_file = super::lease::epoch_file::read(&dir.path().join("epoch1"))
        .unwrap()
        .unwrap();
    let key1 = lock(&lu).registered_key(n1).unwrap();
    assert!(
        super::lease::LeaseKey::decode(key1).unwrap().epoch() <= epoch_file,
        "epoch persisted before use"
    );

    // The holder stalls: every command it sends is lost.
    let stalled_at = Instant::now();
    lock(&lu).fail_next(n1, Injected::Timeout, 100_000);
    // The holder's decision, on the test clock. Its hook runs on a thread of its own, which
    // the paused clock does not wait for: the rule that bounds it is `self_fence.command_timeout
    // < margin`, so the decision plus that timeout is when the holder has surely stopped.
    let fenced = async {
        assert!(
            wait_for(&first.status, Duration::from_secs(30), |s| s.state
                == State::Fenced)
            .await
        );
        let decided = stalled_at.elapsed() + Duration::from_secs(1);
        (first.task.await.unwrap(), decided)
    };
    let promoted = async {
        assert!(
            wait_for(&second.status, Duration::from_secs(30), |s| s.state
                == State::Holder)
            .await
        );
        stalled_at.elapsed()
    };
    let ((outcome, fenced_after), promoted_after) = tokio::join!(fenced, promoted);
    assert_eq!(outcome, RunEnd::Fenced { exit_status: 86 });
    assert_eq!(lines(&fenced1), 1, "the stalled holder ran its hook");
    assert!(
        fenced_after < promoted_after,
        "the holder stops (decision + hook timeout: {fenced_after:?}) before the standby takes \
         over ({promoted_after:?})"
    );
    assert!(
        promoted_after <= Duration::from_secs(14),
        "{promoted_after:?}"
    );
    // The target agrees: node 2's nexus holds the reservation, node 1's key is gone.
    assert!(lock(&lu).is_holder(n2));
    assert_eq!(lock(&lu).registered_key(n1), None);
    assert_eq!(lines(&fenced2), 0);
    assert!(
        lock(&second.metrics)
            .render(Instant::now().into_std())
            .contains("prfence_lease_preempts_total{result=\"ok\"} 1")
    );
    second.control.send(Control::Stop).unwrap();
    assert_eq!(second.task.await.unwrap(), RunEnd::Stopped);
}

#[tokio::test(start_paused = true)]
async fn a_preempted_holder_fences_at_its_next_renew() {
    let dir = tempfile::tempdir().unwrap();
    let lu = model_lu();
    let n1 = connect(&lu, "node1", "0x1");
    let other = connect(&lu, "admin", "0x1");
    let node1 = one_path_node(&lu, n1);
    let fenced1 = dir.path().join("fenced1");
    let first = start(lease_settings(dir.path(), 1, &fenced1), &node1, None);
    assert!(
        wait_for(&first.status, Duration::from_secs(20), |s| s.state
            == State::Holder)
        .await
    );
    // An admin preempts the holder by hand.
    register(&lu, other, KB);
    let victim = lock(&lu).registered_key(n1).unwrap();
    lock(&lu)
        .pr_out(
            other,
            &PrOut::preempt_and_abort(KB, victim, ReservationType::WriteExclusive),
        )
        .unwrap();
    let at = Instant::now();
    // Timed to the decision: the hook after it runs on the real clock, while paused time
    // jumps ahead through the agent's feeds meanwhile.
    assert!(
        wait_for(&first.status, Duration::from_secs(3), |s| s.state
            == State::Fenced)
        .await,
        "{:?}",
        at.elapsed()
    );
    assert_eq!(
        first.task.await.unwrap(),
        RunEnd::Fenced { exit_status: 86 }
    );
    assert!(
        lock(&first.status)
            .fenced_reason
            .as_deref()
            .unwrap()
            .contains("preempted")
    );
}

#[tokio::test(start_paused = true)]
async fn once_reports_an_orphan_and_heals_nothing() {
    let storage = Arc::new(ModelHost::new());
    let lu = model_lu();
    let a1 = connect(&lu, "nodea", "0x1");
    let a2 = connect(&lu, "nodea", "0x2");
    register(&lu, a1, KA);
    lu0_path(&storage, &lu, a1, "/dev/sd0", "session1");
    let agent = |storage: &Arc<ModelHost>| {
        let (_control, receiver) = mpsc::unbounded_channel();
        Agent::new(
            watch_settings(&["/dev/mapper/lu0"], ""),
            AgentParts {
                host: Arc::clone(storage) as Arc<dyn Host>,
                notifier: Notifier::disabled(),
                status_file: None,
                sys_root: PathBuf::from("/nonexistent"),
                log: None,
                watchdog_pin: None,
                watchdog_dev: None,
            },
            receiver,
        )
        .unwrap()
    };
    let generation = lock(&lu).generation();
    assert_eq!(super::entry::once(agent(&storage), Some(KA)).await, 0);
    lu0_path(&storage, &lu, a2, "/dev/sd1", "session2");
    assert_eq!(
        super::entry::once(agent(&storage), Some(KA)).await,
        super::agent::EXIT_ONCE_PROBLEM
    );
    assert_eq!(lock(&lu).registered_key(a2), None);
    // Read-only: no PERSISTENT RESERVE OUT (a path probe would bump the PRgeneration).
    assert_eq!(lock(&lu).generation(), generation, "--once sent a PR OUT");
}

/// A watchdog "device" (a plain file) with its sysfs timeout, wired into watch settings.
fn with_watchdog(mut settings: Settings, dir: &Path, magic_close: bool) -> (Settings, PathBuf) {
    let device = dir.join("watchdog7");
    std::fs::write(&device, "").unwrap();
    let sysfs = dir.join("sys/class/watchdog/watchdog7");
    std::fs::create_dir_all(&sysfs).unwrap();
    std::fs::write(sysfs.join("timeout"), "5\n").unwrap();
    settings.watchdog = Some(super::config::WatchdogSettings {
        device: device.clone(),
        timeout: Duration::from_secs(5),
        magic_close,
    });
    settings.self_fence.stop_watchdog = true;
    (settings, device)
}

fn start_with_sys(
    settings: Settings,
    storage: &Arc<ModelHost>,
    sys: PathBuf,
    key: Option<Key>,
) -> Running {
    start_agent(settings, storage, sys, key, None)
}

/// Starts the agent on the model storage with `sys` as its sysfs root.
fn start_agent(
    settings: Settings,
    storage: &Arc<ModelHost>,
    sys: PathBuf,
    key: Option<Key>,
    status_file: Option<PathBuf>,
) -> Running {
    let (control, receiver) = mpsc::unbounded_channel();
    let host = Arc::clone(storage);
    let agent = Agent::new(
        settings,
        AgentParts {
            host: Arc::clone(&host) as Arc<dyn Host>,
            notifier: Notifier::disabled(),
            status_file,
            sys_root: sys,
            log: None,
            watchdog_pin: None,
            watchdog_dev: None,
        },
        receiver,
    )
    .unwrap();
    Running {
        status: agent.status(),
        metrics: agent.metrics(),
        task: tokio::spawn(super::entry::run(agent, key)),
        control,
        host,
    }
}

#[tokio::test(start_paused = true)]
async fn the_watchdog_is_fed_while_healthy_and_never_disarmed_when_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let t = two_lus();
    let (settings, device) = with_watchdog(
        watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], ""),
        dir.path(),
        true,
    );
    let run = start_with_sys(settings, &t.storage, dir.path().join("sys"), Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let fed = std::fs::read(&device).unwrap();
    assert!(fed.len() >= 5 && fed.iter().all(|&b| b == b'1'), "{fed:?}");
    lock(&t.lus[0])
        .pr_out(t.b[0], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
    let after = std::fs::read(&device).unwrap();
    assert!(
        !after.contains(&b'V'),
        "magic close on fence would stop the reset"
    );
    assert!(after.len() <= fed.len() + 2, "feeding stopped at the fence");
}

#[tokio::test(start_paused = true)]
async fn a_clean_stop_disarms_the_watchdog_only_if_configured() {
    for magic_close in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let t = two_lus();
        let (settings, device) = with_watchdog(
            watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], ""),
            dir.path(),
            magic_close,
        );
        let run = start_with_sys(settings, &t.storage, dir.path().join("sys"), Some(KA));
        assert!(
            wait_for(&run.status, Duration::from_secs(10), |s| s.state
                == State::Healthy)
            .await
        );
        run.control.send(Control::Stop).unwrap();
        assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
        let written = std::fs::read(&device).unwrap();
        assert_eq!(written.last() == Some(&b'V'), magic_close, "{written:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_with_another_timeout_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let t = two_lus();
    let (settings, device) = with_watchdog(
        watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], ""),
        dir.path(),
        false,
    );
    std::fs::write(
        dir.path().join("sys/class/watchdog/watchdog7/timeout"),
        "60",
    )
    .unwrap();
    let run = start_with_sys(settings, &t.storage, dir.path().join("sys"), Some(KA));
    let RunEnd::Failed(e) = run.task.await.unwrap() else {
        panic!("started with a mismatched watchdog")
    };
    assert!(e.contains("60 s"), "{e}");
    assert_eq!(std::fs::read(&device).unwrap(), b"", "never opened");
}

#[tokio::test(start_paused = true)]
async fn unregister_on_exit_removes_our_key_at_a_clean_stop() {
    let t = two_lus();
    let mut settings = watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], "");
    settings.unregister_on_exit = true;
    let run = start(settings, &t.storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
    for lu in &t.lus {
        let keys: Vec<Key> = lock(lu).registrations().iter().map(|r| r.key).collect();
        assert_eq!(keys, vec![KB], "only node B's key is left");
    }
}

#[tokio::test(start_paused = true)]
async fn a_reload_with_another_lease_keeps_the_running_lease_and_the_status_file_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let lu = model_lu();
    let n1 = connect(&lu, "node1", "0x1");
    let node1 = one_path_node(&lu, n1);
    let fenced = dir.path().join("fenced");
    let run = start(lease_settings(dir.path(), 1, &fenced), &node1, None);
    assert!(
        wait_for(&run.status, Duration::from_secs(20), |s| s.state
            == State::Holder)
        .await
    );
    let status_file = dir.path().join("status.json");
    // A shorter lease on the fly could let a standby take over while we still write: the
    // reload is refused and the holder keeps renewing.
    let mut shorter = lease_settings(dir.path(), 1, &fenced);
    if let super::config::ModeSettings::Lease(l) = &mut shorter.mode {
        l.lease = Duration::from_secs(5);
    }
    run.control
        .send(Control::Reload(Box::new(shorter)))
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(lock(&run.status).state, State::Holder);
    super::status_file::write(&status_file, &lock(&run.status)).unwrap();
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status_file).unwrap()).unwrap();
    assert_eq!(written["state"], "holder");
    assert_eq!(written["lus"][0]["verdict"], "holder");
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
    assert!(
        lock(&lu).is_holder(n1),
        "a stop leaves the reservation (unregister_on_exit off)"
    );
}

/// Issue #10 item 3: `--check-config` refuses what a start would refuse, with the same statuses.
#[test]
fn check_config_refuses_what_start_refuses() {
    use super::agent::{EXIT_CONFIG, EXIT_FAILURE};
    use super::entry::{agent_main, check_host};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    let watch = "mode = \"watch\"\n[[device]]\npath = \"/dev/sdb\"\n[key]\nvalue = \"0xabc\"\n";
    let check = |text: &str| {
        std::fs::write(&config, text).unwrap();
        agent_main(&config, true, false, None)
    };
    assert_eq!(check(watch), 0);
    for bad in [
        format!("command_timeout = \"1200h\"\n{watch}[watch]\ngrace = \"2000h\"\n"),
        format!("{watch}[log]\nlevel = \"prfence=loud\"\n"),
        format!("{watch}[self_fence]\ncommand = [\"/bin/true\"]\ncommand_timeout = \"0s\"\n"),
        format!("{watch}[watchdog]\ndevice = \"/dev/watchdog/../sda\"\ntimeout = \"10s\"\n"),
    ] {
        assert_eq!(check(&bad), EXIT_CONFIG, "{bad}");
    }
    if !Path::new("/dev/watchdog42").exists() {
        // Issue 44: watch mode starts without it (degraded, judged and opened once it appears:
        // the packaged agent.toml names /dev/watchdog0, absent where no driver is loaded);
        // lease mode, which needs it from the start, does not.
        let missing = "[watchdog]\ndevice = \"/dev/watchdog42\"\ntimeout = \"10s\"\n";
        assert_eq!(check(&format!("{watch}{missing}")), 0);
        let lease = "mode = \"lease\"\ncheck_interval = \"1s\"\ncommand_timeout = \"1s\"\n\
             [[device]]\npath = \"/dev/sdb\"\n[lease]\nnode_id = 1\nrenew = \"3s\"\n\
             lease = \"30s\"\nmargin = \"3s\"\nstate_file = \"/nonexistent/epoch\"\n";
        assert_eq!(check(&format!("{lease}{missing}")), EXIT_FAILURE);
    }

    // The file system half, over a fake /dev and /sys: a regular file and a symlink to a disk are
    // no watchdogs, whatever their names.
    let dev = dir.path().join("dev");
    let sys = dir.path().join("sys");
    std::fs::create_dir_all(sys.join("class/watchdog/watchdog0")).unwrap();
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("watchdog0"), "").unwrap();
    std::fs::write(dev.join("sda"), "").unwrap();
    std::os::unix::fs::symlink(dev.join("sda"), dev.join("watchdog1")).unwrap();
    let mut settings = Settings::from_toml_str(&format!(
        "{watch}[watchdog]\ndevice = \"/dev/watchdog0\"\ntimeout = \"10s\"\n"
    ))
    .unwrap();
    for name in ["watchdog0", "watchdog1"] {
        if let Some(w) = &mut settings.watchdog {
            w.device = dev.join(name);
        }
        assert_eq!(check_host(&config, &settings, &dev, &sys), Err(EXIT_CONFIG));
    }
    settings.watchdog = None;
    assert!(check_host(&config, &settings, &dev, &sys).is_ok());
}

/// Issue 44: the configuration is read only from a regular file, at once and of bounded size.
#[test]
fn a_config_that_is_no_regular_file_or_too_long_is_refused_at_once() {
    use super::entry::load_settings;
    let dir = tempfile::tempdir().unwrap();
    // A FIFO nobody writes to: its open used to wait for a writer, holding the start.
    let fifo = dir.path().join("agent.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (done, result) = std::sync::mpsc::channel();
    let reader = fifo.clone();
    std::thread::spawn(move || {
        let _ = done.send(load_settings(&reader, false));
    });
    let e = result
        .recv_timeout(Duration::from_secs(5))
        .expect("reading a FIFO as the configuration waits for a writer")
        .unwrap_err();
    assert!(e.contains("not a regular file"), "{e}");
    // Longer than 1 MiB: refused, not read on.
    let long = dir.path().join("long.toml");
    let mut text = "mode = \"watch\"\n".to_owned();
    text += &"# padding padding padding padding padding padding padding padding\n".repeat(20_000);
    std::fs::write(&long, text).unwrap();
    let e = load_settings(&long, false).unwrap_err();
    assert!(e.contains("longer than 1048576 bytes"), "{e}");
}

/// `self_fence.command` runs as root from the configuration file: a file that group or others
/// can write is refused at load (start, SIGHUP, --check-config), naming the file and the fix.
#[test]
fn a_config_file_others_can_write_is_refused() {
    use super::agent::EXIT_CONFIG;
    use super::entry::{agent_main, load_settings};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    let watch = "mode = \"watch\"\n[[device]]\npath = \"/dev/sdb\"\n[key]\nvalue = \"0xabc\"\n";
    std::fs::write(&config, watch).unwrap();
    let chmod = |mode: u32| {
        std::fs::set_permissions(&config, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    for mode in [0o600, 0o644, 0o640, 0o400] {
        chmod(mode);
        assert!(load_settings(&config, false).is_ok(), "{mode:o}");
    }
    for (mode, shown) in [
        (0o666, "0666"),
        (0o664, "0664"),
        (0o646, "0646"),
        (0o622, "0622"),
    ] {
        chmod(mode);
        let e = load_settings(&config, false).unwrap_err();
        let path = config.display().to_string();
        assert!(e.starts_with(&format!("{path}: ")), "{e}");
        assert!(e.contains(shown), "{e}");
        assert!(e.contains(&format!("chmod go-w {path}")), "{e}");
        assert_eq!(agent_main(&config, true, false, None), EXIT_CONFIG);
    }
    // Another unprivileged user could rewrite it too (only root can hand a file away).
    chmod(0o600);
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(&config, Some(4242), None).unwrap();
        let e = load_settings(&config, false).unwrap_err();
        assert!(e.contains("uid 4242") && e.contains("chown root"), "{e}");
        std::os::unix::fs::chown(&config, Some(0), None).unwrap();
    }
    // A safe file in a directory others can write can be replaced by a rename: refused too,
    // naming the directory, also when reached through a symbolic link.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = load_settings(&config, false).unwrap_err();
    let shown = dir.path().display().to_string();
    assert!(
        e.contains(&format!("directory {shown} (mode 0777")) && e.contains("/etc/prfence"),
        "{e}"
    );
    let safe = tempfile::tempdir().unwrap();
    let link = safe.path().join("agent.toml");
    std::os::unix::fs::symlink(&config, &link).unwrap();
    assert!(load_settings(&link, false).unwrap_err().contains(&shown));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(load_settings(&config, false).is_ok(), "a sticky directory");
}

/// A self-fence program that is missing or cannot be executed would only show when the node is
/// fenced: `--check-config` and a start refuse it.
#[test]
fn a_self_fence_program_that_cannot_run_is_refused() {
    use super::agent::EXIT_CONFIG;
    use super::entry::{agent_main, check_host, check_self_fence_program, reload_settings};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    let program = dir.path().join("stop-my-app");
    std::fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
    let with_command = |argv0: &Path| {
        format!(
            "mode = \"watch\"\n[[device]]\npath = \"/dev/sdb\"\n[key]\nvalue = \"0xabc\"\n\
             [self_fence]\ncommand = [{:?}, \"--now\"]\n",
            argv0.display().to_string()
        )
    };
    let check = |argv0: &Path| {
        std::fs::write(&config, with_command(argv0)).unwrap();
        agent_main(&config, true, false, None)
    };
    let chmod = |mode: u32| {
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    chmod(0o755);
    assert_eq!(check(&program), 0);
    assert_eq!(check(Path::new("/bin/sh")), 0);
    for bad in [
        dir.path().join("missing"),
        dir.path().to_path_buf(),
        PathBuf::from("/nonexistent/stop-my-app"),
    ] {
        assert_eq!(check(&bad), EXIT_CONFIG, "{}", bad.display());
    }
    // Not executable, for root too (execve needs an x bit whoever runs it).
    chmod(0o644);
    assert_eq!(check(&program), EXIT_CONFIG);
    let settings = Settings::from_toml_str(&with_command(&program)).unwrap();
    let e = check_self_fence_program(&settings).unwrap_err().to_string();
    let shown = program.display().to_string();
    assert!(
        e.starts_with(&format!("self_fence.command: {shown} (mode 0644)")),
        "{e}"
    );
    assert!(e.contains(&format!("`chmod 0755 {shown}`")), "{e}");
    let missing = Settings::from_toml_str(&with_command(Path::new("/nonexistent/x"))).unwrap();
    let e = check_self_fence_program(&missing).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/x does not exist"), "{e}");
    // A start goes through the same check, and a SIGHUP keeps the running hook.
    let (dev, sys) = (dir.path().join("dev"), dir.path().join("sys"));
    assert_eq!(check_host(&config, &settings, &dev, &sys), Err(EXIT_CONFIG));
    std::fs::write(&config, with_command(&program)).unwrap();
    let e = reload_settings(&config, false).unwrap_err();
    assert!(
        e.starts_with(&format!("{}: self_fence.command: ", config.display())),
        "{e}"
    );
    chmod(0o700);
    assert!(check_host(&config, &settings, &dev, &sys).is_ok());
    // Issue 44: a hook others can change, or replace in its directory, runs as root when the
    // node is fenced: refused like a configuration file others can write.
    chmod(0o777);
    let e = check_self_fence_program(&settings).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("self_fence.command: {shown}: mode 0777")) && e.contains("write it"),
        "{e}"
    );
    assert_eq!(check_host(&config, &settings, &dev, &sys), Err(EXIT_CONFIG));
    chmod(0o755);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = check_self_fence_program(&settings).unwrap_err().to_string();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(
        e.contains(&format!("it is in directory {}", dir.path().display())),
        "{e}"
    );
    assert!(check_self_fence_program(&settings).is_ok());
    assert!(reload_settings(&config, false).is_ok());
}

/// Like [`start_with_sys`], with a status file.
fn start_with_status_file(
    settings: Settings,
    storage: &Arc<ModelHost>,
    sys: PathBuf,
    key: Option<Key>,
    status_file: PathBuf,
) -> Running {
    start_agent(settings, storage, sys, key, Some(status_file))
}

fn has_line(metrics: &Arc<Mutex<super::metrics::Metrics>>, line: &str) -> bool {
    let text = lock(metrics).render(Instant::now().into_std());
    text.lines().any(|l| l == line)
}

/// Issue #10 item 2: watch mode shows a watchdog it cannot open, keeps checking, retries the
/// open at every check and clears the state once it works.
#[tokio::test(start_paused = true)]
async fn a_missing_watchdog_is_degraded_and_retried_until_it_appears() {
    use super::status::WatchdogState;
    let dir = tempfile::tempdir().unwrap();
    let t = two_lus();
    let (settings, device) = with_watchdog(
        watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], ""),
        dir.path(),
        false,
    );
    std::fs::remove_file(&device).unwrap();
    let run = start_with_sys(settings, &t.storage, dir.path().join("sys"), Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.watchdog.state
            == WatchdogState::Degraded)
        .await
    );
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::Degraded);
    let error = status.watchdog.error.clone().unwrap();
    assert!(error.contains("watchdog7"), "{error}");
    assert!(has_line(&run.metrics, "prfence_watchdog_up 0"));
    assert!(has_line(&run.metrics, "prfence_watchdog_degraded 1"));
    let json: serde_json::Value = serde_json::from_str(&status.to_json()).unwrap();
    assert_eq!(json["watchdog"]["state"], "degraded");
    // Checks go on, still degraded.
    let checks = status.checks;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = lock(&run.status).clone();
    assert!(status.checks >= checks + 2, "{} vs {checks}", status.checks);
    assert_eq!(status.watchdog.state, WatchdogState::Degraded);
    // The device appears: the next check opens and feeds it, and the state clears.
    std::fs::write(&device, "").unwrap();
    assert!(
        wait_for(&run.status, Duration::from_secs(2), |s| s.watchdog.state
            == WatchdogState::Ok
            && s.state == State::Healthy)
        .await
    );
    assert_eq!(lock(&run.status).watchdog.error, None);
    assert!(has_line(&run.metrics, "prfence_watchdog_up 1"));
    assert!(has_line(&run.metrics, "prfence_watchdog_degraded 0"));
    assert!(std::fs::read(&device).unwrap().starts_with(b"1"), "fed");
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

/// `--once` reports a watchdog it could not open (exit 3), without ever opening one.
#[tokio::test(start_paused = true)]
async fn once_reports_a_missing_watchdog_without_opening_one() {
    use super::status::WatchdogState;
    let dir = tempfile::tempdir().unwrap();
    let t = two_lus();
    let (settings, device) = with_watchdog(
        watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], ""),
        dir.path(),
        false,
    );
    let once = |settings: Settings| {
        let (_control, receiver) = mpsc::unbounded_channel();
        let agent = Agent::new(
            settings,
            AgentParts {
                host: Arc::clone(&t.storage) as Arc<dyn Host>,
                notifier: Notifier::disabled(),
                status_file: None,
                sys_root: dir.path().join("sys"),
                log: None,
                watchdog_pin: None,
                watchdog_dev: None,
            },
            receiver,
        )
        .unwrap();
        let status = agent.status();
        (super::entry::once(agent, Some(KA)), status)
    };
    let (done, status) = once(settings.clone());
    assert_eq!(done.await, 0);
    assert_eq!(lock(&status).watchdog.state, WatchdogState::NotArmed);
    assert_eq!(std::fs::read(&device).unwrap(), b"", "never opened");
    std::fs::remove_file(&device).unwrap();
    let (done, status) = once(settings);
    assert_eq!(done.await, super::agent::EXIT_ONCE_PROBLEM);
    let status = lock(&status).clone();
    assert_eq!(status.state, State::Degraded);
    assert_eq!(status.watchdog.state, WatchdogState::Degraded);
    assert!(status.watchdog.error.unwrap().contains("watchdog7"));
}

/// Issue 44: a watchdog missing at start is judged when it appears, before it is opened: what
/// turns up under its name and is no watchdog is never opened (opening a device can act).
#[tokio::test(start_paused = true)]
async fn a_watchdog_missing_at_start_is_judged_before_it_is_opened() {
    use super::status::WatchdogState;
    let dir = tempfile::tempdir().unwrap();
    let (dev, sys) = (dir.path().join("dev"), dir.path().join("sys"));
    std::fs::create_dir_all(&dev).unwrap();
    let device = dev.join("watchdog0");
    let t = two_lus();
    let mut settings = watch_settings(&["/dev/mapper/lu0", "/dev/mapper/lu1"], "");
    settings.watchdog = Some(super::config::WatchdogSettings {
        device: device.clone(),
        timeout: Duration::from_secs(5),
        magic_close: true,
    });
    settings.self_fence.stop_watchdog = true;
    let (control, receiver) = mpsc::unbounded_channel();
    let agent = Agent::new(
        settings,
        AgentParts {
            host: Arc::clone(&t.storage) as Arc<dyn Host>,
            notifier: Notifier::disabled(),
            status_file: None,
            sys_root: sys.clone(),
            log: None,
            watchdog_pin: None,
            watchdog_dev: Some(dev.clone()),
        },
        receiver,
    )
    .unwrap();
    let status = agent.status();
    let task = tokio::spawn(super::entry::run(agent, Some(KA)));
    let degraded_with = |what: &'static str| {
        move |s: &Status| {
            s.watchdog.state == WatchdogState::Degraded
                && s.watchdog
                    .error
                    .as_deref()
                    .is_some_and(|e| e.contains(what))
        }
    };
    assert!(
        wait_for(
            &status,
            Duration::from_secs(10),
            degraded_with("cannot resolve")
        )
        .await,
        "{:?}",
        lock(&status).watchdog
    );
    // Something that is no watchdog appears under its name: judged, refused, never opened.
    std::fs::write(&device, "").unwrap();
    std::fs::create_dir_all(sys.join("class/watchdog/watchdog0")).unwrap();
    assert!(
        wait_for(
            &status,
            Duration::from_secs(10),
            degraded_with("resolves to")
        )
        .await,
        "{:?}",
        lock(&status).watchdog
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(std::fs::read(&device).unwrap(), b"", "never opened nor fed");
    assert_eq!(lock(&status).state, State::Degraded);
    control.send(Control::Stop).unwrap();
    assert_eq!(task.await.unwrap(), RunEnd::Stopped);
}

/// A failing hook and a failing reboot: each step's result is shown (status file, metrics),
/// and the failed reboot stops the feeding even with `self_fence.stop_watchdog` off.
#[tokio::test(start_paused = true)]
async fn a_self_fence_records_each_step_and_a_failed_reboot_stops_the_feeding() {
    use super::status::{HookStep, RebootStep, SelfFenceSteps, WatchdogStep};
    let dir = tempfile::tempdir().unwrap();
    let t = two_lus();
    let (mut settings, device) = with_watchdog(
        watch_settings(
            &["/dev/mapper/lu0", "/dev/mapper/lu1"],
            "command = [\"/bin/sh\", \"-c\", \"exit 1\"]\nreboot = true\nexit = false\n",
        ),
        dir.path(),
        false,
    );
    settings.self_fence.stop_watchdog = false;
    let status_file = dir.path().join("status.json");
    let run = start_with_status_file(
        settings,
        &t.storage,
        dir.path().join("sys"),
        Some(KA),
        status_file.clone(),
    );
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    assert_eq!(lock(&run.status).self_fence, None);
    lock(&t.lus[0])
        .pr_out(t.b[0], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    assert!(
        real_wait(Duration::from_secs(10), || lock(&run.status)
            .self_fence
            .is_some_and(|f| f.reboot == RebootStep::Failed))
        .await
    );
    assert_eq!(run.host.reboots(), 1);
    assert_eq!(
        lock(&run.status).self_fence,
        Some(SelfFenceSteps {
            watchdog: WatchdogStep::Ok,
            hook: HookStep::Failed,
            reboot: RebootStep::Failed,
            finished: true,
        })
    );
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&status_file).unwrap()).unwrap();
    assert_eq!(written["state"], "fenced");
    assert_eq!(written["self_fence"]["watchdog"], "ok");
    assert_eq!(written["self_fence"]["hook"], "failed");
    assert_eq!(written["self_fence"]["reboot"], "failed");
    for line in [
        "prfence_self_fence_step{step=\"watchdog\",result=\"ok\"} 1",
        "prfence_self_fence_step{step=\"hook\",result=\"failed\"} 1",
        "prfence_self_fence_step{step=\"reboot\",result=\"failed\"} 1",
    ] {
        assert!(has_line(&run.metrics, line), "{line}");
    }
    // No longer fed, although self_fence.stop_watchdog is off: the reboot failed.
    let fed = std::fs::read(&device).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(std::fs::read(&device).unwrap(), fed);
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

/// Issue 44: an agent killed mid-way through its self-fence (systemd's watchdog or a stop during
/// the hook) and started again in the same boot finishes the self-fence at once instead of
/// coming back waiting for a key that is gone; over a finished self-fence (an admin's start
/// after exit 86) it starts as usual.
#[tokio::test(start_paused = true)]
async fn an_agent_restarted_during_its_self_fence_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let status_file = dir.path().join("status.json");
    let hook_file = dir.path().join("hook");
    let t = two_lus();
    let devices = ["/dev/mapper/lu0", "/dev/mapper/lu1"];
    let slow_hook = "command = [\"/bin/sleep\", \"30\"]\ncommand_timeout = \"2s\"\n";
    let sys = PathBuf::from("/nonexistent");
    let first = start_with_status_file(
        watch_settings(&devices, slow_hook),
        &t.storage,
        sys.clone(),
        Some(KA),
        status_file.clone(),
    );
    assert!(
        wait_for(&first.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    lock(&t.lus[1])
        .pr_out(t.b[1], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    let written = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&status_file).unwrap_or_default())
            .unwrap_or_default()
    };
    assert!(
        real_wait(Duration::from_secs(10), || written()["self_fence"]["hook"]
            == "running")
        .await
    );
    // Killed while its hook runs.
    first.task.abort();
    let _ = first.task.await;
    let record = written();
    assert_eq!(record["state"], "fenced");
    assert_eq!(record["self_fence"]["finished"], false);
    assert_eq!(
        record["boot_id"],
        super::status_file::boot_id().unwrap().as_str()
    );
    assert!(record["updated_unix"].as_u64().unwrap() > 1_600_000_000);

    // Started again: fenced at once, its hook run again, the record finished.
    let second = start_with_status_file(
        watch_settings(&devices, &hook(&hook_file)),
        &t.storage,
        sys.clone(),
        Some(KA),
        status_file.clone(),
    );
    // The real clock: the hook runs on a thread of its own, which paused time does not wait for.
    assert!(
        real_wait(Duration::from_secs(10), || second.task.is_finished()).await,
        "the agent started again did not finish the self-fence: it waits"
    );
    assert_eq!(
        second.task.await.unwrap(),
        RunEnd::Fenced { exit_status: 86 }
    );
    assert_eq!(lines(&hook_file), 1, "the hook ran again");
    let record = written();
    assert_eq!(record["self_fence"]["finished"], true, "{record}");
    let reason = record["fenced_reason"].as_str().unwrap();
    assert!(
        reason.contains("did not finish its self-fence") && reason.contains("lu1"),
        "{reason}"
    );

    // A start over a finished self-fence is an admin's: nothing is run again, the agent waits
    // for this node's key, which only an explicit unfence brings back.
    let third = start_with_status_file(
        watch_settings(&devices, &hook(&hook_file)),
        &t.storage,
        sys,
        Some(KA),
        status_file.clone(),
    );
    assert!(wait_for(&third.status, Duration::from_secs(10), |s| s.checks >= 3).await);
    let state = lock(&third.status).state;
    assert_ne!(state, State::Fenced);
    assert_eq!(lines(&hook_file), 1, "no hook on an admin's start");
    third.control.send(Control::Stop).unwrap();
    assert_eq!(third.task.await.unwrap(), RunEnd::Stopped);
}

/// Issue 44: while the self-fence hook runs, the loop that feeds the watchdogs waits for it.
/// systemd's watchdog (WATCHDOG=1) must still hear from the agent, or systemd kills it mid-hook
/// (the packaged unit's WatchdogSec=30s against a hook allowed longer); the hardware watchdog is
/// fed too when `self_fence.stop_watchdog` is off. Real time: the hook is a real process.
#[tokio::test]
async fn both_watchdogs_are_fed_while_the_hook_runs() {
    let dir = tempfile::tempdir().unwrap();
    let hook_times = dir.path().join("hook-times");
    let socket = dir.path().join("notify");
    let listener = std::os::unix::net::UnixDatagram::bind(&socket).unwrap();
    // Each WATCHDOG=1 with the wall-clock time it arrived, in ns (the hook writes the same).
    let heard = Arc::new(Mutex::new(Vec::<u128>::new()));
    let heard_by = Arc::clone(&heard);
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = listener.recv(&mut buf) {
            if &buf[..n] == b"WATCHDOG=1" {
                let at = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos();
                heard_by.lock().unwrap().push(at);
            }
        }
    });
    let t = two_lus();
    let settings = watch_settings(
        &["/dev/mapper/lu0", "/dev/mapper/lu1"],
        &format!(
            "command = [\"/bin/sh\", \"-c\", \"date +%s%N > {0}; sleep 3; date +%s%N >> {0}\"]\n\
             command_timeout = \"6s\"\nstop_watchdog = false\n",
            hook_times.display()
        ),
    );
    let (settings, device) = with_watchdog(settings, dir.path(), true);
    let mut settings = settings;
    settings.self_fence.stop_watchdog = false;
    let (control, receiver) = mpsc::unbounded_channel();
    let storage = Arc::clone(&t.storage);
    let agent = Agent::new(
        settings,
        AgentParts {
            host: storage as Arc<dyn Host>,
            notifier: Notifier::to_socket(socket.to_str().unwrap()),
            status_file: None,
            sys_root: dir.path().join("sys"),
            log: None,
            watchdog_pin: None,
            watchdog_dev: None,
        },
        receiver,
    )
    .unwrap();
    let status = agent.status();
    let task = tokio::spawn(super::entry::run(agent, Some(KA)));
    assert!(
        wait_for(&status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    lock(&t.lus[1])
        .pr_out(t.b[1], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    // The feeds before the hook, to tell them from those during it.
    assert!(real_wait(Duration::from_secs(10), || lines(&hook_times) >= 1).await);
    let fed_at_hook = std::fs::read(&device).unwrap().len();
    assert_eq!(task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
    drop(control);
    let times: Vec<u128> = std::fs::read_to_string(&hook_times)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let (start, end) = (times[0], times[1]);
    let during = heard
        .lock()
        .unwrap()
        .iter()
        .filter(|&&at| at > start && at < end)
        .count();
    assert!(
        during >= 4,
        "{during} WATCHDOG=1 during the 3 s hook: systemd would think the agent hung"
    );
    let fed_during = std::fs::read(&device).unwrap().len() - fed_at_hook;
    assert!(
        fed_during >= 4,
        "the hardware watchdog was fed {fed_during} times during the hook (stop_watchdog off)"
    );
}

/// No watchdog, a hook that times out, reboot off: each step says so, and the agent exits 86.
#[tokio::test(start_paused = true)]
async fn a_self_fence_with_a_hung_hook_and_no_reboot_records_each_step() {
    use super::status::{HookStep, RebootStep, SelfFenceSteps, WatchdogStep};
    let t = two_lus();
    let settings = watch_settings(
        &["/dev/mapper/lu0", "/dev/mapper/lu1"],
        "command = [\"/bin/sleep\", \"30\"]\ncommand_timeout = \"1s\"\n",
    );
    let run = start(settings, &t.storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    lock(&t.lus[1])
        .pr_out(t.b[1], &PrOut::preempt_and_abort(KB, KA, WERO))
        .unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Fenced { exit_status: 86 });
    assert_eq!(
        lock(&run.status).self_fence,
        Some(SelfFenceSteps {
            watchdog: WatchdogStep::NotConfigured,
            hook: HookStep::TimedOut,
            reboot: RebootStep::Disabled,
            finished: true,
        })
    );
    assert!(has_line(
        &run.metrics,
        "prfence_self_fence_step{step=\"hook\",result=\"timed_out\"} 1"
    ));
    assert!(
        !lock(&run.metrics)
            .render(Instant::now().into_std())
            .contains("prfence_watchdog_up")
    );
    assert_eq!(run.host.reboots(), 0);
}

/// How long a model path hangs in the hung-path tests: longer than either test takes.
const HANG: Duration = Duration::from_secs(30);

/// An agent in watch mode over model LUs, `paths[i]` paths to LU i (`/dev/sd<i><p>`), our key
/// registered through each; the paths for which `hangs(i, p)` hang for [`HANG`]. With its runtime
/// (2 workers) and the budget of one check.
fn agent_over_hung_paths(
    paths: &[usize],
    hangs: impl Fn(usize, usize) -> bool,
    command_timeout: Duration,
) -> (tokio::runtime::Runtime, Agent, Duration) {
    let storage = Arc::new(ModelHost::new());
    let mut devices = Vec::new();
    for (i, &count) in paths.iter().enumerate() {
        let lu = model_lu();
        let device = format!("/dev/mapper/lu{i}");
        for p in 0..count {
            let nexus = connect(&lu, "nodea", &format!("0x{p}"));
            register(&lu, nexus, KA);
            if hangs(i, p) {
                lock(&lu).fail_next(nexus, Injected::Hang(HANG), 1000);
            }
            path(
                &storage,
                &device,
                &format!("naa.{i}"),
                &lu,
                nexus,
                &format!("/dev/sd{i}{p}"),
                &format!("s{i}{p}"),
            );
        }
        devices.push(device);
    }
    let names: Vec<&str> = devices.iter().map(String::as_str).collect();
    let mut settings = watch_settings(&names, "");
    settings.command_timeout = command_timeout;
    let budget = super::config::check_budget(settings.command_timeout);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (_control, receiver) = mpsc::unbounded_channel();
    let agent = Agent::new(
        settings,
        AgentParts {
            host: storage as Arc<dyn Host>,
            notifier: Notifier::disabled(),
            status_file: None,
            sys_root: PathBuf::from("/nonexistent"),
            log: None,
            watchdog_pin: None,
            watchdog_dev: None,
        },
        receiver,
    )
    .unwrap();
    (runtime, agent, budget)
}

/// Issue 44: `unregister_on_exit` at a stop takes one command's bound however many paths hang,
/// not one per path (it went path by path, with no overall deadline: 8 hung paths took 8 bounds,
/// beyond the unit's TimeoutStopSec at the default command_timeout and 8 paths).
#[test]
fn unregistering_at_a_stop_takes_one_command_bound_over_hung_paths() {
    let (runtime, mut agent, _) =
        agent_over_hung_paths(&[2, 2, 2, 2], |_, _| true, Duration::from_millis(500));
    let slot = super::config::command_slot(agent.settings.command_timeout);
    let started = std::time::Instant::now();
    runtime.block_on(async {
        let until = agent.check_deadline();
        agent.table.refresh(&agent.host, until).await;
        assert_eq!(
            agent
                .table
                .lus
                .iter()
                .map(|lu| lu.live_paths().len())
                .sum::<usize>(),
            8
        );
        let keys: Vec<(usize, Key)> = (0..4).map(|i| (i, KA)).collect();
        let started = std::time::Instant::now();
        agent.unregister_everywhere(&keys).await;
        let took = started.elapsed();
        println!("unregistering over 8 hung paths: {took:?} (one command bound: {slot:?})");
        assert!(
            took <= slot + Duration::from_secs(1),
            "{took:?} for 8 hung paths, one command bound is {slot:?}"
        );
    });
    runtime.shutdown_background();
    assert!(
        started.elapsed() < HANG,
        "the test waited for the hung commands"
    );
}

/// A check over hung paths ends within its budget (config::check_budget), on the real clock: the
/// model's hang blocks a thread for longer than the whole test would take without the bound.
#[test]
fn a_check_over_hung_paths_ends_within_its_budget() {
    // Four LUs. LU 0: its first of two paths hangs (failover to the second); LU 1: all five
    // paths hang (unreadable; tried one after another that would be five command slots, more
    // than the budget); LUs 2 and 3 answer through both paths.
    let (runtime, agent, budget) = agent_over_hung_paths(
        &[2, 5, 2, 2],
        |i, p| (i == 0 && p == 0) || i == 1,
        Duration::from_millis(500),
    );
    let (status, metrics) = (agent.status(), agent.metrics());
    // The longest a check gets: READ KEYS and then every path probed (start, a path change).
    let mut agent = agent;
    let started = std::time::Instant::now();
    let probed = runtime.block_on(async {
        let until = agent.check_deadline();
        agent.table.refresh(&agent.host, until).await;
        let probe = vec![super::watch::driver::Probe::Yes; agent.table.lus.len()];
        super::watch::driver::check_all(&agent.exec, &agent.table, KA, &probe, until).await
    });
    let took = started.elapsed();
    println!(
        "one probing check of 4 LUs (11 paths), 6 paths hung for {HANG:?}: {took:?} (budget \
         {budget:?})"
    );
    assert!(
        took <= budget + Duration::from_secs(1),
        "{took:?} > budget {budget:?}"
    );
    assert_eq!(probed.len(), 4, "one result per LU");
    // --once: READ KEYS only, bounded the same way.
    let started = std::time::Instant::now();
    let code = runtime.block_on(super::entry::once(agent, Some(KA)));
    let took = started.elapsed();
    runtime.shutdown_background();
    println!("--once over the same paths: {took:?}");
    assert!(
        took <= budget + Duration::from_secs(1),
        "{took:?} > budget {budget:?}"
    );
    assert_eq!(code, super::agent::EXIT_ONCE_PROBLEM, "LU 1 is unreadable");
    let status = lock(&status).clone();
    assert!(
        status.lus[0].keys.contains(&KA.to_string()),
        "LU 0 read through its second path: {:?}",
        status.lus[0]
    );
    assert!(
        status.lus[1].verdict.contains("unreadable"),
        "{:?}",
        status.lus[1]
    );
    for lu in [2, 3] {
        assert!(
            status.lus[lu].keys.contains(&KA.to_string()),
            "{:?}",
            status.lus[lu]
        );
    }
    let blocked: Vec<&str> = status
        .lus
        .iter()
        .flat_map(|lu| &lu.paths)
        .filter(|p| p.blocked)
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(blocked, ["sd00", "sd10", "sd11", "sd12", "sd13", "sd14"]);
    let text = lock(&metrics).render(std::time::Instant::now());
    assert!(text.contains("prfence_paths_blocked 6"), "{text}");
}

/// The check's first reads share a few threads ([`super::executor::Executor::read_keys_each`]):
/// hung first paths, more of them than those threads, do not keep the healthy LUs from being
/// read in the first slot. LUs 0-9: the first of two paths hangs; LUs 10-15: one healthy path
/// each, which can only be read in the first slot (an LU with no other path gets no second try).
#[test]
fn hung_first_paths_beyond_the_readers_do_not_starve_the_healthy_lus() {
    let paths: Vec<usize> = (0..16).map(|i| if i < 10 { 2 } else { 1 }).collect();
    let (runtime, agent, budget) =
        agent_over_hung_paths(&paths, |i, p| i < 10 && p == 0, Duration::from_millis(800));
    let status = agent.status();
    let started = std::time::Instant::now();
    let code = runtime.block_on(super::entry::once(agent, Some(KA)));
    let took = started.elapsed();
    runtime.shutdown_background();
    println!("--once over 16 LUs, 10 first paths hung for {HANG:?}: {took:?}");
    assert!(
        took <= budget + Duration::from_secs(1),
        "{took:?} > budget {budget:?}"
    );
    let status = lock(&status).clone();
    for (index, lu) in status.lus.iter().enumerate() {
        assert!(
            lu.keys.contains(&KA.to_string()),
            "LU {index} read (through its second path if its first hangs): {lu:?}"
        );
    }
    assert_eq!(code, 0, "every LU read: {:?}", status.lus);
}

#[test]
fn descriptors_are_reserved_for_the_self_fence_and_released_by_it() {
    let mut reserve = super::agent::DescriptorReserve::take(super::agent::DescriptorReserve::SIZE);
    assert_eq!(reserve.held(), super::agent::DescriptorReserve::SIZE);
    reserve.release();
    assert_eq!(reserve.held(), 0);
}

/// `--check-config` in lease mode reads the epoch state file as a start would, and checks its
/// directory can be written (when it exists; the unit's StateDirectory= makes it at start).
#[test]
fn check_config_reads_the_lease_state_file() {
    use super::entry::check_state_file;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lease-epoch");
    assert_eq!(check_state_file(&file), Ok(()), "first start: no file yet");
    assert_eq!(
        check_state_file(&dir.path().join("missing/lease-epoch")),
        Ok(()),
        "the directory is made at start"
    );
    std::fs::write(&file, "42\n").unwrap();
    assert_eq!(check_state_file(&file), Ok(()));
    std::fs::write(&file, "forty-two\n").unwrap();
    let e = check_state_file(&file).unwrap_err();
    assert!(e.contains("not an epoch"), "{e}");
    std::fs::remove_file(&file).unwrap();
    // Root writes anywhere (CAP_DAC_OVERRIDE); an unprivileged agent is told.
    if !nix::unistd::geteuid().is_root() {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o500)).unwrap();
        let e = check_state_file(&file).unwrap_err();
        assert!(e.contains("cannot write in"), "{e}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    }
}

/// Issue 44: `key.derive` settings on lu0 (fence_scsi's `key_value=id`), node name left to
/// corosync.
fn derive_settings() -> Settings {
    let text = "mode = \"watch\"\ncheck_interval = \"1s\"\ncommand_timeout = \"1s\"\n\
                [[device]]\npath = \"/dev/mapper/lu0\"\nname = \"lu0\"\n\
                [key]\nderive = \"fence_scsi\"\n[watch]\ngrace = \"10s\"\n";
    Settings::from_toml_str(text).unwrap()
}

/// [`derive_settings`] with `key.value = "0xa"` instead.
fn given_settings() -> Settings {
    let text = "mode = \"watch\"\ncheck_interval = \"1s\"\ncommand_timeout = \"1s\"\n\
                [[device]]\npath = \"/dev/mapper/lu0\"\nname = \"lu0\"\n\
                [key]\nvalue = \"0xa\"\n[watch]\ngrace = \"10s\"\n";
    Settings::from_toml_str(text).unwrap()
}

/// corosync of the two-node cluster `lab`, running as node2 (local_node_pos 1).
fn corosync_up(host: &ModelHost) {
    host.set_corosync("totem.cluster_name", "totem.cluster_name (str) = lab\n");
    host.set_corosync(
        "nodelist",
        "nodelist.local_node_pos (u32) = 1\n\
         nodelist.node.0.name (str) = node1\nnodelist.node.0.nodeid (u32) = 1\n\
         nodelist.node.1.name (str) = node2\nnodelist.node.1.nodeid (u32) = 2\n",
    );
}

/// The key fence_pr's `on` registers for `node` of cluster `lab` (key_value=id).
fn lab_key(node: &str) -> Key {
    let list = crate::keys::Nodelist::parse(
        "nodelist.node.0.name (str) = node1\nnodelist.node.1.name (str) = node2\n",
    );
    Key::new(
        crate::keys::derive_key("lab", &list, node, crate::keys::KeyScheme::FenceScsiId).unwrap(),
    )
}

/// A host named `hostname` with one path to `lu` as `nexus`, and its agent deriving its key,
/// checked against the key store `store`; a watchdog (a plain file) in `dir`.
/// The key tests' node2: a temporary directory with fence_pr's key store (`cluster`) in it, one
/// model LU, and node2's nexus to it (`a`).
struct Node2 {
    dir: tempfile::TempDir,
    store: crate::fence_agent::store::KeyStore,
    lu: Arc<Mutex<ModelLu>>,
    a: Nexus,
}

fn node2() -> Node2 {
    let dir = tempfile::tempdir().unwrap();
    let store = crate::fence_agent::store::KeyStore::new(dir.path().join("cluster"));
    let lu = model_lu();
    let a = connect(&lu, "node2", "0x1");
    Node2 { dir, store, lu, a }
}

fn start_deriving(
    hostname: &str,
    lu: &Arc<Mutex<ModelLu>>,
    nexus: Nexus,
    store: &crate::fence_agent::store::KeyStore,
    dir: &Path,
) -> Running {
    start_keyed(derive_settings(), None, hostname, lu, nexus, store, dir)
}

/// [`start_deriving`] with `settings` and, for `key.value`, its key.
fn start_keyed(
    settings: Settings,
    key: Option<Key>,
    hostname: &str,
    lu: &Arc<Mutex<ModelLu>>,
    nexus: Nexus,
    store: &crate::fence_agent::store::KeyStore,
    dir: &Path,
) -> Running {
    let host = Arc::new(ModelHost::new().with_hostname(hostname));
    lu0_path(&host, lu, nexus, "/dev/sd0", "session1");
    let (settings, _) = with_watchdog(settings, dir, false);
    let (control, receiver) = mpsc::unbounded_channel();
    let agent = Agent::new(
        settings,
        AgentParts {
            host: Arc::clone(&host) as Arc<dyn Host>,
            notifier: Notifier::disabled(),
            status_file: None,
            sys_root: dir.join("sys"),
            log: None,
            watchdog_pin: None,
            watchdog_dev: None,
        },
        receiver,
    )
    .unwrap();
    Running {
        status: agent.status(),
        metrics: agent.metrics(),
        task: tokio::spawn(super::entry::run_deriving(agent, key, store.clone())),
        control,
        host,
    }
}

/// Issue 44 item A: booted with the cluster stack down, the agent stays up waiting (not armed,
/// the cause shown), asks corosync once per check, and once corosync answers and this node is
/// unfenced, arms on the key of the node corosync runs as.
#[tokio::test(start_paused = true)]
async fn a_derived_key_is_waited_for_until_corosync_answers_then_armed() {
    use super::status::WatchdogState;
    let Node2 { dir, store, lu, a } = node2();
    let run = start_deriving("node2", &lu, a, &store, dir.path());
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        !run.task.is_finished(),
        "the agent gave up without corosync"
    );
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::WaitingForRegistration);
    assert_eq!(status.watchdog.state, WatchdogState::NotArmed);
    assert_eq!(status.own_key, None);
    let problem = status.key_problem.clone().unwrap_or_default();
    assert!(
        problem
            .starts_with("waiting for corosync to tell this node's key: corosync does not answer"),
        "{problem}"
    );
    // One corosync-cmapctl run per check, not more.
    let runs = run.host.corosync_runs().len();
    assert!((25..=32).contains(&runs), "{runs} runs in 30 checks");
    assert!(status.checks >= 25, "{}", status.checks);
    // The cluster stack is started by hand; Pacemaker unfences this node (fence_pr's `on`
    // stores the key, then registers it).
    corosync_up(&run.host);
    let ours = lab_key("node2");
    assert!(
        wait_for(&run.status, Duration::from_secs(3), |s| s.own_key
            == Some(ours.to_string()))
        .await
    );
    assert_eq!(lock(&run.status).key_problem, None);
    assert_eq!(lock(&run.status).state, State::WaitingForRegistration);
    store.write_key(ours.get()).unwrap();
    register(&lu, a, ours);
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Healthy
            && s.watchdog.state == WatchdogState::Ok)
        .await,
        "{:?}",
        lock(&run.status)
    );
    assert_eq!(lock(&lu).registered_key(a), Some(ours));
    let runs_when_armed = run.host.corosync_runs().len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        run.host.corosync_runs().len(),
        runs_when_armed,
        "asked once known"
    );
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

/// Issue 44 item A: stopped while waiting for corosync, the agent stops cleanly.
#[tokio::test(start_paused = true)]
async fn an_agent_waiting_for_corosync_stops_on_request() {
    let Node2 { dir, store, lu, a } = node2();
    let run = start_deriving("node2", &lu, a, &store, dir.path());
    tokio::time::sleep(Duration::from_secs(3)).await;
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
    assert_eq!(lock(&run.status).state, State::Stopping);
}

/// Issue 44 item B: a host named after another node than the one corosync runs as (a clone)
/// never arms, even with that other node's key on the LU: degraded, both names said.
#[tokio::test(start_paused = true)]
async fn a_host_named_after_another_node_is_degraded_naming_both() {
    use super::status::WatchdogState;
    let Node2 { dir, store, lu, a } = node2();
    let other = connect(&lu, "node1", "0x1");
    register(&lu, other, lab_key("node1"));
    let run = start_deriving("node1", &lu, a, &store, dir.path());
    corosync_up(&run.host);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(!run.task.is_finished());
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::Degraded, "{status:?}");
    assert_eq!(status.watchdog.state, WatchdogState::NotArmed);
    assert_eq!(status.own_key, None);
    let problem = status.key_problem.clone().unwrap_or_default();
    assert!(
        problem.contains("\"node1\"") && problem.contains("\"node2\""),
        "{problem}"
    );
    assert!(has_line(
        &run.metrics,
        "prfence_state{state=\"degraded\"} 1"
    ));
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

/// Issue 44 item B: the key fence_pr's `on` stored on this node is not the derived one: never
/// armed on the derived key, degraded naming both keys; once the two agree, healthy as ever.
#[tokio::test(start_paused = true)]
async fn a_key_store_holding_another_key_is_degraded_until_they_agree() {
    use super::status::WatchdogState;
    let Node2 { dir, store, lu, a } = node2();
    let ours = lab_key("node2");
    register(&lu, a, ours);
    store.write_key(lab_key("node1").get()).unwrap();
    let run = start_deriving("node2", &lu, a, &store, dir.path());
    corosync_up(&run.host);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::Degraded, "{status:?}");
    assert_eq!(status.watchdog.state, WatchdogState::NotArmed);
    let problem = status.key_problem.clone().unwrap_or_default();
    assert!(
        problem.contains(&lab_key("node1").to_string()) && problem.contains(&ours.to_string()),
        "{problem}"
    );
    store.write_key(ours.get()).unwrap();
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Healthy
            && s.key_problem.is_none()
            && s.watchdog.state == WatchdogState::Ok)
        .await,
        "{:?}",
        lock(&run.status)
    );
    // Armed, then the store changes under it: degraded, not fenced.
    store.write_key(lab_key("node1").get()).unwrap();
    assert!(
        wait_for(&run.status, Duration::from_secs(3), |s| s.state
            == State::Degraded
            && s.key_problem.is_some())
        .await
    );
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

/// Issue 44: agent.toml copied from another node with its `key.value`: the key fence_pr's `on`
/// stored on this node in this boot is another; the agent is degraded naming both, never armed
/// on a key unfencing did not give this node, until they agree.
#[tokio::test(start_paused = true)]
async fn a_given_key_unlike_the_stored_one_is_degraded_until_they_agree() {
    use super::status::WatchdogState;
    let Node2 { dir, store, lu, a } = node2();
    let (ours, theirs) = (Key::new(0xa), Key::new(0xb));
    register(&lu, a, ours);
    register(&lu, connect(&lu, "node1", "0x1"), theirs);
    store.write_key(theirs.get()).unwrap();
    let run = start_keyed(
        given_settings(),
        Some(ours),
        "node2",
        &lu,
        a,
        &store,
        dir.path(),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = lock(&run.status).clone();
    assert_eq!(status.state, State::Degraded, "{status:?}");
    assert_eq!(status.watchdog.state, WatchdogState::NotArmed);
    let problem = status.key_problem.clone().unwrap_or_default();
    assert!(
        problem.contains(&theirs.to_string()) && problem.contains("key.value is"),
        "{problem}"
    );
    store.write_key(ours.get()).unwrap();
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Healthy
            && s.key_problem.is_none())
        .await,
        "{:?}",
        lock(&run.status)
    );
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

/// Issue 44: a SIGHUP while the agent waits for corosync (the reload path before its key is
/// known) applies the new configuration: with `key.value` now given, it arms on that key at
/// once, corosync still down.
#[tokio::test(start_paused = true)]
async fn a_reload_while_waiting_for_corosync_takes_the_new_key() {
    let Node2 { dir, store, lu, a } = node2();
    register(&lu, a, Key::new(0xa));
    let run = start_deriving("node2", &lu, a, &store, dir.path());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        lock(&run.status).state,
        State::WaitingForRegistration,
        "{:?}",
        lock(&run.status)
    );
    let (given, _) = with_watchdog(given_settings(), dir.path(), false);
    run.control.send(Control::Reload(Box::new(given))).unwrap();
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Healthy
            && s.own_key.as_deref() == Some("0x000000000000000a")
            && s.key_problem.is_none())
        .await,
        "{:?}",
        lock(&run.status)
    );
    run.control.send(Control::Stop).unwrap();
    assert_eq!(run.task.await.unwrap(), RunEnd::Stopped);
}

/// One LU reached through node A's session of initiator name `iqn.2026-11.lab:nodea` (the
/// agent knows its name), registered with `registered`.
fn own_initiator_node(registered: Key) -> (Arc<ModelHost>, Arc<Mutex<ModelLu>>, Nexus) {
    let storage = Arc::new(ModelHost::new());
    let lu = model_lu();
    let a = connect(&lu, "nodea", "0x1");
    register(&lu, a, registered);
    path_of(
        &storage,
        "/dev/mapper/lu0",
        "naa.0",
        &lu,
        a,
        "/dev/sd0",
        "session1",
        "iqn.2026-11.lab:nodea",
    );
    (storage, lu, a)
}

#[tokio::test(start_paused = true)]
async fn a_node_sharing_our_initiator_that_takes_the_registration_is_named_at_the_fence() {
    let (storage, lu, a) = own_initiator_node(KA);
    let run = start(watch_settings(&["/dev/mapper/lu0"], ""), &storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(10), |s| s.state
            == State::Healthy)
        .await
    );
    // A node with a cloned initiator name registers through what the target takes for the same
    // initiator port: its key replaces ours there.
    register(&lu, a, KB);
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Fenced)
        .await
    );
    let status = lock(&run.status).clone();
    let reason = status.fenced_reason.unwrap_or_default();
    assert!(
        reason.contains("iqn.2026-11.lab:nodea")
            && reason.contains(&KB.to_string())
            && reason.contains("iscsi-iname"),
        "{reason}"
    );
    let found = &status.lus[0].other_keys_on_own_initiator;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].key, KB.to_string());
}

#[tokio::test(start_paused = true)]
async fn our_initiator_registered_with_another_key_is_degraded_not_waiting() {
    let (storage, lu, a) = own_initiator_node(KB);
    let run = start(watch_settings(&["/dev/mapper/lu0"], ""), &storage, Some(KA));
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Degraded)
        .await,
        "{:?}",
        lock(&run.status).state
    );
    assert_eq!(
        lock(&run.status).lus[0].other_keys_on_own_initiator[0].key,
        KB.to_string()
    );
    // Unfenced with our key (it replaces the old one on the port): nothing left to say, and
    // the agent arms.
    register(&lu, a, KA);
    assert!(
        wait_for(&run.status, Duration::from_secs(5), |s| s.state
            == State::Healthy)
        .await,
        "{:?}",
        lock(&run.status).state
    );
    assert!(
        lock(&run.status).lus[0]
            .other_keys_on_own_initiator
            .is_empty()
    );
    let _ = run.control.send(Control::Stop);
}
