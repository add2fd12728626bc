//! Discovery on fake sysfs and /dev trees shaped like the lab guest's (Linux 6.1, LIO over
//! iSCSI on 127.0.0.1, ifaces `nodea` and `nodea2` logged in with IQN …:nodea, `nodeb` with
//! …:nodeb, two LUNs; a dm-multipath map made with `dmsetup create` over nodea's two paths to
//! LUN 0). Captured there:
//!
//! ```text
//! /sys/block/sda -> ../devices/platform/host1/session2/target1:0:0/1:0:0:0/block/sda
//! /sys/block/sdc -> ../devices/platform/host2/session3/target2:0:0/2:0:0:0/block/sdc
//! /sys/block/sda/device -> ../../../1:0:0:0   (wwid, state, vpd_pg80, vpd_pg83, scsi_device/,
//!                                             scsi_generic/sg0, generic -> scsi_generic/sg0)
//! sda wwid=naa.6001405ab00000000000000000000000 state=running  (sdc: the same wwid)
//! /sys/class/scsi_generic/sg0 -> ../../devices/platform/host1/session2/target1:0:0/1:0:0:0/scsi_generic/sg0
//! /sys/class/scsi_generic/sg0/device -> ../../../1:0:0:0
//! /sys/class/iscsi_session/session2 -> ../../devices/platform/host1/session2/iscsi_session/session2
//!   initiatorname=iqn.2026-11.lab:nodea targetname=iqn.2026-11.lab:target ifacename=nodea2
//!   tpgt=1 state=LOGGED_IN; no `isid` attribute
//! /sys/block/dm-0 -> ../devices/virtual/block/dm-0
//!   dm/uuid=mpath-36001405ab00000000000000000000000 dm/name=mpath-test
//!   slaves/sda -> ../../../../platform/host1/session2/target1:0:0/1:0:0:0/block/sda
//!   slaves/sdc -> ../../../../platform/host2/session3/target2:0:0/2:0:0:0/block/sdc
//! /sys/block/sda/holders/dm-0 -> ../../../../../../../../virtual/block/dm-0
//! /dev/dm-0 (no udev: no /dev/mapper link; multipath-tools found no paths without udev)
//! ```
//!
//! Partitions are not from the capture (the guest had no partitioning tool on its PATH); their
//! layout is the kernel's usual one: `…/block/sdb/sdb1/partition`, `/sys/class/block/sdb1 ->
//! ../../devices/…/block/sdb/sdb1`.

use super::vpd::tests::{LIO_PG80, LIO_PG83};
use super::*;
use std::fs;
use std::os::unix::fs::symlink;

const LUN0: &str = "naa.6001405ab00000000000000000000000";
const LUN1: &str = "naa.6001405ab10000000000000000000000";

struct Tree {
    root: tempfile::TempDir,
}

impl Tree {
    fn new() -> Self {
        let t = Self {
            root: tempfile::tempdir().unwrap(),
        };
        for d in [
            "sys/block",
            "sys/class/block",
            "sys/class/scsi_generic",
            "sys/class/iscsi_session",
            "sys/devices/virtual/block",
            "dev/mapper",
            "dev/disk/by-id",
        ] {
            fs::create_dir_all(t.root.path().join(d)).unwrap();
        }
        t
    }

    fn sys(&self) -> PathBuf {
        self.root.path().join("sys")
    }

    fn dev(&self, name: &str) -> PathBuf {
        self.root.path().join("dev").join(name)
    }

    fn discovery(&self) -> Discovery {
        Discovery::new(self.sys(), self.root.path().join("dev"))
    }

