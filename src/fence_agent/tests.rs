use super::*;

fn env() -> Environment {
    Environment::default()
}

fn stdin(text: &str) -> Result<FencePrRequest, FencePrError> {
    parse::<&str>(&[], Some(text), &env())
}

fn argv(args: &[&str]) -> Result<FencePrRequest, FencePrError> {
    parse(args, None, &env())
}

#[test]
fn pacemaker_style_stdin() {
    let req = stdin(
        "action=off\nnodename=node2\nport=node2-alias\ndevices=/dev/sdb, /dev/sdc /dev/sdd\nkey_value=hash\npcmk_host_map=x:y\n",
    )
    .unwrap();
    assert_eq!(req.action, Action::Off);
    assert_eq!(req.mode, InputMode::Stdin);
    // nodename overrides plug/port (fence_scsi's rule).
    assert_eq!(req.options.plug.as_deref(), Some("node2"));
    assert_eq!(
        req.options.devices,
        vec![
            PathBuf::from("/dev/sdb"),
            PathBuf::from("/dev/sdc"),
            PathBuf::from("/dev/sdd")
        ]
    );
    assert_eq!(req.options.key_value, KeyScheme::FenceScsiHash);
    assert_eq!(
        req.notes.len(),
        1,
        "unknown pcmk_host_map is noted: {:?}",
        req.notes
    );
}

#[test]
fn empty_nodename_falls_back_to_port() {
    let req = stdin("action=status\nnodename=\nport=n1\n").unwrap();
    assert_eq!(req.options.plug.as_deref(), Some("n1"));
}

#[test]
fn defaults_match_fence_scsi() {
    let req = stdin("port=n1\n").unwrap();
    assert_eq!(req.action, Action::Off);
    let o = &req.options;
    assert_eq!(o.power_timeout, Duration::from_secs(20));
    assert_eq!(o.delay, Duration::ZERO);
    assert_eq!(
        o.corosync_cmap_path,
        PathBuf::from("/usr/sbin/corosync-cmapctl")
    );
    assert_eq!(o.vgs_path, PathBuf::from("/sbin/vgs"));
    assert_eq!(o.key_value, KeyScheme::FenceScsiId);
    assert_eq!(o.mpath_register_method, MpathRegisterMethod::Multi);
    assert!(o.devices.is_empty());
    assert_eq!(o.command_timeout(), Some(Duration::from_secs(20)));
}

#[test]
fn actions_and_aliases() {
    for (text, action) in [
        ("ON", Action::On),
        ("enable", Action::On),
        ("disable", Action::Off),
        ("meta-data", Action::Metadata),
        ("list-status", Action::ListStatus),
        ("validate-all", Action::ValidateAll),
        ("manpage", Action::Manpage),
    ] {
        assert_eq!(Action::parse(text), Ok(action), "{text}");
    }
    let err = argv(&["-o", "reboot", "-n", "x"]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Failed: Unrecognised action 'reboot'"),
        "{err}"
    );
    assert_eq!(err.exit_code(), FencePrExit::Error);
}

#[test]
fn metadata_help_and_version_skip_validation() {
    let req = argv(&["-o", "metadata", "--power-timeout=abc"]).unwrap();
    assert_eq!(req.action, Action::Metadata);
    let req = stdin("action=meta-data\n").unwrap();
    assert_eq!(req.action, Action::Metadata);
    let req = argv(&["-h", "-o", "bogus"]).unwrap();
    assert!(req.options.help);
    let req = argv(&["-V"]).unwrap();
    assert!(req.options.version);
}

#[test]
fn target_is_required_for_on_off_status_validate() {
    for action in ["on", "off", "status", "validate-all"] {
        assert_eq!(
            argv(&["-o", action]).unwrap_err(),
            FencePrError::TargetRequired,
            "{action}"
        );
    }
    for action in ["monitor", "list", "list-status"] {
        assert!(argv(&["-o", action]).is_ok(), "{action}");
    }
    assert!(argv(&["-o", "off", "-k", "abc"]).is_ok());
    assert!(argv(&["-o", "off", "--nodename=n1"]).is_ok());
}

#[test]
fn keys_are_validated() {
    assert_eq!(
        argv(&["-o", "on", "-k", "0x6C9D0001"]).unwrap().options.key,
        Some(0x6c9d_0001)
    );
    assert_eq!(
        argv(&["-o", "on", "-k", "0"]).unwrap_err(),
        FencePrError::Key(KeyError::Zero)
    );
    assert!(matches!(
        argv(&["-o", "on", "-k", "zz"]).unwrap_err(),
        FencePrError::Key(KeyError::Malformed { .. })
    ));
    // An empty key is no key (fence_scsi tests truthiness).
    assert_eq!(
        stdin("action=on\nkey=\n").unwrap_err(),
        FencePrError::TargetRequired
    );
}

