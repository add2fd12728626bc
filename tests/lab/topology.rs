//! Topologies built in the guest through LIO's configfs (and open-iscsi), the target-side oracles,
//! and the O_DIRECT write probe.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use super::{Node, read_file, run, secs, write_file};

/// The unit of the write probe and of [`Topology::read_block`]: 4 KiB, aligned for O_DIRECT on any
/// logical block size the lab uses.
pub const BLOCK_SIZE: usize = 4096;

/// Where open-iscsi keeps its node database (`nodes`, `send_targets`, `static`, `ifaces`):
/// /etc/iscsi on Debian 12, /var/lib/iscsi from open-iscsi 2.1.9 (Debian 13).
pub const ISCSI_DBS: [&str; 2] = ["/etc/iscsi", "/var/lib/iscsi"];
const TARGET: &str = "/sys/kernel/config/target";
/// Backing files live on the guest's fresh tmpfs, never on the 9p host root.
const BACKING: &str = "/run/lab";
/// fence_pr's record of this boot in its default store, which `prfence unfence` writes.
const CLI_RECORD: &str = "/run/cluster.lus";
const LUN_BYTES: u64 = 64 << 20;
const IQN: &str = "iqn.2026-11.org.prfence.lab";
const PORTAL: &str = "127.0.0.1:3260";
/// Node B's portal in [`Topology::iscsi_second_portal`]: another loopback address, so that a packet
/// filter can tell B's session from A's.
const SECOND_PORTAL: &str = "127.0.0.2:3260";
/// The portals of [`Topology::arrays`]: per array, node A's and node B's (its two front-end
/// ports), so that a packet filter can cut one node's path to an array or the whole array. Third
/// octet the array (1 to 3), fourth the node: no clash with [`PORTAL`] or [`SECOND_PORTAL`].
const ARRAY_PORTALS: [[&str; 2]; 3] = [
    ["127.0.11.1:3260", "127.0.11.2:3260"],
    ["127.0.12.1:3260", "127.0.12.2:3260"],
    ["127.0.13.1:3260", "127.0.13.2:3260"],
];
/// open-iscsi's `replacement_timeout` (seconds) on the sessions of [`Topology::arrays`], as an
/// admin of arrays that can be lost sets it (dm-multipath setups use a few seconds): a lost
/// array's commands then fail that long after the session is found dead. With the default, 120
/// s, the kernel can hold them to `fence`'s whole 50 s deadline (TESTING.md, the arrays suite).
const ARRAY_REPLACEMENT_TIMEOUT: &str = "5";
/// The open-iscsi iface of [`Topology::third_initiator`].
/// The initiator name [`Topology::extra_initiator`] logs in with.
pub fn extra_initiator_name(letter: char) -> String {
    format!("{IQN}:node-{letter}")
}

/// The ifaces of initiators beyond nodes A and B ([`Topology::extra_initiator`]).
const EXTRA_IFACES: [&str; 3] = ["lab-c", "lab-d", "lab-e"];
/// The nftables table of [`Topology::hang_path`].
const HANG_TABLE: &str = "lab_hang";
/// How long the asynchronous SCSI scan after a login or a LUN link may take under TCG.
const SCAN_TIMEOUT: Duration = Duration::from_secs(180);
/// The most sessions (paths to every LU) a node of an iSCSI topology logs in.
pub const SESSIONS: usize = 4;
/// The most LUNs an iSCSI topology exports.
pub const MAX_LUNS: usize = 1024;

/// What one node sees: its initiator name (as LIO's configfs shows it) and its device paths.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub node: Node,
    pub initiator: String,
    devices: Vec<PathBuf>,
}

impl NodeView {
    /// The node's /dev/sdX paths, in LUN order (index i is LUN i).
    pub fn devices(&self) -> &[PathBuf] {
        &self.devices
    }

    /// [`Self::devices`] as command-line arguments.
    pub fn device_args(&self) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| d.display().to_string())
            .collect()
    }

    pub fn device(&self, lun: usize) -> &Path {
        &self.devices[lun]
    }
}

/// A logical unit of the topology, with the target's view of its PR state.
#[derive(Clone, Debug)]
pub struct TargetLu {
    pub index: usize,
    /// Its backstore directory under /sys/kernel/config/target/core.
    pub backstore: PathBuf,
    /// VPD page 80h unit serial.
    pub serial: String,
    /// The identifier Linux shows in /sys/block/sdX/device/wwid (VPD page 83h, e.g. `naa.6001405…`).
    pub wwid: String,
}

/// One line of `pr/res_pr_registered_i_pts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetRegistration {
    /// `iSCSI` or `loopback`.
    pub fabric: String,
    pub initiator: String,
    /// The iSCSI session's ISID, e.g. `0x00023d000001` (iSCSI registers per IQN + ISID).
    pub isid: Option<String>,
    pub key: u64,
    /// The PRgeneration LIO gave the registration (`PRgen`): the device's generation just before
    /// the REGISTER that created it, which left the device at this + 1.
    pub generation: u32,
}

/// `pr/res_holder`: who holds the persistent reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetHolder {
    pub fabric: String,
    pub initiator: String,
    pub isid: Option<String>,
}

impl TargetLu {
    fn pr_file(&self, name: &str) -> anyhow::Result<String> {
        read_file(self.backstore.join("pr").join(name))
    }

    /// The keys LIO saved for a power loss: those of the registrations made with APTPL, from
    /// `<dbroot>/pr/aptpl_<serial>` (`sa_res_key=`, decimal), in the file's order.
    pub fn aptpl_saved_keys(&self) -> anyhow::Result<Vec<u64>> {
        aptpl_records(&self.serial)?
            .iter()
            .map(|record| {
                let key = record
                    .split(',')
                    .find_map(|field| field.strip_prefix("sa_res_key="))
                    .with_context(|| format!("no sa_res_key in the APTPL record {record:?}"))?;
                key.parse()
                    .with_context(|| format!("sa_res_key {key:?} in {record:?}"))
            })
            .collect()
    }

    /// The target's registrations for this LU (`pr/res_pr_registered_i_pts`).
    pub fn registrations(&self) -> anyhow::Result<Vec<TargetRegistration>> {
        let text = self.pr_file("res_pr_registered_i_pts")?;
        let mut regs = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with("SPC-3 PR Registrations") || line == "None" {
                continue;
            }
            // "<fabric> Node: <name>[,i,0x<isid>] Key: 0x<key> PRgen: 0x<gen>"
            let (fabric, rest) = line
                .split_once(" Node: ")
                .with_context(|| format!("unexpected registration line {line:?}"))?;
            let (who, rest) = rest
                .split_once(" Key: ")
                .with_context(|| format!("no key in {line:?}"))?;
            let key = rest.split_whitespace().next().unwrap_or_default();
            let key = u64::from_str_radix(key.trim_start_matches("0x"), 16)
                .with_context(|| format!("bad key in {line:?}"))?;
            let generation = rest
                .split_once("PRgen: ")
                .and_then(|(_, g)| g.split_whitespace().next())
                .and_then(|g| u32::from_str_radix(g.trim_start_matches("0x"), 16).ok())
                .with_context(|| format!("no PRgen in {line:?}"))?;
            let (initiator, isid) = split_isid(who);
            regs.push(TargetRegistration {
                fabric: fabric.to_owned(),
                initiator,
                isid,
                key,
                generation,
            });
        }
        Ok(regs)
    }

    /// The reservation holder (`pr/res_holder`), None when nothing is reserved.
    pub fn holder(&self) -> anyhow::Result<Option<TargetHolder>> {
        let text = self.pr_file("res_holder")?;
        let text = text.trim();
        if text.starts_with("No SPC-3 Reservation holder") {
            return Ok(None);
        }
        // "SPC-3 Reservation: <fabric> Initiator: <name>[,i,0x<isid>]"
        let rest = text
            .strip_prefix("SPC-3 Reservation: ")
            .with_context(|| format!("unexpected res_holder {text:?}"))?;
        let (fabric, who) = rest
            .split_once(" Initiator: ")
            .with_context(|| format!("unexpected res_holder {text:?}"))?;
        let (initiator, isid) = split_isid(who.trim());
        Ok(Some(TargetHolder {
            fabric: fabric.to_owned(),
            initiator,
            isid,
        }))
    }

    /// The reservation type as its SPC code (1 WE, 3 EA, 5 WERO, 6 EARO, 7 WEAR, 8 EAAR), None when
    /// nothing is reserved (`pr/res_pr_type`).
    pub fn reservation_type(&self) -> anyhow::Result<Option<u8>> {
        let text = self.pr_file("res_pr_type")?;
        let text = text.trim();
        let Some(name) = text.strip_prefix("SPC-3 Reservation Type: ") else {
            return Ok(None);
        };
        let code = match name {
            "Write Exclusive Access" => 1,
            "Exclusive Access" => 3,
            "Write Exclusive Access, Registrants Only" => 5,
            "Exclusive Access, Registrants Only" => 6,
            "Write Exclusive Access, All Registrants" => 7,
            "Exclusive Access, All Registrants" => 8,
            other => bail!("unknown reservation type {other:?} in res_pr_type"),
        };
        Ok(Some(code))
    }

    /// How many commands the LU has received from every initiator since it was created
    /// (`statistics/scsi_lu/num_cmds`, LIO's own counter).
    pub fn commands(&self) -> anyhow::Result<u64> {
        let text = read_file(self.backstore.join("statistics/scsi_lu/num_cmds"))?;
        text.trim()
            .parse()
            .with_context(|| format!("bad num_cmds {text:?}"))
    }

    /// PRgeneration (`pr/res_pr_generation`). LIO does not bump it on unregister.
    pub fn generation(&self) -> anyhow::Result<u32> {
        let text = self.pr_file("res_pr_generation")?;
        u32::from_str_radix(text.trim().trim_start_matches("0x"), 16)
            .with_context(|| format!("bad res_pr_generation {text:?}"))
    }
}

