//! Clusters of more than two nodes, with quorum (issue 45): corosync's votequorum without
//! `two_node`, so that only a majority partition may fence. Each node is a set of namespaces and
//! a cgroup in the guest as in the two-node cluster suite (tests/lab/cluster-node.sh, unchanged:
//! its own corosync, Pacemaker and prfence agent), its own iSCSI initiator (`…:node-a`, `-b`,
//! then [`Topology::extra_initiator`]'s `-c`…) to the same LIO LUNs, named
//! `/dev/disk/by-id/lab-lun<i>` on every node; the nodes' links meet on a bridge in the guest's
//! root namespace. Pacemaker is configured with its own tools (tests/lab/cluster-config.sh,
//! `LAB_HOSTS` naming every node): fence_pr with `provides=unfencing`. Every verdict comes from
//! the target (configfs registrations, refused O_DIRECT writes). Run:
//! `cargo lab --ignored quorum::` (as root).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::{
    Installed, Nodes, QuickStart, SETTLE, SOURCES, in_node_cgroup, in_node_namespaces, install,
    no_pr_out_while_healthy, node_init_pid, node_path, poll_until, prfence_agent_pids,
    rolling_upgrade, run_doc_block,
};
use crate::WORK;
use crate::fence_agents::{CLUSTER, FenceAgent, derived_key_at, hash_key};
use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::topology::extra_initiator_name;
use crate::{Node, Topology, WriteOutcome, block_data, write_to};
use anyhow::{Context, ensure};

/// The LUNs every node shares (cluster-config.sh names two).
const LUNS: usize = 2;
/// The bridge the nodes' links meet on.
const BRIDGE: &str = "lab-qbr";

pub const SUITE: Suite = Suite {
    name: "quorum",
    kernel: GuestKernel::Host,
    package: true,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 2,
    budget: Duration::from_secs(20 * 60),
    usual: Duration::from_secs(492),
    tests: &[],
    long: TESTS,
    reproducers: &[],
};

/// Long tier: three Pacemaker stacks under TCG take about as long as the whole two-node suite,
/// which CI already runs.
const TESTS: &[crate::plan::Test] = crate::tests![
    three_nodes_the_majority_fences_the_node_cut_off,
    a_middle_node_removed_then_one_added_no_node_is_fenced_by_a_key_it_does_not_hold,
    with_hash_keys_a_node_removed_and_one_added_move_no_other_key,
    five_nodes_split_two_three_the_majority_fences_the_minority,
    three_nodes_set_up_by_the_quick_start_then_a_rolling_upgrade,
];

/// The same on Debian 13 nodes (Pacemaker 3.0, its kernel).
pub const SUITE_DEBIAN13: Suite = Suite {
    name: "quorum_debian13",
    kernel: GuestKernel::Suite("trixie"),
    root: GuestRoot::Suite("trixie"),
    ..SUITE
};

/// One node of the cluster: `node<position + 1>` in corosync's nodelist.
struct Member {
    position: usize,
    devices: Vec<PathBuf>,
    initiator: String,
    child: Option<Child>,
    /// The cluster's keys are `key_value=hash`'s (else `id`'s, fence_pr's default).
    hash_keys: bool,
}

impl Member {
    fn name(&self) -> String {
        format!("node{}", self.position + 1)
    }

    fn netns(&self) -> String {
        format!("lab-q{}", self.name())
    }

    fn cgroup(&self) -> PathBuf {
        PathBuf::from(format!("/sys/fs/cgroup/lab-q{}", self.name()))
    }

    fn logs(&self) -> PathBuf {
        Path::new(WORK).join("quorum").join(self.name())
    }

    fn address(&self) -> String {
        format!("10.78.0.{}", self.position + 1)
    }

    /// fence_scsi's key for this node: `key_value=id`'s (fence_pr's default), from its
    /// position, or `key_value=hash`'s, from its name.
    fn key(&self) -> anyhow::Result<u64> {
        if self.hash_keys {
            hash_key(&self.name())
        } else {
            derived_key_at(self.position)
        }
    }
}

/// A running cluster of `members.len()` nodes. Dropping it kills every node and removes the
/// namespaces and the bridge; the topology then tears the target down.
struct Quorum {
    members: Vec<Member>,
    /// fence_pr and the agents use `key_value=hash` (else `id`).
    hash_keys: bool,
    /// The nodes start the agent an admin enabled (else the lab's own: [`Quorum::online`]).
    units: bool,
    t: Topology,
    _installed: Installed,
}

impl Quorum {
    /// `size` nodes (3 to 5) with corosync and Pacemaker running and all online, fence_pr
    /// configured, every node unfenced by Pacemaker and its agent healthy.
    fn start(size: usize) -> anyhow::Result<Quorum> {
        Quorum::start_for(size, size)
    }

    /// [`Quorum::start`], with the fence device's `pcmk_host_list` naming `hosts` nodes (node1
    /// up), so that a node added later can be unfenced without changing the device.
    fn start_for(size: usize, hosts: usize) -> anyhow::Result<Quorum> {
        Quorum::start_keyed(size, hosts, false)
    }

    /// [`Quorum::start_for`], with `key_value=hash` on the fence device and in every agent's
    /// configuration when `hash_keys`.
    fn start_keyed(size: usize, hosts: usize, hash_keys: bool) -> anyhow::Result<Quorum> {
        let q = Quorum::online(size, hash_keys, false)?;
        let hosts: Vec<String> = (1..=hosts.max(size)).map(|n| format!("node{n}")).collect();
        q.in_node(
            0,
            &format!(
                "LAB_HOSTS='{}' LAB_KEY_VALUE={} bash {SOURCES}/cluster-config.sh fence_pr",
                hosts.join(" "),
                if hash_keys { "hash" } else { "" }
            ),
        )?
        .ok()?;
        q.every_node_armed("the configuration")?;
        Ok(q)
    }