    fn write(&self, rel: &str, contents: impl AsRef<[u8]>) {
        let p = self.sys().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, contents).unwrap();
    }

    fn session(&self, host: u32, session: u32, initiator: &str, iface: &str) {
        let rel =
            format!("devices/platform/host{host}/session{session}/iscsi_session/session{session}");
        self.write(&format!("{rel}/targetname"), "iqn.2026-11.lab:target\n");
        self.write(&format!("{rel}/initiatorname"), format!("{initiator}\n"));
        self.write(&format!("{rel}/ifacename"), format!("{iface}\n"));
        self.write(&format!("{rel}/tpgt"), "1\n");
        self.write(&format!("{rel}/state"), "LOGGED_IN\n");
        symlink(
            format!("../../{rel}"),
            self.sys()
                .join(format!("class/iscsi_session/session{session}")),
        )
        .unwrap();
    }

    /// A SCSI disk `sd` (with generic `sg`) at host:0:0:lun under `sessionN`. `wwid: None` leaves
    /// the attribute out (pre-4.5 kernels); `pg83: None` leaves the VPD page out too.
    #[allow(clippy::too_many_arguments)]
    fn disk(
        &self,
        host: u32,
        session: u32,
        lun: u32,
        sd: &str,
        sg: &str,
        wwid: Option<&str>,
        pg83: Option<&[u8]>,
        state: &str,
    ) {
        let scsi = format!(
            "devices/platform/host{host}/session{session}/target{host}:0:0/{host}:0:0:{lun}"
        );
        if let Some(w) = wwid {
            self.write(&format!("{scsi}/wwid"), format!("{w}\n"));
        }
        if let Some(p) = pg83 {
            self.write(&format!("{scsi}/vpd_pg83"), p);
        }
        self.write(&format!("{scsi}/vpd_pg80"), LIO_PG80);
        self.write(&format!("{scsi}/state"), format!("{state}\n"));
        fs::create_dir_all(
            self.sys()
                .join(format!("{scsi}/scsi_device/{host}:0:0:{lun}")),
        )
        .unwrap();
        self.write(&format!("{scsi}/block/{sd}/dev"), "8:0\n");
        symlink(
            format!("../../../{host}:0:0:{lun}"),
            self.sys().join(format!("{scsi}/block/{sd}/device")),
        )
        .unwrap();
        symlink(
            format!("../{scsi}/block/{sd}"),
            self.sys().join("block").join(sd),
        )
        .unwrap();
        symlink(
            format!("../../{scsi}/block/{sd}"),
            self.sys().join("class/block").join(sd),
        )
        .unwrap();
        self.write(&format!("{scsi}/scsi_generic/{sg}/dev"), "21:0\n");
        symlink(
            format!("../../../{host}:0:0:{lun}"),
            self.sys().join(format!("{scsi}/scsi_generic/{sg}/device")),
        )
        .unwrap();
        symlink(
            format!("../../{scsi}/scsi_generic/{sg}"),
            self.sys().join("class/scsi_generic").join(sg),
        )
        .unwrap();
        fs::write(self.dev(sd), "").unwrap();
        fs::write(self.dev(sg), "").unwrap();
    }

    /// The lab's topology: sessions 1 (nodeb, host0), 2 (nodea via iface nodea2, host1) and
    /// 3 (nodea, host2), each with LUN 0 and LUN 1.
    fn lab() -> Self {
        let t = Self::new();
        t.session(0, 1, "iqn.2026-11.lab:nodeb", "nodeb");
        t.session(1, 2, "iqn.2026-11.lab:nodea", "nodea2");
        t.session(2, 3, "iqn.2026-11.lab:nodea", "nodea");
        for (host, session, lun, sd, sg) in [
            (0, 1, 0, "sdb", "sg1"),
            (0, 1, 1, "sdf", "sg5"),
            (1, 2, 0, "sda", "sg0"),
            (1, 2, 1, "sde", "sg4"),
            (2, 3, 0, "sdc", "sg2"),
            (2, 3, 1, "sdd", "sg3"),
        ] {
            let wwid = if lun == 0 { LUN0 } else { LUN1 };
            t.disk(
                host,
                session,
                lun,
                sd,
                sg,
                Some(wwid),
                Some(LIO_PG83),
                "running",
            );
        }
        // LUN 1's serial is "lab-lun1" (the NAA is built from its hex digits).
        for scsi in [
            "host0/session1/target0:0:0/0:0:0:1",
            "host1/session2/target1:0:0/1:0:0:1",
            "host2/session3/target2:0:0/2:0:0:1",
        ] {
            t.write(
                &format!("devices/platform/{scsi}/vpd_pg80"),
                b"\x00\x80\x00\x09lab-lun1\x00",
            );
        }
        t
    }

    fn dm(&self, n: u32, name: &str, uuid: &str, slaves: &[&str]) {
        let rel = format!("devices/virtual/block/dm-{n}");
        self.write(&format!("{rel}/dm/uuid"), format!("{uuid}\n"));
        self.write(&format!("{rel}/dm/name"), format!("{name}\n"));
        fs::create_dir_all(self.sys().join(format!("{rel}/slaves"))).unwrap();
        for s in slaves {
            let target = fs::read_link(self.sys().join("block").join(s)).unwrap();
            // ../devices/X  ->  ../../../../X, as the kernel's slaves links are.
            let below_devices = target.strip_prefix("../devices").unwrap();
            symlink(
                Path::new("../../../..").join(below_devices),
                self.sys().join(format!("{rel}/slaves/{s}")),
            )
            .unwrap();
        }
        symlink(
            format!("../{rel}"),
            self.sys().join(format!("block/dm-{n}")),
        )
        .unwrap();
        symlink(
            format!("../../{rel}"),
            self.sys().join(format!("class/block/dm-{n}")),
        )
        .unwrap();
        fs::write(self.dev(&format!("dm-{n}")), "").unwrap();
        symlink(format!("../dm-{n}"), self.dev(&format!("mapper/{name}"))).unwrap();
    }

    /// An NVMe-oF controller `nvmeC` (state `state`) with namespace `nvmeCnN` without native
    /// multipath, as a fabrics host shows it:
    /// `/sys/class/block/nvme1n1 -> ../../devices/virtual/nvme-fabrics/ctl/nvme1/nvme1n1`,
    /// `nvme1n1/device -> ../../nvme1`, `ctl/nvme1/state`.
    fn nvme_ns(&self, ctrl: u32, ns: u32, ids: &[(&str, &str)], state: &str) {
        let ctl = format!("devices/virtual/nvme-fabrics/ctl/nvme{ctrl}");
        self.write(&format!("{ctl}/state"), format!("{state}\n"));
        let name = format!("nvme{ctrl}n{ns}");
        self.nvme_ns_attrs(&format!("{ctl}/{name}"), ns, ids);
        symlink(
            format!("../../nvme{ctrl}"),
            self.sys().join(format!("{ctl}/{name}/device")),
        )
        .unwrap();
        symlink(
            format!("../../{ctl}/{name}"),
            self.sys().join("class/block").join(&name),
        )
        .unwrap();
        symlink(
            format!("../{ctl}/{name}"),
            self.sys().join("block").join(&name),
        )
        .unwrap();
        fs::write(self.dev(&name), "").unwrap();
    }

    fn nvme_ns_attrs(&self, dir: &str, ns: u32, ids: &[(&str, &str)]) {
        self.write(&format!("{dir}/nsid"), format!("{ns}\n"));
        for (attr, value) in ids {
            self.write(&format!("{dir}/{attr}"), format!("{value}\n"));
        }
    }

    /// A native-multipath head `nvme<subsys>n<ns>` over controllers `(ctrl, state)`: the head
    /// under `nvme-subsystem/nvme-subsys<subsys>` with `multipath/` links to the hidden
    /// per-controller disks `nvme<subsys>c<ctrl>n<ns>`, which have no /dev node.
    fn nvme_head(&self, subsys: u32, ns: u32, wwid: &str, ctrls: &[(u32, &str)]) {
        let sub = format!("devices/virtual/nvme-subsystem/nvme-subsys{subsys}");
        let head = format!("nvme{subsys}n{ns}");
        self.nvme_ns_attrs(&format!("{sub}/{head}"), ns, &[("wwid", wwid)]);
        symlink(
            format!("../../nvme-subsys{subsys}"),
            self.sys().join(format!("{sub}/{head}/device")),
        )
        .unwrap();
        fs::create_dir_all(self.sys().join(format!("{sub}/{head}/multipath"))).unwrap();
        for (ctrl, state) in ctrls {
            let ctl = format!("devices/virtual/nvme-fabrics/ctl/nvme{ctrl}");
            let path = format!("nvme{subsys}c{ctrl}n{ns}");
            self.write(&format!("{ctl}/state"), format!("{state}\n"));
            self.nvme_ns_attrs(&format!("{ctl}/{path}"), ns, &[("wwid", wwid)]);
            symlink(
                format!("../../nvme{ctrl}"),
                self.sys().join(format!("{ctl}/{path}/device")),
            )
            .unwrap();
            symlink(
                format!("../../../../nvme-fabrics/ctl/nvme{ctrl}/{path}"),
                self.sys().join(format!("{sub}/{head}/multipath/{path}")),
            )
            .unwrap();
            symlink(
                format!("../../{ctl}/{path}"),
                self.sys().join("class/block").join(&path),
            )
            .unwrap();
        }
        symlink(
            format!("../../{sub}/{head}"),
            self.sys().join("class/block").join(&head),
        )
        .unwrap();
        symlink(
            format!("../{sub}/{head}"),
            self.sys().join("block").join(&head),
        )
        .unwrap();
        fs::write(self.dev(&head), "").unwrap();
    }

    fn partition(&self, disk: &str, part: &str) {
        let whole = fs::read_link(self.sys().join("block").join(disk)).unwrap();
        let whole = whole.strip_prefix("..").unwrap();
        self.write(&format!("{}/{part}/partition", whole.display()), "1\n");
        symlink(
            Path::new("../..").join(whole).join(part),
            self.sys().join("class/block").join(part),
        )
        .unwrap();
        fs::write(self.dev(part), "").unwrap();
    }
}

