#!/bin/bash
# Builds the lab guest from Debian packages only: Debian's current kernel package (downloaded and
# unpacked, never compiled) and a busybox initramfs carrying the modules a SCSI PR target needs.
# Installs missing host tools with apt-get (root). Cached: a second run downloads and rebuilds nothing.
# Usage: build.sh OUTDIR          LAB_KERNEL_PKG=linux-image-<version>-amd64 picks another kernel.
# LAB_KERNEL_SUITE=SUITE (e.g. unstable) takes the newest kernel of that Debian suite instead, from
# the mirror the host's apt already uses, through a private apt state in OUTDIR/apt (the host's apt
# configuration and lists are never touched).
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
out=${1:?usage: build.sh OUTDIR}; mkdir -p "$out"; out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
exec 9>"$out/.lock"; flock 9          # two suites building at once must not interleave

bash "$here/host-tools.sh"

. "$here/host-mirror.sh"   # host_mirror

# Without LAB_KERNEL_SUITE apt runs on the host's configuration (Debian 12's kernel); with it, on a
# private state in $out/apt that only knows SUITE/main from the host's mirror. The host's apt.conf.d
# still applies (proxies), its sources, preferences and lists do not.
suite=${LAB_KERNEL_SUITE:-}
apt=()
if [ -n "$suite" ]; then
  [[ $suite =~ ^[a-z0-9][a-z0-9.-]*$ ]] || { echo "lab: LAB_KERNEL_SUITE=$suite is not a Debian suite name" >&2; exit 1; }
  mirror=$(host_mirror)
  [ -n "$mirror" ] || { echo "lab: no deb entry for the host's suite in /etc/apt/sources.list{,.d}: cannot tell which Debian mirror serves $suite" >&2; exit 1; }
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -f "$keyring" ] || { echo "lab: $keyring is missing (package debian-archive-keyring)" >&2; exit 1; }
  ad=$out/apt; line="deb [arch=amd64 signed-by=$keyring target=Packages] $mirror $suite main"
  # a new mirror or suite makes the lists stale: start over
  [ "$(cat "$ad/sources.list" 2>/dev/null)" = "$line" ] || { rm -rf "$ad"; mkdir -p "$ad"; echo "$line" >"$ad/sources.list"; }
  mkdir -p "$ad/lists/partial" "$ad/cache/archives/partial" "$ad/preferences.d"
  # keep a package cache even where the host's apt.conf.d turns it off: it saves a second per run
  apt=(-o "Dir::Etc::sourcelist=$ad/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::lists=$ad/lists"
       -o "Dir::Cache=$ad/cache" -o Dir::Cache::pkgcache=pkgcache.bin -o Dir::Cache::srcpkgcache=
       -o "Dir::Etc::preferences=$ad/preferences" -o "Dir::Etc::preferencesparts=$ad/preferences.d"
       -o APT::Sandbox::User=root)
