//! Discovery asked again and again (the agent, at every check): a device's previous answer is
//! given again while nothing it was read from has changed, which a few reads show, instead of
//! walking every path's sysfs directory again (about 25 system calls per path, most of the
//! agent's per-check cost besides the READ KEYS themselves).
//!
//! Before an answer is given again:
//! - the listings of `class/block` and `class/iscsi_session` are what they were (once per
//!   round): no path appeared or went, no session logged in again, no `/dev/disk/by-id` link
//!   can have moved to a new device;
//! - each SCSI path's `device/state` has the same contents and the same inode number: a path
//!   that went offline or blocked is seen at once, and so is a device removed and added again
//!   under the same name between two rounds (sysfs numbers each new attribute afresh);
//! - a multipath map's `slaves` listing and its `dm/uuid` inode are unchanged: a path added to
//!   or dropped from the map, a map replaced under the same name.
//!
//! An answer is trusted only when these were the same just before and just after the discovery
//! that made it (so nothing changed while it ran), and it is given again at most
//! [`MAX_REUSES`] times before discovery runs afresh: each device in its own round of every
//! [`MAX_REUSES`] (by its place in the caller's list), so that a few devices are discovered
//! afresh at each round rather than all of them at once. NVMe namespaces are discovered afresh
//! every time. The rest of what discovery reads (identity, serial, session parameters) belongs
//! to a device for as long as it exists.
//!
//! An answer given again is not copied: the caller is told [`Repeated::Again`] and keeps what it
//! made of the previous one (a copy and its comparison were most of the agent's user-space work
//! per LU-check beside the READ KEYS, issue 48).
//!
//! Each path's `device/state` (and a map's `dm/uuid`) is read at every round, so it is kept open
//! between rounds where the caller has descriptors to spare (`hold`, files given back when it
//! shrinks): read again from its start (a read from offset 0 makes sysfs contents afresh), one
//! system call where opening it again takes four (the agent's largest cost per LU-check after
//! its READ KEYS, issue 48). Once its device is removed, sysfs fails the read (ENODEV), so a
//! device added again under the same name is a change, as its new inode number is for a file
//! opened afresh; off sysfs (the tests' trees) a held file is also checked still linked.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{DiscoverError, Discovery, Lu, entry_names, read_open};
use crate::transport::Protocol;

/// How many times in a row an answer is given again before discovery runs afresh: a bound on
/// how long a change none of the checks above sees (a VPD page rescanned in place, with no device
/// added, removed or set offline) can go unnoticed, in rounds (the agent's checks), not in time:
/// 10 minutes at the packaged 2 s interval. A full discovery costs about 30 system calls a path;
/// at 30 rounds it was most of the agent's cost per LU-check beyond the READ KEYS (issue 48).
pub const MAX_REUSES: u32 = 300;

/// One device's answer from [`Discovery::resolve_repeated`].
#[derive(Debug)]
pub enum Repeated {
    /// The answer given for this device at the previous call still stands: nothing it rests on
    /// changed. Valid only for a caller that took that answer in.
    Again,
    /// Discovered now.
    Found(Result<Vec<Lu>, DiscoverError>),
}

/// The previous answers, by device as given.
#[derive(Debug, Default)]
pub(super) struct Memo {
    inventory: Option<Inventory>,
    answers: HashMap<PathBuf, Answer>,
    /// Calls so far: device `i` is discovered afresh when `(round + i) % MAX_REUSES == 0`.
    round: u64,
}

/// The block devices and iSCSI sessions present.
#[derive(Debug, PartialEq, Eq)]
struct Inventory {
    block: Vec<String>,
    sessions: Vec<String>,
}

#[derive(Debug)]
struct Answer {
    lus: Vec<Lu>,
    /// What the answer rests on, as read just after the discovery that made it.
    watched: Vec<Watched>,
    /// `watched` read just before that discovery was the same: the answer may be given again.
    trusted: bool,
    reuses: u32,
}

/// One thing an answer rests on.
#[derive(Debug)]
enum Watched {
    /// A file's inode number and contents, and the file itself while it is held open.
    File {
        path: PathBuf,
        ino: u64,
        contents: Vec<u8>,
        held: Option<Held>,
    },
    /// A directory's entry names.
    Dir { path: PathBuf, names: Vec<String> },
}

