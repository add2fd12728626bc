//! Discovery against a real kernel's sysfs, in the lab guest: node A's disks over two iSCSI
//! sessions, their sg nodes, a dm-multipath map over two paths, a partition. The host has no SCSI
//! stack, so these are lab tests (one guest boot for the suite), never skipped.

use std::time::Duration;

use std::path::{Path, PathBuf};

use crate::plan::{GuestInit, GuestKernel, GuestRoot, Suite};
use crate::{Node, Topology};
use anyhow::{Context, ensure};
use prfence::discover::{DeviceError, DiscoverError, Discovery, Lu, LuId, PathState, resolve};

pub const SUITE: Suite = Suite {
    name: "discover",
    kernel: GuestKernel::Host,
    package: false,
    init: GuestInit::Lab,
    root: GuestRoot::Host,
    cpus: 1,
    budget: Duration::from_secs(4 * 60),
    usual: Duration::from_secs(10),
    tests: crate::tests![
        node_disks_group_into_luns_sorted_by_id,
        vpd_fallback_matches_the_kernels_wwid,
        multipath_map_expands_and_reports_a_dead_path,
        partition_is_refused_with_its_disk_named,
    ],
    long: &[],
    reproducers: &[],
};

fn hctls(lu: &Lu) -> Vec<String> {
    let mut h: Vec<String> = lu.paths.iter().map(|p| p.hctl.clone()).collect();
    h.sort();
    h
}

/// The sg node of a disk (`/dev/sdX` → `/dev/sgN`).
fn sg_of(disk: &Path) -> anyhow::Result<PathBuf> {
    let name = disk
        .file_name()
        .context("disk name")?
        .to_string_lossy()
        .into_owned();
    let dir = format!("/sys/block/{name}/device/scsi_generic");
    let entry = std::fs::read_dir(&dir)
        .with_context(|| format!("no {dir}: is the sg module loaded?"))?
        .next()
        .context("no sg node")??;
    Ok(Path::new("/dev").join(entry.file_name()))
}

/// Node A's disks through both of its sessions (two paths per LU).
fn node_a_two_paths(t: &Topology) -> anyhow::Result<Vec<PathBuf>> {
    let mut disks = t.node(Node::A).devices().to_vec();
    disks.extend(t.second_session(Node::A)?);
    Ok(disks)
}

fn node_disks_group_into_luns_sorted_by_id() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    let disks = node_a_two_paths(&t)?;
    let lus = resolve(&disks)?;
    println!("{lus:#?}");
    ensure!(lus.len() == 2, "two LUs expected, got {}", lus.len());
    ensure!(lus[0].id < lus[1].id, "sorted by id");
    for lu in &lus {
        ensure!(lu.id.as_str().starts_with("naa.6001405"), "{}", lu.id);
        ensure!(lu.paths.len() == 2, "two paths expected: {lu:?}");
        let sessions: Vec<_> = lu
            .paths
            .iter()
            .map(|p| p.transport.clone().expect("an iSCSI path"))
            .collect();
        ensure!(
            sessions[0].session != sessions[1].session,
            "distinct sessions"
        );
        let initiator = &t.node(Node::A).initiator;
        ensure!(
            sessions.iter().all(|s| &s.initiator == initiator),
            "node A is {initiator:?}: {sessions:?}"
        );
        ensure!(lu.paths.iter().all(|p| p.state == PathState::Running));
    }
    // The same LUs as the lab's own oracle identifies them.
    let lab_ids: Vec<&str> = t.lus().iter().map(|l| l.wwid.as_str()).collect();
    for lu in &lus {
        ensure!(
            lab_ids.contains(&lu.id.as_str()),
            "{} is not one of {lab_ids:?}",
            lu.id
        );
    }
    // The generic nodes name the same paths.
    let sgs = disks
        .iter()
        .map(|d| sg_of(d))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let by_sg = resolve(&sgs)?;
    let key = |lus: &[Lu]| {
        lus.iter()
            .map(|l| (l.id.clone(), hctls(l)))
            .collect::<Vec<_>>()
    };
    ensure!(
        key(&by_sg) == key(&lus),
        "sg nodes resolve differently: {by_sg:#?}"
    );
    Ok(())
}

