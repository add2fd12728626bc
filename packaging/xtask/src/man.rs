//! Man pages, each generated from the thing it documents:
//! - `prfence(8)` and `prfence-<command>(8)` from the CLI definition (clap_mangen);
//! - `fence_pr(8)` from the agent's own metadata XML, as fence-agents makes its pages;
//! - `prfence-agent.toml(5)` from the parser's own reference table
//!   (`prfence::daemon::config::reference`, tested against the parser) and the agent's timing
//!   rules (`prfence::daemon::config::timing`, which the agent checks).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::CommandFactory;
use clap_mangen::Man;
use prfence::cli::Cli;
use prfence::fence_agent::metadata::metadata_xml;

use crate::roff::{escape, header, inline};

pub fn pages() -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut pages = prfence_pages()?;
    pages.push((PathBuf::from("man/fence_pr.8"), fence_pr()?.into_bytes()));
    pages.push((
        PathBuf::from("man/prfence-agent.toml.5"),
        agent_toml()?.into_bytes(),
    ));
    Ok(pages)
}

/// A clap page: clap_mangen's sections, the after-help text split into its own sections (an
/// "Exit status:" paragraph becomes EXIT STATUS, "Signals:" SIGNALS), then `extra` sections.
fn render(cmd: &clap::Command, extra: &[(&str, String)]) -> anyhow::Result<Vec<u8>> {
    let man = Man::new(cmd.clone()).section("8").date("");
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut buf)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut buf)?;
    }
    let mut page = String::from_utf8(buf)?;
    if let Some(after) = cmd.get_after_help() {
        for paragraph in after.to_string().split("\n\n") {
            let (title, body) = match paragraph.split_once('\n') {
                Some(("Exit status:", rest)) => ("EXIT STATUS", rest.to_owned()),
                _ if paragraph.starts_with("Signals:") => (
                    "SIGNALS",
                    paragraph.trim_start_matches("Signals:").trim().to_owned(),
                ),
                _ => ("NOTES", paragraph.to_owned()),
            };
            let _ = writeln!(page, ".SH {title}");
            if title == "EXIT STATUS" {
                // "  N  text" lines, text continued on lines indented further.
                for line in body.lines() {
                    let trimmed = line.trim_start();
                    let (code, text) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
                    if line.len() - trimmed.len() <= 2 && code.chars().all(|c| c.is_ascii_digit()) {
                        let _ = writeln!(page, ".TP\n.B {code}\n{}", escape(text.trim()));
                    } else {
                        let _ = writeln!(page, "{}", escape(trimmed));
                    }
                }
            } else {
                let _ = writeln!(
                    page,
                    "{}",
                    escape(&body.split_whitespace().collect::<Vec<_>>().join(" "))
                );
            }
        }
    }
    for (title, body) in extra {
        let _ = writeln!(page, ".SH {title}\n{body}");
    }
    Ok(page.into_bytes())
}

/// The commands the EXAMPLES of prfence(8) show (each parsed by the CLI in a test).
const PRFENCE_EXAMPLES: &[(&str, &str)] = &[
    (
        "What is registered and who holds the reservation:",
        "prfence status --key 0x8a3c5f0000000001 /dev/mapper/mpatha /dev/mapper/mpathb",
    ),
    (
        "Is this node ready to fence (its key on every path, the LU set)?",
        "prfence doctor --key 0x8a3c5f0000000001 /dev/mapper/mpatha /dev/mapper/mpathb",
    ),
    (
        "Unfence this node (register its key on every path):",
        "prfence unfence --key 0x8a3c5f0000000001 /dev/mapper/mpatha /dev/mapper/mpathb",
    ),
    (
        "Fence another node by its key, as JSON:",
        "prfence fence --key 0x8a3c5f0000000001 --victim 0x8a3c5f0000000002 --json /dev/mapper/mpatha /dev/mapper/mpathb",
    ),
    ("The keys on one LU:", "prfence keys /dev/mapper/mpatha"),
];

