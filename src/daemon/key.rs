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
        host.cmapctl(Path::new(COROSYNC_CMAPCTL), arg, Some(timeout))
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
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::daemon::config::{ModeSettings, Settings};
    use crate::discover::{DiscoverError, Lu, Resolution};
    use crate::fence_agent::{self, Environment};
    use crate::keys::KeyError;
    use crate::process::RunError;
    use crate::transport::{CommandError, Policy, PrTransport};

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

    /// Node `node2` of a cluster: its name and its corosync; nothing else is asked of it.
    struct Node2;

    impl Host for Node2 {
        fn resolve(&self, _: &[PathBuf]) -> Result<Vec<Lu>, DiscoverError> {
            unreachable!()
        }
        fn resolve_each(&self, _: &[PathBuf]) -> Result<Resolution, DiscoverError> {
            unreachable!()
        }
        fn resolve_lvm_each(
            &self,
            _: &Path,
            _: Option<Duration>,
        ) -> Result<Resolution, DiscoverError> {
            unreachable!()
        }
        fn open(&self, _: &Path, _: Policy) -> Result<Arc<dyn PrTransport>, CommandError> {
            unreachable!()
        }
        fn cmapctl(&self, _: &Path, arg: &str, _: Option<Duration>) -> Result<String, KeyError> {
            cmap(arg)
        }
        fn run_bounded(
            &self,
            _: &Path,
            _: &[String],
            _: Option<Duration>,
        ) -> Result<Vec<u8>, RunError> {
            unreachable!()
        }
        fn hostname(&self) -> std::io::Result<String> {
            Ok("node2".to_owned())
        }
        fn sleep(&self, _: Duration) {
            unreachable!()
        }
        fn reboot_now(&self) -> std::io::Error {
            unreachable!()
        }
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
        let agent = resolve_key(&watch.key, Duration::from_secs(1), &Node2).unwrap();
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
