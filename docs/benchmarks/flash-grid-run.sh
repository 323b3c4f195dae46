#!/bin/bash
# The flash kernels' grids with the tiles along z (every head's longest
# tiles first) against the build before (kernel-ab-run.sh with the flash,
# loss and step tests; the four large rows and the pilot's shape; the flash
# kernels in the profiles), then the sm_80 kernels (KILN_CUDA_FORCE_SM80=1,
# the RTX 3060's path) of both builds at the pilot's shape and small 32,
# alternated twice.
G=${G:-$PWD/.carry/g}; OUT=${OUT:-/tmp/flash-grid}; mkdir -p $OUT
TESTS='TestFlash|TestHopper|TestTrainingStep|TestGolden|TestGraphSteps|TestXent|TestBF16Variants|TestHead' \
SM80_TESTS='TestFlash|TestTrainingStep|TestGolden|TestXent' KERNELS='flash|xent' \
SHAPES=${SHAPES:-small:32 small:8 base:16 base:32} PROFILE_SHAPES=${PROFILE_SHAPES:-base:16 small:8} \
	bash "$(dirname "$0")/kernel-ab-run.sh"
. "$(dirname "$0")/cuda-checks.sh"
unpack ${BUILDS:-sched-prev sched}
log sm80 bench
for round in 1 2; do for s in ${BUILDS:-sched-prev sched}; do for r in small:8 small:32; do set -- ${r/:/ }
  echo "$s sm80 $1 $2 $(KILN_CUDA_FORCE_SM80=1 kbench $s $1 $2)"
done; done; done | tee $OUT/sm80.txt
log end
