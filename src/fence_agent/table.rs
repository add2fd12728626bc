//! fence_pr's one option table: every option fence_scsi accepts, with its stdin name, its
//! command-line spellings and its metadata entries. The parsers (`options`), `--help` (`usage`)
//! and `metadata` all read it, so an option cannot be accepted without being described or
//! described without being accepted. Names, short letters and value rules are those of
//! fence_scsi 4.12.1 (plus `mpath_register_method` from fence-agents HEAD).

/// A parameter's `content type` in the metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Content {
    Boolean,
    String,
    Second,
    Integer,
}

impl Content {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Content::Boolean => "boolean",
            Content::String => "string",
            Content::Second => "second",
            Content::Integer => "integer",
        }
    }
}

/// How a metadata name relates to another name of the same option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Alias {
    None,
    /// This name is the old spelling, kept for existing configurations.
    Deprecated,
    /// This name replaces the given old one.
    Obsoletes(&'static str),
}

/// One `<parameter>` of the metadata. An option has one, none (Pacemaker passes it) or two (the
/// current name and the old one fence-agents still lists, `deprecated` and `obsoletes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Param {
    /// Its place in the metadata: fence_scsi's order (fence-agents sorts by its `order` field,
    /// then name), which is not the option table's.
    pub position: u8,
    pub name: &'static str,
    pub required: bool,
    pub alias: Alias,
    pub getopt: &'static str,
    pub content: Content,
    pub default: Option<&'static str>,
    pub shortdesc: &'static str,
}

