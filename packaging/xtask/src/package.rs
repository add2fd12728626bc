//! The .deb and the .rpm, laid out from one staged tree so their file lists are the same by
//! construction (and checked): `dpkg-deb` and `rpmbuild` from the distribution's own packages
//! (`apt-get install dpkg-dev lintian rpm rpmlint`), nothing compiled for the job.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};

const NAME: &str = "prfence";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const SUMMARY: &str =
    "SCSI-3 persistent reservation fencing: fence_pr agent, admin CLI, node agent";
const DESCRIPTION: &str = "prfence fences cluster nodes at the storage with SCSI-3 persistent \
reservations (PERSISTENT RESERVE IN/OUT through SG_IO): fence_pr is a drop-in replacement for \
fence_scsi (same parameters, same keys), prfence is the admin command (keys, reservations, \
fence, unfence, status, JSON output), and prfence agent keeps a node's registrations watched \
and self-fences when the node is fenced.";
/// Who packages it: the .deb's Maintainer, the .rpm's Packager, packaging/changelog's signer.
const MAINTAINER: &str = "prfence developers <prfence@example.invalid>";
/// The configuration file, a conffile/%config(noreplace): an upgrade never overwrites it.
const CONFFILE: &str = "etc/prfence/agent.toml";

/// Runs a command and fails with its output when it fails.
fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| {
        format!("running {shown} (apt-get install dpkg-dev lintian rpm rpmlint)")
    })?;
    ensure!(
        out.status.success(),
        "{shown} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn gzip(path: &Path) -> anyhow::Result<()> {
    // -n: no name or timestamp inside, so the package is reproducible (lintian checks it).
    run(Command::new("gzip").args(["-9nf"]).arg(path)).map(drop)
}

/// The Markdown files of `docs/`, sorted, so the package lists them in a stable order.
fn doc_pages(root: &Path) -> anyhow::Result<Vec<std::ffi::OsString>> {
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(root.join("docs")).context("reading docs/")? {
        let entry = entry?;
        let name = entry.file_name();
        if entry.file_type()?.is_file() && Path::new(&name).extension().is_some_and(|e| e == "md") {
            pages.push(name);
        }
    }
    pages.sort();
    if pages.is_empty() {
        bail!("docs/ has no .md page to ship");
    }
    Ok(pages)
}

