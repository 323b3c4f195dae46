package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

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
// no refusal; a force-push that replaced the commit the plan pinned
// (404 RevisionNotFound) refuses every download at that commit, and the
// same plan made again, at the commit its branch names now, reads the
// files the store lacks; Software Heritage's bucket, refusing requests
// without AWS keys, is met only after a shard downloaded its file of blob
// ids. The first shard refused records the refusal beside the store's
// status; the shards queued behind it read it and end before their
// download, rather than each downloading a file, or asking the Hub for
// one, to meet the same refusal. The next plan of the store removes it:
// the user changed what the refusal names, or the plan's shards find out
// again. A refusal of a commit refuses the shards at that commit alone: a
// shard of the plan before, still queued once the plan made again cleared
// the record, records it again, and the new plan's shards, at the new
// commit, are not refused by it.

// RefusalKey is the object key of the refusal recorded for a store.
func RefusalKey(storeName string) string { return "tokens/" + storeName + "/refused.json" }

// refusal is a refused shard's record: its dataset, the refusal in one
// line and what the user does before planning again.
type refusal struct {
	Repo string `json:"repo"`
	// Commit, where set, is the commit the refusal is of: the shards
	// planned at another commit are not refused.
	Commit string `json:"commit,omitempty"`
	Reason string `json:"reason"`
	// Fix is what the user changes; "" where a plan made again is all
	// it takes.
	Fix string `json:"fix"`
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
		return refusal{Repo: job.Repo, Reason: gone.Error(), Fix: "the dataset's name is checked (" + goneSincePlan + ") and " + gone.TokenFrom.Setting() + " may read it"}, true
	}
	var pinned *PinnedRevisionError
	if errors.As(err, &pinned) && pinned.Err.Repo == job.Repo && pinned.Err.Commit != "" {
		return refusal{Repo: job.Repo, Commit: pinned.Err.Commit, Reason: pinned.reason(), Fix: pinned.Setting + " names a commit the dataset has, or a branch,"}, true
	}
	var moved *hub.RevisionNotFoundError
	if errors.As(err, &moved) && moved.Repo == job.Repo && moved.Commit != "" {
		// Nothing to change: the plan made again is at the commit the
		// branch names now.
		return refusal{Repo: job.Repo, Commit: moved.Commit, Reason: moved.Error()}, true
	}
	var a *hub.AccessError
	if errors.As(err, &a) {
		// What the worker's token came from (HF_TOKEN, its older name,
		// --hf-token or the config file) is what the user changes.
		token := a.TokenFrom.Setting()
		fix := token + " may read the dataset"
		switch {
		case a.NotFound && !a.HasToken:
			// The Hub tells no reader without a token a dataset deleted
			// from one made private (401 RepoNotFound).
			fix = "the dataset's name is checked (" + goneSincePlan + "), or " + token + " is set if it is private"
		case !a.HasToken:
			fix = token + " is set"
		case a.Status == http.StatusUnauthorized:
			fix = token + " holds a valid token"
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

// revisionSetting names the setting that gave a plan its revision, for a
// refusal that says to change it: --revision where the plan was asked
// for one (sched ingest --direct's too), else the preset's revision.
func revisionSetting(job PlanJob) string {
	if job.Revision != "" {
		return "--revision"
	}
	return "the preset's revision"
}

// NamesCommit says whether rev, the revision a plan was asked for, is the
// id of commit, which it resolved to (whole, or its first 7 or more hex
// digits), not a branch or tag that a force-push moves.
func NamesCommit(rev, commit string) bool {
	rev = strings.ToLower(rev)
	return len(rev) >= 7 && strings.Trim(rev, "0123456789abcdef") == "" && strings.HasPrefix(commit, rev)
}

// PinnedRevisionError is a revision of a hub dataset that the Hub does
// not have (RevisionNotFound) where a setting of the user's asked for it
// by its commit id: a plan made again asks for the same commit, so the
// error says to change that setting, where the Hub's says to plan again
// or to check the preset.
type PinnedRevisionError struct {
	Setting  string // --revision, or another revisionSetting
	Revision string // as the setting gives it
	Path     string // the file whose download met it; "" at the plan
	Err      *hub.RevisionNotFoundError
}

// pinnedRevision is err as a PinnedRevisionError where it is the Hub's
// RevisionNotFound to the revision that setting gave: at the plan, or at
// the download of the file at path, of the commit the plan pinned.
func pinnedRevision(err error, setting, revision, path string) error {
	var gone *hub.RevisionNotFoundError
	if !errors.As(err, &gone) || path != "" && gone.Commit == "" {
		return err
	}
	return &PinnedRevisionError{Setting: setting, Revision: revision, Path: path, Err: gone}
}

// RevisionGiven is err of a plan or a check of a dataset at revision,
// which setting (--revision) gave, saying so where the Hub has no such
// revision: the preset's revision is not the one to check.
func RevisionGiven(err error, setting, revision string) error {
	return pinnedRevision(err, setting, revision, "")
}

func (e *PinnedRevisionError) Error() string {
	if e.Err.Commit == "" {
		return fmt.Sprintf("dataset %s has no revision %s, which %s names (RevisionNotFound): set %s to a branch, tag or commit the dataset has (one a force-push replaced is gone)",
			e.Err.Repo, e.Revision, e.Setting, e.Setting)
	}
	return "downloading " + e.Path + ": " + e.reason()
}

// reason is the error of a download without its file: every file's of
// the plan.
func (e *PinnedRevisionError) reason() string {
	return fmt.Sprintf("commit %s of dataset %s, which the ingest was planned at, is gone from the hub (RevisionNotFound: a force-push replaced it), and %s names it, so a plan made again would ask for it again: set %s to a commit the dataset has, or to a branch, then run the ingest again (sched enqueue ingest, or sched ingest --direct); the files its store holds are left out",
		e.Err.Commit, e.Err.Repo, e.Setting, e.Setting)
}

func (e *PinnedRevisionError) Unwrap() error  { return e.Err }
func (e *PinnedRevisionError) BadInput() bool { return true }

// RefusedPlanError ends a shard whose dataset refused an earlier shard of
// the store's plan, before the shard's file is downloaded.
type RefusedPlanError struct {
	Reason, Fix string
	Store, Path string
}

func (e *RefusedPlanError) Error() string {
	again := "'sched enqueue ingest' again once " + e.Fix + " plans it again"
	if e.Fix == "" {
		again = "'sched enqueue ingest' again plans it at the dataset's current commit"
	}
	return fmt.Sprintf("%s; %s was not downloaded (another file of the plan into token store %s was refused): %s",
		e.Reason, e.Path, e.Store, again)
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
	if r.Repo != job.Repo || r.Commit != "" && r.Commit != job.Revision {
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
