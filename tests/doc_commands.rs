//! What the docs tell an admin to type is run by a test as written: every ```sh block of
//! README.md and docs/ follows a marker `<!-- NAME: every node -->`, `<!-- NAME: one node -->` or
//! `<!-- NAME: site values -->` (tests/common/doc_blocks.rs), and every NAME is one a test reads.
//! A new shell block without a marker, or a marker no test reads, fails here in seconds, before
//! the lab would have to notice. The one-line `prfence` examples of the pages (indented, not
//! blocks) are parsed by prfence's own command line definition; docs/cli.md's are also run in
//! the lab (pr::cli_md_examples_as_written_iscsi).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

#[path = "common/doc_blocks.rs"]
#[allow(dead_code)] // each test binary uses part of it
mod doc_blocks;

/// The admin's pages: README.md and every page of docs/.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    pages.insert(0, root.join("README.md"));
    pages
}

/// Every Rust source under tests/, except this file.
fn test_sources(dir: &Path, into: &mut String) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            test_sources(&path, into);
        } else if path.extension().is_some_and(|x| x == "rs") && !path.ends_with("doc_commands.rs")
        {
            into.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The marker's NAME when `line` is a block marker.
fn marker_name(line: &str) -> Option<&str> {
    let inner = line.trim().strip_prefix("<!-- ")?.strip_suffix(" -->")?;
    let (name, at) = inner.split_once(": ")?;
    ["every node", "one node", "site values"]
        .contains(&at)
        .then_some(name)
}

#[test]
fn every_shell_block_of_the_docs_is_marked_with_a_name_a_test_reads() {
    let mut sources = String::new();
    test_sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
        &mut sources,
    );
    let mut unmarked = Vec::new();
    let mut unread = Vec::new();
    let mut blocks = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let shown = page.file_name().unwrap().to_string_lossy().into_owned();
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start() != "```sh" {
                continue;
            }
            blocks += 1;
            match i.checked_sub(1).and_then(|j| marker_name(lines[j])) {
                None => unmarked.push(format!("{shown}:{}", i + 1)),
                Some(name) if !sources.contains(&format!("\"{name}\"")) => {
                    unread.push(format!("{shown}:{}: {name}", i + 1));
                }
                Some(_) => {}
            }
        }
    }
    assert!(
        unmarked.is_empty(),
        "shell blocks without a marker (run them in a test, or show them as an indented example): \
         {unmarked:?}"
    );
    assert!(unread.is_empty(), "markers no test reads: {unread:?}");
    // README's quick start alone has five: the test would pass vacuously if it found none
    assert!(blocks >= 5, "only {blocks} shell blocks found");
}

#[test]
fn every_prfence_example_of_the_docs_parses() {
    use clap::Parser;
    let mut parsed = 0;
    let mut refused = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for command in doc_blocks::example_commands(&text) {
            match prfence::cli::Cli::try_parse_from(command.split_whitespace()) {
                Ok(_) => parsed += 1,
                Err(e) => refused.push(format!(
                    "{}: {command}: {}",
                    page.file_name().unwrap().to_string_lossy(),
                    e.kind()
                )),
            }
        }
    }
    assert!(refused.is_empty(), "examples prfence refuses: {refused:#?}");
    // docs/cli.md alone shows about twenty: none found means the filter broke
    assert!(parsed >= 15, "only {parsed} examples found");
    println!("{parsed} examples parse");
}

#[test]
fn examples_are_taken_as_an_admin_types_them() {
    let text = "    prfence keys /dev/sdb   # a comment\n    $ prfence --json keys /dev/sdb\n    \
                prfence [--json] COMMAND DEVICE...\n    prfence fence --key 0xb /dev/sdd ...\n\
                prfence keys /dev/not-indented\n";
    assert_eq!(
        doc_blocks::example_commands(text),
        [
            "prfence keys /dev/sdb",
            "prfence --json keys /dev/sdb",
            "prfence fence --key 0xb /dev/sdd"
        ]
    );
    // and a misspelt option is what the parse catches
    use clap::Parser;
    assert!(
        prfence::cli::Cli::try_parse_from("prfence keys --kee 0xa /dev/sdb".split(' ')).is_err()
    );
}

#[test]
fn a_marker_is_recognised_only_in_its_three_forms() {
    assert_eq!(marker_name("<!-- upgrade: every node -->"), Some("upgrade"));
    assert_eq!(
        marker_name("<!-- rollback: site values -->"),
        Some("rollback")
    );
    assert_eq!(
        marker_name("<!-- quick-start: one node -->"),
        Some("quick-start")
    );
    assert_eq!(marker_name("<!-- perf-table: generated -->"), None);
    assert_eq!(marker_name("sh"), None);
}
