//! Man pages, each generated from the thing it documents:
//! - `prfence(8)` and `prfence-<command>(8)` from the CLI definition (clap_mangen);
//! - `fence_pr(8)` from the agent's own metadata XML, as fence-agents makes its pages;
//! - `prfence-agent.toml(5)` from the commented example configuration and README's timing rules.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::CommandFactory;
use clap_mangen::Man;
use prfence::cli::Cli;
use prfence::fence_agent::metadata::metadata_xml;

use crate::roff::{escape, header, inline};

pub fn pages(root: &Path) -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut pages = prfence_pages()?;
    pages.push((PathBuf::from("man/fence_pr.8"), fence_pr()?.into_bytes()));
    pages.push((
        PathBuf::from("man/prfence-agent.toml.5"),
        agent_toml(root)?.into_bytes(),
    ));
    Ok(pages)
}

fn render(man: Man) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    man.section("8").date("").render(&mut buf)?;
    Ok(buf)
}

fn prfence_pages() -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut pages = vec![(
        PathBuf::from("man/prfence.8"),
        render(Man::new(cmd.clone()))?,
    )];
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        // clap names are &'static str without its `string` feature, which would also change the
        // prfence binary's clap when the workspace is built together; a build tool may leak.
        let name: &'static str = Box::leak(format!("prfence-{}", sub.get_name()).into_boxed_str());
        let page = sub
            .clone()
            .name(name)
            .bin_name(format!("prfence {}", sub.get_name()));
        pages.push((
            PathBuf::from(format!("man/{name}.8")),
            render(Man::new(page))?,
        ));
    }
    Ok(pages)
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
         re-keying."
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

/// One setting of the example configuration: its section, name, example value and the comment
/// above or beside it.
struct Setting {
    section: String,
    name: String,
    value: String,
    text: Vec<String>,
}

/// Reads the example: `# comment` lines describe the next `key = value` (or `[section]`); a
/// comment after a value describes that value; commented-out optional settings stay in the text
/// of the setting that follows them, as in the file.
fn settings(example: &str) -> (Vec<String>, Vec<Setting>) {
    let mut preamble = Vec::new();
    let mut settings = Vec::new();
    let mut section = String::new();
    let mut comment: Vec<String> = Vec::new();
    let mut seen_setting = false;
    for line in example.lines() {
        let line = line.trim();
        if line.is_empty() {
            if !seen_setting {
                preamble.append(&mut comment);
            }
            comment.clear();
            continue;
        }
        if line.starts_with('[') {
            // As written: `[watch]`, or `[[device]]` for a table that repeats.
            section = line.to_owned();
            settings.push(Setting {
                section: section.clone(),
                name: String::new(),
                value: String::new(),
                text: std::mem::take(&mut comment),
            });
            seen_setting = true;
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            comment.push(c.strip_prefix(' ').unwrap_or(c).to_owned());
            continue;
        }
        if let Some((name, rest)) = line.split_once('=') {
            let (value, beside) = match rest.split_once(" #") {
                Some((v, c)) => (v.trim(), Some(c.trim())),
                None => (rest.trim(), None),
            };
            let mut text = std::mem::take(&mut comment);
            text.extend(beside.map(str::to_owned));
            settings.push(Setting {
                section: section.clone(),
                name: name.trim().to_owned(),
                value: value.to_owned(),
                text,
            });
            seen_setting = true;
        }
    }
    (preamble, settings)
}

/// README's "Timing rules" table: (mode, rule, why) rows.
fn timing_rules(readme: &str) -> anyhow::Result<Vec<[String; 3]>> {
    let start = readme
        .find("### Timing rules")
        .context("README.md has no \"### Timing rules\" section")?;
    let rows: Vec<[String; 3]> = readme[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            match cells.as_slice() {
                [mode, rule, why] => Some([(*mode).into(), (*rule).into(), (*why).into()]),
                _ => None,
            }
        })
        .collect();
    if rows.is_empty() {
        bail!("README.md's timing rules table is empty");
    }
    Ok(rows)
}

fn agent_toml(root: &Path) -> anyhow::Result<String> {
    let example = std::fs::read_to_string(root.join("packaging/prfence-agent.toml"))?;
    let readme = std::fs::read_to_string(root.join("docs/agent.md"))?;
    let (preamble, settings) = settings(&example);
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
         \\fBprfence agent \\-\\-check\\-config\\fR checks it with the rules that start uses. \
         The settings below, with their example values, are those of the commented example \
         installed under /usr/share/doc/prfence."
    );
    for line in preamble.iter().skip(1) {
        if line.is_empty() {
            let _ = writeln!(page, ".PP");
        } else {
            let _ = writeln!(page, "{}", inline(line));
        }
    }
    let mut current = None::<String>;
    for s in &settings {
        if current.as_deref() != Some(s.section.as_str()) {
            current = Some(s.section.clone());
            let title = if s.section.is_empty() {
                "TOP-LEVEL SETTINGS".to_owned()
            } else {
                s.section.clone()
            };
            let _ = writeln!(page, ".SH {}", escape(&title));
        }
        if s.name.is_empty() {
            for line in &s.text {
                let _ = writeln!(page, "{}", inline(line));
            }
            let _ = writeln!(page, ".PP");
            continue;
        }
        let _ = writeln!(
            page,
            ".TP\n\\fB{}\\fR = {}",
            escape(&s.name),
            escape(&s.value)
        );
        for line in &s.text {
            let _ = writeln!(page, "{}", inline(line));
        }
    }
    let _ = writeln!(page, ".SH TIMING RULES");
    let _ = writeln!(
        page,
        "The agent refuses to start on a configuration that breaks one of these rules, and says \
         which. Safety never rests on them: the storage target refuses a preempted node's \
         writes whatever any clock says."
    );
    for [mode, rule, why] in timing_rules(&readme)? {
        let _ = writeln!(
            page,
            ".TP\n{} ({} mode)\n{}",
            inline(&rule),
            escape(&mode),
            inline(&why)
        );
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

    #[test]
    fn every_example_setting_and_timing_rule_is_on_the_config_page() {
        let root = crate::workspace();
        let page = agent_toml(&root).unwrap();
        let example = std::fs::read_to_string(root.join("packaging/prfence-agent.toml")).unwrap();
        let (_, settings) = settings(&example);
        let named: Vec<&Setting> = settings.iter().filter(|s| !s.name.is_empty()).collect();
        assert!(named.len() >= 25, "only {} settings found", named.len());
        // [systemd] notify is best left unset, so the example only describes it.
        assert!(
            page.contains("notify = true | false"),
            "[systemd] notify missing"
        );
        for s in named {
            assert!(
                page.contains(&format!("\\fB{}\\fR = ", escape(&s.name))),
                "{} missing",
                s.name
            );
        }
        let readme = std::fs::read_to_string(root.join("docs/agent.md")).unwrap();
        assert!(timing_rules(&readme).unwrap().len() >= 10);
    }

    #[test]
    fn every_subcommand_has_a_page() {
        let pages = prfence_pages().unwrap();
        for sub in Cli::command()
            .get_subcommands()
            .filter(|s| s.get_name() != "help")
        {
            let file = format!("man/prfence-{}.8", sub.get_name());
            assert!(pages.iter().any(|(p, _)| p == Path::new(&file)), "{file}");
        }
    }
}

#[cfg(test)]
mod render_tests {
    /// Every page renders with man(1) without a warning (groff's and man-db's checks).
    #[test]
    fn every_page_renders_without_warnings() {
        let dir = tempfile_dir();
        for (path, content) in super::pages(&crate::workspace()).unwrap() {
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
