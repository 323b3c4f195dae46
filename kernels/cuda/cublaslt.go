package cuda

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// cuBLAS enums used by the engine (cublas_api.h, library_types.h).
const (
	ComputeF32         = 68 // CUBLAS_COMPUTE_32F
	ComputeF32Pedantic = 69 // CUBLAS_COMPUTE_32F_PEDANTIC: no reduced-precision shortcuts
	// ComputeF32FastTF32 is CUBLAS_COMPUTE_32F_FAST_TF32 (cublas_api.h,
	// cublasComputeType_t): fp32 operands rounded to TF32 (10 mantissa bits)
	// for the tensor cores, fp32 accumulation and output.
	ComputeF32FastTF32 = 77
	DataF32            = 0  // CUDA_R_32F
	DataBF16           = 14 // CUDA_R_16BF

	opN = 0
	opT = 1

	descTransA = 3 // CUBLASLT_MATMUL_DESC_TRANSA
	descTransB = 4 // CUBLASLT_MATMUL_DESC_TRANSB

	prefMaxWorkspace = 1 // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES (uint64)
)

// BLASLt is the bound cuBLASLt library.
type BLASLt struct {
	Path string

	cublasLtCreate                 func(h *uintptr) int32
	cublasLtDestroy                func(h uintptr) int32
	cublasLtGetVersion             func() uint64
	cublasLtMatmulDescCreate       func(d *uintptr, compute int32, scale int32) int32
	cublasLtMatmulDescDestroy      func(d uintptr) int32
	cublasLtMatmulDescSetAttribute func(d uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatrixLayoutCreate     func(l *uintptr, dtype int32, rows, cols uint64, ld int64) int32
	cublasLtMatrixLayoutDestroy    func(l uintptr) int32
	cublasLtMatmul                 func(h, desc uintptr, alpha unsafe.Pointer, a uint64, ad uintptr, b uint64, bd uintptr,
		beta unsafe.Pointer, c uint64, cd uintptr, d uint64, dd uintptr, algo unsafe.Pointer, ws uint64, wsSize uint64, stream uintptr) int32
	cublasLtMatmulPreferenceCreate       func(p *uintptr) int32
	cublasLtMatmulPreferenceDestroy      func(p uintptr) int32
	cublasLtMatmulPreferenceSetAttribute func(p uintptr, attr int32, buf unsafe.Pointer, size uint64) int32
	cublasLtMatmulAlgoGetHeuristic       func(h, desc, ad, bd, cd, dd, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) int32
	cublasLtMatmulAlgoCheck              func(h, desc, ad, bd, cd, dd uintptr, algo unsafe.Pointer, result unsafe.Pointer) int32
}

var (
	ltOnce sync.Once
	ltLib  *BLASLt
	ltErr  error
)

// LoadBLASLt loads cuBLASLt once per process, preferring CUDA 13 over 12.
func LoadBLASLt() (*BLASLt, error) {
	ltOnce.Do(func() { ltLib, ltErr = loadBLASLt(libDirs()) })
	return ltLib, ltErr
}

func loadBLASLt(dirs []string) (*BLASLt, error) {
	lib, path, err := openLibrary("cuBLASLt (libcublasLt)", []string{"libcublasLt.so.13", "libcublasLt.so.12"}, dirs)
	if err != nil {
		return nil, err
	}
	b := &BLASLt{Path: path}
	err = bind(lib, path, map[string]any{
		"cublasLtCreate":                       &b.cublasLtCreate,
		"cublasLtDestroy":                      &b.cublasLtDestroy,
		"cublasLtGetVersion":                   &b.cublasLtGetVersion,
		"cublasLtMatmulDescCreate":             &b.cublasLtMatmulDescCreate,
		"cublasLtMatmulDescDestroy":            &b.cublasLtMatmulDescDestroy,
		"cublasLtMatmulDescSetAttribute":       &b.cublasLtMatmulDescSetAttribute,
		"cublasLtMatrixLayoutCreate":           &b.cublasLtMatrixLayoutCreate,
		"cublasLtMatrixLayoutDestroy":          &b.cublasLtMatrixLayoutDestroy,
		"cublasLtMatmul":                       &b.cublasLtMatmul,
		"cublasLtMatmulPreferenceCreate":       &b.cublasLtMatmulPreferenceCreate,
		"cublasLtMatmulPreferenceDestroy":      &b.cublasLtMatmulPreferenceDestroy,
		"cublasLtMatmulPreferenceSetAttribute": &b.cublasLtMatmulPreferenceSetAttribute,
		"cublasLtMatmulAlgoGetHeuristic":       &b.cublasLtMatmulAlgoGetHeuristic,
		"cublasLtMatmulAlgoCheck":              &b.cublasLtMatmulAlgoCheck,
	})
	return b, err
}

func ltCheck(call string, r int32) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r)}
}