#[test]
fn typed_values_are_validated_and_errors_collected() {
    let err = argv(&[
        "-o",
        "status",
        "-n",
        "x",
        "--power-timeout=abc",
        "--key-value=foo",
    ])
    .unwrap_err();
    let FencePrError::Several(list) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(list.len(), 2);
    assert!(err.to_string().contains(
        "Failed: The value you have entered for --power-timeout is not a valid time in seconds"
    ));
    assert!(err.to_string().contains("Failed: key-value has to be"));
    assert!(matches!(
        argv(&["-n", "x", "--retry-on=-1"]).unwrap_err(),
        FencePrError::NotInteger {
            option: "retry-on",
            ..
        }
    ));
    assert!(matches!(
        argv(&["-n", "x", "--mpath-register-method=both"]).unwrap_err(),
        FencePrError::MpathRegisterMethod(_)
    ));
    let req = argv(&[
        "-n",
        "x",
        "-H",
        "7",
        "--power-timeout",
        "30",
        "--mpath-register-method=single",
    ])
    .unwrap();
    assert_eq!(req.options.delay, Duration::from_secs(7));
    assert_eq!(req.options.power_timeout, Duration::from_secs(30));
    assert_eq!(
        req.options.mpath_register_method,
        MpathRegisterMethod::Single
    );
}

#[test]
fn verbose_level_rules() {
    assert_eq!(argv(&["-n", "x", "-vv"]).unwrap().options.verbose_level, 2);
    assert_eq!(
        stdin("port=x\nverbose=1\n").unwrap().options.verbose_level,
        1
    );
    assert_eq!(
        stdin("port=x\nverbose=1\nverbose_level=0\n")
            .unwrap()
            .options
            .verbose_level,
        0
    );
    let req = argv(&["-n", "x", "--verbose-level=abc"]).unwrap();
    assert_eq!(req.options.verbose_level, 0);
    assert_eq!(req.notes.len(), 1);
}

#[test]
fn pacemaker_disables_timeouts_unless_told_otherwise() {
    let fenced = Environment {
        pcmk_service: Some("pacemaker-fenced".to_owned()),
    };
    let req = parse::<&str>(&[], Some("port=x\n"), &fenced).unwrap();
    assert!(req.options.disable_timeout);
    assert_eq!(req.options.command_timeout(), None);
    let req = parse::<&str>(&[], Some("port=x\ndisable_timeout=false\n"), &fenced).unwrap();
    assert!(!req.options.disable_timeout);
    let req = stdin("port=x\ndisable_timeout=yes\n").unwrap();
    assert!(req.options.disable_timeout);
    let req = stdin("port=x\npower_timeout=0\n").unwrap();
    assert_eq!(req.options.command_timeout(), None);
}

#[test]
fn argv_switches_to_command_line_mode_and_ignores_stdin() {
    let req = parse(&["-n", "a"], Some("port=b\naction=on\n"), &env()).unwrap();
    assert_eq!(req.mode, InputMode::CommandLine);
    assert_eq!(req.options.plug.as_deref(), Some("a"));
    assert_eq!(req.action, Action::Off);
    assert!(wants_stdin::<&str>(&[]));
    assert!(!wants_stdin(&["-o"]));
}

#[test]
fn flags_and_paths() {
    let req = stdin(
        "port=x\naptpl=1\nreadonly=yes\nsuppress-errors=on\nquiet=true\nlogfile=/tmp/l\ndebug_file=/tmp/d\nsg_turs_path=/t\nvgs_path=/v\nseparator=;\n",
    )
    .unwrap();
    let o = &req.options;
    assert!(o.aptpl && o.quiet);
    assert_eq!(o.logfile, Some(PathBuf::from("/tmp/l")));
    assert_eq!(o.debug_file, Some(PathBuf::from("/tmp/d")));
    assert_eq!(o.vgs_path, PathBuf::from("/v"));
    assert_eq!(o.separator, ";");
    // 0 means off here (fence_scsi would enable the flag).
    assert!(!stdin("port=x\naptpl=0\n").unwrap().options.aptpl);
}

const CMAP_NODELIST: &str = "nodelist.node.0.name (str) = node1\n\
nodelist.node.0.nodeid (u32) = 1\n\
nodelist.node.1.name (str) = node2\n\
nodelist.node.1.nodeid (u32) = 5\n";

