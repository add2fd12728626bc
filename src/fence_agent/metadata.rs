//! `metadata` output: fence-agents' XML format (validated against its lib/metadata.rng in
//! tests/fixtures), with every fence_scsi parameter so that `pcs stonith create … fence_pr` accepts
//! an existing fence_scsi configuration unchanged (pcs refuses parameters the metadata lacks).

use std::fmt::Write as _;

use super::Action;

#[derive(Debug, Clone, Copy)]
enum Content {
    Boolean,
    String,
    Second,
    Integer,
}

impl Content {
    fn as_str(self) -> &'static str {
        match self {
            Content::Boolean => "boolean",
            Content::String => "string",
            Content::Second => "second",
            Content::Integer => "integer",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Alias {
    None,
    /// This name is the old spelling, kept for existing configurations.
    Deprecated,
    /// This name replaces the given old one.
    Obsoletes(&'static str),
}

#[derive(Debug, Clone, Copy)]
struct Param {
    name: &'static str,
    required: bool,
    alias: Alias,
    getopt: &'static str,
    content: Content,
    default: Option<&'static str>,
    shortdesc: &'static str,
}

const fn param(
    name: &'static str,
    getopt: &'static str,
    content: Content,
    default: Option<&'static str>,
    shortdesc: &'static str,
) -> Param {
    Param {
        name,
        required: false,
        alias: Alias::None,
        getopt,
        content,
        default,
        shortdesc,
    }
}

const PLUG_DESC: &str = "Name of the node to fence or unfence; its reservation key is derived \
from it as fence_scsi does. Ignored when key is set.";
const SUPPRESS_DESC: &str = "Accepted for compatibility and ignored: fence_scsi uses it to stay \
     quiet about a missing device list in 'monitor', which fence_pr does not read.";
const DEBUG_DESC: &str = "Write debug information to this file.";

/// In fence_scsi's order (fence-agents sorts by its `order` field, then name).
const PARAMS: &[Param] = &[
    param(
        "action",
        "-o, --action=[action]",
        Content::String,
        Some("off"),
        "Fencing action",
    ),
    param(
        "aptpl",
        "-a, --aptpl",
        Content::Boolean,
        None,
        "Register with APTPL (the registration survives a target power loss); used by 'on' only.",
    ),
    param(
        "devices",
        "-d, --devices=[devices]",
        Content::String,
        None,
        "Devices to act on, separated by commas or spaces (e.g. /dev/sdc,/dev/mapper/mpatha). \
         Each must support SCSI-3 persistent reservations, or be an NVMe namespace with \
         reservation support.",
    ),
    param(
        "key",
        "-k, --key=[key]",
        Content::String,
        None,
        "Reservation key in hex (up to 16 digits, optional 0x), unique per node. For 'on' it is the \
         key this node registers; for 'off' the key removed from the devices. Derived from the node \
         name when unset.",
    ),
    Param {
        required: true,
        alias: Alias::Obsoletes("port"),
        ..param(
            "plug",
            "-n, --plug=[nodename]",
            Content::String,
            None,
            PLUG_DESC,
        )
    },
    Param {
        required: true,
        alias: Alias::Deprecated,
        ..param(
            "port",
            "-n, --plug=[nodename]",
            Content::String,
            None,
            PLUG_DESC,
        )
    },
    param(
        "mpath_register_method",
        "--mpath-register-method=[multi|single]",
        Content::String,
        Some("multi"),
        "multi: register on every path of every LU (a multipath device stands for its paths); \
         single: register, reserve and preempt through one path per LU only (the first live one).",
    ),
    param(
        "readonly",
        "--readonly",
        Content::Boolean,
        None,
        "Accepted for compatibility: fence_pr always opens devices read-only (SG_IO needs no \
         write access, and a read-only open triggers no udev change event).",
    ),
    Param {
        alias: Alias::Deprecated,
        ..param(
            "suppress-errors",
            "--suppress-errors",
            Content::Boolean,
            None,
            SUPPRESS_DESC,
        )
    },
    Param {
        alias: Alias::Obsoletes("suppress-errors"),
        ..param(
            "suppress_errors",
            "--suppress-errors",
            Content::Boolean,
            None,
            SUPPRESS_DESC,
        )
    },
    param(
        "logfile",
        "--logfile=[file]",
        Content::String,
        None,
        "Write output and errors to this file.",
    ),
    param(
        "quiet",
        "-q, --quiet",
        Content::Boolean,
        None,
        "Do not log to stderr.",
    ),
    param(
        "verbose",
        "-v, --verbose",
        Content::Boolean,
        None,
        "Verbose output; repeat -v for more.",
    ),
    param(
        "verbose_level",
        "--verbose-level",
        Content::Integer,
        None,
        "Level of detail of the output (default: the number of -v, or 1 if verbose=1).",
    ),
    Param {
        alias: Alias::Deprecated,
        ..param(
            "debug",
            "-D, --debug-file=[debugfile]",
            Content::String,
            None,
            DEBUG_DESC,
        )
    },
    Param {
        alias: Alias::Obsoletes("debug"),
        ..param(
            "debug_file",
            "-D, --debug-file=[debugfile]",
            Content::String,
            None,
            DEBUG_DESC,
        )
    },
    param(
        "version",
        "-V, --version",
        Content::Boolean,
        None,
        "Print the version and exit.",
    ),
    param(
        "help",
        "-h, --help",
        Content::Boolean,
        None,
        "Print help and exit.",
    ),
    param(
        "separator",
        "-C, --separator=[char]",
        Content::String,
        Some(","),
        "Separator of the columns printed by 'list' and 'list-status'.",
    ),
    param(
        "plug_separator",
        "--plug-separator=[char]",
        Content::String,
        Some(","),
        "Accepted for compatibility and ignored: a request names one node.",
    ),
    param(
        "delay",
        "-H, --delay=[seconds]",
        Content::Second,
        Some("0"),
        "Wait this many seconds before fencing ('off').",
    ),
    param(
        "disable_timeout",
        "--disable-timeout=[true/false]",
        Content::String,
        None,
        "Bound each device command by 10 s instead of power_timeout (default: true when run by \
         pacemaker-fenced, which enforces its own timeout).",
    ),
    param(
        "login_timeout",
        "--login-timeout=[seconds]",
        Content::Second,
        Some("5"),
        "Accepted for compatibility; fence_pr logs in nowhere.",
    ),
    param(
        "power_timeout",
        "--power-timeout=[seconds]",
        Content::Second,
        Some("20"),
        "Upper bound in seconds for each device command.",
    ),
    param(
        "power_wait",
        "--power-wait=[seconds]",
        Content::Second,
        Some("0"),
        "Wait this many seconds after 'on' or 'off'.",
    ),
    param(
        "shell_timeout",
        "--shell-timeout=[seconds]",
        Content::Second,
        Some("3"),
        "Accepted for compatibility; fence_pr runs no shell.",
    ),
    param(
        "stonith_status_sleep",
        "--stonith-status-sleep=[seconds]",
        Content::Second,
        Some("1"),
        "Accepted for compatibility and ignored: fence_pr does not poll the status after 'off' \
         (the action reads its result back itself).",
    ),
    param(
        "retry_on",
        "--retry-on=[attempts]",
        Content::Integer,
        Some("1"),
        "Accepted for compatibility and ignored: fence_pr runs 'on' once.",
    ),
    param(
        "corosync_cmap_path",
        "--corosync-cmap-path=[path]",
        Content::String,
        Some(crate::keys::COROSYNC_CMAPCTL),
        "Path of corosync-cmapctl, used to derive keys from the cluster name and nodelist.",
    ),
    param(
        "key_value",
        "--key-value=<id|hash|native>",
        Content::String,
        Some("id"),
        "How keys are derived from node names. \"id\" (default, as fence_scsi): md5 of the cluster \
         name and the node's position in the corosync nodelist, which can differ between nodes \
         after a node is removed without a full cluster restart. \"hash\" (as fence_scsi): md5 of \
         the cluster name and of the node name; stable, but only 16 bits per node. \"native\": \
         all 64 bits, a cluster tag and the corosync nodeid; stable and collision-free, but not \
         the keys fence_scsi uses.",
    ),
    param(
        "sg_persist_path",
        "--sg_persist-path=[path]",
        Content::String,
        Some("/usr/bin/sg_persist"),
        "Accepted for fence_scsi compatibility; fence_pr issues the commands itself.",
    ),
    param(
        "sg_turs_path",
        "--sg_turs-path=[path]",
        Content::String,
        Some("/usr/bin/sg_turs"),
        "Accepted for fence_scsi compatibility; fence_pr issues the commands itself.",
    ),
    param(
        "vgs_path",
        "--vgs-path=[path]",
        Content::String,
        Some("/sbin/vgs"),
        "Path of vgs, used to find shared volume group devices when devices is unset.",
    ),
];

const SHORTDESC: &str = "Fence agent for SCSI persistent reservations (fence_scsi compatible)";

const LONGDESC: &str = "fence_pr is an I/O fencing agent that uses SCSI-3 persistent \
reservations (or NVMe reservations, on NVMe namespaces) to control access to shared storage, a drop-in replacement for fence_scsi: it \
accepts the same parameters and derives the same reservation keys, so a running cluster can \
switch without re-keying. Each node registers its key on the devices ('on', run automatically \
on the node when it joins) and one node holds a \"write exclusive, registrants only\" \
reservation; 'off' removes the victim's key with PREEMPT AND ABORT and verifies that it is gone. \
A fenced node is cut off from the storage but not rebooted, so this agent never offers reboot. \
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
    for p in PARAMS {
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
    use crate::fence_agent::options::OPTIONS;

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
            let p = PARAMS.iter().find(|p| p.name == name);
            assert!(
                p.is_some_and(|p| p.shortdesc.starts_with("Accepted for")),
                "{name}: {p:?}"
            );
        }
        for p in PARAMS.iter().filter(|p| !ignored.contains(&p.name)) {
            assert!(!p.shortdesc.starts_with("Accepted for"), "{}", p.name);
        }
    }

    #[test]
    fn agent_name_is_escaped() {
        assert!(metadata_xml("a\"b").contains("name=\"a&quot;b\""));
    }
}
