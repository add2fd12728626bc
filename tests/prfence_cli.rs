//! The built `prfence` binary, for behaviour that needs no SCSI device (the lab covers the rest).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// An invalid `PRFENCE_LOG` is said on stderr, not silently replaced by the default level.
#[test]
fn an_invalid_prfence_log_is_said() {
    let out = Command::new(env!("CARGO_BIN_EXE_prfence"))
        .args(["keys", "/nonexistent/prfence-test-device"])
        .env("PRFENCE_LOG", "prfence=loud")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("PRFENCE_LOG=\"prfence=loud\" is not a tracing filter"),
        "{stderr}"
    );
    // Unset or empty: nothing said about it.
    let out = Command::new(env!("CARGO_BIN_EXE_prfence"))
        .args(["keys", "/nonexistent/prfence-test-device"])
        .env("PRFENCE_LOG", "")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("PRFENCE_LOG"));
}

/// Issue 44: a path that names no disk is refused before it is opened (opening a character
/// device can act: /dev/watchdog arms on open), and the error says what the path is, in text and
/// in JSON.
#[test]
fn keys_refuses_what_is_not_a_disk_saying_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().to_str().unwrap().to_owned();
    for (path, kind) in [
        ("/dev/null", "a character device 1:3"),
        (dir.as_str(), "a directory"),
    ] {
        let said = format!("{path} is {kind}, not a disk");
        let out = Command::new(env!("CARGO_BIN_EXE_prfence"))
            .args(["keys", path])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&said) && stderr.contains("not opened"),
            "{stderr}"
        );
        let out = Command::new(env!("CARGO_BIN_EXE_prfence"))
            .args(["--json", "keys", path])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let error = &json[0]["error"];
        assert_eq!(error["kind"], "open", "{json}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(&said), "{message}");
    }
}

/// Issue 44: SIGHUP (the unit's reload) and SIGTERM in the agent's first moments, before its
/// handlers are up (discovery of 1024 devices takes a while), neither kill it nor get lost: a
/// SIGHUP is a reload once it runs, a SIGTERM a clean stop (exit 0). SIGHUP's default action
/// used to end the process.
#[test]
fn signals_at_the_agent_s_start_are_handled_not_fatal() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    let mut text = String::from("mode = \"watch\"\n");
    for i in 0..1024 {
        text += &format!("[[device]]\npath = \"/dev/prfence-test-nonexistent-{i}\"\n");
    }
    text += "[key]\nvalue = \"0xabc\"\n[log]\ntarget = \"stderr\"\n[systemd]\nnotify = false\n";
    let mut file = std::fs::File::create(&config).unwrap();
    file.write_all(text.as_bytes()).unwrap();
    drop(file);
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    for signal in [Signal::SIGHUP, Signal::SIGTERM] {
        let mut agent = Command::new(env!("CARGO_BIN_EXE_prfence"))
            .args(["agent", "--config"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = Pid::from_raw(i32::try_from(agent.id()).unwrap());
        // After the process's own start-up (the loader, main's first lines: until the agent
        // blocks the signals, or 20 ms), then all along the agent's.
        let blocked = || {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigBlk:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & 1 != 0)
        };
        let start = Instant::now();
        while !blocked() && start.elapsed() < Duration::from_millis(20) {
            std::thread::sleep(Duration::from_micros(200));
        }
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until && agent.try_wait().unwrap().is_none() {
            let _ = kill(pid, signal);
            std::thread::sleep(Duration::from_millis(1));
        }
        if signal == Signal::SIGHUP {
            std::thread::sleep(Duration::from_millis(500));
            let early = agent.try_wait().unwrap();
            let _ = kill(pid, Signal::SIGTERM);
            let status = agent.wait().unwrap();
            let stderr = std::io::read_to_string(agent.stderr.take().unwrap()).unwrap();
            assert_eq!(early, None, "SIGHUP at the start ended the agent: {stderr}");
            assert_eq!(status.code(), Some(0), "{stderr}");
        } else {
            let status = agent.wait().unwrap();
            let stderr = std::io::read_to_string(agent.stderr.take().unwrap()).unwrap();
            assert_eq!(
                status.code(),
                Some(0),
                "SIGTERM at the start: {status}: {stderr}"
            );
        }
    }
}

/// Issue 44: the packaged agent.toml passes the unit's `ExecStartPre=` (`--check-config`) on a
/// node whose watchdog driver is not loaded: the agent starts, its watchdog shown degraded and
/// tried again once armed, instead of the unit failing with the file it ships.
#[test]
fn the_packaged_config_passes_check_config_without_a_watchdog_device() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/prfence-agent.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_prfence"))
        .args(["agent", "--config", config, "--check-config"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    if !std::path::Path::new("/dev/watchdog0").exists() {
        assert!(
            stdout.contains("watchdog.device /dev/watchdog0 is not there (yet)"),
            "{stdout}"
        );
    }
}
