//! Debian's multipathd in the lab guest, over one node's paths (issue 25): what a multipath
//! host runs. It takes only paths udev has seen, with their WWID from udev's ID_SERIAL, so a
//! [`Udevd`] runs beside it for its lifetime. What multipathd writes goes to a tmpfs over
//! `/etc/multipath` (the configuration in `conf.d`, the wwids, bindings and prkeys files), taken
//! away with the maps and the daemons when [`Multipathd`] is dropped: the guest is left as found.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};

use crate::udevd::Udevd;
use crate::{TargetLu, WORK, run};

const CONFIG_DIR: &str = "/etc/multipath";
/// How long the daemons may take to show every map with its paths up, under emulation.
const SETTLE: Duration = Duration::from_secs(60);

/// multipath.conf's `reservation_key`: what multipathd registers on a path it adds or
/// reinstates, when the map's key is registered on one of its other paths.
#[derive(Clone, Copy, Debug)]
pub enum ReservationKey {
    /// No `reservation_key`: multipathd leaves registrations alone.
    None,
    /// `reservation_key 0x…`, the same on every map.
    Fixed(u64),
    /// `reservation_key file`: the key mpathpersist last registered on the map, kept by
    /// multipathd in `/etc/multipath/prkeys`.
    File,
}

impl ReservationKey {
    fn line(self) -> String {
        match self {
            ReservationKey::None => String::new(),
            ReservationKey::Fixed(key) => format!("  reservation_key {key:#x}\n"),
            ReservationKey::File => "  reservation_key file\n".to_owned(),
        }
    }
}

/// A running multipathd (and the udevd it needs) with a map `lab-mpath<i>` for each LU, over
/// the paths it was given only (every other disk is blacklisted).
pub struct Multipathd {
    maps: Vec<PathBuf>,
    /// multipath.conf's sections after `defaults`: the blacklist and the maps' aliases
    sections: String,
    daemon: Option<Child>,
    /// Stopped after the daemon and its maps.
    udevd: Option<Udevd>,
    log: PathBuf,
    mounted: bool,
    made_dir: bool,
}

impl Multipathd {
    /// Starts udevd and multipathd over `paths` (disks such as `/dev/sda`), with one map per LU of
    /// `lus`, aliased `lab-mpath<index>`, and waits until every map shows its paths active.
    pub fn start(
        lus: &[TargetLu],
        paths: &[&Path],
        key: ReservationKey,
    ) -> anyhow::Result<Multipathd> {
        // the path selector and hardware handler multipathd picks for LIO's (ALUA) LUs
        run(
            "modprobe",
            ["-a", "dm_multipath", "dm_service_time", "scsi_dh_alua"],
        )?
        .ok()?;
        let mut started = Multipathd {
            maps: Vec::new(),
            sections: String::new(),
            daemon: None,
            udevd: None,
            log: PathBuf::from(format!("{WORK}/multipathd.log")),
            mounted: false,
            made_dir: false,
        };
        if !Path::new(CONFIG_DIR).exists() {
            std::fs::create_dir_all(CONFIG_DIR)?;
            started.made_dir = true;
        }
        run("mount", ["-t", "tmpfs", "lab-multipath", CONFIG_DIR])?.ok()?;
        started.mounted = true;
        let names: Vec<String> = paths
            .iter()
            .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect::<Option<_>>()
            .context("a path without a name")?;
        let mut sections = format!(
            "blacklist {{\n  devnode \".*\"\n}}\nblacklist_exceptions {{\n  devnode \"^({})$\"\n}}\n\
             multipaths {{\n",
            names.join("|")
        );
        for lu in lus {
            sections.push_str(&format!(
                "  multipath {{\n    wwid {}\n    alias lab-mpath{}\n  }}\n",
                multipath_wwid(lu),
                lu.index
            ));
        }
        sections.push_str("}\n");
        started.sections = sections;
        std::fs::create_dir_all(format!("{CONFIG_DIR}/conf.d"))?;
        started.write_config(key)?;

        std::fs::create_dir_all(WORK)?;
        started.udevd = Some(Udevd::start()?);
        let log = std::fs::File::create(&started.log)?;
        started.daemon = Some(
            Command::new("multipathd")
                .args(["-d", "-s", "-v3"])
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context(
                    "starting multipathd (tests/lab/host-tools.sh installs multipath-tools)",
                )?,
        );
        started.maps = lus
            .iter()
            .map(|lu| PathBuf::from(format!("/dev/mapper/lab-mpath{}", lu.index)))
            .collect();
        let per_map = paths.len() / lus.len().max(1);
        started.wait_active(per_map)?;
        Ok(started)
    }

