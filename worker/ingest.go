package worker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"golang.org/x/sync/semaphore"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// Ingest handles ingest:plan, ingest:shard and ingest:append with the
// dependencies it holds; give it to New in Params.Handlers.
type Ingest struct {
	// Pipeline does the work; its Objects is required. Unless its
	// Tokenizer is set, tokenizers come from Tokenizers, each name loaded
	// once: a published name never changes meaning. A Tokenizing left nil
	// bounds the shards tokenizing at once to ingest.DefaultTokenizing(),
	// whatever the ingest queue's concurrency: the shards beyond it
	// download, or wait for their uploads to complete, while the others use
	// the cores.
	Pipeline ingest.Pipeline
	// Tokenizers is the tokenizer catalog (default: that of
	// Pipeline.Objects and Pipeline.DataDir).
	Tokenizers *catalog.Catalog
	// Enqueue queues the next steps (required): scheduler.Client.Again,
	// which runs a completed task of the same id again. A plan queues only
	// the files its store lacks, and a shard the append of one: a completed
	// task of the same id made what the store no longer holds (its disk
	// lost, a backup of fewer files put back). A *scheduler.DuplicateError
	// means the step is queued or running.
	Enqueue func(ctx context.Context, a scheduler.Args) error
	// Queue, when set, tells a plan whether its tokenizer is being made:
	// then the plan waits for it (WaitError) instead of queuing shards
	// that would fail on an unknown name.
	Queue Live
	// WaitEvery is how often a waiting plan looks again. Default
	// DefaultWaitEvery.
	WaitEvery time.Duration
	// Stores, on a worker that appends, watches the token stores of its
	// disk (ingest.Pipeline.WatchStores): WatchStores looks at them every
	// second, and a plan this worker runs looks before it reads its
	// store's status, so that a store deleted from the disk (a damaged
	// one, as `sched datasets` says to do) is ingested whole again by the
	// next ingest, without a restart of the worker.
	Stores *ingest.StoresWatch
	// Redis is the queue's Redis. Through it a worker that watches its
	// stores says so and answers the plans of other workers, which ask it
	// to look at its stores before they read the stores' statuses
	// (AskForALook). Nil: neither.
	Redis redis.UniversalClient
	// claim is the worker's append claim, whose lease Pipeline.Lease is
	// (set by New): an append refused for want of it says why the claim
	// was not renewed.
	claim *AppendClaim
	// saidDamaged is what sayDamaged last wrote to StoresDamagedKey; nil
	// until it has written (guarded by sayDamagedMu).
	saidDamaged *map[string]string
}

// resolve checks c's dependencies and returns a copy with its defaults.
func (c *Ingest) resolve() (*Ingest, error) {
	r := *c
	switch {
	case r.Pipeline.Objects == nil:
		return nil, &requiredError{"Pipeline.Objects", "shards and tokenizers live in the object store"}
	case r.Enqueue == nil:
		return nil, &requiredError{"Enqueue", "a plan queues its shards and a shard its append"}
	}
	if r.Pipeline.Tokenizing == nil {
		r.Pipeline.Tokenizing = semaphore.NewWeighted(int64(ingest.DefaultTokenizing()))
	}
	// A shard that fills the disk of a local object store (no S3
	// endpoint) says how much of it had been written, as a direct ingest
	// does: the room free once its partial file is removed is no measure
	// of what it needed.
	r.Pipeline.Objects = ingest.CountPuts(r.Pipeline.Objects)
	if r.Tokenizers == nil {
		r.Tokenizers = catalog.New(r.Pipeline.Objects, r.Pipeline.DataDir)
	}
	if r.Pipeline.Tokenizer == nil {
		r.Pipeline.Tokenizer = ingestTokenizers(r.Tokenizers)
	}
	// Several workers of one data directory may serve append: each
	// append waits for another's commit rather than fail.
	if r.Pipeline.StoreWait == 0 {
		r.Pipeline.StoreWait = ingest.DefaultStoreWait
	}
	if r.Pipeline.StoreWaiting == nil {
		r.Pipeline.StoreWaiting = func(ctx context.Context, msg string) { Progress(ctx).Message(ctx, msg) }
	}
	return &r, nil
}

