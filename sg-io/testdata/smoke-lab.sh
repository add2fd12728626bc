#!/bin/bash
# Lab guest script: runs sg-io's smoke example (/var/tmp/sgio/smoke) against LIO LUNs through sd and
# sg nodes, a non-SCSI file, and a scsi_debug LUN that never answers (to see a timed-out command).
# Needs lio-two-initiators.sh (lab prototype) beside it. Its console is in smoke-lab.txt.
set -u
here=$(dirname "$0")
N=1 "$here/lio-two-initiators.sh" > /run/map
A=$(awk '$1=="nodea"{print $2; exit}' /run/map); B=$(awk '$1=="nodeb"{print $2; exit}' /run/map)
modprobe sg; sleep 0.5
SGB=/dev/$(ls /sys/block/${B#/dev/}/device/scsi_generic/)
step() { echo "=== STEP $*"; }
step "smoke A, B(sg) with PR register through read-only fds"; /var/tmp/sgio/smoke --pr-register "$A" "$SGB"; echo "exit=$?"
step "smoke on non-SCSI files"; /var/tmp/sgio/smoke /dev/null /dev/does-not-exist; echo "exit=$?"
modprobe scsi_debug dev_size_mb=8
for _ in $(seq 50); do D=$(for b in /sys/block/sd*; do grep -q scsi_debug $b/device/model 2>/dev/null && echo /dev/${b##*/}; done | head -1); [ -n "$D" ] && break; sleep 0.2; done
P=/sys/bus/pseudo/drivers/scsi_debug
echo 1 > $P/every_nth; echo 4 > $P/opts
step "smoke on scsi_debug ignoring every command, TUR timeout 2000 ms"
start=$(date +%s.%N); timeout 120 /var/tmp/sgio/smoke --tur-timeout-ms 2000 "$D"; echo "exit=$? elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null)"
echo 0 > $P/opts; echo 0 > $P/every_nth
step "smoke on scsi_debug after recovery"; /var/tmp/sgio/smoke "$D"; echo "exit=$?"
dmesg | tail -15
exit 0
