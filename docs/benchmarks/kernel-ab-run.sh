#!/bin/bash
# A kernel change against the build before it, on the GPU host, in one call:
# the tests named by TESTS (native; SM80_TESTS with the forced sm_80 build),
# `sched verify` on the head_dim 64 golden in bf16 (native and sm_80), the
# 200-step loss curve six times, then `sched bench` at small 32, the pilot's
# 8 x 1024 and base 16 with each build, alternated twice, and each build's
# profile lines for the kernels matching KERNELS at small 32 and base 16.
# $G holds sched.gz (this build), sched-prev.gz (the one before),
# kernels.test.gz and curve/ (see dresid-run.sh); BUILDS names other
# builds to compare instead of "sched-prev sched", SHAPES and
# PROFILE_SHAPES other rows as MODEL:BATCH words. Output under $OUT.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/kernel-ab}; mkdir -p $OUT
. "$(dirname "$0")/cuda-checks.sh"
BUILDS=${BUILDS:-sched-prev sched}
unpack $BUILDS kernels.test
log tests
gpu_tests native 150 -test.run "$TESTS"
KILN_CUDA_FORCE_SM80=1 gpu_tests sm80 90 -test.run "${SM80_TESTS:-$TESTS}"
for f in 0 1; do KILN_CUDA_FORCE_SM80=$f verify bf16 hd64; done
log curves
curves
log bench
for round in 1 2; do for s in $BUILDS; do for r in ${SHAPES:-small:32 small:8 base:16}; do set -- ${r/:/ }
  echo "$s $1 $2 $(kbench $s $1 $2)"
done; done; done | tee $OUT/ab.txt
for r in ${PROFILE_SHAPES:-small:32 base:16}; do set -- ${r/:/ }; for s in $BUILDS; do
  echo "$s $1 $2: $(kprofile $s $1 $2 "$KERNELS")"
done; done | tee $OUT/profiles.txt
log end
