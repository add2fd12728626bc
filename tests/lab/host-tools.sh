#!/bin/bash
# Installs the host tools the tests need and a fresh Debian 12 lacks, with apt-get (root), with a
# one-line message. The lab guest runs the host's binaries, so its tools are installed here too
# (systemd too: the booted node's guest runs the host's /lib/systemd/systemd as PID 1).
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# command:package pairs
need=(qemu-system-x86_64:qemu-system-x86 busybox:busybox-static depmod:kmod cpio:cpio xz:xz-utils
      iscsiadm:open-iscsi sg_persist:sg3-utils fence_scsi:fence-agents targetcli:targetcli-fb
      dbus-daemon:dbus-daemon xmllint:libxml2-utils nft:nftables tc:iproute2 corosync:corosync
      corosync-cmapctl:corosync pacemakerd:pacemaker cibadmin:pacemaker-cli-utils
      crm_mon:pacemaker-cli-utils dpkg-shlibdeps:dpkg-dev rpmbuild:rpm strip:binutils man:man-db
      nvme:nvme-cli pcs:pcs crm:crmsh multipathd:multipath-tools udevadm:udev
      promtool:prometheus systemctl:systemd journalctl:systemd curl:curl pkill:procps
      logger:bsdutils setpriv:util-linux)
missing=(); for p in "${need[@]}"; do command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}"); done
# the status document's schema is checked with Debian's python3 and its jsonschema module
/usr/bin/python3 -c 'import jsonschema' 2>/dev/null || missing+=(python3-jsonschema)
((${#missing[@]})) || exit 0
if ((EUID != 0)); then echo "lab: missing packages ${missing[*]}: run as root (the lab installs them with apt-get)" >&2; exit 1; fi
exec 9>/var/lock/prfence-host-tools.lock; flock 9   # test binaries may ask at the same time
echo "lab: installing missing packages with apt-get: ${missing[*]}" >&2
apt-get update -qq >&2
# Installing corosync, pacemaker and prometheus (for promtool) must not start them on the host (the lab runs them in the guest
# only): without a policy-rc.d of its own, the host gets one that refuses every start for the
# duration of the install (invoke-rc.d and deb-systemd-invoke obey it).
policy=/usr/sbin/policy-rc.d; own_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# prfence lab: no service starts while host-tools.sh installs packages\nexit 101\n' >"$policy"
  chmod 755 "$policy"; own_policy=1
fi
status=0
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
[ -z "$own_policy" ] || rm -f "$policy"
exit "$status"

