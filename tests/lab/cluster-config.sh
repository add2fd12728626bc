#!/bin/bash
# The lab cluster's Pacemaker configuration (tests/lab_cluster.rs), applied on one node with
# Pacemaker's own tools, as an admin would without pcs or crmsh.
# Usage: cluster-config.sh AGENT   AGENT: fence_pr (device storage-fence) or fence_scsi (device
# scsi-fence, the name docs/pacemaker.md's migration replaces); the same parameters: fence_pr is a
# drop-in. LAB_HOSTS: the cluster's node names (default "node1 node2"). LAB_KEY_VALUE: fence_scsi's
# key_value (id or hash; unset: not given, which is id).
set -euo pipefail
agent=${1:?usage: cluster-config.sh fence_pr|fence_scsi}
case $agent in fence_scsi) id=scsi-fence ;; *) id=storage-fence ;; esac
devices=/dev/disk/by-id/lab-lun0,/dev/disk/by-id/lab-lun1
cibadmin --create --scope resources --xml-text "
<primitive id='$id' class='stonith' type='$agent'>
  <instance_attributes id='$id-params'>
    <nvpair id='$id-devices' name='devices' value='$devices'/>
    <nvpair id='$id-hosts' name='pcmk_host_list' value='${LAB_HOSTS:-node1 node2}'/>
    <nvpair id='$id-delay' name='pcmk_delay_max' value='4s'/>
    ${LAB_KEY_VALUE:+<nvpair id='$id-key-value' name='key_value' value='$LAB_KEY_VALUE'/>}
  </instance_attributes>
  <meta_attributes id='$id-meta'>
    <nvpair id='$id-provides' name='provides' value='unfencing'/>
  </meta_attributes>
  <operations>
    <op id='$id-monitor' name='monitor' interval='3600s'/>
  </operations>
</primitive>"
# pcmk_delay_max: each fencing waits a random 0-4 s first, so that in a split brain one side
# usually acts first (liveness, as two-node clusters are advised to). Safety never rests on it:
# the target lets only one PREEMPT AND ABORT win the arbiter LU, and fence_pr's tie-break keeps
# two fences that start together from crossing.
crm_attribute --type crm_config --name stonith-enabled --update true
# fence_scsi and fence_pr cut a node off its disks: "off" is the only fencing action they have
crm_attribute --type crm_config --name stonith-action --update off
# Emulated nodes can be slow to register a new device: a node may be asked to unfence itself before
# its fencer knows the device ("No fence device"). A failed unfencing is retried at the next
# transition; the recheck makes sure there is one soon.
crm_attribute --type crm_config --name cluster-recheck-interval --update 10s
crm_attribute --type rsc_defaults --name resource-stickiness --update 100
cibadmin --create --scope resources --xml-text "
<primitive id='counter' class='ocf' provider='lab' type='counter'>
  <instance_attributes id='counter-params'>
    <nvpair id='counter-device' name='device' value='/dev/disk/by-id/lab-lun0'/>
  </instance_attributes>
  <meta_attributes id='counter-meta'>
    <nvpair id='counter-requires' name='requires' value='unfencing'/>
  </meta_attributes>
  <operations>
    <op id='counter-monitor' name='monitor' interval='5s'/>
  </operations>
</primitive>"
# node1 first (the failover scenario freezes it); stickiness 100 > 50 keeps the service where
# it runs when node1 comes back
cibadmin --create --scope constraints --xml-text "
<rsc_location id='counter-prefers-node1' rsc='counter' node='node1' score='50'/>"