fn examples(list: &[(&str, &str)]) -> String {
    let mut body = String::new();
    for (what, command) in list {
        let _ = writeln!(
            body,
            ".PP\n{}\n.PP\n.RS\n.nf\n{}\n.fi\n.RE",
            escape(what),
            escape(command)
        );
    }
    body
}

const LOG_ENVIRONMENT: &str = ".TP\n.B PRFENCE_LOG\nA tracing filter (a level such as \\fBdebug\\fR, or directives \
such as \\fBinfo,prfence=trace\\fR) replacing the default log level; an invalid one is said on \
stderr.";

fn prfence_pages() -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    // No `help` subcommand on the pages: it has no page of its own (`--help` is on each).
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let see_also = "\\fBprfence\\-agent\\fR(8), \\fBprfence\\-agent.toml\\fR(5), \\fBfence_pr\\fR(8), \
                    \\fBsg_persist\\fR(8), \\fBmpathpersist\\fR(8)";
    let mut pages = vec![(
        PathBuf::from("man/prfence.8"),
        render(
            &cmd,
            &[
                ("ENVIRONMENT", LOG_ENVIRONMENT.to_owned()),
                ("EXAMPLES", examples(PRFENCE_EXAMPLES)),
                ("SEE ALSO", see_also.to_owned()),
            ],
        )?,
    )];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        // clap names are &'static str without its `string` feature, which would also change the
        // prfence binary's clap when the workspace is built together; a build tool may leak.
        let name: &'static str = Box::leak(format!("prfence-{}", sub.get_name()).into_boxed_str());
        let page = sub
            .clone()
            .name(name)
            .bin_name(format!("prfence {}", sub.get_name()));
        let extra: Vec<(&str, String)> = if sub.get_name() == "agent" {
            agent_sections()
        } else {
            vec![("SEE ALSO", "\\fBprfence\\fR(8)".to_owned())]
        };
        pages.push((
            PathBuf::from(format!("man/{name}.8")),
            render(&page, &extra)?,
        ));
    }
    Ok(pages)
}

/// FILES, ENVIRONMENT, EXAMPLES and SEE ALSO of prfence-agent(8).
fn agent_sections() -> Vec<(&'static str, String)> {
    vec![
        (
            "FILES",
            ".TP\n.B /etc/prfence/agent.toml\nThe configuration, \\fBprfence\\-agent.toml\\fR(5); \
             root's, not writable by group or others.\n\
             .TP\n.B /run/prfence/status.json\nThe status the packaged unit has the agent write \
             (\\fB\\-\\-status\\-file\\fR), replaced after every check.\n\
             .TP\n.B /var/lib/prfence/lease\\-epoch\nLease mode's highest key epoch \
             (\\fBlease.state_file\\fR).\n\
             .TP\n.B /usr/lib/systemd/system/prfence\\-agent.service\nThe .rpm's unit \
             (the .deb installs it in /lib/systemd/system).\n\
             .TP\n.B /usr/share/doc/prfence/examples/agent.toml\nA commented example configuration."
                .to_owned(),
        ),
        (
            "ENVIRONMENT",
            format!(
                "{LOG_ENVIRONMENT} It is checked with the configuration (\\fB\\-\\-check\\-config\\fR \
                 refuses an invalid one).\n\
                 .TP\n.B NOTIFY_SOCKET\nSet by systemd for a Type=notify unit: with \
                 \\fB[systemd] notify\\fR unset, sd_notify is on when it is set.\n\
                 .TP\n.B WATCHDOG_USEC\\fR, \\fBWATCHDOG_PID\nThe unit's WatchdogSec= as systemd \
                 passes it; the timing rules check a check's budget against it."
            ),
        ),
        (
            "EXAMPLES",
            examples(&[
                (
                    "Check a configuration as a start would (the unit's ExecStartPre=):",
                    "prfence agent --config /etc/prfence/agent.toml --check-config",
                ),
                (
                    "Look at every LU once, read-only, and print the status (exit 0: healthy):",
                    "prfence agent --config /etc/prfence/agent.toml --once",
                ),
                (
                    "What the running agent sees:",
                    "curl -s http://127.0.0.1:9464/status",
                ),
            ]),
        ),
        (
            "SEE ALSO",
            "\\fBprfence\\-agent.toml\\fR(5), \\fBprfence\\fR(8), \\fBfence_pr\\fR(8), \
             \\fBsystemd.service\\fR(5), \\fBsd_notify\\fR(3)"
                .to_owned(),
        ),
    ]
}