fn split_isid(who: &str) -> (String, Option<String>) {
    match who.split_once(",i,") {
        Some((name, isid)) => (name.to_owned(), Some(isid.to_owned())),
        None => (who.to_owned(), None),
    }
}

/// The result of one O_DIRECT write (or read, [`Topology::read_probe`]) as the target judged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    Accepted,
    /// The target answered RESERVATION CONFLICT (the kernel reports EBADE).
    Refused,
    /// Any other error.
    Failed(String),
}

/// A block whose content is `text` padded with zeros.
pub fn block_data(text: &str) -> Vec<u8> {
    let mut block = text.as_bytes().to_vec();
    block.resize(BLOCK_SIZE, 0);
    block
}

/// The text at the start of a block written by [`block_data`].
pub fn block_text(block: &[u8]) -> String {
    let end = block.iter().position(|&b| b == 0).unwrap_or(block.len());
    String::from_utf8_lossy(&block[..end]).into_owned()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Iscsi,
    TcmLoop,
    Targetcli,
    /// [`Topology::arrays`]: one target per array.
    Arrays,
}

/// One LIO iSCSI target of [`Topology::arrays`], standing for a storage array: its own IQN,
/// portals and backing files.
#[derive(Clone, Debug)]
pub struct Array {
    /// Its target IQN.
    pub target: String,
    /// The topology's LU indices it exports (its LUNs 0, 1, … in this order).
    pub lus: std::ops::Range<usize>,
    /// Node A's portal, then node B's.
    portals: [&'static str; 2],
}

impl Array {
    /// The portal `node` logs in through.
    pub fn portal(&self, node: Node) -> &'static str {
        self.portals[node.index()]
    }
}

/// A target and two initiators, built for one test. Dropping it tears everything down.
pub struct Topology {
    kind: Kind,
    nodes: [NodeView; 2],
    lus: Vec<TargetLu>,
    setup: Duration,
    /// The portal node B logged in through (node A always uses [`PORTAL`]).
    portal_b: &'static str,
    /// The targets of [`Topology::arrays`], in LU order; empty for the other topologies.
    arrays: Vec<Array>,
}

impl Topology {
    /// One fileio LU seen through two tcm_loop nexuses (initiators `naa.50014050000000a1` and
    /// `…b1`), i.e. two /dev/sdX.
    pub fn tcm_loop() -> anyhow::Result<Self> {
        Self::loopback(true)
    }

    /// Like [`Topology::tcm_loop`], but the LU does not support PR (`attrib/emulate_pr=0`): PR
    /// commands get ILLEGAL REQUEST, INVALID OPERATION CODE.
    pub fn no_pr() -> anyhow::Result<Self> {
        Self::loopback(false)
    }

    /// An LIO iSCSI target on 127.0.0.1:3260 with `luns` fileio LUNs, logged in by two open-iscsi
    /// ifaces with initiators `iqn.2026-11.org.prfence.lab:node-a` and `…:node-b`.
    pub fn iscsi(luns: usize) -> anyhow::Result<Self> {
        Self::iscsi_through(luns, PORTAL)
    }

    /// Like [`Topology::iscsi`], but node B logs in through a second portal, 127.0.0.2:3260, so
    /// that its path alone can be hung ([`Topology::hang_path`]).
    pub fn iscsi_second_portal(luns: usize) -> anyhow::Result<Self> {
        Self::iscsi_through(luns, SECOND_PORTAL)
    }

    fn iscsi_through(luns: usize, portal_b: &'static str) -> anyhow::Result<Self> {
        ensure!(
            (1..=MAX_LUNS).contains(&luns),
            "iscsi topology wants 1..={MAX_LUNS} LUNs, not {luns}"
        );
        let start = begin()?;
        let lus = iscsi_target(luns, portal_b, None)?;
        Self::login_iscsi(Kind::Iscsi, lus, start, portal_b)
    }

    /// Three arrays or fewer as separate LIO iSCSI targets (`…:array1`, `…:array2`, …), array
    /// `i` exporting `luns[i]` fileio LUs on backing files of their own, through a portal per
    /// node ([`ARRAY_PORTALS`]: `127.0.1<i>.1:3260` for node A, `.2` for node B). Both nodes log
    /// in to every array, their sessions' `replacement_timeout` set to
    /// [`ARRAY_REPLACEMENT_TIMEOUT`]. The topology's LUs are numbered across the arrays (array
    /// 1's first, then array 2's…), and so are each node's devices.
    pub fn arrays(luns: &[usize]) -> anyhow::Result<Self> {
        ensure!(
            (1..=ARRAY_PORTALS.len()).contains(&luns.len()) && luns.iter().all(|&n| n >= 1),
            "an arrays topology wants 1 to {} arrays of at least one LU each, not {luns:?}",
            ARRAY_PORTALS.len()
        );
        let start = begin()?;
        let mut arrays = Vec::new();
        let mut lus = Vec::new();
        for (i, (&count, portals)) in luns.iter().zip(ARRAY_PORTALS).enumerate() {
            let array = Array {
                target: format!("{IQN}:array{}", i + 1),
                lus: lus.len()..lus.len() + count,
                portals,
            };
            lus.extend(target_exporting(
                &array.target,
                array.lus.clone(),
                &portals,
                None,
            )?);
            arrays.push(array);
        }
        for node in Node::BOTH {
            new_iface(&iface(node), &iscsi_initiator(node))?;
        }
        // each node through its own portal of each array: a record each, no discovery (which
        // would make records for every portal)
        for array in &arrays {
            for node in Node::BOTH {
                let iface = iface(node);
                let update = [
                    "-o",
                    "update",
                    "-n",
                    "node.session.timeo.replacement_timeout",
                    "-v",
                    ARRAY_REPLACEMENT_TIMEOUT,
                ];
                for action in [&["-o", "new"][..], &update, &["--login"][..]] {
                    let mut args = vec![
                        "-m",
                        "node",
                        "-T",
                        &array.target,
                        "-p",
                        array.portal(node),
                        "-I",
                        &iface,
                    ];
                    args.extend(action);
                    run("iscsiadm", args)?.ok()?;
                }
            }
        }
        let mut nodes = Vec::new();
        for node in Node::BOTH {
            let initiator = iscsi_initiator(node);
            let mut devices = Vec::new();
            for array in &arrays {
                let disks = wait_for(|| {
                    let disks = session_disks(|session| {
                        read_file(session.join("initiatorname"))
                            .is_ok_and(|name| name.trim() == initiator)
                            && read_file(session.join("targetname"))
                                .is_ok_and(|name| name.trim() == array.target)
                    })
                    .ok()?;
                    (disks.len() == array.lus.len()).then_some(disks)
                })
                .with_context(|| {
                    format!(
                        "node {} did not see the {} disks of {}",
                        node.letter(),
                        array.lus.len(),
                        array.target
                    )
                })?;
                devices.extend(disks);
            }
            nodes.push(NodeView {
                node,
                initiator,
                devices,
            });
        }
        fill_wwids(&mut lus, &nodes)?;
        let mut topology = Self::finish(Kind::Arrays, nodes, lus, start, PORTAL)?;
        for array in &arrays {
            println!(
                "lab:   {} LUs {:?}, portals A {} B {}",
                array.target,
                array.lus,
                array.portal(Node::A),
                array.portal(Node::B)
            );
        }
        topology.arrays = arrays;
        Ok(topology)
    }

