package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

func TestXentKernelFor(t *testing.T) {
	for _, c := range []struct {
		V    int
		bf   bool
		want string
	}{
		{16384, true, "xent_fwd_bwd_r8"}, // small
		{32000, true, "xent_fwd_bwd_r16"},
		{4096, true, "xent_fwd_bwd_r8"},
		{8, true, "xent_fwd_bwd_r8"},
		{32768, true, "xent_fwd_bwd_r16"},
		{32776, true, "xent_fwd_bwd"}, // a row too wide for the registers
		{1020, true, "xent_fwd_bwd"},  // not a multiple of 8
		{16384, false, "xent_fwd_bwd"},
	} {
		if got := xentKernelFor(c.V, c.bf); got != c.want {
			t.Errorf("xentKernelFor(%d, %v) = %s, want %s", c.V, c.bf, got, c.want)
		}
	}
}

// The loss kernels that hold a row in registers give xent_fwd_bwd's bits
// on bf16 logits: each row's loss, and its gradient written over the
// logits or into a buffer of its own, for rows that fill the registers
// (16384, 32000: a block's last groups left empty) and one that uses a
// few threads (1032), rows whose target is ignored (-1), and targets in
// every position of their group of eight.
func TestXentRegisterRowsGiveTheLoopsBits(t *testing.T) {
	skipWithoutGPU(t)
	c := model.Config{VocabSize: 256, Hidden: 128, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 64, Intermediate: 64,
		MaxPositions: 64, RopeTheta: 10000, RMSNormEps: 1e-5}
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: 64})
	for _, V := range []int{16384, 32000, 1032} {
		kernel := xentKernelFor(V, true)
		if kernel == "xent_fwd_bwd" {
			t.Fatalf("V %d: no register kernel", V)
		}
		const N = 67
		r := rand.New(rand.NewPCG(uint64(V), 3))
		logits := make([]float32, N*V)
		for i := range logits {
			logits[i] = float32(4 * r.NormFloat64())
		}
		bits := toBF16Bits(logits)
		targets := make([]int32, N)
		for i := range targets {
			targets[i] = int32(r.IntN(V))
			if i < 8 {
				targets[i] = int32(8*r.IntN(V/8) + i) // each position of a group
			}
			if i%11 == 5 {
				targets[i] = -1
			}
		}
		for _, own := range []bool{false, true} {
			t.Run(fmt.Sprintf("V=%d/own-buffer=%v", V, own), func(t *testing.T) {
				type out struct {
					losses []float32
					grad   []uint16
				}
				run := func(name string) out {
					o := out{losses: make([]float32, N), grad: make([]uint16, N*V)}
					err := e.th.do(func() error {
						b := &testBuffers{e: e}
						pl, pt, ps := upload(b, bits), upload(b, targets), upload(b, []float32{0.37})
						loss, dlb := b.alloc(int64(N)*4), cuda.Ptr(0)
						if own {
							dlb = b.alloc(int64(N*V) * 2)
						}
						if b.err != nil {
							return b.err
						}
						if err := e.launch(name, N, 256, pl, dlb, loss, pt, V, ps, 1, 1); err != nil {
							return err
						}
						if err := cuda.Download(e.dv, o.losses, loss); err != nil {
							return err
						}
						src := pl
						if own {
							src = dlb
						}
						if err := cuda.Download(e.dv, o.grad, src); err != nil {
							return err
						}
						return b.free()
					})
					if err != nil {
						t.Fatal(err)
					}
					return o
				}
				got, want := run(kernel), run("xent_fwd_bwd")
				if i := firstBitDiff(got.losses, want.losses); i >= 0 {
					t.Fatalf("%s: loss of row %d %g, xent_fwd_bwd's %g", kernel, i, got.losses[i], want.losses[i])
				}
				for i := range want.grad {
					if got.grad[i] != want.grad[i] {
						t.Fatalf("%s: gradient [%d][%d] %#04x, xent_fwd_bwd's %#04x", kernel, i/V, i%V, got.grad[i], want.grad[i])
					}
				}
				var sum float64
				for i, l := range got.losses {
					if targets[i] >= 0 && (math.IsNaN(float64(l)) || l <= 0) {
						t.Fatalf("row %d: loss %g", i, l)
					}
					sum += float64(l)
				}
				if sum == 0 {
					t.Fatal("every loss is 0")
				}
			})
		}
	}
}
