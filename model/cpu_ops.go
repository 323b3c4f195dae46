package model

import (
	"math"
	"sync"

	"github.com/kiln-lm/kiln/model/gemm"
)

// The CPU engine's building blocks. Every parallel loop splits its outputs
// into disjoint ranges, and every output is summed in one fixed order by one
// goroutine, so results do not depend on scheduling: two runs with the same
// inputs give the same bits (the trainer's exact-resume test relies on it).

// The matrix products run on model/gemm with the engine's threads: packed
// panels and an AVX2/FMA micro-kernel, 5-8x gonum's Sgemm that they
// replaced (docs/benchmarks/model.md). gemm splits C among its threads and
// sums each element along k in one order, so the bits do not depend on the
// thread count either.

// linear computes y(n,out) = x(n,in) @ w(out,in)^T: a forward projection
// with the weight stored as transformers stores it.
func linear(threads int, y, x, w []float32, n, in, out int) {
	gemm.Sgemm(threads, false, true, n, out, in, x, in, w, in, 0, y, out)
}

// linearBackX computes dx(n,in) = dy(n,out) @ w(out,in), adding to dx when
// accumulate is set (several projections read the same input).
func linearBackX(threads int, dx, dy, w []float32, n, in, out int, accumulate bool) {
	var beta float32
	if accumulate {
		beta = 1
	}
	gemm.Sgemm(threads, false, false, n, in, out, dy, out, w, in, beta, dx, in)
}

// linearBackW adds dy(n,out)^T @ x(n,in) to dw(out,in).
func linearBackW(threads int, dw, dy, x []float32, n, in, out int) {
	gemm.Sgemm(threads, true, false, out, in, n, dy, out, x, in, 1, dw, in)
}

// parallelFor runs f over [0,n) split into at most threads contiguous
// ranges. Each index belongs to exactly one range.
func parallelFor(threads, n int, f func(lo, hi int)) {
	if threads > n {
		threads = n
	}
	if threads <= 1 {
		if n > 0 {
			f(0, n)
		}
		return
	}
	chunk := (n + threads - 1) / threads
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
}

// rmsNorm computes y = w * (x * rstd) per row of width d, as transformers'
// LlamaRMSNorm does, and keeps rstd (n) for the backward pass.
func rmsNorm(y, rstd, x, w []float32, n, d int, eps float64) {
	for i := 0; i < n; i++ {
		row := x[i*d : (i+1)*d]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		r := float32(1 / math.Sqrt(ss/float64(d)+eps))
		rstd[i] = r
		out := y[i*d : (i+1)*d]
		for j, v := range row {
			out[j] = w[j] * (v * r)
		}
	}
}

// rmsNormBack adds to dx (n,d) the input gradient of rmsNorm and to dw (d)
// the weight gradient, given dy. With xh = x*r:
// dx = r*(dy*w) - x * r^3/d * sum(dy*w*x); dw += sum over rows of dy*xh.
func rmsNormBack(dx, dw, dy, x, w, rstd []float32, n, d int) {
	for i := 0; i < n; i++ {
		xr, dyr, dxr := x[i*d:(i+1)*d], dy[i*d:(i+1)*d], dx[i*d:(i+1)*d]
		r := rstd[i]
		var dot float64
		for j := range xr {
			dot += float64(dyr[j] * w[j] * xr[j])
		}
		c := float32(dot * float64(r) * float64(r) * float64(r) / float64(d))
		for j := range xr {
			dxr[j] += r*(dyr[j]*w[j]) - xr[j]*c
			dw[j] += dyr[j] * (xr[j] * r)
		}
	}
}

// ropeTable holds cos and sin of every (position, frequency) pair, computed
// in float32 steps as transformers' LlamaRotaryEmbedding does, so that long
// positions round the same way.
type ropeTable struct {
	half     int
	cos, sin []float32 // (positions, half)
	invFreq  []float32
}

func newRopeTable(headDim int, theta float64) *ropeTable {
	half := headDim / 2
	t := &ropeTable{half: half, invFreq: make([]float32, half)}
	for i := 0; i < half; i++ {
		exp := float32(2*i) / float32(headDim)
		t.invFreq[i] = float32(1 / float32(math.Pow(theta, float64(exp))))
	}
	return t
}

// ensure extends the table to at least n positions.
func (t *ropeTable) ensure(n int) {
	have := len(t.cos) / t.half
	for p := have; p < n; p++ {
		for i := 0; i < t.half; i++ {
			a := float64(t.invFreq[i] * float32(p))
			t.cos = append(t.cos, float32(math.Cos(a)))
			t.sin = append(t.sin, float32(math.Sin(a)))
		}
	}
}