fn names(lu: &Lu) -> Vec<&str> {
    lu.paths.iter().map(|p| p.name.as_str()).collect()
}

fn errors(result: Result<Vec<Lu>, DiscoverError>) -> Vec<DeviceError> {
    match result {
        Err(DiscoverError::Devices(e)) => e,
        other => panic!("expected device errors, got {other:?}"),
    }
}

#[test]
fn one_node_two_luns_sorted_by_id() {
    let t = Tree::lab();
    // Given LUN 1 first: the output is still ordered by id, LUN 0 (the arbiter) first.
    let lus = t
        .discovery()
        .resolve(&[t.dev("sdf"), t.dev("sdb")])
        .unwrap();
    assert_eq!(lus.len(), 2);
    assert_eq!(lus[0].id.as_str(), LUN0);
    assert_eq!(lus[1].id.as_str(), LUN1);
    let p = &lus[0].paths[0];
    assert_eq!(p.dev, t.dev("sdb"));
    assert_eq!(p.given, t.dev("sdb"));
    // the disk's sg node, through which a command can be abandoned
    assert_eq!(p.generic, Some(t.dev("sg1")));
    assert_eq!(p.hctl, "0:0:0:0");
    assert!(p.is_live());
    assert_eq!(
        p.transport,
        Some(IscsiSession {
            session: "session1".into(),
            target: "iqn.2026-11.lab:target".into(),
            initiator: "iqn.2026-11.lab:nodeb".into(),
            iface: Some("nodeb".into()),
            tpgt: Some(1),
            isid: None,
        })
    );
}

#[test]
fn two_sessions_of_one_node_group_into_one_lu() {
    let t = Tree::lab();
    let lus = t
        .discovery()
        .resolve(&[t.dev("sdc"), t.dev("sda"), t.dev("sdd"), t.dev("sde")])
        .unwrap();
    assert_eq!(lus.len(), 2);
    assert_eq!(names(&lus[0]), ["sdc", "sda"]);
    assert_eq!(names(&lus[1]), ["sdd", "sde"]);
    let ifaces: Vec<_> = lus[0]
        .paths
        .iter()
        .map(|p| p.transport.as_ref().unwrap().iface.clone().unwrap())
        .collect();
    assert_eq!(ifaces, ["nodea", "nodea2"]);
}

#[test]
fn multipath_map_expands_to_its_slaves() {
    let t = Tree::lab();
    t.dm(
        0,
        "mpatha",
        "mpath-36001405ab00000000000000000000000",
        &["sdc", "sda"],
    );
    for given in [t.dev("dm-0"), t.dev("mapper/mpatha")] {
        let lus = t.discovery().resolve(std::slice::from_ref(&given)).unwrap();
        assert_eq!(lus.len(), 1);
        assert_eq!(lus[0].id.as_str(), LUN0);
        // Slaves in name order; each path remembers the map it came from.
        assert_eq!(names(&lus[0]), ["sda", "sdc"]);
        assert_eq!(lus[0].paths[0].dev, t.dev("sda"));
        assert!(lus[0].paths.iter().all(|p| p.given == given));
        assert_eq!(lus[0].paths[1].hctl, "2:0:0:0");
    }
}

#[test]
fn mapper_node_without_udev_link_is_found_by_dm_name() {
    let t = Tree::lab();
    t.dm(
        0,
        "mpatha",
        "mpath-36001405ab00000000000000000000000",
        &["sdc", "sda"],
    );
    let link = t.dev("mapper/mpatha");
    fs::remove_file(&link).unwrap();
    fs::write(&link, "").unwrap();
    let lus = t.discovery().resolve(&[link]).unwrap();
    assert_eq!(names(&lus[0]), ["sda", "sdc"]);
}

#[test]
fn map_and_its_own_path_and_generic_node_are_not_counted_twice() {
    let t = Tree::lab();
    t.dm(
        0,
        "mpatha",
        "mpath-36001405ab00000000000000000000000",
        &["sdc", "sda"],
    );
    let lus = t
        .discovery()
        .resolve(&[t.dev("sg2"), t.dev("mapper/mpatha"), t.dev("sdc")])
        .unwrap();
    assert_eq!(lus.len(), 1);
    // sg2 is sdc's generic node (2:0:0:0): it stays, under its own name, and sdc is dropped.
    assert_eq!(names(&lus[0]), ["sg2", "sda"]);
    assert_eq!(lus[0].paths[0].dev, t.dev("sg2"));
    assert_eq!(lus[0].paths[0].hctl, "2:0:0:0");
    assert!(lus[0].paths[0].transport.is_some());
}

#[test]
fn by_id_symlink_is_followed() {
    let t = Tree::lab();
    let link = t.dev("disk/by-id/wwn-0x6001405ab00000000000000000000000");
    symlink("../../sdb", &link).unwrap();
    let lus = t.discovery().resolve(std::slice::from_ref(&link)).unwrap();
    assert_eq!(lus[0].paths[0].dev, t.dev("sdb"));
    assert_eq!(lus[0].paths[0].given, link);
}

#[test]
fn dead_path_is_returned_with_its_state() {
    let t = Tree::lab();
    t.write(
        "devices/platform/host1/session2/target1:0:0/1:0:0:0/state",
        "transport-offline\n",
    );
    t.dm(
        0,
        "mpatha",
        "mpath-36001405ab00000000000000000000000",
        &["sdc", "sda"],
    );
    let lus = t.discovery().resolve(&[t.dev("dm-0")]).unwrap();
    let states: Vec<_> = lus[0].paths.iter().map(|p| p.state.clone()).collect();
    assert_eq!(states, [PathState::TransportOffline, PathState::Running]);
    assert!(!lus[0].paths[0].is_live());
    assert_eq!(
        PathState::parse("quiesce\n"),
        PathState::Other("quiesce".into())
    );
}

