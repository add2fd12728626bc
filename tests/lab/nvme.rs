//! The NVMe lab: Linux's NVMe target (nvmet, Linux 6.13 or later for reservations) exports file-backed
//! namespaces with reservations enabled (`resv_enable`) over the nvme-loop fabric to three hosts,
//! each its own host NQN and host ID and so its own controller: nodes A and B, and an observer O
//! that never registers. The Reservation Report that O reads (nvme-cli, extended data structure:
//! keys with 128-bit host IDs) is the target's state and the oracle; a node's O_DIRECT write tells
//! accepted from refused.
//!
//! Native NVMe multipath is off (`nvme_core multipath=N`). With it on, the kernel joins every
//! controller of one subsystem under one namespace head (`/dev/nvmeXnY`), so the nodes that share
//! this guest kernel would share a device node; with it off each controller gets its own, which is
//! what separate nodes have. (Multipath between two controllers of ONE node is the native-multipath
//! case a real node runs; nvmet registers by host ID, so both paths of a node are one registrant.)
//! Namespace device names say nothing about the namespace: `nvme0n1` may be nsid 2. Namespaces are
//! matched by their UUID, which nvmet generates and every host reads from sysfs.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use serde_json::Value;

use super::{Node, WriteOutcome, write_to};

const NVMET: &str = "/sys/kernel/config/nvmet";
const SUBSYSTEM: &str = "nqn.2026-12.org.prfence.lab:shared";
const PORT: &str = "1";
/// Backing files live on the guest's fresh tmpfs, beside LIO's (the lab's teardown empties it).
const BACKING_DIR: &str = "/run/lab";
const NAMESPACE_BYTES: u64 = 16 << 20;

/// Who connects to the subsystem: the two nodes under test and the observer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvmeHost {
    Node(Node),
    Observer,
}

impl NvmeHost {
    pub const ALL: [NvmeHost; 3] = [
        NvmeHost::Node(Node::A),
        NvmeHost::Node(Node::B),
        NvmeHost::Observer,
    ];

    fn tag(self) -> &'static str {
        match self {
            NvmeHost::Node(Node::A) => "node-a",
            NvmeHost::Node(Node::B) => "node-b",
            NvmeHost::Observer => "observer",
        }
    }

    pub fn nqn(self) -> String {
        format!("nqn.2026-12.org.prfence.lab:{}", self.tag())
    }

    /// The 128-bit host ID nvmet registers a host's reservations by.
    pub fn host_id(self) -> &'static str {
        match self {
            NvmeHost::Node(Node::A) => "0a0a0a0a-0000-4000-8000-00000000000a",
            NvmeHost::Node(Node::B) => "0b0b0b0b-0000-4000-8000-00000000000b",
            NvmeHost::Observer => "0c0c0c0c-0000-4000-8000-00000000000c",
        }
    }

    /// The host ID as nvme-cli prints it in a report (hex digits, no dashes).
    fn host_id_hex(self) -> String {
        self.host_id().replace('-', "")
    }
}

/// One namespace of the shared subsystem.
#[derive(Debug, Clone)]
pub struct NvmetNamespace {
    pub nsid: u32,
    /// nvmet's UUID for it, as sysfs shows it (`uuid.<this>` is its wwid).
    pub uuid: String,
    backing: PathBuf,
}

/// One registrant in a Reservation Report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmetRegistrant {
    pub key: u64,
    /// The registering host, if it is one of the lab's.
    pub host: Option<NvmeHost>,
    /// RCSTS bit 0: holds the reservation (every registrant under an all-registrants type).
    pub holder: bool,
}

/// A namespace's reservation state as the target reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmetReport {
    pub generation: u32,
    /// NVMe reservation type (1 WE, 2 EA, 3 WE-RO, 4 EA-RO, 5 WE-AR, 6 EA-AR), 0 for none.
    pub rtype: u8,
    pub registrants: Vec<NvmetRegistrant>,
}

impl NvmetReport {
    pub fn keys(&self) -> Vec<u64> {
        let mut keys: Vec<u64> = self.registrants.iter().map(|r| r.key).collect();
        keys.sort_unstable();
        keys
    }

    /// The lab host that holds the reservation (the first, under an all-registrants type).
    pub fn holder(&self) -> Option<NvmeHost> {
        self.registrants
            .iter()
            .find(|r| r.holder)
            .and_then(|r| r.host)
    }

    /// Whether `host` has a registration.
    pub fn registers(&self, host: NvmeHost) -> bool {
        self.registrants.iter().any(|r| r.host == Some(host))
    }
}

