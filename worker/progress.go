package worker

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/lapse"
	"github.com/kiln-lm/kiln/scheduler"
)

// Reporter publishes a running task's progress for `sched status`.
// Handlers get theirs with Progress(ctx) and call Report as they go; writes
// are throttled, so calling it per step is cheap.
type Reporter struct {
	rdb redis.UniversalClient
	log *zap.Logger
	ttl time.Duration
	// every is the minimum interval between Redis writes.
	every time.Duration

	// now is the clock (time.Now when nil).
	now func() time.Time
	// redact hides the configuration's secrets in what is written (nil:
	// nothing to hide).
	redact func(string) string

	mu   sync.Mutex
	p    scheduler.Progress
	last time.Time
	// base is the first fraction this task reported and when: the ETA is
	// measured from it, not from the task's start, because a task may
	// start part way (a training segment resumes a run at its checkpoint)
	// and may spend its first minutes on setup that says nothing of the
	// rate of the work.
	base     float64
	baseAt   time.Time
	baseSeen bool
	// held is the write of a report the throttle held back, due once
	// every has passed since the last write: a task's last word before a
	// long wait (a hub's retry, minutes away) is what status shows during
	// it, not the word before. ended stops it for good once the final
	// state is written.
	held  *time.Timer
	ended bool

	// wmu orders the writes: each publishes what was last reported when
	// it takes wmu, so that a held write and a due one never leave the
	// older of two reports in Redis.
	wmu sync.Mutex
	// unwritten folds the writes that fail while Redis is down: only the
	// first of them is logged, and the first to succeed after them.
	unwritten lapse.Lapse
}

type reporterKey struct{}

// Progress returns the task's reporter. Outside a worker (a handler called
// directly from a test or the demo command) it returns a reporter that
// records nothing, so handlers need no nil checks.
func Progress(ctx context.Context) *Reporter {
	if r, ok := ctx.Value(reporterKey{}).(*Reporter); ok {
		return r
	}
	return &Reporter{}
}

// Report records that fraction of the work is done (negative when unknown),
// at rate units per second, with a message.
func (r *Reporter) Report(ctx context.Context, fraction, rate float64, unit, msg string) {
	if r.rdb == nil {
		return
	}
	r.mu.Lock()
	now := r.clock()
	r.p.Fraction, r.p.Rate, r.p.Unit, r.p.Message, r.p.Updated = fraction, rate, unit, msg, now
	r.p.ETA = r.eta(fraction, now)
	due := now.Sub(r.last) >= r.every
	if due {
		r.last = now
	} else if r.held == nil && !r.ended {
		r.held = time.AfterFunc(r.every-now.Sub(r.last), r.writeHeld)
	}
	r.mu.Unlock()
	if due {
		r.publish(ctx)
	}
}

// writeHeld writes the report the throttle held back.
func (r *Reporter) writeHeld() {
	r.mu.Lock()
	r.held = nil
	ended := r.ended
	if !ended {
		r.last = r.clock()
	}
	r.mu.Unlock()
	if ended {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.publish(ctx)
}

// stopHeld ends the held write, and any later one: the task's last
// state is being written.
func (r *Reporter) stopHeld() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	if r.held != nil {
		r.held.Stop()
		r.held = nil
	}
}

// publish writes what was last reported.
func (r *Reporter) publish(ctx context.Context) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	p := r.p
	r.mu.Unlock()
	r.write(ctx, p)
}

// eta is the time the rest of the work takes at the rate measured since
// the first report: (1-f) / ((f-base)/elapsed). Zero until a second report
// shows progress.
func (r *Reporter) eta(f float64, now time.Time) time.Duration {
	if f < 0 || f > 1 {
		return 0
	}
	if !r.baseSeen {
		r.base, r.baseAt, r.baseSeen = f, now, true
		return 0
	}
	done, elapsed := f-r.base, now.Sub(r.baseAt)
	if done <= 0 || elapsed <= 0 {
		return 0
	}
	return time.Duration(float64(elapsed) * (1 - f) / done).Round(time.Second)
}

func (r *Reporter) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

// Message records a message without changing the fraction.
// TaskID is the id of the task r reports on ("" where r is nil).
func (r *Reporter) TaskID() string {
	if r == nil {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.p.TaskID
}

func (r *Reporter) Message(ctx context.Context, msg string) {
	r.mu.Lock()
	f, rate, unit := r.p.Fraction, r.p.Rate, r.p.Unit
	r.mu.Unlock()
	r.Report(ctx, f, rate, unit, msg)
}

// flush writes what was last reported, whatever the throttle, as a task's
// process ends: nothing is written after it.
func (r *Reporter) flush() {
	if r.rdb == nil {
		return
	}
	r.stopHeld()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.publish(ctx)
}

// adopt takes what a task's child process last reported, so that the
// final state the worker writes keeps its fraction and message.
func (r *Reporter) adopt(ctx context.Context) {
	if r.rdb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	p, ok, err := scheduler.ReadProgress(ctx, r.rdb, r.p.TaskID)
	if err != nil || !ok {
		return
	}
	r.mu.Lock()
	r.p.Fraction, r.p.Rate, r.p.Unit, r.p.ETA, r.p.Message, r.p.Updated = p.Fraction, p.Rate, p.Unit, p.ETA, p.Message, p.Updated
	r.mu.Unlock()
}

// finish writes the final state unthrottled.
// took records the tokens a step that stopped at its ingest's limit
// appended first (Progress.Taken).
func (r *Reporter) took(tokens int64) {
	r.mu.Lock()
	r.p.Taken = tokens
	r.mu.Unlock()
}

func (r *Reporter) finish(state, msg string) {
	if r.rdb == nil {
		return
	}
	r.mu.Lock()
	r.p.State, r.p.Updated = state, r.clock()
	if state == "done" {
		r.p.Fraction, r.p.ETA = 1, 0
	}
	if msg != "" {
		r.p.Message = msg
	}
	r.mu.Unlock()
	r.stopHeld()
	// The task's context may be cancelled by now; the final state must
	// still be written, so it gets its own short deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.publish(ctx)
}

// write publishes p. Progress is advisory: a lost update does not fail
// the task. While Redis does not answer every write fails (one a second);
// the log says so once, and once more when a write succeeds again.
func (r *Reporter) write(ctx context.Context, p scheduler.Progress) {
	// Also once the task's context has ended (a cancel, a drain): what a
	// task says while it stops, saving its state, is worth showing, and a
	// write refused for the context alone is no failure to log.
	if r.redact != nil {
		p.Message = r.redact(p.Message)
	}
	err := scheduler.WriteProgress(context.WithoutCancel(ctx), r.rdb, p, r.ttl)
	first, lost := r.unwritten.Note(err)
	switch {
	case first:
		r.log.Warn("progress not written; the task goes on, and further failures are not logged until a write succeeds",
			zap.String("task_id", p.TaskID), zap.Error(err))
	case lost > 0:
		r.log.Info("progress written again", zap.String("task_id", p.TaskID), zap.Int("writes_lost", lost))
	}
}
