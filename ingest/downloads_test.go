package ingest

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/tokenizer"
)

// A shard whose download was cut off (its task cancelled, its worker
// stopped) leaves the partial file for its retry, which resumes it; one
// that no retry takes up is removed by a later shard once it has lain
// untouched for StaleDownloadAge, but never while a process holds it.
func TestADownloadNoTaskFinishesIsRemoved(t *testing.T) {
	t.Parallel()
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	h.BreakOnce = true // every file's first download breaks at half its bytes
	for _, name := range []string{"a", "b", "c"} {
		var rows []textRow
		for d := range 200 {
			rows = append(rows, textRow{Text: fmt.Sprintf("file %s doc %d: func main() { println(%d) }", name, d, d)})
		}
		h.Add(corpusRepo, "data/"+name+".parquet", parquetBytes(t, rows), true)
	}
	// cut[path], when set, cancels the download of path as it resumes.
	var mu sync.Mutex
	cut := map[string]context.CancelFunc{}
	resolves := map[string]int{}
	h.SetBeforeResolve(func(_ context.Context, _, path string) error {
		mu.Lock()
		defer mu.Unlock()
		if resolves[path]++; resolves[path] == 2 && cut[path] != nil {
			cut[path]()
		}
		return nil
	})
	res, err := p.Plan(context.Background(), PlanJob{Dataset: "corpus", Store: "code", Tokenizer: "t", Seed: 1})
	if err != nil || len(res.Shards) != 3 {
		t.Fatalf("plan: %+v, %v", res, err)
	}
	jobs := map[string]ShardJob{}
	for _, j := range res.Shards {
		jobs[strings.TrimSuffix(filepath.Base(j.Path), ".parquet")] = j
	}
	raw := filepath.Join(p.DataDir, "raw")
	filesOf := func(name string) []string {
		var out []string
		filepath.WalkDir(raw, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.Contains(d.Name(), name+".parquet") {
				out = append(out, path)
			}
			return nil
		})
		return out
	}
	cutOff := func(name string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		mu.Lock()
		cut["data/"+name+".parquet"] = cancel
		mu.Unlock()
		if _, _, err := p.Shard(ctx, jobs[name], nil); err == nil {
			t.Fatalf("the shard of %s whose download was cut off succeeded", name)
		}
		if left := filesOf(name); len(left) != 1 || !strings.HasSuffix(left[0], ".part") {
			t.Fatalf("the cut-off download of %s left %q, want its partial file", name, left)
		}
	}
	shard := func(name string) {
		t.Helper()
		if _, _, err := p.Shard(context.Background(), jobs[name], nil); err != nil {
			t.Fatalf("shard of %s: %v", name, err)
		}
	}

	// A partial download stays for the retry, past other shards, and the
	// retry resumes it.
	cutOff("a")
	shard("b")
	if left := filesOf("a"); len(left) != 1 {
		t.Fatalf("a's partial download was removed before its retry: %q", left)
	}
	before := len(h.Requests())
	shard("a")
	resumed := false
	for _, r := range h.Requests()[before:] {
		resumed = resumed || r.Host == "cdn" && r.Range != ""
	}
	if !resumed {
		t.Fatalf("the retry of a did not resume its partial download: %+v", h.Requests()[before:])
	}
	if left := filesOf("a"); len(left) != 0 {
		t.Fatalf("a's download left %q after its shard was written", left)
	}

	// One that no retry takes up goes once it is old, unless a live
	// process holds it.
	cutOff("c")
	old := time.Now().Add(-StaleDownloadAge - time.Hour)
	heldDir := filepath.Join(raw, "code", "held")
	held, err := holdDownload(heldDir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Remove()
	if err := os.WriteFile(filepath.Join(heldDir, "h.parquet.part"), []byte("part"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range append(filesOf("c"), filesOf("h")...) {
		for dir := path; dir != raw; dir = filepath.Dir(dir) {
			if err := os.Chtimes(dir, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	shard("b")
	if left := filesOf("c"); len(left) != 0 {
		t.Fatalf("the download no task finishes is still there a day on: %q", left)
	}
	if left := filesOf("h"); len(left) != 1 {
		t.Fatalf("a download a live process holds was removed: %q", left)
	}

	// A second run of a shard's task while the first reads its file waits
	// for it a moment, then fails to be tried again, leaving it alone.
	first, err := holdDownload(downloadDir(p.DataDir, "code", jobs["b"].ShardID))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Remove()
	if _, _, err := p.Shard(context.Background(), jobs["b"], nil); err == nil || !strings.Contains(err.Error(), "is held by another process") {
		t.Fatalf("a second shard of b while the first holds its download: %v", err)
	}
}
