//! The configuration's typed values as serde reads them: durations, and the enums a field names
//! by a word. Each parses its text as the file is read, but a text that does not parse is not a
//! syntax error: it is kept ([`Parsed`]) until validation asks for the value, so the refusal
//! names the field (`lease.renew: "5" has no unit…`) and says what the field accepts, in the
//! order validation checks the fields.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Visitor};

use super::{ConfigError, field_error};

/// A value given as text: parsed (`Ok`) or refused with the reason (`Err`, which validation
/// reports under the field's name). Anything but a string is a syntax error, as for other fields.
#[derive(Debug)]
pub(super) struct Parsed<T>(Result<T, String>);

impl<T> Parsed<T> {
    /// The value, or the field's error.
    pub(super) fn get(self, field: &str) -> Result<T, ConfigError> {
        self.0.map_err(|problem| field_error(field, problem))
    }
}

/// `field`'s value (`None`: not in the file) or, when absent, `default`'s.
pub(super) fn or_default<T: FromStr<Err = String>>(
    field: &str,
    value: Option<Parsed<T>>,
    default: &str,
) -> Result<T, ConfigError> {
    value.unwrap_or_else(|| Parsed(default.parse())).get(field)
}

impl<'de, T: FromStr<Err = String>> Deserialize<'de> for Parsed<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text<T>(PhantomData<T>);
        impl<T: FromStr<Err = String>> Visitor<'_> for Text<T> {
            type Value = Parsed<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Parsed<T>, E> {
                Ok(Parsed(text.parse()))
            }
        }
        deserializer.deserialize_str(Text(PhantomData))
    }
}

/// A duration as the file writes it: `"500ms"`, `"2s"`, `"1m"`, `"1h"` ([`parse_duration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ConfigDuration(pub(super) Duration);

impl FromStr for ConfigDuration {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        parse_duration(text).map(ConfigDuration)
    }
}

/// Parses `"500ms"`, `"2s"`, `"1m"`, `"1h"`: a whole number followed by a unit. A bare number is
/// refused because its unit would be a guess.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit; write e.g. \"500ms\", \"2s\", \"1m\""))?;
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    value
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// `watch.path_audit`: `"off"`, or how often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PathAudit(pub(super) Option<Duration>);

impl FromStr for PathAudit {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "off" => Ok(PathAudit(None)),
            every => parse_duration(every).map(|d| PathAudit(Some(d))),
        }
    }
}

/// `mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Watch,
    Lease,
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "watch" => Ok(Mode::Watch),
            "lease" => Ok(Mode::Lease),
            other => Err(format!(
                "{other:?} is not a mode; use \"watch\" or \"lease\""
            )),
        }
    }
}

/// `key.derive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyDerive {
    Native,
    FenceScsi,
}

impl FromStr for KeyDerive {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "native" => Ok(KeyDerive::Native),
            "fence_scsi" => Ok(KeyDerive::FenceScsi),
            other => Err(format!("{other:?} is not \"native\" or \"fence_scsi\"")),
        }
    }
}

/// `key.key_value`: fence_scsi's `key_value` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyValue {
    Id,
    Hash,
}

impl FromStr for KeyValue {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "id" => Ok(KeyValue::Id),
            "hash" => Ok(KeyValue::Hash),
            other => Err(format!(
                "{other:?} is not \"id\" or \"hash\" (fence_scsi's key_value)"
            )),
        }
    }
}

/// `log.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LogFormat {
    Text,
    Json,
}

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("{other:?} is not \"text\" or \"json\"")),
        }
    }
}
