package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/tokenizer"
)

// A shard downloads its file at the commit its plan pinned. When a
// force-push has taken that commit from the hub, the shard fails as the
// user's to fix (archived at once, not retried), naming the file and the
// commit and saying to run the ingest again, not to check the preset's
// revision, which is fine; the plan made again downloads at the new commit.
func TestShardOfAForcePushedCommitSaysToPlanAgain(t *testing.T) {
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	for _, name := range []string{"a", "b"} {
		var rows []textRow
		for d := range 20 {
			rows = append(rows, textRow{Text: fmt.Sprintf("file %s doc %d: func main() { println(%d) }", name, d, d)})
		}
		h.Add(corpusRepo, "data/"+name+".parquet", parquetBytes(t, rows), true)
	}
	ctx := context.Background()
	plan := func() map[string]ShardJob {
		t.Helper()
		res, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: "code", Tokenizer: "t", Seed: 1})
		if err != nil || len(res.Shards) != 2 {
			t.Fatalf("plan: %+v, %v", res, err)
		}
		jobs := map[string]ShardJob{}
		for _, j := range res.Shards {
			jobs[j.Path] = j
		}
		return jobs
	}
	jobs := plan()
	old := jobs["data/a.parquet"].Revision
	if old != h.Commit {
		t.Fatalf("the plan pinned revision %q, want the commit %s", old, h.Commit)
	}
	if _, _, err := p.Shard(ctx, jobs["data/a.parquet"], nil); err != nil {
		t.Fatal(err)
	}
	if n := h.Downloads(0)["data/a.parquet"]; n != 1 {
		t.Fatalf("data/a.parquet was downloaded %d times at commit %s", n, old)
	}

	now := h.ForcePush()
	_, _, err := p.Shard(ctx, jobs["data/b.parquet"], nil)
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !bad.BadInput() {
		t.Fatalf("a shard whose commit is gone: %v; want an error that is the user's to fix", err)
	}
	for _, want := range []string{"data/b.parquet", old, "run the ingest again"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("a shard whose commit is gone says %q; want it to name %q", err, want)
		}
	}

	jobs = plan()
	if j := jobs["data/b.parquet"]; j.Revision != now {
		t.Fatalf("the plan made again pinned %q, want the new commit %s", j.Revision, now)
	}
	if _, _, err := p.Shard(ctx, jobs["data/b.parquet"], nil); err != nil {
		t.Fatalf("the shard planned again: %v", err)
	}
}

// The Hub lists a gated dataset's files for all and refuses only their
// downloads. Planning one without HF_TOKEN fails once as the user's to
// fix, naming HF_TOKEN and the dataset's page, and queues no shard, where
// every file's shard was queued to fail with the same message.
func TestPlanOfAGatedDatasetWithoutTokenQueuesNoShard(t *testing.T) {
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	h.Gated, h.Authorized, h.PublicListing = true, "hf_granted", true
	for _, name := range []string{"a", "b", "c"} {
		h.Add(corpusRepo, "data/"+name+".parquet", parquetBytes(t, []textRow{{Text: "func main() {}"}}), true)
	}
	res, err := p.Plan(context.Background(), PlanJob{Dataset: "corpus", Store: "code", Tokenizer: "t", Seed: 1})
	var bad interface{ BadInput() bool }
	if err == nil || !hub.IsGated(err) || !errors.As(err, &bad) || !bad.BadInput() || len(res.Shards) != 0 {
		t.Fatalf("the plan of a gated dataset without a token queued %d shards, error %v; want none and a gated error", len(res.Shards), err)
	}
	page := h.Server.URL + "/datasets/" + corpusRepo
	if !strings.Contains(err.Error(), "HF_TOKEN") || !strings.Contains(err.Error(), page) {
		t.Fatalf("the plan of a gated dataset without a token says %q; want HF_TOKEN and %s named", err, page)
	}

	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL, Token: "hf_granted"})
	if err != nil {
		t.Fatal(err)
	}
	p.Hub = hc
	res, err = p.Plan(context.Background(), PlanJob{Dataset: "corpus", Store: "code", Tokenizer: "t", Seed: 1})
	if err != nil || len(res.Shards) != 3 {
		t.Fatalf("with a granted token: %d shards, %v", len(res.Shards), err)
	}
	if _, _, err := p.Shard(context.Background(), res.Shards[0], nil); err != nil {
		t.Fatalf("with a granted token: %v", err)
	}
}
