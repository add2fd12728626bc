//! Reservation keys, every scheme in one place: fence_scsi's derivation (so fence_pr and the agent
//! use the very keys a running fence_scsi cluster already holds), prfence's native 64-bit scheme,
//! and lease mode's node + epoch keys ([`LeaseKey`]).
//!
//! # fence_scsi derivation (verified against /usr/sbin/fence_scsi 4.12.1 and fence-agents HEAD)
//! - cluster part: the first 4 hex digits of md5(cluster name), the cluster name being the first
//!   `(str) = <non-space>` value printed by `corosync-cmapctl totem.cluster_name`;
//! - `key_value=id` (default): then `%.4d` of the node's *positional index* N taken from the first
//!   `nodelist.node.N.name (str) = <node>` line of `corosync-cmapctl nodelist`, falling back to
//!   `nodelist.node.N.ringX_addr (str) = <node>`. The decimal digits are used as hex digits
//!   (index 12 gives `…0012`), and an index ≥ 10000 gives more than 8 digits;
//! - `key_value=hash`: then the first 4 hex digits of md5(node name);
//! - the node is `nodename` if given, else `plug`/`port`;
//! - the result is a hex string; fence_scsi strips leading zeros before use and storage.
//!
//! fence_scsi splices the node name into a regular expression unescaped; this module matches it
//! literally, which gives the same key for every name that is not itself a regex trick.
//! fence_scsi encodes names as ASCII and crashes on anything else; this module hashes UTF-8.
//!
//! # Native scheme
//! `key = (0x8000_0000 | be32(md5(cluster_name)[0..4])) << 32 | corosync_nodeid`.
//! - The corosync nodeid is cluster-wide: every node computes the same key for a given node.
//!   The positional index fence_scsi uses is each node's view of its own nodelist order, which
//!   differs between nodes after a node is removed without a full restart, so two nodes could get
//!   one key (fence-agents PR #289). The nodeid is a u32 and fills the low half exactly, so a key
//!   decodes back to the node (see [`NativeKey::decode`]).
//! - The high half tags the cluster, so two clusters sharing a LUN by mistake do not collide
//!   (31 bits of md5; the chance that two cluster names collide is 2^-31).
//! - The top bit is always set: fence_scsi keys are at most 14 hex digits (< 2^56) and in practice
//!   8 (< 2^32), so a native key can never equal a fence_scsi key and tooling can tell which
//!   scheme made a key. It also makes the key non-zero (0 is not a valid registration key).

use std::num::NonZeroU16;

use md5::{Digest, Md5};

use crate::pr::Key;

/// How a node's key is derived from its name: fence_pr's `key_value` and the agent's
/// `key.scheme` (+ `key.fence_scsi_key_value`) name the same three schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyScheme {
    /// fence_scsi's default (`key_value=id`): cluster md5 + positional nodelist index.
    #[default]
    FenceScsiId,
    /// fence_scsi's `key_value=hash`: cluster md5 + node-name md5.
    FenceScsiHash,
    /// prfence's 64-bit cluster tag + corosync nodeid ([`NativeKey`]).
    Native,
}

/// Errors of key derivation. Messages keep fence_scsi's wording where it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error(
        "Failed: cannot get cluster name (no `(str) = <name>` line in the output of `corosync-cmapctl totem.cluster_name`); is corosync running?"
    )]
    NoClusterName,
    #[error(
        "Failed: unable to parse output of corosync-cmapctl or node does not exist (no nodelist entry named {node:?}); pass the corosync node name or set `key`"
    )]
    NodeNotFound { node: String },
    #[error("Failed: node {node:?} has no nodeid in the corosync nodelist; set `key` explicitly")]
    NoNodeId { node: String },
    #[error("Failed: key cannot be 0")]
    Zero,
    #[error("Failed: key {text:?} is not 1 to 16 hex digits (optionally with 0x)")]
    Malformed { text: String },
    #[error(
        "Failed: running {command}: {reason}; is corosync running on this node (`corosync-cfgtool -s`)?"
    )]
    Cmapctl {
        /// The program and its arguments, space-separated.
        command: String,
        reason: String,
        /// It ran out of its time (corosync did not answer), rather than failing.
        timed_out: bool,
    },
}

