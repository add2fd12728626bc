//! From a [`Resolution`] to the engine's targets: one [`LuTarget`] per identified LU with its
//! paths opened, and one node-local LU per device that could not be identified. Shared by the
//! admin CLI and the fence agent so both treat vanished devices the same way.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::discover::{Lu, LuId, Resolution};
use crate::transport::{CommandError, PrRequest, PrTransport, Reply};

use super::LuTarget;

/// How a path's device is opened (the path as given in, the device out).
pub type Opener<T> = Arc<dyn Fn(&Path) -> Result<T, CommandError> + Send + Sync>;

/// One path, opened on its first command: on the engine's worker and so inside the command's
/// deadline, because an open blocks while the kernel recovers the device (SCSI error handling).
/// A path that cannot be opened stays a dead path whose every command fails with the open
/// error, so the report names it and the LU can still be handled through its other paths.
pub struct OpenPath<T> {
    device: PathBuf,
    open: Opener<T>,
    opened: OnceLock<Result<T, CommandError>>,
}

impl<T> std::fmt::Debug for OpenPath<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenPath")
            .field("device", &self.device)
            .field("opened", &self.opened.get().map(Result::is_ok))
            .finish_non_exhaustive()
    }
}

impl<T: PrTransport> OpenPath<T> {
    pub fn new(device: &Path, open: Opener<T>) -> Self {
        OpenPath {
            device: device.to_path_buf(),
            open,
            opened: OnceLock::new(),
        }
    }

    fn run<R>(&self, f: impl FnOnce(&T) -> Result<R, CommandError>) -> Result<R, CommandError> {
        match self.opened.get_or_init(|| (self.open)(&self.device)) {
            Ok(device) => f(device),
            Err(e) => Err(e.clone()),
        }
    }
}

impl<T: PrTransport> PrTransport for OpenPath<T> {
    fn device(&self) -> &Path {
        match self.opened.get() {
            Some(Ok(device)) => device.device(),
            _ => &self.device,
        }
    }
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        self.run(|d| d.execute(request))
    }
}

/// The paths of `lu` to use: all of them, or with `single_path` only the first live one (the
/// first given if none is live), for `mpath_register_method=single`.
fn chosen_paths(lu: &Lu, single_path: bool) -> Vec<&Path> {
    if !single_path {
        return lu.paths.iter().map(|p| p.dev.as_path()).collect();
    }
    lu.paths
        .iter()
        .find(|p| p.is_live())
        .or_else(|| lu.paths.first())
        .map(|p| vec![p.dev.as_path()])
        .unwrap_or_default()
}

/// The engine's targets for `resolution`, each path opened by `open` on its first command. An
/// unidentified device becomes an LU of its own named by its absolute path ([`LuId::NodeLocal`]):
/// a dead path in the report if it cannot be opened; a fence of several LUs refuses to name an
/// arbiter while one is present.
pub fn targets<T: PrTransport>(
    resolution: &Resolution,
    single_path: bool,
    open: &Opener<T>,
) -> Vec<LuTarget<OpenPath<T>>> {
    let open_path = |dev: &Path| OpenPath::new(dev, Arc::clone(open));
    let mut lus: Vec<LuTarget<OpenPath<T>>> = resolution
        .lus
        .iter()
        .map(|lu| LuTarget {
            id: lu.id.clone(),
            paths: chosen_paths(lu, single_path)
                .into_iter()
                .map(open_path)
                .collect(),
        })
        .collect();
    for unknown in &resolution.unidentified {
        let id = LuId::node_local(&unknown.device);
        // The same vanished device given twice is one path.
        if lus.iter().any(|lu| lu.id == id) {
            continue;
        }
        lus.push(LuTarget {
            id,
            paths: vec![open_path(&unknown.device)],
        });
    }
    lus
}
