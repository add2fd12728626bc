#!/bin/bash
# Installs the host tools the tests need and a fresh Debian 12 lacks, with apt-get (root), with a
# one-line message. The lab guest runs the host's binaries, so its tools are installed here too.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# command:package pairs
need=(qemu-system-x86_64:qemu-system-x86 busybox:busybox-static depmod:kmod cpio:cpio xz:xz-utils
      iscsiadm:open-iscsi sg_persist:sg3-utils fence_scsi:fence-agents targetcli:targetcli-fb
      dbus-daemon:dbus-daemon xmllint:libxml2-utils nft:nftables)
missing=(); for p in "${need[@]}"; do command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}"); done
((${#missing[@]})) || exit 0
if ((EUID != 0)); then echo "lab: missing packages ${missing[*]}: run as root (the lab installs them with apt-get)" >&2; exit 1; fi
exec 9>/var/lock/prfence-host-tools.lock; flock 9   # test binaries may ask at the same time
echo "lab: installing missing packages with apt-get: ${missing[*]}" >&2
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