#[test]
fn identity_falls_back_to_vpd_page_83() {
    let t = Tree::new();
    t.session(0, 1, "iqn.2026-11.lab:nodeb", "default");
    t.disk(0, 1, 0, "sdb", "sg1", None, Some(LIO_PG83), "running");
    let lus = t.discovery().resolve(&[t.dev("sdb")]).unwrap();
    assert_eq!(lus[0].id.as_str(), LUN0);
}

#[test]
fn map_slave_without_identity_inherits_the_maps_lu() {
    let t = Tree::new();
    t.session(1, 2, "iqn.2026-11.lab:nodea", "nodea2");
    t.session(2, 3, "iqn.2026-11.lab:nodea", "nodea");
    t.disk(1, 2, 0, "sda", "sg0", None, None, "offline");
    t.disk(2, 3, 0, "sdc", "sg2", Some(LUN0), None, "running");
    t.dm(
        0,
        "mpatha",
        "mpath-36001405ab00000000000000000000000",
        &["sda", "sdc"],
    );
    let lus = t.discovery().resolve(&[t.dev("dm-0")]).unwrap();
    assert_eq!(lus[0].id.as_str(), LUN0);
    assert_eq!(names(&lus[0]), ["sda", "sdc"]);
    // Given alone, the same disk cannot be placed.
    let e = errors(t.discovery().resolve(&[t.dev("sda")]));
    assert!(matches!(&e[..], [DeviceError::NoIdentity { .. }]), "{e:?}");
    assert!(e[0].to_string().contains("1:0:0:0"), "{}", e[0]);
}

#[test]
fn partitions_are_refused_but_pvs_on_partitions_map_to_the_disk() {
    let t = Tree::lab();
    t.partition("sdb", "sdb1");
    let e = errors(t.discovery().resolve(&[t.dev("sdb1")]));
    let msg = e[0].to_string();
    assert!(
        msg.contains("partition") && msg.ends_with(&format!("give {}", t.dev("sdb").display())),
        "{msg}"
    );
    let lus = t.discovery().resolve_pvs(&[t.dev("sdb1")]).unwrap();
    assert_eq!(lus[0].paths[0].dev, t.dev("sdb"));
    assert_eq!(lus[0].paths[0].given, t.dev("sdb1"));
}

#[test]
fn kpartx_partition_of_a_map() {
    let t = Tree::lab();
    t.dm(
        0,
        "mpatha",
        "mpath-36001405ab00000000000000000000000",
        &["sdc", "sda"],
    );
    t.dm(
        1,
        "mpatha1",
        "part1-mpath-36001405ab00000000000000000000000",
        &[],
    );
    symlink(
        "../../../../virtual/block/dm-0",
        t.sys().join("devices/virtual/block/dm-1/slaves/dm-0"),
    )
    .unwrap();
    let e = errors(t.discovery().resolve(&[t.dev("mapper/mpatha1")]));
    assert!(
        e[0].to_string()
            .contains(&format!("give {}", t.dev("dm-0").display())),
        "{}",
        e[0]
    );
    let lus = t.discovery().resolve_pvs(&[t.dev("dm-1")]).unwrap();
    assert_eq!(names(&lus[0]), ["sda", "sdc"]);
}

#[test]
fn refusals_name_the_device_and_what_to_do() {
    let t = Tree::lab();
    t.dm(0, "vg-lv", "LVM-abcdef", &["sdb"]);
    t.dm(1, "empty", "mpath-3600", &[]);
    // A virtio-blk disk: a block device that is neither SCSI nor an NVMe namespace.
    t.write(
        "devices/pci0000:00/0000:00:04.0/virtio1/block/vda/size",
        "8\n",
    );
    symlink(
        "../../devices/pci0000:00/0000:00:04.0/virtio1/block/vda",
        t.sys().join("class/block/vda"),
    )
    .unwrap();
    symlink(
        "../../../virtio1",
        t.sys()
            .join("devices/pci0000:00/0000:00:04.0/virtio1/block/vda/device"),
    )
    .unwrap();
    fs::write(t.dev("vda"), "").unwrap();
    fs::write(t.dev("null"), "").unwrap();
    let e = errors(t.discovery().resolve(&[
        t.dev("mapper/vg-lv"),
        t.dev("dm-1"),
        t.dev("vda"),
        t.dev("sdz"),
        t.dev("null"),
    ]));
    let msgs: Vec<String> = e.iter().map(ToString::to_string).collect();
    assert!(matches!(e[0], DeviceError::NotMultipath { .. }), "{msgs:?}");
    assert!(msgs[0].contains("LVM-abcdef") && msgs[0].contains("mapper/vg-lv"));
    assert!(matches!(e[1], DeviceError::NoPaths { .. }), "{msgs:?}");
    assert!(matches!(e[2], DeviceError::NotScsi { .. }), "{msgs:?}");
    assert!(
        msgs[2].contains("neither a SCSI device nor an NVMe namespace"),
        "{msgs:?}"
    );
    assert!(matches!(e[3], DeviceError::NotFound { .. }), "{msgs:?}");
    assert!(msgs[3].contains("sdz"));
    assert!(matches!(e[4], DeviceError::NoSysfs { .. }), "{msgs:?}");
    // Every problem is reported, one per line.
    let all = DiscoverError::Devices(e).to_string();
    assert_eq!(all.lines().count(), 5, "{all}");
}

#[test]
fn map_over_two_lus_is_refused() {
    let t = Tree::lab();
    t.dm(0, "bad", "mpath-3600", &["sdb", "sdf"]);
    let e = errors(t.discovery().resolve(&[t.dev("dm-0")]));
    assert!(matches!(&e[..], [DeviceError::MixedMap { ids, .. }] if ids == &[LUN0, LUN1]));
}

#[test]
fn two_lus_with_one_identifier_are_refused() {
    // LIO makes its NAA from the hex digits of vpd_unit_serial: "lab-lunx" and "lab-luny" both
    // give naa.6001405ab0…. Grouping them would fence one LU through the other's paths.
    let t = Tree::lab();
    t.write(
        "devices/platform/host0/session1/target0:0:0/0:0:0:1/wwid",
        format!("{LUN0}\n"),
    );
    let e = errors(t.discovery().resolve(&[t.dev("sdb"), t.dev("sdf")]));
    assert!(matches!(&e[..], [DeviceError::IdCollision { .. }]), "{e:?}");
    assert!(e[0].to_string().contains("\"lab-lun1\""), "{}", e[0]);
}

