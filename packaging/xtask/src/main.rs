//! `cargo xtask`: what the build makes besides the binary, from the code itself.
//!
//! - `cargo xtask docs [DIR]`: man pages and shell completions (default `packaging/generated`, which
//!   is committed and checked fresh by this crate's test, so a stale page fails CI).
//! - `cargo xtask deb|rpm|packages`: the release binary, the generated files and `packaging/` laid
//!   out as a Debian and an RPM package in `target/packages/`.
//! - `cargo xtask deb --binary PATH --out DIR` and `rpm --binary PATH --release N --out DIR`: the
//!   same packages around a binary built already (the lab installs the binary under test this
//!   way, and upgrades the .rpm from release 1 to 2), without lintian or rpmlint.
//! - `cargo xtask packages --binary PATH`: both packages around a binary built already, checked
//!   as `packages` checks the release's (CI, with the binary its tests ran).
//! - `cargo xtask perf LOG`: docs/performance.md's table and `docs/performance.svg` from a lab
//!   log of the bench suite (docs/performance.md).

mod completions;
mod man;
mod package;
mod perf;
mod roff;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The workspace root (this crate lives in `packaging/xtask`).
fn workspace() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Every generated file: its path under the output directory and its content.
pub fn generated() -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut files = man::pages()?;
    files.extend(completions::scripts()?);
    Ok(files)
}

fn write_all(dir: &Path) -> anyhow::Result<()> {
    for (path, content) in generated()? {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["docs"] => write_all(&root.join("packaging/generated")),
        ["docs", dir] => write_all(Path::new(dir)),
        ["deb"] => package::deb(&root, &package::Binary::Release, None)
            .map(|p| println!("{}", p.display())),
        ["deb", "--binary", binary, "--out", out] => package::deb(
            &root,
            &package::Binary::Given(PathBuf::from(binary)),
            Some(Path::new(out)),
        )
        .map(|p| println!("{}", p.display())),
        ["perf", log] => perf::run(&root, Path::new(log)),
        ["rpm"] => package::rpm(&root, &package::Binary::Release, None, 1)
            .map(|p| println!("{}", p.display())),
        [
            "rpm",
            "--binary",
            binary,
            "--release",
            release,
            "--out",
            out,
        ] => package::rpm(
            &root,
            &package::Binary::Given(PathBuf::from(binary)),
            Some(Path::new(out)),
            release
                .parse()
                .with_context(|| format!("--release {release}: not a number"))?,
        )
        .map(|p| println!("{}", p.display())),
        ["packages"] => packages(&root, &package::Binary::Release),
        ["packages", "--binary", binary] => {
            packages(&root, &package::Binary::Checked(PathBuf::from(binary)))
        }
        _ => {
            bail!(
                "usage: cargo xtask docs [DIR] | deb [--binary PATH --out DIR] | \
                 rpm [--binary PATH --release N --out DIR] | packages [--binary PATH] | perf LOG"
            )
        }
    }
}

/// The .deb and the .rpm in `target/packages`, each checked as one that ships.
fn packages(root: &Path, binary: &package::Binary) -> anyhow::Result<()> {
    let deb = package::deb(root, binary, None)?;
    println!("{}", deb.display());
    let rpm = package::rpm(root, binary, None, 1)?;
    println!("{}", rpm.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed pages and completions are what the code generates now: change the CLI, the
    /// fence_pr metadata, the example config or the timing rules of docs/agent.md, then run
    /// `cargo xtask docs`.
    #[test]
    fn committed_docs_are_fresh() {
        let dir = workspace().join("packaging/generated");
        let files = generated().unwrap();
        let mut stale = Vec::new();
        for sub in ["man", "completions"] {
            for entry in std::fs::read_dir(dir.join(sub)).unwrap() {
                let path = PathBuf::from(sub).join(entry.unwrap().file_name());
                if !files.iter().any(|(p, _)| *p == path) {
                    stale.push(format!("{} (no longer generated)", path.display()));
                }
            }
        }
        for (path, content) in files {
            let committed = std::fs::read(dir.join(&path)).unwrap_or_default();
            if committed != content {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "out of date (run `cargo xtask docs`): {}",
            stale.join(", ")
        );
    }
}
