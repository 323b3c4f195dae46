package ingest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
)

// A token the Hub refuses for every file of a dataset, for a reason other
// than its gate, stops the plan's shards as a gated dataset does: the
// first shard refused its download records the refusal, and the shards
// queued behind it fail before theirs, each in one line naming HF_TOKEN,
// what to do with it and the dataset's page. The Hub lists a gated
// dataset for all, so a fine-grained token without the permission to read
// gated datasets plans every file and has each download refused (403);
// a token revoked mid-ingest has the downloads refused too (401). A new
// plan with a token the Hub takes clears the record and ingests the files.
func TestATokenTheHubRefusesStopsTheShardsQueuedBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	h.Gated, h.PublicListing, h.Authorized, h.FineGrained = true, true, "hf_good", "hf_fine"
	for f := range 3 {
		h.Add(corpusRepo, fmt.Sprintf("data/part-%d.jsonl", f), fmt.Appendf(nil, `{"text":"file %d: the quick brown fox"}`+"\n", f), true)
	}
	withToken, plan := threeFilePlans(t, p, h)
	page := h.Server.URL + "/datasets/" + corpusRepo
	// refused runs the plan's shards one after another, and checks that the
	// first is refused its download, and the others end before theirs.
	refused := func(res PlanResult, status int, fix string, words ...string) {
		t.Helper()
		before := len(h.Requests())
		for i, job := range res.Shards {
			_, _, err := p.Shard(ctx, job, nil)
			var bad interface{ BadInput() bool }
			if err == nil || !errors.As(err, &bad) || !bad.BadInput() || strings.Contains(err.Error(), "\n") {
				t.Fatalf("shard of %s: %v; want one line, the user's to fix", job.Path, err)
			}
			want := append([]string{"HF_TOKEN", page}, words...)
			var a *hub.AccessError
			var r *RefusedPlanError
			switch {
			case i == 0 && (!errors.As(err, &a) || a.Status != status):
				t.Fatalf("the first shard, of %s: %v; want the Hub's %d", job.Path, err, status)
			case i > 0 && !errors.As(err, &r):
				t.Fatalf("shard of %s, queued behind a refused one: %v; want it ended before its download", job.Path, err)
			case i > 0:
				want = append(want, job.Path+" was not downloaded", "once "+fix+" plans it again")
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("shard of %s says %q; want %q in it", job.Path, err, w)
				}
			}
		}
		if got := h.Downloads(before); len(got) != 1 || got[res.Shards[0].Path] != 1 {
			t.Fatalf("downloads asked for: %v; want the first shard's once", got)
		}
	}

	withToken("hf_fine")
	refused(plan("fine"), http.StatusForbidden, "HF_TOKEN may read the dataset", `"Read access to contents of all public gated repos you can access"`)
	withToken("hf_good")
	res := plan("fine")
	if _, err := p.Objects.Get(ctx, RefusalKey("fine")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refusal after a new plan: %v; want it removed", err)
	}
	for _, job := range res.Shards {
		if _, _, err := p.Shard(ctx, job, nil); err != nil {
			t.Fatalf("shard of %s with a token the Hub takes: %v", job.Path, err)
		}
	}

	res = plan("revoked")
	h.Revoke("hf_good")
	refused(res, http.StatusUnauthorized, "HF_TOKEN holds a valid token", "invalid or expired")
}