fn vpd_fallback_matches_the_kernels_wwid() -> anyhow::Result<()> {
    let _t = Topology::iscsi(2)?;
    let mut seen = 0;
    for entry in std::fs::read_dir("/sys/block")? {
        let dev = entry?.path().join("device");
        let Ok(wwid) = std::fs::read_to_string(dev.join("wwid")) else {
            continue;
        };
        let page = std::fs::read(dev.join("vpd_pg83"))?;
        let decoded = LuId::from_vpd_pg83(&page).context("VPD page 83h does not decode")?;
        ensure!(
            decoded.as_str() == wwid.trim_end(),
            "{}: {decoded} vs {}",
            dev.display(),
            wwid.trim_end()
        );
        seen += 1;
    }
    ensure!(seen >= 4, "only {seen} SCSI disks");
    Ok(())
}

fn multipath_map_expands_and_reports_a_dead_path() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    let second = t.second_session(Node::A)?;
    let first = t.device(Node::A, 0).to_path_buf();
    let map = t.multipath_map("discover", 0, &[&first, &second[0]])?;
    let lus = resolve(std::slice::from_ref(&map))?;
    println!("{lus:#?}");
    ensure!(lus.len() == 1, "one LU expected");
    ensure!(lus[0].id.as_str() == t.lu(0).wwid, "the map is over LUN 0");
    ensure!(lus[0].paths.len() == 2, "both paths of the map");

    // With the newline: 6.1 accepted "offline" without one but refused "running" (EINVAL).
    let victim = lus[0].paths[0].name.clone();
    let state = format!("/sys/block/{victim}/device/state");
    std::fs::write(&state, "offline\n")?;
    let result = resolve(std::slice::from_ref(&map));
    std::fs::write(&state, "running\n")?;
    let lus = result?;
    ensure!(
        lus[0].paths[0].state == PathState::Offline,
        "{:?}",
        lus[0].paths[0]
    );
    ensure!(!lus[0].paths[0].is_live() && lus[0].paths[1].is_live());
    Ok(())
}

fn partition_is_refused_with_its_disk_named() -> anyhow::Result<()> {
    let t = Topology::iscsi(2)?;
    let disk = t.device(Node::A, 1).to_path_buf();
    // MBR: one Linux partition at LBA 2048, 8192 sectors.
    let mut mbr = vec![0u8; 512];
    mbr[446..462].copy_from_slice(&[0, 0, 0, 0, 0x83, 0, 0, 0, 0, 0x08, 0, 0, 0, 0x20, 0, 0]);
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    let written = crate::write_to(&disk, 0, &{
        let mut block = vec![0u8; crate::BLOCK_SIZE];
        block[..512].copy_from_slice(&mbr);
        block
    });
    ensure!(
        matches!(written, crate::WriteOutcome::Accepted),
        "writing the MBR: {written:?}"
    );
    crate::run("blockdev", ["--rereadpt", &disk.display().to_string()])?
        .ok()
        .context("blockdev --rereadpt")?;
    let part = PathBuf::from(format!("{}1", disk.display()));
    ensure!(part.exists(), "{} did not appear", part.display());

    let err = resolve(std::slice::from_ref(&part)).expect_err("a partition must be refused");
    println!("{err}");
    let DiscoverError::Devices(errors) = &err else {
        anyhow::bail!("unexpected error: {err}")
    };
    ensure!(
        matches!(&errors[..], [DeviceError::Partition { .. }]),
        "{err}"
    );
    ensure!(
        err.to_string()
            .ends_with(&format!("give {}", disk.display())),
        "{err}"
    );
    let lus = Discovery::system().resolve_pvs(std::slice::from_ref(&part))?;
    ensure!(
        lus[0].paths[0].dev == disk,
        "a PV on a partition maps to its disk"
    );
    Ok(())
}