/// Parses a key as fence_pr accepts it: 1–16 hex digits, any case, optional `0x`; 0 is refused.
/// (fence_scsi compares keys case-sensitively and mangles `0x`; both are accepted here.)
pub fn parse_key(text: &str) -> Result<u64, KeyError> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    let malformed = || KeyError::Malformed {
        text: text.to_owned(),
    };
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed());
    }
    let key = u64::from_str_radix(digits, 16).map_err(|_| malformed())?;
    if key == 0 {
        return Err(KeyError::Zero);
    }
    Ok(key)
}

/// Formats a key as fence_scsi writes it (key file, sg_persist arguments): lowercase hex, no
/// `0x`, no leading zeros.
pub fn fence_scsi_key_text(key: u64) -> String {
    format!("{key:x}")
}

fn md5_hex(data: &str) -> String {
    let digest = Md5::digest(data.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// One `key (type) = value` line of `corosync-cmapctl` output; only lines ended by a newline
/// count, as in fence_scsi's regular expressions.
fn cmap_lines(output: &str) -> impl Iterator<Item = (&str, &str, &str)> {
    let complete = match output.rfind('\n') {
        Some(end) => &output[..end],
        None => "",
    };
    complete.split('\n').filter_map(|line| {
        let (lhs, value) = line.split_once(" = ")?;
        let (key, ty) = lhs.rsplit_once(' ')?;
        let ty = ty.strip_prefix('(')?.strip_suffix(')')?;
        Some((key, ty, value))
    })
}

/// The cluster name from `corosync-cmapctl totem.cluster_name` output: the first complete line
/// with `(str) = ` followed by a value without whitespace (fence_scsi: `\(str\) = (\S+)\n`).
pub fn parse_cluster_name(output: &str) -> Option<String> {
    let complete = &output[..output.rfind('\n')?];
    complete.split('\n').find_map(|line| {
        line.match_indices("(str) = ").find_map(|(at, marker)| {
            let rest = &line[at + marker.len()..];
            (!rest.is_empty() && !rest.chars().any(char::is_whitespace)).then(|| rest.to_owned())
        })
    })
}

/// One node of `corosync-cmapctl nodelist`, in output order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmapNode {
    /// N in `nodelist.node.N.*`: the positional index fence_scsi's `key_value=id` uses.
    pub position: u32,
    pub name: Option<String>,
    pub nodeid: Option<u32>,
    /// `ringX_addr` values, X ascending.
    pub ring_addrs: Vec<(u8, String)>,
}

/// The corosync nodelist as `corosync-cmapctl nodelist` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nodelist {
    pub nodes: Vec<CmapNode>,
    /// `nodelist.local_node_pos`: the position of the node corosync runs on (the entry whose
    /// address is one of this host's), as corosync itself decided.
    pub local_node_pos: Option<u32>,
}

impl Nodelist {
    /// Parses `corosync-cmapctl nodelist` output; lines that are not `nodelist.node.N.<field>`
    /// are skipped.
    pub fn parse(output: &str) -> Nodelist {
        let mut nodes: Vec<CmapNode> = Vec::new();
        let mut local_node_pos = None;
        for (key, _ty, value) in cmap_lines(output) {
            if key == "nodelist.local_node_pos" {
                local_node_pos = value.parse().ok();
                continue;
            }
            let Some(rest) = key.strip_prefix("nodelist.node.") else {
                continue;
            };
            let Some((index, field)) = rest.split_once('.') else {
                continue;
            };
            let Ok(position) = index.parse::<u32>() else {
                continue;
            };
            let node = match nodes.iter().position(|n| n.position == position) {
                Some(at) => &mut nodes[at],
                None => {
                    nodes.push(CmapNode {
                        position,
                        ..CmapNode::default()
                    });
                    let last = nodes.len() - 1;
                    &mut nodes[last]
                }
            };
            if field == "name" {
                node.name = Some(value.to_owned());
            } else if field == "nodeid" {
                node.nodeid = value.parse().ok();
            } else if let Some(ring) = field
                .strip_prefix("ring")
                .and_then(|r| r.strip_suffix("_addr"))
                .and_then(|r| r.parse::<u8>().ok())
            {
                node.ring_addrs.push((ring, value.to_owned()));
                node.ring_addrs.sort();
            }
        }
        Nodelist {
            nodes,
            local_node_pos,
        }
    }