fi
updated=
apt_update() {
  [ -z "$suite" ] || echo "lab: apt-get update of $suite from $mirror (private state in $out/apt)" >&2
  apt-get "${apt[@]}" update -qq >&2; updated=1
}
kernel_pkg() { apt-cache "${apt[@]}" depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9].*\)/\1/p' | head -1 || true; }
resolve() {
  pkg=${LAB_KERNEL_PKG:-$(kernel_pkg)}
  if [ -z "$pkg" ] && [ -z "$updated" ]; then apt_update; pkg=$(kernel_pkg); fi
  [ -n "$pkg" ] || { echo "lab: apt-cache knows no linux-image-amd64 package${suite:+ in $suite}; check /etc/apt/sources.list" >&2; exit 1; }
  kv=${pkg#linux-image-}
  stamp="$pkg $(cat "$here/build.sh" "$here/init" | sha256sum | cut -c1-16)"
}
# The packages making up kernel $kv: $pkg and, transitively, what it Depends on named linux-*-$kv.
# Debian 12 has one (vmlinuz in boot/, modules in lib/modules); newer suites split linux-image-$kv
# into linux-binary-$kv (usr/lib/modules/$kv/vmlinuz), linux-modules-$kv and linux-base-$kv
# (modules.builtin, modules.order).
kernel_debs() {
  local all=("$pkg") i d
  for ((i = 0; i < ${#all[@]}; i++)); do
    for d in $(apt-cache "${apt[@]}" depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
                 --no-enhances "${all[i]}" 2>/dev/null | awk -v suf="-$kv" '/Depends: linux-/ {
                   n = $NF; if (length(n) > length(suf) && substr(n, length(n) - length(suf) + 1) == suf) print n }'); do
      [[ " ${all[*]} " == *" $d "* ]] || all+=("$d")
    done
  done
  echo "${all[@]}"
}
vmlinuz() { local f; for f in "kroot/boot/vmlinuz-$kv" "kroot/lib/modules/$kv/vmlinuz"; do [ -f "$f" ] && { echo "$f"; return; }; done; }
unpacked() { [ -n "$(vmlinuz)" ] && [ -f "kroot/lib/modules/$kv/modules.dep" ]; }

resolve
if [ -f "$out/initrd.gz" ] && [ -f "$out/vmlinuz" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "lab: guest cached in $out (kernel $kv)" >&2; exit 0
fi
cd "$out"
# Before downloading from a suite, refresh its lists: the kernel they name may be gone from the mirror.
if ! unpacked && [ -n "$suite" ] && [ -z "$updated" ]; then apt_update; resolve; fi
if ! unpacked; then
  debs=$(kernel_debs)
  echo "lab: downloading kernel packages $debs" >&2
  rm -rf kroot ./*.deb
  # shellcheck disable=SC2086
  apt-get "${apt[@]}" download $debs >&2 2>/dev/null || { echo "lab: apt-get download $debs failed" >&2; exit 1; }
  for d in ./*.deb; do dpkg -x "$d" kroot; done; rm -f ./*.deb
  # newer packages put the modules (and vmlinuz) in usr/lib/modules: merge /usr as a Debian root does
  if [ ! -e kroot/lib ] && [ -d kroot/usr/lib/modules ]; then ln -s usr/lib kroot/lib; fi
  [ -n "$(vmlinuz)" ] || { echo "lab: no vmlinuz for $kv in $debs (boot/vmlinuz-$kv or lib/modules/$kv/vmlinuz; dpkg -c shows where)" >&2; exit 1; }
  [ -d "kroot/lib/modules/$kv/kernel" ] || { echo "lab: no modules for $kv in $debs (dpkg -c shows where)" >&2; exit 1; }
  depmod -b kroot "$kv"
fi
src=kroot/lib/modules/$kv
rm -rf initrd; mkdir -p initrd/{bin,proc,sys,dev,lower,rw,root,var/target,lib/modules/$kv}
cp "$(command -v busybox)" initrd/bin/busybox
for a in sh mount modprobe mkdir cp sed cat chroot poweroff sleep ln echo; do ln -s busybox "initrd/bin/$a"; done
# loaded at boot; the extra ones are only carried, for tests to modprobe when they need them
boot="crc32c_generic virtio_pci 9pnet_virtio 9p overlay configfs target_core_mod target_core_file
      target_core_iblock tcm_loop iscsi_target_mod iscsi_tcp sd_mod sg"
# nf_tables: the faults suite hangs one node's iSCSI path by dropping its packets; sch_prio, sch_netem,
# cls_u32: it delays one node's path; veth: the cluster suite's link, bridge: the quorum suite's
# switch between three or more nodes; ext4: a partition the agent
# suite mounts; dm_service_time, scsi_dh_alua: the path selector and hardware handler multipathd
# picks for LIO's LUs (ALUA)
extra="scsi_debug dm_multipath dm_round_robin dm_service_time scsi_dh_alua softdog target_core_pscsi target_core_user nf_tables veth bridge
       nvmet nvme_loop nvme_fabrics nvme_core nvmet_tcp nvme_tcp sch_prio sch_netem cls_u32 ext4"
# Wanted only where the kernel has them. crc32c_generic: 6.1's iSCSI target and initiator hash their
# CRC32C digests through the crypto API (crypto_alloc_ahash("crc32c")), so without this module login
# fails with "crypto_alloc_ahash() failed". From 6.14 both call the built-in crc32c() library and
# the module is gone (the crypto API's crc32c became crc32c_cryptoapi); checked below.
# nvmet, nvme_loop: lab_nvme's target and its loopback fabric (Debian 12's 6.1 builds no nvme_loop,
# and its nvmet has no reservations: that suite runs on a newer suite's kernel, see host.rs);
# nvmet_tcp, nvme_tcp: the one NVMe path it hangs (a loop path cannot hang, a TCP one can).
optional="crc32c_generic nvmet nvme_loop nvme_fabrics nvme_core nvmet_tcp nvme_tcp"
# The closure of the wanted modules over modules.dep. Prints "missing NAME" for a wanted module that
# is neither a module nor built in, "absent NAME" for such an optional one.
closure=$(awk -v want="$boot $extra" -v optional=" $optional " -v builtin="$src/modules.builtin" '
  function base(k) { sub(/.*\//, "", k); sub(/\.ko.*/, "", k); gsub(/-/, "_", k); return k }
  function add(k,   d, n, j) { if (k in need) return; need[k] = 1; n = split(dep[k], d, " "); for (j = 1; j <= n; j++) add(d[j]) }
  { k = $1; sub(/:$/, "", k); $1 = ""; dep[k] = $0; by[base(k)] = k }
  END {
    while ((getline l < builtin) > 0) inkernel[base(l)] = 1
    n = split(want, w, /[ \n]+/)
    for (i = 1; i <= n; i++) if (w[i] != "") {
      if (w[i] in by) add(by[w[i]])
      else if (!(w[i] in inkernel)) print (index(optional, " " w[i] " ") ? "absent " : "missing ") w[i]
    }
    for (k in need) print k
  }' "$src/modules.dep")
if grep -q '^missing ' <<<"$closure"; then echo "lab: kernel $kv lacks modules: $(sed -n 's/^missing //p' <<<"$closure" | xargs)" >&2; exit 1; fi
absent=$(sed -n 's/^absent //p' <<<"$closure" | xargs); closure=$(grep -v '^absent ' <<<"$closure")
plain() { sed 's/\.ko\.[a-z]*/.ko/g'; }   # busybox modprobe loads uncompressed modules only
for k in $closure; do
  d=initrd/lib/modules/$kv/$(plain <<<"$k"); mkdir -p "$(dirname "$d")"
  case $k in *.xz) xz -dc "$src/$k" >"$d";; *.zst) zstd -qdc "$src/$k" >"$d";; *.gz) gzip -dc "$src/$k" >"$d";; *) cp "$src/$k" "$d";; esac
