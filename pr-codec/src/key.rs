//! Reservation keys: the 8-byte values a registrant is known by.

use std::fmt;
use std::str::FromStr;

/// A SCSI reservation key (RESERVATION KEY / SERVICE ACTION RESERVATION KEY).
///
/// Displayed and serialized as `0x` followed by 16 lowercase hex digits, so keys line up in
/// columns and compare as strings the way they compare as numbers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Key(u64);

impl Key {
    /// The zero key: "not registered" as RESERVATION KEY, "unregister" as SERVICE ACTION KEY.
    pub const ZERO: Key = Key(0);

    pub const fn new(value: u64) -> Self {
        Key(value)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// The key as it appears on the wire (big-endian).
    pub const fn to_be_bytes(self) -> [u8; 8] {
        self.0.to_be_bytes()
    }

    pub const fn from_be_bytes(bytes: [u8; 8]) -> Self {
        Key(u64::from_be_bytes(bytes))
    }
}

impl From<u64> for Key {
    fn from(value: u64) -> Self {
        Key(value)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(0x{:016x})", self.0)
    }
}

/// A string that is not a reservation key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid reservation key {input:?}: {reason} (expected 1 to 16 hex digits, optional 0x)")]
pub struct KeyParseError {
    pub input: String,
    pub reason: &'static str,
}

impl FromStr for Key {
    type Err = KeyParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |reason| KeyParseError {
            input: input.to_owned(),
            reason,
        };
        let digits = input
            .strip_prefix("0x")
            .or_else(|| input.strip_prefix("0X"))
            .unwrap_or(input);
        if digits.is_empty() {
            return Err(fail("no hex digits"));
        }
        if digits.len() > 16 {
            return Err(fail("more than 16 hex digits"));
        }
        // from_str_radix alone would accept a leading '+'.
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(fail("not a hex number"));
        }
        u64::from_str_radix(digits, 16)
            .map(Key)
            .map_err(|_| fail("not a hex number"))
    }
}

impl serde::Serialize for Key {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_hex_with_and_without_prefix_in_any_case() {
        assert_eq!("0x1".parse::<Key>().unwrap(), Key::new(1));
        assert_eq!("0XaBc".parse::<Key>().unwrap(), Key::new(0xabc));
        assert_eq!("DEADbeef".parse::<Key>().unwrap(), Key::new(0xdead_beef));
        assert_eq!(
            "ffffffffffffffff".parse::<Key>().unwrap(),
            Key::new(u64::MAX)
        );
    }

    #[test]
    fn rejects_non_keys_and_names_the_input() {
        for bad in [
            "",
            "0x",
            "+1",
            "0x+1",
            "-1",
            "12345678901234567",
            "g",
            " 1",
            "0x 1",
        ] {
            let err = bad.parse::<Key>().unwrap_err();
            assert_eq!(err.input, bad);
            assert!(err.to_string().contains(&format!("{bad:?}")));
        }
    }

    #[test]
    fn displays_and_serializes_as_fixed_width_hex() {
        let key = Key::new(0xab);
        assert_eq!(key.to_string(), "0x00000000000000ab");
        assert_eq!(
            serde_json::to_string(&key).unwrap(),
            "\"0x00000000000000ab\""
        );
        assert_eq!(
            serde_json::from_str::<Key>("\"0xab\"").unwrap(),
            Key::new(0xab)
        );
        assert!(Key::ZERO.is_zero());
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(value: u64) {
            let key = Key::new(value);
            prop_assert_eq!(key.to_string().parse::<Key>().unwrap(), key);
            prop_assert_eq!(format!("{value:X}").parse::<Key>().unwrap(), key);
            prop_assert_eq!(Key::from_be_bytes(key.to_be_bytes()), key);
        }

        #[test]
        fn parse_never_panics(input in ".{0,24}") {
            let _ = input.parse::<Key>();
        }
    }
}
