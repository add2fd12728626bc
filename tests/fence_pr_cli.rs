//! The built binary invoked as `fence_pr` (a symlink named so, as packaging installs it): the
//! argv[0] dispatch, both input forms of the Fence Agent API, exit codes, and the actions that
//! need no SCSI device (this host has none; the lab covers the rest).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Agent {
    dir: tempfile::TempDir,
}

impl Agent {
    fn new() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        symlink(env!("CARGO_BIN_EXE_prfence"), dir.path().join("fence_pr")).unwrap();
        Agent { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(self.path("fence_pr"));
        // Each run has its own key store and is not under pacemaker-fenced.
        command
            .env("FENCE_PR_STORE", self.path("store/cluster"))
            .env_remove("PCMK_service");
        command
    }

    fn args(&self, args: &[&str]) -> Output {
        self.command().args(args).output().unwrap()
    }

    fn stdin(&self, lines: &str) -> Output {
        self.stdin_bytes(lines.as_bytes().to_vec())
    }

    /// Runs the agent with `bytes` on its stdin; the agent may stop reading early (an error), so a
    /// write that fails on the closed pipe is expected.
    fn stdin_bytes(&self, bytes: Vec<u8>) -> Output {
        let mut child = self
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        out
    }

    /// A fake `corosync-cmapctl` answering the two queries key derivation and `list` make, one
    /// prefix after the other as the real one does.
    fn fake_cmapctl(&self) -> PathBuf {
        let path = self.path("corosync-cmapctl");
        std::fs::write(
            &path,
            "#!/bin/sh\n[ $# -gt 0 ] || exit 1\nfor prefix; do case \"$prefix\" in\n\
             totem.cluster_name) echo 'totem.cluster_name (str) = lab' ;;\n\
             nodelist) printf 'nodelist.local_node_pos (u32) = 0\\n\
nodelist.node.0.name (str) = node1\\nnodelist.node.0.nodeid (u32) = 1\\n\
nodelist.node.1.name (str) = node2\\nnodelist.node.1.nodeid (u32) = 2\\n' ;;\n\
             *) exit 1 ;;\nesac; done\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap()
}

#[test]
fn metadata_on_the_command_line_and_on_stdin() {
    let agent = Agent::new();
    for out in [
        agent.args(&["-o", "metadata"]),
        agent.stdin("action=metadata\n"),
    ] {
        assert_eq!(code(&out), 0, "{}", text(&out.stderr));
        let xml = text(&out.stdout);
        assert!(xml.starts_with("<?xml"), "{xml}");
        assert!(xml.contains("<resource-agent name=\"fence_pr\""));
        assert!(!xml.contains("\"reboot\""));
    }
}

#[test]
fn validate_all_accepts_good_options_and_rejects_bad_ones() {
    let agent = Agent::new();
    let out = agent.stdin("action=validate-all\nnodename=node1\ndevices=/dev/sdb\n");
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    let out = agent.stdin("action=validate-all\nkey_value=bogus\n");
    assert_eq!(code(&out), 1);
    let err = text(&out.stderr);
    assert!(
        err.contains("key-value") && err.contains("nodename or key"),
        "{err}"
    );
}

#[test]
fn argument_errors_and_reboot_exit_1() {
    let agent = Agent::new();
    let out = agent.args(&["-o", "off", "--bogus"]);
    assert_eq!(code(&out), 1);
    assert!(text(&out.stderr).contains("option --bogus not recognized"));
    let out = agent.args(&["-o", "reboot", "-n", "node1"]);
    assert_eq!(code(&out), 1);
    assert!(text(&out.stderr).contains("Unrecognised action 'reboot'"));
    // Pacemaker's form of the same request.
    let out = agent.stdin("action=reboot\nnodename=node1\n");
    assert_eq!(code(&out), 1);
}

#[test]
fn help_and_version() {
    let agent = Agent::new();
    let out = agent.args(&["--help"]);
    assert_eq!(code(&out), 0);
    assert!(text(&out.stdout).contains("--devices"));
    let out = agent.args(&["-V"]);
    assert_eq!(code(&out), 0);
    assert!(text(&out.stdout).starts_with("fence_pr "));
}

#[test]
fn list_prints_the_corosync_nodes() {
    let agent = Agent::new();
    let cmapctl = agent.fake_cmapctl();
    let out = agent.stdin(&format!(
        "action=list\ncorosync_cmap_path={}\n",
        cmapctl.display()
    ));
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "node1,node1\nnode2,node2\n");
    // A corosync that cannot be run is a failure, never an empty list.
    let out = agent.args(&["-o", "list", "--corosync-cmap-path=/nonexistent/cmapctl"]);
    assert_eq!(code(&out), 1);
    assert!(text(&out.stdout).is_empty());
    assert!(text(&out.stderr).contains("/nonexistent/cmapctl"));
}

#[test]
fn off_without_unfencing_first_fails_and_names_the_key_file() {
    let agent = Agent::new();
    let cmapctl = agent.fake_cmapctl();
    let out = agent.args(&[
        "-o",
        "off",
        "-n",
        "node2",
        "-d",
        "/nonexistent/sdz",
        "--corosync-cmap-path",
        cmapctl.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 1);
    let err = text(&out.stderr);
    assert!(
        err.contains(&agent.path("store/cluster.key").display().to_string()),
        "{err}"
    );
}

#[test]
fn status_of_a_vanished_device_is_an_error_and_logs_go_to_the_files() {
    let agent = Agent::new();
    let logfile = agent.path("fence.log");
    let debug = agent.path("debug.log");
    let out = agent.stdin(&format!(
        "action=status\nkey=0x1234\ndevices=/nonexistent/sdz\nlogfile={}\ndebug_file={}\nquiet=1\n",
        logfile.display(),
        debug.display()
    ));
    assert_eq!(code(&out), 1);
    assert!(text(&out.stderr).is_empty(), "quiet: {}", text(&out.stderr));
    let log = std::fs::read_to_string(&logfile).unwrap();
    assert!(
        log.contains("/nonexistent/sdz") && log.contains("Failed"),
        "{log}"
    );
    assert!(Path::new(&debug).exists());
}

/// Issue 44: `devices=` naming something that is no disk (a typo) is refused before it is
/// opened, by status and by off (where the lone LU is the arbiter, so off tries it), and the
/// output says what the path is. Opening /dev/watchdog would arm it (the lab's
/// `faults::a_watchdog_in_the_device_list_is_refused_unopened` shows that it stays idle).
#[test]
fn status_and_off_refuse_devices_that_are_not_disks() {
    let agent = Agent::new();
    let cmapctl = agent.fake_cmapctl();
    std::fs::create_dir_all(agent.path("store")).unwrap();
    std::fs::write(agent.path("store/cluster.key"), "1234\n").unwrap();
    let dir = agent.dir.path().display().to_string();
    for (path, kind) in [
        ("/dev/null", "a character device 1:3"),
        (dir.as_str(), "a directory"),
    ] {
        for (action, whose) in [("status", "key=0x1234"), ("off", "plug=node2")] {
            let out = agent.stdin(&format!(
                "action={action}\n{whose}\ndevices={path}\ncorosync_cmap_path={}\n",
                cmapctl.display()
            ));
            let err = text(&out.stderr);
            assert_eq!(code(&out), 1, "{action} {path}: {err}");
            assert!(
                err.contains(&format!("{path} is {kind}, not a disk"))
                    && err.contains("not opened"),
                "{action} {path}: {err}"
            );
        }
    }
}

#[test]
fn prfence_name_keeps_the_admin_cli() {
    let out = Command::new(env!("CARGO_BIN_EXE_prfence"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0);
    assert!(text(&out.stdout).contains("unfence"));
}

/// Issue #10 item 3: bad input at the door is a clear error with exit 1 (fence_pr) or 2
/// (prfence usage), never a panic (101).
#[test]
fn fence_pr_refuses_bad_input_with_exit_1() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let agent = Agent::new();
    let out = agent
        .command()
        .args([OsStr::new("-o"), OsStr::from_bytes(b"\xff")])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("argument 2 is not valid UTF-8"));

    let out = agent.stdin_bytes(b"action=status\nkey=1\ndevices=/dev/sd\xff\n".to_vec());
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("line 3 of stdin is not valid UTF-8"));