    /// Waits for Pacemaker's unfencing of every node (its key on every LU, nothing else) and for
    /// every agent healthy (`after` says after what); then checks that healthy agents send no
    /// PR OUT.
    fn every_node_armed(&self, after: &str) -> anyhow::Result<()> {
        let all: Vec<usize> = (0..self.members.len()).collect();
        let took = self.wait(
            "every node unfenced (its key on every LU)",
            SETTLE,
            Duration::from_millis(500),
            |q| q.registered_exactly(&all),
        )?;
        println!(
            "  every node's key on every LU {} after {after}",
            crate::secs(took)
        );
        let took = self.wait(
            "every agent healthy",
            SETTLE,
            Duration::from_millis(500),
            |q| {
                Ok(all
                    .iter()
                    .all(|&i| q.agent_state(i).as_deref() == Some("healthy")))
            },
        )?;
        println!("  every agent healthy {} later", crate::secs(took));
        no_pr_out_while_healthy(
            &self.t,
            &self.members[0].devices[0],
            self.members[0].key()?,
            Duration::from_secs(8),
        )
    }

    /// `size` nodes (3 to 5) with corosync and Pacemaker running and all online, nothing
    /// configured. Each node's agent is the lab's (its own configuration, derived keys; `hash`'s
    /// when `hash_keys`), or with `units` what an admin enabled, started as a booting node
    /// starts it (tests/lab/cluster-node.sh's LAB_NODE_AGENT=units).
    fn online(size: usize, hash_keys: bool, units: bool) -> anyhow::Result<Quorum> {
        ensure!((3..=5).contains(&size), "a quorum cluster has 3 to 5 nodes");
        let t = Topology::iscsi(LUNS)?;
        t.settle()?;
        let installed = install(FenceAgent::FencePr)?;
        let mut q = Quorum {
            members: Vec::new(),
            hash_keys,
            units,
            t,
            _installed: installed,
        };
        q.bridge()?;
        for position in 0..size {
            q.add_member(position)?;
        }
        std::fs::create_dir_all("/run/lab")?;
        std::fs::write("/run/lab/quorum-corosync.conf", q.corosync_conf())?;
        let start = Instant::now();
        for index in 0..q.members.len() {
            q.boot(index)?;
        }
        q.wait("every node online", SETTLE, Duration::from_secs(2), |q| {
            let xml = q.in_node(0, "crm_mon -1 --output-as=xml")?.stdout;
            Ok(q.members.iter().all(|m| {
                xml.split("<node ").any(|e| {
                    e.contains(&format!("name=\"{}\"", m.name())) && e.contains("online=\"true\"")
                })
            }))
        })?;
        println!(
            "  cluster of {size} nodes online after {}",
            crate::secs(start.elapsed())
        );
        Ok(q)
    }

    fn corosync_conf(&self) -> String {
        self.corosync_conf_without(&[])
    }

    /// The corosync.conf of every member but those at the indexes in `left` (removed).
    fn corosync_conf_without(&self, left: &[usize]) -> String {
        let mut nodes = String::new();
        for (_, m) in self
            .members
            .iter()
            .enumerate()
            .filter(|(i, _)| !left.contains(i))
        {
            nodes.push_str(&format!(
                "  node {{\n    ring0_addr: {}\n    name: {}\n    nodeid: {}\n  }}\n",
                m.address(),
                m.name(),
                m.position + 1
            ));
        }
        // no two_node: only a majority is quorate; token as the two-node suite's (TCG)
        format!(
            "totem {{\n  version: 2\n  cluster_name: {CLUSTER}\n  transport: knet\n  \
             crypto_cipher: none\n  crypto_hash: none\n  token: 5000\n}}\n\
             nodelist {{\n{nodes}}}\n\
             quorum {{\n  provider: corosync_votequorum\n}}\n\
             logging {{\n  to_logfile: yes\n  logfile: /var/log/cluster/corosync.log\n  \
             to_syslog: no\n  to_stderr: no\n  timestamp: hires\n}}\n"
        )
    }

    /// The corosync.conf without node2, written to node1's and node3's /etc/corosync and to the
    /// one the nodes booted from now read; nothing reloaded.
    fn write_corosync_conf_without_node2(&self) -> anyhow::Result<()> {
        let conf = self.corosync_conf_without(&[1]);
        std::fs::write("/run/lab/quorum-corosync.conf", &conf)?;
        for index in [0, 2] {
            self.in_node(
                index,
                &format!("cat >/etc/corosync/corosync.conf <<'EOF'\n{conf}EOF"),
            )?
            .ok()?;
        }
        Ok(())
    }

    /// node2 fenced through Pacemaker (its key alone leaves every LU, its agent takes it down),
    /// then taken out of corosync (node1's and node3's corosync.conf, a reload) and Pacemaker,
    /// as docs/operations.md has it and `pcs cluster node remove` does.
    fn fence_and_remove_node2(&self) -> anyhow::Result<()> {
        let fenced = self.in_node(0, "stonith_admin --fence node2 --timeout 120")?;
        ensure!(
            fenced.code() == 0,
            "stonith_admin --fence node2: {}{}",
            fenced.stdout,
            fenced.stderr
        );
        self.wait(
            "node2's key gone, no other",
            SETTLE,
            Duration::from_millis(250),
            |q| q.registered_exactly(&[0, 2]),
        )?;
        self.wait(
            "node2 down (its agent)",
            SETTLE,
            Duration::from_millis(250),
            |q| Ok(q.is_down(1)),
        )?;
        self.write_corosync_conf_without_node2()?;
        self.in_node(0, "corosync-cfgtool -R && crm_node --force --remove node2")?
            .ok()?;
        Ok(())
    }

