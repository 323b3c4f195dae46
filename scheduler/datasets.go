package scheduler

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kiln-lm/kiln/ingest"
)

// DatasetProgress is one token store's ingest as the queues hold it: its
// files (one ingest:shard task each, then one ingest:append), how many are
// done, the bytes behind them, and the rate and ETA they imply.
type DatasetProgress struct {
	Store string
	// Datasets are those whose ingests queued files into the store, sorted:
	// one, unless --store sent two datasets' files into one store.
	Datasets []string
	// Planning is set while an ingest:plan of the store waits or runs: more
	// files may still be queued. PlanFailed is set when its latest plan
	// failed for good (archived, not cancelled): one that failed before
	// the ingest was enqueued again does not count.
	Planning, PlanFailed bool
	// PlanWaits is what a plan set back to wait for earlier work says it
	// waits for (its tokenizer, being made), as of its last try.
	PlanWaits string
	// PlanOlder is set with PlanFailed where an older kiln queued that
	// plan: this build's workers refuse its payload's version, and 'sched
	// retry' queues the same payload again, so only the ingest's command,
	// enqueued again, plans the store.
	PlanOlder bool
	// Files is every file queued for the store. A file is Done once it is
	// appended (or found already appended, or recorded as skipped) by any
	// of its append tasks, whatever a later ended task of it says (the
	// store holds a file once), Failed once its shard or append task is
	// archived otherwise, Stopped once one of them completed at the
	// ingest's limit (progress state "stopped": the file is not in the
	// store, and a larger limit plans it again), Running while either task
	// runs, Lost while one is held by a worker that stopped heartbeating
	// (it runs again once recovered), Retrying while one waits to run
	// again after a failed attempt (FAILURES says why), and Waiting
	// otherwise. A file queued again (a larger limit) counts by its newest
	// tasks.
	Files, Done, Failed, Stopped, Running, Lost, Retrying, Waiting int
	// FailedOlder is, of Failed, the files with an archived task an older
	// kiln queued (its payload's version is older than this build reads):
	// this build's workers refuse it, and 'sched retry' queues the same
	// payload again, so only the ingest's command, enqueued again, adds
	// them to the store.
	FailedOlder int
	// Bytes and DoneBytes are the files' download sizes; SizesKnown is
	// false when a source did not publish every file's size, and the rate
	// then counts files.
	Bytes, DoneBytes, FailedBytes, StoppedBytes int64
	SizesKnown                                  bool
	// PlanStopped is set when the store's latest plan found the store at
	// its limit already and queued nothing. StoppedAt is the limits of the
	// latest task that stopped at them (a plan's or a file's).
	PlanStopped bool
	StoppedAt   ingest.Limits
	// PlanDone is set when the store's latest plan completed.
	PlanDone bool
	// LastPlan is the store's latest plan: a live one, else the one that
	// ended last (nil with NoPlan). Its end, where it failed or was
	// cancelled, is the store's: the files it had not queued yet are in
	// no task.
	LastPlan *TaskStatus
	// NoPlan is set when Redis holds tasks of the store's files but none
	// of its plans: Redis lost its data (restarted without its append-only
	// file, or flushed) after the plan queued them, and an append a worker
	// held then queued itself again into the empty Redis; or retention
	// dropped the plan, which ended days before its last files did. Files
	// and Done then count the files whose tasks Redis holds, not the
	// dataset's: the plan's count is gone with it, and a file it queued
	// that Redis lost reads nowhere.
	NoPlan bool
	// Tokens is what the done files appended, and the parts of files
	// taken at the limit.
	Tokens int64
	// Skipped counts the done files recorded as skipped whole (not in the
	// store), by reason.
	Skipped map[string]int
	// Started is when the store's first file task started; Last when its
	// latest file finished.
	Started, Last time.Time
	// Rate is bytes per second (files per second without SizesKnown) from
	// Started to Last, or to the snapshot while files remain.
	Rate float64
	// ETA is the time the remaining files take at Rate; zero when unknown
	// or when no file is running (no worker, or all waiting to retry).
	ETA time.Duration
}