fn fake_cmap(arg: &str) -> Result<String, KeyError> {
    Ok(match arg {
        "totem.cluster_name" => "totem.cluster_name (str) = mycluster\n".to_owned(),
        "nodelist" => CMAP_NODELIST.to_owned(),
        other => panic!("unexpected query {other}"),
    })
}

#[test]
fn target_key_resolution() {
    let req = stdin("action=off\nnodename=node2\n").unwrap();
    assert_eq!(req.target_key(fake_cmap), Ok(0x6c9d_0001));
    let req = stdin("action=off\nnodename=node2\nkey=abc\n").unwrap();
    assert_eq!(
        req.target_key(|_| panic!("no query when key is set")),
        Ok(0xabc)
    );
    let req = stdin("action=off\nnodename=node2\nkey_value=native\n").unwrap();
    assert_eq!(req.target_key(fake_cmap), Ok(0xec9d_58de_0000_0005));
    // Pacemaker's nodeid saves the nodelist lookup (and works for names corosync lacks).
    let req = stdin("action=off\nnodename=ghost\nnodeid=5\nkey_value=native\n").unwrap();
    assert_eq!(req.options.nodeid, Some(5));
    assert_eq!(
        req.target_key(|arg| {
            assert_eq!(arg, "totem.cluster_name");
            fake_cmap(arg)
        }),
        Ok(0xec9d_58de_0000_0005)
    );
    assert!(matches!(
        stdin("port=x\nnodeid=abc\n").unwrap_err(),
        FencePrError::NotInteger {
            option: "nodeid",
            ..
        }
    ));
    // fence_scsi schemes ignore nodeid: they must match fence_scsi's keys.
    let req = stdin("action=off\nnodename=node2\nnodeid=5\n").unwrap();
    assert_eq!(req.target_key(fake_cmap), Ok(0x6c9d_0001));
    let req = stdin("action=off\nnodename=ghost\n").unwrap();
    assert!(matches!(
        req.target_key(fake_cmap),
        Err(FencePrError::Key(KeyError::NodeNotFound { .. }))
    ));
}

#[test]
fn self_fence_guard() {
    assert!(check_not_self(1, 2).is_ok());
    let err = check_not_self(0xabc, 0xabc).unwrap_err();
    assert!(err.to_string().starts_with("Failed: keys cannot be same."));
}

#[test]
fn list_rendering() {
    assert_eq!(
        render_list(&["node1", "node2"], ","),
        "node1,node1\nnode2,node2\n"
    );
    assert_eq!(
        render_list_status(&[("a", Some(true)), ("b", Some(false)), ("c", None)], ","),
        "a,a,ON\nb,b,OFF\nc,c,UNKNOWN\n"
    );
}

#[test]
fn exit_codes() {
    assert_eq!(FencePrExit::Success.code(), 0);
    assert_eq!(FencePrExit::Error.code(), 1);
    assert_eq!(FencePrExit::Off.code(), 2);
}

#[test]
fn usage_lists_every_option() {
    let text = usage("fence_pr");
    assert!(text.contains("-d, --devices=[value]"));
    assert!(text.contains("--mpath-register-method=[value]"));
    assert!(text.contains("-H, --delay=[value]"));
}

#[test]
fn time_options_are_bounded_to_what_sg_io_and_pacemaker_can_count() {
    let options = [
        ("delay", "delay"),
        ("power_timeout", "power-timeout"),
        ("shell_timeout", "shell-timeout"),
        ("login_timeout", "login-timeout"),
        ("power_wait", "power-wait"),
        ("stonith_status_sleep", "stonith-status-sleep"),
    ];
    for (key, long) in options {
        let req = stdin(&format!("port=n1\n{key}={MAX_TIME_SECS}\n")).unwrap();
        // shell_timeout, login_timeout and stonith_status_sleep are checked but not kept.
        let kept = [
            req.options.delay,
            req.options.power_timeout,
            req.options.power_wait,
        ];
        assert_eq!(
            kept.contains(&Duration::from_secs(MAX_TIME_SECS)),
            ["delay", "power_timeout", "power_wait"].contains(&key),
            "{key}"
        );
        for too_large in [
            format!("{}", MAX_TIME_SECS + 1),
            "99999999999".to_owned(),
            u64::MAX.to_string(),
        ] {
            let e = stdin(&format!("port=n1\n{key}={too_large}\n")).unwrap_err();
            assert_eq!(
                e,
                FencePrError::TimeTooLarge {
                    option: long,
                    value: too_large.parse().unwrap()
                }
            );
            assert!(e.to_string().contains("the most is 4294967 s"), "{e}");
            let e = argv(&["-n", "n1", &format!("--{long}={too_large}")]).unwrap_err();
            assert!(matches!(e, FencePrError::TimeTooLarge { .. }), "{e}");
        }
        for bad in [
            "nan",
            "NaN",
            "inf",
            "-inf",
            "-1",
            "1.5",
            "1e3",
            "",
            "18446744073709551616",
        ] {
            let e = stdin(&format!("port=n1\n{key}={bad}\n")).unwrap_err();
            assert!(
                matches!(e, FencePrError::NotSeconds { option, .. } if option == long),
                "{key}={bad}: {e}"
            );
        }
    }
    // The largest power_timeout is a command bound SG_IO can carry.
    let req = stdin(&format!("port=n1\npower_timeout={MAX_TIME_SECS}\n")).unwrap();
    let millis = req.options.command_timeout().unwrap().as_millis();
    assert!(millis < u128::from(u32::MAX), "{millis}");
}