// rope rotates each head of width hd in x (rows of heads*hd) by its row's
// position; inverse applies the transposed rotation, which is the backward
// pass.
func (t *ropeTable) rope(x []float32, pos []int, heads, hd int, inverse bool) {
	RotateHalf(x, t.cos, t.sin, pos, heads, hd, inverse)
}

// RopeTables returns cos and sin of every (position, frequency) pair for
// positions 0 .. positions-1, (positions, headDim/2) each, computed as
// transformers' LlamaRotaryEmbedding computes them: what every engine
// rotates with.
func RopeTables(headDim int, theta float64, positions int) (cos, sin []float32) {
	t := newRopeTable(headDim, theta)
	t.ensure(positions)
	return t.cos, t.sin
}

// RotateHalf rotates each head of width hd in x (rows of heads*hd) by its
// row's position in pos, with RopeTables' cos and sin, in the
// "rotate_half" layout: the pairs are (i, i+hd/2). inverse applies the
// transposed rotation, which is the backward pass.
func RotateHalf(x, cos, sin []float32, pos []int, heads, hd int, inverse bool) {
	half := hd / 2
	width := heads * hd
	for r, p := range pos {
		c, s := cos[p*half:(p+1)*half], sin[p*half:(p+1)*half]
		row := x[r*width : (r+1)*width]
		for h := 0; h < heads; h++ {
			v := row[h*hd : (h+1)*hd]
			for i := 0; i < half; i++ {
				a, b := v[i], v[i+half]
				if inverse {
					v[i] = a*c[i] + b*s[i]
					v[i+half] = b*c[i] - a*s[i]
				} else {
					v[i] = a*c[i] - b*s[i]
					v[i+half] = b*c[i] + a*s[i]
				}
			}
		}
	}
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func axpy(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

// exp32 is e^x in float32 to within 2 ulp of the correctly rounded value
// (TestExp32) for x in [-87, 88], 0 below and +Inf above: Cephes' expf, a
// degree-6 polynomial on the remainder of x's power of two. math.Exp, in
// float64, was a third of a training step at the demo's shape, where the
// loss takes one for each of the vocabulary's logits of every position.
func exp32(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		c1    = 0.693359375 // ln 2 in two parts, the first exact in float32
		c2    = -2.12194440e-4
	)
	if x < -87.33654 {
		return 0
	}
	if x > 88.72283 {
		return float32(math.Inf(1))
	}
	// n = round(x log2 e), by truncation of a positive number.
	n := int32(x*log2e+0.5+128) - 128
	fn := float32(n)
	r := x - fn*c1 - fn*c2
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	p = p*r*r + r + 1
	// 2^n for n in [-126, 128]; 2^128 is not a float32, so as 2 x 2^127.
	if n > 127 {
		return 2 * p * math.Float32frombits(uint32(254)<<23)
	}
	return p * math.Float32frombits(uint32(n+127)<<23)
}

// expSum sets dst[i] = e^(src[i]-m), for src[i] <= m (a max-subtracted
// softmax), and returns their sum in float64: eight at a time in assembly
// where the CPU has AVX2, the rest by exp32. dst may be src.
func expSum(dst, src []float32, m float32) float64 {
	dst = dst[:len(src)]
	var sum float64
	n := 0
	if hasAVX2 && len(src) >= 8 {
		n = len(src) &^ 7
		sum = expSumAVX2(&dst[0], &src[0], n, m)
	}
	for i := n; i < len(src); i++ {
		e := exp32(src[i] - m)
		dst[i] = e
		sum += float64(e)
	}
	return sum
}

// softmaxRow turns scores into probabilities in place (max-subtracted, the
// sum taken in float64).
func softmaxRow(s []float32) {
	m := float32(math.Inf(-1))
	for _, v := range s {
		m = max(m, v)
	}
	sum := expSum(s, s, m)
	inv := float32(1 / sum)
	for i := range s {
		s[i] *= inv
	}
}

func sigmoid(x float32) float32 { return 1 / (1 + exp32(-x)) }

// swiglu computes h = silu(g) * u.
func swiglu(h, g, u []float32) {
	for i := range h {
		h[i] = g[i] * sigmoid(g[i]) * u[i]
	}
}

// swigluBack turns dh into dg (written over g's gradient) and du.
func swigluBack(dg, du, dh, g, u []float32) {
	for i := range dh {
		s := sigmoid(g[i])
		silu := g[i] * s
		du[i] = dh[i] * silu
		dg[i] = dh[i] * u[i] * s * (1 + g[i]*(1-s))
	}
}
