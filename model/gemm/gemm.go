// Package gemm is the CPU engine's single-precision matrix product,
// C = A·B + beta·C with either operand transposed: the operands are packed
// into panels that stay in cache, and a 6x16 micro-kernel (AVX2 and FMA in
// assembly on amd64 CPUs that have them, Go elsewhere) accumulates each
// tile of C.
//
// Every element of C is summed along k in one fixed order, whatever the
// number of threads, so results are the same bits on any GOMAXPROCS: the
// threads split C's rows or columns, never k.
package gemm

import (
	"sync"
)

// Tile and block sizes: a 6x16 tile of C in twelve 8-float registers; a
// kc x 16 panel of B (16 KiB) in L1; an mc x kc block of A (96 KiB) and a
// kc x nc block of B (512 KiB) in L2 and L3. nc 2048 ran no faster.
const (
	mr = 6
	nr = 16
	kc = 256
	mc = 96
	nc = 512
)

// Sgemm computes C(m,n) = op(A)(m,k) · op(B)(k,n) + beta·C, row-major, where
// op(A) is A, or A transposed when transA (then A is k x m); likewise B.
// lda, ldb and ldc are the row strides of the matrices as stored. threads
// bounds the goroutines; 1 or less runs here.
func Sgemm(threads int, transA, transB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m <= 0 || n <= 0 {
		return
	}
	switch beta {
	case 1:
	case 0:
		for i := 0; i < m; i++ {
			clear(c[i*ldc : i*ldc+n])
		}
	default:
		for i := 0; i < m; i++ {
			for j, v := range c[i*ldc : i*ldc+n] {
				c[i*ldc+j] = beta * v
			}
		}
	}
	if k <= 0 {
		return
	}
	A := matrix{a, lda, transA}
	B := matrix{b, ldb, transB}
	// Split C among the threads by whole tiles: by columns when there are
	// enough of them (each thread packs only its own columns of B), else by
	// rows. Not too fine: a piece should be worth its packing.
	threads = min(threads, (m*n*k)/(1<<18)+1)
	if threads <= 1 {
		serial(A, B, c, ldc, 0, m, 0, n, k)
		return
	}
	var wg sync.WaitGroup
	split := func(total, unit int, run func(lo, hi int)) {
		tiles := (total + unit - 1) / unit
		per := (tiles + threads - 1) / threads
		for lo := 0; lo < total; lo += per * unit {
			hi := min(lo+per*unit, total)
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(lo, hi)
			}()
		}
	}
	if n/nr >= 2*threads {
		split(n, nr, func(lo, hi int) { serial(A, B, c, ldc, 0, m, lo, hi, k) })
	} else {
		split(m, mr, func(lo, hi int) { serial(A, B, c, ldc, lo, hi, 0, n, k) })
	}
	wg.Wait()
}

// matrix is an operand as stored: element (i, j) of op(X) is x[i*ld+j], or
// x[j*ld+i] when trans.
type matrix struct {
	x     []float32
	ld    int
	trans bool
}

// ScratchBytes is the packing space Sgemm holds for a call on threads
// threads: one set of buffers a thread, kept for the next call.
func ScratchBytes(threads int) int64 {
	return int64(max(threads, 1)) * int64(mr*kc+nc*kc+mr*nr) * 4
}

type buffers struct {
	a   [mr * kc]float32
	b   [nc * kc]float32
	tmp [mr * nr]float32
}

var pool = sync.Pool{New: func() any { return new(buffers) }}

