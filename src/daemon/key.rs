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
