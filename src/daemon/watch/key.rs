//! Our key in watch mode, as the configuration gives it or as fence_pr derives it, and the
//! wait for it: with `key.derive` the agent starts before the cluster stack does (an admin may
//! leave it disabled at boot after a fence and start it by hand, and Pacemaker then unfences this
//! node through fence_pr), so the driver asks again at every check until corosync answers
//! (`driver::wait_for_key`).
//! Who this node is, and so which key, is decided by [`crate::whoami`].

use std::path::Path;
use std::time::Duration;

use crate::daemon::config::KeySpec;
use crate::fence_agent::store::KeyStore;
use crate::host::Host;
use crate::keys::{CLUSTER_NAME_QUERY, COROSYNC_CMAPCTL, KeyError, NODELIST_QUERY};
use crate::pr::Key;
use crate::whoami::{Identity, WhoAmIError, who_am_i};

/// Our key, and who we are when it was derived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OurKey {
    pub key: Key,
    /// `None` for `key.value`.
    pub identity: Option<Identity>,
}

/// Our key in watch mode: given, or derived as fence_pr derives it for the node this is
/// ([`who_am_i`]), asking corosync through `host`: one corosync-cmapctl run for both prefixes,
/// bounded by `timeout`.
pub fn resolve_key(
    spec: &KeySpec,
    timeout: Duration,
    host: &dyn Host,
) -> Result<OurKey, WhoAmIError> {
    let (scheme, node) = match spec {
        KeySpec::Given(key) => {
            return Ok(OurKey {
                key: *key,
                identity: None,
            });
        }
        KeySpec::Derive { scheme, node } => (*scheme, node.as_deref()),
    };
    let cmapctl = Path::new(COROSYNC_CMAPCTL);
    let both = [CLUSTER_NAME_QUERY, NODELIST_QUERY];
    let run = host.cmapctl(cmapctl, &both, Some(timeout));
    let parts = run
        .as_ref()
        .ok()
        .and_then(|out| crate::keys::split_cmap_output(out, &both));
    let query = |arg: &str| -> Result<String, KeyError> {
        match (&run, &parts) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), Some(parts)) => Ok(both
                .iter()
                .position(|p| *p == arg)
                .and_then(|at| parts.get(at).cloned())
                .unwrap_or_default()),
            // Something else printed it (a wrapper): one query per run.
            (Ok(_), None) => host.cmapctl(cmapctl, &[arg], Some(timeout)),
        }
    };
    let hostname = host.hostname().map_err(|e| e.to_string());
    let identity = who_am_i(node, hostname, scheme, query)?;
    Ok(OurKey {
        key: identity.key,
        identity: Some(identity),
    })
}

/// What the key store's key says of our key, derived or given (`key.value`), checked at every
/// check: `None` when it agrees (or nothing is stored yet), else the problem in words.
pub fn store_problem(our: &OurKey, store: &KeyStore) -> Option<String> {
    let path = store.key_path().display().to_string();
    let stored = match store.read_key() {
        Ok(stored) => stored,
        Err(e) => {
            return Some(format!(
                "cannot read the key fence_pr's `on` stored on this node: {e}"
            ));
        }
    };
    let checked = match &our.identity {
        Some(identity) => identity.check_stored(stored, &path),
        None => crate::whoami::check_stored(
            our.key,
            &format!("key.value is {} (agent.toml)", our.key),
            stored,
            &path,
        ),
    };
    checked.err().map(|e| e.to_string())
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
            Settings::from_toml_str(include_str!("../../../packaging/prfence-agent.toml")).unwrap();
        let ModeSettings::Watch(watch) = settings.mode else {
            panic!("the packaged configuration is in watch mode")
        };
        let agent = resolve_key(&watch.key, Duration::from_secs(1), &node2())
            .unwrap()
            .key;
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