#[test]
fn no_devices_give_no_lus() {
    assert!(Tree::lab().discovery().resolve(&[]).unwrap().is_empty());
}

#[test]
fn lvm_autodiscovery_resolves_pvs_of_shared_vgs() {
    use std::os::unix::fs::PermissionsExt;
    let t = Tree::lab();
    t.dm(
        0,
        "mpatha",
        "mpath-36001405ab00000000000000000000000",
        &["sdc", "sda"],
    );
    t.partition("sdd", "sdd1");
    let vgs = t.root.path().join("vgs");
    let script = |body: String| {
        fs::write(&vgs, format!("#!/bin/sh\n{body}")).unwrap();
        fs::set_permissions(&vgs, fs::Permissions::from_mode(0o755)).unwrap();
    };
    // A clustered VG on the map, a shared one on a partition, a local one on sdb.
    script(format!(
        "echo '  wz--nc:{}'; echo '  wz--ns:{}'; echo '  wz--n-:{}'\n",
        t.dev("dm-0").display(),
        t.dev("sdd1").display(),
        t.dev("sdb").display()
    ));
    let lus = t.discovery().resolve_lvm(&vgs, None).unwrap();
    assert_eq!(lus.len(), 2);
    assert_eq!(names(&lus[0]), ["sda", "sdc"]);
    assert_eq!(names(&lus[1]), ["sdd"]);
    // A PV that vanished ([unknown] in vgs) fails the strict call, not the lenient one.
    script(format!(
        "echo '  wz--nc:{}'; echo '  wz--nc:[unknown]'\n",
        t.dev("dm-0").display()
    ));
    assert!(t.discovery().resolve_lvm(&vgs, None).is_err());
    let r = t.discovery().resolve_lvm_each(&vgs, None).unwrap();
    assert_eq!(r.lus.len(), 1);
    assert_eq!(r.unidentified[0].device, Path::new("[unknown]"));
    script("echo '  wz--n-:/dev/sda'\n".into());
    assert!(matches!(
        t.discovery().resolve_lvm(&vgs, None),
        Err(DiscoverError::NothingToFence)
    ));
    script("exit 5\n".into());
    assert!(matches!(
        t.discovery().resolve_lvm(&vgs, None),
        Err(DiscoverError::Lvm(_))
    ));
}

#[test]
fn lenient_resolution_keeps_vanished_devices_apart_and_still_refuses_admin_errors() {
    let t = Tree::lab();
    // sdz vanished (no node), sdy is a stale node without sysfs: neither stops sdb and sdf.
    fs::write(t.dev("sdy"), "").unwrap();
    let r = t
        .discovery()
        .resolve_each(&[t.dev("sdz"), t.dev("sdb"), t.dev("sdy"), t.dev("sdf")])
        .unwrap();
    let ids: Vec<&str> = r.lus.iter().map(|lu| lu.id.as_str()).collect();
    assert_eq!(ids, [LUN0, LUN1]);
    let unknown: Vec<&Path> = r.unidentified.iter().map(|u| u.device.as_path()).collect();
    assert_eq!(unknown, [t.dev("sdz"), t.dev("sdy")]);
    assert!(matches!(
        r.unidentified[0].error,
        DeviceError::NotFound { .. }
    ));
    // A partition is the admin's to fix, even next to a vanished device.
    t.partition("sdb", "sdb1");
    let e = t
        .discovery()
        .resolve_each(&[t.dev("sdz"), t.dev("sdb1")])
        .unwrap_err();
    assert!(
        matches!(&e, DiscoverError::Devices(v) if v.len() == 1
        && matches!(v[0], DeviceError::Partition { .. })),
        "{e}"
    );
    // The strict entry point still refuses the vanished device.
    assert!(
        t.discovery()
            .resolve(&[t.dev("sdz"), t.dev("sdb")])
            .is_err()
    );
}

#[test]
fn unidentified_devices_become_node_local_dead_lus() {
    let t = Tree::lab();
    let r = t
        .discovery()
        .resolve_each(&[t.dev("sdz"), t.dev("sdb"), t.dev("sdc"), t.dev("sdz")])
        .unwrap();
    // Nothing opens on a fake tree: every path is an unopened (dead) path, which is enough here.
    let open: crate::ops::Opener<crate::exec::ScsiPr<crate::spc_model::ModelDevice>> =
        std::sync::Arc::new(|dev: &Path| {
            Err(crate::transport::CommandError::without_completion(
                dev,
                crate::transport::Command::Open,
                crate::transport::ErrorKind::Open,
                "fake tree",
            ))
        });
    let lus = crate::ops::targets(&r, false, &open);
    assert_eq!(lus.len(), 2);
    assert_eq!(lus[0].id, LUN0);
    assert_eq!(lus[0].paths.len(), 2);
    assert!(lus[1].id.is_node_local());
    assert_eq!(lus[1].paths.len(), 1);
    let single = crate::ops::targets(&r, true, &open);
    assert_eq!(single[0].paths.len(), 1);
}

#[test]
fn a_scsi_disk_being_removed_is_unidentified_not_a_usage_error() {
    // A logout removes the SCSI device's class entry (`device/scsi_device`) before its disk.
    let t = Tree::lab();
    fs::remove_dir_all(
        t.sys()
            .join("devices/platform/host0/session1/target0:0:0/0:0:0:0/scsi_device"),
    )
    .unwrap();
    let r = t
        .discovery()
        .resolve_each(&[t.dev("sdb"), t.dev("sdc")])
        .unwrap();
    assert_eq!(r.lus.len(), 1);
    assert_eq!(r.unidentified.len(), 1);
    let e = &r.unidentified[0].error;
    assert!(matches!(e, DeviceError::Removing { .. }), "{e}");
    assert!(e.to_string().contains("being removed"), "{e}");
    let e = errors(t.discovery().resolve(&[t.dev("sdb")]));
    assert!(matches!(e[0], DeviceError::Removing { .. }), "{}", e[0]);
}

const NS_WWID: &str = "uuid.6b1a9c64-39a4-4a4e-9d4c-1e0b4f2d7a01";