    /// The bridge the members' links meet on, in the guest's root namespace.
    fn bridge(&self) -> anyhow::Result<()> {
        crate::run("modprobe", ["-a", "veth", "bridge"])?.ok()?;
        let _ = crate::run("ip", ["link", "del", BRIDGE]);
        crate::run("ip", ["link", "add", BRIDGE, "type", "bridge"])?.ok()?;
        crate::run("ip", ["link", "set", BRIDGE, "up"])?.ok()?;
        Ok(())
    }

    /// Member `node<position + 1>`: its own iSCSI initiator (node A's and B's for the first two,
    /// extra ones after), and its network namespace linked to [`BRIDGE`]. Not started.
    fn add_member(&mut self, position: usize) -> anyhow::Result<usize> {
        let (devices, initiator) = match position {
            0 => (
                self.t.node(Node::A).devices().to_vec(),
                self.t.node(Node::A).initiator.clone(),
            ),
            1 => (
                self.t.node(Node::B).devices().to_vec(),
                self.t.node(Node::B).initiator.clone(),
            ),
            _ => {
                let letter = char::from(b'a' + u8::try_from(position)?);
                let devices = self.t.extra_initiator(letter)?;
                (devices, extra_initiator_name(letter))
            }
        };
        let m = Member {
            position,
            devices,
            initiator,
            child: None,
            hash_keys: self.hash_keys,
        };
        let ns = m.netns();
        let host_end = format!("lab-qv{}", m.position + 1);
        let _ = crate::run("ip", ["netns", "del", &ns]);
        crate::run("ip", ["netns", "add", &ns])?.ok()?;
        crate::run(
            "ip",
            [
                "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        )?
        .ok()?;
        crate::run("ip", ["link", "set", &host_end, "master", BRIDGE, "up"])?.ok()?;
        let cidr = format!("{}/24", m.address());
        crate::run("ip", ["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?.ok()?;
        crate::run("ip", ["-n", &ns, "link", "set", "eth0", "up"])?.ok()?;
        crate::run("ip", ["-n", &ns, "link", "set", "lo", "up"])?.ok()?;
        self.members.push(m);
        Ok(self.members.len() - 1)
    }

    /// Starts member `index` in fresh namespaces inside its own cgroup.
    fn boot(&mut self, index: usize) -> anyhow::Result<()> {
        let m = &self.members[index];
        let _ = std::fs::remove_dir_all(m.logs());
        std::fs::create_dir_all(m.logs())?;
        let group = m.cgroup();
        std::fs::create_dir_all(&group)?;
        let devices: Vec<String> = m.devices.iter().map(|d| d.display().to_string()).collect();
        let script = format!(
            "echo $$ >{}/cgroup.procs && exec ip netns exec {} unshare --mount --uts --ipc --pid \
             --fork --mount-proc bash {SOURCES}/cluster-node.sh {} {} {}",
            group.display(),
            m.netns(),
            m.name(),
            m.logs().display(),
            devices.join(" ")
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .env("LAB_COROSYNC_CONF", "/run/lab/quorum-corosync.conf")
            .env("LAB_PRFENCE", crate::INSTALLED_PRFENCE)
            .env("LAB_NODE_AGENT", if self.units { "units" } else { "lab" })
            .env("LAB_KEY_VALUE", if m.hash_keys { "hash" } else { "" })
            .env("PATH", node_path())
            .stdin(Stdio::null())
            .spawn()
            .context("starting a cluster node")?;
        self.members[index].child = Some(child);
        Ok(())
    }

    /// The PID (in the guest's root namespace) of member `index`'s PID 1.
    fn init_pid(&self, index: usize) -> anyhow::Result<u32> {
        let m = &self.members[index];
        node_init_pid(m.child.as_ref(), &m.name())
    }

    /// Runs a shell command inside member `index`'s namespaces.
    fn in_node(&self, index: usize, script: &str) -> anyhow::Result<crate::CommandRun> {
        in_node_namespaces(self.init_pid(index)?, script)
    }

    /// The index of the node Pacemaker has as its DC, as node1 sees it.
    fn dc(&self) -> anyhow::Result<usize> {
        let xml = self.in_node(0, "crm_mon -1 --output-as=xml")?.stdout;
        let dc = xml
            .split("<current_dc ")
            .nth(1)
            .and_then(|e| e.split(" name=\"").nth(1))
            .and_then(|e| e.split('"').next())
            .with_context(|| format!("no DC in crm_mon's output: {xml}"))?;
        self.members
            .iter()
            .position(|m| m.name() == dc)
            .with_context(|| format!("the DC {dc} is not a member"))
    }

    /// A clone of Pacemaker's Dummy resource started on every node, as a cluster where every
    /// node runs something.
    fn clone_everywhere(&self) -> anyhow::Result<()> {
        self.in_node(
            0,
            "cibadmin --create --scope resources --xml-text \"<clone id='everywhere'>\
             <primitive id='everywhere-dummy' class='ocf' provider='pacemaker' type='Dummy'>\
             <operations><op id='everywhere-monitor' name='monitor' interval='10s'/>\
             </operations></primitive></clone>\"",
        )?
        .ok()?;
        let took = self.wait(
            "the clone started on every node",
            SETTLE,
            Duration::from_millis(500),
            |q| {
                let run = q.in_node(0, "crm_resource --locate --resource everywhere")?;
                Ok(q.members.iter().all(|m| {
                    run.stdout
                        .lines()
                        .any(|l| l.trim_end().ends_with(&format!(" {}", m.name())))
                }))
            },
        )?;
        println!(
            "  a clone running on every node {} later",
            crate::secs(took)
        );
        Ok(())
    }

    fn agent_state(&self, index: usize) -> Option<String> {
        self.agent_status(index)?["state"]
            .as_str()
            .map(str::to_owned)
    }

    /// Member `index`'s agent status document, as `/run/prfence/status.json` holds it.
    fn agent_status(&self, index: usize) -> Option<serde_json::Value> {
        let run = self.in_node(index, "cat /run/prfence/status.json").ok()?;
        serde_json::from_str(&run.stdout).ok()
    }

    /// True once every process of member `index` is gone.
    fn is_down(&self, index: usize) -> bool {
        std::fs::read_to_string(self.members[index].cgroup().join("cgroup.procs"))
            .map(|procs| procs.trim().is_empty())
            .unwrap_or(true)
    }

    /// Splits the cluster network in two: `group` and the others no longer hear each other
    /// (each node drops, in its own network namespace, what it sends to or receives from the
    /// other side), while the nodes of each side still do. Storage paths are untouched.
    fn partition(&self, group: &[usize]) -> anyhow::Result<()> {
        for (index, m) in self.members.iter().enumerate() {
            let inside = group.contains(&index);
            let others: Vec<String> = self
                .members
                .iter()
                .enumerate()
                .filter(|(i, _)| group.contains(i) != inside)
                .map(|(_, o)| o.address())
                .collect();
            let set = others.join(", ");
            let rules = format!(
                "table inet lab_split {{\n chain input {{ type filter hook input priority 0; \
                 ip saddr {{ {set} }} drop; }}\n chain output {{ type filter hook output \
                 priority 0; ip daddr {{ {set} }} drop; }}\n}}\n"
            );
            let file = format!("/run/lab/quorum-split-{}.nft", m.name());
            std::fs::write(&file, rules)?;
            crate::run("ip", ["netns", "exec", &m.netns(), "nft", "-f", &file])?.ok()?;
        }
        Ok(())
    }

    /// Joins the network again ([`Quorum::partition`] undone).
    fn heal(&self) -> anyhow::Result<()> {
        for m in &self.members {
            let _ = crate::run(
                "ip",
                [
                    "netns",
                    "exec",
                    &m.netns(),
                    "nft",
                    "delete",
                    "table",
                    "inet",
                    "lab_split",
                ],
            );
        }
        Ok(())
    }

    /// The registrations on LU `lun` as (member index, key), sorted.
    fn keys(&self, lun: usize) -> anyhow::Result<Vec<(usize, u64)>> {
        let mut keys = Vec::new();
        for reg in self.t.lu(lun).registrations()? {
            let index = self
                .members
                .iter()
                .position(|m| m.initiator == reg.initiator)
                .with_context(|| format!("registration of an unknown initiator {reg:?}"))?;
            keys.push((index, reg.key));
        }
        keys.sort_unstable();
        Ok(keys)
    }

    /// True when every LU holds exactly the registrations of `members`, each with its key.
    fn registered_exactly(&self, members: &[usize]) -> anyhow::Result<bool> {
        let want = members
            .iter()
            .map(|&i| Ok((i, self.members[i].key()?)))
            .collect::<anyhow::Result<Vec<(usize, u64)>>>()?;
        for lun in 0..LUNS {
            if self.keys(lun)? != want {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn wait(
        &self,
        what: &str,
        limit: Duration,
        poll: Duration,
        done: impl FnMut(&Self) -> anyhow::Result<bool>,
    ) -> anyhow::Result<Duration> {
        poll_until(self, what, limit, poll, done, Self::dump)
    }

    /// The end of each node's logs, and the fencing history as the first live node knows it,
    /// for a failure's report.
    fn dump(&self) {
        if let Some(live) = (0..self.members.len()).find(|&i| !self.is_down(i))
            && let Ok(run) = self.in_node(live, "stonith_admin --history '*' --verbose")
        {
            println!(
                "--- fencing history on {} ---\n{}{}",
                self.members[live].name(),
                run.stdout,
                run.stderr
            );
            if let Ok(run) = self.in_node(live, "crm_mon -1") {
                println!("--- crm_mon -1 ---\n{}{}", run.stdout, run.stderr);
            }
            // What the partition's scheduler and controller decided about the lost nodes.
            let log = std::fs::read_to_string(self.members[live].logs().join("pacemaker.log"))
                .unwrap_or_default();
            let decided: Vec<&str> = log
                .lines()
                .filter(|l| {
                    [
                        "unclean", "fence", "Fence", "lost", "election", "Election", "is now",
                    ]
                    .iter()
                    .any(|w| l.contains(w))
                })
                .collect();
            println!(
                "--- {} pacemaker.log, decisions ---",
                self.members[live].name()
            );
            for line in &decided[decided.len().saturating_sub(80)..] {
                println!("{line}");
            }
        }
        for m in &self.members {
            for file in ["node.log", "agent.log", "pacemaker.log", "corosync.log"] {
                let text = std::fs::read_to_string(m.logs().join(file)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                println!("--- {} {file} (last lines) ---", m.name());
                for line in &lines[lines.len().saturating_sub(15)..] {
                    println!("{line}");
                }
            }
        }
    }
}

impl Nodes for Quorum {
    fn count(&self) -> usize {
        self.members.len()
    }

    fn admin(&self, i: usize, script: &str) -> anyhow::Result<crate::CommandRun> {
        in_node_cgroup(&self.members[i].cgroup(), self.init_pid(i)?, script)
    }

    fn every_key_registered(&self) -> anyhow::Result<bool> {
        self.registered_exactly(&(0..self.members.len()).collect::<Vec<_>>())
    }

    fn registrations(&self) -> String {
        let held: Vec<String> = (0..LUNS)
            .map(|lun| format!("{:x?}", self.keys(lun)))
            .collect();
        held.join(" and ")
    }

    fn node_down(&self, i: usize) -> bool {
        self.is_down(i)
    }

    fn node_agent_state(&self, i: usize) -> Option<String> {
        self.agent_state(i)
    }

    fn node_agent_pids(&self, i: usize) -> Vec<String> {
        prfence_agent_pids(&self.members[i].cgroup())
    }
}

impl Drop for Quorum {
    fn drop(&mut self) {
        for m in &mut self.members {
            let group = m.cgroup();
            if group.exists() {
                let _ = std::fs::write(group.join("cgroup.freeze"), "0");
                let _ = std::fs::write(group.join("cgroup.kill"), "1");
            }
            if let Some(mut child) = m.child.take() {
                let _ = child.wait();
            }
            let start = Instant::now();
            while !std::fs::read_to_string(group.join("cgroup.procs"))
                .unwrap_or_default()
                .trim()
                .is_empty()
                && start.elapsed() < Duration::from_secs(30)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = std::fs::remove_dir(&group);
            let _ = crate::run("ip", ["netns", "del", &m.netns()]);
        }
        let _ = crate::run("ip", ["link", "del", BRIDGE]);
        let _ = std::fs::remove_file("/run/lab/quorum-corosync.conf");
        for m in &self.members {
            let _ = std::fs::remove_file(format!("/run/lab/quorum-split-{}.nft", m.name()));
        }
    }
}

// ----- the tests -----

/// Three nodes; node3's network is cut (its storage path stays). The other two keep quorum and
/// fence it through fence_pr: its key leaves every LU, theirs stay, its writes are refused, and
/// its agent self-fences (the node goes down: reboot(2) in its PID namespace). Node3, without
/// quorum, fences nobody: never a node of the majority.
fn three_nodes_the_majority_fences_the_node_cut_off() -> anyhow::Result<()> {
    let mut q = Quorum::start(3)?;
    let cut = 2;
    let started = Instant::now();
    q.partition(&[cut])?;
    println!(
        "  {} cut off from the others (its network only)",
        q.members[cut].name()
    );
    let took = q.wait(
        "node3's key gone from every LU, the majority's kept",
        SETTLE,
        Duration::from_millis(250),
        |q| q.registered_exactly(&[0, 1]),
    )?;
    println!(
        "  the majority fenced {} {} after the cut: the target holds node1's and node2's keys \
         alone on every LU",
        q.members[cut].name(),
        crate::secs(took)
    );
    let refused = write_to(
        &q.members[cut].devices[0],
        3,
        &block_data("node3 after the cut"),
    );
    ensure!(
        refused == WriteOutcome::Refused,
        "node3's write after the fence: {refused:?}"
    );
    for lun in 0..LUNS {
        let written = write_to(
            &q.members[0].devices[lun],
            4,
            &block_data("node1 after the cut"),
        );
        ensure!(
            written == WriteOutcome::Accepted,
            "node1's write to LU {lun} after the fence: {written:?}"
        );
    }
    let down = q.wait(
        "node3 down (its agent's self-fence)",
        Duration::from_secs(120),
        Duration::from_millis(250),
        |q| Ok(q.is_down(cut)),
    )?;
    let agent_log =
        std::fs::read_to_string(q.members[cut].logs().join("agent.log")).unwrap_or_default();
    ensure!(
        agent_log.contains("fenced"),
        "node3 went down without its agent saying it was fenced:\n{agent_log}"
    );
    // the majority stays up and registered: never a node of it fenced
    ensure!(
        !q.is_down(0) && !q.is_down(1) && q.registered_exactly(&[0, 1])?,
        "a node of the majority was fenced or went down: {:?}",
        (0..LUNS).map(|l| q.keys(l)).collect::<Vec<_>>()
    );
    println!(
        "  node3's write refused; node1's accepted on every LU; node3 down {} after its fence \
         (its agent: {}); node1 and node2 up and registered, {} after the cut",
        crate::secs(down),
        agent_log
            .lines()
            .rev()
            .find(|l| l.contains("fenced"))
            .unwrap_or("?")
            .chars()
            .take(160)
            .collect::<String>(),
        crate::secs(started.elapsed())
    );
    // node3 comes back (its "reboot": a fresh boot of its namespaces), the network healed:
    // Pacemaker unfences it, and only its own key comes back
    q.heal()?;
    if let Some(mut child) = q.members[cut].child.take() {
        child.wait()?;
    }
    let back = Instant::now();
    q.boot(cut)?;
    q.wait(
        "node3 unfenced again after its reboot",
        SETTLE,
        Duration::from_millis(500),
        |q| q.registered_exactly(&[0, 1, 2]),
    )?;
    let unfenced = back.elapsed();
    q.wait(
        "node3's agent healthy again",
        SETTLE,
        Duration::from_millis(500),
        |q| Ok(q.agent_state(cut).as_deref() == Some("healthy")),
    )?;
    println!(
        "  node3 rebooted: unfenced by Pacemaker {} after its start (the same three keys on \
         every LU), its agent healthy {} after its start",
        crate::secs(unfenced),
        crate::secs(back.elapsed())
    );
    Ok(())
}

/// fence-agents #289, with fence_pr's default `key_value=id` (fence_scsi's): a node's key is its
/// position in corosync's nodelist. node2 is removed as docs/operations.md says (fenced first,
/// then taken out of corosync and Pacemaker); node3 moves from position 2 to 1 but still holds
/// position 2's key. A fence of node3 derives position 1's key: it must not be reported done
/// while node3's key stays (P1). node4, added then, takes position 2, whose key node3 still
/// holds: its unfencing must register nowhere (two nodes with one key cannot be fenced apart).
/// After node3's reboot (what docs/operations.md tells the admin to do) it holds its new
/// position's key, node4 is unfenced with position 2's, and a fence of node3 removes its key
/// alone and is done.
fn a_middle_node_removed_then_one_added_no_node_is_fenced_by_a_key_it_does_not_hold()
-> anyhow::Result<()> {
    let mut q = Quorum::start_for(3, 4)?;
    // 1.-2. node2 fenced and removed, as the docs have it
    q.fence_and_remove_node2()?;
    let nodelist = q.in_node(2, "corosync-cmapctl nodelist")?.ok()?.stdout;
    ensure!(
        nodelist.contains("nodelist.node.1.name (str) = node3") && !nodelist.contains("node2"),
        "node3 did not move to position 1 after the reload:\n{nodelist}"
    );
    println!("  node2 fenced and removed; corosync's nodelist now has node3 at position 1");
    // 3. a fence of node3: not reported done while node3's key (position 2's) stays
    let started = Instant::now();
    let run = q.in_node(0, "stonith_admin --fence node3 --timeout 60")?;
    let keys: Vec<Vec<(usize, u64)>> = (0..LUNS).map(|l| q.keys(l)).collect::<Result<_, _>>()?;
    let node3_key = q.members[2].key()?;
    let node3_kept = keys
        .iter()
        .all(|lu| lu.iter().any(|&(i, k)| i == 2 && k == node3_key));
    ensure!(
        run.code() != 0 || !node3_kept,
        "P1: Pacemaker was told node3 is fenced (stonith_admin exit 0) while every LU still \
         holds node3's key {node3_key:#x}: {keys:x?}"
    );
    ensure!(
        node3_kept,
        "node3's key left the LUs, yet the fence derived another: {keys:x?}"
    );
    let log =
        std::fs::read_to_string(q.members[0].logs().join("pacemaker.log")).unwrap_or_default();
    let named = log
        .lines()
        .find(|l| l.contains("no node of the corosync nodelist derives"))
        .map(str::to_owned);
    ensure!(
        named.is_some_and(|l| l.contains(&format!("{node3_key:016x}"))),
        "fence_pr's failure in node1's Pacemaker log does not name node3's key {node3_key:#x}"
    );
    // Nor does fence_pr call it off when asked for its status.
    let status = q.in_node(
        0,
        "fence_pr --action=status --plug=node3 \
         --devices=/dev/disk/by-id/lab-lun0,/dev/disk/by-id/lab-lun1",
    )?;
    ensure!(
        status.code() == 1,
        "fence_pr status of node3: exit {} (2 is OFF): {}{}",
        status.code(),
        status.stdout,
        status.stderr
    );
    let write = write_to(
        &q.members[2].devices[0],
        5,
        &block_data("node3, not fenced"),
    );
    ensure!(
        write == WriteOutcome::Accepted,
        "node3's write: {write:?} (it is not fenced and was not reported fenced)"
    );
    println!(
        "  the fence of node3 failed after {} (stonith_admin exit {}): fence_pr named node3's key \
         {node3_key:#x}, which stays on every LU, and its status unknown, not OFF; node3's \
         writes still land, as Pacemaker knows",
        crate::secs(started.elapsed()),
        run.code()
    );
    // 4. node4 added now takes position 2, whose key node3 still holds: its unfencing must
    // register nowhere (two nodes with one key cannot be fenced apart)
    let node4 = q.add_member(3)?;
    q.write_corosync_conf_without_node2()?;
    q.in_node(0, "corosync-cfgtool -R")?.ok()?;
    let joined = Instant::now();
    q.boot(node4)?;
    let node4_log = q.members[node4].logs().join("pacemaker.log");
    q.wait(
        "node4's unfencing refused",
        SETTLE,
        Duration::from_millis(500),
        |_| {
            Ok(std::fs::read_to_string(&node4_log)
                .is_ok_and(|log| log.contains("two nodes would hold one key")))
        },
    )?;
    let keys: Vec<Vec<(usize, u64)>> = (0..LUNS).map(|l| q.keys(l)).collect::<Result<_, _>>()?;
    let node1_key = q.members[0].key()?;
    ensure!(
        keys.iter()
            .all(|lu| lu == &[(0, node1_key), (2, node3_key)]),
        "after node4's refused unfencing the LUs hold {keys:x?}, not node1's and node3's keys \
         alone"
    );
    let write = write_to(
        &q.members[node4].devices[0],
        6,
        &block_data("node4, unfenced not"),
    );
    ensure!(write == WriteOutcome::Refused, "node4's write: {write:?}");
    let named = std::fs::read_to_string(&node4_log)?.contains(&q.members[2].initiator);
    ensure!(named, "node4's refusal does not name node3's initiator");
    // node4's agent sees its key listed (node3's registrations) under no path of its own: not
    // armed, or it would self-fence when node3's reboot takes that key away
    q.wait(
        "node4's agent not armed on node3's registrations of its key",
        SETTLE,
        Duration::from_millis(500),
        |q| {
            Ok(q.agent_status(node4).is_some_and(|s| {
                s["state"] == "degraded"
                    && (0..LUNS).all(|l| {
                        s["lus"][l]["verdict"]
                            .as_str()
                            .is_some_and(|v| v.contains("none of this node's paths holds it"))
                    })
            }))
        },
    )?;
    println!("  node4's agent: not armed, degraded, its key listed under no path of its own");
    println!(
        "  node4 added at position 2: its unfencing by Pacemaker refused {} after its start, \
         naming node3's initiator, which holds {node3_key:#x}; nothing of node4's registered, \
         its write refused",
        crate::secs(joined.elapsed())
    );
    // 5. node3 rebooted (its namespaces killed and started again with the new nodelist): its
    // unfencing registers its new position's key in place of the old one; then node4's
    // unfencing, retried by Pacemaker, registers position 2's; and a fence of node3 is done
    // again
    let group = q.members[2].cgroup();
    std::fs::write(group.join("cgroup.kill"), "1")?;
    if let Some(mut child) = q.members[2].child.take() {
        child.wait()?;
    }
    q.wait("node3 down", SETTLE, Duration::from_millis(250), |q| {
        Ok(q.is_down(2))
    })?;
    let back = Instant::now();
    q.boot(2)?;
    let new_key = derived_key_at(1)?;
    let all_three = [(0, node1_key), (2, new_key), (node4, node3_key)];
    // Pacemaker retries node4's unfencing, or, when the DC changed while one was pending (the
    // new DC presumes it failed), fences node4 instead, which then needs a boot of its own.
    q.wait(
        "node3 unfenced with position 1's key, node4 then unfenced or fenced",
        SETTLE,
        Duration::from_millis(500),
        |q| {
            // never unfenced, node4's agent has nothing to self-fence on
            if let Some(state) = q.agent_state(node4) {
                ensure!(
                    state != "fenced",
                    "node4's agent self-fenced, never unfenced"
                );
            }
            let node3_rekeyed = (0..LUNS).try_fold(true, |all, l| {
                Ok::<bool, anyhow::Error>(all && q.keys(l)?.contains(&(2, new_key)))
            })?;
            let node4_on = (0..LUNS).try_fold(true, |all, l| {
                Ok::<bool, anyhow::Error>(all && q.keys(l)? == all_three)
            })?;
            Ok(node4_on || (node3_rekeyed && q.is_down(node4)))
        },
    )?;
    let node4_fenced = q.is_down(node4);
    if node4_fenced {
        if let Some(mut child) = q.members[node4].child.take() {
            child.wait()?;
        }
        q.boot(node4)?;
        q.wait(
            "node4 unfenced with position 2's key after its boot",
            SETTLE,
            Duration::from_millis(500),
            |q| (0..LUNS).try_fold(true, |all, l| Ok(all && q.keys(l)? == all_three)),
        )?;
    }
    println!(
        "  node3 rebooted: unfenced by Pacemaker with {new_key:#x} (position 1); node4 {} with \
         {node3_key:#x} (position 2), {} after node3's start",
        if node4_fenced {
            "fenced by Pacemaker meanwhile (its failed unfencing), then booted and unfenced"
        } else {
            "then unfenced"
        },
        crate::secs(back.elapsed())
    );
    let run = q.in_node(0, "stonith_admin --fence node3 --timeout 60")?;
    let keys: Vec<Vec<(usize, u64)>> = (0..LUNS).map(|l| q.keys(l)).collect::<Result<_, _>>()?;
    ensure!(
        run.code() == 0
            && keys
                .iter()
                .all(|lu| lu == &[(0, node1_key), (node4, node3_key)]),
        "the fence of node3 after its reboot: stonith_admin exit {}, the LUs hold {keys:x?}: {}{}",
        run.code(),
        run.stdout,
        run.stderr
    );
    println!(
        "  then node3 fenced through Pacemaker: done, node1's and node4's keys alone on every LU"
    );
    Ok(())
}

/// Issue 45: with fence_pr's `key_value=hash` (and the agents' `key_value = "hash"`), a key comes
/// from the node's name, so membership changes move nobody's key. node2 fenced and removed: node1's
/// and node3's keys stay as they were, node3's status is ON with the key it holds, the agents stay
/// healthy; node4 added: Pacemaker unfences it with its own key, and nothing else changes; a fence of
/// node3 then removes node3's key alone. Judged on the target's registrations.
fn with_hash_keys_a_node_removed_and_one_added_move_no_other_key() -> anyhow::Result<()> {
    let mut q = Quorum::start_keyed(3, 4, true)?;
    let keys: Vec<u64> = (0..3)
        .map(|i| q.members[i].key())
        .collect::<Result<_, _>>()?;
    let tag = derived_key_at(0)? >> 16;
    ensure!(
        keys.iter().all(|&k| k >> 16 == tag) && keys[0] != keys[2],
        "hash keys {keys:x?}: the cluster's tag, one per node"
    );
    // 1. node2 fenced and removed, as docs/operations.md has it
    q.fence_and_remove_node2()?;
    let devices = "/dev/disk/by-id/lab-lun0,/dev/disk/by-id/lab-lun1";
    let status = q.in_node(
        0,
        &format!("fence_pr --action=status --plug=node3 --key-value=hash --devices={devices}"),
    )?;
    ensure!(
        status.code() == 0 && q.registered_exactly(&[0, 2])?,
        "after node2's removal: fence_pr status of node3 exit {} (0 is ON): {}{}",
        status.code(),
        status.stdout,
        status.stderr
    );
    for index in [0, 2] {
        ensure!(
            q.agent_state(index).as_deref() == Some("healthy"),
            "node{}'s agent after the removal: {:?}",
            index + 1,
            q.agent_status(index)
        );
    }
    println!(
        "  node2 fenced and removed: node1's {:#x} and node3's {:#x} unchanged on every LU, \
         node3's status ON, both agents healthy",
        keys[0], keys[2]
    );
    // 2. node4 added: unfenced with its own key; nothing else moves
    let node4 = q.add_member(3)?;
    q.write_corosync_conf_without_node2()?;
    q.in_node(0, "corosync-cfgtool -R")?.ok()?;
    let joined = Instant::now();
    q.boot(node4)?;
    let node4_key = q.members[node4].key()?;
    ensure!(
        !keys.contains(&node4_key),
        "node4's hash key {node4_key:#x} is another's"
    );
    let took = q.wait(
        "node4 unfenced with its own key, nothing else changed",
        SETTLE,
        Duration::from_millis(500),
        |q| q.registered_exactly(&[0, 2, node4]),
    )?;
    q.wait(
        "node4's agent healthy",
        SETTLE,
        Duration::from_millis(500),
        |q| Ok(q.agent_state(node4).as_deref() == Some("healthy")),
    )?;
    for index in [0, 2] {
        ensure!(
            q.agent_state(index).as_deref() == Some("healthy"),
            "node{}'s agent after node4 joined: {:?}",
            index + 1,
            q.agent_status(index)
        );
    }
    println!(
        "  node4 added: unfenced by Pacemaker with {node4_key:#x} {} after its start ({} after \
         the reload), no other key changed, every agent healthy",
        crate::secs(took),
        crate::secs(joined.elapsed())
    );
    // 3. a fence of node3 removes node3's key alone
    let run = q.in_node(0, "stonith_admin --fence node3 --timeout 60")?;
    ensure!(
        run.code() == 0,
        "stonith_admin --fence node3: {}{}",
        run.stdout,
        run.stderr
    );
    q.wait(
        "node3's key gone, node1's and node4's alone",
        SETTLE,
        Duration::from_millis(250),
        |q| q.registered_exactly(&[0, node4]),
    )?;
    let write = write_to(&q.members[2].devices[0], 7, &block_data("node3, fenced"));
    ensure!(write == WriteOutcome::Refused, "node3's write: {write:?}");
    println!("  then node3 fenced through Pacemaker: its key alone gone, its write refused");
    Ok(())
}

/// Five nodes, each running an instance of a cloned resource; the network splits 2|3 with the
/// DC and one other node in the two (they still hear each other, not the others). The three keep
/// quorum and fence both of the two (Pacemaker fences them concurrently); the two, without quorum,
/// fence nobody. The target holds the three's keys alone on every LU, the two's writes are
/// refused, their agents take them down, the three stay up.
///
/// Why the DC and why the clone: a new DC knows whether a lost node was expected to be up only
/// from the old DC, so a node lost together with the old DC is fenced only when a resource runs
/// on it (Pacemaker's controller, `join_make_offer`: "any node that dies at the same time as the
/// old DC and is not running resource (still) won't be fenced"; 2.1.5 and 3.0 alike). The split
/// takes that hardest case on purpose; without the clone the node beside the DC, running
/// nothing, stayed registered in every such run (docs/pacemaker.md says so).
fn five_nodes_split_two_three_the_majority_fences_the_minority() -> anyhow::Result<()> {
    let q = Quorum::start(5)?;
    q.clone_everywhere()?;
    let dc = q.dc()?;
    // the DC and the last other node
    let partner = (0..5).rev().find(|&i| i != dc).context("five nodes")?;
    let minority = [dc, partner];
    let majority: Vec<usize> = (0..5).filter(|i| !minority.contains(i)).collect();
    let names = |group: &[usize]| {
        let names: Vec<String> = group.iter().map(|&i| q.members[i].name()).collect();
        names.join(", ")
    };
    let started = Instant::now();
    q.partition(&minority)?;
    println!(
        "  network split: {} (the DC) and {} | {}",
        q.members[dc].name(),
        q.members[partner].name(),
        names(&majority)
    );
    let took = q.wait(
        "the minority's keys gone from every LU, the majority's kept",
        SETTLE,
        Duration::from_millis(250),
        |q| {
            // never a node of the majority losing its key meanwhile
            for lun in 0..LUNS {
                let keys = q.keys(lun)?;
                for &i in &majority {
                    ensure!(
                        keys.contains(&(i, q.members[i].key()?)),
                        "{} of the majority lost its key on LU {lun}: {keys:x?}",
                        q.members[i].name()
                    );
                }
            }
            q.registered_exactly(&majority)
        },
    )?;
    println!(
        "  the majority fenced {} {} after the split",
        names(&minority),
        crate::secs(took)
    );
    for &i in &minority {
        let refused = write_to(&q.members[i].devices[0], 3, &block_data("minority write"));
        ensure!(
            refused == WriteOutcome::Refused,
            "{}'s write after the fence: {refused:?}",
            q.members[i].name()
        );
    }
    let down = q.wait(
        "the two down (their agents' self-fence)",
        Duration::from_secs(120),
        Duration::from_millis(250),
        |q| Ok(minority.iter().all(|&i| q.is_down(i))),
    )?;
    ensure!(
        majority.iter().all(|&i| !q.is_down(i)) && q.registered_exactly(&majority)?,
        "a node of the majority went down or lost its key"
    );
    println!(
        "  their writes refused; both down {} after the fence; {} up and registered, {} after \
         the split",
        crate::secs(down),
        names(&majority),
        crate::secs(started.elapsed())
    );
    Ok(())
}

/// Issue 45: README's quick start as written on three nodes (`NODES` names the three, `LUS` the
/// lab's LUs; nothing else changed): every node installs the package, writes the agent's
/// configuration and enables the packaged unit; node1 creates the fence device; Pacemaker unfences
/// every node and every agent arms; the armed check passes on every node. Then docs/operations.md's
/// rolling upgrade, node by node ([`rolling_upgrade`]): every key on every LU at every poll, no node
/// down, no fencing. The quick start's last block (a test fence) is the cluster suite's; fencing
/// in a quorum cluster is [`three_nodes_the_majority_fences_the_node_cut_off`]'s.
fn three_nodes_set_up_by_the_quick_start_then_a_rolling_upgrade() -> anyhow::Result<()> {
    let qs = QuickStart::prepare()?;
    let q = Quorum::online(3, false, true)?;
    let names: Vec<String> = q.members.iter().map(Member::name).collect();
    let values = QuickStart::values(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let every: Vec<usize> = (0..q.members.len()).collect();
    // set-up on every node, the fence device on one, the armed check on every node
    for (step, (at, body)) in qs.blocks.iter().enumerate().take(3) {
        let on = match at {
            crate::doc_blocks::Where::EveryNode => &every[..],
            crate::doc_blocks::Where::OneNode => &every[..1],
        };
        for &i in on {
            let what = format!("quick start block {}", step + 1);
            run_doc_block(&q, i, &what, &qs.deb_dir, &values, body)?;
        }
        if step == 0 {
            for &i in &every {
                ensure!(
                    !q.node_agent_pids(i).is_empty(),
                    "node{}: no agent running after `systemctl enable --now`",
                    i + 1
                );
            }
        }
        if step == 1 {
            q.every_node_armed("the fence device")?;
        }
    }
    rolling_upgrade(&q, &qs.deb_dir)
}
