//! The set of LUs a node fences over, in a form two nodes can compare. P2 rests on every node
//! naming the same LUs: the arbiter is the LU with the lowest identifier among them, and a node
//! that names another set can pick another arbiter. Nothing on the storage can tell; an admin
//! (or the lab) compares this across nodes: `prfence doctor` prints it, the agent publishes it.

use serde::Serialize;

use crate::discover::LuId;

/// The LU set as seen by this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LuSet {
    /// How many LUs, identified or not.
    pub count: usize,
    /// The LU with the lowest identifier: the arbiter of `fence` (None if none is identified).
    pub arbiter: Option<String>,
    /// FNV-1a (64 bits, hex) of the sorted identifiers, each after its length: equal on two
    /// nodes that name the same LUs, whatever their device names and order.
    pub fingerprint: String,
    /// LUs whose identifier this node could not read (named by a device path, or not yet
    /// discovered): while any is, the set cannot be compared and `fence` sends nothing.
    pub unidentified: usize,
}

impl LuSet {
    /// The set of `ids` (`None`: not discovered yet); duplicates count once.
    pub fn of<I: Into<LuId>>(ids: impl IntoIterator<Item = Option<I>>) -> LuSet {
        let mut identified: Vec<String> = Vec::new();
        let mut unidentified = 0;
        for id in ids {
            match id.map(Into::into) {
                Some(LuId::Designator(id)) => identified.push(id.into()),
                Some(LuId::NodeLocal(_)) | None => unidentified += 1,
            }
        }
        identified.sort_unstable();
        identified.dedup();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        // Each identifier after its length, so that no two sets hash the same bytes.
        let bytes = identified.iter().flat_map(|id| {
            (id.len() as u64)
                .to_le_bytes()
                .into_iter()
                .chain(id.bytes())
        });
        for byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        LuSet {
            count: identified.len() + unidentified,
            arbiter: identified.first().cloned(),
            fingerprint: format!("{hash:016x}"),
            unidentified,
        }
    }
}

impl std::fmt::Display for LuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} LU{}, arbiter {}, fingerprint {}",
            self.count,
            if self.count == 1 { "" } else { "s" },
            self.arbiter.as_deref().unwrap_or("none"),
            self.fingerprint
        )?;
        if self.unidentified > 0 {
            write!(
                f,
                " ({} not identified: not comparable until they are)",
                self.unidentified
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_lus_give_the_same_fingerprint_in_any_order() {
        let a = LuSet::of([Some("naa.2"), Some("naa.1"), Some("naa.2")]);
        let b = LuSet::of([Some("naa.1"), Some("naa.2")]);
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(a.arbiter.as_deref(), Some("naa.1"));
        assert_eq!((a.count, a.unidentified), (2, 0));
    }

    #[test]
    fn another_set_gives_another_fingerprint() {
        let two = LuSet::of([Some("naa.1"), Some("naa.2")]);
        for other in [
            LuSet::of([Some("naa.1")]),
            LuSet::of([Some("naa.1"), Some("naa.3")]),
            // Not the same as two identifiers run together.
            LuSet::of([Some("naa.1\nnaa.2")]),
            LuSet::of([Some("naa.1"), Some("naa.2"), Some("naa.3")]),
        ] {
            assert_ne!(other.fingerprint, two.fingerprint, "{other}");
        }
    }

    #[test]
    fn unidentified_lus_are_counted_and_said() {
        let set = LuSet::of([Some("naa.2"), Some("/dev/sdq"), None]);
        assert_eq!((set.count, set.unidentified), (3, 2));
        assert_eq!(set.arbiter.as_deref(), Some("naa.2"));
        assert_eq!(set.fingerprint, LuSet::of([Some("naa.2")]).fingerprint);
        assert!(set.to_string().contains("2 not identified"), "{set}");
        assert_eq!(LuSet::of([None::<&str>]).arbiter, None);
    }
}