    /// Array `array` (0-based) of a [`Topology::arrays`] topology.
    pub fn array(&self, array: usize) -> anyhow::Result<&Array> {
        self.arrays
            .get(array)
            .with_context(|| format!("no array {array} in this topology"))
    }

    /// Loses array `array` (0-based) of a [`Topology::arrays`] topology: every packet to and from
    /// its portals dropped for both nodes, as [`Topology::hang_path`] does to one path, until the
    /// guard is dropped ([`Topology::sessions_back`] then waits for the nodes' sessions).
    pub fn lose_array(&self, array: usize) -> anyhow::Result<PathFault> {
        let array = self.array(array)?;
        drop_packets(&array.portals)
    }

    /// Cuts node `node` off array `array` (0-based) alone: its portal's packets dropped, the
    /// other node's path to that array untouched.
    pub fn cut_array(&self, node: Node, array: usize) -> anyhow::Result<PathFault> {
        let array = self.array(array)?;
        drop_packets(&[array.portal(node)])
    }

    /// Waits until every iSCSI session of the topology is logged in again (after a fault is
    /// released: open-iscsi logs in again by itself).
    pub fn sessions_back(&self) -> anyhow::Result<Duration> {
        let sessions = match self.kind {
            Kind::Arrays => 2 * self.arrays.len(),
            _ => 2,
        };
        let start = Instant::now();
        sessions_logged_in(sessions)?;
        Ok(start.elapsed())
    }

    /// Restarts the target of an [`Topology::iscsi`] topology: the whole LIO configuration is
    /// removed and built again, LU data kept, the initiators left logged in (they recover
    /// their sessions once the target is back; this waits for that). LIO keeps no PR state of
    /// its own across this: with `restore_aptpl` the APTPL files LIO wrote (`<dbroot>/pr/
    /// aptpl_<serial>`, for registrations made with APTPL) are loaded back before the LUNs are
    /// exported, as `targetctl restore` does; without, the PR state is forgotten.
    pub fn restart_target(&self, restore_aptpl: bool) -> anyhow::Result<()> {
        ensure!(
            self.kind == Kind::Iscsi,
            "restart_target needs an iscsi topology"
        );
        let aptpl = if restore_aptpl {
            self.lus
                .iter()
                .map(|lu| aptpl_records(&lu.serial))
                .collect::<anyhow::Result<Vec<_>>>()?
        } else {
            vec![Vec::new(); self.lus.len()]
        };
        let mut errors = Vec::new();
        remove_target(&mut errors);
        ensure!(
            errors.is_empty(),
            "stopping the target: {}",
            errors.join("; ")
        );
        // the initiators notice the closed connections before the target is back
        wait_for(|| (!session_states().iter().any(|s| s == "LOGGED_IN")).then_some(()))
            .context("the nodes' iSCSI sessions stayed logged in while the target was gone")?;
        let lus = iscsi_target(self.lus.len(), self.portal_b, Some(&aptpl))?;
        for (old, new) in self.lus.iter().zip(&lus) {
            ensure!(
                old.backstore == new.backstore && old.serial == new.serial,
                "LU {} came back as {} (serial {})",
                old.index,
                new.backstore.display(),
                new.serial
            );
        }
        // both nodes' sessions back (open-iscsi retries the login during its recovery)
        sessions_logged_in(2).context("after the target restart")
    }

    /// The same as [`Topology::iscsi`], but built with targetcli commands, as an admin would.
    pub fn targetcli_iscsi(luns: usize) -> anyhow::Result<Self> {
        ensure!(
            (1..=256).contains(&luns),
            "targetcli topology wants 1..=256 LUNs, not {luns}"
        );
        let start = begin()?;
        let target = format!("{IQN}:target");
        // One targetcli session fed on stdin: each targetcli start costs seconds under TCG.
        let mut commands = vec![
            "set global color_mode=false".to_owned(),
            "set global auto_save_on_exit=false".to_owned(),
        ];
        for index in 0..luns {
            commands.push(format!(
                "/backstores/fileio create name=lun{index} file_or_dev={BACKING}/lun{index}.img size={LUN_BYTES} write_back=false"
            ));
        }
        commands.push(format!("/iscsi create {target}"));
        for index in 0..luns {
            commands.push(format!(
                "/iscsi/{target}/tpg1/luns create /backstores/fileio/lun{index} lun={index}"
            ));
        }
        for node in Node::BOTH {
            // auto_add_mapped_luns (the default) maps every LUN to the new ACL
            commands.push(format!(
                "/iscsi/{target}/tpg1/acls create {}",
                iscsi_initiator(node)
            ));
        }
        commands.push(format!(
            "/iscsi/{target}/tpg1 set attribute authentication=0"
        ));
        commands.push("exit".to_owned());
        let session = targetcli(&commands.join("\n"))?;
        // targetcli exits 0 even when a command failed: check that what it should build exists.
        let tpg = iscsi_tpg();
        let mut expected: Vec<PathBuf> = (0..luns)
            .map(|i| tpg.join(format!("lun/lun_{i}")))
            .collect();
        expected.extend(Node::BOTH.map(|n| {
            tpg.join("acls")
                .join(iscsi_initiator(n))
                .join(format!("lun_{}", luns - 1))
        }));
        if let Some(missing) = expected.iter().find(|p| !p.exists()) {
            bail!(
                "targetcli did not create {}:\n{}{}",
                missing.display(),
                session.stdout,
                session.stderr
            );
        }
        // targetcli chose the backstore names and serials: read them back from configfs.
        let mut lus = Vec::new();
        for index in 0..luns {
            let port = tpg.join(format!("lun/lun_{index}"));
            let backstore = linked_backstore(&port)?;
            let serial = unit_serial(&backstore)?;
            lus.push(TargetLu {
                index,
                backstore,
                serial,
                wwid: String::new(),
            });
        }
        Self::login_iscsi(Kind::Targetcli, lus, start, PORTAL)
    }

    fn loopback(emulate_pr: bool) -> anyhow::Result<Self> {
        let start = begin()?;
        let lu = fileio(0, emulate_pr)?;
        let mut nodes = Vec::new();
        for node in Node::BOTH {
            let tpg = PathBuf::from(format!(
                "{TARGET}/loopback/naa.50014050000000{}0/tpgt_1",
                node.lower()
            ));
            fs::create_dir_all(&tpg).with_context(|| format!("mkdir {}", tpg.display()))?;
            // Since Linux 6.4 a TPG gets its RELATIVE TARGET PORT IDENTIFIER when it is enabled,
            // and a tcm_loop TPG has no `enable`: both ports would report 0 (READ FULL STATUS, 7.2)
            // and REGISTER AND MOVE could not name B's. Set one, as an admin must (before the
            // nexus exists, so no INQUIRY DATA HAS CHANGED attention follows).
            let rtpi = tpg.join("rtpi");
            if rtpi.exists() && read_file(&rtpi)?.trim() == "0x0" {
                let id = match node {
                    Node::A => "0x100",
                    Node::B => "0x101",
                };
                write_file(&rtpi, id)?;
            }
            let initiator = format!("naa.50014050000000{}1", node.lower());
            // the nexus must exist before a LUN is linked, or the scan finds nothing
            write_file(tpg.join("nexus"), &initiator)?;
            let port = tpg.join("lun/lun_0");
            fs::create_dir_all(&port).with_context(|| format!("mkdir {}", port.display()))?;
            link(&lu.backstore, &port.join("lun0"))?;
            let address = read_file(tpg.join("address"))?; // "H:C:T" of this nexus's SCSI host
            let scsi_device = PathBuf::from(format!(
                "/sys/class/scsi_device/{}:0/device",
                address.trim()
            ));
            let device = wait_for(|| block_device(&scsi_device).ok()).with_context(|| {
                format!(
                    "node {} sees no disk at {}",
                    node.letter(),
                    scsi_device.display()
                )
            })?;
            nodes.push(NodeView {
                node,
                initiator,
                devices: vec![device],
            });
        }
        let mut lus = vec![lu];
        fill_wwids(&mut lus, &nodes)?;
        Self::finish(Kind::TcmLoop, nodes, lus, start, PORTAL)
    }

