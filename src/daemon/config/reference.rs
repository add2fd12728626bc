//! Every setting of the agent's configuration file, with the default the parser applies when it
//! is left out: the one table `prfence-agent.toml(5)` is generated from (`cargo xtask docs`).
//! The parser's tests hold the two together: every field serde accepts is here and nothing else,
//! and leaving a setting out parses to the same settings as writing its default here.

/// What the parser does when a setting is left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Default {
    /// The file must give it.
    Required,
    /// This value, as TOML (a string is quoted): writing it changes nothing.
    Value(&'static str),
    /// Something a single value cannot say (it depends on another setting, or the host).
    Otherwise(&'static str),
}

/// Which mode a setting applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modes {
    Both,
    Watch,
    Lease,
}

impl Modes {
    pub fn text(self) -> &'static str {
        match self {
            Modes::Both => "watch and lease mode",
            Modes::Watch => "watch mode",
            Modes::Lease => "lease mode",
        }
    }
}

/// One setting of the file.
#[derive(Debug, Clone, Copy)]
pub struct SettingDoc {
    /// The table it is in: "" at the top, "device" for `[[device]]`, else `[section]`.
    pub section: &'static str,
    pub name: &'static str,
    /// What it takes.
    pub value: &'static str,
    pub default: Default,
    pub modes: Modes,
    pub text: &'static str,
}

/// A table of the file, in the order the page shows them.
#[derive(Debug, Clone, Copy)]
pub struct SectionDoc {
    pub section: &'static str,
    pub text: &'static str,
}

pub const SECTIONS: &[SectionDoc] = &[
    SectionDoc {
        section: "",
        text: "Top-level settings, before any table.",
    },
    SectionDoc {
        section: "device",
        text: "One `[[device]]` table per LU the node writes to: a dm-multipath map, a SCSI disk \
               or an NVMe namespace; 1 to 1024 of them. Watch mode requires our key on all of \
               them (fence_scsi_check passes if it is on any one, fence-agents #278). Every node \
               must name the same LUs (compare `prfence doctor`'s LU set line, or the agents' \
               `lu_set`), since the arbiter is the lowest identifier among them.",
    },
    SectionDoc {
        section: "key",
        text: "Watch mode's own key, the one fence_pr's `on` (unfencing) registers for this node: \
               exactly one of `value` and `derive`. Required in watch mode, refused in lease mode \
               (which makes its keys from `lease.node_id` and an epoch).",
    },
    SectionDoc {
        section: "watch",
        text: "Watch mode judges nothing until one of this node's paths has been seen holding our \
               key on every LU (fence_pr's unfencing registers it when the cluster starts; our key \
               listed under another node's path does not count): before that a missing key is \
               `waiting_for_registration`, nothing is fenced and the watchdog is not opened.",
    },
    SectionDoc {
        section: "lease",
        text: "Lease mode, active/passive failover without a cluster manager: the holder keeps a \
               reservation and renews it by changing its key every `renew` (node id in the top \
               16 bits, an epoch in the low 48, REGISTER old -> new on every path). A standby \
               preempts exactly the holder's key once it has not changed for `lease` on the \
               standby's own clock; a holder that cannot renew self-fences before `lease - \
               margin` on its own. Required in lease mode, refused in watch mode.",
    },
    SectionDoc {
        section: "self_fence",
        text: "What happens once the agent decides this node is fenced, in this order: stop \
               feeding the watchdog, run `command`, reboot, exit. At least one must be on.",
    },
    SectionDoc {
        section: "watchdog",
        text: "A hardware watchdog, fed once per check while healthy. Optional in both modes. \
               Watch mode opens it once our key is on every LU (a failure shows degraded and is \
               retried); lease mode opens it at start and does not start if it cannot. The agent \
               does not program the device: its own timeout (module parameter, e.g. softdog \
               soft_margin=, iTCO_wdt heartbeat=) must equal `timeout`, which the agent checks in \
               /sys/class/watchdog at start.",
    },
    SectionDoc {
        section: "metrics",
        text: "Prometheus text at http://LISTEN/metrics and the agent's state as JSON at \
               /status. Leave the table out to serve nothing.",
    },
    SectionDoc {
        section: "log",
        text: "Where and how the agent logs. Lines are written by a thread of their own: a \
               stalled journal delays (and at worst drops) log lines, never a check.",
    },
    SectionDoc {
        section: "systemd",
        text: "sd_notify(3): READY=1 once started, WATCHDOG=1 once per check, STATUS= lines.",
    },
];