/// The subsystem, its namespaces and the three hosts' controllers; dropping it tears it all down.
pub struct NvmeTopology {
    namespaces: Vec<NvmetNamespace>,
    /// Per host (in [`NvmeHost::ALL`] order): the controller name (`nvme3`) and, per namespace index,
    /// the block device.
    controllers: Vec<(NvmeHost, String, Vec<PathBuf>)>,
}

impl NvmeTopology {
    /// `count` namespaces with reservations enabled, connected by A, B and the observer.
    pub fn new(count: usize) -> anyhow::Result<Self> {
        load_modules()?;
        let mut topology = NvmeTopology {
            namespaces: Vec::new(),
            controllers: Vec::new(),
        };
        // Teardown runs on every error below (Drop), so a failed setup leaves nothing behind.
        topology.build(count)?;
        Ok(topology)
    }

    fn build(&mut self, count: usize) -> anyhow::Result<()> {
        fs::create_dir_all(BACKING_DIR)?;
        let subsystem = Path::new(NVMET).join("subsystems").join(SUBSYSTEM);
        mkdir(&subsystem)?;
        write_attr(&subsystem.join("attr_allow_any_host"), "0")?;
        for index in 0..count {
            let nsid = u32::try_from(index + 1)?;
            let backing = Path::new(BACKING_DIR).join(format!("nvme-ns{nsid}.img"));
            fs::File::create(&backing)?.set_len(NAMESPACE_BYTES)?;
            let ns = subsystem.join("namespaces").join(nsid.to_string());
            mkdir(&ns)?;
            write_attr(&ns.join("device_path"), &backing.display().to_string())?;
            // tmpfs: the page cache is the medium; O_DIRECT on the host side still reaches nvmet
            write_attr(&ns.join("buffered_io"), "1")?;
            write_attr(&ns.join("resv_enable"), "1")?;
            write_attr(&ns.join("enable"), "1")?;
            let uuid = fs::read_to_string(ns.join("device_uuid"))?
                .trim()
                .to_owned();
            self.namespaces.push(NvmetNamespace {
                nsid,
                uuid,
                backing,
            });
        }
        for host in NvmeHost::ALL {
            let dir = Path::new(NVMET).join("hosts").join(host.nqn());
            mkdir(&dir)?;
            symlink(&dir, &subsystem.join("allowed_hosts").join(host.nqn()))?;
        }
        let port = Path::new(NVMET).join("ports").join(PORT);
        mkdir(&port)?;
        write_attr(&port.join("addr_trtype"), "loop")?;
        symlink(&subsystem, &port.join("subsystems").join(SUBSYSTEM))?;
        for host in NvmeHost::ALL {
            let controller = connect(host)?;
            self.controllers.push((host, controller, Vec::new()));
            let devices = self.wait_for_namespaces(host)?;
            if let Some(last) = self.controllers.last_mut() {
                last.2 = devices;
            }
        }
        Ok(())
    }

    /// The block devices of `host`'s controller, one per namespace (by UUID), once all appeared.
    fn wait_for_namespaces(&self, host: NvmeHost) -> anyhow::Result<Vec<PathBuf>> {
        let (_, controller, _) = self
            .controllers
            .iter()
            .find(|(h, _, _)| *h == host)
            .context("controller not connected")?;
        self.wait_for_devices(controller)
            .with_context(|| host.tag().to_owned())
    }