/// What each action does, for the ACTIONS section (the metadata names them only).
fn action_text(name: &str) -> &'static str {
    match name {
        "on" => {
            "Unfence this node: register its key on every device (every path) and, if no node \
             holds one, take the reservation. Pacemaker runs it on the node itself \
             (on_target) and automatically when the node joins (automatic)."
        }
        "off" => {
            "Fence the node named by plug (or key): remove its key from every device with \
             PREEMPT AND ABORT, arbiter device first, and verify that it is gone."
        }
        "status" => "Exit 0 (ON) if the node's key is on any device, 2 (OFF) otherwise.",
        "monitor" => {
            "Probe every device: reachable, persistent reservations supported, this node's key \
             registered. A dead path is reported, not failed."
        }
        "list" | "list-status" => "Print the nodes of the corosync nodelist.",
        "metadata" => "Print the agent's metadata (XML) for Pacemaker.",
        "validate-all" => "Check the parameters and exit.",
        _ => "",
    }
}

fn fence_pr() -> anyhow::Result<String> {
    let xml = metadata_xml("fence_pr");
    let doc = roxmltree::Document::parse(&xml).context("parsing fence_pr's metadata")?;
    let agent = doc.root_element();
    let text = |node: roxmltree::Node<'_, '_>, tag: &str| -> String {
        node.children()
            .find(|c| c.has_tag_name(tag))
            .and_then(|c| c.text())
            .unwrap_or_default()
            .to_owned()
    };
    let mut page = header("fence_pr", "8", "System Manager's Manual");
    let _ = writeln!(page, ".SH NAME");
    let _ = writeln!(
        page,
        "fence_pr \\- {}",
        escape(agent.attribute("shortdesc").unwrap_or_default())
    );
    let _ = writeln!(page, ".SH SYNOPSIS");
    let _ = writeln!(page, ".B fence_pr\n[\\fIOPTIONS\\fR]");
    let _ = writeln!(page, ".br\n.B fence_pr\n< \\fIname\\fR=\\fIvalue\\fR lines");
    let _ = writeln!(page, ".SH DESCRIPTION");
    let _ = writeln!(page, "{}", escape(&text(agent, "longdesc")));
    let _ = writeln!(
        page,
        ".PP\nfence_pr is the \\fBprfence\\fR(8) binary invoked through a link of this name. \
         Parameters come as command-line options or, from Pacemaker, as \\fIname\\fR=\\fIvalue\\fR \
         lines on standard input (the stdin name is the parameter's name below)."
    );
    let _ = writeln!(page, ".SH PARAMETERS");
    let params = agent
        .children()
        .find(|c| c.has_tag_name("parameters"))
        .context("metadata without <parameters>")?;
    for p in params.children().filter(|c| c.has_tag_name("parameter")) {
        let name = p.attribute("name").unwrap_or_default();
        let getopt = p
            .children()
            .find(|c| c.has_tag_name("getopt"))
            .and_then(|g| g.attribute("mixed"))
            .unwrap_or_default();
        let content = p.children().find(|c| c.has_tag_name("content"));
        let mut notes = Vec::new();
        if let Some(kind) = content.and_then(|c| c.attribute("type")) {
            notes.push(format!("type {kind}"));
        }
        if let Some(default) = content.and_then(|c| c.attribute("default")) {
            notes.push(format!("default {default}"));
        }
        if p.attribute("required") == Some("1") {
            notes.push("required".to_owned());
        }
        if p.attribute("deprecated") == Some("1") {
            notes.push("deprecated alias".to_owned());
        }
        if let Some(old) = p.attribute("obsoletes") {
            notes.push(format!("replaces {old}"));
        }
        let _ = writeln!(page, ".TP\n.B {}", escape(getopt));
        let _ = writeln!(
            page,
            "{} (stdin: \\fB{}\\fR; {})",
            escape(&text(p, "shortdesc")),
            escape(name),
            escape(&notes.join(", "))
        );
    }
    let _ = writeln!(page, ".SH ACTIONS");
    let actions = agent
        .children()
        .find(|c| c.has_tag_name("actions"))
        .context("metadata without <actions>")?;
    for a in actions.children().filter(|c| c.has_tag_name("action")) {
        let name = a.attribute("name").unwrap_or_default();
        let _ = writeln!(
            page,
            ".TP\n.B {}\n{}",
            escape(name),
            escape(action_text(name))
        );
    }
    let _ = writeln!(page, ".SH UNFENCING");
    let _ = writeln!(
        page,
        "A node fenced by this agent is cut off from the storage, not powered off, so it must be \
         unfenced (its key registered again) before it uses the devices: configure the stonith \
         resource with \\fBmeta provides=unfencing\\fR, and resources that use the devices with \
         \\fBrequires=unfencing\\fR. Pacemaker then runs \\fBon\\fR on each node as it joins.\n\
         .PP\n.nf\n\
         pcs stonith create scsi\\-fence fence_pr devices=/dev/mapper/mpatha,/dev/mapper/mpathb \\e\n\
         \\    pcmk_host_list=\"node1 node2\" meta provides=unfencing\n.fi\n\
         .PP\nKeys are derived as fence_scsi(8) derives them (key_value=id or hash), or from the \
         corosync node id (key_value=native); the key stored by \\fBon\\fR is kept in \
         /var/run/cluster.key as fence_scsi keeps it, so a fence_scsi cluster switches without \
         re-keying. \\fBon\\fR also lists each LU in /var/run/cluster.lus (fence_pr's own file; \
         /run lasts one boot) before it registers the key there, as \\fBprfence unfence\\fR \
         does; once such an LU no longer holds this node's key, the node was fenced since (or \
         cannot tell that it was not), and \\fBon\\fR registers it nowhere until the node \
         reboots (\\fBprfence unfence\\fR is the explicit way back)."
    );
    let _ = writeln!(page, ".SH EXIT STATUS");
    let _ = writeln!(
        page,
        "0 success (status: ON); 1 failure, including \"this node was fenced\"; 2 status: OFF."
    );
    let _ = writeln!(page, ".SH SEE ALSO");
    let _ = writeln!(
        page,
        "\\fBprfence\\fR(8), \\fBprfence\\-agent.toml\\fR(5), \\fBfence_scsi\\fR(8), \
         \\fBstonith_admin\\fR(8), \\fBpcs\\fR(8)"
    );
    Ok(page)
}

