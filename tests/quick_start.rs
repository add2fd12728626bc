//! README's quick start, run as written with the cluster-side commands (`apt-get`, `systemctl`,
//! `pcs`) recorded instead of run, and `/etc/prfence/` moved to a scratch directory: the agent
//! configuration it writes must pass the real `prfence agent --check-config`, and watch the key the
//! fence device it creates registers. Running it on a cluster is the lab's part (not yet built:
//! README says so).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const README: &str = include_str!("../README.md");
const EVERY_NODE: &str = "<!-- quick-start: every node -->";
const ONE_NODE: &str = "<!-- quick-start: one node -->";

/// The quick start's blocks in order: (marker, the commands of the ```sh block after it).
fn blocks() -> Vec<(&'static str, String)> {
    let mut blocks = Vec::new();
    let mut lines = README.lines();
    while let Some(line) = lines.next() {
        let marker = match line.trim() {
            EVERY_NODE => EVERY_NODE,
            ONE_NODE => ONE_NODE,
            _ => continue,
        };
        assert_eq!(
            lines.next(),
            Some("```sh"),
            "{marker} must precede a ```sh block"
        );
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push((marker, body.join("\n")));
    }
    blocks
}

/// The site-specific values the quick start asks to set first (the ```sh block before the first
/// marked one).
fn site_values() -> String {
    let start = README
        .find("## Quick start")
        .expect("README has a quick start");
    let rest = &README[start..];
    let block = rest.find("```sh\n").expect("a block of site values") + "```sh\n".len();
    let end = rest[block..].find("```").expect("its end");
    rest[block..block + end].to_owned()
}

fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn the_quick_start_configures_an_agent_that_watches_the_key_its_fence_device_registers() {
    let blocks = blocks();
    assert!(
        blocks.iter().any(|(m, _)| *m == EVERY_NODE) && blocks.iter().any(|(m, _)| *m == ONE_NODE),
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
        site_values(),
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
        "pcs [property] [set] [stonith-enabled=true]",
        "prfence [agent] [--config]",
        "[--once]",
    ] {
        assert!(calls.contains(call), "{call} not run: {calls}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
