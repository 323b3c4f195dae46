package trainer

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/kiln-lm/kiln/kernels"
	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// A run on every GPU of the host (one communicator, rank 0 checkpointing)
// follows the one-GPU run's curve, and its checkpoint resumes on one GPU
// on the same curve: the data order and the checkpoint do not depend on
// the number of GPUs. Where the host has one GPU the group is a one-rank
// communicator and the curves are equal bit for bit (fp32, no GEMM tuning).
func TestRunOnEveryGPUResumesOnOne(t *testing.T) {
	kernels.Configure(kernels.Options{})
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
	_, one := run(1, t.TempDir(), 0, false)
	_, every := run(GPUCount(model.AllGPUs), t.TempDir(), 0, false)
	out := t.TempDir()
	if res, _ := run(GPUCount(model.AllGPUs), out, 3, false); res.Step != 3 {
		t.Fatalf("bounded run on every GPU stopped at step %d, want 3", res.Step)
	}
	res, resumed := run(1, out, 0, true)
	if !res.Done {
		t.Fatalf("resumed on one GPU: %+v", res)
	}
	// The GPUs a group of all of them holds here.
	gpus := 0
	if drv, err := cuda.LoadDriver(); err == nil {
		gpus, _ = drv.DeviceCount()
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
			t.Logf("step %d: one GPU %.9g, %s %.9g", step, w, name, g.LossOr(math.NaN()))
		}
	}
}
