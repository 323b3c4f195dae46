package ingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// A shard whose bytes change on their way to the append (a middlebox, a
// faulty NIC) is read again on the spot and appended once it arrives
// intact: before, the append was archived saying the shard was damaged,
// and the stored shard was intact. One that arrives the same wrong way
// every time is the stored object's to blame, refused as bad input
// saying to make it again, and nothing is appended.
func TestAShardChangedOnItsWayToTheAppendIsReadAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := testsvc.S3(t)
	faults := srv.Faults(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: faults.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	dir := t.TempDir()
	p := &Pipeline{Objects: objects, DataDir: filepath.Join(dir, "data"), StoresDir: filepath.Join(dir, "stores"), LocalRoots: []string{dir},
		Tokenizer: func(context.Context, string) (*tokenizer.Tokenizer, error) { return tok, nil }}
	var rows []textRow
	for i := range 50 {
		rows = append(rows, textRow{strings.Repeat("func main() { return } ", 5+i%7)})
	}
	for _, name := range []string{"a", "b"} {
		path := filepath.Join(dir, name+".parquet")
		writeParquet(t, path, rows, 20)
		job := ShardJob{Dataset: "local", Path: path, Store: "s", Tokenizer: "t", ShardID: "local:" + path, Columns: Columns{Text: "text"}}
		out, _, err := p.Shard(ctx, job, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch name {
		case "a":
			// Changed on its way once: the read after it is whole.
			faults.Add(testsvc.Fault{Method: "GET", Path: out.Object, Action: testsvc.Flip, At: 1, Count: 1})
			if _, err := p.Append(ctx, out, nil); err != nil {
				t.Fatalf("append of a shard changed on its way once: %v", err)
			}
			if n := faults.Acted(out.Object); n != 1 {
				t.Fatalf("the fault acted on %d reads, want 1", n)
			}
			m, err := tokens.ReadManifest(filepath.Join(p.StoresDir, "s"))
			if err != nil || m.Tokens != out.Tokens || !m.Input(out.ShardID).Whole {
				t.Fatalf("store after the append: %+v, %v; want the shard's %d tokens", m, err, out.Tokens)
			}
		case "b":
			// The same byte changed every time.
			faults.Add(testsvc.Fault{Method: "GET", Path: out.Object, Action: testsvc.Flip, At: 1})
			before, err := tokens.ReadManifest(filepath.Join(p.StoresDir, "s"))
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Append(ctx, out, nil)
			var bad interface{ BadInput() bool }
			if err == nil || !errors.As(err, &bad) || !bad.BadInput() || !strings.Contains(err.Error(), "read 3 times") || !strings.Contains(err.Error(), "enqueue the ingest again") {
				t.Fatalf("append of a shard read the same wrong way each time: %v; want bad input saying to make it again", err)
			}
			if n := faults.Acted(out.Object); n != 3 {
				t.Fatalf("the shard was read %d times, want 3", n)
			}
			after, err := tokens.ReadManifest(filepath.Join(p.StoresDir, "s"))
			if err != nil || after.Tokens != before.Tokens || after.Input(out.ShardID).Shards != 0 {
				t.Fatalf("store after the refused append: %+v, %v; want it as before (%d tokens)", after, err, before.Tokens)
			}
		}
	}
}

// A shard too large to be read whole before its append (past
// Pipeline.Prefetch, as one parquet file of a real dataset often is)
// streams into the store, its hash known only at its end. One changed on
// its way is read again on the spot all the same, and appended once it
// arrives intact, in the append's one try: before, the try failed and the
// shard waited for the task's retry, after its back-off. One whose stored
// object differs from what was made hashes the same wrong way each time
// and is refused as bad input after shardReads reads, in that one try,
// with nothing appended: before, the task's ten retries read it for about
// 50 minutes. An append that takes part of its shard (at a limit) reads
// it once to find where to cut it and once more to append the part, and
// either read is read again: before, a change on the first failed the
// append for good, and one on the second failed the try.
func TestALargeShardChangedOnItsWayToTheAppendIsReadAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := testsvc.S3(t)
	faults := srv.Faults(t)
	opts := store.S3Options{Endpoint: faults.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
	objects, err := store.NewS3(opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.Endpoint = srv.Endpoint
	bucket, err := store.NewS3(opts) // past the faults: the stored objects
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	eos, _ := tok.EOS()
	dir := t.TempDir()
	p := &Pipeline{Objects: objects, DataDir: filepath.Join(dir, "data"), StoresDir: filepath.Join(dir, "stores"), LocalRoots: []string{dir},
		Tokenizer: func(context.Context, string) (*tokenizer.Tokenizer, error) { return tok, nil }, Prefetch: 1 << 10}
	var rows []textRow
	for i := range 50 {
		rows = append(rows, textRow{strings.Repeat("func main() { return } ", 5+i%7)})
	}
	// damage changes the stored object's second byte, as Flip changes it
	// on the way.
	damage := func(t *testing.T, out AppendJob) {
		b := objectBytes(t, bucket, out.Object)
		b[1] ^= 0x01
		if err := bucket.Put(ctx, out.Object, bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		// part: under a limit that takes part of the shard.
		part  bool
		fault func(t *testing.T, out AppendJob)
		// reads is how many times the append reads the shard object.
		reads   int
		damaged bool
		// down: the store fails every GET of the shard (a 5xx each try).
		down bool
	}{
		{name: "changed once", reads: 2, fault: func(t *testing.T, out AppendJob) {
			faults.Add(testsvc.Fault{Method: "GET", Path: out.Object, Action: testsvc.Flip, At: 1, Count: 1})
		}},
		{name: "damaged in object storage", reads: shardReads, damaged: true, fault: damage},
		{name: "part, changed once as its cut is found", part: true, reads: 3, fault: func(t *testing.T, out AppendJob) {
			faults.Add(testsvc.Fault{Method: "GET", Path: out.Object, Action: testsvc.Flip, At: 1, Count: 1})
		}},
		{name: "part, changed once as it is appended", part: true, reads: 3, fault: func(t *testing.T, out AppendJob) {
			// The first read passes as it is (a hold already released);
			// the second changes an id of the shard's first document into
			// one outside the vocabulary, which the store refuses before
			// the hash is known.
			b := objectBytes(t, bucket, out.Object)
			at := -1
			for i := 0; i+1 < len(b); i += 2 {
				id := uint32(binary.LittleEndian.Uint16(b[i:]))
				if id == eos {
					break
				}
				if id^0x100 >= uint32(out.Tokenizer.VocabSize) {
					at = i + 1
					break
				}
			}
			if at < 0 {
				t.Fatalf("no id of the shard's first document leaves the vocabulary of %d with its ninth bit changed: make the test's documents of other words", out.Tokenizer.VocabSize)
			}
			released := make(chan struct{})
			close(released)
			faults.Add(testsvc.Fault{Method: "GET", Path: out.Object, Action: testsvc.Hold, Release: released, Count: 1})
			faults.Add(testsvc.Fault{Method: "GET", Path: out.Object, Action: testsvc.Flip, At: int64(at), Count: 1})
		}},
		{name: "part, damaged in object storage", part: true, reads: shardReads, damaged: true, fault: damage},
		// A store that fails as the cut is read is an outage, which the
		// task waits out: no stored shard is blamed, and it is read once.
		{name: "part, the store failing as its cut is found", part: true, reads: 1, down: true, fault: func(t *testing.T, out AppendJob) {
			faults.Add(testsvc.Fault{Method: "GET", Path: out.Object, Action: testsvc.Status, Code: 500})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			storeName := strings.NewReplacer(",", "", " ", "-").Replace(c.name)
			path := filepath.Join(dir, storeName+".parquet")
			writeParquet(t, path, rows, 20)
			job := ShardJob{Dataset: "local", Path: path, Store: storeName, Tokenizer: "t", ShardID: "local:" + path, Columns: Columns{Text: "text"}}
			out, _, err := p.Shard(ctx, job, nil)
			if err != nil {
				t.Fatal(err)
			}
			if size := out.Tokens * int64(tokens.DtypeFor(out.Tokenizer.VocabSize).Width()); size <= p.Prefetch {
				t.Fatalf("the shard is %d bytes, not past Prefetch (%d): it is read whole", size, p.Prefetch)
			}
			if c.part {
				out.Limits = Limits{MaxTokens: out.Tokens / 2}
			}
			c.fault(t, out)
			reads := &objectReads{Store: objects, key: out.Object}
			ap := *p
			ap.Objects = reads
			res, err := ap.Append(ctx, out, nil)
			if n := reads.n.Load(); n != int64(c.reads) {
				t.Errorf("the append read the shard %d times, want %d", n, c.reads)
			}
			m, merr := tokens.ReadManifest(filepath.Join(p.StoresDir, storeName))
			var stop *StopError
			switch {
			case c.down:
				var bad interface{ BadInput() bool }
				if err == nil || (errors.As(err, &bad) && bad.BadInput()) || !store.Unreachable(err) {
					t.Fatalf("append of a shard whose store fails as its cut is read: %v; want the store's outage, not bad input", err)
				}
				if merr == nil && m.Input(out.ShardID).Shards != 0 {
					t.Fatalf("store after the failed append: %+v; want none of the shard", m)
				}
			case c.damaged:
				var bad interface{ BadInput() bool }
				if err == nil || !errors.As(err, &bad) || !bad.BadInput() || !strings.Contains(err.Error(), fmt.Sprintf("read %d times", shardReads)) || !strings.Contains(err.Error(), "enqueue the ingest again") {
					t.Fatalf("append of a shard damaged in object storage: %v; want bad input saying to make it again", err)
				}
				if merr == nil && m.Input(out.ShardID).Shards != 0 {
					t.Fatalf("store after the refused append: %+v; want none of the shard", m)
				}
			case c.part:
				if !errors.As(err, &stop) || !res.Part || res.Tokens <= 0 || merr != nil || !m.Input(out.ShardID).Partial() || m.Tokens != res.Tokens {
					t.Fatalf("append of part of a shard changed on its way once: %+v, %v; store %+v, %v; want its part in", res, err, m, merr)
				}
			default:
				if err != nil || merr != nil || m.Tokens != out.Tokens || !m.Input(out.ShardID).Whole {
					t.Fatalf("append of a shard changed on its way once: %v; store %+v, %v; want the shard's %d tokens", err, m, merr, out.Tokens)
				}
			}
		})
	}
}

// objectReads counts the reads of one object, passing every request on.
type objectReads struct {
	store.Store
	key string
	n   atomic.Int64
}

func (o *objectReads) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if key == o.key {
		o.n.Add(1)
	}
	return o.Store.Get(ctx, key)
}
