//! Who this node is to the cluster, and so which key is its own: the one rule the node agent
//! (`key.derive`) and `prfence doctor --config` follow.
//!
//! - `key.node`, when set, names the node: the admin said so.
//! - Otherwise the node is the one corosync runs as (`nodelist.local_node_pos`, the entry whose
//!   address is this host's). Its name is what Pacemaker passes to fence_pr's `on` as `port`
//!   when it unfences this node, so its key is the key that unfencing registers.
//! - The host name only cross-checks it: a host name that names another node than corosync's
//!   (a cloned node, a renamed host) is a [`WhoAmIError::Conflict`] naming both, never settled by
//!   picking one. A host name that is the corosync name with a domain added (or removed) agrees.
//! - Without `local_node_pos` (a corosync that does not print it) the host name is the node.
//! - Last, once fence_pr's `on` has stored this node's key (`/var/run/cluster.key`, this boot's,
//!   `/run` being a tmpfs), that key must be the one derived ([`Identity::check_stored`]).

use crate::keys::{self, KeyError, KeyScheme, Nodelist};
use crate::pr::Key;

/// Where the node's name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeBasis {
    /// `key.node`.
    Configured,
    /// corosync's `nodelist.local_node_pos`.
    Corosync,
    /// The host name (corosync does not say which node it runs as).
    HostName,
}

impl std::fmt::Display for NodeBasis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeBasis::Configured => "key.node",
            NodeBasis::Corosync => "corosync's local node",
            NodeBasis::HostName => "the host name",
        })
    }
}

/// This node as the cluster knows it, and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub node: String,
    pub basis: NodeBasis,
    pub key: Key,
}

/// Why this node's key is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WhoAmIError {
    /// corosync-cmapctl failed: corosync is not running yet (the cluster stack is started by
    /// hand after a fence) or does not answer. It may answer at any moment.
    #[error("corosync does not answer: {0}")]
    NoCorosync(KeyError),
    /// corosync answers, but what it says gives no key for this node (`key.node` names a node
    /// not in its nodelist, no cluster name, …).
    #[error("{0}")]
    NoKey(String),
    /// Two sources disagree about who this node is; the message names both.
    #[error("{0}")]
    Conflict(String),
}

/// Decides who this node is and derives its key by `scheme` (see the module docs).
/// `configured`: `key.node`; `hostname`: the host's name, or why it cannot be read; `query`:
/// corosync-cmapctl's answer to one prefix (the cluster name, then the nodelist).
pub fn who_am_i(
    configured: Option<&str>,
    hostname: Result<String, String>,
    scheme: KeyScheme,
    mut query: impl FnMut(&str) -> Result<String, KeyError>,
) -> Result<Identity, WhoAmIError> {
    let answer = query(keys::CLUSTER_NAME_QUERY).map_err(WhoAmIError::NoCorosync)?;
    let cluster = keys::parse_cluster_name(&answer)
        .ok_or_else(|| WhoAmIError::NoKey(KeyError::NoClusterName.to_string()))?;
    let nodelist = Nodelist::parse(&query(keys::NODELIST_QUERY).map_err(WhoAmIError::NoCorosync)?);
    let (node, basis) = match configured {
        Some(node) => (node.to_owned(), NodeBasis::Configured),
        None => local_node(&nodelist, hostname)?,
    };
    let key = keys::derive_key(&cluster, &nodelist, &node, scheme).map_err(|e| {
        WhoAmIError::NoKey(format!(
            "deriving the key of node {node:?} (named by {basis}): {e}; set key.node to this \
             node's name in the cluster, or give key.value"
        ))
    })?;
    Ok(Identity {
        node,
        basis,
        key: Key::new(key),
    })
}

