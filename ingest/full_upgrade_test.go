package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// An older kiln wrote "full" in a store's status where an append refused a
// whole file at a limit, with room left for some of its documents. After an
// upgrade the same ingest fills that store to the limit, as a fresh ingest
// under it does, rather than taking the old mark for a store full at it;
// and the store is then marked full at the limit, so the ingest again
// stops before it lists a file.
func TestAStoreAnOlderKilnMarkedFullIsFilledToItsLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tok := testTokenizer(t)
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": tok})
	all := partHub(t, h, corpusRepo)
	// ingest plans job into its store, tokenizes every shard of the plan,
	// then appends them in the plan's order, as workers would.
	ingest := func(job PlanJob) *tokens.Manifest {
		t.Helper()
		job.Dataset, job.Tokenizer, job.Seed = "corpus", "t", 5
		var stop *StopError
		res, err := p.Plan(ctx, job)
		if err != nil {
			t.Fatalf("plan of %s at %+v: %v", job.Store, job.Limits, err)
		}
		var jobs []AppendJob
		for _, sj := range res.Shards {
			out, done, err := p.Shard(ctx, sj, nil)
			switch {
			case errors.As(err, &stop):
			case err != nil:
				t.Fatal(err)
			case !done:
				jobs = append(jobs, out)
			}
		}
		for _, j := range jobs {
			if _, err := p.Append(ctx, j, nil); err != nil && !errors.As(err, &stop) {
				t.Fatal(err)
			}
		}
		m, err := tokens.ReadManifest(filepath.Join(p.StoresDir, job.Store))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ref := ingest(PlanJob{Store: "whole"})
	first, second := ref.Shards[0], ref.Shards[1]
	limit := Limits{MaxTokens: first.Tokens + second.Tokens/2}

	// The store as the older kiln left it: the first file in whole, the
	// second refused whole at the limit, marked "full" at it.
	if m := ingest(PlanJob{Store: "old", MaxFiles: 1, Limits: limit}); m.Tokens != first.Tokens {
		t.Fatalf("the first file: %d tokens, want %d", m.Tokens, first.Tokens)
	}
	r, err := p.Objects.Get(ctx, StatusKey("old"))
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	err = json.NewDecoder(r).Decode(&raw)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	raw["full"] = limit
	b, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Objects.Put(ctx, StatusKey("old"), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}

	old := ingest(PlanJob{Store: "old", Limits: limit})
	fresh := ingest(PlanJob{Store: "fresh", Limits: limit})
	if old.Tokens != fresh.Tokens || old.Documents != fresh.Documents || old.Tokens <= first.Tokens || old.Tokens > limit.MaxTokens {
		t.Fatalf("the store an older kiln marked full, after the same ingest: %d tokens, %d documents; a fresh ingest at --max-tokens %d: %d, %d",
			old.Tokens, old.Documents, limit.MaxTokens, fresh.Tokens, fresh.Documents)
	}
	if !slices.Equal(storeDocs(t, tok, filepath.Join(p.StoresDir, "old"), all), storeDocs(t, tok, filepath.Join(p.StoresDir, "fresh"), all)) {
		t.Fatal("the store an older kiln marked full holds other documents than a fresh ingest at its limit")
	}
	if st, err := p.Status(ctx, "old"); err != nil || st.Full != limit || st.Tokens != old.Tokens {
		t.Fatalf("the status after the ingest: %+v, %v; want full at %+v", st, err, limit)
	}
	var stop *StopError
	if res, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: "old", Tokenizer: "t", Seed: 5, Limits: limit}); !errors.As(err, &stop) ||
		len(res.Shards) != 0 || !strings.Contains(stop.Msg, fmt.Sprintf("full at --max-tokens %d", limit.MaxTokens)) {
		t.Fatalf("the same ingest again: %+v, %v; want it stopped, the store full", res, err)
	}
}

