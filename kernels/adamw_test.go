package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// adamw_flat, four elements a thread, against torch.optim.AdamW's update in
// float64 after clip_grad_norm_: on lengths that are not a multiple of
// four, with no-decay ranges that begin and end inside a thread's four
// elements, with the clip scaling the gradient (written back) and not. A
// step size and decay large enough that a wrongly decayed element is off by
// 5% of its value; the kernel's fp32 arithmetic is held to 1e-5 of each
// value (and 1e-7 absolute, for values that cancel to nearly nothing).
func TestAdamWFlatMatchesTorchUpdate(t *testing.T) {
	c := attnConfig(4, 2)
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: 64})
	for _, tc := range []struct {
		n      int
		ranges []int64
		clip   float32
	}{
		{1, nil, 0}, {7, []int64{1, 2, 5, 7}, 1}, {1030, []int64{3, 10, 13, 14, 512, 1029}, 0.5}, {4096, []int64{0, 4096}, 0},
		{1027, []int64{2, 6, 1024, 1027}, 1e9},
	} {
		t.Run(fmt.Sprintf("n=%d/clip=%g", tc.n, tc.clip), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.n), 5))
			vals := func(scale float64) []float32 {
				x := make([]float32, tc.n)
				for i := range x {
					x[i] = float32(r.NormFloat64() * scale)
				}
				return x
			}
			p, g, m := vals(1), vals(0.5), vals(0.1)
			v := make([]float32, tc.n)
			for i := range v {
				v[i] = float32(r.Float64() * 0.01)
			}
			var sum float64
			for _, x := range g {
				sum += float64(x) * float64(x)
			}
			nrm := float32(math.Sqrt(sum))
			const lr, wd, step = 0.05, 1.0, 3
			hp := []float32{0.9, 0.95, 1e-8, float32(1 - lr*wd), tc.clip, float32(0.05 / (1 - math.Pow(0.9, step))), float32(math.Sqrt(1 - math.Pow(0.95, step)))}
			// The reference takes the hyper-parameters as the kernel gets
			// them, in fp32.
			b1, b2, eps, stepSize, bc2 := float64(hp[0]), float64(hp[1]), float64(hp[2]), float64(hp[5]), float64(hp[6])
			got := struct{ p, m, v, g []float32 }{make([]float32, tc.n), make([]float32, tc.n), make([]float32, tc.n), make([]float32, tc.n)}
			wbf := make([]uint16, tc.n)
			err := e.th.do(func() error {
				b := &testBuffers{e: e}
				dp, dm, dv, dg := upload(b, p), upload(b, m), upload(b, v), upload(b, g)
				dn, dh := upload(b, []float32{nrm}), upload(b, hp)
				dw := b.alloc(int64(2 * tc.n))
				ranges := tc.ranges
				if len(ranges) == 0 {
					ranges = []int64{0, 0} // a buffer to point at; nranges says none
				}
				dr := upload(b, ranges)
				if b.err != nil {
					return b.err
				}
				if err := e.launch("adamw_flat", blocks(int64(tc.n+3)/4, 256), 256, dp, dm, dv, dg, dw, dn, int64(tc.n), dr,
					len(tc.ranges)/2, dh); err != nil {
					return err
				}
				for _, o := range []struct {
					dst []float32
					src cuda.Ptr
				}{{got.p, dp}, {got.m, dm}, {got.v, dv}, {got.g, dg}} {
					if err := cuda.Download(e.dv, o.dst, o.src); err != nil {
						return err
					}
				}
				if err := cuda.Download(e.dv, wbf, dw); err != nil {
					return err
				}
				return b.free()
			})
			if err != nil {
				t.Fatal(err)
			}
			scale := 1.0
			if tc.clip > 0 {
				scale = math.Min(1, float64(tc.clip)/(float64(nrm)+1e-6))
			}
			for i := range p {
				decay := float64(hp[3])
				for k := 0; k+1 < len(tc.ranges); k += 2 {
					if int64(i) >= tc.ranges[k] && int64(i) < tc.ranges[k+1] {
						decay = 1
					}
				}
				gi := float64(g[i]) * scale
				mi := float64(m[i]) + (1-b1)*(gi-float64(m[i]))
				vi := b2*float64(v[i]) + (1-b2)*gi*gi
				pi := float64(p[i])*decay - stepSize*mi/(math.Sqrt(vi)/bc2+eps)
				for _, c := range []struct {
					name      string
					got, want float64
				}{{"p", float64(got.p[i]), pi}, {"m", float64(got.m[i]), mi}, {"v", float64(got.v[i]), vi}, {"g", float64(got.g[i]), gi}} {
					if d := math.Abs(c.got - c.want); d > 1e-5*math.Abs(c.want)+1e-7 {
						t.Fatalf("%s[%d] = %g, want %g (decay %g)", c.name, i, c.got, c.want, decay)
					}
				}
				if wbf[i] != model.ToBF16(got.p[i]) {
					t.Fatalf("bf16 copy [%d] = %#04x, want %#04x", i, wbf[i], model.ToBF16(got.p[i]))
				}
			}
		})
	}
}