/// The node corosync runs as, checked against the host name.
fn local_node(
    nodelist: &Nodelist,
    hostname: Result<String, String>,
) -> Result<(String, NodeBasis), WhoAmIError> {
    let Some(local) = nodelist.local() else {
        return hostname
            .map(|host| (host, NodeBasis::HostName))
            .map_err(|e| {
                WhoAmIError::NoKey(format!(
                    "corosync does not say which node this is (no nodelist.local_node_pos) and \
                     the host name cannot be read ({e}); set key.node"
                ))
            });
    };
    let position = local.position;
    let host = hostname.ok();
    let name = match (&local.name, &host) {
        (Some(name), _) => name.clone(),
        // A nodelist without names: Pacemaker names the node by its host name, which must then
        // be one of the entry's addresses.
        (None, Some(host)) if nodelist.find(host).map(|n| n.position) == Some(position) => {
            host.clone()
        }
        (None, host) => {
            return Err(WhoAmIError::Conflict(format!(
                "corosync runs this node as nodelist.node.{position}, which has no name, and \
                 the host name ({}) is none of its addresses; set key.node to this node's name \
                 in the cluster",
                host.as_deref().unwrap_or("unreadable")
            )));
        }
    };
    if let Some(host) = &host
        && !same_host(host, &name)
    {
        return Err(WhoAmIError::Conflict(format!(
            "this host is named {host:?} but corosync runs it as node {name:?} \
             (nodelist.local_node_pos = {position}): a cloned or renamed node? Not watching \
             either key; set key.node to this node's name in the cluster once you know which \
             node it is"
        )));
    }
    Ok((name, NodeBasis::Corosync))
}

/// Whether host name `a` and node name `b` name the same host: equal (ignoring ASCII case), or
/// one is the other with a domain added.
fn same_host(a: &str, b: &str) -> bool {
    let prefix_of = |long: &str, short: &str| {
        long.len() > short.len()
            && long.as_bytes()[short.len()] == b'.'
            && long[..short.len()].eq_ignore_ascii_case(short)
    };
    a.eq_ignore_ascii_case(b) || prefix_of(a, b) || prefix_of(b, a)
}

impl Identity {
    /// Checks the key fence_pr's `on` stored on this node (`stored`, read from `store`, a path
    /// for the message) against ours: a different one means one of the two is another node's.
    pub fn check_stored(&self, stored: Option<u64>, store: &str) -> Result<(), WhoAmIError> {
        let ours = format!(
            "node {:?} (named by {}) has key {}",
            self.node, self.basis, self.key
        );
        check_stored(self.key, &ours, stored, store)
    }
}

