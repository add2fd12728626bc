//! The admin CLI's advice for a failed command: what to check, in terms of `prfence`'s own
//! commands and flags. Attached to every error the CLI shows ([`CommandError::hinted`]).

use crate::transport::CommandError;

/// `e` as the CLI shows it: with the CLI's hint.
pub fn hinted(e: &CommandError) -> CommandError {
    e.clone().hinted(crate::hints::cli)
}
