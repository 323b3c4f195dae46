package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// The RMSNorm backward kernels sized for one width (rmsnorm_bwd_warp_bf4
// for 512 columns, _bf6 for 768) against the general one and against the
// formula in float64: dx += r dy w - r^3 x mean(dy w x), dw += sum dy x r,
// with dy in bf16. The same arithmetic in the same order gives the same dx
// bits; dw, summed block by block and then over blocks in a fixed order,
// comes out the same on every run.
func TestNormBackwardWidthKernels(t *testing.T) {
	skipWithoutGPU(t)
	for _, d := range []int{512, 768} {
		t.Run(fmt.Sprintf("d=%d", d), func(t *testing.T) {
			c := model.Config{VocabSize: 256, Hidden: d, Layers: 1, Heads: d / 64, KVHeads: d / 64, HeadDim: 64, Intermediate: 64,
				MaxPositions: 64, RopeTheta: 10000, RMSNormEps: 1e-5}
			e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: 64})
			name := e.normBackBF()
			if name == "rmsnorm_bwd_warp_bf" {
				t.Fatalf("width %d takes the general kernel; want one sized for it", d)
			}
			const N = 1000 // not a multiple of a block's 8 rows
			r := rand.New(rand.NewPCG(uint64(d), 3))
			x, dx0, w, rstd := make([]float32, N*d), make([]float32, N*d), make([]float32, d), make([]float32, N)
			for i := range x {
				x[i], dx0[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
			}
			for i := range w {
				w[i] = float32(1 + 0.1*r.NormFloat64())
			}
			for i := range rstd {
				rstd[i] = float32(0.5 + r.Float64())
			}
			dy := toBF16Bits(bf16Values(r, N*d))
			type out struct {
				dx, dw []float32
				dxb    []uint16
			}
			run := func(kernel string) out {
				o := out{dx: make([]float32, N*d), dw: make([]float32, d), dxb: make([]uint16, N*d)}
				err := e.th.do(func() error {
					b := &testBuffers{e: e}
					pdx, pdxb, pdw, pdy := upload(b, dx0), b.alloc(int64(N*d)*2), upload(b, make([]float32, d)), upload(b, dy)
					px, pw, pr := upload(b, x), upload(b, w), upload(b, rstd)
					if b.err != nil {
						return b.err
					}
					if err := e.normBackward(kernel, pdx, pdxb, pdw, pdy, px, pw, pr, N); err != nil {
						return err
					}
					if err := e.normReduce(); err != nil {
						return err
					}
					if err := cuda.Download(e.dv, o.dx, pdx); err != nil {
						return err
					}
					if err := cuda.Download(e.dv, o.dxb, pdxb); err != nil {
						return err
					}
					if err := cuda.Download(e.dv, o.dw, pdw); err != nil {
						return err
					}
					return b.free()
				})
				if err != nil {
					t.Fatal(err)
				}
				return o
			}
			got, general := run(name), run("rmsnorm_bwd_warp_bf")
			for i, v := range run(name).dw {
				if math.Float32bits(v) != math.Float32bits(got.dw[i]) {
					t.Fatalf("%s: dw[%d] = %g on one run and %g on the next", name, i, got.dw[i], v)
				}
			}
			for i := range got.dx {
				if math.Float32bits(got.dx[i]) != math.Float32bits(general.dx[i]) || got.dxb[i] != general.dxb[i] {
					t.Fatalf("%s: dx[%d] = %g (bf16 %#04x), the general kernel %g (%#04x)", name, i, got.dx[i], got.dxb[i], general.dx[i], general.dxb[i])
				}
			}
			// The formula in float64.
			wantDX, wantDW := make([]float32, N*d), make([]float64, d)
			for row := 0; row < N; row++ {
				rr := float64(rstd[row])
				var dot float64
				for j := 0; j < d; j++ {
					g := float64(math.Float32frombits(uint32(dy[row*d+j]) << 16))
					dot += g * float64(w[j]) * float64(x[row*d+j])
					wantDW[j] += g * float64(x[row*d+j]) * rr
				}
				dot /= float64(d)
				for j := 0; j < d; j++ {
					g := float64(math.Float32frombits(uint32(dy[row*d+j]) << 16))
					wantDX[row*d+j] = float32(float64(dx0[row*d+j]) + rr*g*float64(w[j]) - rr*rr*rr*float64(x[row*d+j])*dot)
				}
			}
			if e := maxRelErr(got.dx, wantDX); e > 1e-5 {
				t.Errorf("%s: dx off the float64 formula by %.2g of its largest value", name, e)
			}
			for _, o := range []struct {
				name string
				dw   []float32
			}{{name, got.dw}, {"rmsnorm_bwd_warp_bf", general.dw}} {
				want := make([]float32, d)
				for j := range want {
					want[j] = float32(wantDW[j])
				}
				if e := maxRelErr(o.dw, want); e > 1e-5 {
					t.Errorf("%s: dw off the float64 formula by %.2g of its largest value", o.name, e)
				}
			}
		})
	}
}