#[test]
fn device_count_is_capped_on_stdin_and_argv() {
    let list = |n: usize| {
        (0..n)
            .map(|i| format!("/dev/sd{i}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let req = stdin(&format!("port=n1\ndevices={}\n", list(crate::MAX_DEVICES))).unwrap();
    assert_eq!(req.options.devices.len(), crate::MAX_DEVICES);
    let e = stdin(&format!("port=n1\ndevices={}\n", list(3000))).unwrap_err();
    assert_eq!(e, FencePrError::TooManyDevices { count: 3000 });
    assert!(e.to_string().contains("at most 1024"), "{e}");
    let devices = format!("--devices={}", list(crate::MAX_DEVICES + 1));
    let e = argv(&["-n", "n1", &devices]).unwrap_err();
    assert_eq!(e.exit_code(), FencePrExit::Error);
    assert!(
        matches!(e, FencePrError::TooManyDevices { count: 1025 }),
        "{e}"
    );
}

#[test]
fn coordinators_are_none_three_or_five() {
    let req =
        stdin("port=n1\ndevices=/dev/sda\ncoordinators=/dev/sdx, /dev/sdy,/dev/sdz\n").unwrap();
    assert_eq!(
        req.options.coordinators,
        ["/dev/sdx", "/dev/sdy", "/dev/sdz"].map(PathBuf::from)
    );
    assert!(
        stdin("port=n1\ndevices=/dev/sda\n")
            .unwrap()
            .options
            .coordinators
            .is_empty()
    );
    for (count, given) in [
        (1, "/dev/a"),
        (2, "/dev/a,/dev/b"),
        (4, "/dev/a /dev/b /dev/c /dev/d"),
    ] {
        let e = stdin(&format!(
            "port=n1\ndevices=/dev/sda\ncoordinators={given}\n"
        ))
        .unwrap_err();
        assert_eq!(e, FencePrError::CoordinatorCount { count });
        assert!(e.to_string().contains("give 3"), "{e}");
    }
    let e = argv(&["-n", "n1", "-d", "/dev/sda", "--coordinators=/dev/a,/dev/b"]).unwrap_err();
    assert_eq!(e, FencePrError::CoordinatorCount { count: 2 });
}

#[test]
fn unreachable_data_is_fail_or_report_and_report_needs_coordinators() {
    let with = "port=n1\ndevices=/dev/sda\ncoordinators=/dev/x,/dev/y,/dev/z\n";
    assert_eq!(
        stdin(with).unwrap().options.unreachable_data,
        UnreachableData::Fail
    );
    let req = stdin(&format!("{with}unreachable_data=report\n")).unwrap();
    assert_eq!(req.options.unreachable_data, UnreachableData::Report);
    let e = stdin(&format!("{with}unreachable_data=skip\n")).unwrap_err();
    assert_eq!(e, FencePrError::UnreachableData("skip".to_owned()));
    let e = stdin("port=n1\ndevices=/dev/sda\nunreachable_data=report\n").unwrap_err();
    assert_eq!(e, FencePrError::UnreachableDataWithoutCoordinators);
    let req = argv(&[
        "-n",
        "n1",
        "-d",
        "/dev/sda",
        "--coordinators=/dev/x,/dev/y,/dev/z",
        "--unreachable-data=report",
    ])
    .unwrap();
    assert_eq!(req.options.unreachable_data, UnreachableData::Report);
}

#[test]
fn arguments_that_are_not_utf8_are_named() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let ok = args_from_os(["-o".into(), "status".into()]).unwrap();
    assert_eq!(ok, ["-o", "status"]);
    let e = args_from_os([
        std::ffi::OsString::from("-o"),
        OsString::from_vec(vec![0xff]),
    ])
    .unwrap_err();
    assert!(
        matches!(e, FencePrError::ArgumentNotUtf8 { index: 2, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("Failed: argument 2 is not valid UTF-8"),
        "{e}"
    );
    assert_eq!(e.exit_code(), FencePrExit::Error);
}

#[test]
fn stdin_is_read_with_bounded_lines_and_total() {
    use std::io::Read as _;
    let read = |bytes: &[u8]| read_stdin(bytes);
    assert_eq!(
        read(b"action=on\r\nport=n1").unwrap(),
        "action=on\r\nport=n1"
    );
    assert_eq!(read(b"").unwrap(), "");
    // A line of exactly the limit passes, with either line ending or none.
    let fits = "a".repeat(MAX_STDIN_LINE);
    for ending in ["\n", "\r\n", ""] {
        let text = format!("port=n1\n{fits}{ending}");
        assert_eq!(read(text.as_bytes()).unwrap(), text);
    }
    let long = format!("port=n1\ndevices={}\n", "a".repeat(MAX_STDIN_LINE));
    assert_eq!(
        read(long.as_bytes()).unwrap_err(),
        FencePrError::StdinLineTooLong { line: 2 }
    );
    // A 20 MB line is refused after reading one line's worth, not held in memory.
    let mut huge = std::io::Read::chain(&b"devices="[..], std::io::repeat(b'a').take(20_000_000));
    let e = read_stdin(std::io::BufReader::new(&mut huge)).unwrap_err();
    assert_eq!(e, FencePrError::StdinLineTooLong { line: 1 });
    assert!(
        huge.get_ref().1.limit() > 19_000_000,
        "read {} bytes of the line",
        20_000_000 - huge.get_ref().1.limit()
    );
    // Many lines that each fit but add up past the total.
    let line = format!("# {}\n", "c".repeat(MAX_STDIN_LINE - 2));
    let many = line.repeat(MAX_STDIN_BYTES / line.len() + 1);
    assert_eq!(
        read(many.as_bytes()).unwrap_err(),
        FencePrError::StdinTooLarge
    );
    // Issue 44: NUL, ESC and other control characters are refused, naming the line, instead
    // of reaching the logs as they are (a tab, and the line endings, are no such thing).
    for (bytes, code) in [
        (&b"action=status\nport=n\x001\n"[..], 0x00),
        (&b"action=status\nport=n\x1b[2J1\n"[..], 0x1b),
        (&b"action=status\nport=n\x7f\r\n"[..], 0x7f),
    ] {
        let e = read(bytes).unwrap_err();
        assert_eq!(e, FencePrError::StdinControlCharacter { line: 2, code });
        assert_eq!(e.exit_code(), FencePrExit::Error);
        assert!(e.to_string().contains(&format!("U+{code:04X}")), "{e}");
    }
    assert!(read(b"action=status\r\n# a\tcomment\n").is_ok());
    let e = args_from_os(["-o".into(), "status\u{1b}]0;x\u{7}".into()]).unwrap_err();
    assert_eq!(
        e,
        FencePrError::ArgumentControlCharacter {
            index: 2,
            code: 0x1b
        }
    );
    // Not UTF-8: the line is named; the error is a failure (exit 1).
    let e = read(b"action=status\nport=n\xff1\n").unwrap_err();
    assert_eq!(e, FencePrError::StdinNotUtf8 { line: 2 });
    assert_eq!(e.exit_code(), FencePrExit::Error);
    assert!(
        e.to_string().contains("line 2 of stdin is not valid UTF-8"),
        "{e}"
    );
}

#[test]
fn fence_scsi_options_without_a_use_here_are_still_accepted_and_checked() {
    let req = stdin(
        "port=x\nreadonly=1\nsuppress_errors=1\nsg_persist_path=/p\nsg_turs_path=/t\n\
         plug_separator=+\nshell_timeout=3\nlogin_timeout=5\nstonith_status_sleep=1\n\
         retry_on=2\n",
    )
    .unwrap();
    assert!(req.notes.is_empty(), "{:?}", req.notes);
    for bad in [
        "shell_timeout=x",
        "login_timeout=-1",
        "stonith_status_sleep=y",
        "retry_on=z",
    ] {
        assert!(stdin(&format!("port=x\n{bad}\n")).is_err(), "{bad}");
    }
}
