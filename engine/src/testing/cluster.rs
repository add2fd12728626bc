//! A cluster in a test: N nodes × M LUs, each node with its own paths to every LU, over one of
//! the target models (SPC with or without LIO's quirks, or Linux nvmet). Tests and the
//! simulation build their nodes' views of the LUs from it ([`Cluster::targets`]) and read the
//! target's own state back from it, as the lab reads LIO's configfs.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::ops::{LuTarget, OwnInitiator};
use crate::pr::{Key, ReservationType, TransportId};
use crate::spc_model::{Io, ModelLu, Nexus, Quirks, iscsi_initiator};
use crate::testing::nvmet::{Namespace, NvmetHost};

/// Which target the LUs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetModel {
    /// SCSI logical units, registrations per I_T nexus.
    Scsi(Quirks),
    /// NVMe namespaces, registrations per host; `linux_preempt`: nvmet's rule that a holder's
    /// PREEMPT only changes the reservation type.
    Nvmet { linux_preempt: bool },
}

/// One LU's state at the target.
#[derive(Debug, Clone)]
pub enum Medium {
    Scsi(Arc<Mutex<ModelLu>>),
    Nvme(Arc<Mutex<Namespace>>),
}

/// Where a path meets the target: an I_T nexus, or (NVMe) the host, whatever the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Port {
    Nexus(Nexus),
    Host(NvmetHost),
}

/// One path as a test builds its transport: which LU, node and path, its device name, the LU's
/// state and the path's port at the target now.
#[derive(Debug, Clone)]
pub struct ClusterPath {
    pub lu: usize,
    pub node: usize,
    pub path: usize,
    pub device: PathBuf,
    pub medium: Medium,
    pub port: Port,
}

/// N nodes × M LUs × paths over one target model.
#[derive(Debug)]
pub struct Cluster {
    pub model: TargetModel,
    pub lus: Vec<Medium>,
    /// `[lu][node][path]`: each path's port now (an iSCSI re-login changes it).
    pub ports: Vec<Vec<Vec<Port>>>,
    relogins: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked holding a model has failed already; its state is still worth reading.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Node `node`'s iSCSI initiator port for path `path`.
pub fn initiator(node: usize, path: usize) -> TransportId {
    iscsi_initiator(&format!("node{node}"), &format!("23d00000{path}"))
}

/// Node `node`'s NVMe host identifier.
pub fn host_id(node: usize) -> NvmetHost {
    let mut id = [0u8; 16];
    id[0] = 0xa0;
    id[15] = u8::try_from(node).unwrap_or(u8::MAX);
    id
}

impl Cluster {
    /// `lus` LUs; node `i` has `paths_per_node[i]` paths to each (one I_T nexus each on SCSI,
    /// through target port `path + 1`).
    pub fn new(model: TargetModel, lus: usize, paths_per_node: &[usize]) -> Self {
        match model {
            TargetModel::Scsi(quirks) => {
                let initiators: Vec<Vec<(TransportId, u16)>> = paths_per_node
                    .iter()
                    .enumerate()
                    .map(|(node, &paths)| {
                        (0..paths)
                            .map(|p| (initiator(node, p), u16::try_from(p + 1).unwrap_or(u16::MAX)))
                            .collect()
                    })
                    .collect();
                Self::scsi_with_initiators(quirks, lus, &initiators)
            }
            TargetModel::Nvmet { linux_preempt } => {
                let media = (0..lus)
                    .map(|_| {
                        Medium::Nvme(Arc::new(Mutex::new(Namespace {
                            holder_preempt_changes_type_only: linux_preempt,
                            ..Namespace::default()
                        })))
                    })
                    .collect();
                let ports = (0..lus)
                    .map(|_| {
                        paths_per_node
                            .iter()
                            .enumerate()
                            .map(|(node, &paths)| vec![Port::Host(host_id(node)); paths])
                            .collect()
                    })
                    .collect();
                Cluster {
                    model,
                    lus: media,
                    ports,
                    relogins: 0,
                }
            }
        }
    }

