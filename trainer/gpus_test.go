package trainer

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-lm/kiln/kernels"
	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// configureCUDA makes the CUDA engine take the settings in the test's
// environment (KILN_CUDA_FORCE_SM80, KILN_CUDA_GEMM_TUNE,
// KILN_NCCL_BUCKET_MB, ...) as the command line does, and the production
// path again once the test is done.
func configureCUDA(t *testing.T) {
	t.Helper()
	k, err := kernels.ParseOptions(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	kernels.Configure(k)
	t.Cleanup(func() { kernels.Configure(kernels.Options{}) })
}

// A run on every GPU of the host (one communicator, rank 0 checkpointing)
// follows the one-GPU run's curve, and its checkpoint resumes on one GPU
// on the same curve: the data order and the checkpoint do not depend on
// the number of GPUs. Where the host has one GPU the group is a one-rank
// communicator and the curves are equal bit for bit (fp32, no GEMM tuning).
func TestRunOnEveryGPUResumesOnOne(t *testing.T) {
	configureCUDA(t)
	ctx := context.Background()
	const total = 6
	vocab := model.Presets["tiny"].VocabSize
	run := func(gpus GPUCount, out string, maxSteps int, resume bool) (Result, map[int]Metrics) {
		t.Helper()
		rc := testRun(total)
		rc.Engine, rc.GPUs = "cuda", gpus
		res, got, err := runCollect(t, ctx, Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), MaxSteps: maxSteps, Resume: resume}, Hooks{})
		var u interface{ Unavailable() bool }
		if errors.As(err, &u) && u.Unavailable() {
			t.Skipf("no CUDA GPU or no NCCL here, skipping: %v", err)
		}
		if err != nil {
			t.Fatalf("gpus %v: %v", gpus, err)
		}
		return res, got
	}
	// The GPUs a group of all of them holds here.
	gpus := cuda.Devices()
	_, one := run(1, t.TempDir(), 0, false)
	res, every := run(GPUCount(model.AllGPUs), t.TempDir(), 0, false)
	if res.Devices != gpus {
		t.Errorf("a run on every GPU says it trained on %d, want the %d here", res.Devices, gpus)
	}
	out := t.TempDir()
	if res, _ := run(GPUCount(model.AllGPUs), out, 3, false); res.Step != 3 {
		t.Fatalf("bounded run on every GPU stopped at step %d, want 3", res.Step)
	}
	res, resumed := run(1, out, 0, true)
	if !res.Done || res.Devices != 1 {
		t.Fatalf("resumed on one GPU: %+v", res)
	}
	for step := 1; step <= total; step++ {
		w := one[step].LossOr(math.NaN())
		if gpus == 1 && every[step].LossOr(math.NaN()) != w {
			t.Errorf("step %d: a one-rank group's loss %.9g, the engine's %.9g: not bit for bit", step, every[step].LossOr(math.NaN()), w)
		}
		for name, m := range map[string]map[int]Metrics{"every GPU": every, "resumed on one": resumed} {
			g, ok := m[step]
			if !ok {
				if name == "resumed on one" && step <= 3 {
					continue
				}
				t.Fatalf("%s: no step %d logged", name, step)
			}
			if d := math.Abs(g.LossOr(math.NaN()) - w); !(d <= 0.01*math.Abs(w)) {
				t.Errorf("step %d: %s loss %.6g, one GPU %.6g", step, name, g.LossOr(math.NaN()), w)
			}
			// A line says how many GPUs its rate is of, where several.
			if want := map[bool]int{true: gpus, false: 0}[name == "every GPU" && gpus > 1]; g.GPUs != want || one[step].GPUs != 0 {
				t.Errorf("step %d: %s's line says gpus %d (one GPU's %d), want %d", step, name, g.GPUs, one[step].GPUs, want)
			}
			t.Logf("step %d: one GPU %.9g, %s %.9g", step, w, name, g.LossOr(math.NaN()))
		}
	}
}

