package segment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// uploader pushes checkpoints to object storage on its own goroutine, so
// that training continues while a checkpoint of hundreds of megabytes goes
// up. Training never waits for it: one checkpoint uploads while the newest
// one after it waits, and a newer one still takes the waiting one's place,
// as only the newest matters for a resume. A slow or hung store thus costs
// the steps since the last upload if the worker dies, never training time.
//
// What is replaced stays on this disk until the local retention below
// removes it (pruneLocal), with one exception: a checkpoint retention keeps
// in object storage for good (keep_every) is owed to it. Owed checkpoints
// go up, oldest first, once the uploader has caught up with the newest and
// its last upload succeeded; until then they stay on this disk, protected
// from pruneLocal and from the disk guard. One the segment ends without
// uploading is still on this disk when the next segment here starts, and
// that one uploads what object storage lacks (owedSteps).
type uploader struct {
	p        Params
	lock     Lease
	dir      string
	rc       trainer.RunConfig
	log      *zap.Logger
	wall     func() time.Duration
	endpoint string // object storage, for messages
	// from and began are the segment's first step and start, for its
	// event file.
	from  int
	began time.Time
	// retain says that retention is owed for remote, the newest
	// checkpoint object storage held at the segment's start: it runs
	// before the first upload.
	retain bool

	// ctx ends UploadGrace after the segment's context does (graceContext):
	// the upload in flight is then abandoned, its marker never written.
	ctx  context.Context
	wake chan struct{} // a job was queued or the queue closed
	done chan struct{} // loop has returned
	// ending is closed once the segment ends short of the run's end (its
	// training is over and another segment follows, or it was stopped):
	// a store that has not answered since the segment began is then
	// given AnswerWithin, not ListWithin, as the next segment here
	// uploads what this one leaves.
	ending  chan struct{}
	endOnce sync.Once

	mu       sync.Mutex
	waiting  *upJob
	owed     []upJob // by step
	inFlight *upJob
	closed   bool
	// stopped: the loop has returned (the grace is over, or the queue
	// closed), and no upload's end prunes the local checkpoints any more:
	// each push does.
	stopped bool
	healthy bool // the last upload succeeded: owed ones may go
	pushed  int  // the newest step pushed, -1 none
	remote  int  // the newest step object storage held at the start, -1 none
	// unsure holds the retained local checkpoints not yet checked against
	// object storage, which did not answer at the segment's start (nil
	// when it did): they stay on this disk until settle lists it.
	unsure   map[int]bool
	uploaded int // the newest step this segment uploaded, -1 none
	lastErr  error
	// unrecorded is the newest checkpoint this segment uploaded where
	// the run's state in Redis could not record it (nil where it did).
	unrecorded *unrecordedError
	// unsent is what the run's state records, or is to record, of the
	// checkpoints object storage has not taken (noteUnsent); its zero
	// value while it takes them. Its Since carries over from the state
	// the segment began with: an outage that outlasts a segment is one.
	unsent scheduler.Unsent
	// unsentMu orders the state writes of unsent: a slow upload's
	// warning must not record it after the upload's end cleared it.
	unsentMu sync.Mutex
	changed  chan struct{} // closed and replaced when an upload ends
}

type upJob struct {
	dir  string
	step int
	keep bool // retention keeps it in object storage for good
}

func newUploader(ctx context.Context, p Params, lock Lease, dir string, rc trainer.RunConfig, remote int, log *zap.Logger, wall func() time.Duration) *uploader {
	return &uploader{p: p, lock: lock, dir: dir, rc: rc, log: log, wall: wall, endpoint: describe(p.Objects),
		ctx: ctx, wake: make(chan struct{}, 1), done: make(chan struct{}), ending: make(chan struct{}),
		healthy: true, pushed: -1, remote: remote, uploaded: -1, changed: make(chan struct{})}
}

// describe names an object store in messages: S3 by its URL.
func describe(obj Objects) string {
	if s, ok := obj.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprintf("%T", obj)
}

// retained is true for a step retention keeps in object storage for good.
func (u *uploader) retained(step int) bool {
	return Keep([]int{step}, u.rc.CheckpointEvery, 0, u.p.Run.Retention.KeepEvery)[step]
}

// push queues the checkpoint dir of step, the newest, for upload, in the
// place of any that waits; it never blocks.
func (u *uploader) push(dir string, step int) {
	u.mu.Lock()
	j := upJob{dir: dir, step: step, keep: u.retained(step)}
	replaced := u.waiting
	if replaced != nil && replaced.keep {
		u.oweLocked(*replaced)
	}
	u.waiting, u.pushed = &j, max(u.pushed, step)
	stopped := u.stopped
	inFlight := -1
	if u.inFlight != nil {
		inFlight = u.inFlight.step
	}
	u.mu.Unlock()
	u.signal()
	if replaced != nil {
		u.log.Info("checkpoint upload still in flight: the newer checkpoint waits in place of the one that waited",
			zap.Int("step", step), zap.Int("replaced", replaced.step), zap.Bool("replaced_owed", replaced.keep),
			zap.Int("uploading", inFlight), zap.String("endpoint", u.endpoint))
	}
	if replaced != nil || stopped {
		u.pruneLocal()
	}
}