fn install(from: &Path, to: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(from, to).with_context(|| format!("{} -> {}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write(to: &Path, content: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(to, content)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Where each distribution wants systemd units: Debian 12's lintian insists on /lib (13 accepts
/// it), Fedora and RHEL on /usr/lib. The one sanctioned difference between the two file lists.
const DEB_UNIT_DIR: &str = "lib/systemd/system";
const RPM_UNIT_DIR: &str = "usr/lib/systemd/system";

/// What lintian is told to accept in the .deb, argued in the file; only the .deb has it (rpmlint's
/// are in packaging/rpmlint.toml).
const LINTIAN_OVERRIDES: &str = "usr/share/lintian/overrides/prfence";

/// Which prfence binary goes into a package.
pub enum Binary {
    /// `cargo build --release` (the packages that ship).
    Release,
    /// A binary built already, e.g. the debug build under test: the lab installs the package
    /// as an admin would, with the very binary its suites test.
    Given(PathBuf),
    /// A binary built already, packaged as a release is (compressed, and checked by lintian and
    /// rpmlint): CI checks the packaging around the binary its tests ran, without a second,
    /// release build of every crate (about 420 s of CPU on the 2-CPU machine).
    Checked(PathBuf),
}

impl Binary {
    /// The package is built and checked as one that ships.
    fn ships(&self) -> bool {
        matches!(self, Binary::Release | Binary::Checked(_))
    }
}

/// Builds (or takes) the binary and stages every file of the package under `stage`.
fn stage(root: &Path, binary: &Binary, stage: &Path, unit_dir: &str) -> anyhow::Result<()> {
    let binary = match binary {
        Binary::Release => {
            run(Command::new(env!("CARGO")).current_dir(root).args([
                "build",
                "--release",
                "--locked",
                "-p",
                NAME,
                "--bin",
                NAME,
            ]))?;
            target_dir(root).join("release/prfence")
        }
        Binary::Given(path) | Binary::Checked(path) => path.clone(),
    };
    if stage.exists() {
        std::fs::remove_dir_all(stage)?;
    }
    install(&binary, &stage.join("usr/sbin/prfence"), 0o755)?;
    run(Command::new("strip")
        .arg("--strip-unneeded")
        .arg(stage.join("usr/sbin/prfence")))?;
    std::os::unix::fs::symlink("prfence", stage.join("usr/sbin/fence_pr"))?;
    let pkg = root.join("packaging");
    install(
        &pkg.join("prfence-agent.service"),
        &stage.join(unit_dir).join("prfence-agent.service"),
        0o644,
    )?;
    install(
        &pkg.join("prfence-agent.toml"),
        &stage.join(CONFFILE),
        0o600,
    )?;
    let doc = stage.join("usr/share/doc/prfence");
    install(
        &pkg.join("prfence-agent.toml"),
        &doc.join("examples/agent.toml"),
        0o644,
    )?;
    // what monitoring reads: the status document's schema, and alerting rules to start from
    install(
        &pkg.join("status.schema.json"),
        &stage.join("usr/share/prfence/status.schema.json"),
        0o644,
    )?;
    for rules in ["prfence-alerts.yml", "prfence-alerts.test.yml"] {
        install(
            &pkg.join("prometheus").join(rules),
            &doc.join("examples/prometheus").join(rules),
            0o644,
        )?;
    }
    install(&pkg.join("copyright"), &doc.join("copyright"), 0o644)?;
    install(&root.join("README.md"), &doc.join("README.md"), 0o644)?;
    gzip(&doc.join("README.md"))?;
    install(
        &root.join("docs/performance.svg"),
        &doc.join("docs/performance.svg"),
        0o644,
    )?;
    // The admin documentation README points to (docs/<task>.md), under the same relative path.
    for page in doc_pages(root)? {
        let to = doc.join("docs").join(&page);
        install(&root.join("docs").join(&page), &to, 0o644)?;
        gzip(&to)?;
    }
    install(&pkg.join("changelog"), &doc.join("changelog"), 0o644)?;
    gzip(&doc.join("changelog"))?;
    for (path, content) in crate::generated()? {
        let name = path.file_name().context("generated file without a name")?;
        let to = match path
            .parent()
            .and_then(Path::file_name)
            .and_then(|d| d.to_str())
        {
            Some("man") => {
                let section = path.extension().and_then(|e| e.to_str()).unwrap_or("8");
                stage.join(format!("usr/share/man/man{section}")).join(name)
            }
            Some("completions") => match name.to_str() {
                Some("prfence.bash") => stage.join("usr/share/bash-completion/completions/prfence"),
                Some("_prfence") => stage.join("usr/share/zsh/vendor-completions/_prfence"),
                Some("prfence.fish") => {
                    stage.join("usr/share/fish/vendor_completions.d/prfence.fish")
                }
                _ => bail!("unplaced completion {}", path.display()),
            },
            _ => bail!("unplaced generated file {}", path.display()),
        };
        write(&to, &content, 0o644)?;
        if to.starts_with(stage.join("usr/share/man")) {
            gzip(&to)?;
        }
    }
    Ok(())
}

/// Every file and link in the staged tree, `/`-rooted, sorted (no directories).
fn staged_files(stage: &Path) -> anyhow::Result<Vec<String>> {
    Ok(staged(stage)?.0)
}

/// The staged tree's directories that are the package's own (named for it: /etc/prfence,
/// /usr/share/doc/prfence and below), `/`-rooted, sorted; the others (/usr/sbin, /usr/share/man…)
/// belong to the system.
fn own_dirs(stage: &Path) -> anyhow::Result<Vec<String>> {
    Ok(staged(stage)?
        .1
        .into_iter()
        .filter(|d| d.contains(NAME))
        .collect())
}

/// (files and links, directories) of the staged tree, each `/`-rooted and sorted.
fn staged(stage: &Path) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let (mut files, mut dirs_seen) = (Vec::new(), Vec::new());
    let mut dirs = vec![stage.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let rel = format!("/{}", path.strip_prefix(stage)?.display());
            if path.is_dir() && !path.is_symlink() {
                dirs.push(path);
                dirs_seen.push(rel);
            } else {
                files.push(rel);
            }
        }
    }
    files.sort();
    dirs_seen.sort();
    Ok((files, dirs_seen))
}

/// Cargo's target dir: `CARGO_TARGET_DIR`, a relative one taken from the workspace root as the
/// release build started there reads it (and made absolute: the packaging steps run tools in
/// other directories), else `target` in the workspace.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |dir| root.join(dir))
}

