package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/trainer"
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

// bench --moe measures the preset with Mixtral's block and reports its
// active parameters: the routers and top_k of the experts a token uses.
func TestBenchMoEReportsActiveParams(t *testing.T) {
	var out bytes.Buffer
	f := benchFlags{engine: "cpu", model: "tiny", precision: "fp32", batch: 1, seq: 16, steps: 1, warm: 0, peakTFLOPs: 989, moe: "experts=4,top_k=2,d_ff=32"}
	if err := runBench(context.Background(), &out, &bytes.Buffer{}, f); err != nil {
		t.Fatal(err)
	}
	var r struct {
		ParamsM       float64 `json:"params_m"`
		ActiveParamsM float64 `json:"active_params_m"`
		MoE           string  `json:"moe"`
		TokPerSec     float64 `json:"tok_per_sec"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	c := model.Presets["tiny"]
	c.Experts, c.ExpertsPerTok, c.Intermediate, c.RouterAuxCoef = 4, 2, 32, trainer.DefaultAuxCoef
	// Two experts of the four a layer, and the whole router.
	k := c
	k.Experts = 2
	active := k.NumParams() + c.Layers*2*c.Hidden
	if r.MoE != f.moe || r.TokPerSec <= 0 || math.Abs(r.ParamsM-float64(c.NumParams())/1e6) > 1e-9 || math.Abs(r.ActiveParamsM-float64(active)/1e6) > 1e-9 {
		t.Errorf("got %+v; want params %d, active %d", r, c.NumParams(), active)
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
		{func(f *benchFlags) { f.accumulate, f.accumulateSet = 0, true }, "--accumulate"},
		{func(f *benchFlags) { f.accumulate = -2 }, "--accumulate"},
		{func(f *benchFlags) { f.seq = 1 << 20 }, "--seq"},
		{func(f *benchFlags) { f.steps = 0 }, "--steps"},
		{func(f *benchFlags) { f.precision = "fp8" }, "--precision"},
		{func(f *benchFlags) { f.peakTFLOPs = -1 }, "--peak-tflops"},
		{func(f *benchFlags) { f.gpus = "0" }, "--gpus"},
		{func(f *benchFlags) { f.gpus = "many" }, "--gpus"},
		{func(f *benchFlags) { f.profile = true }, "--profile"},
		{func(f *benchFlags) { f.forceSM80 = true }, "--force-sm80"},
		{func(f *benchFlags) { f.moe = "experts=1" }, "--moe"},
		{func(f *benchFlags) { f.moe = "experts=4,top_k=5" }, "--moe"},
		{func(f *benchFlags) { f.moe = "experts=4,aux_coef=-1" }, "--moe"},
		{func(f *benchFlags) { f.moe = "top_k=2" }, "--moe"},
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

// A zero size typed on the command line is refused, not read as the
// default: leave a flag out for that.
func TestBenchZeroSizesAreRefused(t *testing.T) {
	for _, flag := range []string{"--batch", "--seq", "--steps", "--accumulate"} {
		wantBadInput(t, nil, "^sched: "+flag+" must be (positive|between 1)", "bench", "--engine", "cpu", "--model", "tiny", flag, "0")
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

// Several GPUs on the CPU engine, or an accumulate they do not divide, are
// refused before anything runs; with engine auto on a host without a GPU,
// several GPUs fail to start before any bench (auto never trains them on
// the CPU), and "all" is the one device found, measured once.
func TestBenchSeveralGPUsRefusedBeforeAnyBench(t *testing.T) {
	f := benchFlags{engine: "cpu", model: "tiny", precision: "fp32", batch: 1, seq: 16, steps: 1, peakTFLOPs: 989, gpus: "2"}
	var out, errOut bytes.Buffer
	err := runBench(context.Background(), &out, &errOut, f)
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "--gpus 2 needs the cuda engine") || errOut.Len() != 0 || out.Len() != 0 {
		t.Fatalf("engine cpu, gpus 2: %v, stderr %q, stdout %q; want bad input before any bench", err, errOut.String(), out.String())
	}
	f.engine, f.accumulate = "cuda", 3
	err = runBench(context.Background(), &out, &errOut, f)
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "accumulate 3 is not a multiple of gpus 2") || errOut.Len() != 0 {
		t.Fatalf("accumulate 3 on gpus 2: %v, stderr %q; want bad input before any bench", err, errOut.String())
	}
	f.accumulate = 0
	if cuda.Devices() > 0 {
		t.Skip("a GPU is visible: engine auto starts it")
	}
	f.engine = "auto"
	out.Reset()
	errOut.Reset()
	err = runBench(context.Background(), &out, &errOut, f)
	if err == nil || strings.Contains(errOut.String(), "tok/s") || out.Len() != 0 {
		t.Fatalf("engine auto, gpus 2, no GPU: %v, stderr %q, stdout %q; want the GPUs' failure before any bench", err, errOut.String(), out.String())
	}
	f.gpus = "all"
	out.Reset()
	errOut.Reset()
	err = runBench(context.Background(), &out, &errOut, f)
	if err == nil || strings.Contains(errOut.String(), "tok/s") || out.Len() != 0 {
		t.Fatalf("engine auto, gpus all, no GPU: %v, stderr %q, stdout %q; want the GPUs' failure before any bench", err, errOut.String(), out.String())
	}
}

// "All" GPUs on a host of one is one measure, with no scaling: the one-GPU
// measure is taken only after several GPUs have been.
func TestBenchAllGPUsOnAHostOfOneMeasuresOnce(t *testing.T) {
	if cuda.Devices() != 1 {
		t.Skip("needs a host of exactly one GPU")
	}
	f := benchFlags{engine: "cuda", model: "tiny", precision: "fp32", batch: 2, seq: 64, steps: 2, peakTFLOPs: 989, gpus: "all"}
	var out, errOut bytes.Buffer
	if err := runBench(context.Background(), &out, &errOut, f); err != nil {
		t.Fatalf("gpus all: %v, stderr %q", err, errOut.String())
	}
	var r benchResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("stdout %q: %v", out.String(), err)
	}
	if r.GPUs != 1 || r.OneGPUTokPerSec != 0 || r.ScalingEfficiency != 0 || strings.Contains(errOut.String(), "one GPU") {
		t.Fatalf("gpus all on one GPU: gpus %d, one GPU %v, scaling %v, stderr %q; want one measure, no scaling",
			r.GPUs, r.OneGPUTokPerSec, r.ScalingEfficiency, errOut.String())
	}
}
