//! `fence_pr` metadata must validate against fence-agents' RelaxNG schema (the Fence Agent API
//! says so, and pcs/Pacemaker tooling relies on its shape). Needs `xmllint` (libxml2-utils): the
//! test fails, never skips, when it is missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "lab/host_tools.rs"]
mod host_tools;

use std::path::PathBuf;
use std::process::Command;

use prfence::fence_agent::metadata::metadata_xml;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn xmllint_relaxng(xml: &str, name: &str) -> std::process::Output {
    host_tools::ensure();
    let dir = std::env::temp_dir().join(format!("prfence-metadata-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, xml).unwrap();
    let out = Command::new("xmllint")
        .arg("--noout")
        .arg("--relaxng")
        .arg(fixture("fence-agent-metadata.rng"))
        .arg(&file)
        .output()
        .expect("xmllint must be installed (apt-get install libxml2-utils)");
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

#[test]
fn metadata_validates_against_fence_agents_schema() {
    let out = xmllint_relaxng(&metadata_xml("fence_pr"), "fence_pr.xml");
    assert!(
        out.status.success(),
        "xmllint rejected the metadata:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn metadata_with_awkward_agent_name_still_validates() {
    let out = xmllint_relaxng(&metadata_xml("fence_<pr>&\"'"), "odd.xml");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn schema_check_is_not_vacuous() {
    // A reboot-less document with a wrong content type must be rejected, proving xmllint
    // really applies the schema.
    let bad = metadata_xml("fence_pr").replace("type=\"second\"", "type=\"seconds\"");
    let out = xmllint_relaxng(&bad, "bad.xml");
    assert!(
        !out.status.success(),
        "schema accepted an invalid content type"
    );
}

/// The metadata is what `pcs stonith describe` and Pacemaker read: every byte is pinned, so
/// refactoring the option table or `Options` cannot change it unnoticed.
#[test]
fn metadata_is_byte_identical_to_the_pinned_copy() {
    let pinned = std::fs::read_to_string(fixture("fence_pr-metadata.xml")).unwrap();
    assert_eq!(metadata_xml("fence_pr"), pinned);
}

/// The `<shortdesc>` of parameter `name` in the metadata Pacemaker and `pcs stonith describe`
/// read.
fn shortdesc(xml: &str, name: &str) -> String {
    let start = xml
        .find(&format!("<parameter name=\"{name}\""))
        .unwrap_or_else(|| panic!("no parameter {name}"));
    let block = &xml[start..];
    let block = &block[..block.find("</parameter>").unwrap()];
    let open = "<shortdesc lang=\"en\">";
    let text = &block[block.find(open).unwrap() + open.len()..];
    text[..text.find("</shortdesc>").unwrap()].to_owned()
}

/// Issue 21: retry_on, stonith_status_sleep and suppress_errors were documented as doing
/// something; fence_pr validates and drops them (fence_agent::build). What an admin reads in the
/// metadata must say they have no effect, and the options that act must not say so.
#[test]
fn options_that_do_nothing_say_so_in_the_metadata() {
    let xml = metadata_xml("fence_pr");
    for name in [
        "retry_on",
        "stonith_status_sleep",
        "suppress_errors",
        "suppress-errors",
        "plug_separator",
    ] {
        let text = shortdesc(&xml, name);
        assert!(
            text.starts_with("Accepted for compatibility and ignored"),
            "{name}: {text}"
        );
    }
    for name in [
        "login_timeout",
        "shell_timeout",
        "readonly",
        "sg_persist_path",
        "sg_turs_path",
    ] {
        let text = shortdesc(&xml, name);
        assert!(text.starts_with("Accepted for"), "{name}: {text}");
    }
    for name in [
        "delay",
        "power_timeout",
        "power_wait",
        "aptpl",
        "devices",
        "key",
        "key_value",
        "mpath_register_method",
        "corosync_cmap_path",
        "vgs_path",
    ] {
        let text = shortdesc(&xml, name);
        assert!(!text.contains("Accepted for"), "{name}: {text}");
        assert!(!text.contains("ignored"), "{name}: {text}");
    }
}