// Remaining is the files neither done, failed nor stopped.
func (d DatasetProgress) Remaining() int { return d.Files - d.Done - d.Failed - d.Stopped }

type ingestFile struct {
	dataset     string
	size        int64
	shard, apnd *TaskStatus // its newest tasks
	// whole is its append that last completed other than at a limit: the
	// file is in the store (or recorded as skipped) since then.
	whole        *TaskStatus
	tokens       int64  // what whole appended
	taken        int64  // the tokens of the parts of it taken at a limit
	skip         string // why whole recorded it as skipped, "" appended
	startedShard time.Time
}

// EnqueueAgain is the command that queues the files d's store lacks,
// none twice: its ingest's own, enqueued again.
func (d DatasetProgress) EnqueueAgain() string {
	switch len(d.Datasets) {
	case 0: // an append's task does not name its dataset
		return fmt.Sprintf("'sched enqueue ingest <dataset> --store %s' with the ingest's arguments queues the files the store lacks, none twice", d.Store)
	case 1:
		return fmt.Sprintf("'sched enqueue ingest %s --store %s' with the ingest's arguments queues the files the store lacks, none twice", d.Datasets[0], d.Store)
	}
	return fmt.Sprintf("'sched enqueue ingest <dataset> --store %s' with each ingest's arguments (%s) queues the files the store lacks, none twice", d.Store, strings.Join(d.Datasets, ", "))
}

// addDataset records that an ingest of dataset queued work into d's store.
func (d *DatasetProgress) addDataset(dataset string) {
	if dataset == "" {
		return
	}
	i, found := slices.BinarySearch(d.Datasets, dataset)
	if !found {
		d.Datasets = slices.Insert(d.Datasets, i, dataset)
	}
}