    /// The entry of the node corosync runs on ([`Nodelist::local_node_pos`]).
    pub fn local(&self) -> Option<&CmapNode> {
        let position = self.local_node_pos?;
        self.nodes.iter().find(|n| n.position == position)
    }

    /// The node fence_scsi would pick for `node`: the first whose `name` is `node`, else the
    /// first with a `ringX_addr` equal to `node` (the pre-`name` nodelist format).
    pub fn find(&self, node: &str) -> Option<&CmapNode> {
        self.nodes
            .iter()
            .find(|n| n.name.as_deref() == Some(node))
            .or_else(|| {
                self.nodes
                    .iter()
                    .find(|n| n.ring_addrs.iter().any(|(_, addr)| addr == node))
            })
    }

    /// Names for the `list` action: the node name, else its ring0 address.
    pub fn node_names(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter_map(|n| {
                n.name
                    .as_deref()
                    .or_else(|| n.ring_addrs.first().map(|(_, a)| a.as_str()))
            })
            .collect()
    }
}

/// fence_scsi's `key_value=id` key for `node` (see the module docs), as the hex string fence_scsi
/// builds before stripping leading zeros.
pub fn fence_scsi_id_key_string(
    cluster_name: &str,
    nodelist: &Nodelist,
    node: &str,
) -> Result<String, KeyError> {
    let found = nodelist.find(node).ok_or_else(|| KeyError::NodeNotFound {
        node: node.to_owned(),
    })?;
    Ok(id_key_text(cluster_name, found.position))
}

/// `key_value=id`'s key text for nodelist `position`: the cluster's md5 tag, then the position's
/// decimal digits (read as hex digits when parsed).
fn id_key_text(cluster_name: &str, position: u32) -> String {
    format!("{}{:04}", &md5_hex(cluster_name)[..4], position)
}

/// fence_scsi's `key_value=hash` key for `node`, as a hex string.
pub fn fence_scsi_hash_key_string(cluster_name: &str, node: &str) -> String {
    format!("{}{}", &md5_hex(cluster_name)[..4], &md5_hex(node)[..4])
}

/// The key for `node` by `method`, from the cluster name and the nodelist (unused for `hash`).
pub fn derive_key(
    cluster_name: &str,
    nodelist: &Nodelist,
    node: &str,
    method: KeyScheme,
) -> Result<u64, KeyError> {
    match method {
        KeyScheme::FenceScsiId => {
            parse_key(&fence_scsi_id_key_string(cluster_name, nodelist, node)?)
        }
        KeyScheme::FenceScsiHash => parse_key(&fence_scsi_hash_key_string(cluster_name, node)),
        KeyScheme::Native => Ok(NativeKey::for_node(cluster_name, nodelist, node)?.value()),
    }
}

/// Registered keys that carry this cluster's tag as `key_value=id` builds its keys (the first 4
/// hex digits of md5(cluster name) above the low 16 bits) but that no node of `nodelist` derives
/// now. Such a key is a position's that no node has any more, or not a position at all: after a
/// node is removed from the middle of the nodelist, the nodes after it still hold the keys of
/// their old positions, and a fence by name derives the new ones. So while any is registered,
/// the key derived for a victim may not be the key it holds (fence-agents #289), and a fence that
/// removed the derived key has not shown that the victim is off (P1). A removed node's key left
/// behind looks the same and is treated the same: the key is still there, and nothing tells whose.
pub fn id_keys_no_node_derives(
    cluster_name: &str,
    nodelist: &Nodelist,
    registered: &[Key],
) -> Vec<Key> {
    let Ok(tag) = u64::from_str_radix(&md5_hex(cluster_name)[..4], 16) else {
        return Vec::new();
    };
    let derived: Vec<u64> = nodelist
        .nodes
        .iter()
        .filter_map(|n| parse_key(&id_key_text(cluster_name, n.position)).ok())
        .collect();
    let mut unknown: Vec<Key> = registered
        .iter()
        .copied()
        .filter(|k| k.get() >> 16 == tag && !derived.contains(&k.get()))
        .collect();
    unknown.sort_unstable();
    unknown.dedup();
    unknown
}

