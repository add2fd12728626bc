//! Reservation types and scopes (SPC-4 persistent reservation TYPE and SCOPE fields).

use std::fmt;
use std::str::FromStr;

/// The persistent reservation TYPE (SPC-4 table "Persistent reservation type codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum ReservationType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

/// How an I_T nexus relates to the reservation, for the SPC access matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NexusRole {
    /// The nexus holds the reservation (under all-registrants types: any registrant).
    Holder,
    /// Registered but not holding the reservation.
    Registered,
    Unregistered,
}

/// What a nexus may do to the medium while a reservation of some type is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Access {
    pub read: bool,
    pub write: bool,
}

impl ReservationType {
    pub const ALL: [Self; 6] = [
        Self::WriteExclusive,
        Self::ExclusiveAccess,
        Self::WriteExclusiveRegistrantsOnly,
        Self::ExclusiveAccessRegistrantsOnly,
        Self::WriteExclusiveAllRegistrants,
        Self::ExclusiveAccessAllRegistrants,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.code() == code)
    }

    /// sg_persist / LVM style abbreviation: we, ea, wero, earo, wear, eaar.
    pub fn short_name(self) -> &'static str {
        match self {
            Self::WriteExclusive => "we",
            Self::ExclusiveAccess => "ea",
            Self::WriteExclusiveRegistrantsOnly => "wero",
            Self::ExclusiveAccessRegistrantsOnly => "earo",
            Self::WriteExclusiveAllRegistrants => "wear",
            Self::ExclusiveAccessAllRegistrants => "eaar",
        }
    }

    /// The SPC name.
    pub fn description(self) -> &'static str {
        match self {
            Self::WriteExclusive => "Write Exclusive",
            Self::ExclusiveAccess => "Exclusive Access",
            Self::WriteExclusiveRegistrantsOnly => "Write Exclusive, Registrants Only",
            Self::ExclusiveAccessRegistrantsOnly => "Exclusive Access, Registrants Only",
            Self::WriteExclusiveAllRegistrants => "Write Exclusive, All Registrants",
            Self::ExclusiveAccessAllRegistrants => "Exclusive Access, All Registrants",
        }
    }

    /// Under all-registrants types every registrant is a holder and READ RESERVATION reports
    /// key 0 (LIO), so callers must not compare the reported key with their own.
    pub fn is_all_registrants(self) -> bool {
        matches!(
            self,
            Self::WriteExclusiveAllRegistrants | Self::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants-only and all-registrants types let every registrant write.
    fn registrants_may_access(self) -> bool {
        !matches!(self, Self::WriteExclusive | Self::ExclusiveAccess)
    }

    fn is_exclusive_access(self) -> bool {
        matches!(
            self,
            Self::ExclusiveAccess
                | Self::ExclusiveAccessRegistrantsOnly
                | Self::ExclusiveAccessAllRegistrants
        )
    }

    /// The SPC access matrix for READ and WRITE commands while this type is held (the same
    /// table libiscsi's ProutReserve.Access tests check against LIO).
    pub fn access(self, nexus: NexusRole) -> Access {
        let full = Access {
            read: true,
            write: true,
        };
        let registered = match nexus {
            NexusRole::Holder => return full,
            NexusRole::Registered => true,
            NexusRole::Unregistered => false,
        };
        if registered && self.registrants_may_access() {
            return full;
        }
        Access {
            read: !self.is_exclusive_access(),
            write: false,
        }
    }
}

impl fmt::Display for ReservationType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// A string that names no reservation type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid reservation type {input:?} (expected we, ea, wero, earo, wear, eaar or a code 1, 3, 5, 6, 7, 8)"
)]
pub struct ReservationTypeParseError {
    pub input: String,
}

impl FromStr for ReservationType {
    type Err = ReservationTypeParseError;

    /// Accepts the short name in any case, or the SPC code in decimal or `0x` hex.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let by_name = Self::ALL
            .into_iter()
            .find(|t| t.short_name().eq_ignore_ascii_case(input));
        let by_code = || {
            let code = match input
                .strip_prefix("0x")
                .or_else(|| input.strip_prefix("0X"))
            {
                Some(hex) if hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    u8::from_str_radix(hex, 16).ok()
                }
                Some(_) => None,
                None if input.bytes().all(|b| b.is_ascii_digit()) => input.parse().ok(),
                None => None,
            };
            code.and_then(Self::from_code)
        };
        by_name
            .or_else(by_code)
            .ok_or_else(|| ReservationTypeParseError {
                input: input.to_owned(),
            })
    }
}

