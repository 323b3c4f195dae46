package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// The bf16 kernels' paths for shapes no preset has: SwiGLU widths that are
// odd (the fused gate-and-up kernels take single values), even but not a
// multiple of 4 (4-byte pairs instead of 16-byte octets) and a multiple of
// 4 but not of 8 (8-byte quads), a vocabulary that is not a multiple of 4
// (the loss kernel's scalar loop), one of 4 but not 8 (its 8-byte loop)
// and one of 8 (the row held in registers, as the presets' are), a
// sequence that is not a multiple of the 64-row flash tile, and ignored
// targets. On the same weights and batch, the bf16 engine's loss, logits and
// gradients stay within the bf16 tolerances (BF16Tolerances) of the fp32
// engine's, which runs none of these kernels.
func TestBF16OddShapesMatchFP32(t *testing.T) {
	skipWithoutGPU(t)
	for _, s := range []struct{ F, V int }{{177, 1021}, {178, 1021}, {180, 1020}, {176, 1032}} {
		t.Run(fmt.Sprintf("F=%d/V=%d", s.F, s.V), func(t *testing.T) { oddShapes(t, s.F, s.V) })
	}
}

func oddShapes(t *testing.T, F, V int) {
	c := model.Config{VocabSize: V, Hidden: 128, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 64, Intermediate: F,
		MaxPositions: 128, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: true, InitializerRange: 0.02}
	const B, T = 2, 100
	r := rand.New(rand.NewPCG(5, 9))
	b := model.Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
	for i := range b.Inputs {
		b.Inputs[i] = int32(r.IntN(c.VocabSize))
		b.Targets[i] = int32(r.IntN(c.VocabSize))
		if i%17 == 0 {
			b.Targets[i] = -1
		}
	}
	p := model.InitParams(c, 3)
	want := runHead(t, newEngine(t, c, model.Options{Precision: "fp32", MaxBatch: B, MaxSeq: T}), p, b)
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
	got := runHead(t, e, p, b)
	n := e.LaunchCounts()
	for _, k := range []string{e.flashForwardKernel(), "swiglu_fwd_gu", "swiglu_bwd_gu", xentKernelFor(V, true)} {
		if n[k] == 0 {
			t.Fatalf("the bf16 engine never launched %s: launches %v", k, n)
		}
	}
	tol := BF16Tolerances
	if d := math.Abs(got.loss-want.loss) / math.Abs(want.loss); d > tol.LossRel {
		t.Errorf("loss: bf16 %.6g, fp32 %.6g (relative %.2g, limit %g)", got.loss, want.loss, d, tol.LossRel)
	}
	if d := math.Abs(got.eval-want.eval) / math.Abs(want.eval); d > tol.LossRel {
		t.Errorf("eval loss: bf16 %.6g, fp32 %.6g (relative %.2g, limit %g)", got.eval, want.eval, d, tol.LossRel)
	}
	if d := maxRelDiff(want.logits, got.logits); d > tol.LogitsRel {
		t.Errorf("logits differ by %.2g of their largest magnitude (limit %g)", d, tol.LogitsRel)
	}
	for _, s := range c.Specs() {
		if d := maxRelDiff(want.grads.Tensor(s.Name), got.grads.Tensor(s.Name)); d > tol.GradRel {
			t.Errorf("gradient of %s differs by %.2g of its largest magnitude (limit %g)", s.Name, d, tol.GradRel)
		}
	}
	t.Logf("loss bf16 %.6f, fp32 %.6f", got.loss, want.loss)
}
