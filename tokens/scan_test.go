package tokens

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// scanPlain is scanIDs written the obvious way, one id at a time.
func scanPlain(chunk []byte, width int, vocab uint64, eos uint32) (docs int64, last uint32, bad int) {
	bad = -1
	for i := range len(chunk) / width {
		id := idAt(chunk, width, i)
		if id == eos {
			docs++
		}
		if uint64(id) >= vocab && bad < 0 {
			bad = i
		}
		last = id
	}
	return docs, last, bad
}

// aligned returns n zero bytes starting on an 8-byte boundary, as the
// appender's buffers do.
func aligned(n int) []byte {
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)[:n]
}

func checkScan(t *testing.T, chunk []byte, width int, vocab uint64, eos uint32) {
	t.Helper()
	d, l, b := scanIDs(chunk, width, vocab, eos)
	wd, wl, wb := scanPlain(chunk, width, vocab, eos)
	if d != wd || l != wl || b != wb {
		t.Fatalf("width %d, %d ids, vocab %d, eos %d: got docs %d last %d bad %d, want %d %d %d",
			width, len(chunk)/width, vocab, eos, d, l, b, wd, wl, wb)
	}
}

// The word-at-a-time scan of 2-byte ids agrees with the plain one at the
// vocabularies where lane arithmetic could go wrong (the top bit, a full
// 16-bit vocabulary, one id), with eos anywhere, ids at and around the
// vocabulary's end, and lengths that leave a tail of one to three ids.
func TestScanIDsMatchesThePlainScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	vocabs := []uint64{1, 2, 255, 256, 32767, 32768, 32769, 50257, 65535, 65536}
	for _, vocab := range vocabs {
		for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 1000} {
			for trial := range 20 {
				eos := uint32(rng.Uint64N(vocab))
				if trial == 1 {
					eos = uint32(vocab - 1)
				}
				chunk := aligned(2 * n)
				for i := range n {
					var id uint64
					switch rng.IntN(6) {
					case 0:
						id = uint64(eos)
					case 1:
						id = min(vocab-1, 0xffff)
					case 2:
						id = 0
					default:
						id = rng.Uint64N(vocab)
					}
					binary.LittleEndian.PutUint16(chunk[2*i:], uint16(id))
				}
				checkScan(t, chunk, 2, vocab, eos)
				if vocab < 1<<16 {
					// One id out of range, anywhere, just past the end or at the top.
					i := rng.IntN(n)
					bad := vocab + rng.Uint64N(1<<16-vocab)
					if trial%3 == 0 {
						bad = vocab
					} else if trial%3 == 1 {
						bad = 0xffff
					}
					binary.LittleEndian.PutUint16(chunk[2*i:], uint16(bad))
					checkScan(t, chunk, 2, vocab, eos)
				}
			}
		}
	}
	// 4-byte ids keep their own loop.
	chunk := aligned(4 * 9)
	for i := range 9 {
		binary.LittleEndian.PutUint32(chunk[4*i:], uint32(i*7000))
	}
	checkScan(t, chunk, 4, 100_000, 14000)
	checkScan(t, chunk, 4, 50_000, 7000)
}

func FuzzScanIDs(f *testing.F) {
	f.Add([]byte{1, 0, 2, 0, 3, 0, 4, 0, 5, 0}, uint16(50257), uint16(5))
	f.Add([]byte{0xff, 0xff, 0, 0x80}, uint16(0x8000), uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, v, eos uint16) {
		vocab := uint64(v) + 1 // 1 to 65536
		n := len(data) / 2
		if n == 0 {
			return
		}
		chunk := aligned(2 * n)
		copy(chunk, data)
		checkScan(t, chunk, 2, vocab, uint32(eos))
	})
}

// BenchmarkScanIDs is the append's per-token pass over a 1 MiB buffer of
// 2-byte ids (a GPT-2-sized vocabulary, one document per 300 tokens).
func BenchmarkScanIDs(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	chunk := aligned(1 << 20)
	for i := 0; i < len(chunk); i += 2 {
		id := uint16(rng.IntN(50256))
		if rng.IntN(300) == 0 {
			id = 50256
		}
		binary.LittleEndian.PutUint16(chunk[i:], id)
	}
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		scanIDs(chunk, 2, 50257, 50256)
	}
}
