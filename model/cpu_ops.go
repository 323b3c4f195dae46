package model

import (
	"math"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// The CPU engine's building blocks. Every parallel loop splits its outputs
// into disjoint ranges, and every output is summed in one fixed order by one
// goroutine, so results do not depend on scheduling: two runs with the same
// inputs give the same bits (the trainer's exact-resume test relies on it).

// gemm is gonum's pure-Go BLAS. Its Sgemm runs SSE assembly for the inner
// dot and axpy loops and splits C into 64x64 blocks, each summed along k in
// order by one goroutine, so it is deterministic. It beat the hand-blocked
// loops of matmulNT by the margin recorded in docs/benchmarks/model.md.
var gemm gonum.Implementation

// linear computes y(n,out) = x(n,in) @ w(out,in)^T: a forward projection
// with the weight stored as transformers stores it.
func linear(y, x, w []float32, n, in, out int) {
	gemm.Sgemm(blas.NoTrans, blas.Trans, n, out, in, 1, x, in, w, in, 0, y, out)
}

// linearBackX computes dx(n,in) = dy(n,out) @ w(out,in), adding to dx when
// accumulate is set (several projections read the same input).
func linearBackX(dx, dy, w []float32, n, in, out int, accumulate bool) {
	var beta float32
	if accumulate {
		beta = 1
	}
	gemm.Sgemm(blas.NoTrans, blas.NoTrans, n, in, out, 1, dy, out, w, in, beta, dx, in)
}

// linearBackW adds dy(n,out)^T @ x(n,in) to dw(out,in).
func linearBackW(dw, dy, x []float32, n, in, out int) {
	gemm.Sgemm(blas.Trans, blas.NoTrans, out, in, n, 1, dy, out, x, in, 1, dw, in)
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

// softmaxRow turns scores into probabilities in place (max-subtracted, the
// sum taken in float64).
func softmaxRow(s []float32) {
	m := float32(math.Inf(-1))
	for _, v := range s {
		m = max(m, v)
	}
	var sum float64
	for i, v := range s {
		e := float32(math.Exp(float64(v - m)))
		s[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range s {
		s[i] *= inv
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

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

// matmulNT is the hand-written alternative to gemm for y = x @ w^T: rows
// in parallel, 4 outputs at a time so each x row is read once per 4
// weight rows. Kept for the benchmark that chose gemm.
func matmulNT(threads int, y, x, w []float32, n, in, out int) {
	parallelFor(threads, n, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			xr := x[i*in : (i+1)*in]
			yr := y[i*out : (i+1)*out]
			j := 0
			for ; j+4 <= out; j += 4 {
				w0, w1, w2, w3 := w[j*in:(j+1)*in], w[(j+1)*in:(j+2)*in], w[(j+2)*in:(j+3)*in], w[(j+3)*in:(j+4)*in]
				var s0, s1, s2, s3 float32
				for k, v := range xr {
					s0 += v * w0[k]
					s1 += v * w1[k]
					s2 += v * w2[k]
					s3 += v * w3[k]
				}
				yr[j], yr[j+1], yr[j+2], yr[j+3] = s0, s1, s2, s3
			}
			for ; j < out; j++ {
				yr[j] = dot(xr, w[j*in:(j+1)*in])
			}
		}
	})
}