    fn login_iscsi(
        kind: Kind,
        mut lus: Vec<TargetLu>,
        start: Instant,
        portal_b: &'static str,
    ) -> anyhow::Result<Self> {
        let target = format!("{IQN}:target");
        for node in Node::BOTH {
            let iface = iface(node);
            new_iface(&iface, &iscsi_initiator(node))?;
        }
        run(
            "iscsiadm",
            [
                "-m",
                "discovery",
                "-t",
                "st",
                "-p",
                PORTAL,
                "-I",
                &iface(Node::A),
                "-I",
                &iface(Node::B),
            ],
        )?
        .ok()?;
        if portal_b == PORTAL {
            run(
                "iscsiadm",
                ["-m", "node", "-T", &target, "-p", PORTAL, "--login"],
            )?
            .ok()?;
        } else {
            // discovery found both portals for both ifaces: each node logs in through its own
            for (node, portal) in [(Node::A, PORTAL), (Node::B, portal_b)] {
                let iface = iface(node);
                run(
                    "iscsiadm",
                    [
                        "-m", "node", "-T", &target, "-p", portal, "-I", &iface, "--login",
                    ],
                )?
                .ok()?;
            }
        }
        let mut nodes = Vec::new();
        for node in Node::BOTH {
            let initiator = iscsi_initiator(node);
            let devices = wait_for(|| {
                let devices = iscsi_devices(&initiator).ok()?;
                (devices.len() == lus.len()).then_some(devices)
            })
            .with_context(|| {
                format!(
                    "node {} ({initiator}) did not see {} disks",
                    node.letter(),
                    lus.len()
                )
            })?;
            nodes.push(NodeView {
                node,
                initiator,
                devices,
            });
        }
        fill_wwids(&mut lus, &nodes)?;
        Self::finish(kind, nodes, lus, start, portal_b)
    }

    fn finish(
        kind: Kind,
        nodes: Vec<NodeView>,
        lus: Vec<TargetLu>,
        start: Instant,
        portal_b: &'static str,
    ) -> anyhow::Result<Self> {
        let [a, b]: [NodeView; 2] = nodes
            .try_into()
            .map_err(|_| anyhow::anyhow!("a topology has exactly two nodes"))?;
        // A systemd guest's udevd probes every new disk: the topology is ready once it is done.
        crate::udevd::settle_if_running(Duration::from_secs(1200))?;
        let topology = Topology {
            kind,
            nodes: [a, b],
            lus,
            setup: start.elapsed(),
            portal_b,
            arrays: Vec::new(),
        };
        println!("{}", topology.describe());
        Ok(topology)
    }

