package tokens

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
)

var benchTok = Tokenizer{Name: "bench-16k", SHA256: strings.Repeat("12", 32), VocabSize: 16384, EOS: 0}

// benchStore writes a store of n tokens of the small model's vocabulary,
// in shards of 1M tokens.
func benchStore(b *testing.B, n int) *Store {
	b.Helper()
	dir := b.TempDir()
	a, err := OpenAppender(context.Background(), dir, benchTok, nil)
	if err != nil {
		b.Fatal(err)
	}
	const shard = 1 << 20
	ids := make([]uint32, shard)
	for off := 0; off < n; off += shard {
		for j := range ids {
			ids[j] = uint32((off+j)*31%16383 + 1)
			if j%700 == 699 || j == shard-1 {
				ids[j] = 0
			}
		}
		if _, err := a.Append(context.Background(), ShardInfo{ID: fmt.Sprint(off)}, bytes.NewReader(Encode(nil, Uint16, ids))); err != nil {
			b.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		b.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkSampler measures the training data path: windows of seq_len
// 1024 drawn from a 0.7/0.2/0.1 mixture of three page-cached stores (64M
// tokens in all) into an []int32. The target is 40M tokens/s.
func BenchmarkSampler(b *testing.B) {
	src := []Source{
		{Store: benchStore(b, 32<<20), Weight: 0.7},
		{Store: benchStore(b, 16<<20), Weight: 0.2},
		{Store: benchStore(b, 16<<20), Weight: 0.1},
	}
	for _, seqLen := range []int{256, 1024} {
		b.Run(fmt.Sprintf("seq%d", seqLen), func(b *testing.B) {
			s, err := NewSampler(src, Config{SeqLen: seqLen, Seed: 1}, nil)
			if err != nil {
				b.Fatal(err)
			}
			dst := make([]int32, seqLen+1)
			ctx := context.Background()
			// One pass first, so that the figure is the page-cached path the
			// trainer sees once the stores are warm.
			for range (64 << 20) / (seqLen + 1) {
				if _, _, err := s.Next(ctx, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(seqLen+1) * 2)
			b.ResetTimer()
			for b.Loop() {
				if _, _, err := s.Next(ctx, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*float64(seqLen+1)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkPermutation is the cost of ordering one window.
func BenchmarkPermutation(b *testing.B) {
	p := newPermutation(25_000_000_000/1025, 1)
	var i, sink uint64
	for b.Loop() {
		sink += p.at(i % p.n)
		i++
	}
	_ = sink
}

// BenchmarkAppend measures the appender on 4M-token shards: id validation,
// hashing, writing and the fsyncs of a commit.
func BenchmarkAppend(b *testing.B) {
	ids := make([]uint32, 4<<20)
	for j := range ids {
		ids[j] = uint32(j*31%16383 + 1)
	}
	ids[len(ids)-1] = 0
	data := Encode(nil, Uint16, ids)
	// "whole": reads as large as asked; "64KiB-reads": at most 64 KiB a
	// read, as a shard's body from object storage arrives.
	for _, v := range []struct {
		name   string
		reader func() io.Reader
	}{
		{"whole", func() io.Reader { return bytes.NewReader(data) }},
		{"64KiB-reads", func() io.Reader { return &shortReader{r: bytes.NewReader(data), max: 64 << 10} }},
	} {
		b.Run(v.name, func(b *testing.B) {
			a, err := OpenAppender(context.Background(), b.TempDir(), benchTok, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			b.SetBytes(int64(len(data)))
			n := 0
			for b.Loop() {
				if _, err := a.Append(context.Background(), ShardInfo{ID: fmt.Sprint(n)}, v.reader()); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64(b.N)*float64(len(ids))/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// shortReader returns at most max bytes a read.
type shortReader struct {
	r   io.Reader
	max int
}

func (s *shortReader) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.max)]) }
