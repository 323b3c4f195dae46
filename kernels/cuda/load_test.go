package cuda

import (
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// A library that is nowhere must fail with an error that lists every place
// tried and says what to install, and that "auto" reads as unavailable.
func TestOpenLibraryMissingListsWhatWasTried(t *testing.T) {
	dir := t.TempDir()
	_, _, err := openLibrary("NVRTC (libnvrtc)", []string{"libkiln-nonexistent.so.13", "libkiln-nonexistent.so.12"}, []string{dir, "/nonexistent/cuda/lib64"})
	if err == nil {
		t.Fatal("loading a nonexistent library succeeded")
	}
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("error %T is not a *LoadError: %v", err, err)
	}
	msg := err.Error()
	for _, want := range []string{
		"libkiln-nonexistent.so.13", "libkiln-nonexistent.so.12",
		filepath.Join(dir, "libkiln-nonexistent.so.13"),
		"/nonexistent/cuda/lib64/libkiln-nonexistent.so.12",
		"CUDA_HOME",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error is not one line:\n%s", msg)
	}
	var u interface{ Unavailable() bool }
	if !errors.As(err, &u) || !u.Unavailable() {
		t.Error("a missing library is not marked Unavailable, so auto would not fall back")
	}
	var b interface{ BadInput() bool }
	if !errors.As(err, &b) || !b.BadInput() {
		t.Error("a missing library is not marked BadInput, so --engine cuda would not exit 2")
	}
}

// The search order is: bare sonames for the loader's own search first, then
// CUDA_HOME, LD_LIBRARY_PATH and the usual places.
func TestLibDirsOrder(t *testing.T) {
	t.Setenv("CUDA_HOME", "/opt/cuda-x")
	t.Setenv("LD_LIBRARY_PATH", "/opt/a:/opt/b")
	dirs := libDirs()
	idx := func(s string) int {
		for i, d := range dirs {
			if d == s {
				return i
			}
		}
		return -1
	}
	ch, a, b, usr := idx("/opt/cuda-x/lib64"), idx("/opt/a"), idx("/opt/b"), idx("/usr/local/cuda/lib64")
	if ch < 0 || a < 0 || b < 0 || usr < 0 || !(ch < a && a < b && b < usr) {
		t.Fatalf("search order wrong: %v", dirs)
	}
	c := candidates([]string{"libx.so.13", "libx.so.12"}, []string{"/d"})
	want := []string{"libx.so.13", "libx.so.12", "/d/libx.so.13", "/d/libx.so.12"}
	if strings.Join(c, ",") != strings.Join(want, ",") {
		t.Fatalf("candidates = %v, want %v", c, want)
	}
}

// A library that exists but lacks a symbol names the symbol.
func TestBindMissingSymbolNamesIt(t *testing.T) {
	lib, path, err := openLibrary("libc", []string{"libc.so.6"}, nil)
	if err != nil {
		t.Skipf("no libc.so.6 to test with: %v", err)
	}
	var f func() int32
	err = bind(lib, path, map[string]any{"kiln_no_such_symbol": &f})
	if err == nil || !strings.Contains(err.Error(), "kiln_no_such_symbol") {
		t.Fatalf("bind error = %v, want one naming the symbol", err)
	}
}

