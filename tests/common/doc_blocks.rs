//! Command blocks of the docs that tests run as written: README.md's quick start and
//! docs/pacemaker.md's fence_scsi → fence_pr migration, docs/agent.md's stop hook. A block is a ```sh block right after a
//! marker `<!-- NAME: every node -->` or `<!-- NAME: one node -->`; the first ```sh block after
//! the section's heading holds the site-specific values an admin sets first.

pub const README: &str = include_str!("../../README.md");
pub const PACEMAKER: &str = include_str!("../../docs/pacemaker.md");
pub const AGENT: &str = include_str!("../../docs/agent.md");

/// Where a block runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    EveryNode,
    OneNode,
}

/// The blocks marked `name` in `doc`, in order: where each runs, and its commands.
pub fn blocks(doc: &str, name: &str) -> Result<Vec<(Where, String)>, String> {
    let (every, one) = (
        format!("<!-- {name}: every node -->"),
        format!("<!-- {name}: one node -->"),
    );
    let mut blocks = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let at = match line.trim() {
            l if l == every => Where::EveryNode,
            l if l == one => Where::OneNode,
            _ => continue,
        };
        if lines.next() != Some("```sh") {
            return Err(format!("{line} must precede a ```sh block"));
        }
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push((at, body.join("\n")));
    }
    if blocks.is_empty() {
        return Err(format!("no block marked {every} or {one}"));
    }
    Ok(blocks)
}

/// The site-specific values of the section under `heading`: its first ```sh block.
pub fn site_values(doc: &str, heading: &str) -> Result<String, String> {
    let start = doc
        .find(heading)
        .ok_or_else(|| format!("no heading {heading:?}"))?;
    let rest = &doc[start..];
    let block = rest
        .find("```sh\n")
        .ok_or_else(|| format!("{heading:?} has no block"))?
        + "```sh\n".len();
    let end = rest[block..].find("```").ok_or("an unterminated block")?;
    Ok(rest[block..block + end].to_owned())
}
