package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// writeChunks writes b to w in uneven chunks, as a shard's tokens come.
func writeChunks(t *testing.T, w Writer, b []byte) {
	t.Helper()
	for i := 0; len(b) > 0; i++ {
		n := min(len(b), 1<<10+i*97<<10)
		if m, err := w.Write(b[:n]); err != nil || m != n {
			t.Fatalf("write of %d bytes: %d, %v", n, m, err)
		}
		b = b[n:]
	}
}

func readAll(t *testing.T, s Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A streamed object appears whole at Close, in parts or as one PUT, and
// never after Abort; an S3 store's part buffers go back to its pool and
// the next put takes the same ones; an aborted upload leaves no parts.
func TestWriter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s3 := newS3(t, testsvc.S3(t), 0)
	local, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 11<<20+321) // three 5 MiB parts
	rand.Read(big)
	for name, s := range map[string]Store{"s3": s3, "local": local} {
		for _, c := range []struct {
			key  string
			body []byte
		}{
			{"tokens/d/shards/parts.bin", big},
			{"tokens/d/shards/exact.bin", big[:10<<20]},
			{"tokens/d/shards/small.bin", big[:3<<20]},
			{"tokens/d/shards/empty.bin", nil},
		} {
			w := NewUnsignedWriter(ctx, s, c.key)
			writeChunks(t, w, c.body)
			if _, err := s.Stat(ctx, c.key); !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s %s: visible before Close: %v", name, c.key, err)
			}
			if err := w.Close(); err != nil {
				t.Fatalf("%s %s: %v", name, c.key, err)
			}
			if got := readAll(t, s, c.key); !bytes.Equal(got, c.body) {
				t.Fatalf("%s %s: read back %d of %d bytes, equal=%v", name, c.key, len(got), len(c.body), bytes.Equal(got, c.body))
			}
		}

		w := NewUnsignedWriter(ctx, s, "tokens/d/shards/aborted.bin")
		writeChunks(t, w, big)
		if err := w.Abort(errors.New("the tokenizer stopped")); err != nil {
			t.Fatalf("%s: abort: %v", name, err)
		}
		if _, err := s.Stat(ctx, "tokens/d/shards/aborted.bin"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s: an aborted put left an object: %v", name, err)
		}
	}

	uploads, err := minio.Core{Client: s3.c}.ListMultipartUploads(ctx, s3.o.Bucket, "tokens/", "", "", "", 100)
	if err != nil || len(uploads.Uploads) != 0 {
		t.Fatalf("unfinished multipart uploads after the puts: %+v, %v; want none", uploads.Uploads, err)
	}
	if n := len(s3.pool.idle); n != 2 {
		t.Fatalf("%d idle part buffers after puts one at a time; want their 2", n)
	}
	held := [][]byte{<-s3.pool.idle, <-s3.pool.idle}
	for _, b := range held {
		s3.pool.put(b)
	}
	w := NewUnsignedWriter(ctx, s3, "tokens/d/shards/again.bin")
	writeChunks(t, w, big)
	if !sameBuffer(w.(*s3Writer).buf, held) {
		t.Errorf("a put did not reuse the idle part buffers")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(s3.pool.idle); n != 2 {
		t.Fatalf("%d idle part buffers after the put; want 2", n)
	}
}

func sameBuffer(b []byte, of [][]byte) bool {
	for _, o := range of {
		if len(b) > 0 && &b[0] == &o[0] {
			return true
		}
	}
	return false
}
