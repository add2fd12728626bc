//! For host-side tests that run a real tool (xmllint, fence_scsi): install what a fresh machine
//! lacks, once per test binary, so that `cargo test` alone works there. A failure here fails
//! the test that needed the tool; it never skips it.

use std::process::Command;
use std::sync::OnceLock;

pub fn ensure() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let result = DONE.get_or_init(|| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/lab/host-tools.sh");
        match Command::new("bash").arg(script).status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("{script} failed ({s})")),
            Err(e) => Err(format!("cannot run {script}: {e}")),
        }
    });
    if let Err(e) = result {
        panic!("host tools missing: {e}");
    }
}