const fn param(
    position: u8,
    name: &'static str,
    getopt: &'static str,
    content: Content,
    default: Option<&'static str>,
    shortdesc: &'static str,
) -> Param {
    Param {
        position,
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

/// One option as fence-agents' `all_opt` defines it for fence_scsi.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct OptSpec {
    /// The stdin / metadata name (fence-agents' `all_opt` key).
    pub key: &'static str,
    /// The long command-line name, without the leading `--`.
    pub long: &'static str,
    /// The short command-line letter, if fence_scsi has one.
    pub short: Option<char>,
    /// Whether the option takes a value (getopt `:`); otherwise it is a flag.
    pub takes_value: bool,
    /// How `metadata` lists it.
    pub listed: &'static [Param],
}

const fn value(key: &'static str, long: &'static str, short: Option<char>) -> OptSpec {
    OptSpec {
        key,
        long,
        short,
        takes_value: true,
        listed: &[],
    }
}

const fn flag(key: &'static str, long: &'static str, short: Option<char>) -> OptSpec {
    OptSpec {
        key,
        long,
        short,
        takes_value: false,
        listed: &[],
    }
}

impl OptSpec {
    /// The option with its metadata entries.
    const fn listed(self, listed: &'static [Param]) -> OptSpec {
        OptSpec { listed, ..self }
    }
}

/// Every option fence_scsi accepts. Facts checked against /usr/sbin/fence_scsi 4.12.1 and
/// `fence_scsi --help`: `-f` for logfile is advertised but not a getopt letter (a parse error
/// there, so here too); `delay` is `-H` in fence_scsi only; `-C/--separator` is accepted because
/// `port` pulls it in, although fence_scsi hides list from its metadata.
pub(super) const OPTIONS: &[OptSpec] = &[
    value("action", "action", Some('o')).listed(&[
            param(
                0,
                "action",
                "-o, --action=[action]",
                Content::String,
                Some("off"),
                "Fencing action",
            ),
    ]),
    value("port", "plug", Some('n')).listed(&[
            Param {
                required: true,
                alias: Alias::Obsoletes("port"),
                ..param(
                    4,
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
                    5,
                    "port",
                    "-n, --plug=[nodename]",
                    Content::String,
                    None,
                    PLUG_DESC,
                )
            },
    ]),
    value("nodename", "nodename", None),
    // Not a fence_scsi option: Pacemaker passes the target's corosync nodeid as `nodeid` (fence
    // actions, when known); fence_scsi ignores it, the native key scheme uses it.
    value("nodeid", "nodeid", None),
    value("devices", "devices", Some('d')).listed(&[
            param(
                2,
                "devices",
                "-d, --devices=[devices]",
                Content::String,
                None,
                "Devices to act on, separated by commas or spaces (e.g. /dev/sdc,/dev/mapper/mpatha). \
                 Each must support SCSI-3 persistent reservations, or be an NVMe namespace with \
                 reservation support.",
            ),
    ]),
    value("coordinators", "coordinators", None).listed(&[
            param(
                33,
                "coordinators",
                "--coordinators=[devices]",
                Content::String,
                None,
                "Coordinator LUs, 3 or 5, one per array or target, separated by commas or spaces, \
                 the same on every node (prfence's own parameter). 'off' then wins on a majority of \
                 them instead of on the first LU of devices, so a fence still succeeds with one \
                 array lost; 'on' registers on them too. Unset: the first LU decides.",
            ),
    ]),
    value("unreachable_data", "unreachable-data", None).listed(&[
            param(
                34,
                "unreachable_data",
                "--unreachable-data=[fail|report]",
                Content::String,
                Some("fail"),
                "With coordinators: what 'off' does with a data LU no path answers once it won the \
                 coordinators (prfence's own parameter). fail: the fence fails naming it. report: \
                 for an array known to be down, not cut off from this node alone, the fence \
                 succeeds with every other data LU fenced and names it as not fenced; the \
                 victim's key stays there.",
            ),
    ]),
    value("key", "key", Some('k')).listed(&[
            param(
                3,
                "key",
                "-k, --key=[key]",
                Content::String,
                None,
                "Reservation key in hex (up to 16 digits, optional 0x), unique per node. For 'on' it is the \
                 key this node registers; for 'off' the key removed from the devices. Derived from the node \
                 name when unset.",
            ),
    ]),
    flag("aptpl", "aptpl", Some('a')).listed(&[
            param(
                1,
                "aptpl",
                "-a, --aptpl",
                Content::Boolean,
                None,
                "Register with APTPL (the registration survives a target power loss); used by 'on' only.",
            ),
    ]),
    flag("readonly", "readonly", None).listed(&[
            param(
                7,
                "readonly",
                "--readonly",
                Content::Boolean,
                None,
                "Accepted for compatibility: fence_pr always opens devices read-only (SG_IO needs no \
                 write access, and a read-only open triggers no udev change event).",
            ),
    ]),
    flag("suppress-errors", "suppress-errors", None).listed(&[
            Param {
                alias: Alias::Deprecated,
                ..param(
                    8,
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
                    9,
                    "suppress_errors",
                    "--suppress-errors",
                    Content::Boolean,
                    None,
                    SUPPRESS_DESC,
                )
            },
    ]),
    value("logfile", "logfile", None).listed(&[
            param(
                10,
                "logfile",
                "--logfile=[file]",
                Content::String,
                None,
                "Write output and errors to this file.",
            ),
    ]),
    value("corosync_cmap_path", "corosync-cmap-path", None).listed(&[
            param(
                28,
                "corosync_cmap_path",
                "--corosync-cmap-path=[path]",
                Content::String,
                Some(crate::keys::COROSYNC_CMAPCTL),
                "Path of corosync-cmapctl, used to derive keys from the cluster name and nodelist.",
            ),
    ]),
    value("sg_persist_path", "sg_persist-path", None).listed(&[
            param(
                30,
                "sg_persist_path",
                "--sg_persist-path=[path]",
                Content::String,
                Some("/usr/bin/sg_persist"),
                "Accepted for fence_scsi compatibility; fence_pr issues the commands itself.",
            ),
    ]),
    value("sg_turs_path", "sg_turs-path", None).listed(&[
            param(
                31,
                "sg_turs_path",
                "--sg_turs-path=[path]",
                Content::String,
                Some("/usr/bin/sg_turs"),
                "Accepted for fence_scsi compatibility; fence_pr issues the commands itself.",
            ),
    ]),
    value("vgs_path", "vgs-path", None).listed(&[
            param(
                32,
                "vgs_path",
                "--vgs-path=[path]",
                Content::String,
                Some("/sbin/vgs"),
                "Path of vgs, used to find shared volume group devices when devices is unset.",
            ),
    ]),
    value("key_value", "key-value", None).listed(&[
            param(
                29,
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
    ]),
    value("mpath_register_method", "mpath-register-method", None).listed(&[
            param(
                6,
                "mpath_register_method",
                "--mpath-register-method=[multi|single]",
                Content::String,
                Some("multi"),
                "multi: register on every path of every LU (a multipath device stands for its paths); \
                 single: register, reserve and preempt through one path per LU only (the first live one).",
            ),
    ]),
    flag("help", "help", Some('h')).listed(&[
            param(
                17,
                "help",
                "-h, --help",
                Content::Boolean,
                None,
                "Print help and exit.",
            ),
    ]),
    flag("version", "version", Some('V')).listed(&[
            param(
                16,
                "version",
                "-V, --version",
                Content::Boolean,
                None,
                "Print the version and exit.",
            ),
    ]),
    flag("verbose", "verbose", Some('v')).listed(&[
            param(
                12,
                "verbose",
                "-v, --verbose",
                Content::Boolean,
                None,
                "Verbose output; repeat -v for more.",
            ),
    ]),
    value("verbose_level", "verbose-level", None).listed(&[
            param(
                13,
                "verbose_level",
                "--verbose-level",
                Content::Integer,
                None,
                "Level of detail of the output (default: the number of -v, or 1 if verbose=1).",
            ),
    ]),
    value("debug", "debug-file", Some('D')).listed(&[
            Param {
                alias: Alias::Deprecated,
                ..param(
                    14,
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
                    15,
                    "debug_file",
                    "-D, --debug-file=[debugfile]",
                    Content::String,
                    None,
                    DEBUG_DESC,
                )
            },
    ]),
    flag("quiet", "quiet", Some('q')).listed(&[
            param(
                11,
                "quiet",
                "-q, --quiet",
                Content::Boolean,
                None,
                "Do not log to stderr.",
            ),
    ]),
    value("delay", "delay", Some('H')).listed(&[
            param(
                20,
                "delay",
                "-H, --delay=[seconds]",
                Content::Second,
                Some("0"),
                "Wait this many seconds before fencing ('off').",
            ),
    ]),
    value("power_timeout", "power-timeout", None).listed(&[
            param(
                23,
                "power_timeout",
                "--power-timeout=[seconds]",
                Content::Second,
                Some("20"),
                "Upper bound in seconds for each device command.",
            ),
    ]),
    value("shell_timeout", "shell-timeout", None).listed(&[
            param(
                25,
                "shell_timeout",
                "--shell-timeout=[seconds]",
                Content::Second,
                Some("3"),
                "Accepted for compatibility; fence_pr runs no shell.",
            ),
    ]),
    value("login_timeout", "login-timeout", None).listed(&[
            param(
                22,
                "login_timeout",
                "--login-timeout=[seconds]",
                Content::Second,
                Some("5"),
                "Accepted for compatibility; fence_pr logs in nowhere.",
            ),
    ]),
    value("disable_timeout", "disable-timeout", None).listed(&[
            param(
                21,
                "disable_timeout",
                "--disable-timeout=[true/false]",
                Content::String,
                None,
                "Bound each device command by 10 s instead of power_timeout (default: true when run by \
                 pacemaker-fenced, which enforces its own timeout).",
            ),
    ]),
    value("power_wait", "power-wait", None).listed(&[
            param(
                24,
                "power_wait",
                "--power-wait=[seconds]",
                Content::Second,
                Some("0"),
                "Wait this many seconds after 'on' or 'off'.",
            ),
    ]),
    value("stonith_status_sleep", "stonith-status-sleep", None).listed(&[
            param(
                26,
                "stonith_status_sleep",
                "--stonith-status-sleep=[seconds]",
                Content::Second,
                Some("1"),
                "Accepted for compatibility and ignored: fence_pr does not poll the status after 'off' \
                 (the action reads its result back itself).",
            ),
    ]),
    value("retry_on", "retry-on", None).listed(&[
            param(
                27,
                "retry_on",
                "--retry-on=[attempts]",
                Content::Integer,
                Some("1"),
                "Accepted for compatibility and ignored: fence_pr runs 'on' once.",
            ),
    ]),
    value("plug_separator", "plug-separator", None).listed(&[
            param(
                19,
                "plug_separator",
                "--plug-separator=[char]",
                Content::String,
                Some(","),
                "Accepted for compatibility and ignored: a request names one node.",
            ),
    ]),
    value("separator", "separator", Some('C')).listed(&[
            param(
                18,
                "separator",
                "-C, --separator=[char]",
                Content::String,
                Some(","),
                "Separator of the columns printed by 'list' and 'list-status'.",
            ),
    ]),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metadata entry has a place of its own, and the places leave no gap.
    #[test]
    fn metadata_positions_are_a_permutation() {
        let mut positions: Vec<u8> = OPTIONS
            .iter()
            .flat_map(|o| o.listed)
            .map(|p| p.position)
            .collect();
        positions.sort_unstable();
        let expected: Vec<u8> = (0..).take(positions.len()).collect();
        assert_eq!(positions, expected);
    }

    /// The parameter names are the option's stdin name or its renamed twin.
    #[test]
    fn each_option_lists_its_own_name() {
        for o in OPTIONS.iter().filter(|o| !o.listed.is_empty()) {
            assert!(
                o.listed.iter().any(|p| p.name == o.key),
                "{} lists {:?}",
                o.key,
                o.listed.iter().map(|p| p.name).collect::<Vec<_>>()
            );
        }
    }
}