/// The native 64-bit key (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NativeKey {
    /// The high half, top bit set: tags the cluster.
    pub cluster_tag: u32,
    /// The low half: the corosync nodeid.
    pub nodeid: u32,
}

impl NativeKey {
    const MARKER: u32 = 0x8000_0000;

    pub fn new(cluster_name: &str, nodeid: u32) -> NativeKey {
        let digest = Md5::digest(cluster_name.as_bytes());
        let tag = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        NativeKey {
            cluster_tag: tag | Self::MARKER,
            nodeid,
        }
    }

    /// The native key for `node` looked up in the nodelist by name (or ring address).
    pub fn for_node(
        cluster_name: &str,
        nodelist: &Nodelist,
        node: &str,
    ) -> Result<NativeKey, KeyError> {
        let found = nodelist.find(node).ok_or_else(|| KeyError::NodeNotFound {
            node: node.to_owned(),
        })?;
        let nodeid = found.nodeid.ok_or_else(|| KeyError::NoNodeId {
            node: node.to_owned(),
        })?;
        Ok(NativeKey::new(cluster_name, nodeid))
    }

    pub fn value(self) -> u64 {
        (u64::from(self.cluster_tag) << 32) | u64::from(self.nodeid)
    }

    /// Splits a key made by this scheme; `None` for keys without the marker bit (fence_scsi or
    /// hand-set keys).
    pub fn decode(key: u64) -> Option<NativeKey> {
        let cluster_tag = u32::try_from(key >> 32).ok()?;
        let nodeid = u32::try_from(key & 0xffff_ffff).ok()?;
        (cluster_tag & Self::MARKER != 0).then_some(NativeKey {
            cluster_tag,
            nodeid,
        })
    }
}

/// Where corosync's cmap is read when a key is derived: fence_pr's `corosync_cmap_path` default
/// and the agent's (which has no option for it).
pub const COROSYNC_CMAPCTL: &str = "/usr/sbin/corosync-cmapctl";

/// Runs `corosync-cmapctl <args…>` and returns its stdout: the only I/O of key derivation.
/// `timeout` bounds the run (fence_scsi uses `power_timeout`, unbounded under pacemaker-fenced;
/// fence_pr passes its command timeout); on expiry the child is killed and the
/// run fails, because a timeout is a failure in the Fence Agent API.
pub fn query_cmapctl(
    path: &std::path::Path,
    args: &[&str],
    timeout: Option<std::time::Duration>,
) -> Result<String, KeyError> {
    use crate::process::{RunError, run_bounded};

    let fail = |reason: String, timed_out: bool| KeyError::Cmapctl {
        command: cmapctl_command(path, args),
        reason,
        timed_out,
    };
    let stdout = run_bounded(path, args, timeout).map_err(|e| match e {
        RunError::TimedOut(after) => fail(
            format!("timed out after {after:?} (power_timeout); is corosync responsive?"),
            true,
        ),
        other => fail(other.to_string(), false),
    })?;
    String::from_utf8(stdout).map_err(|e| fail(format!("output is not UTF-8: {e}"), false))
}

/// `<cmapctl> <args…>` as an error message names it.
pub fn cmapctl_command(path: &std::path::Path, args: &[&str]) -> String {
    format!("{} {}", path.display(), args.join(" "))
}

