package model

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
)

// The CUDA estimate against the peaks `sched bench --engine cuda` reported
// on an H200 (docs/benchmarks/cuda.md, "Generation's fp32 attention scratch
// out of the training buffers (2026-12-02)" and, at the pilot's 8 x 1024,
// "The LM head's chunk at small micro-batches": bf16, seq 1024, flash
// attention). The estimate may be 5% below or 10% above: below would let
// a run start that then fails to allocate, far above would refuse runs
// that fit.
func TestCUDAEstimateMatchesMeasuredPeaks(t *testing.T) {
	for _, m := range []struct {
		model   string
		batch   int
		peakGiB float64
	}{
		{"small", 8, 1.93}, {"small", 32, 5.66}, {"small", 64, 10.56}, {"base", 16, 7.81}, {"base", 32, 13.50},
	} {
		est, err := EstimateMemory(MemoryPlan{Config: Presets[m.model], Engine: "cuda", Precision: "bf16", Batch: m.batch, Seq: 1024, Purpose: PurposeBench})
		if err != nil {
			t.Fatal(err)
		}
		ratio := float64(est.Total) / (1 << 30) / m.peakGiB
		t.Logf("%s %dx1024: estimate %s, measured %.2f GiB (x%.3f)", m.model, m.batch, GiB(est.Total), m.peakGiB, ratio)
		if ratio < 0.95 || ratio > 1.10 {
			t.Errorf("%s %dx1024: estimate %s is x%.3f the measured %.2f GiB, want within 0.95-1.10", m.model, m.batch, GiB(est.Total), ratio, m.peakGiB)
		}
	}
}

