//! Differential tests against the real fence_scsi: fence_pr must derive the very keys fence_scsi
//! derives, from the same input, so it can replace fence_scsi in a running cluster without
//! re-keying.
//!
//! fence_scsi is pointed at a fake `corosync-cmapctl` (a script printing a chosen cluster name and
//! nodelist) and fake `sg_persist`/`sg_turs` (reporting no registrations), and run with
//! `action=status verbose=1`; it then logs "No registration for key <KEY> on device …" — the key
//! it derived — and exits 2 (OFF). Our parse + derivation runs on the same stdin text and queries
//! the same fake corosync-cmapctl through `keys::query_cmapctl`.
//!
//! Needs fence-agents' fence_scsi (the lab and .ci/run install it): these tests FAIL when it is
//! missing. fence_scsi checks that each device is a block device, so the tests create a block
//! device node in a temp dir (root) or use an existing one from /dev.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "lab/host_tools.rs"]
mod host_tools;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use prfence::fence_agent::{self, Environment};
use prfence::keys::{self, fence_scsi_key_text};

fn fence_scsi() -> PathBuf {
    host_tools::ensure();
    let installed = Path::new("/usr/sbin/fence_scsi");
    if installed.exists() {
        return installed.to_owned();
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("fence_scsi"))
        .find(|p| p.exists());
    on_path.expect("fence_scsi is not installed: install fence-agents (these differential tests must not skip)")
}

struct Sandbox {
    dir: PathBuf,
    device: PathBuf,
}

