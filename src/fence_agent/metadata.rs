//! `metadata` output: fence-agents' XML format (validated against its lib/metadata.rng in
//! tests/fixtures), with every fence_scsi parameter so that `pcs stonith create … fence_pr` accepts
//! an existing fence_scsi configuration unchanged (pcs refuses parameters the metadata lacks).

use std::fmt::Write as _;

use super::Action;
use super::table::{Alias, OPTIONS, Param};

/// The metadata's parameters, in fence_scsi's order.
fn params() -> Vec<&'static Param> {
    let mut params: Vec<&'static Param> = OPTIONS.iter().flat_map(|o| o.listed).collect();
    params.sort_by_key(|p| p.position);
    params
}

const SHORTDESC: &str = "Fence agent for SCSI persistent reservations (fence_scsi compatible)";

const LONGDESC: &str = "fence_pr is an I/O fencing agent that uses SCSI-3 persistent \
reservations (or NVMe reservations, on NVMe namespaces) to control access to shared storage, a drop-in replacement for fence_scsi: it \
accepts the same parameters and derives the same reservation keys, so a running cluster can \
switch without re-keying. Each node registers its key on the devices ('on', run automatically \
on the node when it joins) and one node holds a \"write exclusive, registrants only\" \
reservation; 'off' removes the victim's key with PREEMPT AND ABORT and verifies that it is gone. \
A fenced node is cut off from the storage but not rebooted, so this agent never offers reboot; \
its 'on' registers it nowhere once its key is gone (preempted, or lost with every other key) \
from a device an earlier 'on' in this boot began registering on: the node must reboot first. \
'monitor' probes the devices (reachable, persistent reservations supported, this node's key \
present) and reports a degraded path without failing. 'list' prints the nodes of the corosync \
nodelist, which Pacemaker uses to decide which nodes this device can fence when neither \
pcmk_host_list nor pcmk_host_map is set.";

/// Actions in the order they are listed. `on` carries on_target and automatic: Pacemaker runs it
/// on the node being unfenced, and unfences automatically when the node joins.
pub const ADVERTISED_ACTIONS: &[Action] = &[
    Action::On,
    Action::Off,
    Action::Status,
    Action::Monitor,
    Action::List,
    Action::ListStatus,
    Action::Metadata,
    Action::ValidateAll,
];

/// Escapes text for an XML attribute value or element content.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            _ => out.push(c),
        }
    }
    out
}

/// The metadata document; `agent_name` is the name the binary was invoked as (fence-agents uses
/// the basename of `argv[0]`), normally `fence_pr`.
pub fn metadata_xml(agent_name: &str) -> String {
    let mut xml = String::new();
    // Writing to a String cannot fail; `let _ =` keeps that explicit without unwrap.
    let _ = writeln!(xml, "<?xml version=\"1.0\" ?>");
    let _ = writeln!(
        xml,
        "<resource-agent name=\"{}\" shortdesc=\"{}\" >",
        xml_escape(agent_name),
        xml_escape(SHORTDESC)
    );
    let _ = writeln!(xml, "<longdesc>{}</longdesc>", xml_escape(LONGDESC));
    let _ = writeln!(xml, "<vendor-url></vendor-url>");
    let _ = writeln!(xml, "<parameters>");
    for p in params() {
        let alias = match p.alias {
            Alias::None => String::new(),
            Alias::Deprecated => " deprecated=\"1\"".to_owned(),
            Alias::Obsoletes(old) => format!(" obsoletes=\"{}\"", xml_escape(old)),
        };
        let _ = writeln!(
            xml,
            "\t<parameter name=\"{}\" unique=\"0\" required=\"{}\"{alias}>",
            xml_escape(p.name),
            u8::from(p.required)
        );
        let _ = writeln!(xml, "\t\t<getopt mixed=\"{}\" />", xml_escape(p.getopt));
        let default = p
            .default
            .map(|d| format!(" default=\"{}\"", xml_escape(d)))
            .unwrap_or_default();
        let _ = writeln!(
            xml,
            "\t\t<content type=\"{}\"{default} />",
            p.content.as_str()
        );
        let _ = writeln!(
            xml,
            "\t\t<shortdesc lang=\"en\">{}</shortdesc>",
            xml_escape(p.shortdesc)
        );
        let _ = writeln!(xml, "\t</parameter>");
    }
    let _ = writeln!(xml, "</parameters>");
    let _ = writeln!(xml, "<actions>");
    for action in ADVERTISED_ACTIONS {
        if *action == Action::On {
            let _ = writeln!(
                xml,
                "\t<action name=\"on\" on_target=\"1\" automatic=\"1\"/>"
            );
        } else {
            let _ = writeln!(xml, "\t<action name=\"{}\" />", action.as_str());
        }
    }
    let _ = writeln!(xml, "</actions>");
    let _ = writeln!(xml, "</resource-agent>");
    xml
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(
            xml_escape(r#"<a & "b" 'c'>"#),
            "&lt;a &amp; &quot;b&quot; &apos;c&apos;&gt;"
        );
        assert_eq!(xml_escape("plain"), "plain");
    }

    #[test]
    fn every_option_with_a_metadata_name_is_listed() {
        let xml = metadata_xml("fence_pr");
        // nodename and nodeid come from Pacemaker, not from configuration.
        for o in OPTIONS
            .iter()
            .filter(|o| o.key != "nodename" && o.key != "nodeid")
        {
            assert!(
                xml.contains(&format!("<parameter name=\"{}\"", o.key)),
                "{} missing",
                o.key
            );
        }
        // fence_scsi does not list nodename (Pacemaker always passes it); neither do we.
        assert!(!xml.contains("name=\"nodename\""));
        assert!(!xml.contains("name=\"nodeid\""));
    }

    #[test]
    fn actions_have_no_reboot_and_on_is_automatic_on_target() {
        let xml = metadata_xml("fence_pr");
        assert!(!xml.contains("<action name=\"reboot\""));
        assert!(xml.contains("<action name=\"on\" on_target=\"1\" automatic=\"1\"/>"));
        for a in [
            "off",
            "status",
            "monitor",
            "list",
            "list-status",
            "metadata",
            "validate-all",
        ] {
            assert!(xml.contains(&format!("<action name=\"{a}\" />")), "{a}");
        }
    }

    /// Options fence_pr accepts but does not act on (fence_agent::build says why for each) say
    /// so, so an admin does not tune them expecting an effect.
    #[test]
    fn options_without_an_effect_say_they_are_ignored() {
        let ignored = [
            "readonly",
            "suppress-errors",
            "suppress_errors",
            "plug_separator",
            "login_timeout",
            "shell_timeout",
            "stonith_status_sleep",
            "retry_on",
            "sg_persist_path",
            "sg_turs_path",
        ];
        for name in ignored {
            let p = params().into_iter().find(|p| p.name == name);
            assert!(
                p.is_some_and(|p| p.shortdesc.starts_with("Accepted for")),
                "{name}: {p:?}"
            );
        }
        for p in params().into_iter().filter(|p| !ignored.contains(&p.name)) {
            assert!(!p.shortdesc.starts_with("Accepted for"), "{}", p.name);
        }
    }

    #[test]
    fn agent_name_is_escaped() {
        assert!(metadata_xml("a\"b").contains("name=\"a&quot;b\""));
    }
}