#[test]
fn an_nvme_namespace_is_one_nvme_path_identified_by_its_wwid() {
    let t = Tree::lab();
    t.nvme_ns(1, 1, &[("wwid", NS_WWID)], "live");
    symlink("../../nvme1n1", t.dev("disk/by-id/nvme-uuid.6b1a9c64")).unwrap();
    let lus = t
        .discovery()
        .resolve(&[
            t.dev("disk/by-id/nvme-uuid.6b1a9c64"),
            t.dev("sdb"),
            t.dev("nvme1n1"),
        ])
        .unwrap();
    // Sorted by id: naa.… (the SCSI LUN) before uuid.…; the namespace given twice is one path.
    assert_eq!(lus.len(), 2);
    assert_eq!(lus[1].id.as_str(), NS_WWID);
    let [path] = &lus[1].paths[..] else {
        panic!("{:?}", lus[1]);
    };
    assert_eq!(path.protocol, Protocol::Nvme);
    assert_eq!(
        (path.name.as_str(), path.hctl.as_str()),
        ("nvme1n1", "nvme1:ns1")
    );
    assert_eq!(path.dev, t.dev("nvme1n1"));
    assert_eq!(path.state, PathState::Running);
    assert_eq!(path.transport, None);
    assert_eq!(lus[0].paths[0].protocol, Protocol::Scsi);
}

#[test]
fn nvme_controller_states_map_to_path_states() {
    let t = Tree::new();
    for (ctrl, state) in [
        (1, "connecting"),
        (2, "resetting"),
        (3, "dead"),
        (4, "deleting"),
        (5, "new"),
    ] {
        t.nvme_ns(
            ctrl,
            1,
            &[("wwid", &format!("eui.00000000000000{ctrl:02}"))],
            state,
        );
    }
    let states: Vec<PathState> = (1..=5)
        .map(|c| {
            let lus = t
                .discovery()
                .resolve(&[t.dev(&format!("nvme{c}n1"))])
                .unwrap();
            lus[0].paths[0].state.clone()
        })
        .collect();
    assert_eq!(
        states,
        [
            PathState::Blocked,
            PathState::Blocked,
            PathState::TransportOffline,
            PathState::TransportOffline,
            PathState::Blocked,
        ]
    );
}

#[test]
fn a_multipath_head_is_live_while_one_controller_is() {
    let t = Tree::new();
    t.nvme_head(0, 1, NS_WWID, &[(0, "dead"), (1, "live")]);
    t.nvme_head(
        1,
        2,
        "eui.0011223344556677",
        &[(2, "connecting"), (3, "dead")],
    );
    let lus = t
        .discovery()
        .resolve(&[t.dev("nvme0n1"), t.dev("nvme1n2")])
        .unwrap();
    let head = &lus[1].paths[0];
    assert_eq!(
        (lus[1].id.as_str(), head.hctl.as_str()),
        (NS_WWID, "nvme-subsys0:ns1")
    );
    assert_eq!(head.state, PathState::Running);
    assert_eq!(lus[0].paths[0].state, PathState::Blocked);
    assert_eq!(lus[0].paths[0].protocol, Protocol::Nvme);
}

#[test]
fn a_hidden_controller_path_is_refused_naming_its_head() {
    let t = Tree::new();
    t.nvme_head(0, 1, NS_WWID, &[(0, "live"), (1, "live")]);
    // Hidden disks have no /dev node; one made by hand must still be refused.
    fs::write(t.dev("nvme0c1n1"), "").unwrap();
    let e = errors(t.discovery().resolve(&[t.dev("nvme0c1n1")]));
    assert!(matches!(e[0], DeviceError::NvmePath { .. }), "{e:?}");
    let text = e[0].to_string();
    assert!(
        text.contains("multipath head") && text.ends_with("dev/nvme0n1"),
        "{text}"
    );
}

#[test]
fn nvme_identity_falls_back_to_the_kernels_sources_in_its_order() {
    let t = Tree::new();
    let nguid = "00112233-4455-6677-8899-aabbccddeeff";
    // No wwid: a real UUID wins.
    t.nvme_ns(
        1,
        1,
        &[
            ("uuid", "6B1A9C64-39A4-4A4E-9D4C-1E0B4F2D7A01"),
            ("nguid", nguid),
        ],
        "live",
    );
    // The uuid attribute echoing the NGUID (no UUID): the NGUID, as `eui.`.
    t.nvme_ns(2, 1, &[("uuid", nguid), ("nguid", nguid)], "live");
    // Only an EUI-64, printed with spaces.
    t.nvme_ns(3, 1, &[("eui", "00 11 22 33 44 55 66 77")], "live");
    // Nothing at all.
    t.nvme_ns(4, 1, &[], "live");
    let id = |c: u32| {
        t.discovery()
            .resolve(&[t.dev(&format!("nvme{c}n1"))])
            .map(|lus| lus[0].id.as_str().to_owned())
    };
    assert_eq!(id(1).unwrap(), "uuid.6b1a9c64-39a4-4a4e-9d4c-1e0b4f2d7a01");
    assert_eq!(id(2).unwrap(), "eui.00112233445566778899aabbccddeeff");
    assert_eq!(id(3).unwrap(), "eui.0011223344556677");
    let e = errors(t.discovery().resolve(&[t.dev("nvme4n1")]));
    assert!(matches!(e[0], DeviceError::NoIdentity { .. }), "{e:?}");
}

#[test]
fn an_nvme_partition_is_refused_naming_the_namespace() {
    let t = Tree::new();
    t.nvme_ns(1, 1, &[("wwid", NS_WWID)], "live");
    t.partition("nvme1n1", "nvme1n1p1");
    let e = errors(t.discovery().resolve(&[t.dev("nvme1n1p1")]));
    assert!(matches!(e[0], DeviceError::Partition { .. }), "{e:?}");
    assert!(e[0].to_string().ends_with("dev/nvme1n1"), "{}", e[0]);
}

#[test]
fn the_protocol_of_a_device_node_comes_from_its_name() {
    let t = Tree::lab();
    t.nvme_ns(1, 1, &[("wwid", NS_WWID)], "live");
    symlink("../../nvme1n1", t.dev("disk/by-id/nvme-x")).unwrap();
    assert_eq!(protocol_of(&t.dev("nvme1n1")), Protocol::Nvme);
    assert_eq!(protocol_of(&t.dev("disk/by-id/nvme-x")), Protocol::Nvme);
    assert_eq!(protocol_of(&t.dev("sdb")), Protocol::Scsi);
    assert_eq!(protocol_of(&t.dev("sg1")), Protocol::Scsi);
    for (name, parsed) in [
        ("nvme0n1", Some(NvmeName::Namespace)),
        ("nvme12n34", Some(NvmeName::Namespace)),
        (
            "nvme0c1n2",
            Some(NvmeName::HiddenPath {
                head: "nvme0n2".to_owned(),
            }),
        ),
        ("nvme0n1p1", None),
        ("nvme0", None),
        ("nvmen1", None),
        ("nvme0cn1", None),
        ("sda", None),
    ] {
        assert_eq!(parse_nvme_name(name), parsed, "{name}");
    }
}

