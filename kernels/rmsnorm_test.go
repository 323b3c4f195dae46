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
	// The kernels that keep the residual stream's gradient in fp32.
	t.Setenv("KILN_CUDA_DRESID", "fp32")
	for _, d := range []int{512, 768} {
		t.Run(fmt.Sprintf("d=%d", d), func(t *testing.T) {
			c := model.Config{VocabSize: 256, Hidden: d, Layers: 1, Heads: d / 64, KVHeads: d / 64, HeadDim: 64, Intermediate: 64,
				MaxPositions: 64, RopeTheta: 10000, RMSNormEps: 1e-5}
			e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: 64})
			name := e.normBackBF()
			if name == "rmsnorm_bwd_warp_bf" {
				t.Fatalf("width %d takes the general kernel; want one sized for it", d)
			}
			// Not a multiple of a block's 8 rows, and more than a grid of
			// two blocks an SM takes at once on any GPU up to 312 SMs
			// (2 x 312 x 8 rows): warps take two or three rows each.
			const N = 5001
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

// With the residual stream's gradient in bf16 alone (the default; not
// KILN_CUDA_DRESID=fp32) each norm's backward reads dx in bf16 and writes it
// back in bf16: from the
// same bf16 values, its dx is the same bits as the bf16 copy the fp32
// kernel writes, and its dw the same bits, for the sized widths and the
// general kernel. A bf16 training step then launches those kernels and the
// embedding's backward that reads bf16, and nothing of the fp32 path.
func TestNormBackwardBF16ResidualGradient(t *testing.T) {
	skipWithoutGPU(t)
	for _, d := range []int{512, 768, 640} {
		t.Run(fmt.Sprintf("d=%d", d), func(t *testing.T) {
			c := model.Config{VocabSize: 256, Hidden: d, Layers: 1, Heads: d / 64, KVHeads: d / 64, HeadDim: 64, Intermediate: 64,
				MaxPositions: 64, RopeTheta: 10000, RMSNormEps: 1e-5}
			e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: 64})
			if !e.dresidBF() {
				t.Fatal("the dense bf16 flash path keeps the residual stream's gradient in fp32")
			}
			kb, k32 := e.normBackBF(), warpNormFor(d).bwd
			if kb != warpNormFor(d).bwdB {
				t.Fatalf("kernel %s is not a bf16-gradient one", kb)
			}
			const N = 5001 // as in TestNormBackwardWidthKernels
			r := rand.New(rand.NewPCG(uint64(d), 5))
			x, w, rstd := make([]float32, N*d), make([]float32, d), make([]float32, N)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			for i := range w {
				w[i] = float32(1 + 0.1*r.NormFloat64())
			}
			for i := range rstd {
				rstd[i] = float32(0.5 + r.Float64())
			}
			dx0 := bf16Values(r, N*d) // values a bf16 gradient can hold
			dy := toBF16Bits(bf16Values(r, N*d))
			var fp32Copy, bfOut []uint16
			var dw32, dwBF []float32
			err := e.th.do(func() error {
				b := &testBuffers{e: e}
				pdx, pdxb, pdxOnly := upload(b, dx0), b.alloc(int64(N*d)*2), upload(b, toBF16Bits(dx0))
				pdw32, pdwBF, pdy := upload(b, make([]float32, d)), upload(b, make([]float32, d)), upload(b, dy)
				px, pw, pr := upload(b, x), upload(b, w), upload(b, rstd)
				if b.err != nil {
					return b.err
				}
				if err := e.normBackward(k32, pdx, pdxb, pdw32, pdy, px, pw, pr, N); err != nil {
					return err
				}
				if err := e.normBackward(kb, pdxOnly, 0, pdwBF, pdy, px, pw, pr, N); err != nil {
					return err
				}
				if err := e.normReduce(); err != nil {
					return err
				}
				fp32Copy, bfOut, dw32, dwBF = make([]uint16, N*d), make([]uint16, N*d), make([]float32, d), make([]float32, d)
				for _, dl := range []struct {
					dst any
					src cuda.Ptr
				}{{fp32Copy, pdxb}, {bfOut, pdxOnly}, {dw32, pdw32}, {dwBF, pdwBF}} {
					var err error
					switch v := dl.dst.(type) {
					case []uint16:
						err = cuda.Download(e.dv, v, dl.src)
					case []float32:
						err = cuda.Download(e.dv, v, dl.src)
					}
					if err != nil {
						return err
					}
				}
				return b.free()
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range bfOut {
				if bfOut[i] != fp32Copy[i] {
					t.Fatalf("%s: dx[%d] = %#04x, %s's bf16 copy %#04x", kb, i, bfOut[i], k32, fp32Copy[i])
				}
			}
			for j := range dwBF {
				if math.Float32bits(dwBF[j]) != math.Float32bits(dw32[j]) {
					t.Fatalf("%s: dw[%d] = %g, %s's %g", kb, j, dwBF[j], k32, dw32[j])
				}
			}
		})
	}
	t.Run("step", func(t *testing.T) {
		c, p, b := loadGolden(t, goldenDirs[1])
		e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: b.B, MaxSeq: b.T})
		if err := e.SetParams(p); err != nil {
			t.Fatal(err)
		}
		if err := e.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		n := e.LaunchCounts()
		norms := 2*c.Layers + 1
		if n["rmsnorm_bwd_warp_bfb"] != norms || n["embed_bwd_items_bf"] != 1 || n["rmsnorm_bwd_warp_bf"] != 0 || n["embed_bwd_items"] != 0 {
			t.Fatalf("launches %v: want rmsnorm_bwd_warp_bfb %d times and embed_bwd_items_bf once, and none of the fp32-gradient kernels", n, norms)
		}
	})
}

