package ingest

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
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
