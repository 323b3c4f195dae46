package model

// The CUDA engine's LM head and its loss run over chunks of rows, so that
// the (N, V) logits never exist at once (kernels/head.go). The chunks'
// size is decided here, where both the engine and the memory estimate read
// it, so that the estimate that refuses a run sizes the buffer the engine
// allocates.

// headChunkBytes bounds one chunk's logits buffer, and headMaxRows its
// rows. At small's 32 x 1024, with fp32 logits, 256 MiB chunks (4096 rows)
// against 128 MiB made the head's three GEMMs 3.39 -> 2.78 ms a step and its
// loss kernel 1.53 -> 1.42 (the weight gradient adds up 8 partial sums
// instead of 16) for 0.19 GiB more at the peak; 512 MiB (8192 rows) gained
// nothing more. With the training logits in bf16 the same bytes hold twice
// the rows: base's vocabulary of 32000 gets 4096 rows a chunk where fp32
// allowed 2048, and small stays at 4096 in half the bytes.
//
// At small micro-batches the chunk is a large share of the peak, so it
// holds at most a quarter of the rows, down to headQuarterFloor rows: at
// the pilot's 8 x 1024 (small) 2048 rows, 64 MiB instead of 128, the peak
// 1.99 -> 1.93 GiB, under torch.compile's 1.95, for one more pair of
// partial sums of the head's weight gradient (tok/s at one micro-batch a
// step level, 1,484,558 / 1,512,651 against 1,496,912 / 1,498,670; at the
// pilot's 16, 1,583,067 / 1,607,293 against 1,610,488 / 1,610,853, about
// 1% less: docs/benchmarks/cuda.md). From 16384 rows up the quarter is
// over headMaxRows and changes nothing.
const (
	headChunkBytes   = 256 << 20
	headMaxRows      = 4096
	headQuarterFloor = 2048
)

// headRowsFor is the chunk size for N rows of V logits of size bytes: as
// many rows as fit in headChunkBytes, at most headMaxRows and at most a
// quarter of N unless that is under headQuarterFloor, at least 1 and at
// most N. Above 128 rows it is rounded down to a multiple of 128, so that
// every chunk starts 256-byte aligned in the fp32 and bf16 row buffers its
// GEMMs read, whatever the hidden size.
func headRowsFor(N, V int, size int64) int {
	r := min(int(headChunkBytes/(size*int64(V))), headMaxRows, max(N/4, headQuarterFloor))
	if r >= 128 {
		r &^= 127
	}
	return max(1, min(N, r))
}

// HeadChunkRows is the LM head's chunk size for N rows of V logits, whose
// training logits are bf16 where bf: the rows headChunkBytes holds in bf16,
// unless so few that HeadLogitRows keeps the buffer in fp32, which then
// bounds them in fp32.
func HeadChunkRows(N, V int, bf bool) int {
	if bf {
		if rows := headRowsFor(N, V, 2); rows >= 256 {
			return rows
		}
	}
	return headRowsFor(N, V, 4)
}

// HeadLogitRows is, for chunks of rows rows, the rows of a chunk of the
// fp32 logits the head hands out (generation, verification) and the bytes a
// value of the chunk buffer takes. Where the training head writes its
// logits in bf16 (bf), a buffer of rows bf16 rows holds half as many fp32
// ones, rounded down to 128 rows for the GEMMs' alignment: 128 MiB less at
// the peak at small's 8 x 1024 and 32 x 1024 (docs/benchmarks/cuda.md).
// Chunks under 256 rows keep the fp32 size.
func HeadLogitRows(rows int, bf bool) (out int, size int64) {
	if bf && rows >= 256 {
		return rows / 2 &^ 127, 2
	}
	return rows, 4
}
