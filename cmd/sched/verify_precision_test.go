package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// The CPU engine computes in fp32 only: verify --precision bf16 on it would
// judge an fp32 step by bf16's looser tolerances and print PASS for a bf16
// check that never happened, so it is refused as bad input.
func TestVerifyRefusesBF16OnTheCPU(t *testing.T) {
	tiny := filepath.Join(goldenDir, "tiny")
	out, errOut, code := runModelCLI(t, "verify", "--golden", tiny, "--engine", "cpu", "--precision", "bf16")
	if code != exitBadInput || strings.Contains(out, "PASS") || !strings.Contains(errOut, "computes in fp32 only") ||
		!strings.Contains(errOut, "--engine cuda") {
		t.Errorf("--engine cpu --precision bf16: exit %d\n%s%s\nwant exit 2, no PASS, and that a bf16 check needs --engine cuda", code, out, errOut)
	}
	// Engine auto where it falls back to the CPU says the same. Where a
	// GPU is found the CUDA engine makes the bf16 check and passes.
	out, errOut, code = runModelCLI(t, "verify", "--golden", tiny, "--engine", "auto", "--precision", "bf16")
	switch {
	case code == 0 && strings.Contains(out, "engine cuda"):
	case code == exitBadInput && !strings.Contains(out, "PASS") && strings.Contains(errOut, "computes in fp32 only"):
	default:
		t.Errorf("--engine auto --precision bf16: exit %d\n%s%s\nwant a bf16 check on the CUDA engine, or exit 2 saying the CPU computes in fp32 only", code, out, errOut)
	}
}
