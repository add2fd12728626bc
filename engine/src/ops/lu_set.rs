//! The set of LUs a node fences over, in a form two nodes can compare. P2 rests on every node
//! naming the same LUs: the arbiter is the LU with the lowest identifier among them, and a node
//! that names another set can pick another arbiter. Nothing on the storage can tell; an admin
//! (or the lab) compares this across nodes: `prfence doctor` prints it, the agent publishes it.
//! The agent also compares through the registrations ([`keys_not_on_every_lu`]): another node's
//! key on part of this node's LUs says that node names another set.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::discover::LuId;
use crate::pr::Key;

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

/// Other nodes' keys registered on some of this node's LUs and not on the others, from one
/// READ KEYS per LU (`None`: not read this time, left out): each such key with the indexes of
/// the read LUs that lack it, by key. Every node registers on every LU of the cluster's set
/// (fence_pr's `on`), so a key on part of them is a node whose LU set differs from this one's
/// (it would pick its arbiter among other LUs: P2), or a registration half done or half
/// removed. Two nodes whose sets differ see it from one side at least: the one whose set has an
/// LU the other's lacks.
pub fn keys_not_on_every_lu(read: &[Option<&[Key]>], ours: Key) -> Vec<(Key, Vec<usize>)> {
    let mut keys: Vec<Key> = read
        .iter()
        .flatten()
        .flat_map(|keys| keys.iter().copied())
        .filter(|k| *k != ours)
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| {
            let missing: Vec<usize> = read
                .iter()
                .enumerate()
                .filter_map(|(at, keys)| keys.filter(|k| !k.contains(&key)).map(|_| at))
                .collect();
            (!missing.is_empty()).then_some((key, missing))
        })
        .collect()
}

/// [`keys_not_on_every_lu`] over time: a fence or an unfencing under way leaves a key on part
/// of the LUs for a moment, so a key is reported once it has lacked the same LUs for `settle`.
#[derive(Debug, Default)]
pub struct LastingPartialKeys {
    since: Vec<(Key, Vec<usize>, Instant)>,
}

impl LastingPartialKeys {
    /// Takes this check's findings (`found`, at `now`); returns those that have lasted `settle`.
    pub fn observe(
        &mut self,
        now: Instant,
        settle: Duration,
        found: Vec<(Key, Vec<usize>)>,
    ) -> Vec<(Key, Vec<usize>)> {
        let since = std::mem::take(&mut self.since);
        self.since = found
            .into_iter()
            .map(|(key, missing)| {
                let first = since
                    .iter()
                    .find(|(k, m, _)| *k == key && *m == missing)
                    .map_or(now, |(_, _, at)| *at);
                (key, missing, first)
            })
            .collect();
        self.since
            .iter()
            .filter(|(_, _, at)| now.saturating_duration_since(*at) >= settle)
            .map(|(key, missing, _)| (*key, missing.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_on_part_of_the_lus_is_found_with_the_lus_it_lacks() {
        let (ours, b, c) = (Key::new(0xa), Key::new(0xb), Key::new(0xc));
        let all = [ours, b, c];
        let some = [ours, c];
        let read = [Some(&all[..]), Some(&some[..]), None, Some(&all[..])];
        // b lacks LU 1; the unread LU 2 counts for nothing; c and our own key are everywhere
        assert_eq!(keys_not_on_every_lu(&read, ours), vec![(b, vec![1])]);
        assert!(keys_not_on_every_lu(&[Some(&all[..]), Some(&all[..])], ours).is_empty());
        // our own key missing is the watch's business (fenced), never this
        assert!(keys_not_on_every_lu(&[Some(&all[..]), Some(&[b, c][..])], ours).is_empty());
        assert!(keys_not_on_every_lu(&[None, None], ours).is_empty());
    }

    #[test]
    fn a_partial_key_is_reported_once_it_lasted_and_forgotten_once_gone() {
        let b = Key::new(0xb);
        let mut seen = LastingPartialKeys::default();
        let t0 = Instant::now();
        let settle = Duration::from_secs(10);
        assert!(seen.observe(t0, settle, vec![(b, vec![1])]).is_empty());
        let t = |s| t0 + Duration::from_secs(s);
        assert!(seen.observe(t(9), settle, vec![(b, vec![1])]).is_empty());
        assert_eq!(
            seen.observe(t(10), settle, vec![(b, vec![1])]),
            vec![(b, vec![1])]
        );
        // lacking other LUs now: a new finding, its own wait
        assert!(
            seen.observe(t(11), settle, vec![(b, vec![1, 2])])
                .is_empty()
        );
        assert!(seen.observe(t(12), settle, vec![]).is_empty());
        assert!(seen.observe(t(30), settle, vec![(b, vec![1])]).is_empty());
    }

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