// A failed call's error names the call and the driver's name for the code.
func TestErrorNamesTheCall(t *testing.T) {
	e := &Error{Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	if got := e.Error(); got != "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)" {
		t.Errorf("Error() = %q", got)
	}
	if !e.OutOfMemory() {
		t.Error("CUDA_ERROR_OUT_OF_MEMORY from the driver is not OutOfMemory")
	}
	// cuBLASLt's status 2 is CUBLAS_STATUS_NOT_INITIALIZED, not memory.
	if (&Error{Call: "cublasLtMatmul", Code: 2}).OutOfMemory() {
		t.Error("a cuBLASLt status 2 was taken for out of memory")
	}
	if got := (&Error{Call: "cublasLtCreate", Code: 7}).Error(); got != "cublasLtCreate: error 7" {
		t.Errorf("Error() = %q", got)
	}
}

// A driver without the graph editing calls (older than CUDA 12.3) leaves
// graph editing unbound, and a recorded graph's memsets stay as they are,
// with ErrNoGraphEdit saying so, instead of the driver failing to load.
func TestGraphEditNeedsEveryCall(t *testing.T) {
	lib, _, err := openLibrary("libc", []string{"libc.so.6"}, nil)
	if err != nil {
		t.Skipf("no libc.so.6 to test with: %v", err)
	}
	if ge := loadGraphEdit(lib); ge != nil {
		t.Fatal("graph editing bound from a library without the driver's calls")
	}
	g := &Graph{dv: &Device{D: &Driver{}}}
	if n, err := g.MemsetsToKernels(nil, 64<<10); n != 0 || !errors.Is(err, ErrNoGraphEdit) {
		t.Fatalf("MemsetsToKernels without graph editing: %d, %v; want 0 and ErrNoGraphEdit", n, err)
	}
}

// A kernel's arguments reach the driver each in its own 8-byte slot, 4-byte
// kinds in the slot's low bytes (the kernels' int, unsigned and float),
// with a table of the slots' addresses; a type no kernel takes is refused
// by name.
func TestKernelArgsLayout(t *testing.T) {
	pp, vals, ptrs, err := kernelArgs("k", []any{Ptr(0x1000), 7, int32(-2), uint32(0xfffffffe), float32(1.5), int64(-3), uint64(1 << 40)})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{0x1000, 7, 0xfffffffe, 0xfffffffe, uint64(math.Float32bits(1.5)), ^uint64(2), 1 << 40}
	if !slices.Equal(vals, want) {
		t.Errorf("slots %#x, want %#x", vals, want)
	}
	if pp != unsafe.Pointer(&ptrs[0]) {
		t.Error("the table's address is not its first entry's")
	}
	for i := range vals {
		if ptrs[i] != unsafe.Pointer(&vals[i]) {
			t.Errorf("table entry %d does not point at slot %d", i, i)
		}
	}
	// A tensor map goes as its 128 bytes: the table points at the map
	// itself, on a 64-byte boundary, and its slot stays unused.
	m := &TensorMap{}
	for i := range m.buf {
		m.buf[i] = uint64(i)
	}
	_, _, ptrs, err = kernelArgs("tma", []any{Ptr(8), m, 3})
	if err != nil {
		t.Fatal(err)
	}
	if ptrs[1] != m.bytes() || uintptr(ptrs[1])%64 != 0 {
		t.Errorf("the tensor map's entry %p, want its 64-byte aligned bytes %p", ptrs[1], m.bytes())
	}
	first := *(*uint64)(ptrs[1])
	if off := int(first); &m.buf[off] != (*uint64)(ptrs[1]) || off > 7 {
		t.Errorf("the map starts at word %d of its buffer, want one of the first eight", off)
	}
	if pp, _, _, err := kernelArgs("k", nil); err != nil || pp != nil {
		t.Errorf("no arguments: table %v, %v; want nil", pp, err)
	}
	if _, _, _, err := kernelArgs("scale", []any{1.5}); err == nil || !strings.Contains(err.Error(), "scale") || !strings.Contains(err.Error(), "float64") {
		t.Errorf("a float64 argument: %v; want an error naming the kernel and the type", err)
	}
}

// A tensor map's shape is checked before the driver is asked, and a driver
// without cuTensorMapEncodeTiled says so.
func TestEncodeTiledChecksItsShape(t *testing.T) {
	d := &Driver{}
	m := &TensorMap{}
	for _, c := range []struct {
		dims, strides []uint64
		box           []uint32
	}{
		{nil, nil, nil},
		{[]uint64{64, 10}, nil, []uint32{64, 8}},
		{[]uint64{64, 10}, []uint64{128}, []uint32{64}},
		{[]uint64{1, 1, 1, 1, 1, 1}, []uint64{16, 16, 16, 16, 16}, []uint32{1, 1, 1, 1, 1, 1}},
	} {
		if err := d.EncodeTiled(m, TensorBF16, Ptr(0x1000), c.dims, c.strides, c.box, Swizzle128B); err == nil || errors.Is(err, ErrNoTensorMaps) {
			t.Errorf("dims %v, strides %v, box %v: %v; want the shape refused", c.dims, c.strides, c.box, err)
		}
	}
	if err := d.EncodeTiled(m, TensorBF16, Ptr(0x1000), []uint64{64, 10}, []uint64{128}, []uint32{64, 8}, Swizzle128B); !errors.Is(err, ErrNoTensorMaps) {
		t.Errorf("a driver without tensor maps: %v; want ErrNoTensorMaps", err)
	}
}