// owe queues a retained checkpoint object storage lacks, to go up once the
// uploader has caught up.
func (u *uploader) owe(dir string, step int) {
	u.mu.Lock()
	u.oweLocked(upJob{dir: dir, step: step, keep: true})
	u.mu.Unlock()
	u.signal()
}

func (u *uploader) oweLocked(j upJob) {
	i, found := slices.BinarySearchFunc(u.owed, j.step, func(o upJob, s int) int { return o.step - s })
	if !found {
		u.owed = slices.Insert(u.owed, i, j)
	}
}

// end says that the segment ends short of the run's end (see ending).
func (u *uploader) end() { u.endOnce.Do(func() { close(u.ending) }) }

func (u *uploader) signal() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// uploadedStep is the newest step this segment uploaded, -1 none.
func (u *uploader) uploadedStep() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.uploaded
}

// safeStep is the newest step object storage holds whole as far as this
// segment knows: the newest it uploaded, or the newest there at its start
// that its resume did not find damaged.
func (u *uploader) safeStep() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.safeLocked()
}

// safeLocked is safeStep, u.mu held.
func (u *uploader) safeLocked() int { return max(u.uploaded, u.remote) }

// next takes the next job: the newest waiting, else the oldest owed while
// uploads succeed. It returns false once the queue is closed and has
// nothing more to send, or the grace is over.
func (u *uploader) next() (upJob, bool) {
	for {
		u.mu.Lock()
		var j *upJob
		switch {
		case u.waiting != nil:
			j, u.waiting = u.waiting, nil
		case len(u.owed) > 0 && u.healthy:
			first := u.owed[0]
			j, u.owed = &first, u.owed[1:]
		}
		u.inFlight = j
		closed := u.closed
		u.mu.Unlock()
		if j != nil {
			return *j, true
		}
		if closed || u.ctx.Err() != nil {
			return upJob{}, false
		}
		select {
		case <-u.wake:
		case <-u.ctx.Done():
		}
	}
}

func (u *uploader) loop() {
	defer close(u.done)
	// A checkpoint pushed from now on prunes by itself; one pushed before,
	// which no upload will take, is pruned here: a stop's last checkpoint
	// written after the grace is over leaves the newest two, not three.
	defer u.pruneLocal()
	defer func() {
		u.mu.Lock()
		u.stopped = true
		u.mu.Unlock()
	}()
	if !u.settle() {
		return
	}
	if u.retain {
		u.prune(u.safeStep())
	}
	for {
		j, ok := u.next()
		if !ok {
			return
		}
		start := time.Now()
		err := u.upload(j)
		u.mu.Lock()
		u.inFlight = nil
		u.healthy = err == nil
		if err == nil {
			u.uploaded = max(u.uploaded, j.step)
		} else if j.keep {
			u.oweLocked(j)
		}
		u.lastErr = err
		close(u.changed)
		u.changed = make(chan struct{})
		u.mu.Unlock()
		var fenced fenceError
		switch {
		case err == nil || u.ctx.Err() != nil:
		case errors.As(err, &fenced):
			// Redis is what failed, which the worker's log says of its
			// own: nothing here is object storage's doing.
			u.log.Warn("checkpoint not uploaded: every write of a checkpoint to object storage waits for Redis to confirm the run's lease, and it did not; the next checkpoint's upload tries again, and this one stays on this disk until it is superseded",
				zap.Int("step", j.step), zap.NamedError("redis", fenced.err))
		default:
			u.log.Error("checkpoint upload failed; the next checkpoint's upload tries again, and this one stays on this disk until it is superseded",
				zap.Int("step", j.step), zap.String("endpoint", u.endpoint), zap.Error(err))
			u.noteUnsent(start, briefly(err), nil)
		}
		u.pruneLocal()
	}
}

