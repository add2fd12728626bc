//! README's quick start, run as written with the cluster-side commands (`apt-get`, `systemctl`,
//! `pcs`) recorded instead of run, and `/etc/prfence/` moved to a scratch directory: the agent
//! configuration it writes must pass the real `prfence agent --check-config`, and watch the key the
//! fence device it creates registers, in seconds and without root. The lab's cluster suite runs
//! the same blocks on two real nodes (`cluster::quick_start_as_written`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

#[path = "common/doc_blocks.rs"]
#[allow(dead_code)] // each test binary uses part of it
mod doc_blocks;

use doc_blocks::{README, Where};

fn blocks() -> Result<Vec<(Where, String)>, String> {
    doc_blocks::blocks(README, "quick-start")
}

fn site_values() -> Result<String, String> {
    doc_blocks::site_values(README, "quick-start")
}

fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn the_quick_start_configures_an_agent_that_watches_the_key_its_fence_device_registers() {
    let blocks = blocks().unwrap();
    assert!(
        blocks.iter().any(|(w, _)| *w == Where::EveryNode)
            && blocks.iter().any(|(w, _)| *w == Where::OneNode),
        "README's quick start has blocks for every node and for one node: {blocks:?}"
    );
    let dir = std::env::temp_dir().join(format!("prfence-quick-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (bin, etc) = (dir.join("bin"), dir.join("etc"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    let log = dir.join("calls");
    // Recorded, not run: installing, the init system and the cluster's configuration tool.
    for tool in ["apt-get", "dnf", "systemctl", "pcs"] {
        write_executable(
            &bin.join(tool),
            &format!(
                "#!/bin/sh\nprintf '%s' {tool} >>{log}\nfor a; do printf ' [%s]' \"$a\" >>{log}; \
                 done\necho >>{log}\n",
                log = log.display()
            ),
        );
    }
    // prfence itself: the real binary for the agent's configuration check; the commands that
    // read LUs (doctor, keys, --once) are recorded, as there are none here.
    write_executable(
        &bin.join("prfence"),
        &format!(
            "#!/bin/sh\nif [ \"$1\" = agent ] && [ \"$4\" = --check-config ]; then exec {real} \"$@\"; \
             fi\nprintf '%s' prfence >>{log}\nfor a; do printf ' [%s]' \"$a\" >>{log}; done\necho \
             >>{log}\n",
            real = env!("CARGO_BIN_EXE_prfence"),
            log = log.display()
        ),
    );
    let script = format!(
        "set -eu\n{}\n{}",
        site_values().unwrap(),
        blocks
            .iter()
            .map(|(_, body)| body.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    )
    .replace("/etc/prfence/", &format!("{}/", etc.display()));
    let run = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .env_remove("PRFENCE_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "the quick start failed ({}):\n{stdout}\n{stderr}\nscript:\n{script}",
        run.status
    );
    assert!(
        stdout.contains("agent.toml: valid (watch mode, 2 device(s)"),
        "--check-config: {stdout}"
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    let config = std::fs::read_to_string(etc.join("agent.toml")).unwrap();
    // The agent watches the shared LUs, with the key fence_pr registers by default
    // (key_value=id: fence_scsi's derivation), and the fence device names the same LUs.
    assert!(
        config.contains("path = \"/dev/mapper/mpatha\"")
            && config.contains("path = \"/dev/mapper/mpathb\"")
            && config.contains("derive = \"fence_scsi\""),
        "{config}"
    );
    let create = calls
        .lines()
        .find(|l| l.starts_with("pcs [stonith] [create]"))
        .unwrap_or_else(|| panic!("no `pcs stonith create`: {calls}"));
    for arg in [
        "[fence_pr]",
        "[devices=/dev/mapper/mpatha,/dev/mapper/mpathb]",
        "[pcmk_host_list=node1 node2]",
        // the registrations outlive a target's power loss (docs/pacemaker.md)
        "[aptpl=1]",
        "[meta] [provides=unfencing]",
    ] {
        assert!(create.contains(arg), "{arg} missing: {create}");
    }
    assert!(
        !create.contains("key_value") && !create.contains("[key="),
        "a key option changes fence_pr's key away from what the agent derives: {create}"
    );
    for call in [
        "systemctl [enable] [--now] [prfence-agent]",
        "pcs [property] [set] [stonith-enabled=true] [stonith-action=off] [fence-reaction=panic]",
        "prfence [capabilities] [/dev/mapper/mpatha] [/dev/mapper/mpathb]",
        "prfence [agent] [--config]",
        "[--once]",
        "prfence [doctor] [--config]",
    ] {
        assert!(calls.contains(call), "{call} not run: {calls}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