/// What was read, whether or not the file is held.
impl PartialEq for Watched {
    fn eq(&self, other: &Watched) -> bool {
        match (self, other) {
            (
                Watched::File {
                    path,
                    ino,
                    contents,
                    ..
                },
                Watched::File {
                    path: p,
                    ino: i,
                    contents: c,
                    ..
                },
            ) => (path, ino, contents) == (p, i, c),
            (Watched::Dir { path, names }, Watched::Dir { path: p, names: n }) => {
                (path, names) == (p, n)
            }
            _ => false,
        }
    }
}

/// A file kept open between rounds.
#[derive(Debug)]
struct Held {
    file: std::fs::File,
    /// On sysfs, where a removed device's file fails the read: no link count to check.
    sysfs: bool,
}

/// The longest contents a held file is compared in place (a path's state is a word).
const HELD_READ: usize = 64;

impl Watched {
    /// `path` read now; kept open when `hold` has room left (taking one from it).
    fn file(path: PathBuf, hold: &mut usize) -> Option<Watched> {
        let mut file = std::fs::File::open(&path).ok()?;
        let ino = file.metadata().ok()?.ino();
        let contents = read_open(&mut file).ok()?;
        let held = (*hold > 0 && contents.len() < HELD_READ).then(|| {
            *hold -= 1;
            let sysfs = nix::sys::statfs::fstatfs(&file)
                .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::SYSFS_MAGIC);
            Held { file, sysfs }
        });
        Some(Watched::File {
            path,
            ino,
            contents,
            held,
        })
    }

    fn dir(path: PathBuf) -> Option<Watched> {
        let names = entry_names(&path).ok()?;
        Some(Watched::Dir { path, names })
    }

    fn unchanged(&self) -> bool {
        match self {
            Watched::File {
                held: Some(Held { file, sysfs }),
                contents,
                ..
            } => {
                use std::os::unix::fs::FileExt;
                let mut now = [0u8; HELD_READ];
                // On sysfs a removed device's file fails the read (ENODEV: kernfs deactivates
                // the node, and every open file of it with it), so the read alone tells; the
                // link count is for a tree that is not sysfs (the tests'), where a removed file
                // still reads. One system call a path per round instead of two (issue 48).
                file.read_at(&mut now, 0)
                    .is_ok_and(|n| now.get(..n) == Some(contents))
                    && (*sysfs || file.metadata().is_ok_and(|m| m.nlink() > 0))
            }
            Watched::File {
                path,
                ino,
                contents,
                held: None,
            } => read_with_inode(path).is_ok_and(|(i, c)| i == *ino && c == *contents),
            Watched::Dir { path, names } => entry_names(path).is_ok_and(|n| n == *names),
        }
    }

    fn is_held(&self) -> bool {
        matches!(self, Watched::File { held: Some(_), .. })
    }

    /// Closes a held file: it is opened at each round from now on.
    fn let_go(&mut self) {
        if let Watched::File { held, .. } = self {
            *held = None;
        }
    }
}

fn read_with_inode(path: &Path) -> std::io::Result<(u64, Vec<u8>)> {
    let mut file = std::fs::File::open(path)?;
    let ino = file.metadata()?.ino();
    Ok((ino, read_open(&mut file)?))
}

impl Memo {
    /// Files held open by every answer, for tests of the budget.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.answers.values().map(|a| held(&a.watched)).sum()
    }
}

/// How many files an answer holds open.
fn held(watched: &[Watched]) -> usize {
    watched.iter().filter(|w| w.is_held()).count()
}

