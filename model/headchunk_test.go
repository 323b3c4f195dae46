package model

import "testing"

func TestHeadRowsFor(t *testing.T) {
	for _, c := range []struct {
		N, V int
		size int64
		want int
	}{
		{32 * 1024, 16384, 4, 4096}, // small at B 32 x T 1024, fp32: 8 chunks of 256 MiB
		{32 * 1024, 16384, 2, 4096}, // bf16: 8192 would fit; at most 4096
		{32 * 1024, 32000, 4, 2048}, // base, fp32: 2097 rows fit, rounded down to 128s
		{32 * 1024, 32000, 2, 4096}, // bf16: 4194 fit
		{8 * 1024, 16384, 2, 2048},  // the pilot's 8 x 1024: a quarter of its rows
		{4 * 1024, 16384, 2, 2048},  // not under headQuarterFloor
		{2 * 1024, 16384, 2, 2048},  // one chunk
		{64, 512, 2, 64},            // the golden models: one chunk
		{5000, 50000, 4, 1280},      // 1342 fit
		{100, 50000, 4, 100},        // fewer rows than fit
		{1, 16384, 2, 1},            // generation
		{8, 1 << 27, 4, 1},          // not even one row fits: still one
	} {
		if got := headRowsFor(c.N, c.V, c.size); got != c.want {
			t.Errorf("headRowsFor(%d, %d, %d) = %d, want %d", c.N, c.V, c.size, got, c.want)
		}
	}
}

func TestHeadChunkRows(t *testing.T) {
	for _, c := range []struct {
		N, V int
		bf   bool
		want int
	}{
		{32 * 1024, 32000, true, 4096},  // base in bf16
		{32 * 1024, 32000, false, 2048}, // and in fp32
		{200, 32000, true, 200},         // fewer rows than 256: an fp32 buffer of them
		{32 * 1024, 600000, true, 111},  // 223 bf16 rows fit, too few: the fp32 bound's 111
	} {
		rows := HeadChunkRows(c.N, c.V, c.bf)
		if rows != c.want {
			t.Errorf("HeadChunkRows(%d, %d, %v) = %d, want %d", c.N, c.V, c.bf, rows, c.want)
		}
		if _, size := HeadLogitRows(rows, c.bf); int64(rows)*int64(c.V)*size > headChunkBytes {
			t.Errorf("HeadChunkRows(%d, %d, %v) = %d: a buffer of %d bytes, over %d", c.N, c.V, c.bf, rows, int64(rows)*int64(c.V)*size, headChunkBytes)
		}
	}
}

func TestHeadLogitRows(t *testing.T) {
	for _, c := range []struct {
		rows int
		bf   bool
		out  int
		size int64
	}{
		{4096, true, 2048, 2}, {2048, true, 1024, 2}, {384, true, 128, 2}, {256, true, 128, 2},
		{255, true, 255, 4}, {64, true, 64, 4}, {4096, false, 4096, 4},
	} {
		if out, size := HeadLogitRows(c.rows, c.bf); out != c.out || size != c.size {
			t.Errorf("HeadLogitRows(%d, %v) = %d rows, %d bytes; want %d, %d", c.rows, c.bf, out, size, c.out, c.size)
		}
	}
}

// EstimateMemory sizes the head's chunk buffer as the engine's allocHead
// does (HeadChunkRows, HeadLogitRows, 256 bytes aligned), for
// vocabularies from tiny's to past where bf16 chunks fall under 256 rows,
// batches under and over a chunk, in bf16 and fp32: the estimate that
// refuses a run before the engine starts cannot drift from the engine.
func TestEstimateSizesTheHeadsChunk(t *testing.T) {
	for _, V := range []int{4096, 16384, 32000, 50257, 128256, 600000} {
		for _, N := range []int{64, 200, 8192, 32768} {
			for _, precision := range []string{"bf16", "fp32"} {
				c := Presets["small"]
				c.VocabSize = V
				est, err := EstimateMemory(MemoryPlan{Config: c, Engine: "cuda", Precision: precision, Batch: N, Seq: 1, Purpose: PurposeTrain})
				if err != nil {
					t.Fatal(err)
				}
				var got int64 = -1
				for _, it := range est.Items {
					if it.What == "logits (one chunk)" {
						got = it.Bytes
					}
				}
				bf := precision == "bf16" // the default head writes bf16 logits (logitsBF)
				rows := HeadChunkRows(N, V, bf)
				_, size := HeadLogitRows(rows, bf)
				want := (int64(rows)*int64(V)*size + 255) &^ 255
				if got != want {
					t.Errorf("V %d, N %d, %s: the estimate's chunk is %d bytes, the engine's %d (%d rows of %d bytes)", V, N, precision, got, want, rows, size)
				}
			}
		}
	}
}