    /// The block devices of `controller`, one per namespace (by UUID), once all appeared.
    fn wait_for_devices(&self, controller: &str) -> anyhow::Result<Vec<PathBuf>> {
        let class = Path::new("/sys/class/nvme").join(controller);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut by_uuid = Vec::new();
            for entry in fs::read_dir(&class)?.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !name.starts_with(&format!("{controller}n")) {
                    continue;
                }
                if let Ok(uuid) = fs::read_to_string(entry.path().join("uuid")) {
                    by_uuid.push((uuid.trim().to_owned(), PathBuf::from("/dev").join(&name)));
                }
            }
            let devices: Option<Vec<PathBuf>> = self
                .namespaces
                .iter()
                .map(|ns| {
                    by_uuid
                        .iter()
                        .find(|(u, dev)| *u == ns.uuid && dev.exists())
                        .map(|(_, dev)| dev.clone())
                })
                .collect();
            if let Some(devices) = devices {
                return Ok(devices);
            }
            ensure!(
                Instant::now() < deadline,
                "{controller} shows namespaces {by_uuid:?}, not all of {:?} after 20 s",
                self.namespaces.iter().map(|n| &n.uuid).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn namespaces(&self) -> &[NvmetNamespace] {
        &self.namespaces
    }

    /// `host`'s block device for namespace `index`.
    pub fn device(&self, host: NvmeHost, index: usize) -> &Path {
        self.devices(host)
            .get(index)
            .map_or(Path::new("/dev/null"), PathBuf::as_path)
    }

    /// `host`'s block devices, in namespace order.
    pub fn devices(&self, host: NvmeHost) -> &[PathBuf] {
        self.controllers
            .iter()
            .find(|(h, _, _)| *h == host)
            .map_or(&[], |(_, _, devices)| devices.as_slice())
    }

    /// `node`'s devices as arguments.
    pub fn node_args(&self, node: Node) -> Vec<String> {
        self.devices(NvmeHost::Node(node))
            .iter()
            .map(|d| d.display().to_string())
            .collect()
    }

    /// Namespace `index`'s reservation state, read by the observer (nvme-cli, extended report).
    pub fn report(&self, index: usize) -> anyhow::Result<NvmetReport> {
        let ns = self.namespaces.get(index).context("no such namespace")?;
        let device = self.device(NvmeHost::Observer, index);
        let run = super::run(
            "nvme",
            [
                "resv-report".to_owned(),
                device.display().to_string(),
                "--namespace-id".to_owned(),
                ns.nsid.to_string(),
                "--eds".to_owned(),
                "--output-format=json".to_owned(),
            ],
        )?
        .ok()?;
        parse_report(&run.stdout)
            .with_context(|| format!("nvme resv-report of namespace {}: {}", ns.nsid, run.stdout))
    }

    /// Every namespace's report, in order.
    pub fn reports(&self) -> anyhow::Result<Vec<NvmetReport>> {
        (0..self.namespaces.len()).map(|i| self.report(i)).collect()
    }

    /// `node`'s O_DIRECT write of a tagged block to namespace `index`.
    pub fn write_probe(&self, node: Node, index: usize, block: u64) -> WriteOutcome {
        let text = format!("node {} probe", node.letter());
        write_to(
            self.device(NvmeHost::Node(node), index),
            block,
            text.as_bytes(),
        )
    }
}

/// NVMe/TCP on loopback for [`NvmeTopology::connect_tcp`]: nvmet's port id, address, service.
const TCP_PORT: &str = "2";
const TCP_ADDRESS: &str = "127.0.0.1";
const TCP_SERVICE: u16 = 4420;
/// The nftables table of [`TcpController::hang`].
const TCP_HANG_TABLE: &str = "lab_nvme_hang";

impl NvmeTopology {
    /// A second controller for `host`, over NVMe/TCP on loopback (the same host NQN and host ID,
    /// so the same registrant to the target), whose packets can be dropped: nvme-loop cannot
    /// hang, a TCP connection can. Drop it before the topology.
    pub fn connect_tcp(&self, host: NvmeHost) -> anyhow::Result<TcpController> {
        for module in ["nvmet_tcp", "nvme_tcp", "nf_tables"] {
            super::run("modprobe", [module])?.ok()?;
        }
        let port = Path::new(NVMET).join("ports").join(TCP_PORT);
        mkdir(&port)?;
        let mut controller = TcpController {
            port: port.clone(),
            name: None,
            devices: Vec::new(),
        };
        write_attr(&port.join("addr_trtype"), "tcp")?;
        write_attr(&port.join("addr_adrfam"), "ipv4")?;
        write_attr(&port.join("addr_traddr"), TCP_ADDRESS)?;
        write_attr(&port.join("addr_trsvcid"), &TCP_SERVICE.to_string())?;
        let subsystem = Path::new(NVMET).join("subsystems").join(SUBSYSTEM);
        symlink(&subsystem, &port.join("subsystems").join(SUBSYSTEM))?;
        let name = connect_with(&format!(
            "transport=tcp,traddr={TCP_ADDRESS},trsvcid={TCP_SERVICE},nqn={SUBSYSTEM},\
             hostnqn={},hostid={}",
            host.nqn(),
            host.host_id()
        ))?;
        controller.name = Some(name.clone());
        controller.devices = self.wait_for_devices(&name)?;
        Ok(controller)
    }
}

/// A TCP controller of one host's; dropping it releases a hang, deletes the controller and the
/// port.
pub struct TcpController {
    port: PathBuf,
    name: Option<String>,
    devices: Vec<PathBuf>,
}

impl TcpController {
    /// Its block devices, in namespace order.
    pub fn devices(&self) -> &[PathBuf] {
        &self.devices
    }

