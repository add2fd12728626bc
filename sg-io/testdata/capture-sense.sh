#!/bin/bash
# Lab guest script: captures real sense data from LIO (iSCSI) and scsi_debug with sg3_utils, for
# sg-io's unit tests (result: lab-capture.txt), and runs sg-io's `smoke` example against the same
# devices. Needs lio-two-initiators.sh (from the lab prototype) beside it and the smoke binary at
# /var/tmp/sgio/smoke (`cargo build -p sg-io --example smoke`). Each step is announced "=== STEP".
set -u
here=$(dirname "$0")
N=1 "$here/lio-two-initiators.sh" > /run/map
A=$(awk '$1=="nodea"{print $2; exit}' /run/map); B=$(awk '$1=="nodeb"{print $2; exit}' /run/map)
echo "map: A=$A B=$B"
step() { echo "=== STEP $*"; }
step "LIO A first TUR (power-on UA expected)"; sg_turs -vvv "$A"
step "LIO A second TUR"; sg_turs -vvv "$A"
step "LIO B first TUR via sg_raw"; sg_raw -vvv "$B" 00 00 00 00 00 00
step "LIO B second TUR via sg_raw"; sg_raw -vvv "$B" 00 00 00 00 00 00
sg_persist -n --out --register --param-sark=0xa "$A"
sg_persist -n --out --register --param-sark=0xb "$B"
sg_persist -n --out --reserve --param-rk=0xa --prout-type=5 "$A"
step "LIO B PR IN service action 5 (invalid field in CDB expected)"; sg_raw -vvv -r 255 "$B" 5e 05 00 00 00 00 00 00 ff 00
step "LIO B PR OUT register with wrong key (reservation conflict expected)"; sg_persist -vvv -n --out --register --param-rk=0x77 --param-sark=0x78 "$B"
sg_persist -n --out --preempt-abort --param-rk=0xb --param-sark=0xa --prout-type=5 "$B"
head -c 512 /dev/zero > /run/zero512
step "LIO A WRITE(10) after preempt (reservation conflict expected)"; sg_raw -vvv -s 512 -i /run/zero512 "$A" 2a 00 00 00 00 00 00 00 01 00 || true
step "LIO A WRITE(10) after preempt again"; sg_raw -vvv -s 512 -i /run/zero512 "$A" 2a 00 00 00 00 00 00 00 01 00
step "LIO A TUR after preempt (2Ah/05h expected)"; sg_turs -vvv "$A"
step "LIO A TUR after preempt via sg_raw"; sg_raw -vvv "$A" 00 00 00 00 00 00
step "LIO A WRITE(10) after the UA (reservation conflict expected)"; sg_raw -vvv -s 512 -i /run/zero512 "$A" 2a 00 00 00 00 00 00 00 01 00
step "smoke (sg-io) on A B with write: A conflict expected"; /var/tmp/sgio/smoke --write "$A" "$B"
step "LIO A unknown opcode 0xff"; sg_raw -vvv "$A" ff 00 00 00 00 00
modprobe sg && sleep 1
step "sg devices"; ls -l /dev/sg* ; for s in /sys/class/scsi_generic/*; do echo "$s -> $(ls $s/device/block 2>/dev/null)"; done
SGA=/dev/$(ls /sys/block/${A#/dev/}/device/scsi_generic/)
step "LIO A TUR via $SGA"; sg_raw -vvv "$SGA" 00 00 00 00 00 00
modprobe scsi_debug dev_size_mb=8
for _ in $(seq 50); do D=$(for b in /sys/block/sd*; do grep -q scsi_debug $b/device/model 2>/dev/null && echo /dev/${b##*/}; done | head -1); [ -n "$D" ] && break; sleep 0.2; done
echo "scsi_debug: $D"
step "smoke (sg-io) on scsi_debug and sg node"; /var/tmp/sgio/smoke "$D" "$SGA"; /var/tmp/sgio/smoke --write "$D"
step "scsi_debug first TUR"; sg_raw -vvv "$D" 00 00 00 00 00 00
step "scsi_debug second TUR"; sg_raw -vvv "$D" 00 00 00 00 00 00
step "scsi_debug PR IN read keys (invalid opcode expected)"; sg_raw -vvv -r 255 "$D" 5e 00 00 00 00 00 00 00 ff 00
step "scsi_debug PR IN via sg_persist"; sg_persist -vvv -n -k "$D"
P=/sys/bus/pseudo/drivers/scsi_debug
echo "opts=$(cat $P/opts) dsense=$(cat $P/dsense)"
echo 2 > $P/opts
step "scsi_debug READ(10) lba 0x1234 medium error, fixed"; sg_raw -vvv -r 512 "$D" 28 00 00 00 12 34 00 00 01 00
echo 1 > $P/dsense
step "scsi_debug READ(10) lba 0x1234 medium error, descriptor"; sg_raw -vvv -r 512 "$D" 28 00 00 00 12 34 00 00 01 00
echo 0 > $P/opts
step "scsi_debug PR IN descriptor (invalid opcode expected)"; sg_raw -vvv -r 255 "$D" 5e 00 00 00 00 00 00 00 ff 00
step "scsi_debug INQUIRY bad field descriptor"; sg_raw -vvv -r 255 "$D" 12 01 77 00 ff 00
echo 0 > $P/dsense
step "scsi_debug INQUIRY bad field fixed"; sg_raw -vvv -r 255 "$D" 12 01 77 00 ff 00
step "sg_reset -d scsi_debug"; sg_reset -v -d "$D"
step "scsi_debug TUR after device reset"; sg_raw -vvv "$D" 00 00 00 00 00 00
step "scsi_debug TUR after device reset again"; sg_raw -vvv "$D" 00 00 00 00 00 00
echo 1 > $P/dsense; sg_reset -d "$D"
step "scsi_debug TUR after device reset, descriptor"; sg_raw -vvv "$D" 00 00 00 00 00 00
step "smoke after reset (descriptor sense UA expected)"; sg_reset -d "$D"; /var/tmp/sgio/smoke "$D"
echo 0 > $P/dsense
step "sg_reset -d LIO A"; sg_reset -v -d "$A"
step "LIO B TUR after LUN reset from A"; sg_raw -vvv "$B" 00 00 00 00 00 00
step "LIO A TUR after LUN reset from A"; sg_raw -vvv "$A" 00 00 00 00 00 00
step "LIO A TUR again"; sg_raw -vvv "$A" 00 00 00 00 00 00
exit 0
