package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	gonum "gonum.org/v1/gonum/blas/gonum"
)

func randomMatrix(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// reference is op(A)·op(B) + beta·C in float64, and the sum of the
// products' magnitudes per element, which bounds a float32 sum's error.
func reference(transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) (want, mag []float64) {
	want, mag = make([]float64, m*n), make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, g float64
			for p := 0; p < k; p++ {
				ai, bi := i*lda+p, p*ldb+j
				if transA {
					ai = p*lda + i
				}
				if transB {
					bi = j*ldb + p
				}
				av, bv := a[ai], b[bi]
				s += float64(av) * float64(bv)
				g += math.Abs(float64(av) * float64(bv))
			}
			cv := float64(beta) * float64(c[i*ldc+j])
			want[i*n+j], mag[i*n+j] = s+cv, g+math.Abs(cv)
		}
	}
	return want, mag
}

type shape struct {
	transA, transB bool
	m, n, k        int
	beta           float32
}

// stored is the stored rows and columns of op(A) and op(B).
func stored(transA, transB bool, m, n, k int) (rowsA, colsA, rowsB, colsB int) {
	rowsA, colsA, rowsB, colsB = m, k, k, n
	if transA {
		rowsA, colsA = k, m
	}
	if transB {
		rowsB, colsB = n, k
	}
	return
}

func shapes() []shape {
	var out []shape
	for _, t := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
		for _, d := range [][3]int{{1, 1, 1}, {6, 16, 1}, {7, 17, 3}, {5, 15, 300}, {96, 32, 256}, {97, 33, 257}, {13, 2100, 40}, {200, 48, 600}, {64, 64, 0}} {
			for _, beta := range []float32{0, 1, 0.5} {
				out = append(out, shape{t[0], t[1], d[0], d[1], d[2], beta})
			}
		}
	}
	return out
}

// Both micro-kernels, every transpose, edge tiles and blocks, beta 0, 1
// and other: each element within float32's rounding of the float64 sum,
// the strides wider than the rows, and nothing outside C touched.
func TestSgemmMatchesFloat64(t *testing.T) {
	kernels := map[string]bool{"go": false}
	if hasAVX2 {
		kernels["avx2"] = true
	}
	for name, asm := range kernels {
		t.Run(name, func(t *testing.T) {
			defer func(v bool) { setAVX2(v) }(hasAVX2)
			setAVX2(asm)
			r := rand.New(rand.NewPCG(1, 2))
			for _, s := range shapes() {
				rowsA, colsA, rowsB, colsB := stored(s.transA, s.transB, s.m, s.n, s.k)
				lda, ldb, ldc := colsA+3, colsB+1, s.n+5
				a := randomMatrix(r, max(rowsA*lda, 1))
				b := randomMatrix(r, max(rowsB*ldb, 1))
				c := randomMatrix(r, s.m*ldc+7)
				orig := append([]float32(nil), c...)
				want, mag := reference(s.transA, s.transB, s.m, s.n, s.k, a, lda, b, ldb, s.beta, c, ldc)
				Sgemm(3, s.transA, s.transB, s.m, s.n, s.k, a, lda, b, ldb, s.beta, c, ldc)
				for i := 0; i < s.m; i++ {
					for j := 0; j < s.n; j++ {
						got, w := float64(c[i*ldc+j]), want[i*s.n+j]
						if tol := 1e-6*mag[i*s.n+j]*math.Sqrt(float64(s.k+1)) + 1e-30; math.Abs(got-w) > tol {
							t.Fatalf("%+v: C[%d,%d] = %g, want %g (tolerance %g)", s, i, j, got, w, tol)
						}
					}
					for j := s.n; j < ldc && i*ldc+j < len(c); j++ {
						if c[i*ldc+j] != orig[i*ldc+j] {
							t.Fatalf("%+v: wrote C[%d,%d] past the row's %d columns", s, i, j, s.n)
						}
					}
				}
			}
		})
	}
}

// The threads split C, never k: the same bits on any number of threads.
func TestSgemmSameBitsOnAnyThreads(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range []shape{{false, true, 256, 1400, 128, 0}, {false, false, 300, 96, 700, 1}, {true, false, 128, 512, 1024, 1}} {
		rowsA, colsA, rowsB, colsB := stored(s.transA, s.transB, s.m, s.n, s.k)
		a, b := randomMatrix(r, rowsA*colsA), randomMatrix(r, rowsB*colsB)
		c0 := randomMatrix(r, s.m*s.n)
		var first []float32
		for _, threads := range []int{1, 2, 3, 8, 16} {
			c := append([]float32(nil), c0...)
			Sgemm(threads, s.transA, s.transB, s.m, s.n, s.k, a, colsA, b, colsB, s.beta, c, s.n)
			if first == nil {
				first = c
				continue
			}
			for i := range c {
				if math.Float32bits(c[i]) != math.Float32bits(first[i]) {
					t.Fatalf("%+v on %d threads: C[%d] = %g, on one thread %g", s, threads, i, c[i], first[i])
				}
			}
		}
	}
}

// BenchmarkSgemm is this package beside gonum's Sgemm on the CPU engine's
// shapes: the projections of tiny and small at 1024 tokens (y = x·wᵀ, the
// weight's and the input's gradients) and the LM head.
func BenchmarkSgemm(b *testing.B) {
	var impl gonum.Implementation
	for _, s := range []struct {
		name           string
		transA, transB bool
		m, n, k        int
	}{
		{"fwd-1024x512x512", false, true, 1024, 512, 512},
		{"fwd-1024x1408x512", false, true, 1024, 1408, 512},
		{"dx-1024x512x1408", false, false, 1024, 512, 1408},
		{"dw-512x512x1024", true, false, 512, 512, 1024},
		{"head-1024x4096x128", false, true, 1024, 4096, 128},
	} {
		r := rand.New(rand.NewPCG(5, 6))
		rowsA, colsA, rowsB, colsB := stored(s.transA, s.transB, s.m, s.n, s.k)
		x, w, y := randomMatrix(r, rowsA*colsA), randomMatrix(r, rowsB*colsB), make([]float32, s.m*s.n)
		flops := 2 * float64(s.m) * float64(s.n) * float64(s.k)
		tr := func(t bool) blas.Transpose {
			if t {
				return blas.Trans
			}
			return blas.NoTrans
		}
		b.Run(fmt.Sprintf("kiln/%s", s.name), func(b *testing.B) {
			for b.Loop() {
				Sgemm(threadsForBench(), s.transA, s.transB, s.m, s.n, s.k, x, colsA, w, colsB, 0, y, s.n)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(fmt.Sprintf("gonum/%s", s.name), func(b *testing.B) {
			for b.Loop() {
				impl.Sgemm(tr(s.transA), tr(s.transB), s.m, s.n, s.k, 1, x, colsA, w, colsB, 0, y, s.n)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