impl Sandbox {
    fn new(name: &str, cluster_name: &str, nodelist: &str) -> Sandbox {
        let dir = std::env::temp_dir().join(format!("prfence-fsk-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("cluster_name"),
            format!("totem.cluster_name (str) = {cluster_name}\n"),
        )
        .unwrap();
        fs::write(dir.join("nodelist"), nodelist).unwrap();
        let d = dir.display();
        script(
            &dir.join("cmapctl"),
            &format!(
                "[ $# -gt 0 ] || exit 1\nfor prefix; do\n  case \"$prefix\" in\n  totem.cluster_name) cat '{d}/cluster_name';;\n  nodelist) cat '{d}/nodelist';;\n  *) exit 1;;\n  esac\ndone\n"
            ),
        );
        script(
            &dir.join("sg_persist"),
            "echo '  PR generation=0x0, there are NO registered reservation keys'\n",
        );
        script(&dir.join("sg_turs"), "exit 0\n");
        let device = block_device(&dir);
        Sandbox { dir, device }
    }

    fn cmapctl(&self) -> PathBuf {
        self.dir.join("cmapctl")
    }

    /// The stdin Pacemaker would send, pointed at the fakes.
    fn stdin(&self, extra: &str) -> String {
        format!(
            "action=status\nverbose=1\ndevices={}\ncorosync_cmap_path={}\nsg_persist_path={}\nsg_turs_path={}\n{extra}",
            self.device.display(),
            self.cmapctl().display(),
            self.dir.join("sg_persist").display(),
            self.dir.join("sg_turs").display(),
        )
    }

    /// The key fence_scsi derives for this stdin, as the text it passes to sg_persist.
    fn fence_scsi_key(&self, stdin: &str) -> String {
        let mut child = Command::new(fence_scsi())
            .env_remove("PCMK_service")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        self.key_from_log(&out)
    }

    fn fence_scsi_key_argv(&self, args: &[&str]) -> String {
        let out = Command::new(fence_scsi())
            .env_remove("PCMK_service")
            .args(args)
            .args(["-o", "status", "-v"])
            .arg(format!("--devices={}", self.device.display()))
            .arg(format!("--corosync-cmap-path={}", self.cmapctl().display()))
            .arg(format!(
                "--sg_persist-path={}",
                self.dir.join("sg_persist").display()
            ))
            .arg(format!(
                "--sg_turs-path={}",
                self.dir.join("sg_turs").display()
            ))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        self.key_from_log(&out)
    }

    fn key_from_log(&self, out: &std::process::Output) -> String {
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "fence_scsi status should be OFF:\n{log}"
        );
        let marker = "No registration for key ";
        let at = log
            .find(marker)
            .unwrap_or_else(|| panic!("no key in fence_scsi's log:\n{log}"));
        log[at + marker.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    }

    /// Our key for the same stdin, querying the same fake corosync-cmapctl.
    fn our_key(&self, stdin: &str) -> String {
        let req = fence_agent::parse::<&str>(&[], Some(stdin), &Environment::default()).unwrap();
        our_key_for(&req, &self.cmapctl())
    }

    fn our_key_argv(&self, args: &[&str]) -> String {
        let cmap = format!("--corosync-cmap-path={}", self.cmapctl().display());
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-o", "status", cmap.as_str()]);
        let req = fence_agent::parse(&all, None, &Environment::default()).unwrap();
        our_key_for(&req, &self.cmapctl())
    }
}

fn our_key_for(req: &fence_agent::FencePrRequest, cmapctl: &Path) -> String {
    assert_eq!(req.options.corosync_cmap_path, cmapctl);
    let key = req
        .target_key(|arg| {
            keys::query_cmapctl(
                &req.options.corosync_cmap_path,
                &[arg],
                req.options.command_timeout(),
            )
        })
        .unwrap();
    fence_scsi_key_text(key)
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn script(path: &Path, body: &str) {
    fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A block device node fence_scsi's `stat` check accepts; it is never opened.
fn block_device(dir: &Path) -> PathBuf {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    let node = dir.join("blk");
    if mknod(
        &node,
        SFlag::S_IFBLK,
        Mode::S_IRUSR | Mode::S_IWUSR,
        makedev(7, 250),
    )
    .is_ok()
    {
        return node;
    }
    fs::read_dir("/dev")
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_type().is_ok_and(|t| t.is_block_device()))
        .map(|e| e.path())
        .expect("need a block device node: run as root (mknod) or provide one in /dev")
}

const NODELIST: &str = "nodelist.local_node_pos (u32) = 0\n\
nodelist.node.0.name (str) = node1\n\
nodelist.node.0.nodeid (u32) = 1\n\
nodelist.node.0.ring0_addr (str) = 10.0.0.1\n\
nodelist.node.1.name (str) = node2.example.com\n\
nodelist.node.1.nodeid (u32) = 2\n\
nodelist.node.1.ring0_addr (str) = 10.0.0.2\n\
nodelist.node.2.name (str) = node3\n\
nodelist.node.2.nodeid (u32) = 9\n\
nodelist.node.12.name (str) = node13\n\
nodelist.node.12.nodeid (u32) = 13\n\
nodelist.node.10000.name (str) = far\n\
nodelist.node.10000.nodeid (u32) = 10001\n";

#[test]
fn id_keys_match_fence_scsi() {
    let sb = Sandbox::new("id", "mycluster", NODELIST);
    let mut seen = Vec::new();
    for node in ["node1", "node2.example.com", "node3", "node13", "far"] {
        let stdin = sb.stdin(&format!("nodename={node}\n"));
        let ours = sb.our_key(&stdin);
        assert_eq!(ours, sb.fence_scsi_key(&stdin), "node {node}");
        seen.push(ours);
    }
    // Positional index, decimal digits read as hex, 5 digits past 9999.
    assert_eq!(
        seen,
        ["6c9d0000", "6c9d0001", "6c9d0002", "6c9d0012", "6c9d10000"]
    );
}

#[test]
fn hash_keys_match_fence_scsi() {
    let sb = Sandbox::new("hash", "mycluster", NODELIST);
    for node in ["node1", "node2.example.com", "nd3", "x"] {
        let stdin = sb.stdin(&format!("nodename={node}\nkey_value=hash\n"));
        assert_eq!(sb.our_key(&stdin), sb.fence_scsi_key(&stdin), "node {node}");
    }
}

#[test]
fn leading_zeros_are_stripped_like_fence_scsi() {
    // md5("clu155") starts with "00": fence_scsi's key text loses them.
    let sb = Sandbox::new("zeros", "clu155", NODELIST);
    let stdin = sb.stdin("nodename=node2.example.com\n");
    let ours = sb.our_key(&stdin);
    assert_eq!(ours, "a70001");
    assert_eq!(ours, sb.fence_scsi_key(&stdin));
}

#[test]
fn old_ring_addr_nodelist_matches_fence_scsi() {
    let old = "nodelist.node.0.ring0_addr (str) = 10.0.0.1\n\
nodelist.node.1.ring0_addr (str) = 10.0.0.2\n\
nodelist.node.2.ring1_addr (str) = 10.1.0.3\n";
    let sb = Sandbox::new("ring", "oldcluster", old);
    for node in ["10.0.0.1", "10.0.0.2", "10.1.0.3"] {
        let stdin = sb.stdin(&format!("nodename={node}\n"));
        assert_eq!(sb.our_key(&stdin), sb.fence_scsi_key(&stdin), "node {node}");
    }
}

#[test]
fn nodename_overrides_port_like_fence_scsi() {
    let sb = Sandbox::new("prec", "mycluster", NODELIST);
    let stdin = sb.stdin("port=node1\nnodename=node3\n");
    let ours = sb.our_key(&stdin);
    assert_eq!(ours, sb.fence_scsi_key(&stdin));
    let node3_only = sb.stdin("nodename=node3\n");
    assert_eq!(ours, sb.our_key(&node3_only));
    // plug alone is used when nodename is absent.
    let stdin = sb.stdin("plug=node1\n");
    assert_eq!(sb.our_key(&stdin), sb.fence_scsi_key(&stdin));
}

#[test]
fn command_line_forms_match_fence_scsi() {
    let sb = Sandbox::new("argv", "mycluster", NODELIST);
    for args in [
        &["-n", "node3"][..],
        &["--plug=node13"][..],
        &["--nodename", "node1"][..],
        &["-n", "node1", "--key-value=hash"][..],
    ] {
        assert_eq!(
            sb.our_key_argv(args),
            sb.fence_scsi_key_argv(args),
            "{args:?}"
        );
    }
}

#[test]
fn explicit_keys_match_fence_scsi_text() {
    let sb = Sandbox::new("explicit", "mycluster", NODELIST);
    for key in ["abc", "00ab12", "deadbeef"] {
        let stdin = sb.stdin(&format!("key={key}\n"));
        assert_eq!(sb.our_key(&stdin), sb.fence_scsi_key(&stdin), "key {key}");
    }
}

#[test]
fn metadata_accepts_every_fence_scsi_parameter() {
    // pcs refuses parameters missing from the metadata, so every fence_scsi parameter must be
    // in ours for an existing configuration to carry over.
    let out = Command::new(fence_scsi())
        .args(["-o", "metadata"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let theirs = String::from_utf8(out.stdout).unwrap();
    let ours = prfence::fence_agent::metadata::metadata_xml("fence_pr");
    let names = |xml: &str| -> Vec<String> {
        xml.split("<parameter name=\"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap().to_owned())
            .collect()
    };
    let ours = names(&ours);
    for name in names(&theirs) {
        assert!(
            ours.contains(&name),
            "fence_scsi parameter {name} missing from fence_pr metadata"
        );
    }
}

#[test]
fn stdin_edge_cases_match_fence_scsi() {
    let sb = Sandbox::new("edges", "mycluster", NODELIST);
    for extra in [
        "nodename=\"node3\"\n",
        "   nodename=node13   \n",
        "#nodename=node1\nnodename=node3\n",
        "nodename=node1\r\nport=node3\r\n",
        "nodename=node1\nnodename=node13\n",
        "unknown_option=1\nsuppress-errors=1\nnodename=node3\n",
        "plug=node1\nkey-value=hash\n",
    ] {
        let stdin = sb.stdin(extra);
        assert_eq!(sb.our_key(&stdin), sb.fence_scsi_key(&stdin), "{extra:?}");
    }
}

#[test]
fn reboot_is_refused_like_fence_scsi() {
    let out = Command::new(fence_scsi())
        .args(["-o", "reboot", "-n", "node1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let theirs = String::from_utf8_lossy(&out.stderr);
    assert!(
        theirs.contains("Failed: Unrecognised action 'reboot'"),
        "{theirs}"
    );
    let ours = fence_agent::parse(
        &["-o", "reboot", "-n", "node1"],
        None,
        &Environment::default(),
    )
    .unwrap_err();
    assert!(
        ours.to_string()
            .starts_with("Failed: Unrecognised action 'reboot'"),
        "{ours}"
    );
    assert_eq!(ours.exit_code().code(), 1);
}

/// name → (content type, default) from a metadata document.
fn content_by_name(xml: &str) -> Vec<(String, String, Option<String>)> {
    xml.split("<parameter name=\"")
        .skip(1)
        .map(|chunk| {
            let name = chunk.split('"').next().unwrap().to_owned();
            let content = chunk.split("<content ").nth(1).unwrap();
            let content = content.split("/>").next().unwrap();
            let attr = |a: &str| {
                content
                    .split(&format!("{a}=\""))
                    .nth(1)
                    .map(|v| v.split('"').next().unwrap().to_owned())
            };
            (name, attr("type").unwrap(), attr("default"))
        })
        .collect()
}

#[test]
fn metadata_types_and_defaults_match_fence_scsi() {
    let out = Command::new(fence_scsi())
        .args(["-o", "metadata"])
        .output()
        .unwrap();
    let theirs = content_by_name(&String::from_utf8(out.stdout).unwrap());
    let ours = content_by_name(&prfence::fence_agent::metadata::metadata_xml("fence_pr"));
    assert!(
        theirs.len() > 30,
        "parsed too few fence_scsi parameters: {theirs:?}"
    );
    for (name, ty, default) in &theirs {
        let mine = ours
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!((&mine.1, &mine.2), (ty, default), "parameter {name}");
    }
}
