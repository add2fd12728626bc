//! Command blocks of the docs that tests run as written: README.md's quick start,
//! docs/pacemaker.md's fence_scsi → fence_pr migration and way back, docs/agent.md's stop hook,
//! docs/operations.md's cluster upgrade. A block is a ```sh block right after a
//! marker `<!-- NAME: every node -->` or `<!-- NAME: one node -->`; the block after
//! `<!-- NAME: site values -->` holds the site-specific values an admin sets first. The
//! one-line `prfence` examples of a page (indented, not in a block): [`example_commands`].

pub const README: &str = include_str!("../../README.md");
pub const PACEMAKER: &str = include_str!("../../docs/pacemaker.md");
pub const AGENT: &str = include_str!("../../docs/agent.md");
pub const OPERATIONS: &str = include_str!("../../docs/operations.md");
pub const CLI: &str = include_str!("../../docs/cli.md");

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

/// The site-specific values the blocks marked `name` start from: the ```sh block after
/// `<!-- NAME: site values -->`.
pub fn site_values(doc: &str, name: &str) -> Result<String, String> {
    let marker = format!("<!-- {name}: site values -->");
    let mut lines = doc.lines().skip_while(|l| l.trim() != marker);
    if lines.next().is_none() {
        return Err(format!("no {marker}"));
    }
    if lines.next() != Some("```sh") {
        return Err(format!("{marker} must precede a ```sh block"));
    }
    let body: Vec<&str> = lines.take_while(|l| *l != "```").collect();
    Ok(body.join("\n") + "\n")
}

/// The `prfence …` command lines the pages show as indented examples (`$ ` prompts taken off,
/// comments and `...` dropped); synopses (with `[…]` or an upper-case placeholder) left out.
pub fn example_commands(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with("    "))
        .map(|l| l.trim().trim_start_matches("$ "))
        .filter(|l| l.starts_with("prfence "))
        .map(|l| l.split(" #").next().unwrap_or(l).trim())
        .filter(|l| {
            !l.contains('[')
                && !l
                    .split_whitespace()
                    .any(|w| w.len() > 2 && w.chars().all(|c| c.is_ascii_uppercase()))
        })
        .map(|l| {
            l.split_whitespace()
                .filter(|w| *w != "..." && *w != "…")
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}
