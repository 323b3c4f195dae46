package tokens

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// nativeLittle is whether this machine stores integers little-endian, as
// the token files do, so that ids can be read and written in place.
var nativeLittle = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// scanIDs reads chunk as little-endian ids of width bytes (2 or 4; a whole
// number of them, from an 8-byte-aligned buffer) and returns how many are
// eos, the last one, and the index of the first id at or past vocab (-1
// when there is none). It is the append's per-token pass: reading the ids
// in place, without decoding each one through a bounds-checked slice, made
// it several times faster, and 2-byte ids are read four to a word
// (docs/benchmarks/tokens.md).
func scanIDs(chunk []byte, width int, vocab uint64, eos uint32) (docs int64, last uint32, bad int) {
	n := len(chunk) / width
	over := false
	switch {
	case nativeLittle && width == 2:
		docs, over = scan16(chunk[:2*n], vocab, uint16(eos)) // a uint16 store's vocabulary, eos included, fits 16 bits
		last = uint32(binary.LittleEndian.Uint16(chunk[2*n-2:]))
	case nativeLittle:
		ids := unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(chunk))), n)
		var top uint32
		for _, id := range ids {
			top = max(top, id)
			if id == eos {
				docs++
			}
		}
		last, over = ids[n-1], uint64(top) >= vocab
	default:
		var top uint32
		for i := range n {
			id := idAt(chunk, width, i)
			top = max(top, id)
			if id == eos {
				docs++
			}
			last = id
		}
		over = uint64(top) >= vocab
	}
	if !over {
		return docs, last, -1
	}
	for i := range n {
		if uint64(idAt(chunk, width, i)) >= vocab {
			return docs, last, i
		}
	}
	return docs, last, -1
}

// Four 16-bit lanes of a 64-bit word.
const (
	lanes16 = 0x0001_0001_0001_0001
	high16  = 0x8000_8000_8000_8000
	low16   = 0x7fff_7fff_7fff_7fff
)

// scan16 counts the 2-byte ids of b (native little-endian, 8-byte aligned
// where it starts) equal to eos, and says whether any is at or past vocab,
// four ids to a word:
//   - a lane equals eos when the lane of w^eos is zero, that is when neither
//     its top bit nor the carry of its low 15 bits plus 0x7fff is set;
//   - a lane is at or past vocab when adding 65536-vocab carries out of the
//     lane: the carry out of bit 15 is (a&c) | ((a^c) & carry-in), and the
//     carry into bit 15 is bit 15 of the lanes' low 15 bits added.
func scan16(b []byte, vocab uint64, eos uint16) (docs int64, over bool) {
	words := len(b) / 8
	e := uint64(eos) * lanes16
	c := (1<<16 - min(vocab, 1<<16)) * lanes16 // 0 for a full 16-bit vocabulary: nothing carries
	var n int
	var carries uint64
	for _, w := range unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), words) {
		n += bits.OnesCount64(eosLanes(w, e))
		carries |= overLanes(w, c)
	}
	docs = int64(n)
	for i := words * 8; i+1 < len(b); i += 2 {
		id := uint64(binary.LittleEndian.Uint16(b[i:]))
		if id == uint64(eos) {
			docs++
		}
		if id >= vocab {
			over = true
		}
	}
	return docs, over || carries != 0
}

// eosLanes sets the top bit of each lane of w equal to the lane of e.
func eosLanes(w, e uint64) uint64 {
	x := w ^ e
	return ^((x&low16 + low16) | x) & high16
}

// overLanes sets the top bit of each lane of w that carries out when the
// lane of c is added to it.
func overLanes(w, c uint64) uint64 {
	in := (w&low16 + c&low16) & high16
	return (w&c | (w^c)&in) & high16
}

// idAt is the i-th little-endian id of width bytes in chunk.
func idAt(chunk []byte, width, i int) uint32 {
	if width == 2 {
		return uint32(binary.LittleEndian.Uint16(chunk[2*i:]))
	}
	return binary.LittleEndian.Uint32(chunk[4*i:])
}
