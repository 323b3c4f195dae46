package ingest

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
)

// A shard smaller than an upload's part is sent whole once its file is
// tokenized: while a slow or hung store holds that upload, the task says
// it uploads, not that it still tokenizes its file.
func TestAShardHeldInItsUploadSaysItUploads(t *testing.T) {
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
	for i := range 20 {
		rows = append(rows, textRow{strings.Repeat("func main() { return } ", 3+i%5)})
	}
	path := filepath.Join(dir, "a.parquet")
	writeParquet(t, path, rows, 10)
	release, held := make(chan struct{}), make(chan struct{})
	faults.Add(testsvc.Fault{Method: "PUT", Path: "/shards/", Action: testsvc.Hold, Release: release, Held: held})
	var mu sync.Mutex
	var said []string
	done := make(chan error, 1)
	go func() {
		_, _, err := p.Shard(ctx, ShardJob{Dataset: "local", Path: path, Store: "s", Tokenizer: "t", ShardID: "local:" + path, Columns: Columns{Text: "text"}},
			func(msg string) {
				mu.Lock()
				said = append(said, msg)
				mu.Unlock()
			})
		done <- err
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the shard task ended (%v) before its upload reached the store", err)
	}
	mu.Lock()
	last := said[len(said)-1]
	mu.Unlock()
	if want := "uploading the shard of " + path; last != want {
		t.Errorf("while its upload is held the task says %q; want %q", last, want)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the shard task, its upload released: %v", err)
	}
}
