//! prfence beside Debian's multipathd (issue 25): node A reaches each LU over two iSCSI sessions
//! under a real multipathd (tests/lab/multipathd.rs) and works through its `/dev/mapper` maps;
//! node B, the other cluster node, uses its one session directly (one guest has one device
//! mapper, so only one node can run multipathd). Every verdict is the target's: the exact set of
//! registrations (initiator, session, key) and the reservation holder from LIO's configfs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};

use crate::agent::{AgentProcess, watch_config};
use crate::multipathd::{Multipathd, ReservationKey};
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{Node, Topology};

pub const SUITE: Suite = Suite {
    name: "multipath",
    kernel: GuestKernel::Host,
    package: true,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(8 * 60),
    usual: Duration::from_secs(80),
    tests: TESTS,
    long: LONG,
    reproducers: &[],
};

const TESTS: &[crate::plan::Test] =
    crate::tests![multipathd_reinstates_beside_prfence_and_never_brings_a_fenced_key_back,];

/// The long tier's (CI's 25 minutes on the slower 2-CPU machine): mpathpersist and fence_mpath
/// beside prfence. CI keeps multipathd beside prfence, the maps' reinstated paths never bringing
/// a fenced key back.
const LONG: &[crate::plan::Test] = crate::tests![mpathpersist_and_fence_mpath_beside_prfence];

/// Both tiers, for the Debian 13 suite's long tier.
const EVERY: [crate::plan::Test; TESTS.len() + LONG.len()] = crate::plan::both(TESTS, LONG);

/// The same tests on a Debian 13 node (issue 45): multipath-tools 0.11.1 (its reservation
/// handling reworked since 0.9.4; fence_scsi users reported duplicate keys after the upgrade,
/// fence-agents #631), fence_mpath 4.16, Debian 13's kernel. Long tier, as `fence_debian13`.
pub const SUITE_DEBIAN13: Suite = Suite {
    name: "multipath_debian13",
    kernel: GuestKernel::Suite("trixie"),
    root: GuestRoot::Suite("trixie"),
    tests: &[],
    long: &EVERY,
    ..SUITE
};

const LUNS: usize = 2;
/// Node A's sessions, each a path of every map.
const PATHS_PER_MAP: usize = 2;

/// How many registrations each node has on each LU, by key: (node, key) → count, from LIO.
type KeySet = BTreeMap<(char, u64), usize>;

/// The registrations LIO holds on LU `lun`, counted by node and key.
fn key_set(t: &Topology, lun: usize) -> anyhow::Result<KeySet> {
    let mut set = KeySet::new();
    for r in t.lu(lun).registrations()? {
        let node = r.initiator.chars().last().unwrap_or('?');
        *set.entry((node, r.key)).or_default() += 1;
    }
    Ok(set)
}

/// Every LU's registrations are exactly `expected`.
fn expect_keys(t: &Topology, expected: &[((char, u64), usize)], when: &str) -> anyhow::Result<()> {
    let expected: KeySet = expected.iter().copied().collect();
    for lun in 0..LUNS {
        let set = key_set(t, lun)?;
        ensure!(
            set == expected,
            "{when}: LU {lun} holds {set:?} (node, key) → registrations, not {expected:?}"
        );
    }
    Ok(())
}

/// The key of the reservation's holder on each LU: the key its I_T nexus registered.
fn holders(t: &Topology) -> anyhow::Result<Vec<Option<u64>>> {
    (0..LUNS)
        .map(|lun| {
            let lu = t.lu(lun);
            let Some(holder) = lu.holder()? else {
                return Ok(None);
            };
            Ok(lu
                .registrations()?
                .into_iter()
                .find(|r| r.initiator == holder.initiator && r.isid == holder.isid)
                .map(|r| r.key))
        })
        .collect()
}