    /// One line per node and LU, plus the setup time, for test logs.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "lab: {:?} topology with {} LU(s) ready in {}",
            self.kind,
            self.lus.len(),
            secs(self.setup)
        );
        for view in &self.nodes {
            let devices: Vec<String> = view
                .devices
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            let shown = if devices.len() > 4 {
                format!(
                    "{} … {}",
                    devices[..2].join(" "),
                    devices[devices.len() - 1]
                )
            } else {
                devices.join(" ")
            };
            text.push_str(&format!(
                "\nlab:   node {} {}: {shown}",
                view.node.letter(),
                view.initiator
            ));
        }
        if let (Some(first), Some(last)) = (self.lus.first(), self.lus.last()) {
            text.push_str(&format!(
                "\nlab:   LU 0 serial {} wwid {}",
                first.serial, first.wwid
            ));
            if self.lus.len() > 1 {
                text.push_str(&format!(
                    "\nlab:   LU {} serial {} wwid {}",
                    last.index, last.serial, last.wwid
                ));
            }
        }
        text
    }

    pub fn node(&self, node: Node) -> &NodeView {
        &self.nodes[node.index()]
    }

    /// Node `node`'s path to LUN `lun`.
    pub fn device(&self, node: Node, lun: usize) -> &Path {
        self.node(node).device(lun)
    }

    pub fn lus(&self) -> &[TargetLu] {
        &self.lus
    }

    pub fn lu(&self, index: usize) -> &TargetLu {
        &self.lus[index]
    }

    /// How long building this topology took (configfs, logins, device scan).
    pub fn setup_time(&self) -> Duration {
        self.setup
    }

    /// `iscsiadm -m node … ACTION` for node `node`'s session record.
    fn iscsiadm_node(&self, node: Node, action: &str) -> anyhow::Result<()> {
        ensure!(
            matches!(self.kind, Kind::Iscsi | Kind::Targetcli),
            "{action} needs a one-target iSCSI topology"
        );
        let target = format!("{IQN}:target");
        let iface = iface(node);
        let portal = self.portal(node);
        run(
            "iscsiadm",
            [
                "-m", "node", "-T", &target, "-p", portal, "-I", &iface, action,
            ],
        )?
        .ok()?;
        Ok(())
    }

    /// The iSCSI portal node `node` logged in through.
    fn portal(&self, node: Node) -> &'static str {
        match node {
            Node::A => PORTAL,
            Node::B => self.portal_b,
        }
    }

    /// The address and port of node `node`'s own portal: only node B of an
    /// [`Topology::iscsi_second_portal`] topology has one, which its faults can target alone.
    fn own_portal(&self, node: Node) -> anyhow::Result<(&'static str, &'static str)> {
        ensure!(
            node == Node::B && self.portal_b != PORTAL,
            "only node B of an iscsi_second_portal topology has a path of its own"
        );
        self.portal_b
            .split_once(':')
            .context("portal without a port")
    }

    /// Hangs node `node`'s iSCSI path: every packet of its session is dropped silently on
    /// arrival (nftables in the guest), so its commands get no answer, no reset and no error,
    /// until the guard is dropped. Needs [`Topology::iscsi_second_portal`] and node B.
    pub fn hang_path(&self, node: Node) -> anyhow::Result<PathFault> {
        self.own_portal(node)?;
        drop_packets(&[self.portal_b])
    }

    /// Delays node `node`'s iSCSI requests to its own portal by `delay` (netem on the loopback
    /// device, only packets to that portal), until the guard is dropped: every command of that
    /// path reaches the target `delay` late, in order, and is answered. Keep `delay` under
    /// open-iscsi's NOP-Out timeout (5 s), or the session is dropped. Needs
    /// [`Topology::iscsi_second_portal`] and node B.
    pub fn delay_path(&self, node: Node, delay: Duration) -> anyhow::Result<PathFault> {
        let (address, port) = self.own_portal(node)?;
        for module in ["sch_prio", "sch_netem", "cls_u32"] {
            run("modprobe", [module])?.ok()?;
        }
        let delay_ms = format!("{}ms", delay.as_millis());
        // Every other packet goes to band 2 (priomap all 1), never through the netem band.
        let script = [
            "qdisc add dev lo root handle 1: prio bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1"
                .to_owned(),
            format!("qdisc add dev lo parent 1:3 handle 30: netem delay {delay_ms} limit 100000"),
            format!(
                "filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst {address}/32 \
                 match ip dport {port} 0xffff flowid 1:3"
            ),
        ];
        let guard = PathFault {
            undo: release_delay,
            released: false,
        };
        for line in script {
            let args: Vec<&str> = line.split_whitespace().collect();
            run("tc", args)?.ok()?;
        }
        Ok(guard)
    }

    /// Removes LUN `lun` from the target as an admin would: unmapped from both nodes' ACLs and
    /// its port unlinked (configfs). The LU's backstore and PR state stay; the initiators' disks
    /// stay until they notice (LOGICAL UNIT NOT SUPPORTED).
    pub fn remove_lun(&self, lun: usize) -> anyhow::Result<()> {
        ensure!(
            self.kind == Kind::Iscsi,
            "remove_lun needs an iscsi topology"
        );
        let tpg = iscsi_tpg();
        let mut errors = Vec::new();
        for node in Node::BOTH {
            let mapped = tpg
                .join("acls")
                .join(iscsi_initiator(node))
                .join(format!("lun_{lun}"));
            unlink_all(&mapped, &mut errors);
            rmdir(&mapped, &mut errors);
        }
        let port = tpg.join(format!("lun/lun_{lun}"));
        unlink_all(&port, &mut errors);
        rmdir(&port, &mut errors);
        ensure!(
            errors.is_empty(),
            "removing LUN {lun}: {}",
            errors.join("; ")
        );
        Ok(())
    }

    /// Takes LUN `lun` out of node `node`'s ACL: the target answers that node's commands to it
    /// with LOGICAL UNIT NOT SUPPORTED, the other node's as before (an array one node cannot
    /// reach). Its device stays on the node.
    pub fn unmap_lun(&self, node: Node, lun: usize) -> anyhow::Result<()> {
        ensure!(
            self.kind == Kind::Iscsi,
            "unmap_lun needs an iscsi topology"
        );
        let mapped = iscsi_tpg()
            .join("acls")
            .join(iscsi_initiator(node))
            .join(format!("lun_{lun}"));
        let mut errors = Vec::new();
        unlink_all(&mapped, &mut errors);
        rmdir(&mapped, &mut errors);
        ensure!(
            errors.is_empty(),
            "unmapping LUN {lun} from node {}: {}",
            node.letter(),
            errors.join("; ")
        );
        Ok(())
    }

    /// Logs node `node`'s iSCSI session out and in again. The new session has a new ISID, so the
    /// target sees a new I_T nexus and the old one's registrations are orphaned (fence-agents
    /// #517). The node's device paths are refreshed (the disks get new names).
    pub fn relogin(&mut self, node: Node) -> anyhow::Result<()> {
        self.logout(node)?;
        self.login(node)
    }

    /// Logs node `node`'s iSCSI session out: its disks vanish.
    pub fn logout(&self, node: Node) -> anyhow::Result<()> {
        self.iscsiadm_node(node, "--logout")
    }

    /// Logs node `node` in again after [`Topology::logout`]: a new session with a new ISID, so
    /// the target sees a new I_T nexus. The node's device paths are refreshed (the disks get
    /// new names).
    pub fn login(&mut self, node: Node) -> anyhow::Result<()> {
        self.iscsiadm_node(node, "--login")?;
        let initiator = iscsi_initiator(node);
        let count = self.lus.len();
        let devices = wait_for(|| {
            let devices = iscsi_devices(&initiator).ok()?;
            (devices.len() == count).then_some(devices)
        })
        .with_context(|| format!("node {} sees no disks after re-login", node.letter()))?;
        self.nodes[node.index()].devices = devices;
        let mut lus = self.lus.clone();
        fill_wwids(&mut lus, &self.nodes)?;
        for (old, new) in self.lus.iter().zip(&lus) {
            ensure!(
                old.wwid == new.wwid,
                "after re-login LUN {} shows wwid {}, not {}",
                old.index,
                new.wwid,
                old.wwid
            );
        }
        Ok(())
    }

    /// Logs node `node` in a second time, through another open-iscsi iface with the same
    /// initiator name: a second I_T nexus (same IQN, another ISID), i.e. a second path to every
    /// LU for dm-multipath. A node with a portal of its own ([`Topology::iscsi_second_portal`])
    /// logs in through the first portal, so this path stays when its own is hung or delayed.
    /// Returns that session's disks in LUN order.
    pub fn second_session(&self, node: Node) -> anyhow::Result<Vec<PathBuf>> {
        self.session(node, 2)
    }

    /// [`Topology::second_session`] for session `n` of the node (2 to [`SESSIONS`]): another
    /// path to every LU.
    pub fn session(&self, node: Node, n: usize) -> anyhow::Result<Vec<PathBuf>> {
        ensure!(
            matches!(self.kind, Kind::Iscsi | Kind::Targetcli),
            "a second session needs a one-target iSCSI topology"
        );
        ensure!(
            (2..=SESSIONS).contains(&n),
            "session {n}: a node has sessions 2 to {SESSIONS} beside its first"
        );
        let iface = session_iface(node, n);
        new_iface(&iface, &iscsi_initiator(node))?;
        let target = format!("{IQN}:target");
        let portal = PORTAL;
        for action in ["new", "login"] {
            let mut args = vec!["-m", "node", "-T", &target, "-p", portal, "-I", &iface];
            if action == "new" {
                args.extend(["-o", "new"]);
            } else {
                args.push("--login");
            }
            run("iscsiadm", args)?.ok()?;
        }
        let count = self.lus.len();
        wait_for(|| {
            let devices = session_disks(|session| {
                read_file(session.join("ifacename")).is_ok_and(|n| n.trim() == iface)
            })
            .ok()?;
            (devices.len() == count).then_some(devices)
        })
        .with_context(|| format!("node {}'s second session shows no disks", node.letter()))
    }

    /// Logs a third initiator in to every LU of an [`Topology::iscsi`] topology: `…:node-c`, no
    /// node of the cluster (another host on the SAN), with an ACL of its own. Returns its disks
    /// in LUN order.
    pub fn third_initiator(&self) -> anyhow::Result<Vec<PathBuf>> {
        self.extra_initiator('c')
    }

    /// Logs initiator `…:node-<letter>` (`c`, `d` or `e`: [`EXTRA_IFACES`]) in to every LU of an
    /// [`Topology::iscsi`] topology, with an ACL and an iface `lab-<letter>` of its own. Returns
    /// its disks in LUN order.
    pub fn extra_initiator(&self, letter: char) -> anyhow::Result<Vec<PathBuf>> {
        let iface = format!("lab-{letter}");
        ensure!(
            EXTRA_IFACES.contains(&iface.as_str()),
            "no extra initiator {letter} (the teardown knows {EXTRA_IFACES:?})"
        );
        ensure!(
            self.kind == Kind::Iscsi,
            "another initiator needs an iscsi topology"
        );
        let initiator = extra_initiator_name(letter);
        let tpg = iscsi_tpg();
        for index in 0..self.lus.len() {
            let mapped = tpg
                .join("acls")
                .join(&initiator)
                .join(format!("lun_{index}"));
            fs::create_dir_all(&mapped).with_context(|| format!("mkdir {}", mapped.display()))?;
            link(&tpg.join(format!("lun/lun_{index}")), &mapped.join("lun"))?;
        }
        new_iface(&iface, &initiator)?;
        let target = format!("{IQN}:target");
        for action in [&["-o", "new"][..], &["--login"][..]] {
            let mut args = vec!["-m", "node", "-T", &target, "-p", PORTAL, "-I", &iface];
            args.extend(action);
            run("iscsiadm", args)?.ok()?;
        }
        let count = self.lus.len();
        wait_for(|| {
            let devices = iscsi_devices(&initiator).ok()?;
            (devices.len() == count).then_some(devices)
        })
        .with_context(|| format!("initiator {initiator} sees no disks"))
    }

    /// A dm-multipath map `lab-<name>` over `paths` to LUN `lun`, made with plain dmsetup (no
    /// udev, no multipathd) and a multipath uuid (`mpath-…`; multipathd's would be `mpath-<wwid>`,
    /// but both nodes' maps of one LU live on this one guest and uuids must differ). Returns its
    /// `/dev/dm-N`. Teardown removes every `lab-` map.
    pub fn multipath_map(
        &self,
        name: &str,
        lun: usize,
        paths: &[&Path],
    ) -> anyhow::Result<PathBuf> {
        ensure!(!paths.is_empty(), "a multipath map needs paths");
        run("modprobe", ["-a", "dm_multipath", "dm_round_robin"])?.ok()?;
        let mut sectors = None;
        let mut table_paths = String::new();
        for path in paths {
            let disk = path.file_name().context("path name")?.to_string_lossy();
            let sysfs = Path::new("/sys/block").join(&*disk);
            sectors.get_or_insert(read_file(sysfs.join("size"))?.trim().to_owned());
            table_paths.push_str(&format!(" {} 1", read_file(sysfs.join("dev"))?.trim()));
        }
        let sectors = sectors.unwrap_or_default();
        let table = format!(
            "0 {sectors} multipath 0 0 1 1 round-robin 0 {} 1{table_paths}",
            paths.len()
        );
        let map = format!("lab-{name}");
        let uuid = format!("mpath-{}-{map}", self.lu(lun).wwid);
        run(
            "dmsetup",
            [
                "create",
                "--noudevsync",
                &map,
                "-u",
                &uuid,
                "--table",
                &table,
            ],
        )?
        .ok()?;
        dm_device(&map)?.with_context(|| format!("no /sys/block/dm-* is named {map}"))
    }

    /// Eats pending UNIT ATTENTIONs with TEST UNIT READY on every device of both nodes, for tests
    /// that don't study them. (Measured on Debian's 6.1: the kernel's own scan of a new disk
    /// already consumed the power-on UA, so a fresh topology usually has none left to show.)
    pub fn settle(&self) -> anyhow::Result<()> {
        for view in &self.nodes {
            for device in &view.devices {
                let mut tries = 0;
                while run("sg_turs", [device])?.code() != 0 {
                    tries += 1;
                    ensure!(
                        tries < 5,
                        "TEST UNIT READY on {} keeps failing",
                        device.display()
                    );
                }
            }
        }
        Ok(())
    }

    /// Node `node` writes a recognisable block `block` of LUN `lun` with O_DIRECT.
    pub fn write_probe(&self, node: Node, lun: usize, block: u64) -> WriteOutcome {
        let text = format!(
            "write probe from node {} to LUN {lun} block {block}",
            node.letter()
        );
        self.write_block(node, lun, block, &block_data(&text))
    }

    /// Node `node` reads block `block` of LUN `lun` with O_DIRECT: whether the target lets it read
    /// (the exclusive-access types refuse reads too). Same verdicts as [`Topology::write_probe`].
    pub fn read_probe(&self, node: Node, lun: usize, block: u64) -> WriteOutcome {
        let device = self.device(node, lun);
        let mut buffer = AlignedBlock::new();
        let result = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(device)
            .and_then(|file| file.read_exact_at(buffer.get_mut(), block * BLOCK_SIZE as u64));
        match result {
            Ok(()) => WriteOutcome::Accepted,
            Err(e) if e.raw_os_error() == Some(libc::EBADE) => WriteOutcome::Refused,
            Err(e) => WriteOutcome::Failed(format!("O_DIRECT read from {}: {e}", device.display())),
        }
    }

    /// Node `node` writes `data` (at most [`BLOCK_SIZE`] bytes, zero padded) to block `block` of
    /// LUN `lun` with O_DIRECT, so the target, not the page cache, judges it.
    pub fn write_block(&self, node: Node, lun: usize, block: u64, data: &[u8]) -> WriteOutcome {
        write_to(self.device(node, lun), block, data)
    }

    /// Node `node` reads block `block` of LUN `lun` with O_DIRECT (what the target has stored).
    pub fn read_block(&self, node: Node, lun: usize, block: u64) -> anyhow::Result<Vec<u8>> {
        let device = self.device(node, lun);
        let mut buffer = AlignedBlock::new();
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(device)
            .and_then(|file| file.read_exact_at(buffer.get_mut(), block * BLOCK_SIZE as u64))
            .with_context(|| format!("O_DIRECT read of block {block} from {}", device.display()))?;
        Ok(buffer.get().to_vec())
    }
}

