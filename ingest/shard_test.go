package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-lm/kiln/tokens"
)

// sliceSource serves documents from memory, then err (io.EOF when nil).
type sliceSource struct {
	docs []string
	err  error
	next int
}

func (s *sliceSource) Next(ctx context.Context) (Document, error) {
	if s.next == len(s.docs) {
		if s.err != nil {
			return Document{}, s.err
		}
		return Document{}, io.EOF
	}
	s.next++
	return Document{Text: s.docs[s.next-1]}, nil
}

func (s *sliceSource) Skipped() Skips { return Skips{} }
func (s *sliceSource) Close() error   { return nil }

// shardDocs is about 6 MB of documents of varied sizes: many chunks, with
// their boundaries falling mid-stream.
func shardDocs() []string {
	var docs []string
	for i := range 3000 {
		docs = append(docs, fmt.Sprintf("doc %d: ", i)+strings.Repeat("func main() { fmt.Println(\"the quick brown fox\") }\n", 1+(i*37)%80))
	}
	return docs
}

func TestWriteShardMatchesSequentialEncoding(t *testing.T) {
	tok := testTokenizer(t)
	eos, ok := tok.EOS()
	if !ok {
		t.Fatal("the test tokenizer has no EOS")
	}
	docs := shardDocs()
	var want []byte
	var wantTokens int64
	for _, d := range docs {
		ids := append(tok.Encode(d), eos)
		want = tokens.Encode(want, tokens.DtypeFor(tok.VocabSize()), ids)
		wantTokens += int64(len(ids))
	}
	var got bytes.Buffer
	st, err := WriteShard(context.Background(), &sliceSource{docs: docs}, tok, &got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("shard bytes differ from encoding each document in order: %d bytes, want %d", got.Len(), len(want))
	}
	sum := sha256.Sum256(want)
	if st.SHA256 != hex.EncodeToString(sum[:]) || st.Documents != int64(len(docs)) || st.Tokens != wantTokens {
		t.Fatalf("stats %+v, want %d documents, %d tokens, sha256 %x", st, len(docs), wantTokens, sum)
	}
}

// failingWriter takes n bytes, then fails.
type failingWriter struct{ n int }

func (w *failingWriter) Write(b []byte) (int, error) {
	if len(b) > w.n {
		return 0, errors.New("disk full")
	}
	w.n -= len(b)
	return len(b), nil
}

func TestWriteShardStopsAtAWriteError(t *testing.T) {
	tok := testTokenizer(t)
	// The encoders are the process's, started by its first shard: one is
	// written first so that they are counted in before.
	if _, err := WriteShard(context.Background(), &sliceSource{docs: shardDocs()[:10]}, tok, io.Discard); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	_, err := WriteShard(context.Background(), &sliceSource{docs: shardDocs()}, tok, &failingWriter{n: 1 << 20})
	if err == nil || !strings.Contains(err.Error(), "writing the shard: disk full") {
		t.Fatalf("err = %v, want the write error", err)
	}
	// The reader is done and the encoders idle by the time WriteShard
	// returns: a failed shard leaves nothing of its own running.
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after the failed shard, %d before", n, before)
	}
}

// Shards written at once share the process's encoders: each gets exactly
// its own documents' tokens in order, and one that fails part way (its
// writer's disk full) neither stops nor mixes into the others.
func TestShardsWrittenAtOnce(t *testing.T) {
	tok := testTokenizer(t)
	eos, _ := tok.EOS()
	dtype := tokens.DtypeFor(tok.VocabSize())
	all := shardDocs()
	const n = 4
	type result struct {
		got  bytes.Buffer
		want []byte
		err  error
	}
	res := make([]*result, n)
	var wg sync.WaitGroup
	for i := range n {
		r := &result{}
		res[i] = r
		var docs []string
		for j := i; j < len(all); j += n {
			docs = append(docs, fmt.Sprintf("shard %d: %s", i, all[j]))
		}
		for _, d := range docs {
			r.want = tokens.Encode(r.want, dtype, append(tok.Encode(d), eos))
		}
		var w io.Writer = &r.got
		if i == 1 {
			w = &failingWriter{n: 64 << 10}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, r.err = WriteShard(context.Background(), &sliceSource{docs: docs}, tok, w)
		}()
	}
	wg.Wait()
	for i, r := range res {
		if i == 1 {
			if r.err == nil || !strings.Contains(r.err.Error(), "disk full") {
				t.Errorf("shard 1: err = %v, want its writer's error", r.err)
			}
			continue
		}
		if r.err != nil {
			t.Errorf("shard %d: %v", i, r.err)
		} else if !bytes.Equal(r.got.Bytes(), r.want) {
			t.Errorf("shard %d: %d bytes differ from encoding its documents in order (%d bytes)", i, r.got.Len(), len(r.want))
		}
	}
}

func TestWriteShardReturnsTheSourceError(t *testing.T) {
	bad := errors.New("page 7 is corrupt")
	_, err := WriteShard(context.Background(), &sliceSource{docs: shardDocs(), err: bad}, testTokenizer(t), io.Discard)
	if !errors.Is(err, bad) {
		t.Fatalf("err = %v, want %v", err, bad)
	}
}

func TestWriteShardCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := WriteShard(ctx, &sliceSource{docs: shardDocs()}, testTokenizer(t), io.Discard)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// BenchmarkWriteShard is the shard writer alone (no files, no queue) beside
// the tokenizer's EncodeBatch over the same documents: the gap is what the
// pipeline adds (ids to bytes, the hash, chunk handoffs).
func BenchmarkWriteShard(b *testing.B) {
	tok := testTokenizer(b)
	docs := shardDocs()
	var size int64
	for _, d := range docs {
		size += int64(len(d))
	}
	b.Run("WriteShard", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			if _, err := WriteShard(context.Background(), &sliceSource{docs: docs}, tok, io.Discard); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("EncodeBatch", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			tok.EncodeBatch(docs)
		}
	})
}