// Version is cuBLASLt's version, e.g. 130100.
func (b *BLASLt) Version() uint64 { return b.cublasLtGetVersion() }

// LtHandle is a cuBLASLt handle with a cache of matmul descriptors and,
// once Tune is called, of the fastest algorithm for each product.
type LtHandle struct {
	b     *BLASLt
	h     uintptr
	descs map[[3]int32]uintptr
	lays  map[[4]int64]uintptr

	tuneN   int
	timer   func(stream uintptr, run func() error) (float32, error)
	scratch func(bytes int64) (Ptr, func(), error)
	algos   map[product]*algo // nil: the library's own first choice
	timing  map[product][]float32
	// frozen refuses to tune: while a stream is captured into a graph, the
	// candidates' timing would wait on work that is only being recorded.
	frozen bool
	// choices keeps the tuned algorithms in a file (Remember; nil: none).
	choices *choiceFile
}

// product is what an algorithm is chosen for: types, transposes and shape.
type product struct {
	compute, dtype, ctype int32
	ta, tb                bool
	M, N, K               int
}

// algo is cublasLtMatmulAlgo_t, opaque.
type algo struct{ data [8]uint64 }

// heuristicResult is cublasLtMatmulHeuristicResult_t.
type heuristicResult struct {
	algo      algo
	wsSize    uint64
	state     int32
	waves     float32
	reserved_ [4]int32
}

// NewHandle creates a cuBLASLt handle on the current context.
func (b *BLASLt) NewHandle() (*LtHandle, error) {
	var h uintptr
	if err := ltCheck("cublasLtCreate", b.cublasLtCreate(&h)); err != nil {
		return nil, err
	}
	return &LtHandle{b: b, h: h, descs: map[[3]int32]uintptr{}, lays: map[[4]int64]uintptr{}, algos: map[product]*algo{},
		timing: map[product][]float32{}}, nil
}

// Destroy frees the handle and its cached descriptors.
func (h *LtHandle) Destroy() error {
	for _, d := range h.descs {
		h.b.cublasLtMatmulDescDestroy(d)
	}
	for _, l := range h.lays {
		h.b.cublasLtMatrixLayoutDestroy(l)
	}
	return ltCheck("cublasLtDestroy", h.b.cublasLtDestroy(h.h))
}

func (h *LtHandle) desc(compute int32, ta, tb bool) (uintptr, error) {
	key := [3]int32{compute, b2i(ta), b2i(tb)}
	if d, ok := h.descs[key]; ok {
		return d, nil
	}
	var d uintptr
	if err := ltCheck("cublasLtMatmulDescCreate", h.b.cublasLtMatmulDescCreate(&d, compute, DataF32)); err != nil {
		return 0, err
	}
	for _, a := range []struct {
		attr int32
		v    int32
	}{{descTransA, opOf(ta)}, {descTransB, opOf(tb)}} {
		v := a.v
		if err := ltCheck("cublasLtMatmulDescSetAttribute", h.b.cublasLtMatmulDescSetAttribute(d, a.attr, unsafe.Pointer(&v), 4)); err != nil {
			return 0, err
		}
	}
	h.descs[key] = d
	return d, nil
}

func (h *LtHandle) layout(dtype int32, rows, cols, ld int) (uintptr, error) {
	key := [4]int64{int64(dtype), int64(rows), int64(cols), int64(ld)}
	if l, ok := h.lays[key]; ok {
		return l, nil
	}
	var l uintptr
	if err := ltCheck("cublasLtMatrixLayoutCreate", h.b.cublasLtMatrixLayoutCreate(&l, dtype, uint64(rows), uint64(cols), int64(ld))); err != nil {
		return 0, err
	}
	h.lays[key] = l
	return l, nil
}

func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

