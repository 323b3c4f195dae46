#!/bin/bash
# rope_bf16 in 16-byte accesses against the build before it (kernel-ab-run.sh
# with the tests of the paths that take the kernel).
TESTS='TestRope|TestFlash|TestGolden|TestTrainingStep|TestGraphSteps|TestBF16Variants|TestNormBackward' \
SM80_TESTS='TestRope|TestGolden|TestTrainingStep' KERNELS='rope_bf16' OUT=${OUT:-/tmp/rope} \
	exec bash "$(dirname "$0")/kernel-ab-run.sh"
