package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/store"
)

// Some refusals are the same for every file of a plan, and met only once a
// shard runs: the Hub lists a gated dataset's files for anyone, so a plan
// with an HF_TOKEN whose account has not accepted the terms, or a
// fine-grained one not allowed to read gated datasets, queues every file
// and only the downloads are refused; a worker's HF_TOKEN may not be the
// one that planned, or may expire mid-ingest; a dataset deleted, renamed
// or made private after its plan is no longer found (404 RepoNotFound, or
// 401 to a request without a token) by any download of it, where a file
// that alone is not found (404 EntryNotFound) is that file's failure and
// no refusal; Software Heritage's bucket, refusing requests without AWS
// keys, is met only after a shard downloaded its file of blob ids. The
// first shard refused records the refusal beside the store's status; the
// shards queued behind it read it and end before their download, rather
// than each downloading a file, or asking the Hub for one, to meet the
// same refusal. The next plan of the store removes it: the user changed
// what the refusal names, or the plan's shards find out again.

// RefusalKey is the object key of the refusal recorded for a store.
func RefusalKey(storeName string) string { return "tokens/" + storeName + "/refused.json" }

// refusal is a refused shard's record: its dataset, the refusal in one
// line and what the user does before planning again.
type refusal struct {
	Repo   string `json:"repo"`
	Reason string `json:"reason"`
	Fix    string `json:"fix"`
}

// refusalOf is the refusal that err says every file of job's dataset
// meets, if it says one.
func refusalOf(job ShardJob, err error) (refusal, bool) {
	var g *hub.GatedError
	if errors.As(err, &g) {
		return refusal{Repo: job.Repo, Reason: g.Error(), Fix: "the terms are accepted"}, true
	}
	var gone *hub.RepoNotFoundError
	if errors.As(err, &gone) && gone.Repo == job.Repo {
		return refusal{Repo: job.Repo, Reason: gone.Error(), Fix: "the dataset's name is checked (" + goneSincePlan + ") and HF_TOKEN may read it"}, true
	}
	var a *hub.AccessError
	if errors.As(err, &a) {
		fix := "HF_TOKEN may read the dataset"
		switch {
		case a.NotFound && !a.HasToken:
			// The Hub tells no reader without a token a dataset deleted
			// from one made private (401 RepoNotFound).
			fix = "the dataset's name is checked (" + goneSincePlan + "), or HF_TOKEN is set if it is private"
		case !a.HasToken:
			fix = "HF_TOKEN is set"
		case a.Status == http.StatusUnauthorized:
			fix = "HF_TOKEN holds a valid token"
		}
		return refusal{Repo: job.Repo, Reason: a.Error(), Fix: fix}, true
	}
	var s *SWHRefusedError
	if errors.As(err, &s) {
		return refusal{Repo: job.Repo, Reason: s.Error(), Fix: "the keys are set"}, true
	}
	return refusal{}, false
}

// goneSincePlan is why the Hub no longer has a dataset at a shard's
// download that it had at the plan.
const goneSincePlan = "it was deleted, renamed or made private since the plan"

// RefusedPlanError ends a shard whose dataset refused an earlier shard of
// the store's plan, before the shard's file is downloaded.
type RefusedPlanError struct {
	Reason, Fix string
	Store, Path string
}

func (e *RefusedPlanError) Error() string {
	return fmt.Sprintf("%s; %s was not downloaded (another file of the plan into token store %s was refused): 'sched enqueue ingest' again once %s plans it again",
		e.Reason, e.Path, e.Store, e.Fix)
}

func (e *RefusedPlanError) BadInput() bool { return true }

// markRefused records, where err is a refusal that every file of the job's
// dataset meets, that refusal for the shards queued behind the job. A
// failure is logged: the refusal stands, and the next shard refused
// records it.
func (p *Pipeline) markRefused(ctx context.Context, job ShardJob, err error) {
	if p.holdsStores() || job.Repo == "" {
		return
	}
	r, ok := refusalOf(job, err)
	if !ok {
		return
	}
	b, err := json.Marshal(r)
	if err == nil {
		err = p.Objects.Put(ctx, RefusalKey(job.Store), bytes.NewReader(b), int64(len(b)))
	}
	if err != nil {
		p.log().Warn("a dataset's refusal is not recorded; the shards queued behind it download their files",
			zap.String("store", job.Store), zap.String("dataset", job.Repo), zap.Error(err))
	}
}

// checkRefused refuses the job's download where an earlier shard of its
// store's plan was refused.
func (p *Pipeline) checkRefused(ctx context.Context, job ShardJob) error {
	if p.holdsStores() {
		return nil
	}
	rc, err := p.Objects.Get(ctx, RefusalKey(job.Store))
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading whether dataset %s was refused (%s): %w", job.Repo, RefusalKey(job.Store), err)
	}
	defer rc.Close()
	var r refusal
	if err := json.NewDecoder(rc).Decode(&r); err != nil {
		return fmt.Errorf("reading whether dataset %s was refused (%s): %w", job.Repo, RefusalKey(job.Store), err)
	}
	if r.Repo != job.Repo {
		return nil
	}
	return &RefusedPlanError{Reason: r.Reason, Fix: r.Fix, Store: job.Store, Path: job.Path}
}

// clearRefused removes the store's refusal before a plan queues its
// shards: the plan is the user's word that what it named was changed.
func (p *Pipeline) clearRefused(ctx context.Context, storeName string) error {
	if p.holdsStores() {
		return nil
	}
	if err := p.Objects.Delete(ctx, RefusalKey(storeName)); err != nil {
		return fmt.Errorf("removing the refusal recorded for token store %s (%s): %w", storeName, RefusalKey(storeName), err)
	}
	return nil
}