    /// Drops every packet to and from the TCP port (nftables, input hook, so sends do not fail
    /// with EPERM): commands on this controller get no answer, until [`release_hang`].
    pub fn hang(&self) -> anyhow::Result<()> {
        let rules = format!(
            "add table ip {TCP_HANG_TABLE}\n\
             add chain ip {TCP_HANG_TABLE} input {{ type filter hook input priority 0; }}\n\
             add rule ip {TCP_HANG_TABLE} input tcp dport {TCP_SERVICE} drop\n\
             add rule ip {TCP_HANG_TABLE} input tcp sport {TCP_SERVICE} drop\n"
        );
        let script = Path::new(BACKING_DIR).join("nvme-hang.nft");
        fs::write(&script, rules)?;
        super::run("nft", ["-f", &script.display().to_string()])?.ok()?;
        Ok(())
    }
}

/// Lets the TCP port's packets through again.
pub fn release_hang() {
    let _ = super::run("nft", ["delete", "table", "ip", TCP_HANG_TABLE]);
}

impl Drop for TcpController {
    fn drop(&mut self) {
        release_hang();
        if let Some(name) = &self.name {
            let _ = fs::write(
                Path::new("/sys/class/nvme")
                    .join(name)
                    .join("delete_controller"),
                "1",
            );
        }
        let _ = fs::remove_file(self.port.join("subsystems").join(SUBSYSTEM));
        let _ = fs::remove_dir(&self.port);
    }
}

impl Drop for NvmeTopology {
    fn drop(&mut self) {
        for (_, controller, _) in &self.controllers {
            let _ = fs::write(
                Path::new("/sys/class/nvme")
                    .join(controller)
                    .join("delete_controller"),
                "1",
            );
        }
        let subsystem = Path::new(NVMET).join("subsystems").join(SUBSYSTEM);
        let port = Path::new(NVMET).join("ports").join(PORT);
        let _ = fs::remove_file(port.join("subsystems").join(SUBSYSTEM));
        let _ = fs::remove_dir(&port);
        for host in NvmeHost::ALL {
            let _ = fs::remove_file(subsystem.join("allowed_hosts").join(host.nqn()));
            let _ = fs::remove_dir(Path::new(NVMET).join("hosts").join(host.nqn()));
        }
        for ns in &self.namespaces {
            let dir = subsystem.join("namespaces").join(ns.nsid.to_string());
            let _ = fs::write(dir.join("enable"), "0");
            let _ = fs::remove_dir(&dir);
            let _ = fs::remove_file(&ns.backing);
        }
        let _ = fs::remove_dir(&subsystem);
    }
}

/// nvme_core without native multipath (see the module doc), then the target and its loop fabric.
fn load_modules() -> anyhow::Result<()> {
    let multipath = Path::new("/sys/module/nvme_core/parameters/multipath");
    if !multipath.exists() {
        super::run("modprobe", ["nvme_core", "multipath=N"])?.ok()?;
    }
    let value = fs::read_to_string(multipath).context("nvme_core's multipath parameter")?;
    ensure!(
        value.trim() == "N",
        "nvme_core was loaded with native multipath on ({}): the lab's nodes would share one \
         namespace head",
        value.trim()
    );
    for module in ["nvmet", "nvme_loop"] {
        super::run("modprobe", [module])?.ok()?;
    }
    ensure!(
        Path::new(NVMET).is_dir(),
        "{NVMET} is missing after modprobe nvmet (configfs not mounted?)"
    );
    Ok(())
}

/// Connects `host` over nvme-loop by writing its options to /dev/nvme-fabrics (what `nvme
/// connect` does; nvme-cli 2.3 refuses a second host NQN to the same subsystem as "already
/// connected"). The kernel answers the read with `instance=N,cntlid=M`.
fn connect(host: NvmeHost) -> anyhow::Result<String> {
    connect_with(&format!(
        "transport=loop,nqn={SUBSYSTEM},hostnqn={},hostid={}",
        host.nqn(),
        host.host_id()
    ))
}

/// Writes `options` to /dev/nvme-fabrics; returns the new controller's name.
fn connect_with(options: &str) -> anyhow::Result<String> {
    let mut fabrics = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/nvme-fabrics")
        .context("open /dev/nvme-fabrics")?;
    fabrics
        .write_all(options.as_bytes())
        .with_context(|| format!("connecting {options}"))?;
    let mut answer = String::new();
    fabrics.read_to_string(&mut answer)?;
    let instance = answer
        .split(',')
        .find_map(|f| f.trim().strip_prefix("instance="))
        .with_context(|| format!("/dev/nvme-fabrics answered {answer:?}"))?;
    Ok(format!("nvme{instance}"))
}

/// nvme-cli's `resv-report --eds -o json`.
fn parse_report(text: &str) -> anyhow::Result<NvmetReport> {
    let json: Value = serde_json::from_str(text.trim())?;
    let number = |v: &Value, what: &str| v[what].as_u64().with_context(|| format!("no {what}"));
    let mut registrants = Vec::new();
    for entry in json["regctlext"].as_array().into_iter().flatten() {
        let host_id = entry["hostid"].as_str().unwrap_or_default().to_lowercase();
        registrants.push(NvmetRegistrant {
            key: number(entry, "rkey")?,
            host: NvmeHost::ALL
                .into_iter()
                .find(|h| h.host_id_hex() == host_id),
            holder: number(entry, "rcsts")? & 1 == 1,
        });
    }
    let regctl = number(&json, "regctl")?;
    if usize::try_from(regctl)? != registrants.len() {
        bail!("regctl {regctl} but {} descriptors", registrants.len());
    }
    Ok(NvmetReport {
        generation: u32::try_from(number(&json, "gen")?)?,
        rtype: u8::try_from(number(&json, "rtype")?)?,
        registrants,
    })
}

fn mkdir(dir: &Path) -> anyhow::Result<()> {
    fs::create_dir(dir).with_context(|| format!("mkdir {}", dir.display()))
}

fn symlink(target: &Path, link: &Path) -> anyhow::Result<()> {
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("ln -s {} {}", target.display(), link.display()))
}

