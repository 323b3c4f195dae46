#!/bin/bash
# kiln against the PyTorch peer in one call: each build in BUILDS (default
# sched) on the rows in ROWS (MODEL:BATCH words, seq 1024; default the
# issue's four rows and the pilot's shape), `torch_peer.py` (torch.compile,
# default and reduce-overhead) on the same shapes, then kiln's rows again.
# $G holds the builds' .gz and torch_peer.py (the design material's bench/).
# VARIANTS adds builds that are a build run with settings, NAME:BUILD:ENV
# words (sched-serial:sched:KILN_CUDA_OVERLAP=off). The SM clock and the
# power are sampled throughout (clocks.txt: their medians under load for
# kiln before, the peer and kiln after). tok/s and peak GiB a row; output
# under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/peer}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
BUILDS=${BUILDS:-sched}
ROWS=${ROWS:-small:32 small:64 base:16 base:32 small:8}
unpack $BUILDS
BUILDS="$BUILDS $(variants $VARIANTS)"
rows() {
  local s r
  for s in $BUILDS; do for r in $ROWS; do set -- ${r/:/ }
    echo "$s $1 $2 $(kbench $s $1 $2)"
  done; done
}
plan=$(for r in $ROWS; do printf '%s:1024,' $r; done); plan=${plan%,}
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
clocks_start
log kiln; clocks_phase "kiln before"; rows | tee $OUT/kiln_before.txt
log peer; clocks_phase peer
peer 330 $plan ${MODES:-compile reduce-overhead} | tee $OUT/peer.jsonl
log kiln again; clocks_phase "kiln after"; rows | tee $OUT/kiln_after.txt
clocks_summary
log end
