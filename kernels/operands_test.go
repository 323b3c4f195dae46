package kernels

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// In bf16 precision the kernels that produce GEMM inputs write them in bf16,
// so a training step runs no conversion pass: none with flash attention,
// and through the straightforward attention, whose kernels write fp32, four
// per layer: the attention output for the output projection's forward and
// weight-gradient GEMMs, dv for the value projection's two backward GEMMs. A count above these
// means some GEMM operand lost its bf16 copy and is converted again.
func TestBF16StepConvertsNoActivations(t *testing.T) {
	c, p, b := loadGolden(t, goldenDirs[1])
	for _, v := range []struct {
		name, attention, head string
		want                  int
	}{
		{"flash", "", "", 0},
		{"naive attention", "naive", "", 4 * c.Layers},
		{"fp32 head", "", "fp32", 0},
		{"fp32 head backward", "", "fp32-backward", 0},
		{"tf32 head", "", "tf32", 0},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Setenv("KILN_CUDA_ATTENTION", v.attention)
			t.Setenv("KILN_CUDA_HEAD", v.head)
			e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: b.B, MaxSeq: b.T})
			if err := e.SetParams(p); err != nil {
				t.Fatal(err)
			}
			before := e.LaunchCounts()["f32_to_bf16"]
			if err := e.ForwardBackward(b, 1); err != nil {
				t.Fatal(err)
			}
			if got := e.LaunchCounts()["f32_to_bf16"] - before; got != v.want {
				t.Errorf("a bf16 forward and backward ran %d conversion passes, want %d", got, v.want)
			}
			if _, err := e.Metrics(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The bf16 variants that route the LM head's gradient or the attention
// output through other buffers, run the head on TF32 tensor cores, or keep
// the residual stream's gradient in fp32 with a bf16 copy, still agree with
// transformers on both golden models (the default bf16 path is
// TestGoldenBF16's).
func TestBF16VariantsMatchTransformers(t *testing.T) {
	skipWithoutGPU(t)
	for _, v := range []struct{ name, attention, head, dresid string }{
		{"naive attention", "naive", "", ""},
		{"fp32 head", "", "fp32", ""},
		{"fp32 head forward", "", "fp32-forward", ""},
		{"fp32 head backward", "", "fp32-backward", ""},
		{"tf32 head", "", "tf32", ""},
		{"fp32 residual gradient", "", "", "fp32"},
	} {
		for _, dir := range goldenDirs {
			t.Run(v.name+"/"+filepath.Base(dir), func(t *testing.T) {
				t.Setenv("KILN_CUDA_ATTENTION", v.attention)
				t.Setenv("KILN_CUDA_HEAD", v.head)
				t.Setenv("KILN_CUDA_DRESID", v.dresid)
				tol := BF16Tolerances
				verify(t, dir, "bf16", &tol)
			})
		}
	}
}

// Generation in bf16 reads its attention output without a bf16 copy (the
// cached-key kernel writes fp32) and still runs to the end.
func TestGenerateBF16(t *testing.T) {
	c, p, b := loadGolden(t, goldenDirs[1])
	const n = 16
	prompt := b.Inputs[:8]
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: len(prompt) + n})
	if err := e.SetParams(p); err != nil {
		t.Fatal(err)
	}
	out, err := e.Generate(context.Background(), prompt, n, -1, model.Sampling{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != n {
		t.Fatalf("generated %d tokens, want %d", len(out), n)
	}
	for i, id := range out {
		if id < 0 || int(id) >= c.VocabSize {
			t.Fatalf("token %d is %d, outside the vocabulary of %d", i, id, c.VocabSize)
		}
	}
}
