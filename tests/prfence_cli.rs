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
