//! A node's record of its boot ([`BootRecord`]) kept in memory, as fence_pr keeps its `.lus`
//! file: for the engine's tests and the simulation's nodes.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::discover::LuId;
use crate::ops::BootRecord;

#[derive(Debug, Default)]
pub struct MemoryRecord(Mutex<BTreeSet<LuId>>);

impl MemoryRecord {
    /// A record holding `lus` already (their `on` ran before).
    pub fn of(lus: impl IntoIterator<Item = LuId>) -> MemoryRecord {
        MemoryRecord(Mutex::new(lus.into_iter().collect()))
    }

    /// Whether an LU whose identifier is `lu` is in the record.
    pub fn has(&self, lu: &str) -> bool {
        self.lus().iter().any(|id| *id == *lu)
    }

    /// Forgets every LU: the node rebooted.
    pub fn clear(&self) {
        self.lus().clear();
    }

    fn lus(&self) -> MutexGuard<'_, BTreeSet<LuId>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BootRecord for MemoryRecord {
    fn contains(&self, lu: &LuId) -> bool {
        self.lus().contains(lu)
    }

    fn add(&self, lu: &LuId) -> Result<(), String> {
        self.lus().insert(lu.clone());
        Ok(())
    }
}