/// An open-iscsi iface `iface` logging in as `initiator` (one "node"; a second iface with the
/// same name is a second session, i.e. another I_T nexus, of that node).
fn new_iface(iface: &str, initiator: &str) -> anyhow::Result<()> {
    run("iscsiadm", ["-m", "iface", "-I", iface, "-o", "new"])?.ok()?;
    let update = [
        "-m",
        "iface",
        "-I",
        iface,
        "-o",
        "update",
        "-n",
        "iface.initiatorname",
        "-v",
        initiator,
    ];
    run("iscsiadm", update)?.ok()?;
    Ok(())
}

/// A fault on one path ([`Topology::hang_path`], [`Topology::delay_path`]); dropping it undoes
/// the fault.
pub struct PathFault {
    undo: fn() -> anyhow::Result<()>,
    released: bool,
}

impl PathFault {
    pub fn release(mut self) -> anyhow::Result<()> {
        self.released = true;
        (self.undo)()
    }
}

impl Drop for PathFault {
    fn drop(&mut self) {
        if !self.released
            && let Err(e) = (self.undo)()
        {
            eprintln!("lab: {e:#}");
        }
    }
}

fn release_delay() -> anyhow::Result<()> {
    run("tc", ["qdisc", "del", "dev", "lo", "root"])?.ok()?;
    Ok(())
}

/// Drops every packet to and from each of `portals` (`ADDRESS:PORT`) silently on arrival
/// (nftables in the guest, table [`HANG_TABLE`]), so commands through them get no answer, no
/// reset and no error, until the guard is dropped. One such fault at a time.
fn drop_packets(portals: &[&str]) -> anyhow::Result<PathFault> {
    run("modprobe", ["nf_tables"])?.ok()?;
    // The input hook, not output: a drop on output fails the sender's send (EPERM), which is an
    // error the initiator sees, not a hang.
    let mut rules = format!(
        "add table ip {HANG_TABLE}\n\
         add chain ip {HANG_TABLE} input {{ type filter hook input priority 0; }}\n"
    );
    for portal in portals {
        let (address, port) = portal
            .split_once(':')
            .with_context(|| format!("portal {portal} without a port"))?;
        rules.push_str(&format!(
            "add rule ip {HANG_TABLE} input ip daddr {address} tcp dport {port} drop\n\
             add rule ip {HANG_TABLE} input ip saddr {address} tcp sport {port} drop\n"
        ));
    }
    let script = Path::new(BACKING).join("hang.nft");
    write_file(&script, &rules)?;
    run("nft", ["-f", &script.display().to_string()])?.ok()?;
    Ok(PathFault {
        undo: release_hang,
        released: false,
    })
}

fn release_hang() -> anyhow::Result<()> {
    run("nft", ["delete", "table", "ip", HANG_TABLE])?.ok()?;
    Ok(())
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Err(e) = teardown_all() {
            eprintln!("lab: teardown failed: {e:#}");
        }
    }
}

/// Writes `data` (at most [`BLOCK_SIZE`] bytes, zero padded) to block `block` of any block device
/// (a node's disk, a multipath map) with O_DIRECT, so the target, not the page cache, judges it.
pub fn write_to(device: &Path, block: u64, data: &[u8]) -> WriteOutcome {
    let mut buffer = AlignedBlock::new();
    let len = data.len().min(BLOCK_SIZE);
    buffer.get_mut()[..len].copy_from_slice(&data[..len]);
    let result = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .and_then(|file| file.write_all_at(buffer.get(), block * BLOCK_SIZE as u64));
    match result {
        Ok(()) => WriteOutcome::Accepted,
        Err(e) if e.raw_os_error() == Some(libc::EBADE) => WriteOutcome::Refused,
        Err(e) => WriteOutcome::Failed(format!("O_DIRECT write to {}: {e}", device.display())),
    }
}

/// A page-aligned block buffer for O_DIRECT, without unsafe: the aligned window of a larger Vec.
struct AlignedBlock {
    storage: Vec<u8>,
    offset: usize,
}

impl AlignedBlock {
    fn new() -> Self {
        let storage = vec![0u8; 2 * BLOCK_SIZE];
        let offset = storage.as_ptr().align_offset(BLOCK_SIZE);
        AlignedBlock { storage, offset }
    }

    fn get(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + BLOCK_SIZE]
    }

    fn get_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + BLOCK_SIZE]
    }
}

/// Starts a topology: refuses to run outside the guest, checks nothing is left from before.
fn begin() -> anyhow::Result<Instant> {
    ensure!(
        super::guest::inside(),
        "topologies are built only inside the lab guest"
    );
    teardown_all().context("cleaning up before a new topology")?;
    fs::create_dir_all(BACKING).with_context(|| format!("mkdir {BACKING}"))?;
    Ok(Instant::now())
}

/// Runs one targetcli session reading `script` on stdin. targetcli keeps its preferences, history
/// and log in `~/.targetcli`: its home is the test's scratch directory, so none of it outlives
/// the test.
fn targetcli(script: &str) -> anyhow::Result<super::CommandRun> {
    let mut cmd = std::process::Command::new("targetcli");
    cmd.env("HOME", super::WORK)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().context("cannot start targetcli")?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, script.as_bytes()).context("feeding targetcli")?;
    }
    let out = child.wait_with_output().context("waiting for targetcli")?;
    super::CommandRun {
        command: format!("targetcli <<EOF\n{script}\nEOF"),
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: start.elapsed(),
    }
    .ok()
}

fn iscsi_tpg() -> PathBuf {
    tpg_of(&format!("{IQN}:target"))
}

/// The configfs directory of target `target`'s one TPG.
fn tpg_of(target: &str) -> PathBuf {
    PathBuf::from(format!("{TARGET}/iscsi/{target}/tpgt_1"))
}

fn iscsi_initiator(node: Node) -> String {
    format!("{IQN}:node-{}", node.lower())
}

fn iface(node: Node) -> String {
    format!("lab-{}", node.lower())
}

