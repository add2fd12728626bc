//! Registrations made under this node's own initiator identity that carry a key not its own.
//!
//! The target knows a node only by its initiator: an iSCSI initiator name (with an ISID per
//! session) or an NVMe host id. Two nodes that share one (a cloned
//! `/etc/iscsi/initiatorname.iscsi` or `/etc/nvme/hostid`) are one registrant to it: the last
//! REGISTER from either replaces the other's key, and a fence between them removes nothing (P1).
//! Seen from the node whose key was replaced, READ FULL STATUS lists its own initiator with the
//! other node's key. The same listing follows from this node's own earlier key left registered;
//! either way this node's key is not where its initiator is, and an admin has to look.
//! `prfence doctor` matches each path to its exact port; the agent asks this one question.

use std::fmt;

use serde::Serialize;

use crate::discover::{PathInfo, Resolution};
use crate::pr::{FullStatus, Key, TransportId};
use crate::transport::Protocol;

/// One initiator identity of this node's, as READ FULL STATUS can name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnInitiator {
    /// An iSCSI initiator name: every ISID (session) under it is this node's.
    Iscsi(String),
    /// An NVMe host id (a UUID): NVMe registers the host, once for all its controllers.
    NvmeHost(String),
}

impl OwnInitiator {
    /// Who this node is to the target on `path`: its iSCSI session's initiator name, or the NVMe
    /// host id (`nvme_host_id`, read from sysfs only for an NVMe path). `None` where the
    /// transport does not say (FC, SAS, tcm_loop, a path without a session).
    pub fn of_path(
        path: &PathInfo,
        nvme_host_id: impl FnOnce() -> Option<String>,
    ) -> Option<OwnInitiator> {
        match path.protocol {
            Protocol::Nvme => nvme_host_id().map(OwnInitiator::NvmeHost),
            Protocol::Scsi => path
                .transport
                .as_ref()
                .map(|t| t.initiator.clone())
                .filter(|name| !name.is_empty())
                .map(OwnInitiator::Iscsi),
        }
    }

    /// This node's identities on every path of `resolution`, each once, for
    /// [`super::unfence_observed`]; empty when some path's identity is not known (then no
    /// registration can be told to be another node's).
    pub fn of_resolution(
        resolution: &Resolution,
        nvme_host_id: impl Fn(&PathInfo) -> Option<String>,
    ) -> Vec<OwnInitiator> {
        let mut all = Vec::new();
        for path in resolution.lus.iter().flat_map(|lu| &lu.paths) {
            match OwnInitiator::of_path(path, || nvme_host_id(path)) {
                Some(own) => all.push(own),
                None => return Vec::new(),
            }
        }
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Whether `id`, a registrant's transport id, is this initiator (an iSCSI name with any ISID;
    /// names compare without case, as iSCSI names are case-insensitive).
    pub fn is(&self, id: &TransportId) -> bool {
        match (self, id) {
            (OwnInitiator::Iscsi(own), TransportId::Iscsi { name, .. }) => {
                own.eq_ignore_ascii_case(name)
            }
            (OwnInitiator::NvmeHost(own), TransportId::NvmeHostId { .. }) => {
                format!("nvme-hostid:{own}")
                    .parse::<TransportId>()
                    .is_ok_and(|ours| ours == *id)
            }
            _ => false,
        }
    }
}

impl fmt::Display for OwnInitiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnInitiator::Iscsi(name) => write!(f, "iSCSI initiator {name}"),
            OwnInitiator::NvmeHost(id) => write!(f, "NVMe host id {id}"),
        }
    }
}

/// A registration of one of this node's initiators with a key that is not this node's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtherKeyOnOwnInitiator {
    /// The registrant as the target names it (`iqn.…,i,0x…`, `nvme-hostid:…`).
    pub registrant: String,
    /// The key it carries.
    pub key: String,
}

/// Every registration in `status` of one of `own` initiators whose key is not `ours`, in the
/// target's order.
pub fn other_keys_on_own_initiators(
    own: &[OwnInitiator],
    ours: Key,
    status: &FullStatus,
) -> Vec<OtherKeyOnOwnInitiator> {
    status
        .registrations
        .iter()
        .filter(|r| r.key != ours && own.iter().any(|o| o.is(&r.transport_id)))
        .map(|r| OtherKeyOnOwnInitiator {
            registrant: r.transport_id.to_string(),
            key: r.key.to_string(),
        })
        .collect()
}

