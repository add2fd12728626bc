//! TEMPORARY stand-in for `crate::pr::Key` until the PR codec branch is merged.
//!
//! The API mirrors the codec's fixed one (`Key::new`, `get`, `is_zero`, `Display` as
//! `0x%016x`, `FromStr` hex). The lead replaces `use super::shim::Key` with `use crate::pr::Key`
//! and deletes this file; nothing else in `daemon` depends on it.

use std::fmt;
use std::str::FromStr;

/// A PERSISTENT RESERVE reservation key (8 bytes on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(u64);

impl Key {
    pub const fn new(value: u64) -> Key {
        Key(value)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

/// Why a key string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a reservation key: expected 1 to 16 hex digits, optionally prefixed by 0x"
)]
pub struct ParseKeyError {
    text: String,
}

impl FromStr for Key {
    type Err = ParseKeyError;

    fn from_str(text: &str) -> Result<Key, ParseKeyError> {
        let digits = text
            .strip_prefix("0x")
            .or_else(|| text.strip_prefix("0X"))
            .unwrap_or(text);
        let refuse = || ParseKeyError {
            text: text.to_owned(),
        };
        if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(refuse());
        }
        u64::from_str_radix(digits, 16)
            .map(Key)
            .map_err(|_| refuse())
    }
}