func opOf(t bool) int32 {
	if t {
		return opT
	}
	return opN
}

// Gemm computes, in row-major terms, C (M x N, fp32) = alpha op(A) op(B) +
// beta C, where A is stored (M x K) or, with ta, (K x M), and B (K x N) or,
// with tb, (N x K). A and B share dtype (DataF32 or DataBF16); compute is
// ComputeF32 or ComputeF32Pedantic, or ComputeF32FastTF32 with DataF32.
// cuBLASLt is column-major, so it computes C^T = op(B)^T op(A)^T with the
// operands swapped.
func (h *LtHandle) Gemm(compute, dtype int32, ta, tb bool, M, N, K int, alpha float32, A, B Ptr, beta float32, C Ptr, ws Ptr, wsSize int64, stream uintptr) error {
	return h.GemmTo(compute, dtype, DataF32, ta, tb, M, N, K, alpha, A, B, beta, C, ws, wsSize, stream)
}

// GemmTo is Gemm with C stored as ctype: DataBF16 lets the kernel that
// consumes C read it in bf16 without a conversion pass (C and D share the
// type, so beta should then be 0 unless C already holds bf16 values).
func (h *LtHandle) GemmTo(compute, dtype, ctype int32, ta, tb bool, M, N, K int, alpha float32, A, B Ptr, beta float32, C Ptr, ws Ptr, wsSize int64, stream uintptr) error {
	return h.matmul(compute, dtype, ctype, ta, tb, M, N, K, alpha, A, B, beta, C, C, ws, wsSize, stream)
}

// GemmAdd is Gemm writing D = alpha op(A) op(B) + beta C to D rather than
// over C (fp32, same shape): a residual add without copying C to D first.
func (h *LtHandle) GemmAdd(compute, dtype int32, ta, tb bool, M, N, K int, alpha float32, A, B Ptr, beta float32, C, D Ptr, ws Ptr, wsSize int64, stream uintptr) error {
	return h.matmul(compute, dtype, DataF32, ta, tb, M, N, K, alpha, A, B, beta, C, D, ws, wsSize, stream)
}

func (h *LtHandle) matmul(compute, dtype, ctype int32, ta, tb bool, M, N, K int, alpha float32, A, B Ptr, beta float32, C, D Ptr, ws Ptr, wsSize int64, stream uintptr) error {
	d, err := h.desc(compute, tb, ta)
	if err != nil {
		return err
	}
	// Stored column-major shapes of the swapped operands.
	br, bc := N, K
	if tb {
		br, bc = K, N
	}
	ar, ac := K, M
	if ta {
		ar, ac = M, K
	}
	la, err := h.layout(dtype, br, bc, br)
	if err != nil {
		return err
	}
	lb, err := h.layout(dtype, ar, ac, ar)
	if err != nil {
		return err
	}
	lc, err := h.layout(ctype, N, M, N)
	if err != nil {
		return err
	}
	al, be := alpha, beta
	// run launches the product with algorithm a (nil: the library's
	// choice), writing D to dst.
	run := func(a *algo, dst Ptr) error {
		var ap unsafe.Pointer
		if a != nil {
			ap = unsafe.Pointer(a)
		}
		return ltCheck("cublasLtMatmul", h.b.cublasLtMatmul(h.h, d, unsafe.Pointer(&al), uint64(B), la, uint64(A), lb,
			unsafe.Pointer(&be), uint64(C), lc, uint64(dst), lc, ap, uint64(ws), uint64(wsSize), stream))
	}
	key := product{compute, dtype, ctype, ta, tb, M, N, K}
	a, known := h.algos[key]
	if !known && h.tuneN > 0 && h.choices != nil {
		// Another process, or an earlier one, may have timed it.
		if r, ok := h.choices.recall(key, wsSize, h.tuneN); ok && h.usable(d, la, lb, lc, r, wsSize) {
			a, known = r, true
			h.algos[key] = a
		}
	}
	if !known && h.tuneN > 0 && h.frozen {
		return fmt.Errorf("GEMM %s met first while its stream is captured into a graph: it must run once outside the capture, to be tuned", ProductName(ta, tb, M, N, K))
	}
	if !known && h.tuneN > 0 {
		// A product that adds into its own output (beta != 0, D = C)
		// cannot run twice in place: its candidates write to scratch.
		dst, release := D, func() {}
		if beta != 0 && C == D {
			size := int64(4)
			if ctype == DataBF16 {
				size = 2
			}
			if dst, release, err = h.scratch(int64(M) * int64(N) * size); err != nil {
				return err
			}
		}
		a, err = h.tune(key, d, la, lb, lc, wsSize, stream, func(a *algo) error { return run(a, dst) })
		release()
		if err != nil {
			return err
		}
		h.algos[key] = a
		if h.choices != nil && a != nil {
			h.choices.keep(key, wsSize, h.tuneN, a)
		}
	}
	return run(a, D)
}