// The same for a direct ingest, whose store an older kiln marked full in
// the store's directory (FullMarkFile, holding the bare limits) where an
// append refused a whole file: the same run fills the store to its limit,
// and the mark it leaves stops the run again before it lists a file.
func TestAStoreAnOlderDirectIngestMarkedFullIsFilledToItsLimit(t *testing.T) {
	t.Parallel()
	h := hubtest.New()
	defer h.Close()
	all := partHub(t, h, "owner/parts")
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	dir := t.TempDir()
	opt := DirectOptions{Preset: Preset{Name: "parts", Repo: "owner/parts", Revision: "main", Include: []string{"data/*"}, Columns: Columns{Text: "text"}},
		Hub: hc, Tokenizer: tok, TokenizerName: "t", StoreDir: filepath.Join(dir, "whole"), DataDir: filepath.Join(dir, "data"), Seed: 5}
	ctx := context.Background()
	if rep, err := Direct(ctx, opt); err != nil || rep.Appended != 3 {
		t.Fatalf("one-shot ingest: %+v, %v", rep, err)
	}
	ref, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	first, second := ref.Shards[0], ref.Shards[1]
	opt.MaxTokens = first.Tokens + second.Tokens/2

	// The store as the older kiln left it: the first file in whole, the
	// second refused whole at the limit, and the mark of it.
	oldDir := filepath.Join(dir, "old")
	opt.StoreDir, opt.MaxFiles = oldDir, 1
	if rep, err := Direct(ctx, opt); err != nil || rep.Appended != 1 || rep.Stopped != "" {
		t.Fatalf("the first file: %+v, %v", rep, err)
	}
	mark := filepath.Join(oldDir, FullMarkFile)
	if err := os.WriteFile(mark, fmt.Appendf(nil, `{"max_tokens":%d}`+"\n", opt.MaxTokens), 0o644); err != nil {
		t.Fatal(err)
	}

	opt.MaxFiles = 0
	rep, err := Direct(ctx, opt)
	if err != nil || rep.Partial != 1 || !strings.Contains(rep.Stopped, fmt.Sprintf("reached --max-tokens %d with part of %s taken", opt.MaxTokens, second.Source)) {
		t.Fatalf("the same run after the older kiln's mark: %+v, %v; want part of %s taken", rep, err, second.Source)
	}
	freshDir := filepath.Join(dir, "fresh")
	opt.StoreDir = freshDir
	if _, err := Direct(ctx, opt); err != nil {
		t.Fatal(err)
	}
	old, err := tokens.ReadManifest(oldDir)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := tokens.ReadManifest(freshDir)
	if err != nil {
		t.Fatal(err)
	}
	if old.Tokens != fresh.Tokens || old.Documents != fresh.Documents || old.Tokens <= first.Tokens || old.Tokens > opt.MaxTokens {
		t.Fatalf("the store an older kiln marked full, after the same run: %d tokens, %d documents; a fresh run at --max-tokens %d: %d, %d",
			old.Tokens, old.Documents, opt.MaxTokens, fresh.Tokens, fresh.Documents)
	}
	if !slices.Equal(storeDocs(t, tok, oldDir, all), storeDocs(t, tok, freshDir, all)) {
		t.Fatal("the store an older kiln marked full holds other documents than a fresh run at its limit")
	}
	if b, err := os.ReadFile(mark); err != nil || !strings.Contains(string(b), fmt.Sprintf(`"full_at":{"max_tokens":%d}`, opt.MaxTokens)) {
		t.Fatalf("the mark after the run: %q, %v; want the store full at --max-tokens %d", b, err, opt.MaxTokens)
	}
	opt.StoreDir = oldDir
	if rep, err := Direct(ctx, opt); err != nil || !rep.StoppedBeforePlan() || !strings.Contains(rep.Stopped, fmt.Sprintf("full at --max-tokens %d", opt.MaxTokens)) {
		t.Fatalf("the same run again: %+v, %v; want it stopped before a file, the store full", rep, err)
	}
}
