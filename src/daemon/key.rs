//! Our key in watch mode, as the configuration gives it or as fence_pr derives it.

use std::path::Path;
use std::time::Duration;

use super::config::KeySpec;
use crate::host::Host;
use crate::keys::{COROSYNC_CMAPCTL, derive_key_via};
use crate::pr::Key;

/// Our key in watch mode: given, or derived as fence_pr derives it (asks corosync through `host`).
pub fn resolve_key(spec: &KeySpec, timeout: Duration, host: &dyn Host) -> Result<Key, String> {
    let (scheme, node) = match spec {
        KeySpec::Given(key) => return Ok(*key),
        KeySpec::Derive { scheme, node } => (scheme, node),
    };
    let node = match node {
        Some(node) => node.clone(),
        None => host
            .hostname()
            .map_err(|e| format!("cannot read this host's name ({e}); set key.node"))?,
    };
    derive_key_via(&node, *scheme, |arg| {
        host.cmapctl(Path::new(COROSYNC_CMAPCTL), &[arg], Some(timeout))
    })
    .map(Key::new)
    .map_err(|e| {
        format!(
            "deriving the key of node {node:?}: {e} (set key.node to the corosync node name if \
             it differs from the host name, or give key.value)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::config::{ModeSettings, Settings};
    use crate::fence_agent::{self, Environment};
    use crate::keys::KeyError;
    use crate::testing::ModelHost;

    const CMAP_NAME: &str = "totem.cluster_name (str) = lab\n";
    const CMAP_NODES: &str = "nodelist.local_node_pos (u32) = 1\n\
        nodelist.node.0.name (str) = node1\n\
        nodelist.node.0.nodeid (u32) = 1\n\
        nodelist.node.1.name (str) = node2\n\
        nodelist.node.1.nodeid (u32) = 2\n";

    fn cmap(arg: &str) -> Result<String, KeyError> {
        match arg {
            "totem.cluster_name" => Ok(CMAP_NAME.to_owned()),
            "nodelist" => Ok(CMAP_NODES.to_owned()),
            other => panic!("unexpected cmapctl query {other}"),
        }
    }

    /// Node `node2` of a cluster: its name and its corosync.
    fn node2() -> ModelHost {
        let host = ModelHost::new().with_hostname("node2");
        host.set_corosync("totem.cluster_name", CMAP_NAME);
        host.set_corosync("nodelist", CMAP_NODES);
        host
    }

    /// The packaged agent configuration watches the key that fence_pr, created with no key
    /// options, registers when pacemaker-fenced unfences this node.
    #[test]
    fn the_packaged_config_watches_the_key_fence_pr_registers_by_default() {
        let settings =
            Settings::from_toml_str(include_str!("../../packaging/prfence-agent.toml")).unwrap();
        let ModeSettings::Watch(watch) = settings.mode else {
            panic!("the packaged configuration is in watch mode")
        };
        let agent = resolve_key(&watch.key, Duration::from_secs(1), &node2()).unwrap();
        let unfence = fence_agent::parse::<&str>(
            &[],
            Some("action=on\nport=node2\nnodename=node2\ndevices=/dev/mapper/mpatha\n"),
            &Environment::default(),
        )
        .unwrap();
        let registered = unfence.target_key(cmap).unwrap();
        assert_eq!(agent, Key::new(registered));
        // fence_scsi's id key: node2 is at position 1 of the nodelist.
        assert_eq!(registered & 0xffff, 1);
    }
}