// Datasets groups the ingest tasks by token store, sorted by store name.
func (s *Snapshot) Datasets() []DatasetProgress {
	type key struct{ store, file string }
	files := map[key]*ingestFile{}
	byStore := map[string]*DatasetProgress{}
	lastPlan := map[string]*TaskStatus{}
	stoppedAt := map[string]*TaskStatus{} // the latest task that stopped at a limit, per store
	stopped := func(store string, t *TaskStatus) {
		if isStopped(t) && (stoppedAt[store] == nil || endOf(t).After(endOf(stoppedAt[store]))) {
			stoppedAt[store] = t
		}
	}
	store := func(name string) *DatasetProgress {
		d := byStore[name]
		if d == nil {
			d = &DatasetProgress{Store: name, SizesKnown: true}
			byStore[name] = d
		}
		return d
	}
	file := func(k key) *ingestFile {
		f := files[k]
		if f == nil {
			f = &ingestFile{}
			files[k] = f
		}
		return f
	}
	for i := range s.Tasks {
		t := &s.Tasks[i]
		switch t.Kind {
		case KindIngestPlan:
			a, err := DecodeTask[IngestPlan](t.Payload)
			if err != nil {
				continue
			}
			name := a.Store
			if name == "" {
				name = lastElem(a.Dataset)
			}
			d := store(name)
			d.addDataset(a.Dataset)
			if !t.Ended() {
				d.Planning = true
				if t.State != "active" && t.HasProgress && t.Progress.State == "waiting" {
					d.PlanWaits = t.Progress.Message
				}
			}
			if p := lastPlan[name]; p == nil || newerTask(t, p) {
				lastPlan[name] = t
			}
			stopped(name, t)
		case KindIngestShard:
			a, err := DecodeTask[IngestShard](t.Payload)
			if err != nil {
				continue
			}
			id := a.ShardID
			if id == "" {
				id = a.Path
			}
			d := store(a.Store)
			d.addDataset(a.Dataset)
			stopped(a.Store, t)
			f := file(key{a.Store, id})
			if f.shard != nil && !newerTask(t, f.shard) {
				continue
			}
			f.dataset, f.size, f.shard, f.startedShard = a.Dataset, a.Size, t, time.Time{}
			if t.HasProgress {
				f.startedShard = t.Progress.Started
			}
		case KindIngestAppend:
			a, err := DecodeTask[IngestAppend](t.Payload)
			if err != nil {
				continue
			}
			store(a.Store)
			stopped(a.Store, t)
			f := file(key{a.Store, a.ShardID})
			if f.apnd == nil || newerTask(t, f.apnd) {
				f.apnd = t
			}
			if t.State == "completed" && !isStopped(t) && (f.whole == nil || newerTask(t, f.whole)) {
				f.whole, f.tokens, f.skip = t, a.Tokens, a.SkipReason
			}
			if t.HasProgress && t.Progress.State == "stopped" {
				// Each part of a file taken at a limit is a task of its
				// own, and stays in the store when a larger limit takes
				// the rest.
				f.taken += t.Progress.Taken
			}
		}
	}
	for k, f := range files {
		d := store(k.store)
		if f.shard == nil {
			// An append whose shard task retention already dropped: its
			// file still counts, with an unknown size.
			d.SizesKnown = false
		} else if f.size <= 0 {
			d.SizesKnown = false
		}
		d.Files++
		d.Bytes += f.size
		if !f.startedShard.IsZero() && (d.Started.IsZero() || f.startedShard.Before(d.Started)) {
			d.Started = f.startedShard
		}
		switch fileState(f) {
		case "done":
			d.Done++
			d.DoneBytes += f.size
			d.Tokens += f.tokens + f.taken
			if f.skip != "" {
				if d.Skipped == nil {
					d.Skipped = map[string]int{}
				}
				d.Skipped[f.skip]++
			}
			end := f.finished()
			if end.After(d.Last) {
				d.Last = end
			}
		case "failed":
			d.Failed++
			d.FailedBytes += f.size
			if (f.shard != nil && f.shard.State == "archived" && olderPayload(f.shard)) ||
				(f.apnd != nil && f.apnd.State == "archived" && olderPayload(f.apnd)) {
				d.FailedOlder++
			}
		case "stopped":
			d.Stopped++
			d.StoppedBytes += f.size
			d.Tokens += f.taken // the parts of its file that fit
		case "running":
			d.Running++
		case "lost":
			d.Lost++
		case "retrying":
			d.Retrying++
		default:
			d.Waiting++
		}
	}
	for name, d := range byStore {
		p := lastPlan[name]
		if p == nil {
			d.NoPlan = true
			continue
		}
		d.PlanStopped = isStopped(p)
		d.PlanDone = p.State == "completed"
		// An older plan that failed does not count where the ingest was
		// enqueued again: the latest plan queued the files the store
		// lacked.
		d.PlanFailed = p.State == "archived" && !p.Cancelled
		d.PlanOlder = d.PlanFailed && olderPayload(p)
		d.LastPlan = p
	}
	for name, t := range stoppedAt {
		if l, ok := taskLimits(t); ok {
			byStore[name].StoppedAt = l
		}
	}
	out := make([]DatasetProgress, 0, len(byStore))
	for _, d := range byStore {
		d.rate(s.At)
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Store < out[j].Store })
	return out
}

// endOf is when a task last reported, to the nanosecond (asynq's
// completion time has whole seconds), or when it ended.
func endOf(t *TaskStatus) time.Time {
	if t.HasProgress && !t.Progress.Updated.IsZero() {
		return t.Progress.Updated
	}
	return t.Finished
}

// newerTask orders two tasks of one file, or two plans of one store,
// queued by two ingests (a larger limit queues its own): live before
// ended, then the later report.
func newerTask(a, b *TaskStatus) bool {
	if a.Ended() != b.Ended() {
		return !a.Ended()
	}
	return endOf(a).After(endOf(b))
}

// isStopped is a task that completed at its ingest's limit.
func isStopped(t *TaskStatus) bool {
	return t.State == "completed" && t.HasProgress && t.Progress.State == "stopped"
}

