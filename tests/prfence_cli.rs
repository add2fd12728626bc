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
