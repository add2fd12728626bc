//! How the CLI opens a path for the engine: on its first command (inside the engine's deadline),
//! its errors with the CLI's hints, so a report says what to do in terms of `prfence`'s flags.

use std::path::Path;
use std::sync::Arc;

use crate::host::Host;
use crate::ops::{OpenPath, Opener};
use crate::transport::{CommandError, Hinted, Policy, PrTransport};

/// An opened path (or its open error) whose errors carry the CLI's hints, so the engine's report
/// says what to do in terms of `prfence`'s flags.
pub fn with_cli_hints<T>(opened: Result<T, CommandError>) -> Result<Hinted<T>, CommandError> {
    opened
        .map(|inner| Hinted {
            inner,
            hints: crate::hints::cli,
        })
        .map_err(|e| e.hinted(crate::hints::cli))
}

/// A path the CLI runs the engine on: opened on its first command, its errors with the CLI's
/// hints.
pub type CliPath = OpenPath<Hinted<Arc<dyn PrTransport>>>;

/// How the CLI opens each path on `host`: with `policy`, its errors with the CLI's hints.
pub fn opener(host: &Arc<dyn Host>, policy: Policy) -> Opener<Hinted<Arc<dyn PrTransport>>> {
    let host = Arc::clone(host);
    Arc::new(move |dev: &Path| with_cli_hints(host.open(dev, policy)))
}