// settle lists object storage once it answers, when it did not at the
// segment's start: the retained local checkpoints it lacks are then owed
// to it, and the others may go. Uploads wait until then (they would fail
// as the listing does). It returns false when the grace ended first, or
// training did and the store still does not answer.
func (u *uploader) settle() bool {
	u.mu.Lock()
	unsure := u.unsure != nil
	u.mu.Unlock()
	for wait := time.Second; unsure; wait = min(2*wait, 30*time.Second) {
		// Training goes on meanwhile: the store is given ListWithin, not
		// the AnswerWithin of the segment's start, so that one slow to
		// list is waited for and its uploads go. Once the segment ends
		// short of the run's end, a store that still has not answered is
		// given AnswerWithin more: the segment that began during the
		// outage and finds it still there at its end ends after that, not
		// the grace. A listing that ran out of ListWithin fails as the
		// store's outage (store.Unreachable), so that the run's last
		// segment waits for it.
		steps, _, err := u.p.remoteSteps(u.ctx, u.p.ListWithin, u.ending)
		if err == nil {
			lacking := u.p.owedSteps(u.dir, u.rc, steps)
			var owed []int
			u.mu.Lock()
			for _, s := range lacking {
				if u.unsure[s] {
					u.oweLocked(upJob{dir: filepath.Join(u.dir, trainer.StepDir(s)), step: s, keep: true})
					owed = append(owed, s)
				}
			}
			u.unsure, u.healthy, u.lastErr = nil, true, nil
			if len(steps) > 0 {
				u.remote = max(u.remote, steps[len(steps)-1])
			}
			u.mu.Unlock()
			u.log.Info("object storage answers: the retained local checkpoints it lacks are uploaded after the newest", zap.Ints("owed", owed), zap.String("endpoint", u.endpoint))
			return true
		}
		u.mu.Lock()
		u.healthy, u.lastErr = false, err
		closed := u.closed
		u.mu.Unlock()
		if u.ctx.Err() == nil {
			u.noteUnsent(u.began, briefly(err), nil)
		}
		if closed {
			// Training is over: the segment ends saying what object
			// storage still lacks, and the next one tries again.
			return false
		}
		select {
		case <-u.ctx.Done():
			return false
		case <-u.wake:
		case <-time.After(wait):
		}
	}
	return true
}

func (u *uploader) upload(j upJob) error {
	if u.p.Objects == nil {
		return nil
	}
	start := time.Now()
	// The retention and results after the push count too: a store that
	// hangs there holds the uploader as well.
	var pushed atomic.Bool
	defer u.warnSlow(j.step, start, &pushed)()
	m, err := push(u.ctx, u.p.Objects, u.lock, u.p.Run.Name, j.dir, j.keep)
	if err != nil {
		return err
	}
	pushed.Store(true)
	var bytes int64
	for _, n := range m.Files {
		bytes += n
	}
	u.log.Info("checkpoint uploaded", zap.Int("step", j.step), zap.Int64("bytes", bytes), zap.Duration("took", time.Since(start)))
	// An owed checkpoint is older than one already uploaded, by this
	// segment or before it: the run's state and results stay the newer
	// one's.
	safe := u.safeStep()
	newest := j.step > safe
	if newest {
		f := map[string]string{
			"checkpoint": strconv.Itoa(j.step), "checkpoint_at": time.Now().UTC().Format(time.RFC3339),
			"checkpoint_upload_s": strconv.FormatFloat(time.Since(start).Seconds(), 'f', 3, 64),
		}
		err := u.recordUploaded(f)
		u.mu.Lock()
		u.unrecorded = nil
		if err != nil {
			u.unrecorded = &unrecordedError{step: j.step, err: err}
		}
		u.mu.Unlock()
		if err != nil {
			// The checkpoint is in object storage all the same: it counts
			// as uploaded (the local ones it supersedes may go, and a
			// resume anywhere finds it), and the state's next write of a
			// checkpoint, this segment's next upload or the next
			// segment's start, records it. Retention and the results wait
			// for that write: a holder fenced out must not prune or
			// write the run's results over the new holder's.
			if u.ctx.Err() != nil {
				return nil // the grace is over: finish says what is left
			}
			u.log.Warn("checkpoint uploaded, but the run's state in Redis could not record it: `sched status` and kiln_run_checkpoint_step name an older checkpoint, and retention and the results wait, until the next upload or the next segment records it",
				zap.Int("step", j.step), zap.NamedError("redis", err))
			return nil
		}
	}
	u.prune(max(j.step, safe))
	if newest {
		if err := u.p.writeResults(u.ctx, u.dir, u.rc, Outcome{Step: j.step, TotalSteps: u.rc.TotalSteps, Wall: u.wall(),
			ResumedFrom: u.from, Began: u.began}, u.log); err != nil {
			u.log.Warn("results", zap.Error(err))
		}
	}
	return nil
}

// recordUploaded sets f, the run's state of the newest checkpoint
// uploaded, fenced; where the state may record that checkpoints do not
// reach object storage (unsent), the same write clears that: the store
// takes them again.
func (u *uploader) recordUploaded(f map[string]string) error {
	u.unsentMu.Lock()
	defer u.unsentMu.Unlock()
	u.mu.Lock()
	unsent := !u.unsent.Since.IsZero()
	u.mu.Unlock()
	if unsent {
		maps.Copy(f, scheduler.Unsent{}.Fields())
	}
	err := u.lock.Fenced(u.ctx, f)
	if err == nil && unsent {
		u.mu.Lock()
		u.unsent = scheduler.Unsent{}
		u.mu.Unlock()
	}
	return err
}

