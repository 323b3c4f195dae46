package kernels

import (
	"strings"
	"testing"
	"time"
)

// Each setting lands in the one options value the command line passes on;
// with nothing set, that value is the production path (the zero Options).
func TestParseOptions(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	o, err := ParseOptions(env(nil))
	if err != nil || o != (Options{}) || o.candidates() != gemmCandidates {
		t.Fatalf("nothing set: %+v, %v; want the zero Options and %d GEMM candidates", o, err, gemmCandidates)
	}
	o, err = ParseOptions(env(map[string]string{"KILN_CUDA_HEAD": "fp32-forward", "KILN_CUDA_GEMM_TUNE": "off",
		"KILN_CUDA_ATTENTION": "naive", "KILN_CUDA_FLASH_FWD": "64", "KILN_CUDA_FLASH_BWD": "fused", "KILN_CUDA_GRAPH": "off", "KILN_CUDA_FORCE_SM80": "1",
		"KILN_KERNEL_CACHE": "/cache"}))
	want := Options{head: headMode{f32Fwd: true}, gemmTune: -1, naive: true, flash64: true, flashFused: true, eager: true, forceSM80: true, kernelCache: "/cache"}
	if err != nil || o != want || o.candidates() != 0 || CacheDir(o.kernelCache) != "/cache" {
		t.Fatalf("everything set: %+v, %v; want %+v, no GEMM tuning", o, err, want)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_GEMM_TUNE": "3", "KILN_CUDA_GRAPH": "on", "KILN_CUDA_FLASH_FWD": "128", "KILN_CUDA_FLASH_BWD": "split"})); err != nil || o.candidates() != 3 || o.eager || o.flash64 || o.flashFused {
		t.Fatalf("3 candidates, graphs on, 128 rows, two-kernel backward: %+v, %v", o, err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_DRESID": "bf16"})); err != nil || o != (Options{}) {
		t.Fatalf("the residual stream's gradient in bf16: %+v, %v; want the production path", o, err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_DRESID": "fp32"})); err != nil || o != (Options{dresidFP32: true}) {
		t.Fatalf("the residual stream's gradient in fp32: %+v, %v", o, err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_FLASH_TMA": "on"})); err != nil || o != (Options{}) {
		t.Fatalf("the Hopper flash kernels with tensor copies: %+v, %v; want the production path", o, err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_FLASH_TMA": "off"})); err != nil || o != (Options{flashCopyAsync: true}) {
		t.Fatalf("the Hopper flash kernels with cp.async: %+v, %v", o, err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_OVERLAP": "on"})); err != nil || o != (Options{}) {
		t.Fatalf("weight gradients on the side stream: %+v, %v; want the production path", o, err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_OVERLAP": "off"})); err != nil || o != (Options{serialGrads: true}) {
		t.Fatalf("weight gradients on the main stream: %+v, %v", o, err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_GRAPH_MEMSETS": "kernel"})); err != nil || o != (Options{}) {
		t.Fatalf("memsets as kernels in recorded graphs: %+v, %v; want the production path", o, err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_GRAPH_MEMSETS": "keep"})); err != nil || o != (Options{keepMemsets: true}) {
		t.Fatalf("memsets kept in recorded graphs: %+v, %v", o, err)
	}
	if _, err = ParseOptions(env(map[string]string{"KILN_CUDA_GRAPH_MEMSETS": "off"})); err == nil ||
		!strings.Contains(err.Error(), "KILN_CUDA_GRAPH_MEMSETS") || !strings.Contains(err.Error(), "kernel, keep") {
		t.Fatalf("KILN_CUDA_GRAPH_MEMSETS=off: %v; want an error naming the variable and the settings it takes", err)
	}
	for v, want := range map[string]time.Duration{"10m": 10 * time.Minute, "90s": 90 * time.Second, "off": -1} {
		if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_HANG_TIMEOUT": v})); err != nil || o != (Options{hangTimeout: want}) {
			t.Errorf("KILN_CUDA_HANG_TIMEOUT=%s: %+v, %v; want the hang timeout %v", v, o, err, want)
		}
	}
	for _, v := range []string{"0", "-5m", "10", "soon"} {
		if _, err = ParseOptions(env(map[string]string{"KILN_CUDA_HANG_TIMEOUT": v})); err == nil ||
			!strings.Contains(err.Error(), "KILN_CUDA_HANG_TIMEOUT=") || !strings.Contains(err.Error(), "such as 10m") {
			t.Errorf("KILN_CUDA_HANG_TIMEOUT=%s: %v; want an error naming the variable and the settings it takes", v, err)
		}
	}
	if _, err = ParseOptions(env(map[string]string{"KILN_CUDA_HANG_TIMEOUT": "3000000h"})); err == nil || !strings.Contains(err.Error(), `KILN_CUDA_HANG_TIMEOUT="3000000h" is out of range`) {
		t.Errorf("KILN_CUDA_HANG_TIMEOUT=3000000h: %v; want it said out of range", err)
	}
	if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_ATTENTION": "flash-sm80"})); err != nil || o != (Options{flashSM80: true}) {
		t.Fatalf("flash.cu's kernels on Hopper too: %+v, %v", o, err)
	}
	for v, want := range map[string]string{"": CacheDir(""), "off": "", "/var/kiln/gemm": "/var/kiln/gemm"} {
		if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_GEMM_CHOICES": v})); err != nil || o.choicesDir() != want {
			t.Errorf("KILN_CUDA_GEMM_CHOICES=%q: choices in %q, %v; want %q", v, o.choicesDir(), err, want)
		}
	}
	if o, _ = ParseOptions(env(map[string]string{"KILN_KERNEL_CACHE": "/cache/k"})); o.choicesDir() != "/cache/k" {
		t.Errorf("with KILN_KERNEL_CACHE=/cache/k the GEMM choices go to %q, want the kernel cache", o.choicesDir())
	}
	for v, want := range map[string]int64{"": wsBytes, "0": 0, "4": 4 << 20, "32": 32 << 20} {
		if o, err = ParseOptions(env(map[string]string{"KILN_CUDA_GEMM_WORKSPACE": v})); err != nil || o.workspace() != want {
			t.Errorf("KILN_CUDA_GEMM_WORKSPACE=%q: %d bytes, %v; want %d", v, o.workspace(), err, want)
		}
	}
	if o, _ = ParseOptions(env(nil)); o.workspace() != wsBytes {
		t.Errorf("the production path's workspace %d bytes, want %d", o.workspace(), wsBytes)
	}
	for _, v := range []string{"33", "-1", "x", "8MiB"} {
		if _, err = ParseOptions(env(map[string]string{"KILN_CUDA_GEMM_WORKSPACE": v})); err == nil ||
			!strings.Contains(err.Error(), "KILN_CUDA_GEMM_WORKSPACE") || !strings.Contains(err.Error(), "from 0 (none) to 32") {
			t.Errorf("KILN_CUDA_GEMM_WORKSPACE=%q: %v; want an error naming the variable and the sizes it takes", v, err)
		}
	}
	for v, want := range map[string]int{"": 0, "off": 0, "0": 0, "1": 1, "25": 25, "1024": 1024} {
		if o, err = ParseOptions(env(map[string]string{"KILN_NCCL_BUCKET_MB": v})); err != nil || o != (Options{bucketBytes: int64(want) << 20}) {
			t.Errorf("KILN_NCCL_BUCKET_MB=%q: %+v, %v; want buckets of %d MiB", v, o, err, want)
		}
	}
	for _, v := range []string{"-1", "1025", "25MB", "on"} {
		if _, err = ParseOptions(env(map[string]string{"KILN_NCCL_BUCKET_MB": v})); err == nil ||
			!strings.Contains(err.Error(), "KILN_NCCL_BUCKET_MB") || !strings.Contains(err.Error(), "from 1 to 1024") {
			t.Errorf("KILN_NCCL_BUCKET_MB=%q: %v; want an error naming the variable and the sizes it takes", v, err)
		}
	}
	if _, err = ParseOptions(env(map[string]string{"KILN_CUDA_ATTENTION": "sm80"})); err == nil ||
		!strings.Contains(err.Error(), "KILN_CUDA_ATTENTION") || !strings.Contains(err.Error(), "flash-sm80") {
		t.Fatalf("KILN_CUDA_ATTENTION=sm80: %v; want an error naming the variable and the settings it takes", err)
	}
}