// taskLimits are the limits an ingest task carries.
func taskLimits(t *TaskStatus) (ingest.Limits, bool) {
	switch t.Kind {
	case KindIngestPlan:
		a, err := DecodeTask[IngestPlan](t.Payload)
		return a.Limits, err == nil
	case KindIngestShard:
		a, err := DecodeTask[IngestShard](t.Payload)
		return a.Limits, err == nil
	case KindIngestAppend:
		a, err := DecodeTask[IngestAppend](t.Payload)
		return a.Limits, err == nil
	}
	return ingest.Limits{}, false
}

// olderPayload reports whether t's payload has a version older than the
// one this build reads its kind at (OlderPayload).
func olderPayload(t *TaskStatus) bool {
	_, _, older := OlderPayload(t.Kind, t.Payload)
	return older
}

// fileState is one file's place in the two-task pipeline.
func fileState(f *ingestFile) string {
	if f.shard != nil && f.apnd != nil && !f.shard.Ended() && f.apnd.Ended() {
		// Queued again (a larger limit, or its store deleted): the
		// appends are the earlier ingest's.
		f = &ingestFile{shard: f.shard}
	}
	if f.whole != nil && f.apnd.Ended() {
		// In the store whole, whatever a later task of it said: a shard
		// of a smaller limit stops, its file unread, at a store the
		// append filled; an append that failed after (an older kiln's
		// refused, retried once the ingest enqueued again had appended
		// the file) had nothing to add, appends of a file being
		// idempotent.
		return "done"
	}
	for _, t := range []*TaskStatus{f.shard, f.apnd} {
		if t != nil && t.State == "archived" {
			return "failed"
		}
	}
	for _, t := range []*TaskStatus{f.shard, f.apnd} {
		if t != nil && t.State == "active" && t.Lost {
			return "lost"
		}
		if t != nil && t.State == "active" {
			return "running"
		}
	}
	for _, t := range []*TaskStatus{f.shard, f.apnd} {
		if t != nil && isStopped(t) {
			return "stopped"
		}
	}
	if f.apnd == nil && f.shard != nil && f.shard.State == "completed" {
		// A completed shard queues its append before it completes, so a
		// completed shard without one found its file already in the store.
		return "done"
	}
	for _, t := range []*TaskStatus{f.shard, f.apnd} {
		// Set back after a failure, not to wait out an outage (whose
		// progress says "waiting", and which uses no retry).
		if t != nil && t.State == "retry" && t.HasProgress && t.Progress.State == "failed" {
			return "retrying"
		}
	}
	return "waiting"
}

// finished is when the done file entered the store (its append that
// completed whole), or was found there (its shard): its progress record's
// last update, to the nanosecond, where asynq's completion time has whole
// seconds. A task of it that failed after does not count: a store deleted
// from the disk since the append holds the file no more.
func (f *ingestFile) finished() time.Time {
	t := f.whole
	if t == nil {
		t = f.shard
	}
	if t.HasProgress && !t.Progress.Updated.IsZero() {
		return t.Progress.Updated
	}
	return t.Finished
}

// rate sets Rate and ETA: the work done over the time since the first
// file started, up to the last finish once nothing is left, else up to now.
func (d *DatasetProgress) rate(now time.Time) {
	if d.Started.IsZero() || d.Done == 0 {
		return
	}
	end := now
	if d.Remaining() == 0 {
		end = d.Last
	}
	secs := end.Sub(d.Started).Seconds()
	if secs <= 0 {
		return
	}
	done, left := float64(d.Done), float64(d.Remaining())
	if d.SizesKnown {
		done = float64(d.DoneBytes)
		left = float64(d.Bytes - d.DoneBytes - d.FailedBytes - d.StoppedBytes)
	}
	d.Rate = done / secs
	if d.Running > 0 && d.Rate > 0 && left > 0 {
		d.ETA = time.Duration(left / d.Rate * float64(time.Second))
	}
}

func lastElem(s string) string {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return s[i+1:]
		}
	}
	return s
}
