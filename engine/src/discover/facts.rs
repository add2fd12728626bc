//! What sysfs says about one path beyond its identity and state, for `prfence doctor`: the SCSI
//! host's driver and the LU's vendor (which kind of target answers), and for NVMe the host
//! identifier this node registers with. Read on demand, not at discovery: only doctor asks.

use std::path::{Path, PathBuf};

use super::{Discovery, PathInfo};
use crate::transport::Protocol;

/// Where nvme-cli keeps the host id `nvme connect` sends by default.
const NVME_CLI_HOSTID: &str = "/etc/nvme/hostid";

/// A path's facts as sysfs gives them (each `None` where sysfs has nothing, or for the other
/// protocol).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathSysfs {
    /// SCSI: the driver of the path's SCSI host (`proc_name`: `iscsi_tcp`, `tcm_loopback`…).
    pub host_driver: Option<String>,
    /// SCSI: the LU's INQUIRY vendor as sysfs shows it (`LIO-ORG`).
    pub vendor: Option<String>,
    /// NVMe: the host id the namespace's controller connected with: the controller's `hostid`
    /// (fabrics controllers), through one of the paths of a multipath head, else nvme-cli's
    /// `/etc/nvme/hostid`.
    pub nvme_host_id: Option<String>,
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    super::read_attr(path.as_ref())
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

impl Discovery {
    /// What sysfs says about `path` beyond what discovery found ([`PathSysfs`]).
    pub fn path_sysfs(&self, path: &PathInfo) -> PathSysfs {
        if path.protocol == Protocol::Nvme {
            return PathSysfs {
                nvme_host_id: self.nvme_host_id(&path.name),
                ..PathSysfs::default()
            };
        }
        let host = path.hctl.split(':').next().unwrap_or_default();
        PathSysfs {
            host_driver: read(
                self.sys
                    .join(format!("class/scsi_host/host{host}/proc_name")),
            ),
            vendor: read(
                self.sys
                    .join(format!("class/scsi_device/{}/device/vendor", path.hctl)),
            ),
            nvme_host_id: None,
        }
    }

    fn nvme_host_id(&self, name: &str) -> Option<String> {
        let block = self.sys.join("class/block").join(name);
        let via_paths = std::fs::read_dir(block.join("multipath"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path().join("device/hostid"));
        std::iter::once(block.join("device/hostid"))
            .chain(via_paths)
            .chain(std::iter::once(PathBuf::from(NVME_CLI_HOSTID)))
            .find_map(read)
    }
}
