#!/bin/bash
# kiln against the PyTorch peer in one call: each build in BUILDS (default
# sched) on the rows in ROWS (MODEL:BATCH words, seq 1024; default the
# issue's four rows and the pilot's shape), `torch_peer.py` (torch.compile,
# default and reduce-overhead) on the same shapes, then kiln's rows again.
# $G holds the builds' .gz and torch_peer.py (the design material's bench/).
# tok/s and peak GiB a row; output under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/peer}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
BUILDS=${BUILDS:-sched}
ROWS=${ROWS:-small:32 small:64 base:16 base:32 small:8}
unpack $BUILDS
rows() {
  local s r
  for s in $BUILDS; do for r in $ROWS; do set -- ${r/:/ }
    echo "$s $1 $2 $(kbench $s $1 $2)"
  done; done
}
plan=$(for r in $ROWS; do printf '%s:1024,' $r; done); plan=${plan%,}
log start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
log kiln; rows | tee $OUT/kiln_before.txt
log peer
peer 330 $plan ${MODES:-compile reduce-overhead} | tee $OUT/peer.jsonl
log kiln again; rows | tee $OUT/kiln_after.txt
log end