// prune applies the run's retention to its checkpoints in object storage
// up to step upTo.
func (u *uploader) prune(upTo int) {
	ret := u.p.Run.Retention
	if deleted, err := Prune(u.ctx, u.p.Objects, u.p.Run.Name, upTo, u.rc.CheckpointEvery, ret.KeepLast, ret.KeepEvery); err != nil {
		u.log.Warn("checkpoint retention", zap.Error(err))
	} else if len(deleted) > 0 {
		u.log.Info("checkpoints deleted by retention", zap.Ints("steps", deleted))
	}
}

// unrecordedError is a checkpoint uploaded whose record in the run's state
// in Redis failed: object storage holds it, and the state names an older
// one until its next write of a checkpoint.
type unrecordedError struct {
	step int
	err  error
}

func (e *unrecordedError) Error() string {
	return fmt.Sprintf("checkpoint step %d is in object storage, but the run's state in Redis could not record it (Redis: %v); the next segment records it", e.step, e.err)
}

func (e *unrecordedError) Unwrap() error { return e.err }

// warnSlow warns while the upload of step, begun at start, goes on past
// SlowUpload, and again each time its time doubles: the one sign an
// operator gets of a hung or crawling store, as training goes on. Each
// says what holds it, the push or (pushed) the retention and results
// after it, and whether training goes on or is over and waits for it. The
// returned func ends the warnings.
func (u *uploader) warnSlow(step int, start time.Time, pushed *atomic.Bool) (stop func()) {
	end := make(chan struct{})
	go func() {
		after := u.p.SlowUpload
		t := time.NewTimer(after)
		defer t.Stop()
		for {
			select {
			case <-end:
				return
			case <-t.C:
			}
			u.mu.Lock()
			waiting, over := -1, u.closed
			if u.waiting != nil {
				waiting = u.waiting.step
			}
			u.mu.Unlock()
			what := "checkpoint upload is slow"
			if pushed.Load() {
				what = "checkpoint uploaded, and the retention and results after it are slow"
			}
			if over {
				what += "; training is over, and the segment waits for it"
			} else {
				what += "; training goes on, and the newest checkpoint waits to go next"
			}
			elapsed := time.Since(start)
			u.log.Warn(what, zap.Int("step", step), zap.Duration("elapsed", elapsed), zap.String("endpoint", u.endpoint),
				zap.Int("waiting", waiting))
			if !pushed.Load() && !over {
				// Training goes on and its checkpoints wait on this disk.
				// Once training is over, the run reads finishing, which
				// says that it uploads its last checkpoint.
				u.noteUnsent(start, fmt.Sprintf("the upload of step %d has gone on for %s", step, elapsed.Round(time.Second)),
					func() bool { return !pushed.Load() })
			}
			after *= 2
			t.Reset(time.Until(start.Add(after)))
		}
	}()
	return func() { close(end) }
}

// noteUnsent records in the run's state, fenced, that object storage has
// not taken the newest checkpoint, as of since where the state records no
// earlier time, and why (in short): it and those after the state's newest
// uploaded one are on this worker's disk only, where `sched status` would
// otherwise read as if all were well while the outage lasts. Nothing is
// recorded while the newest is in object storage (an owed older one that
// fails waits for the next upload, which says whether the store takes
// them), nor where still (nil: always) no longer holds once the writes
// before are done. Each failed or slow upload writes it again, with the
// newest step.
func (u *uploader) noteUnsent(since time.Time, why string, still func() bool) {
	u.unsentMu.Lock()
	defer u.unsentMu.Unlock()
	if still != nil && !still() {
		return
	}
	u.mu.Lock()
	if u.pushed <= u.safeLocked() {
		u.mu.Unlock()
		return
	}
	if u.unsent.Since.IsZero() {
		u.unsent.Since = since
	}
	u.unsent.Newest, u.unsent.Worker, u.unsent.Store, u.unsent.Err = u.pushed, u.p.Owner, u.endpoint, why
	f := u.unsent.Fields()
	u.mu.Unlock()
	if err := u.lock.Fenced(u.ctx, f); err != nil && u.ctx.Err() == nil && !errors.Is(err, scheduler.ErrRunLockLost) {
		u.log.Warn("the run's state does not record that object storage has not taken its newest checkpoints", zap.NamedError("redis", err))
	}
}

// briefly is an upload's error in a few words for the run's state: an
// object store's operation and its innermost cause, where the whole error
// repeats the store's URL and the object's key.
func briefly(err error) string {
	var se *store.S3Error
	if errors.As(err, &se) {
		return store.Outage(err)
	}
	return scheduler.OneLine(err.Error(), 200)
}

// pending is the set of local checkpoints that must stay: queued, in
// flight or owed to object storage.
func (u *uploader) pending() map[int]bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	p := map[int]bool{}
	for _, j := range u.owed {
		p[j.step] = true
	}
	for s := range u.unsure {
		p[s] = true
	}
	if u.waiting != nil {
		p[u.waiting.step] = true
	}
	if u.inFlight != nil {
		p[u.inFlight.step] = true
	}
	return p
}

