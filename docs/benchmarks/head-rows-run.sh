#!/bin/bash
# The LM head's chunks of 4096 bf16 rows at base's vocabulary (2048 before)
# against the build before (kernel-ab-run.sh with the head's tests, base 16
# and 32 and small 32, and the head's GEMMs and loss kernel in the profiles).
TESTS='TestHead|TestLogit|TestBF16Logits|TestGolden|TestTrainingStep|TestGraphSteps|TestXent' \
SM80_TESTS='TestHead|TestBF16Logits|TestGolden' KERNELS='GEMM.*32000|xent' \
SHAPES='base:16 base:32 small:32' PROFILE_SHAPES='base:16 base:32' OUT=${OUT:-/tmp/head-rows} \
	exec bash "$(dirname "$0")/kernel-ab-run.sh"
