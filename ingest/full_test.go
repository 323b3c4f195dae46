package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// Once an append reached --max-tokens, taking the leading documents of its
// shard that fit, the store is full at that limit: the shards planned
// under it that have not started stop without downloading their file, one
// whose download was under way stops before tokenizing it, and a plan
// under it (or a lower limit) stops at once. A larger limit plans the rest
// of the file taken in part and the files left out, and appends them after
// the ones in, which do not change.
func TestAStoreFullAtItsLimitReadsNoMoreFiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	objects := p.Objects
	// Seven files of one number of tokens (they differ in one digit) and a
	// small one.
	file := func(f, docs int) []byte {
		var rows []textRow
		for d := range docs {
			rows = append(rows, textRow{Text: fmt.Sprintf("file %d doc %d: the quick brown fox; func main() {}", f, d)})
		}
		return parquetBytes(t, rows)
	}
	for f := range 7 {
		h.Add(corpusRepo, fmt.Sprintf("data/full-%d.parquet", f), file(f, 9), true)
	}
	h.Add(corpusRepo, "data/small.parquet", file(7, 2), true)
	// onDownload[path] runs before the hub answers the file's first
	// download.
	var mu sync.Mutex
	onDownload := map[string]func(){}
	h.SetBeforeResolve(func(_ context.Context, _, path string) error {
		mu.Lock()
		run := onDownload[path]
		delete(onDownload, path)
		mu.Unlock()
		if run != nil {
			run()
		}
		return nil
	})
	const name = "code"
	plan := func(l Limits) (PlanResult, error) {
		return p.Plan(ctx, PlanJob{Dataset: "corpus", Store: name, Tokenizer: "t", Seed: 3, Limits: l})
	}
	shard := func(j ShardJob) AppendJob {
		t.Helper()
		out, done, err := p.Shard(ctx, j, nil)
		if err != nil || done || out.Object == "" {
			t.Fatalf("shard of %s: %+v, %v, %v", j.Path, out, done, err)
		}
		return out
	}
	appendOK := func(j AppendJob) {
		t.Helper()
		if res, err := p.Append(ctx, j, nil); err != nil || res.Tokens != j.Tokens {
			t.Fatalf("append of %s: %+v, %v", j.Source, res, err)
		}
	}
	status := func() StoreStatus {
		t.Helper()
		st, err := p.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	// The files' tokens, and room for two full files and the small one.
	probe, err := plan(Limits{})
	if err != nil || len(probe.Shards) != 8 {
		t.Fatalf("plan: %+v, %v", probe, err)
	}
	var fullJobs []ShardJob
	var smallJob ShardJob
	for _, j := range probe.Shards {
		if strings.Contains(j.Path, "small") {
			smallJob = j
		} else {
			fullJobs = append(fullJobs, j)
		}
	}
	measure := func(j ShardJob) int64 {
		j.Store = "probe"
		j.ShardID = "probe:" + j.ShardID
		return shard(j).Tokens
	}
	perFile, small := measure(fullJobs[0]), measure(smallJob)
	if measure(fullJobs[1]) != perFile || 2*small >= perFile {
		t.Fatalf("the fixture's files: %d tokens, %d for the small one; want equal full files and a small one under half", perFile, small)
	}
	limits := Limits{MaxTokens: 2*perFile + perFile/2}

	res, err := plan(limits)
	if err != nil || len(res.Shards) != 8 {
		t.Fatalf("plan: %+v, %v", res, err)
	}
	fullJobs = fullJobs[:0]
	for _, j := range res.Shards {
		if strings.Contains(j.Path, "small") {
			smallJob = j
		} else {
			fullJobs = append(fullJobs, j)
		}
	}
	// Four shards are tokenized before any append, as four workers would.
	in := []AppendJob{shard(fullJobs[0]), shard(fullJobs[1]), shard(fullJobs[2]), shard(smallJob)}
	appendOK(in[0])
	appendOK(in[1])
	// The small shard fits whole.
	appendOK(in[3])
	// The third full file is taken in part while the fourth downloads: its
	// leading documents that fit.
	var stopped error
	var part AppendResult
	mu.Lock()
	onDownload[fullJobs[3].Path] = func() { part, stopped = p.Append(ctx, in[2], nil) }
	mu.Unlock()
	_, _, err = p.Shard(ctx, fullJobs[3], nil)
	var stop *StopError
	if !errors.As(stopped, &stop) || !strings.Contains(stop.Msg, fmt.Sprintf("reached --max-tokens %d with part of %s taken", limits.MaxTokens, in[2].Source)) ||
		!part.Part || part.Tokens <= 0 || part.Documents <= 0 || part.Documents >= in[2].Documents {
		t.Fatalf("the append past the limit: %+v, %v; want part of its documents taken", part, stopped)
	}
	in2 := 2*perFile + small + part.Tokens
	if st := status(); st.Full != limits || st.Tokens != in2 || st.Tokens > limits.MaxTokens || len(st.Partial) != 1 || st.Partial[0].ID != in[2].ShardID || st.done(in[2].ShardID) {
		t.Fatalf("status after the part: %+v; want full at %+v with %d tokens and %s in part", st, limits, in2, in[2].ShardID)
	}
	if !errors.As(err, &stop) || !strings.Contains(stop.Msg, fullJobs[3].Path+" was downloaded but not tokenized") ||
		!strings.Contains(stop.Msg, fmt.Sprintf("full at --max-tokens %d", limits.MaxTokens)) || h.Downloads(0)[fullJobs[3].Path] != 1 {
		t.Fatalf("the shard whose download was under way: %v (%d downloads)", err, h.Downloads(0)[fullJobs[3].Path])
	}
	if _, err := objects.Stat(ctx, shardKey(fullJobs[3])); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the shard stopped before tokenizing left an object: %v", err)
	}
	if _, err := objects.Stat(ctx, in[2].Object); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the shard taken in part was left in object storage: %v", err)
	}
	// The rest are not downloaded.
	for _, j := range fullJobs[4:] {
		_, _, err := p.Shard(ctx, j, nil)
		if !errors.As(err, &stop) || !strings.Contains(stop.Msg, j.Path+" was not read") || h.Downloads(0)[j.Path] != 0 {
			t.Fatalf("shard of %s after the store filled: %v (%d downloads)", j.Path, err, h.Downloads(0)[j.Path])
		}
	}
	// Nor does a plan under the limit, or a lower one, list or queue them.
	storeDir := filepath.Join(p.StoresDir, name)
	m, err := tokens.ReadManifest(storeDir)
	if err != nil || len(m.Shards) != 4 || m.Tokens != in2 || m.Version != tokens.Version {
		t.Fatalf("manifest: %+v, %v", m, err)
	}
	before, err := os.ReadFile(filepath.Join(storeDir, tokens.TokensFile))
	if err != nil {
		t.Fatal(err)
	}
	requests := len(h.Requests())
	for _, l := range []Limits{limits, {MaxTokens: limits.MaxTokens - 1}} {
		if res, err := plan(l); !errors.As(err, &stop) || len(res.Shards) != 0 || !strings.Contains(stop.Msg, fmt.Sprintf("full at --max-tokens %d", l.MaxTokens)) {
			t.Fatalf("plan at %+v of a full store: %+v, %v", l, res, err)
		}
	}
	if got := h.Downloads(requests); len(got) != 0 {
		t.Fatalf("a plan of a full store downloaded %v", got)
	}
	if m2, err := tokens.ReadManifest(storeDir); err != nil || m2.Tokens != m.Tokens || len(m2.Shards) != len(m.Shards) {
		t.Fatalf("the store changed while full: %+v, %v", m2, err)
	}

	// A larger limit plans the rest of the file in part and the four files
	// left out, and the first append under it clears the mark.
	res, err = plan(Limits{MaxTokens: 10 * perFile})
	if err != nil || len(res.Shards) != 5 || res.Done != 3 || res.Rests() != 1 {
		t.Fatalf("plan at a larger limit: %d shards, %d done, %d rests, %v", len(res.Shards), res.Done, res.Rests(), err)
	}
	want := in2
	for _, j := range res.Shards {
		if j.ShardID == in[2].ShardID && j.From == 0 {
			t.Fatalf("the file in part is planned from its start: %+v", j)
		}
		out := shard(j)
		appendOK(out)
		want += out.Tokens
		if st := status(); st.Full != (Limits{}) || st.Tokens != want {
			t.Fatalf("status after an append under a larger limit: %+v", st)
		}
	}
	m2, err := tokens.ReadManifest(storeDir)
	if err != nil || len(m2.Shards) != 9 || m2.Tokens != 7*perFile+small {
		t.Fatalf("manifest after the larger limit: %+v, %v", m2, err)
	}
	for i := range m.Shards {
		if m2.Shards[i] != m.Shards[i] {
			t.Fatalf("shard %d changed: %+v, was %+v", i, m2.Shards[i], m.Shards[i])
		}
	}
	if st := status(); len(st.Partial) != 0 || !st.done(in[2].ShardID) {
		t.Fatalf("status once the rest is in: %+v", st)
	}
	after, err := os.ReadFile(filepath.Join(storeDir, tokens.TokensFile))
	if err != nil || !bytes.Equal(after[:len(before)], before) {
		t.Fatalf("the tokens in before the larger limit changed (%v)", err)
	}
}