/// A session's parameters are read once it is complete; one still logging in (no portal group
/// yet) is read again at the next discovery, and a new session name is read afresh.
#[test]
fn iscsi_sessions_are_read_again_until_complete_and_then_remembered() {
    let t = Tree::lab();
    let d = t.discovery();
    let sdc = || {
        d.resolve(&[t.dev("sdc")]).unwrap()[0].paths[0]
            .transport
            .clone()
            .unwrap()
    };
    let tpgt = t
        .sys()
        .join("devices/platform/host2/session3/iscsi_session/session3/tpgt");
    fs::write(&tpgt, "(null)\n").unwrap();
    assert_eq!(sdc().tpgt, None);
    fs::write(&tpgt, "1\n").unwrap();
    let complete = sdc();
    assert_eq!(complete.tpgt, Some(1));
    assert_eq!(complete.initiator, "iqn.2026-11.lab:nodea");
    // Complete: the kernel never gives this name to another session, so it is not read again.
    fs::write(&tpgt, "7\n").unwrap();
    assert_eq!(sdc(), complete);
    // A clone shares what was learned; a new discovery reads it.
    assert_eq!(
        d.clone().resolve(&[t.dev("sdc")]).unwrap()[0].paths[0].transport,
        Some(complete)
    );
    let fresh = t.discovery().resolve(&[t.dev("sdc")]).unwrap();
    assert_eq!(fresh[0].paths[0].transport.as_ref().unwrap().tpgt, Some(7));
}

#[test]
fn attributes_longer_than_a_page_are_read_to_the_end() {
    let t = Tree::new();
    let long = "x".repeat(4096) + "tail\n";
    t.write("long", &long);
    t.write("page", "y".repeat(4096));
    assert_eq!(super::read_attr(&t.sys().join("long")).unwrap(), long);
    assert_eq!(
        super::read_attr(&t.sys().join("page")).unwrap(),
        "y".repeat(4096)
    );
    assert!(super::read_attr(&t.sys().join("missing")).is_err());
}

#[test]
fn real_paths_are_what_realpath_gives() {
    let t = Tree::lab();
    for rel in [
        "class/block/sdc/device",
        "class/scsi_generic/sg2/device",
        "block/sdb",
        "class/iscsi_session/session3",
        "devices",
    ] {
        let path = t.sys().join(rel);
        assert_eq!(
            super::real_path(&path).unwrap(),
            fs::canonicalize(&path).unwrap(),
            "{rel}"
        );
    }
    assert_eq!(
        super::real_path(&t.sys().join("class/block/nothing"))
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::NotFound
    );
}

/// [`Discovery::resolve_repeated`]: the previous answer while nothing it rests on changed;
/// afresh at once when a path's state, the map's paths, the devices present or the caller say
/// so. An answer given again is recognised by a change it cannot see: the identity attributes
/// removed, which fails a full discovery.
mod repeated {
    use super::*;

    const SDA_DIR: &str = "devices/platform/host1/session2/target1:0:0/1:0:0:0";

    /// sda loses its identity where a full discovery reads it: such a discovery fails.
    fn change_identity_behind_its_back(t: &Tree) {
        for attr in ["wwid", "vpd_pg83"] {
            fs::remove_file(t.sys().join(SDA_DIR).join(attr)).unwrap();
        }
    }

    /// Each answer's identifier, "again" for an answer that stands, or its error.
    fn ids(results: &[Repeated]) -> Vec<String> {
        results
            .iter()
            .map(|r| match r {
                Repeated::Again => AGAIN.to_owned(),
                Repeated::Found(Ok(lus)) => lus[0].id.as_str().to_owned(),
                Repeated::Found(Err(e)) => format!("error: {e}"),
            })
            .collect()
    }

    const AGAIN: &str = "again";

    /// The LUs found now (not an answer that stands).
    fn found(answer: &Repeated) -> &[Lu] {
        match answer {
            Repeated::Found(Ok(lus)) => lus,
            other => panic!("not found afresh: {other:?}"),
        }
    }

    /// Two full rounds (the second makes the answer trusted), then sda's identity removed
    /// behind discovery's back.
    fn settled(t: &Tree, d: &Discovery, devices: &[PathBuf]) {
        let fresh = vec![false; devices.len()];
        let first = ids(&d.resolve_repeated(devices, &fresh, usize::MAX));
        assert_eq!(first[0], LUN0);
        assert_eq!(first, ids(&d.resolve_repeated(devices, &fresh, usize::MAX)));
        change_identity_behind_its_back(t);
    }

    fn failed(ids: &[String]) -> bool {
        ids[0].starts_with("error: ")
    }

    /// Given again (not copied), then discovered afresh within [`repeat::MAX_REUSES`] rounds.
    #[test]
    fn an_unchanged_device_gets_its_previous_answer_until_the_bound() {
        let t = Tree::lab();
        let d = t.discovery();
        let devices = [t.dev("sda")];
        settled(&t, &d, &devices);
        let mut again = 0;
        let afresh = loop {
            let answer = ids(&d.resolve_repeated(&devices, &[false], usize::MAX));
            if answer != [AGAIN] {
                break answer;
            }
            again += 1;
            assert!(again <= repeat::MAX_REUSES, "given again {again} times");
        };
        assert!(again > 0, "never given again");
        assert!(failed(&afresh), "after {again} rounds: {afresh:?}");
    }

    /// Each device is discovered afresh in its own round of every [`repeat::MAX_REUSES`]: a
    /// few at each round, not all of them in one.
    #[test]
    fn devices_are_discovered_afresh_in_turn() {
        let t = Tree::lab();
        let d = t.discovery();
        let devices = [t.dev("sda"), t.dev("sdd")];
        let fresh = [false, false];
        d.resolve_repeated(&devices, &fresh, usize::MAX);
        d.resolve_repeated(&devices, &fresh, usize::MAX);
        let mut afresh_at: Vec<Vec<usize>> = vec![Vec::new(); devices.len()];
        for round in 0..2 * repeat::MAX_REUSES as usize {
            let answers = d.resolve_repeated(&devices, &fresh, usize::MAX);
            for (index, answer) in answers.iter().enumerate() {
                if !matches!(answer, Repeated::Again) {
                    afresh_at[index].push(round);
                }
            }
        }
        let period = repeat::MAX_REUSES as usize;
        for rounds in &afresh_at {
            assert_eq!(rounds.len(), 2, "{afresh_at:?}");
            assert_eq!(rounds[1] - rounds[0], period, "{afresh_at:?}");
        }
        assert_ne!(afresh_at[0][0], afresh_at[1][0], "{afresh_at:?}");
    }