/// Splits the output of one `corosync-cmapctl P1 P2 …` run (disjoint prefixes) into what each
/// `corosync-cmapctl Pi` prints alone: corosync prints each prefix's keys in turn, one
/// `key (type) = value` line per key, and a key's name starts with its prefix. None when a line
/// starts with none of them or the output does not end with a newline: something else printed
/// it (a wrapper of the tool), so its parts cannot be told apart.
pub fn split_cmap_output(output: &str, prefixes: &[&str]) -> Option<Vec<String>> {
    let mut parts = vec![String::new(); prefixes.len()];
    if output.is_empty() {
        return Some(parts);
    }
    let complete = output.strip_suffix('\n')?;
    for line in complete.split('\n') {
        let owner = prefixes.iter().position(|p| line.starts_with(p))?;
        parts[owner].push_str(line);
        parts[owner].push('\n');
    }
    Some(parts)
}

/// The `corosync-cmapctl` argument that prints the cluster name.
pub const CLUSTER_NAME_QUERY: &str = "totem.cluster_name";
/// The `corosync-cmapctl` argument that prints the nodelist.
pub const NODELIST_QUERY: &str = "nodelist";

/// Derives the key for `node` by asking corosync through `query` (normally [`query_cmapctl`]
/// with `corosync_cmap_path`), in fence_scsi's order: cluster name first, then the nodelist,
/// which `hash` does not need.
pub fn derive_key_via(
    node: &str,
    method: KeyScheme,
    mut query: impl FnMut(&str) -> Result<String, KeyError>,
) -> Result<u64, KeyError> {
    let cluster = parse_cluster_name(&query(CLUSTER_NAME_QUERY)?).ok_or(KeyError::NoClusterName)?;
    let nodelist = match method {
        KeyScheme::FenceScsiId | KeyScheme::Native => Nodelist::parse(&query(NODELIST_QUERY)?),
        KeyScheme::FenceScsiHash => Nodelist::default(),
    };
    derive_key(&cluster, &nodelist, node, method)
}

// Lease mode: `key = node_id << 48 | epoch` — why epochs only grow is told in the agent's lease
// state machine, which allocates them.

/// Bits of a lease key holding the epoch.
pub const EPOCH_BITS: u32 = 48;
/// The highest epoch.
pub const EPOCH_MAX: u64 = (1 << EPOCH_BITS) - 1;

/// No lease key can carry this epoch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "lease key epoch {epoch} of node {node} exceeds 48 bits: the state file or a key on the LU is \
     corrupt; clear the state file and the node's registrations"
)]
pub struct EpochExhausted {
    pub node: u16,
    pub epoch: u64,
}

/// A lease-mode key: node id in the top 16 bits, epoch in the low 48.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseKey {
    node: NonZeroU16,
    epoch: u64,
}

impl LeaseKey {
    pub fn new(node: NonZeroU16, epoch: u64) -> Result<LeaseKey, EpochExhausted> {
        if epoch > EPOCH_MAX {
            return Err(EpochExhausted {
                node: node.get(),
                epoch,
            });
        }
        Ok(LeaseKey { node, epoch })
    }

    /// Splits a key; `None` for 0 in the node bits (not a lease key).
    pub fn decode(key: Key) -> Option<LeaseKey> {
        let node = u16::try_from(key.get() >> EPOCH_BITS).ok()?;
        Some(LeaseKey {
            node: NonZeroU16::new(node)?,
            epoch: key.get() & EPOCH_MAX,
        })
    }

    pub fn node(self) -> NonZeroU16 {
        self.node
    }

    pub fn epoch(self) -> u64 {
        self.epoch
    }