    let mut huge = b"action=status\nkey=1\ndevices=".to_vec();
    huge.resize(20_000_000, b'a');
    let started = std::time::Instant::now();
    let out = agent.stdin_bytes(huge);
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("line 3 of stdin is longer than"));
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());

    let devices: Vec<String> = (0..3000).map(|i| format!("/dev/sd{i}")).collect();
    let out = agent.stdin(&format!(
        "action=status\nkey=1\ndevices={}\n",
        devices.join(",")
    ));
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("3000 devices given; at most 1024"));

    let out = agent.args(&["-o", "status", "-k", "1", "--power-timeout", "99999999999"]);
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--power-timeout is too large"));
    let out = agent.stdin("action=status\nkey=1\ndelay=-1\n");
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--delay is not a valid time"));
}

#[test]
fn prfence_refuses_bad_arguments_as_usage_errors() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let prfence = || Command::new(env!("CARGO_BIN_EXE_prfence"));
    let out = prfence()
        .args(["--timeout", "0.0000000001", "keys", "/nonexistent/sdz"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("at least 1 ms"));
    let out = prfence()
        .args([
            OsStr::new("--timeout"),
            OsStr::from_bytes(b"\xff"),
            OsStr::new("keys"),
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    // A device path need not be UTF-8: it is tried and fails like any missing device.
    let out = prfence()
        .args([
            OsStr::new("keys"),
            OsStr::from_bytes(b"/nonexistent/sd\xff"),
        ])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1, "{}", text(&out.stderr));
    let devices: Vec<String> = (0..1025).map(|i| format!("/nonexistent/sd{i}")).collect();
    let out = prfence().arg("keys").args(&devices).output().unwrap();
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("1025 devices given; at most 1024"));
}

/// `PRFENCE_LOG` overrides the agent's `log.level`: `--check-config` (the unit's ExecStartPre=,
/// run with the same environment) refuses a bad one as a start would, and ignores it unset or
/// empty.
#[test]
fn prfence_agent_check_config_judges_prfence_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "mode = \"watch\"\n[[device]]\npath = \"/dev/sdb\"\n[key]\nvalue = \"0xabc\"\n",
    )
    .unwrap();
    let check = |log: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_prfence"));
        command
            .args(["agent", "--check-config", "--config"])
            .arg(&config)
            .env_remove("WATCHDOG_USEC")
            .env_remove("PRFENCE_LOG");
        if let Some(log) = log {
            command.env("PRFENCE_LOG", log);
        }
        command.output().unwrap()
    };
    for fine in [None, Some(""), Some("debug"), Some("info,prfence=trace")] {
        let out = check(fine);
        assert_eq!(code(&out), 0, "{fine:?}: {}", text(&out.stderr));
    }
    let out = check(Some("prfence=loud"));
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("PRFENCE_LOG=\"prfence=loud\""), "{stderr}");
    assert!(stderr.contains("unset it"), "{stderr}");
}