/// The one comparison of a node's key with the key fence_pr's `on` stored on it in this boot
/// (`stored`, read from `store`): for a derived key ([`Identity::check_stored`]) and for a key
/// the configuration gives (`key.value`, a file copied from another node being the usual
/// mistake). `ours` says whose key `key` is, for the message. A different stored key means one
/// of the two is another node's: the node must not watch either until they agree.
pub fn check_stored(
    key: Key,
    ours: &str,
    stored: Option<u64>,
    store: &str,
) -> Result<(), WhoAmIError> {
    match stored.map(Key::new) {
        Some(stored) if stored != key => Err(WhoAmIError::Conflict(format!(
            "the key store {store} holds {stored} (written by fence_pr's `on` when this node \
             was unfenced in this boot), but {ours}: one of the two is another node's. Check \
             which node this is, then set key.node (or key.value) and unfence it again"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "totem.cluster_name (str) = mycluster\n";
    const NODELIST: &str = "nodelist.local_node_pos (u32) = 1\n\
nodelist.node.0.name (str) = node1\n\
nodelist.node.0.nodeid (u32) = 1\n\
nodelist.node.1.name (str) = node2\n\
nodelist.node.1.nodeid (u32) = 2\n";

    fn corosync(nodelist: &'static str) -> impl FnMut(&str) -> Result<String, KeyError> {
        move |arg| {
            Ok(match arg {
                keys::CLUSTER_NAME_QUERY => NAME.to_owned(),
                _ => nodelist.to_owned(),
            })
        }
    }

    fn host(name: &str) -> Result<String, String> {
        Ok(name.to_owned())
    }

    #[test]
    fn corosyncs_local_node_is_this_node() {
        let me = who_am_i(
            None,
            host("node2"),
            KeyScheme::FenceScsiId,
            corosync(NODELIST),
        );
        let me = me.unwrap();
        assert_eq!((me.node.as_str(), me.basis), ("node2", NodeBasis::Corosync));
        assert_eq!(me.key, Key::new(0x6c9d_0001));
        // A domain on either side agrees; an unreadable host name leaves corosync's word.
        for name in ["node2.example.com", "NODE2"] {
            assert!(who_am_i(None, host(name), KeyScheme::FenceScsiId, corosync(NODELIST)).is_ok());
        }
        let me = who_am_i(
            None,
            Err("no".into()),
            KeyScheme::Native,
            corosync(NODELIST),
        );
        assert_eq!(me.unwrap().key.get() & 0xffff_ffff, 2);
    }

    #[test]
    fn a_host_name_of_another_node_is_a_conflict_naming_both() {
        for name in ["node1", "node22", "web7"] {
            let e = who_am_i(None, host(name), KeyScheme::FenceScsiId, corosync(NODELIST));
            let Err(WhoAmIError::Conflict(text)) = e else {
                panic!("{name}: {e:?}")
            };
            assert!(text.contains(name) && text.contains("\"node2\""), "{text}");
        }
        // key.node decides.
        let me = who_am_i(
            Some("node1"),
            host("web7"),
            KeyScheme::FenceScsiId,
            corosync(NODELIST),
        );
        assert_eq!(me.unwrap().key, Key::new(0x6c9d_0000));
    }

    #[test]
    fn without_local_node_pos_the_host_name_is_the_node() {
        const OLD: &str =
            "nodelist.node.0.name (str) = node1\nnodelist.node.1.name (str) = node2\n";
        let me = who_am_i(None, host("node1"), KeyScheme::FenceScsiId, corosync(OLD)).unwrap();
        assert_eq!(
            (me.basis, me.key),
            (NodeBasis::HostName, Key::new(0x6c9d_0000))
        );
        let e = who_am_i(None, host("other"), KeyScheme::FenceScsiId, corosync(OLD));
        assert!(matches!(e, Err(WhoAmIError::NoKey(t)) if t.contains("\"other\"")));
    }

    #[test]
    fn a_nameless_entry_takes_the_host_name_among_its_addresses() {
        const ADDRS: &str = "nodelist.local_node_pos (u32) = 0\n\
nodelist.node.0.ring0_addr (str) = alpha\nnodelist.node.1.ring0_addr (str) = beta\n";
        let me = who_am_i(
            None,
            host("alpha"),
            KeyScheme::FenceScsiHash,
            corosync(ADDRS),
        );
        assert_eq!(me.unwrap().node, "alpha");
        let e = who_am_i(
            None,
            host("beta"),
            KeyScheme::FenceScsiHash,
            corosync(ADDRS),
        );
        assert!(matches!(e, Err(WhoAmIError::Conflict(_))), "{e:?}");
    }

    #[test]
    fn corosync_down_is_told_from_a_node_it_does_not_know() {
        let down = |_: &str| -> Result<String, KeyError> {
            Err(KeyError::Cmapctl {
                command: "corosync-cmapctl".into(),
                reason: "exited with status 1".into(),
                timed_out: false,
            })
        };
        let e = who_am_i(None, host("node2"), KeyScheme::FenceScsiId, down);
        assert!(matches!(e, Err(WhoAmIError::NoCorosync(_))), "{e:?}");
        let e = who_am_i(
            Some("node9"),
            host("node2"),
            KeyScheme::FenceScsiId,
            corosync(NODELIST),
        );
        assert!(matches!(e, Err(WhoAmIError::NoKey(t)) if t.contains("node9")));
    }

    #[test]
    fn a_stored_key_of_another_node_is_a_conflict() {
        let me = who_am_i(
            None,
            host("node2"),
            KeyScheme::FenceScsiId,
            corosync(NODELIST),
        )
        .unwrap();
        assert_eq!(me.check_stored(None, "/s"), Ok(()));
        assert_eq!(me.check_stored(Some(0x6c9d_0001), "/s"), Ok(()));
        let Err(WhoAmIError::Conflict(text)) = me.check_stored(Some(0x6c9d_0000), "/s") else {
            panic!()
        };
        assert!(
            text.contains("0x000000006c9d0000") && text.contains("0x000000006c9d0001"),
            "{text}"
        );
    }

    #[test]
    fn a_given_key_unlike_the_stored_one_is_a_conflict_naming_both() {
        let key = Key::new(0xa);
        assert_eq!(check_stored(key, "key.value is 0xa", None, "/s"), Ok(()));
        assert_eq!(
            check_stored(key, "key.value is 0xa", Some(0xa), "/s"),
            Ok(())
        );
        let Err(WhoAmIError::Conflict(text)) =
            check_stored(key, "key.value is 0xa", Some(0xb), "/s")
        else {
            panic!()
        };
        assert!(
            text.contains("0x000000000000000b") && text.contains("key.value is 0xa"),
            "{text}"
        );
    }
}
