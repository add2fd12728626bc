//! The two input forms of the Fence Agent API: `name=value` lines on stdin and the getopt
//! command line, both over the option table (`table`), so a fence_scsi configuration works
//! unchanged.

use std::collections::BTreeMap;

use super::FencePrError;
use super::table::{OPTIONS, OptSpec};

/// Where the options came from; the API says any argv means command-line mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputMode {
    Stdin,
    CommandLine,
}

/// Options as entered, before typing: option key → raw value (`None` for a set flag on the
/// command line). Later entries overwrite earlier ones (last value wins).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct RawOptions {
    pub values: BTreeMap<&'static str, RawValue>,
    /// Number of `-v` on the command line (fence-agents' default for verbose_level).
    pub verbose_count: u32,
    /// Notes for the debug log: unknown stdin names, unused arguments.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawValue {
    Text(String),
    Flag(bool),
}

fn by_long(long: &str) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|o| o.long == long)
}

fn by_key(key: &str) -> Option<&'static OptSpec> {
    OPTIONS.iter().find(|o| o.key == key)
}

/// Resolves a stdin name the way fence-agents does: a long name with `-`/`_` swapped either way,
/// else the option key itself. `option` is the API's deprecated alias of `action` (fence-agents
/// dropped it in 2012, commit 1eda61c3; the API document still lists it).
fn resolve_stdin_name(name: &str) -> Option<&'static OptSpec> {
    if name == "option" {
        return by_key("action");
    }
    by_long(&name.replace('-', "_"))
        .or_else(|| by_long(&name.replace('_', "-")))
        .or_else(|| by_key(name))
}

/// Parses stdin `name=value` lines: lines are trimmed, `#` lines and blank lines skipped, the
/// name ends at the first `=` (no spaces allowed around it), one pair of surrounding double
/// quotes is removed from the value, unknown names are ignored with a note, flags take
/// 1/yes/on/true or 0/no/off/false (anything else is ignored with a note).
///
/// Deliberate difference: fence_scsi treats a flag set to `0` as *set* (it tests presence), so
/// `aptpl=0` enables APTPL there; here `0` means off.
pub(crate) fn parse_stdin(text: &str) -> RawOptions {
    let mut raw = RawOptions::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.split_once('=').unwrap_or((line, ""));
        let value = strip_quotes(value);
        let Some(spec) = resolve_stdin_name(name) else {
            raw.notes
                .push(format!("Parse error: Ignoring unknown option '{line}'"));
            continue;
        };
        if spec.takes_value {
            raw.values
                .insert(spec.key, RawValue::Text(value.to_owned()));
        } else if let Some(on) = parse_bool(value) {
            raw.values.insert(spec.key, RawValue::Flag(on));
        } else {
            raw.notes.push(format!(
                "Parse error: Ignoring option '{name}' because it does not have value"
            ));
        }
    }
    raw
}

fn strip_quotes(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

/// fence-agents' truth values (case-insensitive).
pub(crate) fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "yes" | "on" | "true" => Some(true),
        "0" | "no" | "off" | "false" => Some(false),
        _ => None,
    }
}

fn parse_error(msg: String) -> FencePrError {
    FencePrError::Parse(msg)
}

/// Parses the command line like Python's `getopt.gnu_getopt` with fence_scsi's option set:
/// options and operands may be mixed, `--` ends options, short flags cluster (`-vvv`, `-ao on`),
/// a short option's value may be attached (`-ooff`) or the next word, a long option's value
/// follows `=` or is the next word, and a long name may be abbreviated to a unique prefix.
/// Error messages are Python getopt's, so logs read the same as fence_scsi's.
pub(crate) fn parse_command_line<S: AsRef<str>>(args: &[S]) -> Result<RawOptions, FencePrError> {
    let mut raw = RawOptions::default();
    let mut operands = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_ref();
        i += 1;
        if arg == "--" {
            operands.extend(args[i..].iter().map(|a| a.as_ref().to_owned()));
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, attached) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            let spec = match_long(name)?;
            let value = if spec.takes_value {
                match attached {
                    Some(v) => RawValue::Text(v.to_owned()),
                    None => {
                        let Some(next) = args.get(i) else {
                            return Err(parse_error(format!(
                                "option --{} requires argument",
                                spec.long
                            )));
                        };
                        i += 1;
                        RawValue::Text(next.as_ref().to_owned())
                    }
                }
            } else {
                if attached.is_some() {
                    return Err(parse_error(format!(
                        "option --{} must not have an argument",
                        spec.long
                    )));
                }
                RawValue::Flag(true)
            };
            record(&mut raw, spec, value);
        } else if arg.len() > 1 && arg.starts_with('-') {
            let letters: Vec<char> = arg[1..].chars().collect();
            let mut j = 0;
            while j < letters.len() {
                let letter = letters[j];
                j += 1;
                let Some(spec) = OPTIONS.iter().find(|o| o.short == Some(letter)) else {
                    return Err(parse_error(format!("option -{letter} not recognized")));
                };
                if spec.takes_value {
                    let rest: String = letters[j..].iter().collect();
                    let value = if !rest.is_empty() {
                        rest
                    } else if let Some(next) = args.get(i) {
                        i += 1;
                        next.as_ref().to_owned()
                    } else {
                        return Err(parse_error(format!("option -{letter} requires argument")));
                    };
                    record(&mut raw, spec, RawValue::Text(value));
                    break;
                }
                record(&mut raw, spec, RawValue::Flag(true));
            }
        } else {
            operands.push(arg.to_owned());
        }
    }
    if !operands.is_empty() {
        raw.notes
            .push(format!("Unused arguments on command line: {operands:?}"));
    }
    Ok(raw)
}