func ingestTokenizers(cat *catalog.Catalog) func(context.Context, string) (*tokenizer.Tokenizer, error) {
	var mu sync.Mutex
	loaded := map[string]*tokenizer.Tokenizer{}
	return func(ctx context.Context, name string) (*tokenizer.Tokenizer, error) {
		mu.Lock()
		defer mu.Unlock()
		if t, ok := loaded[name]; ok {
			return t, nil
		}
		_, t, err := cat.Resolve(ctx, name)
		if err != nil {
			return nil, err
		}
		loaded[name] = t
		return t, nil
	}
}

// AbortStaleUploads drops the multipart uploads that a process killed
// mid-put, or an abort that failed while S3 was down, left under kiln's
// prefixes: S3 keeps (and bills) their parts until someone aborts them (in
// the local directory store, the temporary files of killed puts). The
// bucket is shared with other workers whose uploads are live, so only
// uploads idle for longer than idle go (a worker passes
// store.StaleUploadAge). Each is logged, and returned; a failure is logged,
// not fatal: the next sweep tries again.
func AbortStaleUploads(ctx context.Context, objects store.Store, idle time.Duration, log *zap.Logger) []store.Upload {
	aborted, err := store.AbortStaleUploads(ctx, objects, time.Now().Add(-idle))
	for _, u := range aborted {
		// In S3 a multipart upload aborted; in the local directory store a
		// put's temporary file removed.
		log.Info("removed an unfinished upload", zap.String("object", u.Key), zap.String("upload", u.ID),
			zap.Time("last_active", u.LastActive), zap.Int("parts", u.Parts))
	}
	if err != nil && ctx.Err() == nil {
		log.Warn("unfinished uploads not removed; the next sweep tries again", zap.Error(err))
	}
	return aborted
}

// SweepStaleUploads runs AbortStaleUploads every interval until ctx ends: a
// worker runs for weeks, and the orphans of an outage it lived through
// would otherwise hold their bytes until its next start. The worker's
// start runs the first sweep itself.
func SweepStaleUploads(ctx context.Context, objects store.Store, idle, interval time.Duration, log *zap.Logger) {
	repeat(ctx, interval, func() { AbortStaleUploads(ctx, objects, idle, log) })
}