    pub fn key(self) -> Key {
        Key::new(u64::from(self.node.get()) << EPOCH_BITS | self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODELIST: &str = "nodelist.local_node_pos (u32) = 1\n\
nodelist.node.0.name (str) = node1\n\
nodelist.node.0.nodeid (u32) = 1\n\
nodelist.node.0.ring0_addr (str) = 10.0.0.1\n\
nodelist.node.1.name (str) = node2\n\
nodelist.node.1.nodeid (u32) = 7\n\
nodelist.node.1.ring0_addr (str) = 10.0.0.2\n\
nodelist.node.12.name (str) = node13\n\
nodelist.node.12.nodeid (u32) = 13\n";

    #[test]
    fn md5_vectors() {
        assert_eq!(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
        // Cross-checked with Python hashlib on this host.
        assert_eq!(md5_hex("mycluster"), "6c9d58deeaac0e67f612d1ce6477116e");
    }

    #[test]
    fn key_text_round_trip() {
        assert_eq!(parse_key("6c9d0001"), Ok(0x6c9d_0001));
        assert_eq!(parse_key("0x6C9D0001"), Ok(0x6c9d_0001));
        assert_eq!(parse_key("ffffffffffffffff"), Ok(u64::MAX));
        assert_eq!(parse_key("0"), Err(KeyError::Zero));
        assert_eq!(parse_key("0x00"), Err(KeyError::Zero));
        assert!(matches!(parse_key(""), Err(KeyError::Malformed { .. })));
        assert!(matches!(parse_key("0x"), Err(KeyError::Malformed { .. })));
        assert!(matches!(
            parse_key("12345678901234567"),
            Err(KeyError::Malformed { .. })
        ));
        assert!(matches!(parse_key("xyz"), Err(KeyError::Malformed { .. })));
        assert!(matches!(parse_key("+1"), Err(KeyError::Malformed { .. })));
        assert_eq!(fence_scsi_key_text(0x0abc_0001), "abc0001");
    }

    #[test]
    fn cluster_name_parsing() {
        assert_eq!(
            parse_cluster_name("totem.cluster_name (str) = mycluster\n").as_deref(),
            Some("mycluster")
        );
        // No trailing newline: fence_scsi's regex needs one.
        assert_eq!(
            parse_cluster_name("totem.cluster_name (str) = mycluster"),
            None
        );
        // A name with a space does not match `\S+\n`.
        assert_eq!(
            parse_cluster_name("totem.cluster_name (str) = my cluster\n"),
            None
        );
        assert_eq!(parse_cluster_name("Failed to get key\n"), None);
    }

    #[test]
    fn nodelist_parsing() {
        let list = Nodelist::parse(NODELIST);
        assert_eq!(list.nodes.len(), 3);
        assert_eq!(list.nodes[1].name.as_deref(), Some("node2"));
        assert_eq!(list.nodes[1].nodeid, Some(7));
        assert_eq!(list.nodes[2].position, 12);
        assert_eq!(list.node_names(), vec!["node1", "node2", "node13"]);
        assert_eq!(list.local_node_pos, Some(1));
        assert_eq!(list.local().and_then(|n| n.name.as_deref()), Some("node2"));
        assert_eq!(list.find("10.0.0.2").map(|n| n.position), Some(1));
        assert!(list.find("node").is_none());
    }

    #[test]
    fn id_keys_left_by_a_moved_or_removed_node_are_named() {
        // node1..node3 at positions 0..2 registered …0000, …0001, …0002; node2 is removed and
        // node3 moves to position 1: it still holds …0002, which no node derives now.
        let tag = u64::from_str_radix(&md5_hex("mycluster")[..4], 16).unwrap();
        let id_key = |position: u64| {
            Key::new(tag << 16 | u64::from_str_radix(&format!("{position:04}"), 16).unwrap())
        };
        let before = Nodelist::parse(
            "nodelist.node.0.name (str) = node1\nnodelist.node.1.name (str) = node2\n\
             nodelist.node.2.name (str) = node3\n",
        );
        let after = Nodelist::parse(
            "nodelist.node.0.name (str) = node1\nnodelist.node.1.name (str) = node3\n",
        );
        let registered = [id_key(0), id_key(1), id_key(2), id_key(2)];
        assert_eq!(
            derive_key("mycluster", &before, "node3", KeyScheme::FenceScsiId).unwrap(),
            id_key(2).get()
        );
        assert!(id_keys_no_node_derives("mycluster", &before, &registered).is_empty());
        assert_eq!(
            id_keys_no_node_derives("mycluster", &after, &registered),
            [id_key(2)]
        );
        // Another cluster's keys, native keys and fence_mpath's own keys are not this cluster's.
        let others = [
            Key::new(0xa),
            Key::new(NativeKey::new("mycluster", 3).value()),
            Key::new((tag ^ 1) << 16 | 0x0002),
        ];
        assert!(id_keys_no_node_derives("mycluster", &after, &others).is_empty());
        // Position 12 is key …0012, not …000c.
        let twelve = Nodelist::parse("nodelist.node.12.name (str) = node13\n");
        assert!(id_keys_no_node_derives("mycluster", &twelve, &[id_key(12)]).is_empty());
        assert_eq!(
            id_keys_no_node_derives("mycluster", &twelve, &[Key::new(tag << 16 | 0xc)]),
            [Key::new(tag << 16 | 0xc)]
        );
    }

    #[test]
    fn fence_scsi_id_keys() {
        let list = Nodelist::parse(NODELIST);
        let key = |n| fence_scsi_id_key_string("mycluster", &list, n);
        assert_eq!(key("node1").unwrap(), "6c9d0000");
        assert_eq!(key("node2").unwrap(), "6c9d0001");
        // Positional index 12 is written in decimal and read as hex.
        assert_eq!(key("node13").unwrap(), "6c9d0012");
        assert_eq!(key("10.0.0.1").unwrap(), "6c9d0000");
        assert!(matches!(key("nodeX"), Err(KeyError::NodeNotFound { .. })));
        assert_eq!(
            derive_key("mycluster", &list, "node13", KeyScheme::FenceScsiId),
            Ok(0x6c9d_0012)
        );
    }

    #[test]
    fn fence_scsi_wide_index_keeps_all_digits() {
        let list = Nodelist::parse("nodelist.node.12345.name (str) = big\n");
        assert_eq!(
            fence_scsi_id_key_string("c", &list, "big").unwrap(),
            format!("{}12345", &md5_hex("c")[..4])
        );
    }

    #[test]
    fn fence_scsi_hash_keys() {
        let k = fence_scsi_hash_key_string("mycluster", "node2");
        assert_eq!(k, format!("6c9d{}", &md5_hex("node2")[..4]));
        let key = derive_key(
            "mycluster",
            &Nodelist::default(),
            "node2",
            KeyScheme::FenceScsiHash,
        );
        assert_eq!(key.map(fence_scsi_key_text), Ok(k));
    }

    #[test]
    fn derive_queries_in_fence_scsi_order() {
        let mut asked = Vec::new();
        let key = derive_key_via("node2", KeyScheme::FenceScsiId, |arg| {
            asked.push(arg.to_owned());
            Ok(match arg {
                "totem.cluster_name" => "totem.cluster_name (str) = mycluster\n".to_owned(),
                _ => NODELIST.to_owned(),
            })
        });
        assert_eq!(key, Ok(0x6c9d_0001));
        assert_eq!(asked, ["totem.cluster_name", "nodelist"]);
        let mut asked = 0;
        let key = derive_key_via("node2", KeyScheme::FenceScsiHash, |_| {
            asked += 1;
            Ok("totem.cluster_name (str) = mycluster\n".to_owned())
        });
        assert!(key.is_ok());
        assert_eq!(asked, 1);
        let err = derive_key_via("n", KeyScheme::FenceScsiId, |_| Ok(String::new()));
        assert_eq!(err, Err(KeyError::NoClusterName));
    }

    fn script(name: &str, body: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("prfence-cmap-{}-{name}", std::process::id()));
        std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn query_cmapctl_runs_reports_and_times_out() {
        use std::time::Duration;
        let ok = script("ok", "echo \"totem.cluster_name (str) = $1\"\n");
        assert_eq!(
            query_cmapctl(&ok, &["x"], Some(Duration::from_secs(5))).unwrap(),
            "totem.cluster_name (str) = x\n"
        );
        let bad = script("bad", "echo 'Failed to initialize' >&2; exit 1\n");
        let err = query_cmapctl(&bad, &["nodelist"], None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("Failed to initialize") && err.contains("nodelist"),
            "{err}"
        );
        let slow = script("slow", "exec sleep 5\n");
        let started = std::time::Instant::now();
        let err =
            query_cmapctl(&slow, &["nodelist"], Some(Duration::from_millis(200))).unwrap_err();
        assert!(err.to_string().contains("timed out"), "{err}");
        assert!(matches!(
            err,
            KeyError::Cmapctl {
                timed_out: true,
                ..
            }
        ));
        assert!(started.elapsed() < Duration::from_secs(3));
        let missing = std::path::Path::new("/nonexistent/corosync-cmapctl");
        assert!(matches!(
            query_cmapctl(missing, &["x"], None),
            Err(KeyError::Cmapctl {
                timed_out: false,
                ..
            })
        ));
        for p in [ok, bad, slow] {
            std::fs::remove_file(p).unwrap();
        }
    }

    #[test]
    fn one_run_for_two_prefixes_splits_into_what_each_prints_alone() {
        let prefixes = [CLUSTER_NAME_QUERY, NODELIST_QUERY];
        let name = "totem.cluster_name (str) = mycluster\n";
        let both = format!("{name}{NODELIST}");
        assert_eq!(
            split_cmap_output(&both, &prefixes),
            Some(vec![name.to_owned(), NODELIST.to_owned()])
        );
        // A prefix with no key prints nothing, as it does alone.
        assert_eq!(
            split_cmap_output(NODELIST, &prefixes),
            Some(vec![String::new(), NODELIST.to_owned()])
        );
        assert_eq!(
            split_cmap_output("", &prefixes),
            Some(vec![String::new(), String::new()])
        );
        // A line of neither prefix, or an unfinished line: not corosync-cmapctl's output.
        for odd in [
            format!("{name}usage: cmapctl KEY\n"),
            "totem.cluster_name (str) = mycluster".to_owned(),
            format!("{name}\n{NODELIST}"),
        ] {
            assert_eq!(split_cmap_output(&odd, &prefixes), None, "{odd:?}");
        }
        // Parsed alone, each part gives what a run of its own would: the nodelist's names are
        // never taken for the cluster name.
        let parts = split_cmap_output(NODELIST, &prefixes).unwrap();
        assert_eq!(parse_cluster_name(&parts[0]), None);
        assert_eq!(Nodelist::parse(&parts[1]), Nodelist::parse(NODELIST));
    }

    #[test]
    fn native_keys() {
        let list = Nodelist::parse(NODELIST);
        let k = NativeKey::for_node("mycluster", &list, "node2").unwrap();
        assert_eq!(k.nodeid, 7);
        assert_eq!(k.cluster_tag, 0x8000_0000 | 0x6c9d_58de);
        assert_eq!(k.value(), 0xec9d_58de_0000_0007);
        assert_eq!(NativeKey::decode(k.value()), Some(k));
        assert_eq!(NativeKey::decode(0x6c9d_0001), None);
        let no_id = Nodelist::parse("nodelist.node.0.name (str) = a\n");
        assert!(matches!(
            NativeKey::for_node("c", &no_id, "a"),
            Err(KeyError::NoNodeId { .. })
        ));
    }

    #[test]
    fn native_keys_never_equal_fence_scsi_keys() {
        // fence_scsi keys fit in 14 hex digits; native keys always have bit 63 set.
        for name in ["a", "b", "mycluster", ""] {
            for id in [0, 1, u32::MAX] {
                assert!(NativeKey::new(name, id).value() >= 1 << 63);
            }
        }
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn key_text_round_trips(key in 1u64..) {
            prop_assert_eq!(parse_key(&fence_scsi_key_text(key)), Ok(key));
            prop_assert_eq!(parse_key(&format!("0x{key:016X}")), Ok(key));
        }

        #[test]
        fn native_keys_decode(name in "\\PC{0,20}", nodeid in any::<u32>()) {
            let key = NativeKey::new(&name, nodeid);
            prop_assert_eq!(NativeKey::decode(key.value()), Some(key));
            prop_assert_eq!(key.nodeid, nodeid);
        }

        #[test]
        fn cmap_parsers_never_panic(text in "\\PC*") {
            let _ = parse_cluster_name(&text);
            let _ = Nodelist::parse(&text);
        }
    }
}