impl serde::Serialize for ReservationType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.short_name())
    }
}

impl<'de> serde::Deserialize<'de> for ReservationType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The SCOPE field. Only LU_SCOPE exists in SPC-3 onwards; other codes are kept, not guessed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    LogicalUnit,
    /// A reserved scope code (4 bits), reported as received.
    Other(u8),
}

impl Scope {
    pub fn code(self) -> u8 {
        match self {
            Scope::LogicalUnit => 0,
            Scope::Other(code) => code,
        }
    }

    /// `code` is the 4-bit field value; higher bits are ignored.
    pub fn from_code(code: u8) -> Self {
        match code & 0x0f {
            0 => Scope::LogicalUnit,
            other => Scope::Other(other),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::LogicalUnit => f.write_str("lu"),
            Scope::Other(code) => write!(f, "{code:#x}"),
        }
    }
}

impl serde::Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_none() {
        for t in ReservationType::ALL {
            assert_eq!(ReservationType::from_code(t.code()), Some(t));
        }
        for code in [0u8, 2, 4, 9, 0xf, 0xff] {
            assert_eq!(ReservationType::from_code(code), None);
        }
    }

    #[test]
    fn parses_names_and_codes() {
        use ReservationType as T;
        assert_eq!("wero".parse(), Ok(T::WriteExclusiveRegistrantsOnly));
        assert_eq!("WERO".parse(), Ok(T::WriteExclusiveRegistrantsOnly));
        assert_eq!("5".parse(), Ok(T::WriteExclusiveRegistrantsOnly));
        assert_eq!("0x5".parse(), Ok(T::WriteExclusiveRegistrantsOnly));
        assert_eq!("0X8".parse(), Ok(T::ExclusiveAccessAllRegistrants));
        assert_eq!("we".parse(), Ok(T::WriteExclusive));
        for bad in ["", "2", "0x", "0x+5", "+5", "w e", "write", "256", "0x105"] {
            assert_eq!(
                bad.parse::<T>(),
                Err(ReservationTypeParseError { input: bad.into() })
            );
        }
        for t in T::ALL {
            assert_eq!(t.to_string().parse(), Ok(t));
            assert_eq!(
                serde_json::to_string(&t).unwrap(),
                format!("\"{}\"", t.short_name())
            );
        }
    }

    #[test]
    fn access_matrix_matches_spc_and_libiscsi_expectations() {
        use NexusRole::*;
        use ReservationType as T;
        let rw = |read, write| Access { read, write };
        // (type, registered non-holder, unregistered) as in libiscsi ProutReserve.Access*.
        let table = [
            (T::ExclusiveAccess, rw(false, false), rw(false, false)),
            (T::WriteExclusive, rw(true, false), rw(true, false)),
            (
                T::ExclusiveAccessRegistrantsOnly,
                rw(true, true),
                rw(false, false),
            ),
            (
                T::WriteExclusiveRegistrantsOnly,
                rw(true, true),
                rw(true, false),
            ),
            (
                T::ExclusiveAccessAllRegistrants,
                rw(true, true),
                rw(false, false),
            ),
            (
                T::WriteExclusiveAllRegistrants,
                rw(true, true),
                rw(true, false),
            ),
        ];
        for (t, registered, unregistered) in table {
            assert_eq!(t.access(Holder), rw(true, true), "{t}");
            assert_eq!(t.access(Registered), registered, "{t}");
            assert_eq!(t.access(Unregistered), unregistered, "{t}");
        }
    }

    #[test]
    fn scope_serializes_as_lu() {
        assert_eq!(
            serde_json::to_string(&Scope::LogicalUnit).unwrap(),
            "\"lu\""
        );
        assert_eq!(Scope::from_code(0), Scope::LogicalUnit);
        assert_eq!(Scope::from_code(2), Scope::Other(2));
        assert_eq!(Scope::Other(2).to_string(), "0x2");
    }
}
