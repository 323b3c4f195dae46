package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// bench prints one JSON line with the throughput, memory and GPU-sharing
// fields; the CPU engine stands in where CI has no GPU.
func TestBenchPrintsOneJSONLine(t *testing.T) {
	var out, errOut bytes.Buffer
	f := benchFlags{engine: "cpu", model: "tiny", precision: "fp32", batch: 1, seq: 16, steps: 2, warm: 1, peakTFLOPs: 989}
	if err := runBench(context.Background(), &out, &errOut, f); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("bench printed %d lines, want 1:\n%s", len(lines), out.String())
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, lines[0])
	}
	for _, k := range []string{"tok_per_sec", "mfu", "peak_memory_bytes", "process_memory_bytes", "memory_in_use_before_bytes", "other_processes", "gpu_idle", "loss"} {
		if _, ok := r[k]; !ok {
			t.Errorf("the line lacks %q: %s", k, lines[0])
		}
	}
	if r["engine"] != "cpu" || r["batch"].(float64) != 1 || r["seq"].(float64) != 16 || r["tok_per_sec"].(float64) <= 0 {
		t.Errorf("unexpected line: %s", lines[0])
	}
}

func TestBenchBadInputNamesTheFlag(t *testing.T) {
	base := benchFlags{engine: "cpu", model: "tiny", precision: "fp32", batch: 1, seq: 16, steps: 1, peakTFLOPs: 989, gpus: "1"}
	cases := []struct {
		edit func(*benchFlags)
		want string
	}{
		{func(f *benchFlags) { f.model = "huge" }, "--model"},
		{func(f *benchFlags) { f.batch = 0 }, "--batch"},
		{func(f *benchFlags) { f.seq = 1 << 20 }, "--seq"},
		{func(f *benchFlags) { f.steps = 0 }, "--steps"},
		{func(f *benchFlags) { f.precision = "fp8" }, "--precision"},
		{func(f *benchFlags) { f.peakTFLOPs = -1 }, "--peak-tflops"},
		{func(f *benchFlags) { f.gpus = "0" }, "--gpus"},
		{func(f *benchFlags) { f.gpus = "many" }, "--gpus"},
	}
	for _, c := range cases {
		f := base
		c.edit(&f)
		err := runBench(context.Background(), &bytes.Buffer{}, &bytes.Buffer{}, f)
		if err == nil || !strings.Contains(err.Error(), c.want) || !isBadInput(err) {
			t.Errorf("%s: error = %v, want bad input naming %s", c.want, err, c.want)
		}
	}
}

// A mistyped CUDA engine setting is refused before the command starts
// anything, on any engine: one line naming the variable, exit status 2.
func TestBadCUDASettingRefusedBeforeStart(t *testing.T) {
	t.Parallel()
	out, errOut, code := sched(t, []string{"KILN_CUDA_GRAPH=eager"},
		"bench", "--engine", "cpu", "--model", "tiny", "--precision", "fp32", "--batch", "1", "--seq", "16", "--steps", "1")
	if code != exitBadInput || out != "" || !strings.Contains(errOut, "KILN_CUDA_GRAPH") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and one line naming KILN_CUDA_GRAPH", code, out, errOut)
	}
	if _, errOut, code := sched(t, []string{"KILN_CUDA_GRAPH=off"},
		"bench", "--engine", "cpu", "--model", "tiny", "--precision", "fp32", "--batch", "1", "--seq", "16", "--steps", "1", "--warmup", "0"); code != 0 {
		t.Fatalf("KILN_CUDA_GRAPH=off: exit %d: %s", code, errOut)
	}
}