// disk is what the disk guard needs to know of the uploads.
func (u *uploader) disk() diskState {
	pending := u.pending()
	u.mu.Lock()
	defer u.mu.Unlock()
	return diskState{safe: u.safeLocked(), pending: pending, lastErr: u.lastErr, endpoint: u.endpoint, objects: u.p.Objects != nil}
}

// busy is true while an upload is queued or in flight, or owed ones can go.
func (u *uploader) busy() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.busyLocked()
}

func (u *uploader) busyLocked() bool {
	return u.waiting != nil || u.inFlight != nil || (len(u.owed) > 0 && u.healthy)
}

// idle waits until the uploader has nothing left it can send now.
func (u *uploader) idle(ctx context.Context) error {
	for {
		u.mu.Lock()
		busy, changed := u.busyLocked(), u.changed
		u.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-changed:
		case <-u.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// pruneLocal keeps the newest two local checkpoints (the newest and the
// one before it, which a resume falls back to if the newest turns out
// unreadable) and those queued, in flight or owed. Any other is in object
// storage or superseded by a newer one there or on its way. Without object
// storage the local disk is the only copy, and retention applies to it.
func (u *uploader) pruneLocal() {
	keep := u.pending()
	steps := localSteps(u.dir)
	if u.p.Objects == nil {
		maps.Copy(keep, Keep(steps, u.rc.CheckpointEvery, u.p.Run.Retention.KeepLast, u.p.Run.Retention.KeepEvery))
	}
	for i, s := range steps {
		if i >= len(steps)-2 || keep[s] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(u.dir, trainer.StepDir(s))); err != nil {
			u.log.Warn("remove local checkpoint", zap.Int("step", s), zap.Error(err))
		}
	}
}

// unanswered reports whether object storage has not answered this segment
// at all: it did not at the start, and settle has not listed it since.
func (u *uploader) unanswered() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.unsure != nil
}

// finish closes the queue and waits for what it holds, or until the grace
// is over (u.ctx ends UploadGrace after the segment's context): the upload
// in flight is then abandoned (its marker is never written, so object
// storage stays consistent), and what was not uploaded stays on this disk
// for the next segment, which uploads what object storage lacks. It returns
// an error when the newest checkpoint pushed, or one owed, is not in object
// storage, and an *unrecordedError when the newest is, and the run's state
// in Redis could not record it. last says the segment ended the run: the
// store is waited for, a slow one included, where another segment would
// catch up.
func (u *uploader) finish(last bool) error {
	if !last {
		u.end()
	}
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	u.signal()
	<-u.done
	u.mu.Lock()
	defer u.mu.Unlock()
	var owed []int
	for _, j := range u.owed {
		owed = append(owed, j.step)
	}
	for s := range u.unsure {
		owed = append(owed, s)
	}
	sort.Ints(owed)
	missing := u.pushed > u.safeLocked()
	if u.ctx.Err() != nil && (missing || len(owed) > 0) {
		u.log.Warn("upload grace over: the checkpoints not uploaded stay on this disk, and the next segment here uploads them; one on another worker resumes from the newest in object storage",
			zap.Duration("grace", u.p.UploadGrace), zap.Int("newest", u.pushed), zap.Int("uploaded", u.safeLocked()),
			zap.Ints("owed", owed), zap.String("endpoint", u.endpoint))
	}
	cause := u.lastErr
	if cause == nil && u.ctx.Err() != nil {
		cause = fmt.Errorf("upload grace of %v over", u.p.UploadGrace)
	}
	var fenced fenceError
	switch {
	case missing && errors.As(cause, &fenced):
		return fmt.Errorf("upload of the last checkpoint, step %d, to %s: Redis did not confirm the run's lease, which every write of a checkpoint waits for: %w", u.pushed, u.endpoint, cause)
	case missing:
		return fmt.Errorf("upload of the last checkpoint, step %d, to %s: %w", u.pushed, u.endpoint, cause)
	case len(owed) > 0:
		return fmt.Errorf("upload of checkpoints retention keeps (steps %v) to %s: %w", owed, u.endpoint, cause)
	case u.unrecorded != nil:
		return u.unrecorded
	}
	return nil
}

// owedSteps are the local checkpoints that retention keeps in object
// storage for good and that it lacks (remote lists what it holds): the
// earlier segment here ended before it uploaded them.
func (p Params) owedSteps(dir string, rc trainer.RunConfig, remote []int) []int {
	have := map[int]bool{}
	for _, s := range remote {
		have[s] = true
	}
	var owed []int
	for s := range Keep(localSteps(dir), rc.CheckpointEvery, 0, p.Run.Retention.KeepEvery) {
		if !have[s] {
			owed = append(owed, s)
		}
	}
	sort.Ints(owed)
	return owed
}

func localSteps(dir string) []int {
	entries, _ := os.ReadDir(dir)
	var steps []int
	for _, e := range entries {
		if s, ok := trainer.DirStep(e.Name()); ok && e.IsDir() {
			steps = append(steps, s)
		}
	}
	sort.Ints(steps)
	return steps
}

