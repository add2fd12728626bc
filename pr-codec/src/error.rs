//! Codec errors. Decode errors describe what the target sent; encode errors what the caller asked.

/// Bytes that do not form the expected structure. Never a panic: hostile data ends here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the structure's own length fields require. For PR IN responses the
    /// executor re-issues the command with `needed` as allocation length (bounded).
    #[error(
        "data truncated: {needed} bytes needed, {got} received (re-issue with a larger allocation length)"
    )]
    Truncated { needed: usize, got: usize },
    /// A field holds a value the structure cannot have.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    /// A TYPE field holds a code SPC does not define.
    #[error("unknown reservation type code {code:#04x} in {what}")]
    UnknownType { what: &'static str, code: u8 },
    /// A CDB names a service action this codec does not implement.
    #[error("unsupported {what} service action {code:#04x}")]
    UnknownServiceAction { what: &'static str, code: u8 },
}

impl DecodeError {
    pub(crate) fn malformed(what: &'static str, detail: impl Into<String>) -> Self {
        DecodeError::Malformed {
            what,
            detail: detail.into(),
        }
    }
}

/// A PERSISTENT RESERVE OUT request that must not be sent as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("{action} needs a reservation TYPE")]
    MissingType { action: &'static str },
    /// SPC ignores (or rejects) this field for this service action; setting it is a caller bug.
    #[error("{action} does not use {field}; leave it unset")]
    FieldNotAllowed {
        action: &'static str,
        field: &'static str,
    },
    #[error("REGISTER AND MOVE needs its destination (RegisterMove)")]
    MissingRegisterMove,
    #[error("{action} needs a non-zero SERVICE ACTION RESERVATION KEY")]
    ZeroServiceActionKey { action: &'static str },
    #[error(transparent)]
    TransportId(#[from] TransportIdError),
    #[error("{action} parameter list of {len} bytes exceeds the 32-bit length fields")]
    TooLong { action: &'static str, len: usize },
}

/// A TransportID that cannot be parsed or sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid TransportID {input:?}: {reason} (expected an iSCSI name iqn./eui./naa.… optionally followed by ,i,0x<isid>, or fc,0x<wwpn>, sas,0x<address>, raw,<hex>)"
)]
pub struct TransportIdError {
    pub input: String,
    pub reason: &'static str,
}
