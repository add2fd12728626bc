# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_prfence_global_optspecs
    string join \n json timeout= v/verbose h/help V/version
end

function __fish_prfence_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_prfence_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_prfence_using_subcommand
    set -l cmd (__fish_prfence_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c prfence -n "__fish_prfence_needs_command" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_needs_command" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_needs_command" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c prfence -n "__fish_prfence_needs_command" -s V -l version -d 'Print version'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "keys" -d 'List the registered keys (PR IN READ KEYS)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "reservation" -d 'Show the reservation, if any (PR IN READ RESERVATION)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "capabilities" -d 'Show what the device supports (PR IN REPORT CAPABILITIES)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "full-status" -d 'Show every registration with its initiator and port (PR IN READ FULL STATUS)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "register" -d 'Register a key on this path (REGISTER, or REGISTER AND IGNORE EXISTING KEY)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "unregister" -d 'Remove this path\'s registration (REGISTER with service action key 0)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "reserve" -d 'Take a reservation with a registered key (RESERVE)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "release" -d 'Give up a reservation this path holds (RELEASE)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "clear" -d 'Remove every registration and the reservation (CLEAR)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "preempt" -d 'Remove another key\'s registrations and take over its reservation (PREEMPT [AND ABORT])'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "register-move" -d 'Register a key for another initiator and move the reservation to it (REGISTER AND MOVE)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "unfence" -d 'Let this node write: register its key on every path of every LU (REGISTER AND IGNORE EXISTING KEY), reserve (wero) where no reservation exists, verify. The only command that registers a key that was preempted. Each LU is first added to fence_pr\'s record of this boot (/var/run/cluster.lus, or FENCE_PR_STORE\'s stem), so fence_pr\'s `on` refuses the node once it is fenced again'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "fence" -d 'Fence another node: remove its key from every LU (PREEMPT AND ABORT, or PREEMPT where the target refuses it) and verify. The first LU by identifier decides alone: if this node\'s key is gone there, no other LU is touched and the exit status is 4 (also when it vanishes there during the fence). fence never registers this node\'s key: an LU where it is gone is left alone'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "status" -d 'Is this node\'s key registered on all, some or none of the LUs? (Read only.)'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "agent" -d 'Run the node agent (watch or lease mode) from a configuration file'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "doctor" -d 'Is every LU ready to fence? Paths, PR support, capabilities, registrations and which paths carry this node\'s key, the reservation, orphans, with what to do about each problem. Read only: sends nothing but PERSISTENT RESERVE IN'
complete -c prfence -n "__fish_prfence_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c prfence -n "__fish_prfence_using_subcommand keys" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand keys" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand keys" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand keys" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand keys" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand reservation" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand reservation" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand reservation" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand reservation" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand reservation" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand capabilities" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand capabilities" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand capabilities" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand capabilities" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand capabilities" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand full-status" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand full-status" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand full-status" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand full-status" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand full-status" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand register" -l key -d 'The key to register' -r
complete -c prfence -n "__fish_prfence_using_subcommand register" -l old-key -d 'The key this path is registered with now, to change it (default: not registered)' -r
complete -c prfence -n "__fish_prfence_using_subcommand register" -l transport-id -d 'Also register these initiators (SPEC_I_PT), e.g. iqn.2026-11.lab:nodeb,i,0x23d000002, fc,0x5001405abcdef012 or sas,0x5001405abcdef012' -r
complete -c prfence -n "__fish_prfence_using_subcommand register" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand register" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand register" -l ignore-existing -d 'Replace whatever key this path has (REGISTER AND IGNORE EXISTING KEY)'
complete -c prfence -n "__fish_prfence_using_subcommand register" -l aptpl -d 'Ask the target to keep registrations across power loss (APTPL). Without it the LU\'s current state is kept: prfence reads it (REPORT CAPABILITIES) and sends it along'
complete -c prfence -n "__fish_prfence_using_subcommand register" -l all-target-ports -d 'Register on every target port of this initiator (ALL_TG_PT)'
complete -c prfence -n "__fish_prfence_using_subcommand register" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand register" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand register" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -l key -d 'This path\'s registered key' -r
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -l all-target-ports -d 'The registration was made with ALL_TG_PT (LIO refuses to remove it otherwise)'
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -l aptpl -d 'Turn persist-through-power-loss on for the LU\'s remaining registrations. Without it the LU\'s current state is kept (a REGISTER\'s APTPL bit applies to the whole LU)'
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand reserve" -l key -d 'This path\'s registered key' -r
complete -c prfence -n "__fish_prfence_using_subcommand reserve" -l type -d 'Reservation type: wero, we, ea, earo, wear, eaar or an SPC code' -r
complete -c prfence -n "__fish_prfence_using_subcommand reserve" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand reserve" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand reserve" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand reserve" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand reserve" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand release" -l key -d 'This path\'s registered key' -r
complete -c prfence -n "__fish_prfence_using_subcommand release" -l type -d 'Reservation type: wero, we, ea, earo, wear, eaar or an SPC code' -r
complete -c prfence -n "__fish_prfence_using_subcommand release" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand release" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand release" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand release" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand release" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand clear" -l key -d 'This path\'s registered key' -r
complete -c prfence -n "__fish_prfence_using_subcommand clear" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand clear" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand clear" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand clear" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand clear" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -l key -d 'This path\'s registered key' -r
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -l victim -d 'The key to remove. 0 removes every other registration, only for wear and eaar' -r
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -l type -d 'Reservation type to hold afterwards if the victim held the reservation' -r
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -l abort -d 'Also abort the victim\'s outstanding commands (PREEMPT AND ABORT): what fencing wants'
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l key -d 'The reservation holder\'s key (this path)' -r
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l new-key -d 'The key to register for the destination initiator, which becomes the holder' -r
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l transport-id -d 'The destination initiator, e.g. iqn.2026-11.lab:nodeb,i,0x23d000002' -r
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l relative-target-port -d 'Relative target port identifier through which the destination sees the LU' -r
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l type -d 'Reservation type the destination holds' -r
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l deadline -d 'Overall deadline in seconds for all devices together; a device whose open or command is still blocked in the kernel then is reported as timed out (default: twice --timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l unreg -d 'Unregister this path after the move'
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l aptpl -d 'Persist through power loss (APTPL)'
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand unfence" -l key -d 'This node\'s key' -r
complete -c prfence -n "__fish_prfence_using_subcommand unfence" -l deadline -d 'Overall deadline in seconds for all LUs together; LUs still pending are reported as timed out (default 50, below Pacemaker\'s 60 s fence timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand unfence" -l coordinator -d 'A coordinator LU, one device each (best its dm-multipath map), 3 or 5 of them on separate arrays, the same set on every node: `fence` then wins on a majority of them instead of on the arbiter LU, so it still wins with one array lost; `unfence` registers on them and `status` reads them as it does the other LUs' -r -F
complete -c prfence -n "__fish_prfence_using_subcommand unfence" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand unfence" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand unfence" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand unfence" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand fence" -l victim -d 'The key of the node to fence' -r
complete -c prfence -n "__fish_prfence_using_subcommand fence" -l tie-break -d 'How long the node with the greater key waits on the arbiter LU, while both keys are registered there, before it looks again and preempts: in a mutual fence the smaller key goes first, so two PREEMPTs never cross on one LU (they can lock up an LIO target). `auto`: twice what this fence took to the arbiter\'s first answer, at most 1 s (the other node needs about as long to reach its PREEMPT). SECS: that long; 0 turns the wait off' -r
complete -c prfence -n "__fish_prfence_using_subcommand fence" -l unreachable-data -d 'With --coordinator, what a fence that won the coordinators does with a data LU no path of this node answers. `fail` (the default): the fence fails naming it. `report`: for an array you know is down, not cut off from this node alone: the fence succeeds with every data LU it reaches fenced (at least one) and names the others as not fenced; the victim\'s key stays on them' -r
complete -c prfence -n "__fish_prfence_using_subcommand fence" -l key -d 'This node\'s key' -r
complete -c prfence -n "__fish_prfence_using_subcommand fence" -l deadline -d 'Overall deadline in seconds for all LUs together; LUs still pending are reported as timed out (default 50, below Pacemaker\'s 60 s fence timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand fence" -l coordinator -d 'A coordinator LU, one device each (best its dm-multipath map), 3 or 5 of them on separate arrays, the same set on every node: `fence` then wins on a majority of them instead of on the arbiter LU, so it still wins with one array lost; `unfence` registers on them and `status` reads them as it does the other LUs' -r -F
complete -c prfence -n "__fish_prfence_using_subcommand fence" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand fence" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand fence" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand fence" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand status" -l key -d 'This node\'s key' -r
complete -c prfence -n "__fish_prfence_using_subcommand status" -l deadline -d 'Overall deadline in seconds for all LUs together; LUs still pending are reported as timed out (default 50, below Pacemaker\'s 60 s fence timeout)' -r
complete -c prfence -n "__fish_prfence_using_subcommand status" -l coordinator -d 'A coordinator LU, one device each (best its dm-multipath map), 3 or 5 of them on separate arrays, the same set on every node: `fence` then wins on a majority of them instead of on the arbiter LU, so it still wins with one array lost; `unfence` registers on them and `status` reads them as it does the other LUs' -r -F
complete -c prfence -n "__fish_prfence_using_subcommand status" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand status" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand status" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand status" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand agent" -l config -d 'The agent\'s TOML configuration (every setting: `man prfence-agent.toml`; the package installs a commented one as /etc/prfence/agent.toml)' -r -F
complete -c prfence -n "__fish_prfence_using_subcommand agent" -l status-file -d 'Write the status as JSON to FILE after every check (atomically replaced)' -r -F
complete -c prfence -n "__fish_prfence_using_subcommand agent" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand agent" -l check-config -d 'Validate the configuration and exit'
complete -c prfence -n "__fish_prfence_using_subcommand agent" -l once -d 'Look once at every LU, print the status as JSON and exit. Read-only: READ KEYS only, no PERSISTENT RESERVE OUT, no watchdog opened, no self-fence action. The paths count as registered when our key is listed once per path: an earlier session\'s leftover registration can stand in for a path that has none, which `prfence doctor` (READ FULL STATUS, also read-only) tells apart'
complete -c prfence -n "__fish_prfence_using_subcommand agent" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand agent" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand agent" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -l key -d 'This node\'s key (default: key.value of --config)' -r
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -l config -d 'Take the devices, and key.value if it is set, from the node agent\'s configuration file' -r -F
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -l deadline -d 'Overall deadline in seconds for all LUs together' -r
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -l coordinator -d 'A coordinator LU, one device each, as `fence --coordinator` names them: each is checked as an LU, and the set for its size (3 or 5), each on its own iSCSI target where that shows, every key of the data LUs registered on each, and this node\'s key on a majority' -r -F
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -l timeout -d 'Per-command timeout in seconds (default 10)' -r
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -l json -d 'Print JSON: one array with an object per device (admin commands), or one object with a report per LU (unfence, fence, status)'
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -s v -l verbose -d 'Log what is sent and retried on stderr (-v debug, -vv trace)'
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -s h -l help -d 'Print help'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "keys" -d 'List the registered keys (PR IN READ KEYS)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "reservation" -d 'Show the reservation, if any (PR IN READ RESERVATION)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "capabilities" -d 'Show what the device supports (PR IN REPORT CAPABILITIES)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "full-status" -d 'Show every registration with its initiator and port (PR IN READ FULL STATUS)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "register" -d 'Register a key on this path (REGISTER, or REGISTER AND IGNORE EXISTING KEY)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "unregister" -d 'Remove this path\'s registration (REGISTER with service action key 0)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "reserve" -d 'Take a reservation with a registered key (RESERVE)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "release" -d 'Give up a reservation this path holds (RELEASE)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "clear" -d 'Remove every registration and the reservation (CLEAR)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "preempt" -d 'Remove another key\'s registrations and take over its reservation (PREEMPT [AND ABORT])'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "register-move" -d 'Register a key for another initiator and move the reservation to it (REGISTER AND MOVE)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "unfence" -d 'Let this node write: register its key on every path of every LU (REGISTER AND IGNORE EXISTING KEY), reserve (wero) where no reservation exists, verify. The only command that registers a key that was preempted. Each LU is first added to fence_pr\'s record of this boot (/var/run/cluster.lus, or FENCE_PR_STORE\'s stem), so fence_pr\'s `on` refuses the node once it is fenced again'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "fence" -d 'Fence another node: remove its key from every LU (PREEMPT AND ABORT, or PREEMPT where the target refuses it) and verify. The first LU by identifier decides alone: if this node\'s key is gone there, no other LU is touched and the exit status is 4 (also when it vanishes there during the fence). fence never registers this node\'s key: an LU where it is gone is left alone'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "status" -d 'Is this node\'s key registered on all, some or none of the LUs? (Read only.)'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "agent" -d 'Run the node agent (watch or lease mode) from a configuration file'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "doctor" -d 'Is every LU ready to fence? Paths, PR support, capabilities, registrations and which paths carry this node\'s key, the reservation, orphans, with what to do about each problem. Read only: sends nothing but PERSISTENT RESERVE IN'
complete -c prfence -n "__fish_prfence_using_subcommand help; and not __fish_seen_subcommand_from keys reservation capabilities full-status register unregister reserve release clear preempt register-move unfence fence status agent doctor help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'

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
complete -c prfence -n "__fish_prfence_using_subcommand keys" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand reservation" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand capabilities" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand full-status" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand register" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand unregister" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand reserve" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand release" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand clear" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand preempt" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand register-move" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand unfence" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand fence" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand status" -f -a "(__prfence_devices)"
complete -c prfence -n "__fish_prfence_using_subcommand doctor" -f -a "(__prfence_devices)"
