package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

func TestShardObjectIsOneSafeKeyPerShard(t *testing.T) {
	ids := []string{"owner/corpus/data/a.parquet", "owner/corpus/data/b.parquet", "local:/data/*.parquet//data/a.parquet", "owner/x/../../../etc/passwd"}
	seen := map[string]bool{}
	for _, id := range ids {
		key := ShardObject("code", id)
		if !strings.HasPrefix(key, ShardPrefix("code")) || strings.Contains(strings.TrimPrefix(key, ShardPrefix("code")), "/") ||
			strings.Contains(key, "..") || seen[key] {
			t.Fatalf("ShardObject(%q) = %q: want one new key, one element under %s", id, key, ShardPrefix("code"))
		}
		seen[key] = true
		if ShardObject("code", id) != key {
			t.Fatal("the key of a shard must not change between attempts")
		}
	}
	for _, bad := range []string{"", "a/b", "..", ".hidden", "two words", `back\slash`} {
		if err := CheckStoreName(bad); err == nil || !strings.Contains(err.Error(), "token store name") {
			t.Errorf("CheckStoreName(%q) = %v", bad, err)
		}
	}
	if err := CheckStoreName("the-stack-v2_py.1"); err != nil {
		t.Error(err)
	}
}

// A retried append records a shard's skipped documents once, and a whole
// file skipped is recorded once, whatever the retries.
func TestRecordSkipsOnceAcrossRetries(t *testing.T) {
	ctx := context.Background()
	tok := testTokenizer(t)
	eos, _ := tok.EOS()
	dir := t.TempDir()
	app, err := tokens.OpenAppender(ctx, dir, tokens.Tokenizer{Name: "t", SHA256: tok.SHA256(), VocabSize: tok.VocabSize(), EOS: eos}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	shard := tokens.Encode(nil, tokens.Uint16, []uint32{5, 6, eos})
	if _, err := app.Append(ctx, tokens.ShardInfo{ID: "s1"}, bytes.NewReader(shard)); err != nil {
		t.Fatal(err)
	}
	skips := Skips{SkipInvalidUTF8: 3, SkipEmptyDocument: 1}
	for range 2 {
		if err := RecordSkips(ctx, app, tokens.Skipped{ID: "s1", Source: "a.parquet"}, skips); err != nil {
			t.Fatal(err)
		}
		if err := app.Skip(ctx, tokens.Skipped{ID: "bad", Reason: "corrupt-file: not parquet"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := app.Skip(ctx, tokens.Skipped{ID: "s1", Reason: "corrupt-file: x"}); err == nil {
		t.Fatal("an appended shard was recorded as skipped whole")
	}
	m := app.Manifest()
	got := map[string]int64{}
	for _, s := range m.Skipped {
		got[s.ID+" "+s.Reason] += max(s.Count, 1)
	}
	want := map[string]int64{"s1 invalid-utf8": 3, "s1 empty-document": 1, "bad corrupt-file: not parquet": 1}
	if len(got) != len(want) {
		t.Fatalf("skipped = %+v", m.Skipped)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("skipped = %+v; want %s counted %d", m.Skipped, k, v)
		}
	}
}

// The status is what planning and shard workers see of a store they do not
// hold; a store never appended to has the zero status.
func TestStatusOfAStore(t *testing.T) {
	ctx := context.Background()
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Objects: objects}
	st, err := p.Status(ctx, "none")
	if err != nil || st.Tokens != 0 || len(st.Done) != 0 {
		t.Fatalf("status of a new store: %+v %v", st, err)
	}
	m := tokens.Manifest{Dtype: tokens.Uint16, Tokens: 10, Documents: 2,
		Shards: []tokens.Shard{{ID: "b", Tokens: 4}, {ID: "a", Tokens: 6}},
		Skipped: []tokens.Skipped{{ID: "c", Reason: "empty-file: x: the file is empty"}, {ID: "a", Reason: "invalid-utf8", Count: 2},
			// Read again by the next ingest, which may read another column.
			{ID: "d", Reason: "missing-column: x"}, {ID: "e", Reason: "empty-file: x: no usable documents (skipped: empty-document=2)"}}}
	if _, err := p.publishStatus(ctx, "s", m, Limits{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	st, err = p.Status(ctx, "s")
	if err != nil || st.Tokens != 10 || st.Bytes != 20 || st.Shards != 2 || strings.Join(st.Done, ",") != "a,b,c" {
		t.Fatalf("status: %+v %v", st, err)
	}
	l := Limits{MaxTokens: 10}
	if msg := l.reached("s", st); !strings.Contains(msg, "--max-tokens is 10") {
		t.Fatalf("limit message %q", msg)
	}
	if msg := (Limits{MaxDisk: 21}).reached("s", st); msg != "" {
		t.Fatalf("below --max-disk: %q", msg)
	}
}

// gateWatch is a store that, while it receives a shard, says whether a
// shard's place in the tokenizing bound was free: after the first byte
// (it must not be: the shard is still being written) and at the end of
// the body (it must be: the shard gave its place back before waiting for
// the upload to complete).
type gateWatch struct {
	store.Store
	gate                   *semaphore.Weighted
	freeAtFirst, freeAtEnd bool
}

func (g *gateWatch) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if !strings.HasPrefix(key, ShardPrefix("s")) {
		return g.Store.Put(ctx, key, r, size)
	}
	free := func() bool {
		if g.gate.TryAcquire(1) {
			g.gate.Release(1)
			return true
		}
		return false
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(r, first); err != nil {
		return err
	}
	g.freeAtFirst = free()
	rest, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	g.freeAtEnd = free()
	return g.Store.Put(ctx, key, bytes.NewReader(append(first, rest...)), -1)
}

// A shard holds its place among those tokenizing at once while its tokens
// are written, and gives it back before it waits for its upload to
// complete, so that the next shard can use the cores meanwhile.
func TestShardGivesBackItsTokenizingPlaceBeforeItsUploadCompletes(t *testing.T) {
	ctx := context.Background()
	tok := testTokenizer(t)
	local, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	gate := semaphore.NewWeighted(1)
	objects := &gateWatch{Store: local, gate: gate}
	p := &Pipeline{Objects: objects, Tokenizing: gate,
		Tokenizer: func(context.Context, string) (*tokenizer.Tokenizer, error) { return tok, nil }}
	var rows []textRow
	for i := range 2000 {
		rows = append(rows, textRow{Text: fmt.Sprintf("document %d: the quick brown fox; func main() {}", i)})
	}
	path := filepath.Join(t.TempDir(), "a.parquet")
	writeParquet(t, path, rows, 500)
	p.LocalRoots = []string{filepath.Dir(path)}
	out, done, err := p.Shard(ctx, ShardJob{Path: path, Store: "s", Tokenizer: "t", ShardID: "local:a"}, nil)
	if err != nil || done || out.Documents != int64(len(rows)) || out.Object == "" {
		t.Fatalf("Shard = %+v, %v, %v", out, done, err)
	}
	if objects.freeAtFirst {
		t.Error("the shard's place was free while its tokens were still being written")
	}
	if !objects.freeAtEnd {
		t.Error("the shard still held its place when its upload was about to complete")
	}
	info, err := local.Stat(ctx, out.Object)
	if err != nil || info.Size != out.Tokens*2 {
		t.Fatalf("shard object: %+v, %v; want %d bytes", info, err, out.Tokens*2)
	}
	if !gate.TryAcquire(1) {
		t.Fatal("the shard kept its place after it returned")
	}
}

// Appends of one process to one store run at once (a worker serves two):
// each reads its shard first, then they take turns on the store. Every
// shard goes in exactly once, a task repeated for the same shard included,
// and the store's tokens are the shards' own, whole.
func TestAppendsAtOnceGoInOnce(t *testing.T) {
	ctx := context.Background()
	tok := testTokenizer(t)
	eos, _ := tok.EOS()
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir()}
	meta := tokens.Tokenizer{Name: "t", SHA256: tok.SHA256(), VocabSize: tok.VocabSize(), EOS: eos}
	const shards = 8
	var jobs []AppendJob
	want := map[string][]byte{}
	for i := range shards {
		ids := []uint32{}
		for j := range 1000 + 100*i {
			ids = append(ids, uint32(5+(i*31+j)%50))
		}
		ids = append(ids, eos)
		b := tokens.Encode(nil, tokens.Uint16, ids)
		id := fmt.Sprintf("owner/corpus/data/%d.parquet", i)
		key := ShardObject("corpus", id)
		if err := objects.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		jobs = append(jobs, AppendJob{Store: "corpus", ShardID: id, Object: key, SHA256: hex.EncodeToString(sum[:]),
			Documents: 1, Tokens: int64(len(ids)), Tokenizer: meta})
		want[id] = b
	}
	// Shard 3's task twice, as a retried or re-enqueued task can be.
	jobs = append(jobs, jobs[3])
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, job := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = p.Append(ctx, job, nil)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	dir := filepath.Join(p.StoresDir, "corpus")
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) != shards {
		t.Fatalf("%d shards committed, want %d", len(m.Shards), shards)
	}
	all, err := os.ReadFile(filepath.Join(dir, tokens.TokensFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range m.Shards {
		got := all[s.Offset*2 : (s.Offset+s.Tokens)*2]
		if !bytes.Equal(got, want[s.ID]) {
			t.Fatalf("shard %s: the store's %d tokens at %d are not the shard's", s.ID, s.Tokens, s.Offset)
		}
		delete(want, s.ID)
	}
	if len(want) != 0 {
		t.Fatalf("shards missing from the store: %v", want)
	}
}

// While the Hub keeps a download waiting (it answers 503 and the client
// waits to try again), the shard says so in its progress, with the
// answer and the attempt, not "downloading" as if the file were coming.
func TestAShardSaysWhyItsDownloadWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	h.Add(corpusRepo, "data/a.parquet", parquetBytes(t, []textRow{{Text: "func main() {}"}}), true)
	var mu sync.Mutex
	refusals := 2
	h.SetBeforeResolve(func(context.Context, string, string) error {
		mu.Lock()
		defer mu.Unlock()
		if refusals > 0 {
			refusals--
			return errors.New("busy")
		}
		return nil
	})
	res, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: "code", Tokenizer: "t", Seed: 3})
	if err != nil || len(res.Shards) != 1 {
		t.Fatalf("plan: %+v, %v", res, err)
	}
	var said []string
	if _, _, err := p.Shard(ctx, res.Shards[0], func(msg string) { said = append(said, msg) }); err != nil {
		t.Fatal(err)
	}
	waits := 0
	for _, m := range said {
		if strings.HasPrefix(m, "downloading data/a.parquet: ") && strings.Contains(m, "503 Service Unavailable; trying again in ") {
			waits++
			if want := fmt.Sprintf("(attempt %d of 9)", waits+1); !strings.HasSuffix(m, want) {
				t.Errorf("progress %q does not end %q", m, want)
			}
		}
	}
	if waits != 2 || !slices.Equal(said[len(said)-2:], []string{"tokenizing data/a.parquet", "uploading the shard of data/a.parquet"}) {
		t.Errorf("progress %q; want two waits for the Hub, then the tokenizing and the shard's upload", said)
	}
}