/// The iface of a node's session `n` ([`Topology::session`]).
fn session_iface(node: Node, n: usize) -> String {
    format!("lab-{}{n}", node.lower())
}

/// `/dev/dm-N` of the device-mapper map named `name`, if any: the kernel names a map's disk by
/// its minor (`dm-%d`). Asked of dmsetup, not found by reading every /sys/block entry, which
/// took minutes once 1024 maps were made among 5000 disks.
fn dm_device(name: &str) -> anyhow::Result<Option<PathBuf>> {
    let info = run(
        "dmsetup",
        ["info", "-c", "--noheadings", "-o", "minor", name],
    )?;
    if info.code() != 0 {
        return Ok(None);
    }
    let minor: u32 = info
        .stdout
        .trim()
        .parse()
        .with_context(|| format!("dmsetup info {name}: {:?}", info.stdout))?;
    Ok(Some(PathBuf::from(format!("/dev/dm-{minor}"))))
}

/// Builds the LIO iSCSI target of [`Topology::iscsi`] in configfs: `luns` fileio LUs, both
/// portals, both nodes' ACLs. With `aptpl` it restarts a target ([`Topology::restart_target`]):
/// the backing files are kept and each LU's records are loaded into `pr/res_aptpl_metadata`
/// before it is exported.
fn iscsi_target(
    luns: usize,
    portal_b: &str,
    aptpl: Option<&[Vec<String>]>,
) -> anyhow::Result<Vec<TargetLu>> {
    let portals = if portal_b == PORTAL {
        vec![PORTAL]
    } else {
        vec![PORTAL, portal_b]
    };
    target_exporting(&format!("{IQN}:target"), 0..luns, &portals, aptpl)
}

/// Builds LIO iSCSI target `target` in configfs: the topology's LUs `lus` as fileio LUs (its
/// LUNs 0, 1, … in that order), a portal for each of `portals`, both nodes' ACLs mapping every
/// LUN. `aptpl` as [`iscsi_target`]'s, indexed by LU.
fn target_exporting(
    target: &str,
    lus: std::ops::Range<usize>,
    portals: &[&str],
    aptpl: Option<&[Vec<String>]>,
) -> anyhow::Result<Vec<TargetLu>> {
    let tpg = tpg_of(target);
    fs::create_dir_all(&tpg).with_context(|| format!("mkdir {}", tpg.display()))?;
    let first = lus.start;
    let mut made = Vec::new();
    for index in lus {
        let lu = match aptpl {
            None => fileio(index, true)?,
            Some(records) => {
                let lu = fileio_backstore(index, true)?;
                for record in records.get(index).into_iter().flatten() {
                    write_file(lu.backstore.join("pr/res_aptpl_metadata"), record)?;
                }
                lu
            }
        };
        let port = tpg.join(format!("lun/lun_{}", index - first));
        fs::create_dir(&port).with_context(|| format!("mkdir {}", port.display()))?;
        link(&lu.backstore, &port.join(format!("lun{index}")))?;
        made.push(lu);
    }
    for portal in portals {
        fs::create_dir(tpg.join(format!("np/{portal}")))
            .with_context(|| format!("mkdir the iSCSI portal {portal} of {target}"))?;
    }
    write_file(tpg.join("attrib/authentication"), "0")?;
    for node in Node::BOTH {
        let acl = tpg.join("acls").join(iscsi_initiator(node));
        for lun in 0..made.len() {
            let mapped = acl.join(format!("lun_{lun}"));
            fs::create_dir_all(&mapped).with_context(|| format!("mkdir {}", mapped.display()))?;
            link(&tpg.join(format!("lun/lun_{lun}")), &mapped.join("lun"))?;
        }
    }
    write_file(tpg.join("enable"), "1")?;
    Ok(made)
}

/// Waits until there are `count` iSCSI sessions, every one `LOGGED_IN`.
fn sessions_logged_in(count: usize) -> anyhow::Result<()> {
    wait_for(|| {
        let states = session_states();
        (states.len() == count && states.iter().all(|s| s == "LOGGED_IN")).then_some(())
    })
    .with_context(|| {
        format!(
            "the nodes' {count} iSCSI sessions did not all come back: {:?}",
            session_states()
        )
    })
}

/// The state of every iSCSI session (`LOGGED_IN`, `FAILED`, `FREE`).
fn session_states() -> Vec<String> {
    fs::read_dir("/sys/class/iscsi_session")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|s| read_file(s.path().join("state")).ok())
        .map(|s| s.trim().to_owned())
        .collect()
}

/// The registrations LIO saved for the LU with unit serial `serial` (`<dbroot>/pr/aptpl_<serial>`,
/// written when a registration asks for APTPL), one `res_aptpl_metadata` record each: the lines
/// between `PR_REG_START` and `PR_REG_END` joined with commas, as rtslib loads them.
fn aptpl_records(serial: &str) -> anyhow::Result<Vec<String>> {
    let dbroot = read_file(Path::new(TARGET).join("dbroot"))?;
    let file = Path::new(dbroot.trim()).join(format!("pr/aptpl_{serial}"));
    let text = read_file(&file).context("no APTPL file: was a key registered with APTPL?")?;
    let mut records = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.split_whitespace() {
        if line.starts_with("PR_REG_START:") {
            current = Some(Vec::new());
        } else if line.starts_with("PR_REG_END:") {
            records.extend(current.take().map(|fields| fields.join(",")));
        } else if let Some(fields) = current.as_mut() {
            fields.push(line);
        }
    }
    ensure!(
        !records.is_empty(),
        "{} holds no registration",
        file.display()
    );
    Ok(records)
}

/// Creates fileio backstore `lun<index>` with a pure-hex serial (LIO derives the NAA identifier from
/// the serial's hex digits, so they must differ within the first 25).
fn fileio(index: usize, emulate_pr: bool) -> anyhow::Result<TargetLu> {
    let file = backing_file(index);
    fs::File::create(&file)
        .and_then(|f| f.set_len(LUN_BYTES))
        .with_context(|| format!("create {}", file.display()))?;
    fileio_backstore(index, emulate_pr)
}

fn backing_file(index: usize) -> PathBuf {
    PathBuf::from(format!("{BACKING}/lun{index}.img"))
}

/// The backstore of [`fileio`] on its existing backing file.
fn fileio_backstore(index: usize, emulate_pr: bool) -> anyhow::Result<TargetLu> {
    let file = backing_file(index);
    let backstore = PathBuf::from(format!("{TARGET}/core/fileio_0/lun{index}"));
    fs::create_dir_all(&backstore).with_context(|| format!("mkdir {}", backstore.display()))?;
    write_file(
        backstore.join("control"),
        &format!("fd_dev_name={},fd_dev_size={LUN_BYTES}", file.display()),
    )?;
    // before any LUN link: it names the APTPL file and the VPD serial
    let serial = format!("1ab0{index:012x}");
    write_file(backstore.join("wwn/vpd_unit_serial"), &serial)?;
    write_file(backstore.join("enable"), "1")?;
    if !emulate_pr {
        write_file(backstore.join("attrib/emulate_pr"), "0")?;
    }
    Ok(TargetLu {
        index,
        backstore,
        serial,
        wwid: String::new(),
    })
}

fn link(target: &Path, at: &Path) -> anyhow::Result<()> {
    symlink(target, at).with_context(|| format!("ln -s {} {}", target.display(), at.display()))
}

/// The backstore a LUN port links to.
fn linked_backstore(port: &Path) -> anyhow::Result<PathBuf> {
    for entry in fs::read_dir(port).with_context(|| format!("read {}", port.display()))? {
        let path = entry?.path();
        if path.is_symlink() {
            return fs::canonicalize(&path).with_context(|| format!("resolve {}", path.display()));
        }
    }
    bail!("{} links no backstore", port.display())
}

fn unit_serial(backstore: &Path) -> anyhow::Result<String> {
    let text = read_file(backstore.join("wwn/vpd_unit_serial"))?;
    Ok(text
        .trim()
        .trim_start_matches("T10 VPD Unit Serial Number:")
        .trim()
        .to_owned())
}