// Tune makes each product, at its first call, time up to n of cuBLASLt's
// heuristic candidates (timer runs what it is given, on the product's
// stream, and returns milliseconds) and keep the fastest for every later call. The library's
// first choice is always among them, so a product never gets a slower
// algorithm than without tuning, to within the timer's noise. A product
// that adds into its own output is timed writing to a buffer from scratch
// (bytes asked; release frees it), so that its output is added to once.
// Different algorithms may sum in a different order: results are not
// bit-identical to an untuned run's.
func (h *LtHandle) Tune(n int, timer func(stream uintptr, run func() error) (float32, error), scratch func(bytes int64) (Ptr, func(), error)) {
	h.tuneN, h.timer, h.scratch = n, timer, scratch
}

// Freeze makes a product not tuned yet an error instead of a tuning run,
// while frozen is set (during a graph capture).
func (h *LtHandle) Freeze(frozen bool) { h.frozen = frozen }

// Tuned reports, for each product timed so far, the candidates' times in
// milliseconds (the library's first choice first) and which one won.
func (h *LtHandle) Tuned() map[string]TuneResult {
	out := map[string]TuneResult{}
	for k, ms := range h.timing {
		best := 0
		for i := range ms {
			if ms[i] < ms[best] {
				best = i
			}
		}
		out[fmt.Sprintf("%s dtype %d out %d", ProductName(k.ta, k.tb, k.M, k.N, k.K), k.dtype, k.ctype)] = TuneResult{MS: ms, Best: best}
	}
	return out
}

// TuneResult is one product's tuning: candidate times and the winner.
type TuneResult struct {
	MS   []float32
	Best int
}

// ProductName names a product by its row-major shape M x N x K and which
// operands are transposed: "32768x1024x512 NT".
func ProductName(ta, tb bool, M, N, K int) string {
	t := func(b bool) string {
		if b {
			return "T"
		}
		return "N"
	}
	return fmt.Sprintf("%dx%dx%d %s%s", M, N, K, t(ta), t(tb))
}

func (h *LtHandle) tune(key product, d, la, lb, lc uintptr, wsSize int64, stream uintptr, run func(*algo) error) (*algo, error) {
	var pref uintptr
	if err := ltCheck("cublasLtMatmulPreferenceCreate", h.b.cublasLtMatmulPreferenceCreate(&pref)); err != nil {
		return nil, err
	}
	defer h.b.cublasLtMatmulPreferenceDestroy(pref)
	limit := uint64(wsSize)
	if err := ltCheck("cublasLtMatmulPreferenceSetAttribute",
		h.b.cublasLtMatmulPreferenceSetAttribute(pref, prefMaxWorkspace, unsafe.Pointer(&limit), 8)); err != nil {
		return nil, err
	}
	res := make([]heuristicResult, h.tuneN)
	var got int32
	if err := ltCheck("cublasLtMatmulAlgoGetHeuristic", h.b.cublasLtMatmulAlgoGetHeuristic(h.h, d, la, lb, lc, lc, pref,
		int32(len(res)), unsafe.Pointer(&res[0]), &got)); err != nil {
		return nil, err
	}
	var best *algo
	bestMS := float32(math.Inf(1))
	var times []float32
	for i := range res[:got] {
		if res[i].state != 0 {
			continue
		}
		a := res[i].algo
		// One untimed run loads the kernel; an algorithm the library
		// offers but cannot launch here is passed over.
		if run(&a) != nil {
			continue
		}
		ms, err := h.timer(stream, func() error {
			for range 3 {
				if err := run(&a); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		times = append(times, ms)
		if ms < bestMS {
			best, bestMS = &a, ms
		}
	}
	h.timing[key] = times
	return best, nil
}