done
if [[ " $absent " == *" crc32c_generic "* ]]; then
  # without it, iSCSI works only if no carried iSCSI module still asks the crypto API for the digest
  users=$(find "initrd/lib/modules/$kv" -name '*iscsi*.ko' -exec grep -l crypto_alloc_ahash {} + | xargs -rn1 basename | xargs || true)
  [ -z "$users" ] || { echo "lab: kernel $kv has no crc32c_generic module but $users hash CRC32C through the crypto API" >&2; exit 1; }
  echo "lab: kernel $kv has no crc32c_generic module; its iSCSI modules use the crc32c() library" >&2
fi
cp "$src"/modules.{order,builtin,builtin.modinfo} "initrd/lib/modules/$kv/"
# the binary index too: kmod's modprobe in the guest wants it, and depmod is slow under TCG
depmod -b initrd "$kv"
for m in $boot; do grep -q "/$m.ko:\|/${m//_/-}.ko:" "initrd/lib/modules/$kv/modules.dep" && printf '%s ' "$m"; done >initrd/modules
cp "$here/init" initrd/init; chmod +x initrd/init
(cd initrd && find . | cpio -o -H newc 2>/dev/null | gzip -1) >initrd.gz.new && mv initrd.gz.new initrd.gz
cp "$(vmlinuz)" vmlinuz
echo "$stamp" >stamp
echo "lab: guest built in $out (kernel $kv)" >&2