/// The settings the example configuration sets, as (table, name): `[watch]` or `[[device]]` as
/// written, "" at the top; commented-out lines are prose, not settings.
#[cfg(test)]
fn example_settings(example: &str) -> Vec<(String, String)> {
    let mut settings = Vec::new();
    let mut section = String::new();
    for line in example.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_owned();
        } else if !line.starts_with('#')
            && let Some((name, _)) = line.split_once('=')
        {
            settings.push((section.clone(), name.trim().to_owned()));
        }
    }
    settings
}

fn agent_toml() -> anyhow::Result<String> {
    use prfence::daemon::config::reference::{
        Default, LEASE_EXAMPLE, SECTIONS, SETTINGS, WATCH_EXAMPLE,
    };
    use prfence::daemon::config::timing::{TIMING_RULES, TimingRule};
    let mut page = header("prfence-agent.toml", "5", "File Formats Manual");
    let _ = writeln!(page, ".SH NAME");
    let _ = writeln!(
        page,
        "prfence\\-agent.toml \\- configuration of the prfence node agent"
    );
    let _ = writeln!(page, ".SH SYNOPSIS");
    let _ = writeln!(page, "/etc/prfence/agent.toml");
    let _ = writeln!(page, ".SH DESCRIPTION");
    let _ = writeln!(
        page,
        "\\fBprfence agent \\-\\-config\\fR \\fIFILE\\fR reads this TOML file; \
         \\fBprfence agent \\-\\-check\\-config\\fR checks it with the rules a start uses. \
         Unknown or misspelt settings are errors, never ignored. Durations are a whole number \
         with a unit: \"500ms\", \"2s\", \"1m\", \"1h\". SIGHUP re-reads the file. \
         self_fence.command runs as root from it, so the agent refuses a file that group or \
         others can write, that another user owns, or that sits in a directory others can \
         write: keep it root's, 0600.\n\
         .PP\n\
         Safety never rests on the timings: the storage target refuses the writes of a node \
         whose key was preempted, whatever any clock says. The timings decide how fast a fenced \
         node notices and stops (watch mode), and that a stalled lease holder stops before a \
         standby takes over (lease mode)."
    );
    for section in SECTIONS {
        let title = match section.section {
            "" => "TOP-LEVEL SETTINGS".to_owned(),
            "device" => "[[device]]".to_owned(),
            other => format!("[{other}]"),
        };
        let _ = writeln!(page, ".SH {}", escape(&title));
        let _ = writeln!(page, "{}", inline(section.text));
        for setting in SETTINGS.iter().filter(|s| s.section == section.section) {
            let default = match setting.default {
                Default::Required => "required".to_owned(),
                Default::Value(value) => format!("default {value}"),
                Default::Otherwise(text) => format!("default: {text}"),
            };
            let _ = writeln!(
                page,
                ".TP\n\\fB{}\\fR = \\fI{}\\fR\n({}; {})\n.br\n{}",
                escape(setting.name),
                escape(setting.value),
                escape(&default),
                setting.modes.text(),
                inline(setting.text)
            );
        }
    }
    let _ = writeln!(page, ".SH TIMING RULES");
    let _ = writeln!(
        page,
        "The agent refuses to start on a configuration that breaks one of these rules, and says \
         which."
    );
    for TimingRule {
        modes: mode,
        rule,
        why,
        ..
    } in TIMING_RULES
    {
        let _ = writeln!(
            page,
            ".TP\n{} ({} mode)\n{}",
            inline(rule),
            escape(mode),
            inline(why)
        );
    }
    let _ = writeln!(page, ".SH FILES");
    let _ = writeln!(
        page,
        ".TP\n.B /etc/prfence/agent.toml\nThe packaged unit's configuration.\n\
         .TP\n.B /usr/share/doc/prfence/examples/agent.toml\nA commented example.\n\
         .TP\n.B /var/lib/prfence/lease\\-epoch\nThe default lease.state_file.\n\
         .TP\n.B /var/run/cluster.key\nfence_pr's key store (this node's key after its \
         unfencing), as fence_scsi keeps it.\n\
         .TP\n.B /var/run/cluster.lus\nThe LUs fence_pr's unfencing registered this node's key \
         on in this boot; \\fBon\\fR refuses those whose key is gone since."
    );
    let _ = writeln!(page, ".SH ENVIRONMENT");
    let _ = writeln!(
        page,
        ".TP\n.B PRFENCE_LOG\nSet and not empty, replaces log.level (checked with the file).\n\
         .TP\n.B NOTIFY_SOCKET\nWith [systemd] notify unset, sd_notify is on when it is set."
    );
    let _ = writeln!(page, ".SH EXAMPLES");
    for (what, example) in [
        (
            "Watch mode beside Pacemaker and fence_pr (created without key_value):",
            WATCH_EXAMPLE,
        ),
        (
            "Lease mode, two nodes (node_id 2 on the other):",
            LEASE_EXAMPLE,
        ),
    ] {
        let _ = writeln!(page, ".PP\n{}\n.PP\n.RS\n.nf", escape(what));
        for line in example.lines() {
            let _ = writeln!(page, "{}", escape(line));
        }
        let _ = writeln!(page, ".fi\n.RE");
    }
    let _ = writeln!(page, ".SH SEE ALSO");
    let _ = writeln!(
        page,
        "\\fBprfence\\fR(8), \\fBprfence\\-agent\\fR(8), \\fBfence_pr\\fR(8)"
    );
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fence_pr_parameter_and_action_is_on_its_page() {
        let page = fence_pr().unwrap();
        let xml = metadata_xml("fence_pr");
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let names: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("parameter") || n.has_tag_name("action"))
            .filter_map(|n| n.attribute("name"))
            .collect();
        assert!(names.len() > 20, "{names:?}");
        for name in names {
            assert!(
                page.contains(&escape(name)),
                "{name} missing from fence_pr.8"
            );
        }
    }

    /// The config page shows every setting of the parser's reference table with its default,
    /// every setting of the shipped example file (so the example names nothing the parser
    /// lacks), every table, and the timing rules.
    #[test]
    fn every_setting_default_and_timing_rule_is_on_the_config_page() {
        use prfence::daemon::config::reference::{Default, SECTIONS, SETTINGS};
        let root = crate::workspace();
        let page = agent_toml().unwrap();
        for setting in SETTINGS {
            let entry = format!("\\fB{}\\fR = \\fI", escape(setting.name));
            let at = page
                .find(&format!(".SH {}", section_title(setting.section)))
                .unwrap_or_else(|| panic!("no section for {}", setting.name));
            assert!(page[at..].contains(&entry), "{} missing", setting.name);
            if let Default::Value(value) = setting.default {
                assert!(
                    page.contains(&format!("default {}", escape(value))),
                    "{}: default {value} missing",
                    setting.name
                );
            }
        }
        assert_eq!(SECTIONS.len(), 10);
        let example = std::fs::read_to_string(root.join("packaging/prfence-agent.toml")).unwrap();
        let named = example_settings(&example);
        assert!(named.len() >= 25, "only {} settings found", named.len());
        for (section, name) in named {
            let section = section.trim_matches(|c| c == '[' || c == ']');
            assert!(
                SETTINGS
                    .iter()
                    .any(|d| d.section == section && d.name == name),
                "the example's [{section}] {name} is not a setting"
            );
        }
        let rules = prfence::daemon::config::timing::TIMING_RULES;
        assert!(rules.len() >= 10);
        for rule in rules {
            assert!(
                page.contains(&inline(rule.rule)),
                "timing rule {} missing",
                rule.rule
            );
        }
    }

    fn section_title(section: &str) -> String {
        match section {
            "" => escape("TOP-LEVEL SETTINGS"),
            "device" => escape("[[device]]"),
            other => escape(&format!("[{other}]")),
        }
    }

    /// No page shows a comment where a setting should be, or one setting's text under another:
    /// every `.TP` tag line of the config page is one setting.
    #[test]
    fn the_config_page_is_not_garbled() {
        let page = agent_toml().unwrap();
        let tags: Vec<&str> = page
            .lines()
            .zip(page.lines().skip(1))
            .filter(|(l, _)| *l == ".TP")
            .map(|(_, tag)| tag)
            .collect();
        assert!(tags.len() > 40, "{}", tags.len());
        for tag in tags {
            assert!(!tag.contains('#'), "a comment in a tag line: {tag}");
        }
    }

    /// Every page a page points to (`\fBname\fR(N)`) is generated here or is another
    /// package's page.
    #[test]
    fn every_page_referenced_exists() {
        const ELSEWHERE: &[&str] = &[
            "fence_scsi(8)",
            "stonith_admin(8)",
            "pcs(8)",
            "sg_persist(8)",
            "mpathpersist(8)",
            "systemd.service(5)",
            "sd_notify(3)",
        ];
        let pages = pages().unwrap();
        let names: Vec<String> = pages
            .iter()
            .filter_map(|(p, _)| p.file_name()?.to_str())
            .filter_map(|f| f.rsplit_once('.'))
            .map(|(name, section)| format!("{}({section})", name.replace('-', "\\-")))
            .collect();
        for (path, content) in &pages {
            let text = String::from_utf8_lossy(content);
            for piece in text.split("\\fB").skip(1) {
                let Some((name, rest)) = piece.split_once("\\fR(") else {
                    continue;
                };
                let Some(section) = rest.split(')').next() else {
                    continue;
                };
                if section.len() != 1 || name.contains(' ') {
                    continue;
                }
                let reference = format!("{name}({section})");
                assert!(
                    names.contains(&reference)
                        || ELSEWHERE.contains(&reference.replace("\\-", "-").as_str()),
                    "{} refers to {reference}, which no package has",
                    path.display()
                );
            }
        }
    }

    /// The commands the EXAMPLES show are valid prfence command lines.
    #[test]
    fn the_example_commands_parse() {
        use clap::Parser;
        for (_, command) in PRFENCE_EXAMPLES {
            let argv: Vec<&str> = command.split_whitespace().collect();
            if let Err(e) = Cli::try_parse_from(&argv) {
                panic!("{command}: {e}");
            }
        }
    }

    /// prfence-agent(8)'s EXIT STATUS lists the codes the agent's constants hold.
    #[test]
    fn the_agent_page_lists_its_exit_statuses() {
        use prfence::daemon::agent::{EXIT_CONFIG, EXIT_FAILURE, EXIT_ONCE_PROBLEM};
        use prfence::daemon::config::DEFAULT_FENCED_EXIT_STATUS;
        let pages = prfence_pages().unwrap();
        let (_, page) = pages
            .iter()
            .find(|(p, _)| p.ends_with("prfence-agent.8"))
            .unwrap();
        let page = String::from_utf8_lossy(page);
        let status = &page[page.find(".SH EXIT STATUS").expect("EXIT STATUS")..];
        for code in [
            0,
            EXIT_FAILURE,
            EXIT_CONFIG,
            EXIT_ONCE_PROBLEM,
            DEFAULT_FENCED_EXIT_STATUS,
        ] {
            assert!(
                status.contains(&format!(".B {code}\n")),
                "exit {code} missing"
            );
        }
        for section in ["FILES", "ENVIRONMENT", "EXAMPLES", "SEE ALSO"] {
            assert!(
                page.contains(&format!(".SH {section}")),
                "{section} missing"
            );
        }
    }

    #[test]
    fn every_subcommand_has_a_page() {
        let pages = prfence_pages().unwrap();
        for sub in Cli::command()
            .get_subcommands()
            .filter(|s| s.get_name() != "help")
        {
            let file = format!("man/prfence-{}.8", sub.get_name());
            assert!(
                pages.iter().any(|(p, _)| p == std::path::Path::new(&file)),
                "{file}"
            );
        }
    }
}

#[cfg(test)]
mod render_tests {
    /// Every page renders with man(1) without a warning (groff's and man-db's checks).
    #[test]
    fn every_page_renders_without_warnings() {
        let dir = tempfile_dir();
        for (path, content) in super::pages().unwrap() {
            let file = dir.join(path.file_name().unwrap());
            std::fs::write(&file, content).unwrap();
            let out = std::process::Command::new("man")
                .args(["--warnings", "-l"])
                .arg(&file)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "80")
                .env("LC_ALL", "C.UTF-8")
                .output()
                .expect("man(1) is needed to check the pages: apt-get install man-db");
            let warnings = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && warnings.trim().is_empty(),
                "{}: {warnings}",
                path.display()
            );
            assert!(
                out.stdout.len() > 200,
                "{} rendered almost nothing",
                path.display()
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("prfence-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