impl Discovery {
    /// [`Discovery::resolve`] of each device on its own, for a caller that asks every few
    /// seconds: a device's previous answer is given again while what it rests on is unchanged
    /// (see the module). `fresh[i]`: discover device `i` afresh (a command on one of its paths
    /// failed, so the caller is about to open it again). `hold`: how many descriptors the
    /// answers may keep open between calls (files they watch).
    pub fn resolve_repeated(
        &self,
        devices: &[PathBuf],
        fresh: &[bool],
        hold: usize,
    ) -> Vec<Repeated> {
        let inventory = self.inventory();
        let mut memo = self
            .repeated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        memo.round += 1;
        let round = memo.round;
        if inventory.is_none() || memo.inventory != inventory {
            for answer in memo.answers.values_mut() {
                answer.trusted = false;
            }
            memo.inventory = inventory;
        }
        if memo.answers.len() > devices.len() {
            let asked: HashSet<&PathBuf> = devices.iter().collect();
            memo.answers.retain(|device, _| asked.contains(device));
        }
        // What is held already counts against `hold`; past it (the caller's spare shrank as paths
        // appeared), files are given back.
        let mut hold = hold;
        for watched in memo.answers.values_mut().flat_map(|a| a.watched.iter_mut()) {
            if watched.is_held() {
                if hold > 0 {
                    hold -= 1;
                } else {
                    watched.let_go();
                }
            }
        }
        let mut results = Vec::with_capacity(devices.len());
        for (index, device) in devices.iter().enumerate() {
            let fresh = fresh.get(index).copied().unwrap_or(true)
                || (round + index as u64).is_multiple_of(u64::from(MAX_REUSES));
            if let Some(answer) = memo.answers.get_mut(device)
                && !fresh
                && answer.trusted
                && answer.reuses < MAX_REUSES
                && answer.watched.iter().all(Watched::unchanged)
            {
                answer.reuses += 1;
                results.push(Repeated::Again);
                continue;
            }
            let before = memo.answers.remove(device).and_then(|previous| {
                hold += held(&previous.watched);
                self.watch_list(device, &previous.lus, &mut 0)
            });
            let result = self.resolve(std::slice::from_ref(device));
            if let Ok(lus) = &result
                && let Some(watched) = self.watch_list(device, lus, &mut hold)
            {
                let trusted = memo.inventory.is_some() && before.as_ref() == Some(&watched);
                memo.answers.insert(
                    device.clone(),
                    Answer {
                        lus: lus.clone(),
                        watched,
                        trusted,
                        reuses: 0,
                    },
                );
            }
            results.push(Repeated::Found(result));
        }
        results
    }

    /// `None` if a listing cannot be read: then no answer is given again.
    fn inventory(&self) -> Option<Inventory> {
        let sessions = self.sys.join("class/iscsi_session");
        Some(Inventory {
            block: entry_names(&self.sys.join("class/block")).ok()?,
            // No iSCSI initiator loaded: no sessions (the directory appears with the module).
            sessions: if sessions.exists() {
                entry_names(&sessions).ok()?
            } else {
                Vec::new()
            },
        })
    }

    /// What an answer for `device` rests on, read now, holding files open while `hold` has room;
    /// `None` when it cannot be given again (an NVMe path, something unreadable).
    fn watch_list(&self, device: &Path, lus: &[Lu], hold: &mut usize) -> Option<Vec<Watched>> {
        // Taken from `hold` only when the list is made: a failure midway closes what it opened.
        let mut left = *hold;
        let watched = self.watch_list_within(device, lus, &mut left)?;
        *hold = left;
        Some(watched)
    }

    fn watch_list_within(
        &self,
        device: &Path,
        lus: &[Lu],
        hold: &mut usize,
    ) -> Option<Vec<Watched>> {
        let mut watched = Vec::new();
        let name = self.kernel_name(device).ok()?;
        if name.starts_with("dm-") {
            let map = self.sys.join("class/block").join(&name);
            watched.push(Watched::dir(map.join("slaves"))?);
            watched.push(Watched::file(map.join("dm/uuid"), hold)?);
        }
        for path in lus.iter().flat_map(|lu| &lu.paths) {
            if path.protocol != Protocol::Scsi {
                return None;
            }
            let generic = self.sys.join("class/scsi_generic").join(&path.name);
            let class = if generic.exists() {
                generic
            } else {
                self.sys.join("class/block").join(&path.name)
            };
            watched.push(Watched::file(class.join("device/state"), hold)?);
        }
        Some(watched)
    }
}