/// Where a package is written: `out`, or `target/packages` by default; made if missing.
fn out_dir(root: &Path, out: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match out {
        Some(dir) => dir.to_path_buf(),
        None => target_dir(root).join("packages"),
    };
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The link `systemctl enable prfence-agent` makes (the unit's `WantedBy=multi-user.target`).
const ENABLED_LINK: &str = "/etc/systemd/system/multi-user.target.wants/prfence-agent.service";

/// The .deb: staged tree + DEBIAN/{control,conffiles,postinst,prerm,postrm,md5sums}, written to
/// `out` (default `target/packages`). The release package is checked with lintian (no errors
/// allowed); a package of a given binary (the lab's) is not: lintian judges a release.
pub fn deb(root: &Path, binary: &Binary, out: Option<&Path>) -> anyhow::Result<PathBuf> {
    let out = out_dir(root, out)?;
    let tree = out.join("deb-root");
    stage(root, binary, &tree, DEB_UNIT_DIR)?;
    write(
        &tree.join(LINTIAN_OVERRIDES),
        format!(
            "# The agent's configuration is root's alone: it names the LUs this node fences on and\n\
             # may hold a fixed key.\n\
             {NAME}: non-standard-file-perm 0600 != 0644 [{CONFFILE}]\n"
        )
        .as_bytes(),
        0o644,
    )?;
    let arch = run(Command::new("dpkg").arg("--print-architecture"))?
        .trim()
        .to_owned();
    // Library dependencies as Debian computes them, from the binary's ELF needs.
    let shlibs_dir = out.join("shlibs");
    std::fs::create_dir_all(shlibs_dir.join("debian"))?;
    std::fs::write(
        shlibs_dir.join("debian/control"),
        format!("Source: {NAME}\n\nPackage: {NAME}\nArchitecture: any\n"),
    )?;
    let depends = run(Command::new("dpkg-shlibdeps")
        .current_dir(&shlibs_dir)
        .arg("-O")
        .arg(tree.join("usr/sbin/prfence")))?;
    let depends = depends
        .trim()
        .strip_prefix("shlibs:Depends=")
        .context("dpkg-shlibdeps printed no shlibs:Depends")?
        .to_owned();
    let installed_kib = dir_size(&tree)?.div_ceil(1024);
    let debian = tree.join("DEBIAN");
    let control = format!(
        "Package: {NAME}\nVersion: {VERSION}\nArchitecture: {arch}\nMaintainer: {MAINTAINER}\n\
         Installed-Size: {installed_kib}\nDepends: {depends}\n\
         Recommends: sg3-utils\nSuggests: pacemaker, corosync\nSection: admin\nPriority: optional\n\
         Homepage: https://example.invalid/prfence\nDescription: {SUMMARY}\n{}",
        wrap_description(DESCRIPTION)
    );
    write(&debian.join("control"), control.as_bytes(), 0o644)?;
    write(
        &debian.join("conffiles"),
        format!("/{CONFFILE}\n").as_bytes(),
        0o644,
    )?;
    // The unit is installed but neither enabled nor started: the agent needs a configuration
    // naming this node's devices and key first (docs/agent.md).
    write(
        &debian.join("postinst"),
        b"#!/bin/sh\nset -e\nif [ -d /run/systemd/system ]; then\n\tsystemctl --system daemon-reload >/dev/null || true\nfi\n",
        0o755,
    )?;
    write(
        &debian.join("prerm"),
        b"#!/bin/sh\nset -e\nif [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then\n\tdeb-systemd-invoke stop prfence-agent.service >/dev/null || true\nfi\n",
        0o755,
    )?;
    // remove keeps the admin's configuration, the enable link included (a reinstall finds the
    // agent enabled as it was); purge takes the link `systemctl enable` made, which would point
    // at a unit no longer there, and the unit's runtime directory (RuntimeDirectoryPreserve=yes).
    write(
        &debian.join("postrm"),
        format!(
            "#!/bin/sh\nset -e\nif [ \"$1\" = purge ]; then\n\trm -f {ENABLED_LINK}\n\trm -rf \
             /run/prfence\nfi\nif [ -d /run/systemd/system ]; then\n\tsystemctl --system \
             daemon-reload >/dev/null || true\nfi\n"
        )
        .as_bytes(),
        0o755,
    )?;
    let mut sums = Vec::new();
    for file in staged_files(&tree)? {
        let path = tree.join(file.trim_start_matches('/'));
        if file.starts_with("/DEBIAN/") || path.is_symlink() || file == format!("/{CONFFILE}") {
            continue;
        }
        let sum = run(Command::new("md5sum").arg(&path))?;
        let hash = sum.split_whitespace().next().unwrap_or_default();
        writeln!(sums, "{hash}  {}", file.trim_start_matches('/'))?;
    }
    write(&debian.join("md5sums"), &sums, 0o644)?;
    let deb = out.join(format!("{NAME}_{VERSION}_{arch}.deb"));
    run(Command::new("dpkg-deb")
        .arg("--root-owner-group")
        // The lab unpacks its package in an emulated guest, where xz costs tens of seconds.
        .arg(if binary.ships() { "-Zxz" } else { "-Znone" })
        .arg("--build")
        .arg(&tree)
        .arg(&deb))?;
    if binary.ships() {
        lintian(&deb)?;
    }
    Ok(deb)
}

/// lintian, with errors and warnings failing the build (the one kept on purpose is overridden
/// in the package, with its reason).
fn lintian(deb: &Path) -> anyhow::Result<()> {
    package_check(
        Command::new("lintian").args(["--tag-display-limit", "0", "--fail-on", "error,warning"]),
        "lintian",
        deb,
    )
}

/// Runs a package checker `name` (`command`, the package appended) with its report printed;
/// fails, with the report, when it exits non-zero (an error found).
fn package_check(command: &mut Command, name: &str, package: &Path) -> anyhow::Result<()> {
    let out = command
        .arg(package)
        .output()
        .with_context(|| format!("running {name} (apt-get install {name})"))?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    ensure!(
        out.status.success(),
        "{name} found errors in {}: {}{}",
        package.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// packaging/changelog (Debian's format, the one source) as an RPM %changelog: each entry's
/// signer and date as its `*` line with `VERSION-1`, each `  * ` item as a `- ` item.
fn rpm_changelog(debian: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut version = None;
    let mut items = String::new();
    for line in debian.lines() {
        if let Some(rest) = line.strip_prefix(&format!("{NAME} (")) {
            version = Some(
                rest.split(')')
                    .next()
                    .context("a changelog heading without ')'")?,
            );
        } else if let Some(item) = line.strip_prefix("  * ") {
            items.push_str(&format!("- {item}\n"));
        } else if let Some(more) = line.strip_prefix("    ") {
            items.push_str(&format!("  {more}\n"));
        } else if let Some(trailer) = line.strip_prefix(" -- ") {
            let (who, date) = trailer
                .split_once("  ")
                .context("a changelog trailer without its date")?;
            // "Tue, 01 Dec 2026 06:00:00 +0000" -> "Tue Dec 01 2026"
            let words: Vec<&str> = date.split_whitespace().collect();
            let [day, number, month, year, ..] = words[..] else {
                anyhow::bail!("a changelog date rpm cannot take: {date}");
            };
            let version = version
                .take()
                .context("a changelog trailer before its heading")?;
            out.push_str(&format!(
                "* {} {month} {number} {year} {who} - {version}-1\n{}\n",
                day.trim_end_matches(','),
                std::mem::take(&mut items)
            ));
        }
    }
    ensure!(!out.is_empty(), "packaging/changelog has no entry");
    Ok(out)
}

fn wrap_description(text: &str) -> String {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + word.len() + 1 > 78 {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines.iter().map(|l| format!(" {l}\n")).collect()
}

fn dir_size(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for file in staged_files(dir)? {
        let meta = std::fs::symlink_metadata(dir.join(file.trim_start_matches('/')))?;
        total += meta.len();
    }
    Ok(total)
}

/// The .rpm: the same staged tree, packaged by rpmbuild with a generated spec; its file list
/// must equal the .deb's (the one in `out`, when there is one). `release` is its Release: the
/// lab builds a second one to upgrade to. The release package is checked with rpmlint; a
/// package of a given binary (the lab's) is not, and its payload is not compressed (the lab
/// unpacks it in an emulated guest).
pub fn rpm(
    root: &Path,
    binary: &Binary,
    out: Option<&Path>,
    release: u32,
) -> anyhow::Result<PathBuf> {
    let out = out_dir(root, out)?;
    let tree = out.join("rpm-root");
    stage(root, binary, &tree, RPM_UNIT_DIR)?;
    let files = staged_files(&tree)?;
    let top = out.join("rpmbuild");
    if top.exists() {
        std::fs::remove_dir_all(&top)?;
    }
    std::fs::create_dir_all(top.join("SPECS"))?;
    // The package owns its own directories, so that erasing it removes them.
    let mut list: String = own_dirs(&tree)?
        .iter()
        .map(|d| format!("%dir {d}\n"))
        .collect();
    for file in &files {
        let line = if file == &format!("/{CONFFILE}") {
            format!("%config(noreplace) %attr(0600,root,root) {file}\n")
        } else if file.starts_with("/usr/share/doc/prfence/copyright") {
            format!("%license {file}\n")
        } else {
            format!("{file}\n")
        };
        list.push_str(&line);
    }
    let spec = format!(
        "Name: {NAME}\nVersion: {VERSION}\nRelease: {release}\nSummary: {SUMMARY}\nLicense: MIT OR Apache-2.0\n\
         Group: Applications/System\nPackager: {MAINTAINER}\n\
         URL: https://example.invalid/prfence\n\n%description\n{}\n\
         %install\ncp -a {}/. %{{buildroot}}/\n\n\
         %post\nif [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null || :; fi\n\n\
         %preun\nif [ $1 -eq 0 ]; then systemctl --no-reload disable --now prfence-agent.service >/dev/null 2>&1 || :; systemctl clean --what=runtime prfence-agent.service >/dev/null 2>&1 || :; fi\n\n\
         %postun\nif [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null || :; fi\n\n\
         %files\n{list}\n\
         %changelog\n{}",
        wrap_description(DESCRIPTION)
            .replace("\n ", "\n")
            .trim_start(),
        tree.display(),
        rpm_changelog(&std::fs::read_to_string(root.join("packaging/changelog"))?)?
    );
    let spec_path = top.join("SPECS/prfence.spec");
    std::fs::write(&spec_path, spec)?;
    run(Command::new("rpmbuild")
        .arg("-bb")
        .arg("--define")
        .arg(format!("_topdir {}", top.display()))
        // The tree is already stripped and compressed; rpm's brp scripts must not redo it.
        .args([
            "--define",
            "__os_install_post %{nil}",
            "--define",
            "debug_package %{nil}",
        ])
        .args(["--define", "_build_id_links none"])
        .args(if binary.ships() {
            &[][..]
        } else {
            &["--define", "_binary_payload w.ufdio"][..]
        })
        .arg(&spec_path))?;
    let arch = run(Command::new("rpm").args(["--eval", "%{_arch}"]))?
        .trim()
        .to_owned();
    let built = top.join(format!("RPMS/{arch}/{NAME}-{VERSION}-{release}.{arch}.rpm"));
    let rpm = out.join(built.file_name().context("rpm name")?);
    std::fs::rename(&built, &rpm).with_context(|| format!("moving {}", built.display()))?;
    same_files(&out, &rpm, &own_dirs(&tree)?)?;
    if binary.ships() {
        rpmlint(root, &rpm)?;
    }
    Ok(rpm)
}

/// rpmlint, as lintian for the .deb: errors and warnings fail the build (`--strict`). Its
/// settings and the messages it is told to ignore are argued in packaging/rpmlint.toml.
fn rpmlint(root: &Path, rpm: &Path) -> anyhow::Result<()> {
    package_check(
        Command::new("rpmlint")
            .arg("--strict")
            .arg("--config")
            .arg(root.join("packaging/rpmlint.toml")),
        "rpmlint",
        rpm,
    )
}

/// The .rpm's files are the .deb's in `out` but for the unit directory and the .deb's lintian
/// overrides (both are staged by one function; this proves it from the packages themselves); `dirs`, the directories the .rpm
/// owns, are left out of its list as the .deb's directories are out of the .deb's.
fn same_files(out: &Path, rpm: &Path, dirs: &[String]) -> anyhow::Result<()> {
    let listed = run(Command::new("rpm").arg("-qlp").arg(rpm))?;
    let missing: Vec<&String> = dirs
        .iter()
        .filter(|d| !listed.lines().any(|l| l == d.as_str()))
        .collect();
    ensure!(
        missing.is_empty(),
        "the .rpm does not own its directories {missing:?}"
    );
    let debs: Vec<PathBuf> = std::fs::read_dir(out)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    let [deb] = debs.as_slice() else {
        println!(
            "no single .deb in {} to compare the .rpm with; run `cargo xtask packages`",
            out.display()
        );
        return Ok(());
    };
    let deb_list: Vec<String> = run(Command::new("dpkg-deb").arg("-c").arg(deb))?
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| !p.ends_with(LINTIAN_OVERRIDES))
        .map(|p| {
            p.trim_start_matches('.')
                .replacen(DEB_UNIT_DIR, RPM_UNIT_DIR, 1)
        })
        .collect();
    let rpm_list: Vec<String> = listed
        .lines()
        .filter(|l| !dirs.iter().any(|d| d == l))
        .map(str::to_owned)
        .collect();
    let (mut d, mut r) = (deb_list, rpm_list);
    d.sort();
    r.sort();
    ensure!(d == r, "file lists differ:\n.deb: {d:?}\n.rpm: {r:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_debian_changelog_becomes_an_rpm_changelog() {
        let debian = "prfence (0.2.0) unstable; urgency=medium\n\n  * Second: a fix\n    \
                      continued.\n  * Another.\n\n -- A B <a@b.invalid>  Wed, 02 Dec 2026 \
                      06:00:00 +0000\n\nprfence (0.1.0) unstable; urgency=medium\n\n  * \
                      First.\n\n -- A B <a@b.invalid>  Tue, 01 Dec 2026 06:00:00 +0000\n";
        assert_eq!(
            rpm_changelog(debian).unwrap(),
            "* Wed Dec 02 2026 A B <a@b.invalid> - 0.2.0-1\n- Second: a fix\n  continued.\n\
             - Another.\n\n* Tue Dec 01 2026 A B <a@b.invalid> - 0.1.0-1\n- First.\n\n"
        );
        assert!(rpm_changelog("no entry").is_err());
        assert!(rpm_changelog("prfence (1) x\n -- A B <a@b>  Tue\n").is_err());
    }

    #[test]
    fn the_packaged_changelog_converts() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = std::fs::read_to_string(root.join("packaging/changelog")).unwrap();
        let rpm = rpm_changelog(&text).unwrap();
        assert!(rpm.starts_with("* "), "{rpm}");
        assert!(
            rpm.contains(&format!("{MAINTAINER} - {VERSION}-1")),
            "{rpm}"
        );
    }
}