// repeat calls f every interval, the first an interval from now, until ctx
// ends.
func repeat(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// ReconcileStores makes the statuses in object storage of the token
// stores say what this worker's store directory holds, where they say
// otherwise (ingest.Pipeline.ReconcileStatuses): a worker that appends
// runs it at its start, so that after its disk was lost, or a backup of
// fewer files was put back, `sched enqueue ingest` plans the missing files
// again instead of taking them for stored. Each store so mended is logged.
//
// On a worker that watches its stores (c.Stores), a failure (object
// storage down, the append claim's lease unconfirmed) leaves it to the
// watch, whose looks try again until it succeeds; the failure is logged
// once while it stays the same.
func (c *Ingest) ReconcileStores(ctx context.Context, log *zap.Logger) []ingest.Reconciled {
	reconcile, again := c.Pipeline.ReconcileStatuses, "the next start tries again"
	if c.Stores != nil {
		reconcile, again = c.Stores.ReconcileAll, "the store watch tries again at each look until it succeeds"
	}
	rs, err := reconcile(ctx)
	c.logMended(log, "token store's status in object storage did not say what this disk's store holds: it does now, and an ingest plans the files the store lacks again", rs)
	if err != nil && ctx.Err() == nil {
		log.Warn("token stores' statuses not checked against this disk; "+again, zap.Error(err))
	}
	c.noteDeleted(ctx, log, rs)
	return rs
}

// logMended logs msg of each store whose status was mended.
func (c *Ingest) logMended(log *zap.Logger, msg string, rs []ingest.Reconciled) {
	for _, r := range rs {
		dir := zap.String("dir", filepath.Join(c.Pipeline.StoresDir, r.Store))
		if r.Damaged != "" {
			log.Error("token store is damaged: its status in object storage says so, and ingests into it and runs over it are refused until it is deleted or mended",
				zap.String("store", r.Store), zap.String("damaged", r.Damaged), dir)
			continue
		}
		log.Warn(msg, zap.String("store", r.Store), zap.Int("files_listed", r.Listed), zap.Int("files_held", r.Holds), dir)
	}
}

// noteDeleted records the stores of rs found gone for sched status
// (sayDeleted). A store's deletion not recorded (Redis away) costs only
// status's word on it: the store's status in object storage is mended.
func (c *Ingest) noteDeleted(ctx context.Context, log *zap.Logger, rs []ingest.Reconciled) {
	if err := c.sayDeleted(ctx, rs); err != nil && ctx.Err() == nil {
		log.Debug("the token stores found gone not written to Redis for sched status", zap.Error(err))
	}
}

// DefaultWatchStoresEvery is how often a worker that appends looks at
// its token stores for one that went (WatchStores).
const DefaultWatchStoresEvery = time.Second

// WatchStores looks at the token stores of this worker's disk through
// c.Stores every `every`, and whenever a plan on another worker asks it
// to, until ctx ends, and makes the status in object storage of each
// store that went or was replaced since say what the disk holds, as
// ReconcileStores does at the start: `sched enqueue ingest` then plans
// the files of a deleted store again instead of taking them for stored.
// Each store so mended is logged, and a failure once while it stays the
// same; the next look tries again.
func (c *Ingest) WatchStores(ctx context.Context, every time.Duration, log *zap.Logger) {
	if log == nil {
		log = zap.NewNop()
	}
	var asks <-chan *redis.Message
	if c.Redis != nil {
		// Subscribed before the watch is announced, so that no plan
		// asks unheard.
		sub := c.Redis.Subscribe(ctx, StoresLookChannel)
		defer sub.Close()
		if _, err := sub.Receive(ctx); err != nil && ctx.Err() == nil {
			log.Warn("not listening for the plans of other workers that ask this one to look at its token stores; it looks every "+every.String()+" and tries to listen again", zap.Error(err))
		}
		asks = sub.Channel()
		if err := c.announceWatch(ctx, every); err != nil && ctx.Err() == nil {
			log.Warn("could not say in Redis that this worker watches its token stores; the next look tries again", zap.Error(err))
		}
		// Said again every `every` whatever a look takes (one waits for
		// an append's store lock, or for object storage), so that a plan
		// waiting for a long look does not take the watch for stopped.
		beat, stop := context.WithCancel(ctx)
		defer stop()
		go c.keepWatched(beat, every)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-asks:
		}
		c.watchLook(ctx, every, log)
	}
}

// watchLook is one look of WatchStores, numbered in Redis for the plans
// that wait for it.
func (c *Ingest) watchLook(ctx context.Context, every time.Duration, log *zap.Logger) {
	if c.Stores == nil || c.Stores.Stopped() {
		// No longer the stores' worker: its looks answer no plan, and
		// the watch's key lapses.
		return
	}
	n := c.startLook(ctx)
	c.checkStores(ctx, log)
	if err := c.finishLook(ctx, n, every); err != nil && ctx.Err() == nil {
		log.Debug("a look at the token stores not recorded in Redis", zap.Error(err))
	}
}

// checkStores mends the statuses of the stores that went or were
// replaced since c.Stores last looked; nothing where c watches none.
func (c *Ingest) checkStores(ctx context.Context, log *zap.Logger) {
	if c.Stores == nil {
		return
	}
	if log == nil {
		log = zap.NewNop()
	}
	if c.Stores.Pending() {
		// The start's mending of every status, which could not.
		c.ReconcileStores(ctx, log)
	}
	rs, err := c.Stores.Check(ctx)
	c.logMended(log, "token store changed on this disk while the worker ran (it went, was replaced, or a direct ingest grew it) or its last status was not written: its status in object storage says what the disk holds now, and an ingest plans the files the store lacks again", rs)
	if err != nil && ctx.Err() == nil {
		log.Warn("the status of a token store that changed on this disk is not mended; the next look tries again", zap.Error(err))
	}
	c.noteDeleted(ctx, log, rs)
	if err := c.sayDamaged(ctx); err != nil && ctx.Err() == nil {
		log.Debug("the damaged token stores not written to Redis for sched status; the next look tries again", zap.Error(err))
	}
}

