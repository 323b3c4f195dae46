#!/bin/bash
# The RMSNorm kernels with two rows a warp and the loss kernel with its row
# held in registers, against the build before them (kernel-ab-run.sh with
# the tests of the paths that take the kernels).
TESTS='TestXent|TestNorm|TestBF16OddShapes|TestHead|TestGolden|TestTrainingStep|TestGraphSteps|TestBF16Variants' \
SM80_TESTS='TestXent|TestNorm|TestBF16OddShapes|TestGolden|TestTrainingStep' KERNELS='rmsnorm|xent' OUT=${OUT:-/tmp/norm-xent} \
	exec bash "$(dirname "$0")/kernel-ab-run.sh"