    /// `lus` SCSI LUs; node `i` reaches each through the initiator ports `initiators[i]`, each
    /// with the target port it logs in to (one I_T nexus per path), for a test that names its
    /// sessions.
    pub fn scsi_with_initiators(
        quirks: Quirks,
        lus: usize,
        initiators: &[Vec<(TransportId, u16)>],
    ) -> Self {
        let mut media = Vec::with_capacity(lus);
        let mut ports = Vec::with_capacity(lus);
        for _ in 0..lus {
            let mut lu = ModelLu::new(quirks);
            let per_node = initiators
                .iter()
                .map(|paths| {
                    paths
                        .iter()
                        .map(|(initiator, port)| Port::Nexus(lu.connect(initiator.clone(), *port)))
                        .collect()
                })
                .collect();
            media.push(Medium::Scsi(Arc::new(Mutex::new(lu))));
            ports.push(per_node);
        }
        Cluster {
            model: TargetModel::Scsi(quirks),
            lus: media,
            ports,
            relogins: 0,
        }
    }

    /// LU `lu`'s SCSI model (`None` on NVMe).
    pub fn scsi_lu(&self, lu: usize) -> Option<&Arc<Mutex<ModelLu>>> {
        match &self.lus[lu] {
            Medium::Scsi(l) => Some(l),
            Medium::Nvme(_) => None,
        }
    }

    /// The I_T nexus of a SCSI path now (`None` on NVMe).
    pub fn nexus(&self, lu: usize, node: usize, path: usize) -> Option<Nexus> {
        match self.ports[lu][node][path] {
            Port::Nexus(nexus) => Some(nexus),
            Port::Host(_) => None,
        }
    }

    pub fn nodes(&self) -> usize {
        self.ports.first().map_or(0, Vec::len)
    }

    pub fn paths(&self, lu: usize, node: usize) -> usize {
        self.ports[lu][node].len()
    }

    /// The LU's identifier (a VPD 83h NAA designator); LUs sort in index order.
    pub fn lu_id(lu: usize) -> String {
        format!("naa.6001405000000{lu:03}")
    }

    /// The device node of a path, as the node names it.
    pub fn device(node: usize, lu: usize, path: usize) -> String {
        format!("/dev/n{node}l{lu}p{path}")
    }

    /// Who node `node` is to the target, as an unfence is told ([`crate::ops::unfence_observed`]):
    /// its iSCSI initiator name on the SCSI model; on the NVMe model nothing (not checked).
    pub fn own_initiators(&self, node: usize) -> Vec<OwnInitiator> {
        match (&self.model, initiator(node, 0)) {
            (TargetModel::Scsi(_), TransportId::Iscsi { name, .. }) => {
                vec![OwnInitiator::Iscsi(name)]
            }
            _ => Vec::new(),
        }
    }

    /// Node `node`'s view of every LU, each path's transport made by `make`, handed over in
    /// reverse LU order (the engine must sort).
    pub fn targets<T>(&self, node: usize, make: impl Fn(ClusterPath) -> T) -> Vec<LuTarget<T>> {
        (0..self.lus.len())
            .rev()
            .map(|lu| LuTarget {
                id: Self::lu_id(lu).into(),
                paths: (0..self.paths(lu, node))
                    .map(|path| make(self.spec(lu, node, path)))
                    .collect(),
            })
            .collect()
    }

    pub fn spec(&self, lu: usize, node: usize, path: usize) -> ClusterPath {
        ClusterPath {
            lu,
            node,
            path,
            device: PathBuf::from(Self::device(node, lu, path)),
            medium: self.lus[lu].clone(),
            port: self.ports[lu][node][path],
        }
    }