/// Every registrant in `status` that carries `ours` under an initiator that is none of `own`:
/// another node holding this node's key. Two nodes with one key are one node to every fence: a
/// fence of either removes both, and a fence by name removes only what its name derives.
pub fn own_key_on_other_initiators(
    own: &[OwnInitiator],
    ours: Key,
    status: &FullStatus,
) -> Vec<String> {
    status
        .registrations
        .iter()
        .filter(|r| r.key == ours && !own.iter().any(|o| o.is(&r.transport_id)))
        .map(|r| r.transport_id.to_string())
        .collect()
}

impl OwnInitiator {
    /// What to do about an [`OtherKeyOnOwnInitiator`] of this initiator's.
    pub fn advice(&self) -> &'static str {
        match self {
            OwnInitiator::Iscsi(_) => {
                "give every node its own initiator name (/etc/iscsi/initiatorname.iscsi, e.g. \
             from `iscsi-iname`), log in again, then run `prfence unfence` on each node; if \
             the key is this node's old one, `prfence unfence` with the right key replaces it"
            }
            OwnInitiator::NvmeHost(_) => {
                "give every node its own host id (/etc/nvme/hostid, e.g. from `uuidgen`; `nvme \
             show-hostnqn` for the NQN), reconnect, then run `prfence unfence` on each node; \
             if the key is this node's old one, `prfence unfence` with the right key replaces \
             it"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pr::Registration;

    fn registered(key: u64, id: &str) -> Registration {
        Registration {
            key: Key::new(key),
            all_tg_pt: false,
            holder: false,
            scope: None,
            rtype: None,
            relative_target_port: 1,
            transport_id: id.parse().unwrap(),
        }
    }

    const HOST: &str = "0b8b0a8c-5c2a-4a8e-9a57-3f7d6d2c1e10";

    #[test]
    fn another_key_under_our_initiator_name_or_host_id_is_found() {
        let status = FullStatus {
            generation: 7,
            registrations: vec![
                registered(0xa, "iqn.2026-11.lab:nodea,i,0x23d000001"),
                registered(0xb, "IQN.2026-11.LAB:NODEA,i,0x23d000002"),
                registered(0xb, "iqn.2026-11.lab:nodeb,i,0x23d000001"),
                registered(0xc, &format!("nvme-hostid:{HOST}")),
            ],
        };
        let own = [
            OwnInitiator::Iscsi("iqn.2026-11.lab:nodea".into()),
            OwnInitiator::NvmeHost(HOST.into()),
        ];
        let found = other_keys_on_own_initiators(&own, Key::new(0xa), &status);
        let keys: Vec<(&str, &str)> = found
            .iter()
            .map(|f| (f.registrant.as_str(), f.key.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("IQN.2026-11.LAB:NODEA,i,0x23d000002", "0x000000000000000b"),
                (
                    "nvme-hostid:0b8b0a8c-5c2a-4a8e-9a57-3f7d6d2c1e10",
                    "0x000000000000000c"
                ),
            ]
        );
        // our own key under our name, and other nodes' keys under theirs, are nothing to say
        assert!(
            other_keys_on_own_initiators(&own[..1], Key::new(0xb), &status)
                .iter()
                .all(|f| f.registrant.to_ascii_lowercase().contains("nodea"))
        );
        assert!(other_keys_on_own_initiators(&[], Key::new(0xa), &status).is_empty());
    }

    #[test]
    fn our_key_under_another_initiator_is_found() {
        let status = FullStatus {
            generation: 3,
            registrations: vec![
                registered(0xa, "iqn.2026-11.lab:nodea,i,0x23d000001"),
                registered(0xa, "IQN.2026-11.LAB:NODEA,i,0x23d000002"),
                registered(0xb, "iqn.2026-11.lab:nodeb,i,0x23d000001"),
                registered(0xa, "iqn.2026-11.lab:nodec,i,0x23d000001"),
                registered(0xa, &format!("nvme-hostid:{HOST}")),
            ],
        };
        let own = [OwnInitiator::Iscsi("iqn.2026-11.lab:nodea".into())];
        assert_eq!(
            own_key_on_other_initiators(&own, Key::new(0xa), &status),
            [
                "iqn.2026-11.lab:nodec,i,0x23d000001".to_owned(),
                format!("nvme-hostid:{HOST}")
            ]
        );
        // node B's key is its own
        let b = [OwnInitiator::Iscsi("iqn.2026-11.lab:nodeb".into())];
        assert!(own_key_on_other_initiators(&b, Key::new(0xb), &status).is_empty());
    }
}
