package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// TensorMap is a CUtensorMap: the 128-byte description of a tiled tensor in
// device memory that a Hopper GPU's tensor memory accelerator (TMA) copies
// from (cp.async.bulk.tensor), made on the host by Driver.EncodeTiled and
// passed to a kernel by value, as a `const __grid_constant__ TmaMap`
// parameter. The driver wants its address on a 64-byte boundary, which a
// Go allocation does not promise, so the map lives at the first such
// boundary inside buf; a TensorMap must not be copied once encoded (use
// *TensorMap).
type TensorMap struct {
	buf [16 + 8]uint64
}

// bytes is the map's 128 bytes, 64-byte aligned. Go's collector does not
// move heap objects, and a TensorMap reached through a pointer lives on
// the heap.
func (m *TensorMap) bytes() unsafe.Pointer {
	p := uintptr(unsafe.Pointer(&m.buf[0]))
	return unsafe.Pointer(&m.buf[(64-p%64)%64/8])
}

// Tensor map settings (CUtensorMapDataType, CUtensorMapSwizzle).
const (
	TensorBF16    = 9 // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
	Swizzle128B   = 3 // CU_TENSOR_MAP_SWIZZLE_128B
	tensorMapRank = 5 // the most dimensions a map may have
)

// ErrNoTensorMaps says the driver cannot make tensor maps (older than
// CUDA 12.0).
var ErrNoTensorMaps = errors.New("the CUDA driver cannot make tensor maps (CUDA 12.0 or newer can)")

// tensorMapEncodeTiled is cuTensorMapEncodeTiled: map, data type, rank,
// global address, dimensions (innermost first), the strides in bytes of
// the rank - 1 outer dimensions, box, element strides, interleave,
// swizzle, L2 promotion, out-of-bounds fill.
type tensorMapEncodeTiled func(m unsafe.Pointer, dtype, rank uint32, addr uint64, dims, strides *uint64, box, estrides *uint32,
	interleave, swizzle, l2, oob uint32) int32

// loadTensorMaps binds cuTensorMapEncodeTiled, or returns nil when the
// driver lacks it.
func loadTensorMaps(lib uintptr) tensorMapEncodeTiled {
	addr, err := purego.Dlsym(lib, "cuTensorMapEncodeTiled")
	if err != nil {
		return nil
	}
	var f tensorMapEncodeTiled
	purego.RegisterFunc(&f, addr)
	return f
}

// TensorMaps says whether the driver makes tensor maps (EncodeTiled).
func (d *Driver) TensorMaps() bool { return d.tensorMapEncode != nil }

// EncodeTiled makes m describe a tensor of bf16 or other elements at addr
// with dims elements along each dimension (innermost first), each outer
// dimension strides[i] bytes apart (multiples of 16), read box elements at
// a time along each dimension, with the given shared-memory swizzle.
// Elements outside dims read as zeros.
func (d *Driver) EncodeTiled(m *TensorMap, dtype int, addr Ptr, dims []uint64, strides []uint64, box []uint32, swizzle int) error {
	rank := len(dims)
	if rank < 1 || rank > tensorMapRank || len(strides) != rank-1 || len(box) != rank {
		return fmt.Errorf("tensor map: %d dimensions, %d strides, %d box sizes: want 1 to %d dimensions, one stride fewer, a box size each",
			len(dims), len(strides), len(box), tensorMapRank)
	}
	if d.tensorMapEncode == nil {
		return ErrNoTensorMaps
	}
	ones := make([]uint32, rank)
	for i := range ones {
		ones[i] = 1
	}
	var st *uint64
	if len(strides) > 0 {
		st = &strides[0]
	}
	return d.check("cuTensorMapEncodeTiled", d.tensorMapEncode(m.bytes(), uint32(dtype), uint32(rank), uint64(addr), &dims[0], st,
		&box[0], &ones[0], 0, uint32(swizzle), 0, 0))
}