fn set_state(disk: &Path, state: &str) -> anyhow::Result<()> {
    let name = disk.file_name().context("disk name")?.to_string_lossy();
    // with the newline: 6.1 refuses "running" without one (EINVAL)
    std::fs::write(
        format!("/sys/block/{name}/device/state"),
        format!("{state}\n"),
    )?;
    Ok(())
}

fn name(disk: &Path) -> String {
    disk.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Node A under multipathd with `reservation_key 0xa` in multipath.conf, the key prfence gives
/// it. B fences A while one path of each of A's maps is down; the paths come back: multipathd
/// must not register the preempted key on them (P3), nor does A's agent. A is unfenced explicitly
/// while the paths are down (prfence registers on the live ones); the paths come back: multipathd
/// registers nothing (it learns of a registration from mpathpersist only) and the agent never
/// registers: it turns degraded naming the paths until `prfence unfence` registers them. After
/// `multipathd setprstatus` (what mpathpersist sends), multipathd registers the key on paths it
/// reinstates, beside the agent, with one registration per session and the reservation kept.
/// Last, without `reservation_key`: the paths stay unregistered until `prfence unfence`.
fn multipathd_reinstates_beside_prfence_and_never_brings_a_fenced_key_back() -> anyhow::Result<()> {
    let t = Topology::iscsi(LUNS)?;
    let second = t.second_session(Node::A)?;
    let first = t.node(Node::A).devices().to_vec();
    let paths: Vec<&Path> = first.iter().chain(&second).map(PathBuf::as_path).collect();
    let mp = Multipathd::start(t.lus(), &paths, ReservationKey::Fixed(Node::A.key()))?;
    let maps = mp.maps().to_vec();
    println!("  multipathd: maps {maps:?} over {paths:?}, reservation_key 0xa");

    crate::prfence_with_devices(&["unfence", "--key", "0xa"], &maps)?.ok()?;
    crate::prfence_with_devices(&["unfence", "--key", "0xb"], &t.node(Node::B).device_args())?
        .ok()?;
    expect_keys(
        &t,
        &[(('a', 0xa), 2), (('b', 0xb), 1)],
        "after both unfences",
    )?;
    ensure!(
        holders(&t)? == vec![Some(0xa); LUNS],
        "A unfenced first and reserved: {:?}",
        holders(&t)?
    );

    // A's agent watches its maps: it heals a path without the key while the key is on another
    // path, and never registers a key that is gone from every path
    let config = watch_config(
        &maps,
        "0xa",
        500,
        "grace = \"5s\"\nmissing_confirmations = 1",
        crate::agent::SELF_FENCE_NO_RESET,
        "",
    );
    let mut agent = AgentProcess::start("multipath-a", &config)?;
    agent.wait_state("healthy", Duration::from_secs(60))?;

    // one path of each map down (the second session's), then B fences A
    fail_paths(&mp, &second)?;
    crate::prfence_with_devices(
        &["fence", "--key", "0xb", "--victim", "0xa"],
        &t.node(Node::B).device_args(),
    )?
    .ok()?;
    expect_keys(&t, &[(('b', 0xb), 1)], "after B fenced A")?;
    agent.wait_state("fenced", Duration::from_secs(30))?;

    // the paths come back: multipathd reinstates them; A's key must stay gone
    let back = Instant::now();
    reinstate_paths(&mp, &second)?;
    let reinstated = back.elapsed();
    // multipathd registers on a path it reinstates right then; five checker rounds more
    std::thread::sleep(Duration::from_secs(5));
    expect_keys(
        &t,
        &[(('b', 0xb), 1)],
        "after multipathd reinstated A's paths, A fenced",
    )?;
    ensure!(
        holders(&t)? == vec![Some(0xb); LUNS],
        "B took the reservation: {:?}",
        holders(&t)?
    );
    println!(
        "  A fenced by B with a path of each map down; multipathd reinstated the paths {} later \
         and 5 s on the target still holds B's key alone: the preempted key did not come back",
        crate::secs(reinstated)
    );
    drop(agent);

    // A unfenced explicitly while a path is down: its key goes on the live path only
    fail_paths(&mp, &second)?;
    let unfence = crate::prfence_with_devices(&["unfence", "--key", "0xa"], &maps)?;
    println!(
        "  prfence unfence with a path of each map down: exit {}\n{}",
        unfence.code(),
        unfence.stdout.trim_end()
    );
    expect_keys(
        &t,
        &[(('a', 0xa), 1), (('b', 0xb), 1)],
        "after A's unfence with a path down",
    )?;
    // an offline path is no path to the agent: healthy on the live one
    let mut agent = AgentProcess::start("multipath-a2", &config)?;
    agent.wait_state("healthy", Duration::from_secs(60))?;

    // the paths come back. multipathd registers nothing: it learns that its key is registered
    // only from mpathpersist (`multipathd setprstatus`), not from the target. Nor does the agent
    // (it never registers, P3): it turns degraded and names the paths; `prfence unfence`, as it
    // says, registers them.
    reinstate_paths(&mp, &second)?;
    unregistered_until_unfence(&t, &mut agent, &maps, "nobody told multipathd")?;
    println!(
        "  paths back: multipathd registered nothing on them, A's agent turned degraded naming \
         them, and `prfence unfence` registered them"
    );

    // told as mpathpersist tells it, multipathd registers its key on a path it reinstates: a
    // path's registration removed (as a new session would lack it), the path failed and back
    for map in mp.maps() {
        let name = name(map);
        crate::run("multipathd", ["setprstatus", "map", &name])?.ok()?;
    }
    crate::prfence_with_devices(&["unregister", "--key", "0xa"], &second)?.ok()?;
    expect_keys(
        &t,
        &[(('a', 0xa), 1), (('b', 0xb), 1)],
        "after the second session's registrations were removed",
    )?;
    fail_paths(&mp, &second)?;
    let back = Instant::now();
    reinstate_paths(&mp, &second)?;
    wait_keys(&t, &[(('a', 0xa), 2), (('b', 0xb), 1)]).with_context(|| {
        format!(
            "multipathd after setprstatus:\n{}\nA's agent:\n{}",
            mp.diagnosis(),
            agent.log_tail()
        )
    })?;
    let took = back.elapsed();
    agent.wait_state("healthy", Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_secs(3));
    expect_keys(
        &t,
        &[(('a', 0xa), 2), (('b', 0xb), 1)],
        "3 s after multipathd registered the reinstated paths",
    )?;
    ensure!(
        holders(&t)? == vec![Some(0xb); LUNS],
        "the reservation moved: {:?}",
        holders(&t)?
    );
    println!(
        "  after `multipathd setprstatus`: multipathd registered 0xa on each reinstated path {} \
         after it came back; one registration per session, B's reservation kept, A's agent \
         healthy",
        crate::secs(took)
    );

    // without reservation_key (what README recommends): multipathd sends no PR command; a
    // path that comes back without the key stays so, the agent names it, `prfence unfence` heals
    mp.reconfigure(ReservationKey::None, PATHS_PER_MAP)?;
    crate::prfence_with_devices(&["unregister", "--key", "0xa"], &second)?.ok()?;
    fail_paths(&mp, &second)?;
    reinstate_paths(&mp, &second)?;
    unregistered_until_unfence(&t, &mut agent, &maps, "without reservation_key")?;
    println!(
        "  without reservation_key: the reinstated paths stayed unregistered, A's agent degraded \
         until `prfence unfence` registered them"
    );
    let status = crate::prfence_with_devices(&["status", "--key", "0xa"], &maps)?;
    ensure!(
        status.code() == 0,
        "prfence status after the reinstatement: exit {}\n{}{}",
        status.code(),
        status.stdout,
        status.stderr
    );
    drop(agent);
    drop(mp);
    Ok(())
}

/// Takes `disks` offline and waits until multipathd's checker shows each faulty.
fn fail_paths(mp: &Multipathd, disks: &[PathBuf]) -> anyhow::Result<()> {
    for disk in disks {
        set_state(disk, "offline")?;
    }
    for disk in disks {
        mp.wait_path(&name(disk), "faulty")?;
    }
    Ok(())
}

/// Brings `disks` back and waits until multipathd shows every map's paths active.
fn reinstate_paths(mp: &Multipathd, disks: &[PathBuf]) -> anyhow::Result<()> {
    for disk in disks {
        set_state(disk, "running")?;
    }
    mp.wait_active(PATHS_PER_MAP)?;
    Ok(())
}

/// A's second session is back without A's key and nothing registers it: A's agent turns
/// degraded and, 3 s on, the target still has A's key on one session per LU; `prfence unfence`, as
/// the agent says, registers it, and the agent is healthy again.
fn unregistered_until_unfence(
    t: &Topology,
    agent: &mut AgentProcess,
    maps: &[PathBuf],
    case: &str,
) -> anyhow::Result<()> {
    agent.wait_state("degraded", Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_secs(3));
    expect_keys(
        t,
        &[(('a', 0xa), 1), (('b', 0xb), 1)],
        &format!("{case}, 3 s after the paths came back"),
    )?;
    crate::prfence_with_devices(&["unfence", "--key", "0xa"], maps)?.ok()?;
    expect_keys(
        t,
        &[(('a', 0xa), 2), (('b', 0xb), 1)],
        &format!("{case}, after prfence unfence"),
    )?;
    agent.wait_state("healthy", Duration::from_secs(30))
}

/// Waits up to 30 s until every LU holds exactly `expected`.
fn wait_keys(t: &Topology, expected: &[((char, u64), usize)]) -> anyhow::Result<()> {
    let start = Instant::now();
    while expect_keys(t, expected, "").is_err() {
        if start.elapsed() > Duration::from_secs(30) {
            return expect_keys(t, expected, "30 s after the paths came back");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Node A under multipathd with `reservation_key file` (what fence_mpath asks for). A registers
/// and reserves with mpathpersist; prfence reads it as its own. B unfences with prfence;
/// mpathpersist reads B's key. A preempts B with mpathpersist; B's agent sees it is fenced and
/// never registers again. Then fence_mpath and fence_pr fence B from A's maps one after the other:
/// time, commands per LU (LIO's counter) and the target's result, side by side.
fn mpathpersist_and_fence_mpath_beside_prfence() -> anyhow::Result<()> {
    let t = Topology::iscsi(LUNS)?;
    let second = t.second_session(Node::A)?;
    let first = t.node(Node::A).devices().to_vec();
    let paths: Vec<&Path> = first.iter().chain(&second).map(PathBuf::as_path).collect();
    let mp = Multipathd::start(t.lus(), &paths, ReservationKey::File)?;
    let maps = mp.maps().to_vec();
    let map_list: Vec<String> = maps.iter().map(|m| m.display().to_string()).collect();
    for map in &map_list {
        crate::sh(&format!(
            "mpathpersist --out --register --param-sark=0xa {map} && \
             mpathpersist --out --reserve --param-rk=0xa --prout-type=5 {map}"
        ))?
        .ok()?;
    }
    expect_keys(&t, &[(('a', 0xa), 2)], "after mpathpersist registered A")?;
    println!(
        "  mpathpersist registered and reserved 0xa on both maps; multipathd's prkeys file:\n{}",
        mp.prkeys().trim_end()
    );
    let status = crate::prfence_with_devices(&["status", "--json", "--key", "0xa"], &maps)?;
    ensure!(
        status.code() == 0,
        "prfence status of mpathpersist's registration: exit {}\n{}{}",
        status.code(),
        status.stdout,
        status.stderr
    );
    let reservation = crate::prfence_with_devices(&["reservation", "--json"], &maps)?.ok()?;
    println!(
        "  prfence status --key 0xa: exit 0; prfence reservation:\n{}",
        reservation.stdout.trim_end()
    );
    crate::prfence_with_devices(&["unfence", "--key", "0xb"], &t.node(Node::B).device_args())?
        .ok()?;
    for map in &map_list {
        let keys = crate::sh(&format!("mpathpersist --in --read-keys {map}"))?.ok()?;
        let res = crate::sh(&format!("mpathpersist --in --read-reservation {map}"))?.ok()?;
        println!("  mpathpersist on {map}:\n{}{}", keys.stdout, res.stdout);
        ensure!(
            keys.stdout.contains("0xb") && keys.stdout.contains("0xa"),
            "mpathpersist does not read prfence's key 0xb: {}",
            keys.stdout
        );
    }
    // B's agent watches; A preempts B with mpathpersist
    let config = watch_config(
        t.node(Node::B).devices(),
        "0xb",
        500,
        "grace = \"5s\"\nmissing_confirmations = 1",
        crate::agent::SELF_FENCE_NO_RESET,
        "",
    );
    let mut agent = AgentProcess::start("multipath-b", &config)?;
    agent.wait_state("healthy", Duration::from_secs(60))?;
    for map in &map_list {
        crate::sh(&format!(
            "mpathpersist --out --preempt-abort --param-rk=0xa --param-sark=0xb --prout-type=5 {map}"
        ))?
        .ok()?;
    }
    agent.wait_state("fenced", Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_secs(3));
    expect_keys(&t, &[(('a', 0xa), 2)], "after mpathpersist preempted B")?;
    drop(agent);
    println!("  mpathpersist preempted B: B's agent says fenced, and 3 s on B's key is still gone");

    // fence_mpath and fence_pr, each fencing B from A's maps
    let devices = map_list.join(",");
    let mut rows = Vec::new();
    for agent in ["fence_mpath", "fence_pr"] {
        crate::prfence_with_devices(&["unfence", "--key", "0xb"], &t.node(Node::B).device_args())?
            .ok()?;
        let (on_stdin, off_stdin, program) = match agent {
            "fence_mpath" => (
                format!(
                    "action=on\ndevices={devices}\nkey=a\nstore_path={}\n",
                    crate::WORK
                ),
                format!(
                    "action=off\ndevices={devices}\nplug=b\nstore_path={}\n",
                    crate::WORK
                ),
                "fence_mpath",
            ),
            _ => (
                format!("action=on\ndevices={devices}\nkey=a\n"),
                format!("action=off\ndevices={devices}\nkey=b\n"),
                crate::INSTALLED_FENCE_PR,
            ),
        };
        let mut row = vec![agent.to_owned()];
        for stdin in [on_stdin, off_stdin] {
            let before: Vec<u64> = (0..LUNS)
                .map(|l| t.lu(l).commands())
                .collect::<Result<_, _>>()?;
            // as pacemaker-fenced runs an agent: its parameters on stdin
            let run = crate::sh(&format!(
                "PCMK_service=pacemaker-fenced FENCE_PR_STORE={}/fence-pr-a {program} \
                 <<'END'\n{stdin}END",
                crate::WORK
            ))?;
            ensure!(
                run.code() == 0,
                "{agent} {stdin:?}: exit {}\n{}{}",
                run.code(),
                run.stdout,
                run.stderr
            );
            let after: Vec<u64> = (0..LUNS)
                .map(|l| t.lu(l).commands())
                .collect::<Result<_, _>>()?;
            let per_lu: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            row.push(format!(
                "{} ms, {per_lu:?} commands",
                run.elapsed.as_millis()
            ));
        }
        expect_keys(&t, &[(('a', 0xa), 2)], &format!("after {agent} off"))?;
        ensure!(
            holders(&t)? == vec![Some(0xa); LUNS],
            "{agent}: holders {:?}",
            holders(&t)?
        );
        rows.push(row);
    }
    println!(
        "  side by side on A's two maps (2 paths each), fencing B (commands per LU include multipathd's checker):"
    );
    for row in rows {
        println!("    {}: on {}; off {}", row[0], row[1], row[2]);
    }
    drop(mp);
    Ok(())
}
