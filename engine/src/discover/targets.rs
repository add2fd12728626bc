//! From a [`Resolution`] to the engine's targets: one [`LuTarget`] per identified LU with its
//! paths opened, and one node-local LU per device that could not be identified. Shared by the
//! admin CLI and the fence agent so both treat vanished devices the same way.

use std::path::Path;

use crate::ops::LuTarget;
use crate::transport::{CommandError, PrRequest, PrTransport, Reply};

use super::{Lu, Resolution};

/// One path as opened. A path that cannot be opened is kept, as a dead path whose every command
/// fails with the open error, so the report names it and the LU can still be handled through its
/// other paths.
#[derive(Debug)]
pub enum OpenPath<T> {
    Open(T),
    Unopened(CommandError),
}

impl<T: PrTransport> PrTransport for OpenPath<T> {
    fn device(&self) -> &Path {
        match self {
            OpenPath::Open(device) => device.device(),
            OpenPath::Unopened(e) => &e.device,
        }
    }
    fn execute(&self, request: PrRequest<'_>) -> Result<Reply, CommandError> {
        match self {
            OpenPath::Open(device) => device.execute(request),
            OpenPath::Unopened(e) => Err(e.clone()),
        }
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

/// The engine's targets for `resolution`. An unidentified device becomes an LU of its own named by
/// its absolute path: the engine sorts such LUs last and never makes one the arbiter
/// (`ops::is_node_local_id`); if it cannot be opened it is a dead path in the report.
pub fn targets<T>(
    resolution: &Resolution,
    single_path: bool,
    open: impl Fn(&Path) -> Result<T, CommandError>,
) -> Vec<LuTarget<OpenPath<T>>> {
    let open_path = |dev: &Path| match open(dev) {
        Ok(device) => OpenPath::Open(device),
        Err(e) => OpenPath::Unopened(e),
    };
    let mut lus: Vec<LuTarget<OpenPath<T>>> = resolution
        .lus
        .iter()
        .map(|lu| LuTarget {
            id: lu.id.to_string(),
            paths: chosen_paths(lu, single_path)
                .into_iter()
                .map(open_path)
                .collect(),
        })
        .collect();
    for unknown in &resolution.unidentified {
        let id = std::path::absolute(&unknown.device)
            .unwrap_or_else(|_| Path::new("/").join(&unknown.device))
            .display()
            .to_string();
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
