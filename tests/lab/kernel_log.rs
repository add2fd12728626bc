//! The guest kernel's log read by record sequence number (`/dev/kmsg`). Counting matching lines
//! in `dmesg` miscounts once the ring buffer wraps (old lines drop out as new ones arrive: a
//! count can stay the same across a new match) or a test clears it (`dmesg -C`); a record's
//! sequence number only grows, so "after this mark" stays exact.

use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;

use anyhow::Context;

/// A point in the kernel log: the sequence number of the newest record when it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark(u64);

/// One kernel log record.
#[derive(Debug, Clone)]
pub struct Record {
    pub seq: u64,
    /// When, in microseconds of the kernel log's clock (since boot).
    pub micros: u64,
    pub text: String,
}

/// Every record the kernel still holds, oldest first (records overwritten while reading are
/// skipped: the kernel says so with EPIPE).
pub fn records() -> anyhow::Result<Vec<Record>> {
    let mut kmsg = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .context("open /dev/kmsg")?;
    let mut records = Vec::new();
    // One record per read; the kernel refuses a buffer smaller than the record.
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match kmsg.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => records.extend(parse(&String::from_utf8_lossy(&buf[..n]))),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(e).context("read /dev/kmsg"),
        }
    }
    Ok(records)
}

/// `prio,seq,usec,flags[,…];text` (continuation lines after it are ignored).
fn parse(record: &str) -> Option<Record> {
    let (head, text) = record.split_once(';')?;
    let mut fields = head.split(',').skip(1);
    let seq = fields.next()?.parse().ok()?;
    let micros = fields.next()?.parse().ok()?;
    let text = text.lines().next().unwrap_or_default().to_owned();
    Some(Record { seq, micros, text })
}

/// The newest record now: what comes after it is new.
pub fn mark() -> anyhow::Result<Mark> {
    Ok(Mark(records()?.last().map_or(0, |r| r.seq)))
}

/// How many records after `mark` contain `needle`.
pub fn count_since(mark: Mark, needle: &str) -> anyhow::Result<usize> {
    Ok(records()?
        .iter()
        .filter(|r| r.seq > mark.0 && r.text.contains(needle))
        .count())
}