// plan lists a dataset and queues one ingest:shard per file the store
// lacks, in the plan's seeded order; a file already queued keeps its task.
func (c *Ingest) plan(ctx context.Context, a scheduler.IngestPlan) error {
	rep := Progress(ctx)
	if a.Tokenizer != "" && c.Queue != nil {
		if err := waitForTokenizer(ctx, c.Queue, a.Tokenizer); err != nil {
			var we *WaitError
			if !errors.As(err, &we) {
				return fmt.Errorf("%s %s: %w", a.Kind(), a.Dataset, err)
			}
			we.Every = c.WaitEvery
			rep.Message(ctx, we.Error())
			return we
		}
	}
	// The tokenizer is loaded while the plan lists the dataset, so that
	// the first shards on this worker find it loaded (on 16 cores one
	// shard spent 104 ms loading it while the other waited, 3% of a 1 GB
	// run: docs/benchmarks/ingest.md); the plan waits for it, so no load
	// outlives its task. One that is neither made nor being made (its
	// making cancelled or failed for good) fails the plan once, where each
	// of its shards would; other errors are left to the shards, which
	// load it again and report them.
	loaded := make(chan struct{})
	var tokErr error
	if a.Tokenizer != "" {
		go func() {
			defer close(loaded)
			_, tokErr = c.Pipeline.Tokenizer(ctx, a.Tokenizer)
		}()
		defer func() { <-loaded }()
	} else {
		close(loaded)
	}
	// A store deleted from the disk of the worker that holds the stores
	// a moment ago is forgotten before the plan reads its status.
	c.lookAtStores(ctx)
	listing := fmt.Sprintf("listing %s", a.Dataset)
	rep.Message(ctx, listing)
	res, err := c.Pipeline.Plan(hub.SayRetries(ctx, listing, func(msg string) { rep.Message(ctx, msg) }), a)
	if err != nil {
		return permanent(a.Kind(), err)
	}
	<-loaded
	var unknown *catalog.NotFoundError
	if errors.As(tokErr, &unknown) && len(res.Shards) > 0 {
		return permanent(a.Kind(), fmt.Errorf("%s: its tokenizer %s is neither made nor being made (its making cancelled or failed: 'sched status' shows it), so no file of it is queued: make the tokenizer, then queue this ingest again: %w",
			a.Dataset, a.Tokenizer, tokErr))
	}
	queued, dups := 0, 0
	start := time.Now()
	// One at a time, so that the queue holds the files in the plan's order.
	for i, sj := range res.Shards {
		err := c.Enqueue(ctx, sj)
		var dup *scheduler.DuplicateError
		switch {
		case errors.As(err, &dup):
			dups++
		case err != nil:
			return fmt.Errorf("%s %s: queuing %s: %w", a.Kind(), a.Dataset, sj.Path, err)
		default:
			queued++
		}
		rep.Report(ctx, float64(i+1)/float64(len(res.Shards)), float64(i+1)/max(time.Since(start).Seconds(), 1e-3), "tasks",
			fmt.Sprintf("%s at %s: queued %d of %d files", a.Dataset, res.Revision, i+1, len(res.Shards)))
	}
	// The store's status lists the files appended and those recorded as
	// skipped whole as one (res.Done): a file skipped for its bytes holds
	// none of them in the store, so the count names both.
	msg := fmt.Sprintf("%s at %s: %d files planned into store %s: %d queued, %d already queued, %d already appended or skipped in the store",
		a.Dataset, res.Revision, res.Files, a.Store, queued, dups, res.Done)
	if res.Same > 0 {
		msg += fmt.Sprintf(", %d with the same content as another of its files (one shard holds it)", res.Same)
	}
	rep.Message(ctx, msg)
	return nil
}