// serial adds op(A)[i0:i1, :] · op(B)[:, j0:j1] into C[i0:i1, j0:j1]. B
// is packed a block at a time; A is read where it is stored, six rows of
// op(A) at a time, and only a last panel of fewer rows is packed.
func serial(A, B matrix, c []float32, ldc, i0, i1, j0, j1, k int) {
	buf := pool.Get().(*buffers)
	defer pool.Put(buf)
	rs, ps := A.ld, 1 // element (i, p) of op(A) at i*rs + p*ps
	if A.trans {
		rs, ps = 1, A.ld
	}
	for jc := j0; jc < j1; jc += nc {
		ncur := min(nc, j1-jc)
		for pc := 0; pc < k; pc += kc {
			kcur := min(kc, k-pc)
			packB(buf.b[:], B, pc, kcur, jc, ncur)
			for ic := i0; ic < i1; ic += mc {
				mcur := min(mc, i1-ic)
				edge := mcur - mcur%mr // the first row of a part panel
				if edge < mcur {
					packA(buf.a[:], A.x[(ic+edge)*rs+pc*ps:], rs, ps, mcur-edge, kcur)
				}
				for jr := 0; jr < ncur; jr += nr {
					bp := buf.b[jr*kcur:]
					for ir := 0; ir < mcur; ir += mr {
						a, ars, aps := A.x[(ic+ir)*rs+pc*ps:], rs, ps
						if ir >= edge {
							a, ars, aps = buf.a[:], 1, mr
						}
						off := (ic+ir)*ldc + jc + jr
						if ir+mr <= mcur && jr+nr <= ncur {
							kernel(kcur, a, ars, aps, bp, c[off:], ldc)
							continue
						}
						// An edge tile: into a full one, then the part
						// that exists.
						clear(buf.tmp[:])
						kernel(kcur, a, ars, aps, bp, buf.tmp[:], nr)
						rows, cols := min(mr, mcur-ir), min(nr, ncur-jr)
						for r := 0; r < rows; r++ {
							dst := c[off+r*ldc : off+r*ldc+cols]
							for j, v := range buf.tmp[r*nr : r*nr+cols] {
								dst[j] += v
							}
						}
					}
				}
			}
		}
	}
}

// packA writes rows (fewer than mr) rows of op(A), element (r, p) at
// a[r*rs+p*ps], as a panel of k steps of mr values padded with zeros: the
// last panel of a block, which the kernel cannot read where it is stored.
func packA(dst, a []float32, rs, ps, rows, k int) {
	for p := 0; p < k; p++ {
		step := dst[p*mr : p*mr+mr]
		for r := range step {
			step[r] = 0
			if r < rows {
				step[r] = a[r*rs+p*ps]
			}
		}
	}
}

// packB writes op(B)[p0:p0+k, j0:j0+n] as panels of nr columns, each k
// steps of nr values, the last panel padded with zeros.
func packB(dst []float32, B matrix, p0, k, j0, n int) {
	for jr := 0; jr < n; jr += nr {
		panel := dst[jr*k : jr*k+nr*k]
		cols := min(nr, n-jr)
		if B.trans {
			for j := 0; j < nr; j++ {
				if j >= cols {
					for p := 0; p < k; p++ {
						panel[p*nr+j] = 0
					}
					continue
				}
				col := B.x[(j0+jr+j)*B.ld+p0 : (j0+jr+j)*B.ld+p0+k]
				for p, v := range col {
					panel[p*nr+j] = v
				}
			}
			continue
		}
		for p := 0; p < k; p++ {
			row := B.x[(p0+p)*B.ld+j0+jr:]
			dst := (*[nr]float32)(panel[p*nr : p*nr+nr])
			if cols == nr {
				*dst = *(*[nr]float32)(row[:nr])
				continue
			}
			for j := range dst {
				dst[j] = 0
				if j < cols {
					dst[j] = row[j]
				}
			}
		}
	}
}

// kernelGo is the micro-kernel in Go: C[0:mr, 0:nr] (row stride ldc) +=
// the product of A's mr rows, element (r, p) at a[r*rs+p*ps], and a B
// panel of k steps.
func kernelGo(k int, a []float32, rs, ps int, b, c []float32, ldc int) {
	var acc [mr][nr]float32
	for p := 0; p < k; p++ {
		bp := (*[nr]float32)(b[p*nr : p*nr+nr])
		for r := range acc {
			av := a[r*rs+p*ps]
			row := &acc[r]
			for j, bv := range bp {
				row[j] += av * bv
			}
		}
	}
	for r := range acc {
		dst := (*[nr]float32)(c[r*ldc : r*ldc+nr])
		for j, v := range acc[r] {
			dst[j] += v
		}
	}
}