// ErrDiskFull is the disk guard's error: the local disk has less free space
// than the run's min_free_disk even after removing what object storage
// already holds.
var ErrDiskFull = errors.New("local disk below min_free_disk")

// diskState is what the disk guard knows of object storage: the newest
// step it holds complete (safe), the local checkpoints still to go up
// (pending), and why the last upload failed.
type diskState struct {
	safe     int
	pending  map[int]bool
	lastErr  error
	endpoint string
	objects  bool
}

// guardDisk keeps dir's filesystem above the run's min_free_disk: below it,
// local checkpoints object storage makes redundant (up to its newest step,
// never one still to go up, never the newest) go first; if that is not
// enough the segment stops with ErrDiskFull rather than fill the disk the
// token stores live on.
func (p Params) guardDisk(dir string, st diskState) error {
	min := int64(p.Run.MinFreeDisk)
	if min <= 0 {
		return nil
	}
	free, err := p.FreeSpace(dir)
	if err != nil {
		return fmt.Errorf("disk guard: %w", err)
	}
	if free >= min {
		return nil
	}
	steps := localSteps(dir)
	for i, s := range steps {
		if i == len(steps)-1 || s > st.safe {
			break
		}
		if st.pending[s] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, trainer.StepDir(s))); err != nil {
			return fmt.Errorf("disk guard: %w", err)
		}
		p.Log.Warn("disk guard removed an uploaded local checkpoint", zap.String("run", p.Run.Name), zap.Int("step", s))
		if free, err = p.FreeSpace(dir); err != nil {
			return fmt.Errorf("disk guard: %w", err)
		}
		if free >= min {
			return nil
		}
	}
	// The run is named by the error's wrapper, and by its directory.
	msg := fmt.Sprintf("%s has %s free, below min_free_disk %s", dir, bytesize.Format(free), bytesize.Format(min))
	// The newest, which the guard never removes (it is the one just
	// written, its upload under way), holds its space whatever object
	// storage does: it blames the store for nothing.
	older := localSteps(dir)
	if len(older) > 0 {
		older = older[:len(older)-1]
	}
	if lacking := lackingSteps(older, st); st.objects && len(lacking) > 0 {
		// What holds the space is the run's own checkpoints, kept until
		// object storage has them: the fix is there, not on this disk.
		var size int64
		for _, s := range lacking {
			size += dirSize(filepath.Join(dir, trainer.StepDir(s)))
		}
		why := ""
		if st.lastErr != nil {
			why = fmt.Sprintf(" (last upload: %v)", st.lastErr)
		}
		return fmt.Errorf("%w: %s; %d local checkpoints (steps %d to %d, %s) are not in object storage yet and stay until they are: %s is unreachable or behind%s: bring it back, free space on that disk, or lower min_free_disk in a runs file",
			ErrDiskFull, msg, len(lacking), lacking[0], lacking[len(lacking)-1], bytesize.Format(size), st.endpoint, why)
	}
	return fmt.Errorf("%w: %s: free space on that disk, or lower min_free_disk in a runs file", ErrDiskFull, msg)
}