// shard tokenizes one file into a shard object and queues its append
// (or the record of its skip).
func (c *Ingest) shard(ctx context.Context, a scheduler.IngestShard) error {
	rep := Progress(ctx)
	out, done, err := c.Pipeline.Shard(ctx, a, func(msg string) { rep.Message(ctx, msg) })
	if err != nil {
		return permanent(a.Kind(), err)
	}
	if done {
		rep.Message(ctx, fmt.Sprintf("%s is already in token store %s", a.Path, a.Store))
		return nil
	}
	err = c.Enqueue(ctx, out)
	var dup *scheduler.DuplicateError
	if err != nil && !errors.As(err, &dup) {
		return fmt.Errorf("%s %s: queuing its append: %w", a.Kind(), a.Path, err)
	}
	if out.SkipReason != "" {
		// The skip's message names the file and the reason.
		rep.Message(ctx, out.SkipMessage)
	} else {
		rep.Message(ctx, shardDone(a.Path, out))
	}
	return nil
}

// shardDone is a tokenized shard's last progress message: its documents
// and tokens, and the documents left out by reason when there were any.
func shardDone(path string, out ingest.AppendJob) string {
	msg := fmt.Sprintf("%s: %d documents, %d tokens", path, out.Documents, out.Tokens)
	if len(out.Skipped) > 0 {
		msg += ", skipped documents: " + out.Skipped.String()
	}
	return msg
}

// append appends one shard to its store; the append queue has one
// consumer, the machine that holds the stores.
func (c *Ingest) append(ctx context.Context, a scheduler.IngestAppend) error {
	rep := Progress(ctx)
	start := time.Now()
	res, err := c.Pipeline.Append(ctx, a, func(done, total int64) {
		rep.Report(ctx, float64(done)/float64(max(total, 1)), float64(done)/max(time.Since(start).Seconds(), 1e-3), "B",
			fmt.Sprintf("appending %s to %s", a.Source, a.Store))
	})
	if c.Stores != nil {
		// Should the store go before the watch looks at it, the watch
		// still knows it was here.
		c.Stores.Saw(a.Store)
	}
	var lapsed *ingest.LeaseError
	if errors.As(err, &lapsed) && lapsed.Renewal == nil && c.claim != nil {
		lapsed.Renewal = c.claim.RenewalError()
	}
	var locked *tokens.LockedError
	if errors.As(err, &locked) && locked.Waited > 0 {
		// Held past a commit's time: a direct ingest's run, say. Not
		// the task's fault, so it waits without using a retry, and
		// sched status lists it under WAITING.
		by := "another process"
		if locked.PID > 0 {
			by = fmt.Sprintf("pid %d", locked.PID)
		}
		we := &WaitError{For: fmt.Sprintf("token store %s, still locked by %s after this append waited %v for it (a direct ingest, 'sched ingest --direct', holds its store until it ends)",
			a.Store, by, locked.Waited), Every: c.WaitEvery}
		rep.Message(ctx, we.Error())
		return we
	}
	if err != nil {
		return permanent(a.Kind(), err)
	}
	log := c.Pipeline.Logger
	if log == nil {
		log = zap.NewNop()
	}
	switch {
	case res.Skipped:
		rep.Message(ctx, fmt.Sprintf("recorded %s as skipped (%s) in store %s", a.Source, a.SkipReason, a.Store))
	case res.Duplicate:
		rep.Message(ctx, fmt.Sprintf("%s was already in store %s (%d tokens)", a.Source, a.Store, res.Status.Tokens))
	default:
		rep.Message(ctx, fmt.Sprintf("appended %s to store %s: %d tokens, the store holds %d", a.Source, a.Store, res.Tokens, res.Status.Tokens))
	}
	log.Info("ingest append", zap.String("store", a.Store), zap.String("shard", a.ShardID), zap.Bool("duplicate", res.Duplicate),
		zap.Bool("skipped", res.Skipped), zap.Int64("tokens", res.Tokens), zap.Int64("committed", res.Status.Tokens))
	return nil
}
