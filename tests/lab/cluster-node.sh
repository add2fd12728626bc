#!/bin/bash
# PID 1 of one lab cluster node (tests/lab_cluster.rs): run in its own network namespace (made by
# the test, with one end of the veth link) by `unshare --mount --uts --ipc --pid --fork`. Gives
# the node its own /run, /dev/shm, /var/lib/{pacemaker,corosync}, /etc/corosync, logs and its own
# stable names for the shared LUNs, then runs corosync and Pacemaker in the foreground.
# Usage: cluster-node.sh NAME LOG_DIR DEVICE...   (DEVICE i becomes /dev/disk/by-id/lab-lun<i>)
# Environment: LAB_COROSYNC_CONF (the file to install as /etc/corosync/corosync.conf), LAB_PRFENCE
# (the prfence binary whose `agent` watches this node's registrations), LAB_NODE_AGENT: "lab"
# (default) runs that agent with the lab's own configuration; "units" starts instead what an admin
# enabled (/etc/systemd/system/multi-user.target.wants) through the lab's systemctl
# (tests/lab/bin/systemctl), as a booting node would.
set -euo pipefail
name=$1 logs=$2; shift 2
conf=$(cat "$LAB_COROSYNC_CONF")   # read before /run is replaced
hostname "$name"
mount --make-rprivate /
# Pacemaker's fence-reaction=panic (README's quick start) resets the machine with sysrq 'b' and
# then reboot(2): here sysrq would reset the whole guest, so it writes into /dev/null, and
# reboot(2) in this PID namespace takes down this node alone, as the agent's self-fence does.
[ -e /proc/sysrq-trigger ] && mount --bind /dev/null /proc/sysrq-trigger
# the node's logs stay readable from the guest's root namespace after the node is gone
mkdir -p "$logs" /var/log/cluster; mount --bind "$logs" /var/log/cluster
for d in /run /dev/shm /var/lib/pacemaker /var/lib/corosync /etc/corosync /var/log/pacemaker \
         /var/log/corosync /dev/disk; do
  mkdir -p "$d"; mount -t tmpfs -o mode=0755 "lab-$name" "$d"
done
mkdir -p /var/lib/pacemaker/{cib,pengine,blackbox,cores} /var/log/pacemaker /run/crm
chown -R hacluster:haclient /var/lib/pacemaker /var/log/pacemaker /run/crm /var/log/cluster
chmod 0750 /var/lib/pacemaker/{cib,pengine,blackbox,cores}; chmod 0770 /var/log/pacemaker
# The controller starts from this CIB instead of an empty one for one setting: dc-deadtime 5 s.
# Pacemaker's default, 20 s, is how long a starting controller waits to hear of a DC before it
# calls an election: two nodes started together spent it idle in every cluster start. A node
# that joins a running cluster takes the DC's CIB (a higher epoch) and never waits. Unsigned (no
# cib.xml.sig): Pacemaker reads it and warns.
cat >/var/lib/pacemaker/cib/cib.xml <<'EOF_CIB'
<cib validate-with="pacemaker-3.9" epoch="1" num_updates="0" admin_epoch="0">
  <configuration>
    <crm_config>
      <cluster_property_set id="cib-bootstrap-options">
        <nvpair id="cib-bootstrap-options-dc-deadtime" name="dc-deadtime" value="5s"/>
      </cluster_property_set>
    </crm_config>
    <nodes/>
    <resources/>
    <constraints/>
  </configuration>
  <status/>
</cib>
EOF_CIB
chown hacluster:haclient /var/lib/pacemaker/cib/cib.xml; chmod 0600 /var/lib/pacemaker/cib/cib.xml
chmod 1777 /dev/shm
mkdir -p /dev/disk/by-id
i=0; for dev in "$@"; do ln -s "$dev" "/dev/disk/by-id/lab-lun$i"; i=$((i + 1)); done
printf '%s\n' "$conf" >/etc/corosync/corosync.conf
ip link set lo up
echo "$name: namespaces ready" >>/var/log/cluster/node.log
corosync -f >>/var/log/cluster/corosync.out 2>&1 &
# polled every 0.5 s: under emulation each poll is a process start that corosync's own start
# competes with
for _ in $(seq 120); do corosync-cfgtool -s >/dev/null 2>&1 && break; sleep 0.5; done
export PCMK_logfile=/var/log/cluster/pacemaker.log PCMK_debug=no
pacemakerd -f >>/var/log/cluster/pacemakerd.out 2>&1 &
if [ "${LAB_NODE_AGENT:-lab}" = units ]; then
  # Started 10 s after pacemakerd, for the reason given below.
  (
    sleep 10
    for unit in /etc/systemd/system/multi-user.target.wants/prfence-agent.service; do
      [ -e "$unit" ] && systemctl start "$(basename "$unit")"
    done
  ) >>/var/log/cluster/node.log 2>&1 &
  echo "$name: corosync, pacemakerd and the enabled units started" >>/var/log/cluster/node.log
  while :; do wait || sleep 1; done
fi
# The node agent in watch mode, as fence_scsi_check would run beside fence_scsi: fence_scsi's key
# for this node (asked of corosync, like fence_pr's), every shared LUN. Once its key is gone it
# self-fences with reboot(2), which in this PID namespace kills the namespace's init: the whole
# node goes down at once, as a reboot would take a real one. No watchdog: softdog would reset the
# whole guest.
mkdir -p /run/prfence
{
  echo 'mode = "watch"'
  echo 'check_interval = "1s"'
  # corosync-cmapctl (the key) is bounded by it too; a node starting under emulation needs more
  echo 'command_timeout = "5s"'
  for ((j = 0; j < i; j++)); do printf '[[device]]\npath = "/dev/disk/by-id/lab-lun%d"\n' "$j"; done
  printf '[key]\nderive = "fence_scsi"\nnode = "%s"\n' "$name"
  [ -z "${LAB_KEY_VALUE:-}" ] || printf 'key_value = "%s"\n' "$LAB_KEY_VALUE"
  printf '[watch]\ngrace = "20s"\nmissing_confirmations = 2\n'
  printf '[self_fence]\nreboot = true\n'
  printf '[log]\ntarget = "stderr"\n'
  printf '[systemd]\nnotify = false\n'
} >/run/prfence/agent.toml
# Restarted as its unit restarts it (Restart=on-failure, RestartSec=2s,
# RestartPreventExitStatus=86): an agent that starts while corosync is still too slow to answer
# its key query exits and comes back.
# It has nothing to judge before fence_pr's unfencing registers its key, which Pacemaker does only
# after its controller joined: started 10 s after pacemakerd, it leaves the emulated CPU to
# Pacemaker's own start, which on Linux 7.2 was otherwise slow enough for pacemakerd to kill its
# controller as unresponsive (and the other node to fence this one for it).
(
  sleep 10
  while :; do
    status=0
    "$LAB_PRFENCE" agent --config /run/prfence/agent.toml --status-file /run/prfence/status.json \
      >>/var/log/cluster/agent.log 2>&1 || status=$?
    echo "agent exited with status $status" >>/var/log/cluster/agent.log
    [ "$status" != 0 ] && [ "$status" != 86 ] || break
    sleep 2
  done
) &
echo "$name: corosync, pacemakerd and prfence agent started" >>/var/log/cluster/node.log
# PID 1: reap orphans (the counter's writer, fence agents' children) until killed
while :; do wait || sleep 1; done