/// Fills each LU's wwid from node A's disk and checks node B's disk shows the same LU.
fn fill_wwids(lus: &mut [TargetLu], nodes: &[NodeView]) -> anyhow::Result<()> {
    for lu in lus.iter_mut() {
        let mut seen = Vec::new();
        for view in nodes {
            let device = &view.devices[lu.index];
            let name = device
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            seen.push(
                read_file(format!("/sys/class/block/{name}/device/wwid"))?
                    .trim()
                    .to_owned(),
            );
        }
        ensure!(
            seen.windows(2).all(|w| w[0] == w[1]),
            "LU {} has different wwids on the nodes: {seen:?}",
            lu.index
        );
        lu.wwid = seen.swap_remove(0);
    }
    Ok(())
}

/// The /dev path of the disk under a SCSI device's sysfs directory.
fn block_device(scsi_device: &Path) -> anyhow::Result<PathBuf> {
    let name = fs::read_dir(scsi_device.join("block"))?
        .next()
        .context("no block device yet")??
        .file_name();
    let device = Path::new("/dev").join(name);
    ensure!(device.exists(), "{} not created yet", device.display());
    Ok(device)
}

/// The disks of `initiator`'s iSCSI session, in LUN order.
fn iscsi_devices(initiator: &str) -> anyhow::Result<Vec<PathBuf>> {
    session_disks(|session| {
        read_file(session.join("initiatorname")).is_ok_and(|name| name.trim() == initiator)
    })
}

/// The disks of the iSCSI sessions `wanted` accepts (given /sys/class/iscsi_session/sessionN), in
/// LUN order.
fn session_disks(wanted: impl Fn(&Path) -> bool) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for session in fs::read_dir("/sys/class/iscsi_session")? {
        let session = session?.path();
        if !wanted(&session) {
            continue;
        }
        for target in fs::read_dir(session.join("device"))? {
            let target = target?.path();
            if !target
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("target"))
            {
                continue;
            }
            for lun in fs::read_dir(&target)? {
                let lun = lun?.path();
                let name = lun
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let Some(number) = name
                    .rsplit(':')
                    .next()
                    .and_then(|n| n.parse::<usize>().ok())
                else {
                    continue;
                };
                if name.matches(':').count() == 3 {
                    found.push((number, block_device(&lun)?));
                }
            }
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, device)| device).collect())
}

fn wait_for<T>(mut probe: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        ensure!(
            start.elapsed() < SCAN_TIMEOUT,
            "gave up after {}",
            secs(SCAN_TIMEOUT)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes every topology, whoever built it: iSCSI sessions and records, LIO fabric and core
/// objects, scsi_debug, backing files and APTPL files. Guest only.
pub fn teardown_all() -> anyhow::Result<()> {
    ensure!(
        super::guest::inside(),
        "teardown runs only inside the lab guest"
    );
    let mut errors = Vec::new();
    // a hung path left behind would stall the logout below
    if Path::new("/sys/module/nf_tables").exists()
        && run("nft", ["list", "table", "ip", HANG_TABLE]).is_ok_and(|r| r.code() == 0)
        && let Err(e) = release_hang()
    {
        errors.push(e.to_string());
    }
    // and so would a delayed one: the netem qdisc on lo, if a test left it
    if Path::new("/sys/module/sch_netem").exists()
        && run("tc", ["qdisc", "show", "dev", "lo"])
            .is_ok_and(|r| r.code() == 0 && r.stdout.contains("netem"))
        && let Err(e) = release_delay()
    {
        errors.push(e.to_string());
    }
    // multipath maps hold their paths open: remove them before the sessions go
    for entry in fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let name = read_file(entry.path().join("dm/name")).unwrap_or_default();
        let name = name.trim();
        if name.starts_with("lab-") {
            match run("dmsetup", ["remove", "--noudevsync", name]) {
                Ok(r) if r.code() == 0 => {}
                Ok(r) => errors.push(format!("dmsetup remove {name}: {}", r.stderr.trim())),
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    if fs::read_dir("/sys/class/iscsi_session").is_ok_and(|mut d| d.next().is_some()) {
        match run("iscsiadm", ["-m", "node", "--logoutall=all"]) {
            Ok(r) if r.code() == 0 || r.code() == 21 => {}
            Ok(r) => errors.push(format!("iscsiadm logout: {}", r.stderr.trim())),
            Err(e) => errors.push(e.to_string()),
        }
    }
    for db in ISCSI_DBS {
        for dir in ["nodes", "send_targets", "static"] {
            let dir = Path::new(db).join(dir);
            if dir.exists()
                && let Err(e) = fs::remove_dir_all(&dir)
            {
                errors.push(format!("rm -r {}: {e}", dir.display()));
            }
        }
        let ifaces = Node::BOTH.iter().flat_map(|&node| {
            std::iter::once(iface(node)).chain((2..=SESSIONS).map(move |n| session_iface(node, n)))
        });
        for iface in ifaces.chain(EXTRA_IFACES.map(str::to_owned)) {
            let file = Path::new(db).join("ifaces").join(iface);
            if file.exists()
                && let Err(e) = fs::remove_file(&file)
            {
                errors.push(format!("rm {}: {e}", file.display()));
            }
        }
    }
    remove_target(&mut errors);
    if Path::new("/sys/module/scsi_debug").exists() {
        match run("rmmod", ["scsi_debug"]) {
            Ok(r) if r.code() == 0 => {}
            Ok(r) => errors.push(format!("rmmod scsi_debug: {}", r.stderr.trim())),
            Err(e) => errors.push(e.to_string()),
        }
    }
    for dir in [BACKING, "/var/target/pr", "/etc/rtslib-fb-target/pr"] {
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            if let Err(e) = fs::remove_file(entry.path()) {
                errors.push(format!("rm {}: {e}", entry.path().display()));
            }
        }
    }
    // The record `prfence unfence` keeps in fence_pr's default store (/run is a tmpfs: the
    // next topology's nodes start as if just booted).
    match fs::remove_file(CLI_RECORD) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            errors.push(format!("rm {CLI_RECORD}: {e}"))
        }
        _ => {}
    }
    // A running udevd (a systemd guest's) handles the removal of every device above in workers
    // of its own: hundreds of LUs keep them busy past the residue check's wait, so wait for
    // them here (theirs, not the next test's).
    if let Err(e) = crate::udevd::settle_if_running(Duration::from_secs(600)) {
        errors.push(format!("{e:#}"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("{}", errors.join("; "))
    }
}

/// Removes every LIO fabric object and backstore from configfs (the backing files stay).
fn remove_target(errors: &mut Vec<String>) {
    for fabric in ["iscsi", "loopback"] {
        // WWN directories are named iqn.…, naa.…, eui.…; the others are configfs default groups.
        let wwns = subdirs(&Path::new(TARGET).join(fabric));
        for wwn in wwns.iter().filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().contains('.'))
        }) {
            let tpgs = subdirs(wwn);
            for tpg in tpgs.iter().filter(|d| {
                d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("tpgt_"))
            }) {
                remove_tpg(tpg, fabric, errors);
            }
            rmdir(wwn, errors);
        }
    }
    for hba in subdirs(&Path::new(TARGET).join("core")) {
        if hba.file_name().is_some_and(|n| n == "alua") {
            continue;
        }
        for device in subdirs(&hba) {
            rmdir(&device, errors);
        }
        rmdir(&hba, errors);
    }
}

fn remove_tpg(tpg: &Path, fabric: &str, errors: &mut Vec<String>) {
    if fabric == "iscsi" {
        let _ = fs::write(tpg.join("enable"), "0"); // fails harmlessly when already disabled
    }
    for acl in subdirs(&tpg.join("acls")) {
        for mapped in subdirs(&acl) {
            if mapped
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("lun_"))
            {
                unlink_all(&mapped, errors);
                rmdir(&mapped, errors);
            }
        }
        rmdir(&acl, errors);
    }
    for portal in subdirs(&tpg.join("np")) {
        rmdir(&portal, errors);
    }
    for port in subdirs(&tpg.join("lun")) {
        unlink_all(&port, errors);
        rmdir(&port, errors);
    }
    if fabric == "loopback" {
        let _ = fs::write(tpg.join("nexus"), "NULL"); // fails harmlessly without a nexus
    }
    rmdir(tpg, errors);
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect();
    dirs.sort();
    dirs
}

fn unlink_all(dir: &Path, errors: &mut Vec<String>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_symlink()
            && let Err(e) = fs::remove_file(&path)
        {
            errors.push(format!("rm {}: {e}", path.display()));
        }
    }
}

fn rmdir(dir: &Path, errors: &mut Vec<String>) {
    if let Err(e) = fs::remove_dir(dir) {
        errors.push(format!("rmdir {}: {e}", dir.display()));
    }
}