// lackingSteps are the steps among local that object storage lacks: newer
// than its newest, or still to go up.
func lackingSteps(local []int, st diskState) []int {
	var out []int
	for _, s := range local {
		if s > st.safe || st.pending[s] {
			out = append(out, s)
		}
	}
	return out
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// benchGPUs is the GPU count of the bench row a run is held to: the GPUs
// its segment trained on (for gpus: all, those it found: a sweep on
// several GPUs holds a row for one beside theirs). Where it started no
// engine, the run's setting: one where it sets none, any count (0) for
// all.
func benchGPUs(configured trainer.GPUCount, devices int) int {
	switch {
	case devices > 0:
		return devices
	case configured == 0:
		return 1
	}
	return max(int(configured), 0)
}

// benchPrecision is the precision of the bench row a run is held to: the
// one its segment's engine computed in (fp32 on the CPU engine, whatever
// the run asked), else, where it started no engine, the run's.
func benchPrecision(configured, computed string) string {
	if computed != "" {
		return computed
	}
	return configured
}

// runBench is the bench row of the step that rc's segment out trained, or
// the zero row where rows hold none.
func runBench(rows []results.BenchRow, rc trainer.RunConfig, out Outcome) results.BenchRow {
	mc, err := rc.ModelConfig()
	if err != nil {
		return results.BenchRow{}
	}
	// The bench's step must be the run's: the optimizer's share of a step
	// shrinks with its micro-batches, and one micro-batch of batch x
	// accumulate is a different step again.
	return results.FindBench(rows, results.Shape(mc, rc.Batch, rc.Seq, rc.Accumulate, benchGPUs(rc.GPUs, out.Devices),
		benchPrecision(rc.Precision, out.Precision)))
}

// writeResults writes summary.md and loss.svg beside metrics.jsonl and
// uploads the three to results/<run>/.
func (p Params) writeResults(ctx context.Context, dir string, rc trainer.RunConfig, out Outcome, log *zap.Logger) error {
	f, err := os.Open(filepath.Join(dir, results.MetricsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("results of run %s: %w", p.Run.Name, err)
	}
	recs, err := results.ReadMetrics(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("results of run %s: %w", p.Run.Name, err)
	}
	if len(results.TrainCurve(recs)) == 0 {
		return nil
	}
	s := results.Summary{Run: p.Run.Name, Settings: Settings(p.Run, rc, out.Precision, recs), Records: recs, TotalSteps: rc.TotalSteps, WallClock: out.Wall}
	fig := s.Figures()
	// The gates of a run short of its total steps (a checkpoint's upload, a
	// segment that ends before the run) wait for its end where the steps
	// so far do not decide: summary.md is what `sched results` prints.
	ev := results.Evidence{Run: p.Run.Name, Records: recs, Warmup: rc.Warmup, TokPerSec: fig.TokPerSec, Bench: runBench(p.Bench, rc, out),
		Step: max(out.Step, fig.Steps), TotalSteps: rc.TotalSteps}
	if out.Done && p.Sample != nil && out.Checkpoint != "" {
		ids, text, err := p.Sample(ctx, out.Checkpoint)
		if err != nil {
			log.Warn("generation sample", zap.Error(err))
			ev.SampleErr = err
		} else {
			ev.Sample, s.Sample = ids, text
		}
	}
	s.Gates = results.Gates(ev)
	if err := s.WriteFiles(dir); err != nil {
		return err
	}
	// This segment's TensorBoard file: its lines up to out.Step, the
	// checkpoint being uploaded, from which a successor resumes if this
	// worker dies.
	events, err := results.WriteEventFile(dir, recs, out.ResumedFrom, out.Step, out.Began)
	if err != nil {
		return err
	}
	if p.Objects == nil {
		return nil
	}
	for _, name := range []string{results.MetricsFile, results.SummaryFile, results.PlotFile, events} {
		if name == "" {
			continue
		}
		if _, _, err := putFile(ctx, p.Objects, ResultsPrefix(p.Run.Name)+name, filepath.Join(dir, filepath.FromSlash(name))); err != nil {
			return fmt.Errorf("upload results of run %s: %w", p.Run.Name, err)
		}
	}
	if err := p.catchUpEvents(ctx, dir, recs, out, path.Base(events)); err != nil {
		return fmt.Errorf("upload results of run %s: %w", p.Run.Name, err)
	}
	return nil
}

// catchUpEvents brings the event files of the run's earlier segments in
// object storage up to the run's metrics. A segment's file is written
// when its checkpoints upload and when it ends, so a segment killed, or
// ending while the store was down or hung, leaves its file short of the
// step the next segment resumed from, or only on this disk; the first
// segment killed before its first upload ended leaves none, and gets one
// (results.FirstStretch). Each earlier
// file (of this disk or of the store; current, this segment's, was just
// uploaded) is written anew from the run's metrics over its own stretch,
// from its first step to the next segment's, and uploaded where the store
// holds it otherwise: a stretch ends where the next begins, so that steps
// trained again after a resume from an older checkpoint are never in two
// files, and a file that begins at or after current's first step holds
// only steps current trained again: it is removed.
func (p Params) catchUpEvents(ctx context.Context, dir string, recs []results.Record, out Outcome, current string) error {
	var files []results.EventFile
	seen := map[string]bool{}
	add := func(name string) {
		if began, _, from, ok := results.ParseEventFileName(name); ok && !seen[name] {
			files = append(files, results.EventFile{Name: name, Began: began, From: from})
			seen[name] = true
		}
	}
	entries, err := os.ReadDir(filepath.Join(dir, results.TensorBoardDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			add(e.Name())
		}
	}
	prefix := ResultsPrefix(p.Run.Name) + results.TensorBoardDir + "/"
	objs, err := p.Objects.List(ctx, prefix)
	if err != nil {
		return err
	}
	stored := map[string]int64{}
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, prefix)
		stored[name] = o.Size
		add(name)
	}
	if !seen[current] {
		// This segment's stretch begins where it resumed, logged lines or
		// not: the earlier files end there.
		files = append(files, results.EventFile{Name: current, Began: out.Began, From: out.ResumedFrom})
	}
	if f, ok := results.FirstStretch(files, recs); ok {
		// The first segment was killed before its results were written.
		files = append(files, f)
	}
	for _, f := range files {
		if f.Name == current || p.caughtUp.has(f.Name) {
			continue
		}
		end := results.StretchEnd(files, f, out.Step)
		if f.From >= out.ResumedFrom {
			// This segment resumed at or before the file's first step:
			// it trained every step of the file again, in its own.
			end = f.From
		}
		var buf bytes.Buffer
		n, err := results.WriteEventStretch(&buf, recs, f.From, end, f.Began)
		if err != nil {
			return err
		}
		size, ok := stored[f.Name]
		switch {
		case n == 0:
			// A file of no step of the run's: were it kept, its steps
			// would be shown beside the ones trained again.
			if ok {
				if err := p.Objects.Delete(ctx, prefix+f.Name); err != nil {
					return err
				}
			}
			if err := os.Remove(filepath.Join(dir, results.TensorBoardDir, f.Name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		case !ok || size != int64(buf.Len()):
			if err := p.Objects.Put(ctx, prefix+f.Name, bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
				return err
			}
		}
		// Its stretch ends at a later file's first step, which does not
		// change while this segment trains: it stays whole.
		p.caughtUp.add(f.Name)
	}
	return nil
}

// caughtUp is the set of event files a segment has made whole in object
// storage. Each is written anew from every line of its stretch, a month's
// run's lines in all, so once is enough.
type caughtUp struct {
	mu    sync.Mutex
	names map[string]bool
}

func (c *caughtUp) has(name string) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.names[name]
}

func (c *caughtUp) add(name string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names[name] = true
}

// Settings is the configuration table of a run's summary; computed is the
// precision its engine computed in, where known, and recs the run's
// metrics lines, which say the GPUs it trained on.
func Settings(r runs.Run, rc trainer.RunConfig, computed string, recs []results.Record) []results.Setting {
	precision := rc.Precision
	if computed != "" && computed != rc.Precision {
		// A bf16 run that fell back to the CPU trained in fp32: the
		// summary says what the figures beside it were measured in.
		precision += ", computed in " + computed
	}
	var mix []string
	for _, m := range r.RunConfig.Mixture {
		mix = append(mix, fmt.Sprintf("%s %.0f%%", m.Store, 100*m.Weight/totalWeight(r.RunConfig.Mixture)))
	}
	settings := []results.Setting{{Key: "model", Value: rc.Model}}
	if moe := experts(rc); moe != "" {
		settings = append(settings, results.Setting{Key: "moe", Value: moe})
	}
	return append(settings, []results.Setting{
		{Key: "seq x batch x accumulate", Value: fmt.Sprintf("%d x %d x %d = %d tokens/step", rc.Seq, rc.Batch, rc.Accumulate, rc.TokensPerStep())},
		{Key: "total steps", Value: strconv.Itoa(rc.TotalSteps)},
		{Key: "lr", Value: fmt.Sprintf("%g, warmup %d, cosine to %gx", rc.LR, rc.Warmup, rc.FloorOr())},
		{Key: "weight decay, clip", Value: fmt.Sprintf("%g, %g", rc.WeightDecay, rc.ClipOr())},
		{Key: "mixture", Value: strings.Join(mix, ", ")},
		{Key: "tokenizer", Value: r.Tokenizer},
		{Key: "engine, precision", Value: rc.Engine + ", " + precision},
		{Key: "gpus", Value: gpusTrained(rc, recs)},
		{Key: "checkpoint every", Value: fmt.Sprintf("%d steps (keep last %d, every %d)", rc.CheckpointEvery, r.Retention.KeepLast, r.Retention.KeepEvery)},
		{Key: "segment", Value: fmt.Sprintf("max %d steps, max %v", r.Segment.MaxSteps, r.Segment.MaxDuration)},
	}...)
}

// experts says a run's mixture of experts as its model trained with it,
// absent fields at their defaults ("4 experts, top 2, d_ff 176, aux_coef
// 0.02"), or "" for a dense run: the model's name alone reads as its
// dense preset.
func experts(rc trainer.RunConfig) string {
	if rc.MoE == nil {
		return ""
	}
	mc, err := rc.ModelConfig()
	if err != nil || mc.Experts == 0 {
		// A model this build has no preset of: what the run asked.
		return rc.MoE.String()
	}
	return fmt.Sprintf("%d experts, top %d, d_ff %d, aux_coef %g", mc.Experts, mc.ExpertsPerTok, mc.Intermediate, mc.RouterAuxCoef)
}

// gpusTrained is how many GPUs the run trained on, as its logged steps
// record it (a run resumed on another number of them says from which
// step), else, before any step is logged, what it asks for: its tok/s is
// all of theirs together, its MFU each one's.
func gpusTrained(rc trainer.RunConfig, recs []results.Record) string {
	if rc.Engine == "cpu" {
		return "none (engine cpu)"
	}
	var b strings.Builder
	last := 0
	for _, rec := range recs {
		if rec.Loss == nil {
			continue
		}
		n := max(rec.GPUs, 1)
		switch {
		case last == 0:
			fmt.Fprint(&b, n)
		case n != last:
			fmt.Fprintf(&b, ", then %d from step %d", n, rec.Step)
		}
		last = n
	}
	if last == 0 {
		asked := rc.GPUs
		if asked == 0 {
			asked = 1
		}
		return fmt.Sprintf("%s (no step logged yet)", asked)
	}
	return b.String()
}

func totalWeight(m []trainer.MixtureEntry) float64 {
	t := 0.0
	for _, e := range m {
		t += e.Weight
	}
	if t == 0 {
		return 1
	}
	return t
}