// 200 steps on every GPU of the host follow the one-GPU run at the same
// global batch (same seed, same data: each GPU takes its share of every
// step's micro-batches): the loss within 1% at every logged step, fp32 and
// bf16 (the production path). Where the host has one GPU the group is one
// rank and fp32 (no GEMM tuning) is equal bit for bit; on several, the
// all-reduce sums the gradients in another order than one GPU's
// accumulation, and the test logs how far the curves drift.
func TestEveryGPUFollowsOneGPUsCurveFor200Steps(t *testing.T) {
	t.Setenv("KILN_CUDA_GEMM_TUNE", "off")
	configureCUDA(t)
	const total = 200
	for _, precision := range []string{"fp32", "bf16"} {
		run := func(gpus GPUCount) map[int]Metrics {
			t.Helper()
			rc := testRun(total)
			rc.Engine, rc.Precision, rc.GPUs = "cuda", precision, gpus
			rc.Batch, rc.Seq, rc.Accumulate = 8, 128, 4
			rc.LR, rc.Warmup, rc.EvalEvery, rc.LogEvery = 3e-3, 20, 0, 10
			// Each run its own data, from the first window: a source shared
			// by the two runs would give the second the windows after the
			// first's 6,400.
			res, got, err := runCollect(t, context.Background(), Config{Run: rc, Out: t.TempDir(), Data: patternData(model.Presets["tiny"].VocabSize)}, Hooks{})
			var u interface{ Unavailable() bool }
			if errors.As(err, &u) && u.Unavailable() {
				t.Skipf("no CUDA GPU or no NCCL here, skipping: %v", err)
			}
			if err != nil || !res.Done || len(got) != total/10 {
				t.Fatalf("%s on gpus %v: %+v, %d lines logged, %v", precision, gpus, res, len(got), err)
			}
			return got
		}
		one := run(1)
		every := run(GPUCount(model.AllGPUs))
		gpus := cuda.Devices()
		var worst float64
		for step := 10; step <= total; step += 10 {
			w, g := one[step].LossOr(math.NaN()), every[step].LossOr(math.NaN())
			rel := math.Abs(g-w) / math.Abs(w)
			worst = math.Max(worst, rel)
			if !(rel <= 0.01) {
				t.Errorf("%s, step %d: loss on %d GPUs %.6g, on one %.6g: %.2f%% apart", precision, step, gpus, g, w, 100*rel)
			}
			if gpus == 1 && precision == "fp32" && g != w {
				t.Errorf("fp32, step %d: a one-rank group's loss %.9g, the engine's %.9g: not bit for bit", step, g, w)
			}
		}
		first, last := one[10].LossOr(0), one[total].LossOr(0)
		if !(last < first/2) {
			t.Errorf("%s: loss %v -> %v over %d steps on one GPU: not learning, so the curves compare little", precision, first, last, total)
		}
		t.Logf("%s, %d GPUs against one: loss %.4f -> %.4f, curves at most %.3g%% apart over %d logged steps",
			precision, gpus, first, last, 100*worst, total/10)
	}
}

