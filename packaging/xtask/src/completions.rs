//! Shell completions for bash, zsh and fish, generated from the CLI definition (clap_complete),
//! with every DEVICE argument completing to block and SCSI generic devices.

use std::path::PathBuf;

use clap::{CommandFactory, ValueHint};
use clap_complete::{Shell, generate};
use prfence::cli::Cli;

/// The CLI with its device arguments marked as paths, so each shell completes them from the
/// file system; the shells' scripts then narrow that to devices.
fn command() -> clap::Command {
    let mut cmd = Cli::command();
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    for name in names {
        cmd = cmd.mut_subcommand(&name, |sub| {
            let devices: Vec<String> = sub
                .get_arguments()
                .filter(|a| {
                    a.get_value_names()
                        .is_some_and(|v| v.iter().any(|n| n == "DEVICE"))
                })
                .map(|a| a.get_id().to_string())
                .collect();
            devices.iter().fold(sub, |sub, id| {
                sub.mut_arg(id, |a| a.value_hint(ValueHint::FilePath))
            })
        });
    }
    cmd
}

pub fn scripts() -> anyhow::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut out = Vec::new();
    for (shell, file) in [
        (Shell::Bash, "completions/prfence.bash"),
        (Shell::Zsh, "completions/_prfence"),
        (Shell::Fish, "completions/prfence.fish"),
    ] {
        let mut buf = Vec::new();
        generate(shell, &mut command(), "prfence", &mut buf);
        let script = String::from_utf8(buf)?;
        out.push((
            PathBuf::from(file),
            devices_only(shell, &script)?.into_bytes(),
        ));
    }
    Ok(out)
}

/// Subcommands that take DEVICE arguments, each with its options that take a value.
fn device_commands() -> Vec<(String, Vec<String>)> {
    let mut cmd = command();
    cmd.build();
    cmd.get_subcommands()
        .filter(|sub| {
            sub.get_arguments().any(|a| {
                a.get_value_names()
                    .is_some_and(|v| v.iter().any(|n| n == "DEVICE"))
            })
        })
        .map(|sub| {
            let options = sub
                .get_arguments()
                .filter(|a| !a.is_positional() && a.get_action().takes_values())
                .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                .collect();
            (sub.get_name().to_owned(), options)
        })
        .collect()
}

/// Narrows the completion of DEVICE arguments to block devices, character devices (/dev/sgN) and
/// directories to descend into (/dev/mapper, /dev/disk/by-id).
fn devices_only(shell: Shell, script: &str) -> anyhow::Result<String> {
    let commands = device_commands();
    anyhow::ensure!(commands.len() > 10, "no DEVICE arguments found");
    Ok(match shell {
        // zsh's glob qualifiers: block (%b) and character (%c) devices, through symlinks (-).
        Shell::Zsh => script.replace(":_files' \\", ":_files -g \"*(-%b) *(-%c)\"' \\"),
        // bash: clap's function completes options; a wrapper completes devices where a DEVICE
        // argument may stand (not after an option that takes a value).
        Shell::Bash => {
            let mut cases = String::new();
            for (name, options) in &commands {
                let guard = if options.is_empty() {
                    String::new()
                } else {
                    format!("case \"$prev\" in {}) return 0;; esac; ", options.join("|"))
                };
                cases.push_str(&format!("        {name}) {guard}_prfence_devices;;\n"));
            }
            let wrapper = r#"
# DEVICE arguments: block and SCSI generic devices, and directories to descend into.
_prfence_devices() {
    local f
    COMPREPLY=()
    for f in $(compgen -f -- "${cur:-/dev/}"); do
        if [[ -b $f || -c $f || -d $f ]]; then COMPREPLY+=("$f"); fi
    done
}
_prfence_with_devices() {
    _prfence "$@"
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" sub= w
    [[ $cur == -* ]] && return 0
    for w in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do
        if [[ $w != -* ]]; then sub=$w; break; fi
    done
    case "$sub" in
CASES    esac
}
complete -F _prfence_with_devices -o bashdefault -o default prfence
"#;
            format!(
                "{}\n{}",
                script.trim_end(),
                wrapper.replace("CASES", &cases)
            )
        }
        Shell::Fish => {
            let mut lines = String::from(
                r#"
# DEVICE arguments: block and SCSI generic devices, and directories.
function __prfence_devices
    set -l cur (commandline -ct)
    test -z "$cur"; and set cur /dev/
    for f in $cur*
        if test -b $f -o -c $f -o -d $f
            echo $f
        end
    end
end
"#,
            );
            for (name, _) in &commands {
                lines.push_str(&format!(
                    "complete -c prfence -n \"__fish_prfence_using_subcommand {name}\" -f -a \"(__prfence_devices)\"\n"
                ));
            }
            format!("{script}{lines}")
        }
        _ => script.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the generated bash completion for a command line ending in `words`.
    fn bash_complete(words: &[&str]) -> Vec<String> {
        let script = scripts().unwrap().remove(0).1;
        let line = words.join(" ");
        let program = format!(
            "{}\nCOMP_WORDS=({line}); COMP_CWORD={}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n\
             _prfence_with_devices prfence \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            String::from_utf8(script).unwrap(),
            words.len() - 1
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(program)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn bash_completes_devices_where_a_device_goes_and_options_elsewhere() {
        // /dev/null is a character device; /etc/hostname a regular file.
        assert_eq!(
            bash_complete(&["prfence", "keys", "/dev/nul"]),
            ["/dev/null"]
        );
        let regular = bash_complete(&["prfence", "keys", "/etc/hostnam"]);
        assert!(regular.is_empty(), "{regular:?}");
        // After a flag that takes no value, a device may follow.
        assert_eq!(
            bash_complete(&["prfence", "fence", "--json", "/dev/nul"]),
            ["/dev/null"]
        );
        assert!(bash_complete(&["prfence", "keys", "--js"]).contains(&"--json".to_owned()));
    }

    #[test]
    fn zsh_and_fish_narrow_devices() {
        let all = scripts().unwrap();
        let zsh = String::from_utf8(all[1].1.clone()).unwrap();
        assert!(zsh.contains(":_files -g \"*(-%b) *(-%c)\"'"));
        assert!(!zsh.contains(":_files' \\"));
        let fish = String::from_utf8(all[2].1.clone()).unwrap();
        assert!(fish.contains("using_subcommand fence\" -f -a \"(__prfence_devices)\""));
    }
}