// The mark of a full store: read from a status written before it existed
// (not full), kept and dropped by the appends after the refusal, and what
// it stops.
func TestFullStoreMark(t *testing.T) {
	ctx := context.Background()
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Objects: objects}
	old := []byte(`{"tokens":50,"documents":2,"bytes":100,"shards":1,"done":["a"],"updated":"2025-01-01T00:00:00Z"}`)
	if err := objects.Put(ctx, StatusKey("old"), bytes.NewReader(old), int64(len(old))); err != nil {
		t.Fatal(err)
	}
	st, err := p.Status(ctx, "old")
	if err != nil || st.Full != (Limits{}) || st.Tokens != 50 {
		t.Fatalf("a status without the mark: %+v, %v", st, err)
	}
	if msg := (Limits{MaxTokens: 51, MaxDisk: 101}).reached("old", st); msg != "" {
		t.Fatalf("a store below its limits, never refused, stops: %q", msg)
	}
	// An unmarked status is written as before.
	m := tokens.Manifest{Dtype: tokens.Uint16, Tokens: 50, Documents: 2, Shards: []tokens.Shard{{ID: "a", Tokens: 50}}}
	if _, err := p.publishStatus(ctx, "s", m, Limits{MaxTokens: 100}, Limits{}); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if b, err := p.Objects.Get(ctx, StatusKey("s")); err != nil {
		t.Fatal(err)
	} else if err := json.NewDecoder(b).Decode(&raw); err != nil {
		t.Fatal(err)
	} else if _, ok := raw["full_at"]; ok {
		t.Fatalf("an unmarked status carries the mark: %v", raw)
	}

	for _, c := range []struct {
		name               string
		full, job, refused Limits
		want               Limits
	}{
		{"refused", Limits{}, Limits{MaxTokens: 100}, Limits{MaxTokens: 100}, Limits{MaxTokens: 100}},
		{"refused on both", Limits{}, Limits{MaxTokens: 100, MaxDisk: 200}, Limits{MaxTokens: 100, MaxDisk: 200}, Limits{MaxTokens: 100, MaxDisk: 200}},
		{"refused at a lower limit", Limits{MaxTokens: 100}, Limits{MaxTokens: 80}, Limits{MaxTokens: 80}, Limits{MaxTokens: 100}},
		{"refused at a larger limit", Limits{MaxTokens: 100}, Limits{MaxTokens: 120}, Limits{MaxTokens: 120}, Limits{MaxTokens: 120}},
		{"in under the same limit", Limits{MaxTokens: 100}, Limits{MaxTokens: 100}, Limits{}, Limits{MaxTokens: 100}},
		{"in under a lower limit", Limits{MaxTokens: 100}, Limits{MaxTokens: 90}, Limits{}, Limits{MaxTokens: 100}},
		{"in under a larger limit", Limits{MaxTokens: 100}, Limits{MaxTokens: 101}, Limits{}, Limits{}},
		{"in under no token limit", Limits{MaxTokens: 100}, Limits{MaxDisk: 1000}, Limits{}, Limits{}},
		{"disk refused, tokens kept", Limits{MaxTokens: 100}, Limits{MaxTokens: 100, MaxDisk: 150}, Limits{MaxDisk: 150}, Limits{MaxTokens: 100, MaxDisk: 150}},
		{"disk in under a larger limit", Limits{MaxDisk: 150}, Limits{MaxDisk: 300}, Limits{}, Limits{}},
	} {
		if got := c.full.fullAfter(c.job, c.refused); got != c.want {
			t.Errorf("%s: %+v after %+v refused at %+v = %+v, want %+v", c.name, c.full, c.job, c.refused, got, c.want)
		}
		// Through the status the append publishes, as the next step reads it.
		name := strings.ReplaceAll(c.name, " ", "-")
		if _, err := p.publishStatus(ctx, name, m, Limits{MaxTokens: c.full.MaxTokens, MaxDisk: c.full.MaxDisk}, c.full); err != nil {
			t.Fatal(err)
		}
		if _, err := p.publishStatus(ctx, name, m, c.job, c.refused); err != nil {
			t.Fatal(err)
		}
		if st, err := p.Status(ctx, name); err != nil || st.Full != c.want {
			t.Errorf("%s: published %+v, %v; want %+v", c.name, st.Full, err, c.want)
		}
	}

	full := StoreStatus{Tokens: 50, Bytes: 100, Full: Limits{MaxTokens: 100, MaxDisk: 400}}
	for _, c := range []struct {
		l    Limits
		want string
	}{
		{Limits{MaxTokens: 100}, "full at --max-tokens 100 (a document that would pass --max-tokens 100 was left out)"},
		{Limits{MaxTokens: 60}, "full at --max-tokens 60 (a document that would pass --max-tokens 100 was left out)"},
		{Limits{MaxTokens: 101}, ""},
		{Limits{MaxDisk: 400}, "full at --max-disk 400"},
		{Limits{MaxDisk: 401}, ""},
		{Limits{}, ""},
		{Limits{MaxTokens: 40}, "it holds 50 tokens, --max-tokens is 40"},
	} {
		got := c.l.reached("s", full)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%+v on a store full at %+v: %q, want %q", c.l, full.Full, got, c.want)
		}
	}
}

// corpusRepo is newCorpus's dataset on its Hub test server.
const corpusRepo = "owner/corpus"

// newCorpus is a Pipeline over a real S3 server and a data directory of
// its own, whose preset corpus is the dataset corpusRepo (its data/*,
// column text) of the Hub test server it returns, and whose tokenizers
// are toks, by name.
func newCorpus(t *testing.T, toks map[string]*tokenizer.Tokenizer) (*Pipeline, *hubtest.Hub) {
	t.Helper()
	objects := versityObjects(t, testsvc.S3(t))
	h := hubtest.New()
	t.Cleanup(h.Close)
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	return &Pipeline{Objects: objects, Hub: hc, DataDir: filepath.Join(dir, "data"), StoresDir: filepath.Join(dir, "stores"),
		Presets: map[string]Preset{"corpus": {Name: "corpus", Repo: corpusRepo, Revision: "main", Include: []string{"data/*"}, Columns: Columns{Text: "text"}}},
		Tokenizer: func(_ context.Context, name string) (*tokenizer.Tokenizer, error) {
			if tok := toks[name]; tok != nil {
				return tok, nil
			}
			return nil, fmt.Errorf("no tokenizer %s", name)
		}}, h
}
