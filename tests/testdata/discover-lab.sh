#!/bin/bash
# Lab guest script for tests/discover_lab.rs. Usage (inside the guest): discover-lab.sh TEST_BINARY
# Exports two LIO fileio LUNs over iSCSI (127.0.0.1:3260) to IQN …:nodea through two open-iscsi
# ifaces (two sessions = two paths per LUN) and to …:nodeb through one, builds a dm-multipath map
# (plain dmsetup: no udev in the guest, and multipath-tools finds no paths without it) over
# nodea's two paths to LUN 0, writes an MBR with one partition on nodea's LUN 1, then runs the
# ignored tests. Its console is in discover-lab.txt.
set -uo pipefail
bin=${1:?TEST_BINARY}
mkdir -p /run/lock/iscsi /etc/iscsi
modprobe sg
C=/sys/kernel/config/target
T=iqn.2026-11.lab:target; TPG=$C/iscsi/$T/tpgt_1
mkdir -p "$TPG"
for i in 0 1; do
  mkdir -p "$C/core/fileio_0/lun$i"
  echo "fd_dev_name=/tmp/lun$i.img,fd_dev_size=67108864" > "$C/core/fileio_0/lun$i/control"
  echo "lab-lun$i" > "$C/core/fileio_0/lun$i/wwn/vpd_unit_serial"
  echo 1 > "$C/core/fileio_0/lun$i/enable"
  mkdir -p "$TPG/lun/lun_$i"; ln -s "$C/core/fileio_0/lun$i" "$TPG/lun/lun_$i/lun$i"
done
mkdir -p "$TPG/np/127.0.0.1:3260"; echo 0 > "$TPG/attrib/authentication"
for n in nodea nodeb; do
  for i in 0 1; do
    mkdir -p "$TPG/acls/iqn.2026-11.lab:$n/lun_$i"; ln -s "$TPG/lun/lun_$i" "$TPG/acls/iqn.2026-11.lab:$n/lun_$i/m"
  done
done
echo 1 > "$TPG/enable"
echo "InitiatorName=iqn.2026-11.lab:nodea" > /etc/iscsi/initiatorname.iscsi
iscsid
for n in nodea nodea2 nodeb; do
  iscsiadm -m iface -I "$n" -o new >/dev/null
  iscsiadm -m iface -I "$n" -o update -n iface.initiatorname -v "iqn.2026-11.lab:${n%2}" >/dev/null
done
iscsiadm -m discovery -t st -p 127.0.0.1 -I nodea -I nodea2 -I nodeb >/dev/null
iscsiadm -m node -L all >/dev/null
for _ in $(seq 150); do   # the SCSI scan after login is asynchronous
  [ "$(ls /sys/class/iscsi_session/session*/device/target*/*/block 2>/dev/null | grep -c '^sd')" -ge 6 ] && break
  sleep 0.2
done
disks() {  # disks of nodea's sessions; $1 = LUN number or '*'
  for s in /sys/class/iscsi_session/session*; do
    [ "$(cat "$s/initiatorname")" = iqn.2026-11.lab:nodea ] || continue
    for b in "$s"/device/target*/*:$1/block/*; do echo "/dev/${b##*/}"; done
  done
}
LAB_NODE_DISKS=$(disks '*' | tr '\n' ' ')
LAB_NODE_SGS=$(for d in $LAB_NODE_DISKS; do echo "/dev/$(ls /sys/block/${d#/dev/}/device/scsi_generic/)"; done | tr '\n' ' ')
read -r p1 p2 <<<"$(disks 0 | tr '\n' ' ')"
size=$(cat /sys/block/${p1#/dev/}/size); w=$(cat /sys/block/${p1#/dev/}/device/wwid)
modprobe dm_multipath; modprobe dm_round_robin
dmsetup create --noudevsync mpatha --uuid "mpath-3${w#naa.}" \
  --table "0 $size multipath 0 0 1 1 round-robin 0 2 1 $(cat /sys/block/${p1#/dev/}/dev) 1000 $(cat /sys/block/${p2#/dev/}/dev) 1000"
LAB_MPATH=/dev/$(ls /sys/block/${p1#/dev/}/holders/)
# MBR: one Linux partition at LBA 2048, 8192 sectors.
part_disk=$(disks 1 | head -1)
printf '\x00\x00\x00\x00\x83\x00\x00\x00\x00\x08\x00\x00\x00\x20\x00\x00' | dd of="$part_disk" bs=1 seek=446 conv=notrunc status=none
printf '\x55\xaa' | dd of="$part_disk" bs=1 seek=510 conv=notrunc status=none
blockdev --rereadpt "$part_disk"
LAB_PARTITION=${part_disk}1
export LAB_NODE_DISKS LAB_NODE_SGS LAB_MPATH LAB_PARTITION
env | grep '^LAB_' | sort
dmsetup table; ls -l /sys/block/${LAB_MPATH#/dev/}/slaves/ /sys/class/block/${LAB_PARTITION#/dev/}
"$bin" --ignored --nocapture --test-threads 1