    /// The registered keys, one per registration (per I_T nexus on SCSI, per host on NVMe), in
    /// the target's order.
    pub fn keys(&self, lu: usize) -> Vec<Key> {
        match &self.lus[lu] {
            Medium::Scsi(l) => lock(l).registrations().iter().map(|r| r.key).collect(),
            Medium::Nvme(n) => lock(n)
                .registrants
                .iter()
                .map(|(_, k)| Key::new(*k))
                .collect(),
        }
    }

    pub fn has(&self, lu: usize, key: Key) -> bool {
        self.keys(lu).contains(&key)
    }

    /// The key a path is registered with now (NVMe: its host's).
    pub fn key_of(&self, lu: usize, node: usize, path: usize) -> Option<Key> {
        self.key_at(lu, self.ports[lu][node][path])
    }

    pub fn key_at(&self, lu: usize, port: Port) -> Option<Key> {
        match (&self.lus[lu], port) {
            (Medium::Scsi(l), Port::Nexus(nexus)) => lock(l).registered_key(nexus),
            (Medium::Nvme(n), Port::Host(host)) => lock(n).key_of(host).map(Key::new),
            _ => None,
        }
    }

    /// The reservation's type, if one exists.
    pub fn reservation(&self, lu: usize) -> Option<ReservationType> {
        match &self.lus[lu] {
            Medium::Scsi(l) => lock(l).reservation().map(|r| r.rtype),
            Medium::Nvme(n) => {
                let n = lock(n);
                crate::pr::nvme::scsi_type(n.rtype)
            }
        }
    }

    pub fn generation(&self, lu: usize) -> u32 {
        match &self.lus[lu] {
            Medium::Scsi(l) => lock(l).generation(),
            Medium::Nvme(n) => lock(n).generation,
        }
    }

    /// Whether a write through `port` would be accepted now (nothing is sent, no unit attention
    /// consumed).
    pub fn may_write(&self, lu: usize, port: Port) -> bool {
        match (&self.lus[lu], port) {
            (Medium::Scsi(l), Port::Nexus(nexus)) => lock(l).may_access(nexus, Io::Write),
            (Medium::Nvme(n), Port::Host(host)) => lock(n).may_write(host),
            _ => false,
        }
    }

    /// The keys, reservation and generation of every LU: equal snapshots mean nothing changed.
    pub fn snapshot(&self) -> Vec<(Vec<Key>, Option<ReservationType>, u32)> {
        (0..self.lus.len())
            .map(|lu| (self.keys(lu), self.reservation(lu), self.generation(lu)))
            .collect()
    }

    /// An iSCSI re-login of one path: the node's device now reaches the LU through a new I_T
    /// nexus (new ISID) and the old registration is orphaned. NVMe registrations belong to the
    /// host, so nothing changes there.
    pub fn relogin(&mut self, lu: usize, node: usize, path: usize) {
        if let (Medium::Scsi(l), Port::Nexus(nexus)) = (&self.lus[lu], self.ports[lu][node][path]) {
            self.relogins += 1;
            let isid = format!("{:x}", 0x23d1_0000_0000_u64 + u64::from(self.relogins));
            let new = lock(l).relogin(nexus, &isid);
            self.ports[lu][node][path] = Port::Nexus(new);
        }
    }

    /// A target power cycle of one LU (SCSI; without APTPL every registration is lost), or an
    /// NVMe controller reset (nvmet keeps its reservations in memory: all gone too).
    pub fn power_cycle(&mut self, lu: usize) {
        match &self.lus[lu] {
            Medium::Scsi(l) => {
                let mut l = lock(l);
                l.power_cycle();
                // Every session logs in again with the identity it had.
                for port in self.ports[lu].iter().flatten() {
                    if let Port::Nexus(nexus) = *port {
                        let (initiator, target_port) = l.identity(nexus);
                        let initiator = initiator.clone();
                        l.connect(initiator, target_port);
                    }
                }
            }
            Medium::Nvme(n) => {
                let mut n = lock(n);
                let linux = n.holder_preempt_changes_type_only;
                *n = Namespace {
                    holder_preempt_changes_type_only: linux,
                    ..Namespace::default()
                };
            }
        }
    }
}