fn record(raw: &mut RawOptions, spec: &'static OptSpec, value: RawValue) {
    if spec.key == "verbose" {
        raw.verbose_count += 1;
    }
    raw.values.insert(spec.key, value);
}

/// Exact long name first, then a unique prefix (Python getopt's rule).
fn match_long(name: &str) -> Result<&'static OptSpec, FencePrError> {
    if let Some(spec) = by_long(name) {
        return Ok(spec);
    }
    let mut candidates = OPTIONS.iter().filter(|o| o.long.starts_with(name));
    match (candidates.next(), candidates.next()) {
        (Some(spec), None) if !name.is_empty() => Ok(spec),
        (Some(_), Some(_)) => Err(parse_error(format!("option --{name} not a unique prefix"))),
        _ => Err(parse_error(format!("option --{name} not recognized"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(raw: &RawOptions, key: &str) -> Option<String> {
        match raw.values.get(key) {
            Some(RawValue::Text(t)) => Some(t.clone()),
            _ => None,
        }
    }

    #[test]
    fn short_letters_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for o in OPTIONS {
            if let Some(c) = o.short {
                assert!(seen.insert(c), "duplicate -{c}");
            }
        }
    }

    #[test]
    fn stdin_basic_comments_blank_and_last_wins() {
        let raw = parse_stdin(
            "# comment\n\n  action=on  \nport=n1\nport=n2\ndevices=/dev/sda,/dev/sdb\n",
        );
        assert_eq!(text(&raw, "action").as_deref(), Some("on"));
        assert_eq!(text(&raw, "port").as_deref(), Some("n2"));
        assert_eq!(text(&raw, "devices").as_deref(), Some("/dev/sda,/dev/sdb"));
        assert!(raw.notes.is_empty());
    }

    #[test]
    fn stdin_name_variants_resolve_like_fence_agents() {
        let raw = parse_stdin(
            "plug=a\nsuppress_errors=1\ndebug_file=/tmp/d\ncorosync-cmap-path=/x\nsg_persist_path=/y\nmpath_register_method=single\nverbose-level=3\n",
        );
        assert_eq!(text(&raw, "port").as_deref(), Some("a"));
        assert_eq!(
            raw.values.get("suppress-errors"),
            Some(&RawValue::Flag(true))
        );
        assert_eq!(text(&raw, "debug").as_deref(), Some("/tmp/d"));
        assert_eq!(text(&raw, "corosync_cmap_path").as_deref(), Some("/x"));
        assert_eq!(text(&raw, "sg_persist_path").as_deref(), Some("/y"));
        assert_eq!(
            text(&raw, "mpath_register_method").as_deref(),
            Some("single")
        );
        assert_eq!(text(&raw, "verbose_level").as_deref(), Some("3"));
        // Legacy dash form of suppress-errors is the key itself.
        let raw = parse_stdin("suppress-errors=yes\n");
        assert_eq!(
            raw.values.get("suppress-errors"),
            Some(&RawValue::Flag(true))
        );
    }

    #[test]
    fn stdin_option_is_the_deprecated_action_alias() {
        let raw = parse_stdin("option=off\n");
        assert_eq!(text(&raw, "action").as_deref(), Some("off"));
        let raw = parse_stdin("option=off\naction=on\n");
        assert_eq!(text(&raw, "action").as_deref(), Some("on"));
    }

    #[test]
    fn stdin_unknown_and_spaced_names_are_ignored_with_a_note() {
        let raw = parse_stdin("foo=bar\naction =on\npcmk_host_list=a b\n");
        assert!(raw.values.is_empty());
        assert_eq!(raw.notes.len(), 3);
        assert!(raw.notes[0].contains("'foo=bar'"));
    }

    #[test]
    fn stdin_values_keep_equals_and_lose_one_pair_of_quotes() {
        let raw = parse_stdin("key=\"ab=cd\"\nport=\"x\nlogfile=\n");
        assert_eq!(text(&raw, "key").as_deref(), Some("ab=cd"));
        assert_eq!(text(&raw, "port").as_deref(), Some("\"x"));
        assert_eq!(text(&raw, "logfile").as_deref(), Some(""));
    }

    #[test]
    fn stdin_flags_take_truth_values() {
        let raw = parse_stdin("aptpl=TRUE\nreadonly=off\nquiet=maybe\nverbose\n");
        assert_eq!(raw.values.get("aptpl"), Some(&RawValue::Flag(true)));
        assert_eq!(raw.values.get("readonly"), Some(&RawValue::Flag(false)));
        assert!(!raw.values.contains_key("quiet"));
        // A bare name has an empty value, which is no truth value.
        assert!(!raw.values.contains_key("verbose"));
        assert_eq!(raw.notes.len(), 2);
    }

    #[test]
    fn stdin_handles_crlf() {
        let raw = parse_stdin("action=on\r\nport=n1\r\n");
        assert_eq!(text(&raw, "action").as_deref(), Some("on"));
        assert_eq!(text(&raw, "port").as_deref(), Some("n1"));
    }

    #[test]
    fn argv_short_long_attached_and_separate() {
        let raw = parse_command_line(&[
            "-o",
            "off",
            "-nnode1",
            "--devices=/dev/a",
            "--key",
            "abc",
            "-vvv",
            "-aq",
            "-H",
            "5",
        ])
        .unwrap();
        assert_eq!(text(&raw, "action").as_deref(), Some("off"));
        assert_eq!(text(&raw, "port").as_deref(), Some("node1"));
        assert_eq!(text(&raw, "devices").as_deref(), Some("/dev/a"));
        assert_eq!(text(&raw, "key").as_deref(), Some("abc"));
        assert_eq!(text(&raw, "delay").as_deref(), Some("5"));
        assert_eq!(raw.verbose_count, 3);
        assert_eq!(raw.values.get("aptpl"), Some(&RawValue::Flag(true)));
        assert_eq!(raw.values.get("quiet"), Some(&RawValue::Flag(true)));
    }

    #[test]
    fn argv_flag_cluster_ending_in_value_option() {
        let raw = parse_command_line(&["-vo", "status"]).unwrap();
        assert_eq!(text(&raw, "action").as_deref(), Some("status"));
        assert_eq!(raw.verbose_count, 1);
    }

    #[test]
    fn argv_unique_prefix_and_errors_match_python_getopt() {
        let raw = parse_command_line(&["--dev=/dev/x", "--nodename", "n1"]).unwrap();
        assert_eq!(text(&raw, "devices").as_deref(), Some("/dev/x"));
        assert_eq!(text(&raw, "nodename").as_deref(), Some("n1"));
        // FencePrError adds "; see --help" after Python's text.
        let msg = |a: &[&str]| {
            let text = parse_command_line(a).unwrap_err().to_string();
            text.strip_suffix("; see --help").unwrap().to_owned()
        };
        assert_eq!(
            msg(&["--de=x"]),
            "Parse error: option --de not a unique prefix"
        );
        assert_eq!(msg(&["-f", "x"]), "Parse error: option -f not recognized");
        assert_eq!(
            msg(&["--aptpl=1"]),
            "Parse error: option --aptpl must not have an argument"
        );
        assert_eq!(
            msg(&["--bogus"]),
            "Parse error: option --bogus not recognized"
        );
        assert_eq!(msg(&["-o"]), "Parse error: option -o requires argument");
        assert_eq!(
            msg(&["--key"]),
            "Parse error: option --key requires argument"
        );
    }

    #[test]
    fn argv_operands_are_noted_and_double_dash_ends_options() {
        let raw = parse_command_line(&["extra", "-o", "on", "--", "-n", "x"]).unwrap();
        assert_eq!(text(&raw, "action").as_deref(), Some("on"));
        assert!(!raw.values.contains_key("port"));
        assert_eq!(raw.notes.len(), 1);
        assert!(raw.notes[0].contains("extra") && raw.notes[0].contains("-n"));
    }

    #[test]
    fn argv_last_value_wins() {
        let raw = parse_command_line(&["-k", "1", "--key=2"]).unwrap();
        assert_eq!(text(&raw, "key").as_deref(), Some("2"));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn stdin_parser_never_panics(text in "\\PC*") {
            let _ = parse_stdin(&text);
        }

        #[test]
        fn argv_parser_never_panics(args in proptest::collection::vec("-{0,2}[a-zA-Z=_-]{0,12}", 0..6)) {
            let _ = parse_command_line(&args);
        }

        #[test]
        fn last_stdin_value_wins(values in proptest::collection::vec("[a-z0-9/._-]{1,10}", 1..5)) {
            let text: String = values.iter().map(|v| format!("port={v}\n")).collect();
            let raw = parse_stdin(&text);
            prop_assert_eq!(raw.values.get("port"), Some(&RawValue::Text(values.last().unwrap().clone())));
        }
    }
}