    fn write_config(&self, key: ReservationKey) -> anyhow::Result<()> {
        let conf = format!(
            "defaults {{\n  find_multipaths no\n  user_friendly_names no\n  polling_interval 1\n  \
             no_path_retry fail\n{}}}\n{}",
            key.line(),
            self.sections
        );
        std::fs::write(format!("{CONFIG_DIR}/conf.d/lab.conf"), conf)?;
        Ok(())
    }

    /// multipath.conf with `key` and `multipathd reconfigure`, as an admin changes it; waits until
    /// every map has its `per_map` paths active again.
    pub fn reconfigure(&self, key: ReservationKey, per_map: usize) -> anyhow::Result<()> {
        self.write_config(key)?;
        run("multipathd", ["reconfigure"])?.ok()?;
        let shown = run("multipathd", ["show", "config"])?.ok()?;
        let line = key.line();
        ensure!(
            line.is_empty() || shown.stdout.contains(line.trim()),
            "multipathd's configuration after reconfigure lacks {line:?}"
        );
        self.wait_active(per_map)?;
        Ok(())
    }

    pub fn maps(&self) -> &[PathBuf] {
        &self.maps
    }

    /// `multipathd show paths` as (device, map, dm state, checker state), e.g.
    /// ("sda", "lab-mpath0", "active", "ready").
    pub fn paths(&self) -> anyhow::Result<Vec<(String, String, String, String)>> {
        let out = run(
            "multipathd",
            ["show", "paths", "raw", "format", "%d %m %t %T"],
        )?
        .ok()?;
        Ok(out
            .stdout
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 4).then(|| (f[0].into(), f[1].into(), f[2].into(), f[3].into()))
            })
            .collect())
    }

    /// Waits until every map exists and has `per_map` paths, all active and ready.
    pub fn wait_active(&self, per_map: usize) -> anyhow::Result<Duration> {
        wait_until("every map with its paths active", SETTLE, || {
            // an error: multipathd is not listening yet
            let paths = self.paths().unwrap_or_default();
            Ok(self.maps.iter().all(|m| m.exists())
                && self.maps.iter().all(|m| {
                    let name = m.file_name().map(|n| n.to_string_lossy().into_owned());
                    paths
                        .iter()
                        .filter(|p| Some(&p.1) == name.as_ref())
                        .filter(|p| p.2 == "active" && p.3 == "ready")
                        .count()
                        == per_map
                }))
        })
        .with_context(|| self.diagnosis())
    }

    /// Waits until multipathd's checker shows `device` (`sda`) in `checker` state (`faulty`,
    /// `ready`).
    pub fn wait_path(&self, device: &str, checker: &str) -> anyhow::Result<Duration> {
        wait_until(&format!("{device} {checker} in multipathd"), SETTLE, || {
            Ok(self
                .paths()
                .unwrap_or_default()
                .iter()
                .any(|p| p.0 == device && p.3 == checker))
        })
        .with_context(|| self.diagnosis())
    }

    /// The prkeys file multipathd keeps for `reservation_key file` (empty when none).
    pub fn prkeys(&self) -> String {
        std::fs::read_to_string(format!("{CONFIG_DIR}/prkeys")).unwrap_or_default()
    }

    /// What multipathd shows and logged last, for an error.
    pub fn diagnosis(&self) -> String {
        let show = |args: &[&str]| {
            run("multipathd", args)
                .map(|r| format!("{}{}", r.stdout, r.stderr))
                .unwrap_or_else(|e| e.to_string())
        };
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        // its answers to the test's own polling say nothing
        let lines: Vec<&str> = log.lines().filter(|l| !l.ends_with("(operator)")).collect();
        format!(
            "multipathd show paths:\n{}\nmultipathd show maps:\n{}\nmultipathd's log (last 80 \
             lines, without the test's queries):\n{}",
            show(&["show", "paths"]),
            show(&["show", "maps"]),
            lines[lines.len().saturating_sub(80)..].join("\n")
        )
    }
}

impl Drop for Multipathd {
    fn drop(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            let _ = run("multipathd", ["shutdown"]);
            crate::reap_or_kill(&mut daemon, Duration::from_secs(10));
        }
        let _ = run("multipath", ["-F"]);
        self.udevd = None;
        if self.mounted {
            let _ = run("umount", [CONFIG_DIR]);
        }
        if self.made_dir {
            let _ = std::fs::remove_dir(CONFIG_DIR);
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The WWID multipath gives an LU: udev's ID_SERIAL, `3` and the NAA designator in hex.
pub fn multipath_wwid(lu: &TargetLu) -> String {
    format!("3{}", lu.wwid.trim_start_matches("naa."))
}

/// Polls `done` every 200 ms until it holds or `limit` passes.
fn wait_until(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        if done()? {
            return Ok(start.elapsed());
        }
        ensure!(
            start.elapsed() < limit,
            "{what}: not after {}",
            crate::secs(limit)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