// 200 steps of a mixture of experts on the GPU (bf16, the production
// path): the loss falls, every logged line carries the load-balancing loss
// and each expert's share of the routing, and no expert starves.
func TestMoERunOnTheGPU(t *testing.T) {
	configureCUDA(t)
	d := &sliceData{ids: make([]int32, 200000), eval: make([]int32, 4000)}
	for i := range d.ids {
		d.ids[i] = int32(i * 7 % 61)
	}
	copy(d.eval, d.ids)
	const total = 200
	rc := testRun(total)
	rc.Engine, rc.Precision, rc.Batch, rc.Seq = "cuda", "bf16", 8, 128
	rc.LR, rc.Warmup, rc.EvalEvery, rc.LogEvery = 3e-3, 20, 0, 10
	rc.MoE = &MoEConfig{Experts: 4, TopK: 2, DFF: 64}
	// KILN_MOE_OUT keeps the run (for transformers to read its last
	// checkpoint against kiln's fp32 logits, left there as
	// kiln_logits.safetensors: docs/benchmarks/hf_moe_check.py).
	out := os.Getenv("KILN_MOE_OUT")
	if out == "" {
		out = t.TempDir()
	}
	res, got, err := runCollect(t, context.Background(), Config{Run: rc, Out: out, Data: d}, Hooks{})
	var u interface{ Unavailable() bool }
	if errors.As(err, &u) && u.Unavailable() {
		t.Skipf("no CUDA GPU here, skipping: %v", err)
	}
	if err != nil || !res.Done || len(got) != total/10 {
		t.Fatalf("run: %+v, %d lines, %v", res, len(got), err)
	}
	first, last := got[10].LossOr(0), got[total].LossOr(0)
	t.Logf("loss %.4f at step 10, %.4f at step %d", first, last, total)
	if !(last < first/2) {
		t.Errorf("loss %v -> %v over %d steps: not learning", first, last, total)
	}
	for step := 10; step <= total; step += 10 {
		m := got[step]
		var sum, least float64 = 0, 1
		for _, s := range m.ExpertShare {
			sum += s
			least = math.Min(least, s)
		}
		if m.AuxLoss == nil || len(m.ExpertShare) != 4 || math.Abs(sum-1) > 1e-6 {
			t.Fatalf("step %d: aux_loss %v, expert_share %v; want both, the shares of 4 experts summing to 1", step, m.AuxLoss, m.ExpertShare)
		}
		// A uniform router gives each 1/4; a starving expert gets few.
		if least < 1.0/16 {
			t.Errorf("step %d: an expert starves: shares %.3f", step, m.ExpertShare)
		}
		if step%50 == 0 {
			t.Logf("step %d: loss %.4f, aux %.4f, shares %.3f", step, m.LossOr(0), *m.AuxLoss, m.ExpertShare)
		}
	}
	if os.Getenv("KILN_MOE_OUT") != "" {
		writeFP32Logits(t, res.Checkpoint, out, d.ids[:rc.Seq])
	}
}

// writeFP32Logits computes the fp32 logits of checkpoint ck on one
// sequence on the CUDA engine and writes them, with the ids, to
// out/kiln_logits.safetensors.
func writeFP32Logits(t *testing.T, ck, out string, ids []int32) {
	mc, err := model.ReadConfig(filepath.Join(ck, ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := ReadCheckpoint(ck, &mc)
	if err != nil {
		t.Fatal(err)
	}
	e, err := model.NewEngine("cuda", mc, model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: len(ids)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.SetParams(snap.Params); err != nil {
		t.Fatal(err)
	}
	logits, err := e.Logits(model.Batch{B: 1, T: len(ids), Inputs: ids})
	if err != nil {
		t.Fatal(err)
	}
	f := &model.SafetensorsFile{Metadata: map[string]string{"format": "pt", "checkpoint": ck}, Tensors: []model.Tensor{
		model.I32Tensor("input_ids", []int{1, len(ids)}, ids),
		model.F32Tensor("logits", []int{1, len(ids), mc.VocabSize}, logits),
	}}
	if err := model.WriteSafetensors(filepath.Join(out, "kiln_logits.safetensors"), f); err != nil {
		t.Fatal(err)
	}
}

// patternData is a pattern to learn with 3 ids in 16 drawn at random: on
// it the loss falls, then levels near 2 nats rather than near 0, where 1%
// of it would be a tolerance of rounding. A new source each call, read
// from its first window.
func patternData(vocab int) *sliceData {
	d := &sliceData{ids: make([]int32, 400000), eval: make([]int32, 4000)}
	x := uint64(0x9e3779b97f4a7c15)
	for i := range d.ids {
		x = x*6364136223846793005 + 1442695040888963407
		d.ids[i] = int32(i * 7 % 61)
		if x>>60 < 3 { // 3 in 16
			d.ids[i] = int32((x >> 20) % uint64(vocab))
		}
	}
	copy(d.eval, d.ids)
	return d
}