pub const SETTINGS: &[SettingDoc] = &[
    SettingDoc {
        section: "",
        name: "mode",
        value: "\"watch\" | \"lease\"",
        default: Default::Required,
        modes: Modes::Both,
        text: "\"watch\" replaces fence_scsi_check under a cluster manager (Pacemaker and \
               fence_pr): the node fences itself once its key is gone. \"lease\" is \
               active/passive failover without a cluster manager.",
    },
    SettingDoc {
        section: "",
        name: "check_interval",
        value: "duration, 100ms..1h",
        default: Default::Value("\"2s\""),
        modes: Modes::Both,
        text: "How often every LU is read (one READ KEYS per LU through a read-only open, no \
               udev event). A fence is noticed about check_interval x \
               watch.missing_confirmations after it landed.",
    },
    SettingDoc {
        section: "",
        name: "command_timeout",
        value: "duration, more than 0, at most 4294967294ms",
        default: Default::Value("\"2s\""),
        modes: Modes::Both,
        text: "The bound on one PR command (SG_IO carries it in 32 bits of milliseconds; NVMe \
               block ioctls are bounded by a thread the agent stops waiting for). A command \
               that takes longer counts as unreachable.",
    },
    SettingDoc {
        section: "",
        name: "unregister_on_exit",
        value: "bool",
        default: Default::Value("false"),
        modes: Modes::Both,
        text: "Remove our registrations when stopped by SIGTERM. Off: a restart must not look \
               like, or race with, being fenced; fence_pr's `on` owns registration.",
    },
    SettingDoc {
        section: "device",
        name: "path",
        value: "string, under /dev/",
        default: Default::Required,
        modes: Modes::Both,
        text: "The LU's device node, best by a stable name: /dev/mapper/NAME, \
               /dev/disk/by-id/..., /dev/nvmeXnY.",
    },
    SettingDoc {
        section: "device",
        name: "name",
        value: "string",
        default: Default::Otherwise("the path"),
        modes: Modes::Both,
        text: "A label for logs, metrics and the status.",
    },
    SettingDoc {
        section: "device",
        name: "coordinator",
        value: "bool",
        default: Default::Value("false"),
        modes: Modes::Watch,
        text: "One of the coordinators (3 or 5 devices, the set fence_pr's coordinators= names): \
               our key gone from one of them does not self-fence (a losing node's preempt), gone \
               from a majority does; an unreadable one never does. The watch arms with our key \
               on every data LU and a majority of the coordinators. See docs/concepts.md, \
               \"Coordinator LUs\".",
    },
    SettingDoc {
        section: "key",
        name: "value",
        value: "string, 1 to 16 hexadecimal digits, 0x optional, not 0",
        default: Default::Otherwise("none: give value or derive"),
        modes: Modes::Watch,
        text: "The key itself, e.g. \"0x8a3c5f0000000001\".",
    },
    SettingDoc {
        section: "key",
        name: "derive",
        value: "\"fence_scsi\" | \"native\"",
        default: Default::Otherwise("none: give value or derive"),
        modes: Modes::Watch,
        text: "Derive the key as fence_pr does, asking corosync: \"fence_scsi\" for a fence_pr \
               (or fence_scsi) resource with key_value=id (the default) or hash, \"native\" for \
               key_value=native (cluster tag and corosync nodeid).",
    },
    SettingDoc {
        section: "key",
        name: "key_value",
        value: "\"id\" | \"hash\"",
        default: Default::Value("\"id\""),
        modes: Modes::Watch,
        text: "With derive = \"fence_scsi\": the stonith resource's key_value.",
    },
    SettingDoc {
        section: "key",
        name: "node",
        value: "string, not empty",
        default: Default::Otherwise(
            "the node corosync runs as here (nodelist.local_node_pos), which must agree with the \
             host name",
        ),
        modes: Modes::Watch,
        text: "With derive: the corosync node name to derive the key for. Unset, a host name \
               that names another node than corosync's leaves the agent degraded, never armed, \
               until this is set.",
    },
    SettingDoc {
        section: "watch",
        name: "grace",
        value: "duration, at least check_interval, more than command_timeout",
        default: Default::Value("\"20s\""),
        modes: Modes::Watch,
        text: "An LU that cannot be read (unreachable, timed out) for this long, from its last \
               good read, counts as fenced: a node cut off from its storage must stop as surely \
               as a preempted one. A storage outage longer than this self-fences every node.",
    },
    SettingDoc {
        section: "watch",
        name: "missing_confirmations",
        value: "integer, 1..10",
        default: Default::Value("2"),
        modes: Modes::Watch,
        text: "Reads in a row that must miss our key before this node calls itself fenced. 1: \
               the first miss; 2 re-reads once, riding out a brief re-registration \
               (fence-agents #576).",
    },
    SettingDoc {
        section: "watch",
        name: "heal",
        value: "bool",
        default: Default::Value("true"),
        modes: Modes::Watch,
        text: "When a path lost its registration (an iSCSI re-login gets a new ISID): purge the \
               old session's orphaned registration where one atomic command can. The agent never \
               registers a path (no SPC command registers only while our key is still there, \
               P3): the LU shows degraded, naming the path, until `prfence unfence`.",
    },
    SettingDoc {
        section: "watch",
        name: "path_audit",
        value: "duration (at least check_interval) | \"off\"",
        default: Default::Value("\"off\""),
        modes: Modes::Watch,
        text: "Every path's registration is probed at start, when a path appears or logs in \
               again, when the number of our registrations changes, and every minute while a \
               path is found unregistered. A probe is a same-key REGISTER (a PERSISTENT RESERVE \
               OUT, which on LIO can cross another node's PREEMPT), so a healthy node sends \
               none; a duration adds a periodic probe.",
    },
    SettingDoc {
        section: "lease",
        name: "node_id",
        value: "integer, 1..65535",
        default: Default::Required,
        modes: Modes::Lease,
        text: "This node's id, the top 16 bits of its keys: different on every node sharing \
               the LUs.",
    },
    SettingDoc {
        section: "lease",
        name: "reservation",
        value: "\"write-exclusive\" | \"exclusive-access\"",
        default: Default::Value("\"write-exclusive\""),
        modes: Modes::Lease,
        text: "The holder's reservation type: standbys stay registered without write (or any) \
               access.",
    },
    SettingDoc {
        section: "lease",
        name: "renew",
        value: "duration, 100ms <= renew < lease / 2",
        default: Default::Value("\"3s\""),
        modes: Modes::Lease,
        text: "How often the holder renews (a new key on every path). command_timeout <= renew.",
    },
    SettingDoc {
        section: "lease",
        name: "lease",
        value: "duration, more than 0",
        default: Default::Value("\"15s\""),
        modes: Modes::Lease,
        text: "How long a standby waits, on its own clock, for the holder's key to change before \
               it takes over. check_interval <= lease / 2.",
    },
    SettingDoc {
        section: "lease",
        name: "margin",
        value: "duration, 0 < margin < lease - renew, at least 2 x clock_drift_ppm x lease",
        default: Default::Value("\"3s\""),
        modes: Modes::Lease,
        text: "The holder self-fences lease - margin after the send of its last good renew. The \
               margin covers clock rate differences, wake-up lateness and the stop hook \
               (self_fence.command_timeout < margin): choose seconds.",
    },
    SettingDoc {
        section: "lease",
        name: "clock_drift_ppm",
        value: "integer, at most 100000",
        default: Default::Value("1000"),
        modes: Modes::Lease,
        text: "The worst rate difference of two nodes' monotonic clocks (a crystal is within \
               100 ppm).",
    },
    SettingDoc {
        section: "lease",
        name: "state_file",
        value: "string, an absolute path",
        default: Default::Value("\"/var/lib/prfence/lease-epoch\""),
        modes: Modes::Lease,
        text: "The highest key epoch handed out, written durably before use so a key is never \
               reused (P3). Must survive reboots (the packaged unit's StateDirectory=).",
    },
    SettingDoc {
        section: "self_fence",
        name: "stop_watchdog",
        value: "bool",
        default: Default::Otherwise("true with a [watchdog], false without"),
        modes: Modes::Both,
        text: "Stop feeding the watchdog: the hardware resets the node watchdog.timeout later. \
               A failed reboot stops the feeding whatever this says.",
    },
    SettingDoc {
        section: "self_fence",
        name: "command",
        value: "array of strings, argv[0] an absolute path",
        default: Default::Otherwise("none"),
        modes: Modes::Both,
        text: "The stop hook, e.g. [\"/usr/local/sbin/stop-my-app\", \"--now\"]: run without a \
               shell, as the agent's user (root), on a thread of its own; killed with its whole \
               process group after command_timeout. argv[0] must be an executable file \
               (checked by --check-config and at start).",
    },
    SettingDoc {
        section: "self_fence",
        name: "command_timeout",
        value: "duration, more than 0",
        default: Default::Value("\"2s\""),
        modes: Modes::Both,
        text: "The hook is killed after this.",
    },
    SettingDoc {
        section: "self_fence",
        name: "reboot",
        value: "bool",
        default: Default::Value("false"),
        modes: Modes::Both,
        text: "reboot(2) at once, WITHOUT sync (dirty pages must not reach the LU); needs \
               CAP_SYS_BOOT.",
    },
    SettingDoc {
        section: "self_fence",
        name: "exit",
        value: "bool",
        default: Default::Value("true"),
        modes: Modes::Both,
        text: "Exit with exit_status after the steps above.",
    },
    SettingDoc {
        section: "self_fence",
        name: "exit_status",
        value: "integer, 3..199 or 243..255",
        default: Default::Value("86"),
        modes: Modes::Both,
        text: "The status a fenced agent exits with; the packaged unit lists 86 in \
               RestartPreventExitStatus=, so a fenced node stays down until an admin looks.",
    },
    SettingDoc {
        section: "watchdog",
        name: "device",
        value: "string, /dev/watchdog or /dev/watchdogN",
        default: Default::Required,
        modes: Modes::Both,
        text: "Must resolve to a watchdog (misc 10:130, or listed in /sys/class/watchdog); the \
               device checked at start is the one opened later.",
    },
    SettingDoc {
        section: "watchdog",
        name: "timeout",
        value: "duration, whole seconds, at least 1s",
        default: Default::Required,
        modes: Modes::Both,
        text: "Must equal the device's own timeout, and exceed check_interval + a check's budget \
               (3 x (command_timeout + 200ms)).",
    },
    SettingDoc {
        section: "watchdog",
        name: "magic_close",
        value: "bool",
        default: Default::Value("true"),
        modes: Modes::Both,
        text: "Disarm the watchdog when the agent is stopped cleanly (SIGTERM): `systemctl \
               stop`/`restart` and an orderly reboot reset nothing. A crash, SIGKILL or a hang \
               leaves it armed, and so does being fenced. Off: every stop resets the node \
               timeout later, package removal and reboots included.",
    },
    SettingDoc {
        section: "metrics",
        name: "listen",
        value: "string, address:port",
        default: Default::Value("\"127.0.0.1:9464\""),
        modes: Modes::Both,
        text: "Where /metrics and /status are served (loopback by default).",
    },
    SettingDoc {
        section: "log",
        name: "target",
        value: "\"journald\" | \"stderr\"",
        default: Default::Value("\"journald\""),
        modes: Modes::Both,
        text: "journald: no time stamp (the journal adds one) and a <N> priority prefix; \
               stderr: time-stamped lines for a terminal.",
    },
    SettingDoc {
        section: "log",
        name: "format",
        value: "\"text\" | \"json\"",
        default: Default::Value("\"text\""),
        modes: Modes::Both,
        text: "json: one JSON object per line.",
    },
    SettingDoc {
        section: "log",
        name: "level",
        value: "string, a tracing filter, not empty",
        default: Default::Value("\"info\""),
        modes: Modes::Both,
        text: "A level (error, warn, info, debug, trace) or directives such as \
               \"info,prfence=debug\". PRFENCE_LOG, set and not empty, replaces it.",
    },
    SettingDoc {
        section: "systemd",
        name: "notify",
        value: "bool",
        default: Default::Otherwise(
            "on when NOTIFY_SOCKET is set (started by a Type=notify unit, as the packaged one), \
             off elsewhere",
        ),
        modes: Modes::Both,
        text: "Send sd_notify messages. With the packaged unit (Type=notify, WatchdogSec=30s) \
               leave it unset: off, systemd would kill the agent for never saying READY=1.",
    },
];

