//! Watch mode: this node's own initiator registered with a key not its own
//! ([`crate::ops::other_keys_on_own_initiators`]): a cloned initiator name or NVMe host id, or
//! this node's earlier key. Asked only where our key is registered fewer times than the LU's
//! paths expect, once per PRgeneration, by one READ FULL STATUS run beside the checks (never
//! inside a check's budget, which the watchdog's timing rests on). What it finds makes the agent
//! `degraded`, or is added to the reason of a self-fence, naming the registrant and the key.

use std::sync::{Arc, Mutex};

use crate::daemon::executor::{Executor, first_live};
use crate::daemon::lock;
use crate::daemon::lu_table::LuEntry;
use crate::ops::{OtherKeyOnOwnInitiator, OwnInitiator, other_keys_on_own_initiators};
use crate::pr::{Key, PrInAction, ReadKeys};
use crate::transport::Command;

/// One LU's last look.
#[derive(Debug, Default, Clone)]
struct Look {
    /// The PRgeneration of the READ KEYS that asked for it (asked again only when it changes).
    generation: Option<u32>,
    in_flight: bool,
    found: Vec<OtherKeyOnOwnInitiator>,
    /// What to do, for the initiators found.
    advice: Option<&'static str>,
}

/// Per LU (table order), what the last READ FULL STATUS found; shared with the reads under way.
#[derive(Debug, Clone, Default)]
pub(in crate::daemon) struct OwnInitiatorLooks(Arc<Mutex<Vec<Look>>>);

impl OwnInitiatorLooks {
    /// After a check: forget the LUs where our key is registered as often as expected, and start
    /// a read on each other LU whose generation changed since its last one.
    pub(in crate::daemon) fn after_check(
        &self,
        exec: &Arc<Executor>,
        lus: &[LuEntry],
        keys: &[Option<&ReadKeys>],
        ours: Key,
    ) {
        let mut looks = lock(&self.0);
        looks.resize_with(lus.len(), Look::default);
        for (index, (lu, read)) in lus.iter().zip(keys).enumerate() {
            let Some(read) = read else { continue };
            let look = &mut looks[index];
            let registered = read.keys.iter().filter(|&&k| k == ours).count();
            if registered >= lu.registrations_expected() {
                *look = Look::default();
                continue;
            }
            let mut own: Vec<OwnInitiator> = lu
                .paths
                .iter()
                .filter_map(|p| p.spec.initiator.clone())
                .collect();
            own.sort();
            own.dedup();
            if own.is_empty() || look.in_flight || look.generation == Some(read.generation) {
                continue;
            }
            let Some(path) = first_live(&lu.paths).map(|i| lu.paths[i].clone()) else {
                continue;
            };
            look.in_flight = true;
            look.generation = Some(read.generation);
            let (exec, shared, name) = (Arc::clone(exec), Arc::clone(&self.0), lu.name.clone());
            tokio::spawn(async move {
                let status = exec
                    .run(&path, Command::PrIn(PrInAction::ReadFullStatus), |t| {
                        t.read_full_status()
                    })
                    .await;
                let found = match &status {
                    Ok(status) => other_keys_on_own_initiators(&own, ours, status),
                    Err(e) => {
                        tracing::debug!(lu = %name, error = %e, "READ FULL STATUS failed");
                        Vec::new()
                    }
                };
                let advice = own.first().map(OwnInitiator::advice);
                let mut looks = lock(&shared);
                let Some(look) = looks.get_mut(index) else {
                    return;
                };
                look.in_flight = false;
                if status.is_err() {
                    return;
                }
                if found != look.found {
                    for f in &found {
                        tracing::error!(
                            lu = %name,
                            registrant = %f.registrant,
                            key = %f.key,
                            advice = advice.unwrap_or_default(),
                            "this node's initiator is registered with another key than {ours}"
                        );
                    }
                }
                look.found = found;
                look.advice = advice;
            });
        }
    }

    /// Per LU, what the last read found.
    pub(in crate::daemon) fn found(&self) -> Vec<Vec<OtherKeyOnOwnInitiator>> {
        lock(&self.0).iter().map(|l| l.found.clone()).collect()
    }

    /// Everything found, in words, for a self-fence's reason; `None` when nothing is.
    pub(in crate::daemon) fn describe(&self, names: &[String]) -> Option<String> {
        let looks = lock(&self.0);
        let mut parts = Vec::new();
        let mut advice = None;
        for (look, name) in looks.iter().zip(names) {
            for f in &look.found {
                parts.push(format!("{} carries key {} on {name}", f.registrant, f.key));
            }
            if !look.found.is_empty() {
                advice = advice.or(look.advice);
            }
        }
        (!parts.is_empty()).then(|| {
            format!(
                "this node's initiator is registered with another key: {} (a node sharing this \
                 node's initiator, which the target takes for one with it, or this node's old \
                 key); {}",
                parts.join(", "),
                advice.unwrap_or_default()
            )
        })
    }
}
