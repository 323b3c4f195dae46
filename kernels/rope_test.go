package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// rope_bf16 rotates the query and key heads of the fused projection's bf16
// rows in place, as the fp32 rope kernel rotates the same values into bf16,
// at every position of two sequences; the value heads after them and the
// row's padding are left as they were. The two kernels' multiply-adds are
// contracted by the compiler, each in its own way, so a value may round to
// the neighbouring bf16 (rarely: the first one at row 385 of 400). Each must
// be within one bf16 step of the other kernel's, or, where the rotation
// nearly cancels, within the fp32 rounding of its two products.
func TestRopeBF16MatchesRope(t *testing.T) {
	skipWithoutGPU(t)
	const B, T, H, KV, D = 2, 200, 8, 4, 64
	c := model.Config{VocabSize: 256, Hidden: H * D, Layers: 1, Heads: H, KVHeads: KV, HeadDim: D, Intermediate: 64,
		MaxPositions: T, RopeTheta: 10000, RMSNormEps: 1e-5}
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
	N, nh := B*T, H+KV
	ld := (H+2*KV)*D + 8 // the value heads, then padding the kernel must not touch
	r := rand.New(rand.NewPCG(11, 13))
	rows := bf16Values(r, N*ld)
	in := toBF16Bits(rows)
	// The rotated columns, packed, for the fp32 kernel.
	packed := make([]float32, N*nh*D)
	for n := 0; n < N; n++ {
		copy(packed[n*nh*D:(n+1)*nh*D], rows[n*ld:n*ld+nh*D])
	}
	got, want := make([]uint16, N*ld), make([]uint16, N*nh*D)
	err := e.th.do(func() error {
		b := &testBuffers{e: e}
		px, pp, pw := upload(b, in), upload(b, packed), b.alloc(int64(N*nh*D)*2)
		if b.err != nil {
			return b.err
		}
		if err := e.ropeBF16(px, N, T, nh, ld); err != nil {
			return err
		}
		if err := e.rope(pp, pw, N, T, nh, 0, 1); err != nil {
			return err
		}
		if err := cuda.Download(e.dv, got, px); err != nil {
			return err
		}
		if err := cuda.Download(e.dv, want, pw); err != nil {
			return err
		}
		return b.free()
	})
	if err != nil {
		t.Fatal(err)
	}
	bf := func(v uint16) float64 { return float64(math.Float32frombits(uint32(v) << 16)) }
	same := 0
	for n := 0; n < N; n++ {
		for j := 0; j < ld; j++ {
			g := got[n*ld+j]
			if j < nh*D {
				w := want[n*nh*D+j]
				if g == w {
					same++
					continue
				}
				// The pair's two inputs: this column and the one half a
				// head away.
				h, i := j/D, j%D
				p := h*D + (i+D/2)%D
				scale := math.Abs(bf(in[n*ld+j])) + math.Abs(bf(in[n*ld+p]))
				step := math.Max(math.Abs(bf(g)), math.Abs(bf(w))) / 128 // a bf16 step at most
				if diff := math.Abs(bf(g) - bf(w)); diff > step+scale*0x1p-22 {
					t.Fatalf("row %d (position %d), column %d: %#04x (%g), the fp32 kernel's %#04x (%g)", n, n%T, j, g, bf(g), w, bf(w))
				}
			} else if g != in[n*ld+j] {
				t.Fatalf("row %d, column %d past the rotated heads changed: %#04x, was %#04x", n, j, g, in[n*ld+j])
			}
		}
	}
	if total := N * nh * D; same < total*999/1000 {
		t.Fatalf("%d of %d rotated values are the fp32 kernel's bits; the arithmetic differs by more than the compiler's contractions", same, total)
	}
}