// A dataset the Hub no longer has when the plan's shards download it
// (deleted, renamed or made private after the plan: 404 RepoNotFound to a
// token, 401 to a request without one) stops the plan's shards as a token
// the Hub refuses does: the first shard records the refusal, and the
// shards queued behind it fail before their download, each in one line
// naming the dataset's page, what became of it and HF_TOKEN, none tried
// again. A file alone gone (404 EntryNotFound) is that file's failure and
// no refusal: the shards behind it download theirs. A new plan, once the
// dataset is back, clears the record and ingests the files.
func TestADatasetGoneAfterItsPlanStopsTheShardsQueuedBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	files := map[string][]byte{}
	for f := range 3 {
		files[fmt.Sprintf("data/part-%d.jsonl", f)] = fmt.Appendf(nil, `{"text":"file %d: the quick brown fox"}`+"\n", f)
	}
	restore := func() {
		for path, b := range files {
			h.Add(corpusRepo, path, b, true)
		}
	}
	restore()
	withToken, plan := threeFilePlans(t, p, h)
	page := h.Server.URL + "/datasets/" + corpusRepo
	ingested := func(res PlanResult) {
		t.Helper()
		for _, job := range res.Shards {
			if _, _, err := p.Shard(ctx, job, nil); err != nil {
				t.Fatalf("shard of %s: %v", job.Path, err)
			}
		}
	}

	withToken("hf_token")
	res := plan("entry")
	h.DeleteFile(corpusRepo, res.Shards[0].Path)
	before := len(h.Requests())
	_, _, err := p.Shard(ctx, res.Shards[0], nil)
	var nf *hub.NotFoundError
	if !errors.As(err, &nf) || isBadInput(err) {
		t.Fatalf("the shard of a file deleted after the plan: %v; want its own 404, tried again", err)
	}
	ingested(PlanResult{Shards: res.Shards[1:]})
	if _, err := p.Objects.Get(ctx, RefusalKey("entry")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refusal after a file's 404: %v; want none", err)
	}
	if got := h.Downloads(before); len(got) != 3 {
		t.Fatalf("downloads asked for: %v; want each file's", got)
	}
	restore()

	for _, c := range []struct {
		token, store, fix string
		status            int
	}{
		{"hf_token", "gone", "once the dataset's name is checked (it was deleted, renamed or made private since the plan) and HF_TOKEN may read it plans it again", http.StatusNotFound},
		{"", "gone-anonymous", "once the dataset's name is checked (it was deleted, renamed or made private since the plan), or HF_TOKEN is set if it is private plans it again", http.StatusUnauthorized},
	} {
		withToken(c.token)
		res := plan(c.store)
		h.Delete(corpusRepo)
		before := len(h.Requests())
		for i, job := range res.Shards {
			_, _, err := p.Shard(ctx, job, nil)
			if !isBadInput(err) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("token %q: shard of %s: %v; want one line, the user's to fix", c.token, job.Path, err)
			}
			want := []string{corpusRepo, page, "HF_TOKEN"}
			var gone *hub.RepoNotFoundError
			var a *hub.AccessError
			var r *RefusedPlanError
			switch {
			case i == 0 && c.status == http.StatusNotFound && !errors.As(err, &gone):
				t.Fatalf("the first shard, of %s: %v; want the dataset not found", job.Path, err)
			case i == 0 && c.status == http.StatusUnauthorized && (!errors.As(err, &a) || !a.NotFound || a.Status != c.status):
				t.Fatalf("the first shard, without a token, of %s: %v; want the Hub's 401 RepoNotFound", job.Path, err)
			case i > 0 && !errors.As(err, &r):
				t.Fatalf("shard of %s, queued behind a refused one: %v; want it ended before its download", job.Path, err)
			case i > 0:
				want = append(want, job.Path+" was not downloaded", c.fix)
			}
			if c.status == http.StatusNotFound {
				want = append(want, "is no longer found", "deleted, renamed or made private")
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("token %q: shard of %s says %q; want %q in it", c.token, job.Path, err, w)
				}
			}
		}
		if got := h.Downloads(before); len(got) != 1 || got[res.Shards[0].Path] != 1 {
			t.Fatalf("token %q: downloads asked for: %v; want the first shard's once", c.token, got)
		}
		restore()
		ingested(plan(c.store))
	}
}

// isBadInput says whether err is the user's to fix, not tried again.
func isBadInput(err error) bool {
	var bad interface{ BadInput() bool }
	return errors.As(err, &bad) && bad.BadInput()
}

