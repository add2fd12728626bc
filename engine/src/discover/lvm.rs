//! Device discovery from LVM when no devices are given, as fence_scsi does: the physical volumes
//! of clustered (clvmd) and shared (lvmlockd) volume groups.
//!
//! fence_scsi 4.12.1 runs `vgs --noheadings --separator : --sort pv_uuid --options
//! vg_attr,pv_name --config 'global { locking_type = 0 } devices { preferred_names = [ "^/dev/dm"
//! ] }'` and keeps a line when `c` appears anywhere in its vg_attr field — which also matches the
//! allocation-policy letter `c` (contiguous) at position 5, a false positive. We run the same
//! command (no locking, so a dead node's locks cannot block discovery; `/dev/dm-N` names, which
//! [`super::Discovery`] expands to their paths) and keep a PV when the 6th vg_attr letter, the
//! one vgs(8) defines as "(c)lustered, (s)hared", is `c` or `s` (fence-agents HEAD also accepts
//! `s`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{RunError, run_bounded};

/// Arguments given to `vgs` (after the program path).
pub const VGS_ARGS: &[&str] = &[
    "--noheadings",
    "--separator",
    ":",
    "--sort",
    "pv_uuid",
    "--options",
    "vg_attr,pv_name",
    "--config",
    "global { locking_type = 0 } devices { preferred_names = [ \"^/dev/dm\" ] }",
];

/// Running `vgs` failed.
#[derive(Debug, thiserror::Error)]
#[error("running {} {}: {reason}; check vgs_path, or give devices explicitly", program.display(), VGS_ARGS.join(" "))]
pub struct LvmError {
    /// The vgs binary run.
    pub program: PathBuf,
    /// What went wrong (spawn error, exit status with stderr, timeout).
    pub reason: String,
}

/// The PVs of clustered or shared VGs in `vgs` output made with [`VGS_ARGS`], in output order,
/// each once. Lines look like `  wz--nc:/dev/dm-0`; a line that does not is skipped.
pub fn parse_vgs(output: &str) -> Vec<PathBuf> {
    let mut pvs: Vec<PathBuf> = Vec::new();
    for line in output.lines() {
        let Some((attr, pv)) = line.split_once(':') else {
            continue;
        };
        let pv = pv.trim();
        let clustered_or_shared = matches!(attr.trim().chars().nth(5), Some('c' | 's'));
        if clustered_or_shared && !pv.is_empty() && !pvs.iter().any(|p| p.as_os_str() == pv) {
            pvs.push(PathBuf::from(pv));
        }
    }
    pvs
}

/// Runs `vgs` (at `program`) with [`VGS_ARGS`] and returns [`parse_vgs`] of its output. With a
/// timeout, a run still going after it is killed and reported as a failure.
pub fn shared_pvs(program: &Path, timeout: Option<Duration>) -> Result<Vec<PathBuf>, LvmError> {
    let fail = |reason: String| LvmError {
        program: program.to_owned(),
        reason,
    };
    let stdout = run_bounded(program, VGS_ARGS, timeout).map_err(|e| match e {
        RunError::TimedOut(after) => fail(format!(
            "timed out after {after:?}; is LVM blocked on a lock or a dead device?"
        )),
        other => fail(other.to_string()),
    })?;
    Ok(parse_vgs(&String::from_utf8_lossy(&stdout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_clustered_and_shared_vgs_only() {
        let out = "  wz--nc:/dev/dm-0\n  wz--n-:/dev/sda2\n  wz--ns:/dev/sdb\n  wz--cn:/dev/sdc\n\
                   \n  garbage\n  wz--nc:/dev/dm-0\n  wz--nc:\n  wz--nc:/dev/sdd1  \n";
        assert_eq!(
            parse_vgs(out),
            ["/dev/dm-0", "/dev/sdb", "/dev/sdd1"]
                .map(PathBuf::from)
                .to_vec()
        );
        assert!(parse_vgs("").is_empty());
    }

    fn script(name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap().keep();
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn runs_vgs_reports_failures_and_times_out() {
        // The fake vgs checks it got fence_scsi's arguments.
        let ok = script(
            "vgs",
            "[ \"$*\" = '--noheadings --separator : --sort pv_uuid --options vg_attr,pv_name \
             --config global { locking_type = 0 } devices { preferred_names = [ \"^/dev/dm\" ] }' ] \
             || { echo \"bad args: $*\" >&2; exit 3; }\necho '  wz--nc:/dev/dm-1'\n",
        );
        assert_eq!(
            shared_pvs(&ok, Some(Duration::from_secs(5))).unwrap(),
            vec![PathBuf::from("/dev/dm-1")]
        );
        let bad = script("vgs", "echo 'No volume groups found' >&2; exit 5\n");
        let err = shared_pvs(&bad, None).unwrap_err().to_string();
        assert!(
            err.contains("No volume groups found") && err.contains("vgs_path"),
            "{err}"
        );
        let slow = script("vgs", "exec sleep 5\n");
        let err = shared_pvs(&slow, Some(Duration::from_millis(200))).unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
        assert!(shared_pvs(Path::new("/nonexistent/vgs"), None).is_err());
        for p in [ok, bad, slow] {
            std::fs::remove_dir_all(p.parent().unwrap()).unwrap();
        }
    }
}