// The RMSNorm forward kernels sized for one width (rmsnorm_fwd_warp4 for
// 512 columns, _6 for 768) give the general kernel's bits: the output, its
// bf16 copy and 1/rms, over rows that do not fill a block's last warps.
func TestNormForwardWidthKernels(t *testing.T) {
	skipWithoutGPU(t)
	for _, d := range []int{512, 768} {
		t.Run(fmt.Sprintf("d=%d", d), func(t *testing.T) {
			c := model.Config{VocabSize: 256, Hidden: d, Layers: 1, Heads: d / 64, KVHeads: d / 64, HeadDim: 64, Intermediate: 64,
				MaxPositions: 64, RopeTheta: 10000, RMSNormEps: 1e-5}
			e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: 64})
			const N = 1001 // an odd count: a warp of the two-row kernels has one
			r := rand.New(rand.NewPCG(uint64(d), 7))
			x, w := make([]float32, N*d), make([]float32, d)
			for i := range x {
				x[i] = float32(3 * r.NormFloat64())
			}
			for i := range w {
				w[i] = float32(1 + 0.1*r.NormFloat64())
			}
			type out struct {
				y, rstd []float32
				yb      []uint16
			}
			run := func(general bool) out {
				o := out{y: make([]float32, N*d), rstd: make([]float32, N), yb: make([]uint16, N*d)}
				err := e.th.do(func() error {
					b := &testBuffers{e: e}
					px, pw, py, pyb, pr := upload(b, x), upload(b, w), b.alloc(int64(N*d)*4), b.alloc(int64(N*d)*2), b.alloc(int64(N)*4)
					if b.err != nil {
						return b.err
					}
					var err error
					if general {
						err = e.launch("rmsnorm_fwd_warp", blocks(int64(N), 8), 256, py, pyb, pr, px, pw, N, d, float32(c.RMSNormEps))
					} else {
						err = e.rmsnorm(py, pyb, pr, px, pw, N)
					}
					if err != nil {
						return err
					}
					if err := cuda.Download(e.dv, o.y, py); err != nil {
						return err
					}
					if err := cuda.Download(e.dv, o.yb, pyb); err != nil {
						return err
					}
					if err := cuda.Download(e.dv, o.rstd, pr); err != nil {
						return err
					}
					return b.free()
				})
				if err != nil {
					t.Fatal(err)
				}
				return o
			}
			got, want := run(false), run(true)
			if i := firstBitDiff(got.rstd, want.rstd); i >= 0 {
				t.Fatalf("1/rms of row %d: %g, the general kernel's %g", i, got.rstd[i], want.rstd[i])
			}
			if i := firstBitDiff(got.y, want.y); i >= 0 {
				t.Fatalf("y[%d] = %g, the general kernel's %g", i, got.y[i], want.y[i])
			}
			for i := range got.yb {
				if got.yb[i] != want.yb[i] {
					t.Fatalf("bf16 y[%d] = %#04x, the general kernel's %#04x", i, got.yb[i], want.yb[i])
				}
			}
		})
	}
}