// A force-push that replaced the commit a plan pinned (404
// RevisionNotFound at the shards' downloads) stops the plan's shards as a
// dataset gone does: the first shard to meet it records the refusal, and
// the shards queued behind it fail before their download, each in one
// line naming the dataset, the commit and what plans it again, none tried
// again. Where a branch was planned, the plan made again reads it at its
// new commit; where --revision (or the preset's revision) named the
// commit, each says to change that setting, and the plan made again at
// the same commit is refused, the record kept. A new plan clears the
// record and ingests the files; a shard of the plan before, still queued,
// records the refusal again, and the new plan's shards are not refused.
func TestAForcePushAfterThePlanStopsTheShardsQueuedBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	for f := range 3 {
		h.Add(corpusRepo, fmt.Sprintf("data/part-%d.jsonl", f), fmt.Appendf(nil, `{"text":"file %d: the quick brown fox"}`+"\n", f), true)
	}
	const flag, preset = "--revision", "the preset's revision"
	for _, c := range []struct {
		store  string
		pinned string // the setting that named the commit; "" for a branch
	}{
		{"branch", ""},
		{"flag", flag},
		{"preset", preset},
	} {
		// plan plans the store as c's user asks: at the branch, or at
		// commit by --revision or by the preset's revision.
		plan := func(commit string) (PlanResult, error) {
			job := PlanJob{Dataset: "corpus", Store: c.store, Tokenizer: "t", Seed: 1}
			switch c.pinned {
			case flag:
				job.Revision = commit
			case preset:
				p.Presets["corpus-at"] = Preset{Name: "corpus-at", Repo: corpusRepo, Revision: commit, Include: []string{"data/*"}, Columns: Columns{Text: "text"}}
				job.Dataset = "corpus-at"
			}
			return p.Plan(ctx, job)
		}
		planned := func(commit string) PlanResult {
			t.Helper()
			res, err := plan(commit)
			if err != nil || len(res.Shards) != 3 || res.Revision != commit {
				t.Fatalf("%s: plan: %d shards at %s, %v; want 3 at %s", c.store, len(res.Shards), res.Revision, err, commit)
			}
			for _, job := range res.Shards {
				if job.Pinned != c.pinned {
					t.Fatalf("%s: the shard of %s is pinned by %q; want %q", c.store, job.Path, job.Pinned, c.pinned)
				}
			}
			return res
		}
		ingested := func(res PlanResult) {
			t.Helper()
			for _, job := range res.Shards {
				if _, _, err := p.Shard(ctx, job, nil); err != nil {
					t.Fatalf("%s: shard of %s at %s: %v", c.store, job.Path, job.Revision, err)
				}
			}
		}
		refused := func(job ShardJob, err error, first bool, old string) {
			t.Helper()
			want := []string{corpusRepo, "commit " + old, "a force-push replaced it"}
			var moved *hub.RevisionNotFoundError
			var r *RefusedPlanError
			switch {
			case !isBadInput(err) || strings.Contains(err.Error(), "\n"):
				t.Fatalf("%s: shard of %s: %v; want one line, the user's to fix", c.store, job.Path, err)
			case first && (!errors.As(err, &moved) || moved.Commit != old):
				t.Fatalf("%s: the first shard, of %s: %v; want its commit %s not found", c.store, job.Path, err, old)
			case first && c.pinned == "":
				want = append(want, "downloading "+job.Path, "run the ingest again", "to plan it at the current commit")
			case first:
				want = append(want, "downloading "+job.Path, "and "+c.pinned+" names it", "set "+c.pinned+" to a commit the dataset has, or to a branch")
			case !errors.As(err, &r):
				t.Fatalf("%s: shard of %s, queued behind a refused one: %v; want it ended before its download", c.store, job.Path, err)
			case c.pinned == "":
				want = append(want, job.Path+" was not downloaded", "'sched enqueue ingest' again plans it at the dataset's current commit")
			default:
				want = append(want, job.Path+" was not downloaded", "'sched enqueue ingest' again once "+c.pinned+" names a commit the dataset has, or a branch, plans it again")
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("%s: shard of %s says %q; want %q in it", c.store, job.Path, err, w)
				}
			}
		}

		old := h.Commit
		res := planned(old)
		ingested(PlanResult{Shards: res.Shards[:1]})
		now := h.ForcePush()
		before := len(h.Requests())
		for i, job := range res.Shards[1:] {
			_, _, err := p.Shard(ctx, job, nil)
			refused(job, err, i == 0, old)
		}
		if got := h.Downloads(before); len(got) != 1 || got[res.Shards[1].Path] != 1 {
			t.Fatalf("%s: downloads asked for: %v; want the first refused shard's once", c.store, got)
		}
		if c.pinned != "" {
			// The user plans again as it was asked: the commit is gone.
			_, err := plan(old)
			check := "which --revision names (RevisionNotFound): set --revision to a branch, tag or commit the dataset has"
			if c.pinned == preset {
				check = "has no such revision (" + h.Server.URL
			}
			var moved *hub.RevisionNotFoundError
			if !errors.As(err, &moved) || !isBadInput(err) || !strings.Contains(err.Error(), check) {
				t.Fatalf("%s: the plan made again at commit %s: %v; want it refused, saying %q", c.store, old, err, check)
			}
			before := len(h.Requests())
			_, _, err = p.Shard(ctx, res.Shards[2], nil)
			refused(res.Shards[2], err, false, old)
			if got := h.Downloads(before); len(got) != 0 {
				t.Fatalf("%s: downloads asked for after the refused plan: %v; want none, the record kept", c.store, got)
			}
		}

		again := planned(now)
		if _, err := p.Objects.Get(ctx, RefusalKey(c.store)); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: the refusal after a new plan: %v; want it cleared", c.store, err)
		}
		_, _, err := p.Shard(ctx, res.Shards[2], nil)
		refused(res.Shards[2], err, true, old)
		if _, err := p.Objects.Get(ctx, RefusalKey(c.store)); err != nil {
			t.Fatalf("%s: the refusal the plan before's shard met: %v; want it recorded again", c.store, err)
		}
		ingested(again)
	}
}

// threeFilePlans returns, for the refusal tests, withToken, which gives p
// a Hub client of h with token, and plan, which plans the corpus's three
// files into a store.
func threeFilePlans(t *testing.T, p *Pipeline, h *hubtest.Hub) (withToken func(token string), plan func(storeName string) PlanResult) {
	withToken = func(token string) {
		t.Helper()
		var err error
		if p.Hub, err = hub.New(hub.Config{Endpoint: h.Server.URL, Token: token}); err != nil {
			t.Fatal(err)
		}
	}
	plan = func(storeName string) PlanResult {
		t.Helper()
		res, err := p.Plan(context.Background(), PlanJob{Dataset: "corpus", Store: storeName, Tokenizer: "t", Seed: 1})
		if err != nil || len(res.Shards) != 3 {
			t.Fatalf("plan into %s: %d shards, %v", storeName, len(res.Shards), err)
		}
		return res
	}
	return withToken, plan
}