// The CPU estimate against what the CPU engine really allocates for one
// training step: the Go heap's cumulative allocation over NewCPUEngine and
// one ForwardBackward and Step.
func TestCPUEstimateMatchesAllocation(t *testing.T) {
	skipUnderRace(t)
	c := Presets["tiny"]
	for _, shape := range [][2]int{{2, 64}, {4, 128}} {
		B, T := shape[0], shape[1]
		b := Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
		for i := range b.Inputs {
			b.Inputs[i], b.Targets[i] = int32(i%c.VocabSize), int32((i+1)%c.VocabSize)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		e, err := NewCPUEngine(c, Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		if err := e.Step(AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(e)
		got := float64(after.TotalAlloc - before.TotalAlloc)
		est, err := EstimateMemory(MemoryPlan{Config: c, Engine: "cpu", Batch: B, Seq: T})
		if err != nil {
			t.Fatal(err)
		}
		ratio := float64(est.Total) / got
		t.Logf("tiny %dx%d: estimate %d bytes, allocated %.0f (x%.3f)", B, T, est.Total, got, ratio)
		if ratio < 0.9 || ratio > 1.1 {
			t.Errorf("tiny %dx%d: estimate %d bytes is x%.3f of the %.0f the engine allocated, want within 0.9-1.1", B, T, est.Total, ratio, got)
		}
	}
}

// Generation on the CPU: the engine plus the KV cache and the prompt's
// temporaries.
func TestCPUGenerateEstimateMatchesAllocation(t *testing.T) {
	skipUnderRace(t)
	c := Presets["tiny"]
	prompt := make([]int32, 200)
	for i := range prompt {
		prompt[i] = int32(i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	e, err := NewCPUEngine(c, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Generate(context.Background(), prompt, 8, -1, Sampling{}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	got := float64(after.TotalAlloc - before.TotalAlloc)
	est, err := EstimateMemory(MemoryPlan{Config: c, Engine: "cpu", Batch: 1, Seq: len(prompt) + 8, Purpose: PurposeGenerate})
	if err != nil {
		t.Fatal(err)
	}
	ratio := float64(est.Total) / got
	t.Logf("tiny generate %d: estimate %d bytes, allocated %.0f (x%.3f)", len(prompt)+8, est.Total, got, ratio)
	if ratio < 0.9 || ratio > 1.2 {
		t.Errorf("estimate %d bytes is x%.3f of the %.0f allocated, want within 0.9-1.2", est.Total, ratio, got)
	}
}

// An engine start that cannot fit the host is refused in one line naming
// both sizes and what to change, before the engine allocates anything.
func TestNewEngineRefusesWhatDoesNotFit(t *testing.T) {
	avail, ok := HostAvailable()
	if !ok {
		t.Skip("this host's available memory cannot be read")
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	e, err := NewEngine("cpu", Presets["tiny"], Options{MaxBatch: 100000000, MaxSeq: 1024})
	runtime.ReadMemStats(&after)
	if e != nil {
		t.Fatal("an engine of batch 1e8 started")
	}
	var me *MemoryError
	if !errors.As(err, &me) || !me.BadInput() {
		t.Fatalf("got %v, want a *MemoryError", err)
	}
	msg := err.Error()
	// The CPU engine computes in fp32, whatever precision was asked (bf16
	// by default), and its line says so.
	for _, want := range []string{"batch 100000000 x seq 1024", "cpu engine (fp32)", GiB(me.Needed), "this host", "--batch", "--accumulate"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	if me.Needed <= avail/2 || me.Available <= 0 {
		t.Errorf("needed %d, available %d (host %d)", me.Needed, me.Available, avail)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("the refused start allocated %d bytes", d)
	}
	// A model whose state alone does not fit is not a batch to lower.
	huge := Presets["tiny"]
	huge.Experts, huge.ExpertsPerTok, huge.RouterAuxCoef = 99999999, 2, 0.001
	if _, err := NewEngine("cpu", huge, Options{MaxBatch: 2, MaxSeq: 16}); err == nil ||
		!strings.Contains(err.Error(), "optimizer state alone need") || !strings.Contains(err.Error(), "fewer experts") || strings.Contains(err.Error(), "lower --batch") {
		t.Errorf("99999999 experts: %v; want the model named as what does not fit", err)
	}
	// A size that fits starts.
	e, err = NewEngine("cpu", Presets["tiny"], Options{MaxBatch: 2, MaxSeq: 16})
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
}

// Absurd shapes are sized without overflow and without listing tensors.
func TestEstimateOfAbsurdShapes(t *testing.T) {
	c := Presets["tiny"]
	c.Layers = 100000000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	est, err := EstimateMemory(MemoryPlan{Config: c, Engine: "cuda", Batch: 1 << 40, Seq: 1 << 40})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if est.Total != math.MaxInt64 {
		t.Errorf("total %d, want saturated at MaxInt64", est.Total)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("sizing allocated %d bytes", d)
	}
	if got, want := Presets["base"].ParamCount(), float64(Presets["base"].NumParams()); got != want {
		t.Errorf("ParamCount %v, NumParams %v", got, want)
	}
	c = Presets["small"]
	c.TieEmbeddings = false
	if got, want := c.ParamCount(), float64(c.NumParams()); got != want {
		t.Errorf("untied: ParamCount %v, NumParams %v", got, want)
	}
}

// Generation sizes the KV cache; evaluation sizes no gradient scratch.
func TestEstimateByPurpose(t *testing.T) {
	c := Presets["small"]
	size := func(engine string, p Purpose) int64 {
		t.Helper()
		est, err := EstimateMemory(MemoryPlan{Config: c, Engine: engine, Batch: 1, Seq: 4096, Purpose: p})
		if err != nil {
			t.Fatal(err)
		}
		return est.Total
	}
	kv := int64(2*c.Layers*4096*c.KVHeads*c.HeadDim) * 4
	if g, tr := size("cuda", PurposeGenerate), size("cuda", PurposeTrain); g-tr < kv {
		t.Errorf("cuda: generate %d is not train %d plus the %d-byte KV cache", g, tr, kv)
	}
	if ev, tr := size("cpu", PurposeEval), size("cpu", PurposeTrain); ev >= tr {
		t.Errorf("cpu: eval %d not below train %d", ev, tr)
	}
	if _, err := EstimateMemory(MemoryPlan{Config: c, Engine: "tpu"}); err == nil || !strings.Contains(err.Error(), "choose cuda, cpu or auto") {
		t.Errorf("engine tpu: %v", err)
	}
}

func TestHostAvailable(t *testing.T) {
	v, ok := meminfoAvailable([]byte("MemTotal:       16384000 kB\nMemFree:         1000 kB\nMemAvailable:    8192000 kB\n"))
	if !ok || v != 8192000*1024 {
		t.Errorf("MemAvailable read as %d, %v", v, ok)
	}
	if _, ok := meminfoAvailable([]byte("MemTotal: 1 kB\n")); ok {
		t.Error("a meminfo without MemAvailable read as available")
	}
	if runtime.GOOS == "linux" {
		if avail, ok := HostAvailable(); !ok || avail <= 0 {
			t.Errorf("HostAvailable on Linux: %d, %v", avail, ok)
		}
	}
}

func TestUnknownEngineIsBadInput(t *testing.T) {
	_, err := NewEngine("tpu", Presets["tiny"], Options{})
	var ee *EngineError
	if !errors.As(err, &ee) || !ee.BadInput() || !strings.Contains(err.Error(), "cpu") || !strings.Contains(err.Error(), "auto") {
		t.Errorf("engine tpu: %v", err)
	}
	_, err = NewEngine("cpu", Presets["tiny"], Options{Precision: "fp8"})
	if !errors.As(err, &ee) || !strings.Contains(err.Error(), "fp32 or bf16") {
		t.Errorf("precision fp8: %v", err)
	}
}

// With experts the estimate counts every expert's weights and the sparse
// block's activations, against what the CPU engine allocates for a training
// step and for generation.
func TestMoEEstimateMatchesAllocation(t *testing.T) {
	skipUnderRace(t)
	c := Presets["tiny"]
	c.Experts, c.ExpertsPerTok, c.Intermediate, c.RouterAuxCoef = 8, 2, 96, 0.02
	if got, want := c.ParamCount(), float64(c.NumParams()); got != want {
		t.Fatalf("ParamCount %v, NumParams %v", got, want)
	}
	dense := Presets["tiny"]
	dense.Intermediate = 96
	if c.ParamCount() <= dense.ParamCount()+7*3*96*64*float64(c.Layers) {
		t.Errorf("ParamCount %v does not count 8 experts beside the dense %v", c.ParamCount(), dense.ParamCount())
	}
	measure := func(f func(e *CPUEngine)) float64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		e, err := NewCPUEngine(c, Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		f(e)
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(e)
		return float64(after.TotalAlloc - before.TotalAlloc)
	}
	check := func(what string, p MemoryPlan, got float64, lo, hi float64) {
		est, err := EstimateMemory(p)
		if err != nil {
			t.Fatal(err)
		}
		ratio := float64(est.Total) / got
		t.Logf("%s: estimate %d bytes, allocated %.0f (x%.3f)", what, est.Total, got, ratio)
		if ratio < lo || ratio > hi {
			t.Errorf("%s: estimate %d bytes is x%.3f of the %.0f allocated, want within %g-%g", what, est.Total, ratio, got, lo, hi)
		}
	}
	B, T := 4, 128
	b := Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
	for i := range b.Inputs {
		b.Inputs[i], b.Targets[i] = int32(i*7%c.VocabSize), int32((i+1)*7%c.VocabSize)
	}
	got := measure(func(e *CPUEngine) {
		if err := e.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		if err := e.Step(AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
			t.Fatal(err)
		}
	})
	check("train 4x128", MemoryPlan{Config: c, Engine: "cpu", Batch: B, Seq: T}, got, 0.9, 1.1)
	prompt := make([]int32, 200)
	for i := range prompt {
		prompt[i] = int32(i)
	}
	got = measure(func(e *CPUEngine) {
		if _, err := e.Generate(context.Background(), prompt, 8, -1, Sampling{}); err != nil {
			t.Fatal(err)
		}
	})
	check("generate 208", MemoryPlan{Config: c, Engine: "cpu", Batch: 1, Seq: len(prompt) + 8, Purpose: PurposeGenerate}, got, 0.9, 1.2)
}

// The largest batches of 1024 positions that enqueue lets through for an
// H200 are those docs/operations.md's memory table gives: about 900 for
// small and 385 for base (bf16, CUDA engine, training).
func TestLargestCardHoldsTheBatchesTheDocsSay(t *testing.T) {
	largest := func(preset string) int {
		b := 1
		for ; ; b++ {
			plan := MemoryPlan{Config: Presets[preset], Engine: "cuda", Precision: "bf16", Batch: b + 1, Seq: 1024, Purpose: PurposeBench}
			if err := CheckMemory(plan, LargestGPU, "an H200"); err != nil {
				return b
			}
		}
	}
	for _, c := range []struct {
		preset string
		about  int
	}{{"small", 900}, {"base", 385}} {
		if b := largest(c.preset); b < c.about*98/100 || b > c.about*102/100 {
			t.Errorf("%s: batch %d x 1024 is the largest an H200 holds by the estimate; docs/operations.md says about %d", c.preset, b, c.about)
		}
	}
}

// skipUnderRace skips a test of allocated bytes in a race-detector build,
// whose instrumentation allocates beside the engine.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceDetector {
		t.Skip("allocation counts under the race detector are not the engine's")
	}
}
