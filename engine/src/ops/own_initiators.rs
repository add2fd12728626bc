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

use crate::pr::{FullStatus, Key, TransportId};

/// One initiator identity of this node's, as READ FULL STATUS can name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OwnInitiator {
    /// An iSCSI initiator name: every ISID (session) under it is this node's.
    Iscsi(String),
    /// An NVMe host id (a UUID): NVMe registers the host, once for all its controllers.
    NvmeHost(String),
}

impl OwnInitiator {
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
}
