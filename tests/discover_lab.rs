//! Discovery against a real kernel's sysfs, inside the lab guest (the host has no SCSI stack, so
//! these tests are `#[ignore]`d there). The guest script (`testdata/discover-lab.sh`) exports LIO
//! LUNs over iSCSI to one node through two sessions, builds a dm-multipath map over that node's
//! two paths to LUN 0 and a partition on LUN 1, then runs this binary with `--ignored` and:
//!   LAB_NODE_DISKS  the node's /dev/sdX (both sessions, both LUNs), space-separated
//!   LAB_NODE_SGS    their /dev/sgN
//!   LAB_MPATH       the map (/dev/dm-N)
//!   LAB_PARTITION   the partition (/dev/sdX1)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use prfence::discover::{DeviceError, DiscoverError, Lu, LuId, PathState, resolve};

fn env_paths(name: &str) -> Vec<PathBuf> {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set; run inside the lab guest"))
        .split_whitespace()
        .map(PathBuf::from)
        .collect()
}

fn hctls(lu: &Lu) -> Vec<String> {
    let mut h: Vec<String> = lu.paths.iter().map(|p| p.hctl.clone()).collect();
    h.sort();
    h
}

#[test]
#[ignore = "needs the lab guest"]
fn node_disks_group_into_luns_sorted_by_id() {
    let lus = resolve(&env_paths("LAB_NODE_DISKS")).unwrap();
    println!("{lus:#?}");
    assert_eq!(lus.len(), 2);
    assert!(lus[0].id < lus[1].id);
    for lu in &lus {
        assert!(lu.id.as_str().starts_with("naa.6001405"), "{}", lu.id);
        assert_eq!(lu.paths.len(), 2, "{lu:?}");
        let sessions: Vec<_> = lu
            .paths
            .iter()
            .map(|p| p.transport.clone().expect("an iSCSI path"))
            .collect();
        assert_ne!(sessions[0].session, sessions[1].session);
        assert!(
            sessions
                .iter()
                .all(|s| s.initiator == "iqn.2026-11.lab:nodea")
        );
        assert!(lu.paths.iter().all(|p| p.state == PathState::Running));
    }
    // The generic nodes name the same paths.
    let by_sg = resolve(&env_paths("LAB_NODE_SGS")).unwrap();
    assert_eq!(
        by_sg.iter().map(|l| (&l.id, hctls(l))).collect::<Vec<_>>(),
        lus.iter().map(|l| (&l.id, hctls(l))).collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "needs the lab guest"]
fn vpd_fallback_matches_the_kernels_wwid() {
    let mut seen = 0;
    for entry in std::fs::read_dir("/sys/block").unwrap() {
        let dev = entry.unwrap().path().join("device");
        let Ok(wwid) = std::fs::read_to_string(dev.join("wwid")) else {
            continue;
        };
        let page = std::fs::read(dev.join("vpd_pg83")).unwrap();
        assert_eq!(
            LuId::from_vpd_pg83(&page).unwrap().as_str(),
            wwid.trim_end(),
            "{}",
            dev.display()
        );
        seen += 1;
    }
    assert!(seen >= 4, "only {seen} SCSI disks");
}

#[test]
#[ignore = "needs the lab guest"]
fn multipath_map_expands_and_reports_a_dead_path() {
    let map = env_paths("LAB_MPATH");
    let lus = resolve(&map).unwrap();
    println!("{lus:#?}");
    assert_eq!(lus.len(), 1);
    let by_disks = resolve(&env_paths("LAB_NODE_DISKS")).unwrap();
    assert_eq!(lus[0].id, by_disks[0].id, "the map is over LUN 0");
    assert_eq!(hctls(&lus[0]), hctls(&by_disks[0]));

    // With the newline: 6.1 accepted "offline" without one but refused "running" (EINVAL).
    let victim = lus[0].paths[0].name.clone();
    let state = format!("/sys/block/{victim}/device/state");
    std::fs::write(&state, "offline\n").unwrap();
    let result = resolve(&map);
    std::fs::write(&state, "running\n").unwrap();
    let lus = result.unwrap();
    assert_eq!(lus[0].paths[0].state, PathState::Offline);
    assert!(!lus[0].paths[0].is_live() && lus[0].paths[1].is_live());
}

#[test]
#[ignore = "needs the lab guest"]
fn partition_is_refused_with_its_disk_named() {
    let part = env_paths("LAB_PARTITION");
    let err = resolve(&part).unwrap_err();
    println!("{err}");
    let DiscoverError::Devices(errors) = &err else {
        panic!("{err}")
    };
    assert!(
        matches!(&errors[..], [DeviceError::Partition { .. }]),
        "{err}"
    );
    let disk = part[0].to_str().unwrap().trim_end_matches(char::is_numeric);
    assert!(err.to_string().ends_with(&format!("give {disk}")), "{err}");
    let lus = prfence::discover::Discovery::system()
        .resolve_pvs(&part)
        .unwrap();
    assert_eq!(lus[0].paths[0].dev, PathBuf::from(disk));
}