fn write_attr(path: &Path, value: &str) -> anyhow::Result<()> {
    fs::write(path, value).with_context(|| format!("echo {value} > {}", path.display()))
}

const TRACING: &str = "/sys/kernel/tracing";

/// Counts the Reservation commands nvmet takes in, per namespace, from the target's own trace
/// event (`nvmet:nvmet_req_init`, one per command it receives, retries included): the NVMe twin
/// of LIO's `num_cmds`. Dropping it turns the event off, empties the buffer and unmounts tracefs
/// if it mounted it.
pub struct ReservationCounter {
    mounted: bool,
}

impl ReservationCounter {
    pub fn start() -> anyhow::Result<Self> {
        let tracing = Path::new(TRACING);
        let mounted = !crate::is_mount(TRACING);
        if mounted {
            crate::run("mount", ["-t", "tracefs", "nodev", TRACING])?.ok()?;
        }
        let counter = ReservationCounter { mounted };
        let event = tracing.join("events/nvmet/nvmet_req_init/enable");
        ensure!(
            event.exists(),
            "{} is missing: this kernel cannot count nvmet's commands",
            event.display()
        );
        fs::write(tracing.join("trace"), "")?;
        fs::write(&event, "1")?;
        Ok(counter)
    }

    /// Reservation commands per nsid since the last call (or the start), by command
    /// (`register`, `report`, `acquire`, `release`); empties the buffer. An overrun buffer (fewer
    /// entries kept than written) is an error, not a low count.
    pub fn take(&self) -> anyhow::Result<BTreeMap<u32, BTreeMap<String, u64>>> {
        let trace = Path::new(TRACING).join("trace");
        let text = fs::read_to_string(&trace)?;
        fs::write(&trace, "")?;
        if let Some(header) = text
            .lines()
            .find_map(|l| l.strip_prefix("# entries-in-buffer/entries-written: "))
        {
            let (kept, written) = header
                .split_whitespace()
                .next()
                .and_then(|n| n.split_once('/'))
                .with_context(|| format!("trace header {header:?}"))?;
            ensure!(kept == written, "the trace buffer lost entries: {header}");
        }
        let mut counts: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
        for line in text.lines() {
            let Some((_, command)) = line.split_once("cmd=(nvme_cmd_resv_") else {
                continue;
            };
            let command: String = command
                .chars()
                .take_while(char::is_ascii_alphabetic)
                .collect();
            let nsid: u32 = line
                .split_once("nsid=")
                .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("no nsid in the trace line {line:?}"))?;
            *counts.entry(nsid).or_default().entry(command).or_insert(0) += 1;
        }
        Ok(counts)
    }
}

impl Drop for ReservationCounter {
    fn drop(&mut self) {
        let tracing = Path::new(TRACING);
        let _ = fs::write(tracing.join("events/nvmet/nvmet_req_init/enable"), "0");
        let _ = fs::write(tracing.join("trace"), "");
        if self.mounted {
            let _ = crate::run("umount", [TRACING]);
        }
    }
}
