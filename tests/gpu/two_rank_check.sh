#!/usr/bin/env bash
# The device engine's two-rank check: two comm ranks as two processes of `WORKER check` (each
# exits non-zero on any failed check), whose outputs must then be the same bits. Run by
# run_device_checks.sh on a GPU and by meson on the CPU emulation (gpu_two_ranks_emulated).
# NCCL_HOSTID differs per process so that NCCL treats them as two hosts even on one GPU.
#   two_rank_check.sh WORKER [OUTDIR]
set -u
W=$1
OUTDIR=${2:-$(mktemp -d)}
id=$(mktemp -u)
for r in 0 1; do
  NCCL_HOSTID=lowrank-host$r timeout 300 "$W" check $r 2 "$id" "$OUTDIR/out$r.bin" &
done
wait %1; rc0=$?
wait %2; rc1=$?
rm -f "$id"
[ $rc0 = 0 ] && [ $rc1 = 0 ] || { echo "FAILED: two-rank check exited $rc0/$rc1"; exit 1; }
cmp -s "$OUTDIR/out0.bin" "$OUTDIR/out1.bin" || { echo "FAILED: outputs differ between ranks"; exit 1; }
echo "two-rank check passed; outputs bit-identical on both ranks"