/// A complete watch-mode configuration, as the page's EXAMPLES show it (a test parses it).
pub const WATCH_EXAMPLE: &str = r#"mode = "watch"

[[device]]
path = "/dev/mapper/mpatha"
name = "data"

[[device]]
path = "/dev/mapper/mpathb"
name = "logs"

[key]
derive = "fence_scsi"

[self_fence]
command = ["/usr/local/sbin/stop-my-app"]

[watchdog]
device = "/dev/watchdog0"
timeout = "10s"

[metrics]
"#;

/// A complete lease-mode configuration, as the page's EXAMPLES show it (a test parses it).
pub const LEASE_EXAMPLE: &str = r#"mode = "lease"
check_interval = "1s"

[[device]]
path = "/dev/mapper/mpatha"

[lease]
node_id = 1

[self_fence]
command = ["/usr/local/sbin/stop-my-app"]
reboot = true

[watchdog]
device = "/dev/watchdog0"
timeout = "6s"
"#;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::{ConfigError, Settings};
    use super::*;

    /// A valid configuration of `mode` with `extra` lines added to table `section` ("" for the
    /// top level), every table written once.
    fn config(mode: Modes, section: &str, extra: &str) -> String {
        let mut tables: Vec<(&str, String)> = vec![
            ("", String::new()),
            ("[[device]]", "path = \"/dev/sdb\"\n".to_owned()),
        ];
        match mode {
            Modes::Lease => tables.push(("[lease]", "node_id = 1\n".to_owned())),
            _ => tables.push(("[key]", "value = \"0xabc\"\n".to_owned())),
        }
        let header = match section {
            "" => "",
            "device" => "[[device]]",
            "key" => "[key]",
            "watch" => "[watch]",
            "lease" => "[lease]",
            "self_fence" => "[self_fence]",
            "watchdog" => "[watchdog]",
            "metrics" => "[metrics]",
            "log" => "[log]",
            "systemd" => "[systemd]",
            other => panic!("unknown section {other}"),
        };
        if !tables.iter().any(|(h, _)| *h == header) {
            let required = match section {
                "watchdog" => "device = \"/dev/watchdog0\"\ntimeout = \"10s\"\n",
                _ => "",
            };
            tables.push((header, required.to_owned()));
        }
        if section == "key" && !extra.starts_with("value") {
            // key_value and node need derive, which excludes value.
            for (h, body) in &mut tables {
                if *h == "[key]" {
                    *body = "derive = \"fence_scsi\"\n".to_owned();
                }
            }
        }
        let mut text = format!(
            "mode = \"{}\"\n",
            if mode == Modes::Lease {
                "lease"
            } else {
                "watch"
            }
        );
        for (h, body) in tables {
            if !h.is_empty() {
                text.push_str(h);
                text.push('\n');
            }
            text.push_str(&body);
            if h == header {
                text.push_str(extra);
                text.push('\n');
            }
        }
        text
    }

    fn mode_of(setting: &SettingDoc) -> Modes {
        match setting.modes {
            Modes::Lease => Modes::Lease,
            _ => Modes::Watch,
        }
    }

    /// The fields serde accepts in `section`, from its own error for an unknown one.
    fn accepted(section: &str) -> BTreeSet<String> {
        let mode = if section == "lease" {
            Modes::Lease
        } else {
            Modes::Watch
        };
        let e = Settings::from_toml_str(&config(mode, section, "zzz_unknown = 1")).unwrap_err();
        let ConfigError::Syntax(text) = &e else {
            panic!("{section}: {e}");
        };
        let list = text
            .split_once("expected ")
            .map(|(_, rest)| rest)
            .unwrap_or_else(|| panic!("{section}: {text}"));
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_field_the_parser_accepts_is_documented_and_nothing_else() {
        for section in SECTIONS {
            let mut serde_fields = accepted(section.section);
            if section.section.is_empty() {
                // The tables themselves are top-level fields.
                for table in SECTIONS.iter().filter(|s| !s.section.is_empty()) {
                    assert!(serde_fields.remove(table.section), "{}", table.section);
                }
            }
            let documented: BTreeSet<String> = SETTINGS
                .iter()
                .filter(|s| s.section == section.section)
                .map(|s| s.name.to_owned())
                .collect();
            assert_eq!(
                serde_fields, documented,
                "[{}]: the parser's fields vs the reference",
                section.section
            );
        }
        for setting in SETTINGS {
            assert!(
                SECTIONS.iter().any(|s| s.section == setting.section),
                "{} is in no section",
                setting.name
            );
        }
    }

    /// Leaving a setting out and writing its documented default parse the same.
    #[test]
    fn every_documented_default_is_what_the_parser_applies() {
        let mut checked = 0;
        for setting in SETTINGS {
            let Default::Value(value) = setting.default else {
                continue;
            };
            let mode = mode_of(setting);
            let without = Settings::from_toml_str(&config(mode, setting.section, ""))
                .unwrap_or_else(|e| panic!("{}: {e}", setting.name));
            let written = format!("{} = {value}", setting.name);
            let with = Settings::from_toml_str(&config(mode, setting.section, &written))
                .unwrap_or_else(|e| panic!("{written}: {e}"));
            assert_eq!(without, with, "[{}] {written}", setting.section);
            checked += 1;
        }
        assert!(checked >= 20, "{checked}");
    }

    /// The defaults that depend on something else, as the text says.
    #[test]
    fn the_conditional_defaults_are_as_documented() {
        let parse = |text: &str| Settings::from_toml_str(text).unwrap();
        let bare = parse(&config(Modes::Watch, "", ""));
        let with_watchdog = parse(&config(Modes::Watch, "watchdog", ""));
        assert!(!bare.self_fence.stop_watchdog);
        assert!(with_watchdog.self_fence.stop_watchdog);
        assert_eq!(bare.self_fence.command, None);
        assert_eq!(bare.metrics_listen, None, "no [metrics]: nothing served");
        let named = parse(&config(Modes::Watch, "", ""));
        assert_eq!(
            named.devices[0].name, "/dev/sdb",
            "name defaults to the path"
        );
    }

    #[test]
    fn the_examples_parse() {
        for example in [WATCH_EXAMPLE, LEASE_EXAMPLE] {
            if let Err(e) = Settings::from_toml_str(example) {
                panic!("{e}\n{example}");
            }
        }
    }
}
