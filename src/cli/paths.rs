//! How the CLI opens a path for the engine: on its first command (inside the engine's deadline).
//! The CLI's hints are added where a report is shown ([`crate::hints::cli`]), not here.

use std::path::Path;
use std::sync::Arc;

use crate::host::Host;
use crate::ops::{OpenPath, Opener};
use crate::transport::{Policy, PrTransport};

/// A path the CLI runs the engine on: opened on its first command.
pub type CliPath = OpenPath<Arc<dyn PrTransport>>;

/// How the CLI opens each path on `host`: with `policy`.
pub fn opener(host: &Arc<dyn Host>, policy: Policy) -> Opener<Arc<dyn PrTransport>> {
    let host = Arc::clone(host);
    Arc::new(move |dev: &Path| host.open(dev, policy))
}

/// Makes room for `paths` paths of `lus` LUs held open at once ([`crate::descriptors`]). When
/// even the hard limit is too small this says so, and goes on: the paths beyond it fail to open
/// (EMFILE), each reported as such.
pub fn make_room(lus: usize, paths: usize) {
    if let Err(e) = crate::descriptors::fit(lus, paths) {
        eprintln!(
            "prfence: warning: {e}: the paths beyond it fail to open (EMFILE); raise the hard \
             limit first (as root: `ulimit -Hn {0}; ulimit -Sn {0}`, then run prfence from that \
             shell)",
            e.need
        );
    }
}
