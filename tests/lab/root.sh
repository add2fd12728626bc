#!/bin/bash
# Builds the root file system of a lab node running another Debian release than the host's
# (Debian 13 "trixie": Pacemaker 3.0, pcs 0.12, multipath-tools 0.11, fence-agents 4.16), from
# Debian's packages only, from the mirror the host's apt already uses: a minbase debootstrap, then
# apt-get inside it for the cluster stack and the tools the tests run. Cached: OUTDIR/root is built
# once per suite and package list (OUTDIR/root.stamp) and replaced whole, never patched.
# The guest mounts it read-only, below a tmpfs, in place of the host's root (tests/lab/init).
# Usage: root.sh OUTDIR SUITE
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
out=${1:?usage: root.sh OUTDIR SUITE}; suite=${2:?usage: root.sh OUTDIR SUITE}
[[ $suite =~ ^[a-z0-9][a-z0-9.-]*$ ]] || { echo "lab: $suite is not a Debian suite name" >&2; exit 1; }
mkdir -p "$out"; out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
exec 9>"$out/.root.lock"; flock 9
. "$here/host-mirror.sh"   # host_mirror

# What a node runs and what the tests call inside it (host-tools.sh's list, less what only the
# host uses: qemu, the initramfs and packaging tools). Recommends are skipped, as on a lean node.
packages=(systemd systemd-sysv udev dbus kmod iproute2 nftables procps util-linux bsdutils
          ca-certificates curl python3-jsonschema libxml2-utils man-db
          open-iscsi sg3-utils multipath-tools nvme-cli targetcli-fb
          corosync pacemaker pacemaker-cli-utils pcs crmsh fence-agents-scsi fence-agents-mpath)
stamp="$suite ${packages[*]} (no apt binary cache)"
# what the node runs, for the run's log (and README's support matrix)
versions() {
  dpkg-query --admindir="$out/root/var/lib/dpkg" -W -f '${Package} ${Version}, ' pacemaker corosync pcs \
    crmsh multipath-tools open-iscsi sg3-utils fence-agents-scsi systemd | sed 's/, $//'
}
if [ "$(cat "$out/root.stamp" 2>/dev/null)" = "$stamp" ] && [ -x "$out/root/usr/sbin/corosync" ]; then
  echo "lab: $suite node root: $(versions)" >&2
  exit 0
fi

mirror=$(host_mirror)
[ -n "$mirror" ] || { echo "lab: no deb entry for the host's suite in /etc/apt/sources.list{,.d}: cannot tell which Debian mirror serves $suite" >&2; exit 1; }
if ! command -v debootstrap >/dev/null; then
  ((EUID == 0)) || { echo "lab: debootstrap is missing: run as root (the lab installs it with apt-get)" >&2; exit 1; }
  echo "lab: installing debootstrap with apt-get" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

start=$SECONDS
new=$out/root.new
rm -rf "$new" "$out/root.stamp"
echo "lab: debootstrap $suite from $mirror into $new" >&2
debootstrap --variant=minbase "$suite" "$new" "$mirror" >"$out/root.log" 2>&1 \
  || { tail -20 "$out/root.log" >&2; echo "lab: debootstrap of $suite failed (whole log: $out/root.log)" >&2; exit 1; }

# apt inside the new root: no service starts while packages install (policy-rc.d), /proc for the
# maintainer scripts that read it, unmounted whatever happens
printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"; chmod 755 "$new/usr/sbin/policy-rc.d"
mount -t proc proc "$new/proc"
trap 'umount "$new/proc" 2>/dev/null || true' EXIT
echo "deb $mirror $suite main" >"$new/etc/apt/sources.list"
in_root() { chroot "$new" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
echo "lab: apt-get install in the $suite root: ${packages[*]}" >&2
{ in_root apt-get update -qq && in_root apt-get install -y -q --no-install-recommends "${packages[@]}" \
    && in_root apt-get -f install -y -q && in_root apt-get clean; } >>"$out/root.log" 2>&1 \
  || { tail -30 "$out/root.log" >&2; echo "lab: installing the $suite packages failed (whole log: $out/root.log)" >&2; exit 1; }
# nothing left half configured (a package that needs another's postinst)
if in_root dpkg --audit | grep -q .; then
  in_root dpkg --audit >&2; echo "lab: packages left unconfigured in the $suite root" >&2; exit 1
fi
umount "$new/proc"; trap - EXIT
rm -f "$new/usr/sbin/policy-rc.d"
# apt keeps no binary package cache, as in Debian's container images (and CI's host): an
# `apt install ./prfence.deb` in a test would otherwise leave a rewritten one behind
printf 'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n' >"$new/etc/apt/apt.conf.d/docker-clean"
rm -rf "$out/root"; mv "$new" "$out/root"
echo "$stamp" >"$out/root.stamp"
echo "lab: $suite root ready in $((SECONDS - start)) s ($(du -sh "$out/root" | cut -f1)): $(versions)" >&2