    #[test]
    fn a_fresh_request_discovers_afresh() {
        let t = Tree::lab();
        let d = t.discovery();
        let devices = [t.dev("sda")];
        settled(&t, &d, &devices);
        assert!(failed(&ids(&d.resolve_repeated(
            &devices,
            &[true],
            usize::MAX
        ))));
    }

    /// With the state file held open between rounds, and read afresh each round (no
    /// descriptors to spare).
    #[test]
    fn a_path_state_change_is_seen_at_once() {
        for hold in [usize::MAX, 0] {
            let t = Tree::lab();
            let d = t.discovery();
            let devices = [t.dev("sda")];
            for round in 0..3 {
                let answer = ids(&d.resolve_repeated(&devices, &[false], hold));
                // the third is given again: the state is all that is read
                assert_eq!(answer, [if round < 2 { LUN0 } else { AGAIN }]);
            }
            t.write(&format!("{SDA_DIR}/state"), "transport-offline\n");
            let again = d.resolve_repeated(&devices, &[false], hold);
            let lus = found(&again[0]);
            assert_eq!(
                lus[0].paths[0].state,
                PathState::TransportOffline,
                "hold {hold}"
            );
        }
    }

    /// Files are held up to the budget given, and given back when it shrinks.
    #[test]
    fn state_files_are_held_within_the_budget_and_given_back() {
        let t = Tree::lab();
        let d = t.discovery();
        let devices = [t.dev("sda"), t.dev("sdd")];
        let held = || d.repeated.lock().unwrap().held();
        d.resolve_repeated(&devices, &[false, false], 1);
        assert_eq!(held(), 1, "two paths, room for one");
        // Not trusted yet (a first answer is not given again): discovered again, with room.
        d.resolve_repeated(&devices, &[false, false], usize::MAX);
        assert_eq!(held(), 2);
        d.resolve_repeated(&devices, &[false, false], 1);
        assert_eq!(held(), 1, "the budget shrank: one given back");
        d.resolve_repeated(&devices, &[false, false], 0);
        assert_eq!(held(), 0);
        assert_eq!(
            ids(&d.resolve_repeated(&devices, &[false, false], 0)),
            [AGAIN, AGAIN],
            "read afresh instead of held, and still given again"
        );
    }

    /// A device removed and added again under the same name between two rounds: its state file
    /// reads the same, but it is another file (sysfs fails the held one's read; here it is
    /// unlinked), so the answer is not given again.
    #[test]
    fn a_state_file_made_again_under_the_same_name_is_a_change() {
        for hold in [usize::MAX, 0] {
            let t = Tree::lab();
            let d = t.discovery();
            let devices = [t.dev("sda")];
            settled(&t, &d, &devices);
            let state = t.sys().join(SDA_DIR).join("state");
            let text = fs::read(&state).unwrap();
            fs::remove_file(&state).unwrap();
            fs::write(&state, text).unwrap();
            let again = ids(&d.resolve_repeated(&devices, &[false], hold));
            assert!(failed(&again), "hold {hold}: {again:?}");
        }
    }

    #[test]
    fn a_device_added_anywhere_makes_every_device_discovered_afresh() {
        let t = Tree::lab();
        let d = t.discovery();
        let devices = [t.dev("sda"), t.dev("sdd")];
        settled(&t, &d, &devices);
        t.disk(3, 4, 0, "sdg", "sg6", Some(LUN0), Some(LIO_PG83), "running");
        let again = ids(&d.resolve_repeated(&devices, &[false, false], usize::MAX));
        assert!(failed(&again), "{again:?}");
        assert_eq!(again[1], LUN1);
    }

    #[test]
    fn a_map_whose_paths_change_is_discovered_afresh() {
        let t = Tree::lab();
        t.dm(
            0,
            "mpatha",
            "mpath-36001405ab00000000000000000000000",
            &["sdc"],
        );
        let d = t.discovery();
        let devices = [t.dev("dm-0")];
        let fresh = [false];
        for round in 0..3 {
            let lus = d.resolve_repeated(&devices, &fresh, usize::MAX);
            if round < 2 {
                assert_eq!(names(&found(&lus[0])[0]), ["sdc"]);
            } else {
                assert!(matches!(lus[0], Repeated::Again), "{lus:?}");
            }
        }
        // multipathd adds sda to the map: no block device appeared, the map's slaves changed.
        let below = fs::read_link(t.sys().join("block/sda")).unwrap();
        let below = below.strip_prefix("../devices").unwrap().to_owned();
        symlink(
            Path::new("../../../..").join(below),
            t.sys().join("devices/virtual/block/dm-0/slaves/sda"),
        )
        .unwrap();
        let lus = d.resolve_repeated(&devices, &fresh, usize::MAX);
        assert_eq!(names(&found(&lus[0])[0]), ["sda", "sdc"]);
    }

    #[test]
    fn a_first_answer_is_not_given_again() {
        let t = Tree::lab();
        let d = t.discovery();
        let devices = [t.dev("sda")];
        assert_eq!(
            ids(&d.resolve_repeated(&devices, &[false], usize::MAX)),
            [LUN0]
        );
        change_identity_behind_its_back(&t);
        // Trusted only once two discoveries in a row found the same state around them.
        assert!(failed(&ids(&d.resolve_repeated(
            &devices,
            &[false],
            usize::MAX
        ))));
    }

    #[test]
    fn nvme_namespaces_are_discovered_afresh_every_time() {
        let t = Tree::new();
        t.nvme_ns(
            1,
            1,
            &[("wwid", "uuid.0a5e6b1c-0000-4000-8000-000000000001")],
            "live",
        );
        let d = t.discovery();
        let devices = [t.dev("nvme1n1")];
        for _ in 0..3 {
            found(&d.resolve_repeated(&devices, &[false], usize::MAX)[0]);
        }
        t.write(
            "devices/virtual/nvme-fabrics/ctl/nvme1/state",
            "connecting\n",
        );
        let lus = d.resolve_repeated(&devices, &[false], usize::MAX);
        assert!(!found(&lus[0])[0].paths[0].is_live());
    }
}
