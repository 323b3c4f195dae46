package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/store"
)

// The Hub lists a gated dataset's files for anyone, so a plan with an
// HF_TOKEN whose account has not accepted the terms queues every file, and
// only the downloads are refused. The first shard refused records the
// refusal beside the store's status; the shards queued behind it read it
// and end before their download, rather than each asking the Hub for a
// file it refuses. The next plan of the store removes it: the user
// accepted the terms, or the plan's shards find out again.

// GatedKey is the object key of the gated refusal recorded for a store.
func GatedKey(storeName string) string { return "tokens/" + storeName + "/gated.json" }

// gatedMark is a refused download's record: the dataset and its refusal.
type gatedMark struct {
	Repo     string `json:"repo"`
	Page     string `json:"page"`
	HasToken bool   `json:"has_token"`
}

// GatedPlanError ends a shard whose dataset refused an earlier shard of
// the store's plan as gated, before the shard's file is downloaded.
type GatedPlanError struct {
	Gated *hub.GatedError
	Store string
	Path  string
}

func (e *GatedPlanError) Error() string {
	return fmt.Sprintf("%s; %s was not downloaded (another file of the plan into token store %s was refused): 'sched enqueue ingest' again once the terms are accepted plans it again",
		e.Gated, e.Path, e.Store)
}

func (e *GatedPlanError) Unwrap() error  { return e.Gated }
func (e *GatedPlanError) BadInput() bool { return true }

// markGated records, where err is the Hub's refusal of the job's dataset
// as gated, that refusal for the shards queued behind the job. A failure
// is logged: the refusal stands, and the next shard refused records it.
func (p *Pipeline) markGated(ctx context.Context, job ShardJob, err error) {
	var g *hub.GatedError
	if p.statusesMu != nil || !errors.As(err, &g) {
		return
	}
	b, err := json.Marshal(gatedMark{Repo: job.Repo, Page: g.Page, HasToken: g.HasToken})
	if err == nil {
		err = p.Objects.Put(ctx, GatedKey(job.Store), bytes.NewReader(b), int64(len(b)))
	}
	if err != nil {
		p.log().Warn("a gated dataset's refusal is not recorded; the shards queued behind it ask the Hub for their files",
			zap.String("store", job.Store), zap.String("dataset", job.Repo), zap.Error(err))
	}
}

// checkGated refuses the job's download where an earlier shard of its
// store's plan was refused it as gated.
func (p *Pipeline) checkGated(ctx context.Context, job ShardJob) error {
	if p.statusesMu != nil {
		return nil
	}
	r, err := p.Objects.Get(ctx, GatedKey(job.Store))
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading whether dataset %s was refused as gated (%s): %w", job.Repo, GatedKey(job.Store), err)
	}
	defer r.Close()
	var m gatedMark
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		return fmt.Errorf("reading whether dataset %s was refused as gated (%s): %w", job.Repo, GatedKey(job.Store), err)
	}
	if m.Repo != job.Repo {
		return nil
	}
	return &GatedPlanError{Gated: &hub.GatedError{Repo: m.Repo, Page: m.Page, HasToken: m.HasToken}, Store: job.Store, Path: job.Path}
}

// clearGated removes the store's gated refusal before a plan queues its
// shards: the plan is the user's word that the terms are accepted.
func (p *Pipeline) clearGated(ctx context.Context, storeName string) error {
	if p.statusesMu != nil {
		return nil
	}
	if err := p.Objects.Delete(ctx, GatedKey(storeName)); err != nil {
		return fmt.Errorf("removing the gated refusal of token store %s (%s): %w", storeName, GatedKey(storeName), err)
	}
	return nil
}
