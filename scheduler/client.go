package scheduler

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/kiln-lm/kiln/internal/redismem"
)

// Client enqueues and inspects kiln's tasks. It is safe for concurrent use.
type Client struct {
	c    *asynq.Client
	insp *asynq.Inspector
	rdb  redis.UniversalClient
	// listed, where a test sets it, is called after each of a queue's
	// lists is read by a snapshot or a scan of live work, with the
	// list's state: what moves in between is the test's to make.
	listed func(queue, state string)
}

// NewClient connects to the queue's Redis. It does not dial until used;
// Ping checks the connection with a clear error.
func NewClient(opt asynq.RedisConnOpt) *Client {
	return &Client{
		c:    asynq.NewClient(opt),
		insp: asynq.NewInspector(opt),
		rdb:  opt.MakeRedisClient().(redis.UniversalClient),
	}
}

// Close releases the client's connections.
func (c *Client) Close() error {
	return errors.Join(c.c.Close(), c.insp.Close(), c.rdb.Close())
}

// Redis returns the client's Redis connection (for progress and cancel marks).
func (c *Client) Redis() redis.UniversalClient { return c.rdb }

// Ping checks that Redis answers. A failure that is a question of TLS
// says so, and what to do (tlsHint).
func (c *Client) Ping(ctx context.Context) error {
	err := c.rdb.Ping(ctx).Err()
	rc, ok := c.rdb.(*redis.Client)
	if err == nil || !ok {
		return err
	}
	o := rc.Options()
	if hint := tlsHint(err, o.TLSConfig != nil, o.Addr); hint != "" {
		return fmt.Errorf("%w (%s)", err, hint)
	}
	return err
}

// tlsHint says what err, a failed ping of Redis at addr over TLS (overTLS:
// a rediss:// URL) or not, tells of TLS, with what to do; "" where it
// tells nothing. The errors alone do not say why ("EOF", "context
// deadline exceeded"):
//   - a redis:// URL to a Redis that speaks TLS alone: the server takes
//     the command for a handshake that fails and closes the connection,
//     which reads as EOF;
//   - a rediss:// URL to a Redis without TLS: the handshake ends as
//     mayNotSpeakTLS says;
//   - a Redis that requires a client certificate (tls-auth-clients yes,
//     Redis's default where it speaks TLS): kiln presents none, and the
//     server's alert says "certificate required";
//   - a server certificate this machine does not take.
func tlsHint(err error, overTLS bool, addr string) string {
	if !overTLS {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return "the server closed the connection at once, as a Redis that speaks TLS alone does to redis://: use rediss:// for a Redis with TLS"
		}
		return ""
	}
	var authority x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case certificateRequired(err):
		return fmt.Sprintf("Redis at %s requires a client certificate (tls-auth-clients yes, Redis's default with TLS), which kiln cannot present: set tls-auth-clients no (or optional) in that Redis's configuration", addr)
	case mayNotSpeakTLS(err):
		return "rediss:// means TLS, which this server may not speak: use redis:// for a Redis without TLS"
	case errors.As(err, &authority):
		return fmt.Sprintf("the certificate of Redis at %s is signed by an authority this machine does not trust: add that authority's certificate to the system's trusted ones, or name its PEM file in SSL_CERT_FILE", addr)
	case errors.As(err, &host):
		return fmt.Sprintf("the certificate of Redis at %s does not name %s: give the URL a host it names", addr, host.Host)
	}
	return ""
}

// certificateRequired says whether err is the TLS alert of a server that
// requires a client certificate (certificate_required, RFC 8446), which
// crypto/tls gives as a "remote error" of an alert type of its own.
func certificateRequired(err error) bool {
	const alertCertificateRequired = 116
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error" && op.Err != nil &&
		op.Err.Error() == tls.AlertError(alertCertificateRequired).Error()
}

// mayNotSpeakTLS says whether err is how a TLS handshake with a server
// that does not speak TLS ends: a timeout, a reply that is not a TLS
// record, or the connection closed on what the server took for a bad
// command. A TLS alert or a certificate error is the server speaking TLS.
func mayNotSpeakTLS(err error) bool {
	var rh tls.RecordHeaderError
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) ||
		errors.As(err, &rh) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// DuplicateError says the same work is already queued (or was done within
// its retention); the existing task's id and state are given.
type DuplicateError struct {
	ID    string
	State string
}

func (e *DuplicateError) Error() string {
	if e.State == "" {
		return "already queued as " + e.ID
	}
	return fmt.Sprintf("already queued as %s (%s)", e.ID, e.State)
}

// Options returns the asynq options of a's kind: queue, id, timeout,
// retries and retention.
func Options(a Args) ([]asynq.Option, error) {
	p, ok := policyOf(a)
	if !ok {
		return nil, &UnknownKindError{Kind: a.Kind()}
	}
	id, err := TaskID(a)
	if err != nil {
		return nil, err
	}
	return []asynq.Option{
		asynq.Queue(p.Queue),
		asynq.TaskID(id),
		asynq.Timeout(p.Timeout),
		asynq.MaxRetry(p.queueRetries()),
		asynq.Retention(p.Retention),
	}, nil
}

// NewTask builds a's asynq task with its kind's options.
func NewTask(a Args) (*asynq.Task, error) {
	payload, err := Encode(a)
	if err != nil {
		return nil, err
	}
	opts, err := Options(a)
	if err != nil {
		return nil, err
	}
	return asynq.NewTask(a.Kind(), payload, opts...), nil
}

// Enqueue queues a, as a worker queues the next piece of a job. The same
// work pending, scheduled, running, waiting to retry or completed is a
// *DuplicateError naming that task; the same work archived (it failed for
// good, or was cancelled) is queued again in its place, so that a job
// started again after its cause was fixed redoes what failed.
func (c *Client) Enqueue(ctx context.Context, a Args) (*asynq.TaskInfo, error) {
	t, err := NewTask(a)
	if err != nil {
		return nil, err
	}
	s, err := c.submit(ctx, t, false)
	return s.Info, err
}

// Submitted is what Again did.
type Submitted struct {
	// Info is the task now queued.
	Info *asynq.TaskInfo
	// Was is the state of the same work before: "" when it was new,
	// "archived" or "completed" when it was queued again in its place,
	// "retry" when its waiting retry was started now.
	Was string
	// LastErr is the archived task's last error, when Was is "archived".
	LastErr string
	// Cancelled says that the archived task was stopped by `sched
	// cancel` (its LastErr then only the cancellation's echo).
	Cancelled bool
	// Reported is the state its worker last reported of the task whose
	// waiting retry was started now: "interrupted" where its worker's
	// shutdown set it back, "waiting" where it waited for something,
	// neither of which used a retry; otherwise what the worker last said.
	Reported string
}

// Again queues a as a person asks for it: like Enqueue, and the same work
// that completed is queued again too, and the same work waiting out a
// retry back-off runs now. Only work pending, scheduled or running is a
// *DuplicateError: what is kept for idempotence never stops a person from
// redoing work.
func (c *Client) Again(ctx context.Context, a Args) (Submitted, error) {
	t, err := NewTask(a)
	if err != nil {
		return Submitted{}, err
	}
	return c.submit(ctx, t, true)
}

// Retry runs the task id again, from its stored payload: what `sched
// retry` does for one task, whatever queued it.
func (c *Client) Retry(ctx context.Context, id string) (Submitted, error) {
	ti, err := c.Find(ctx, id)
	if err != nil {
		return Submitted{}, err
	}
	p, ok := PolicyFor(ti.Type)
	if !ok {
		return Submitted{}, &UnknownKindError{Kind: ti.Type}
	}
	t := asynq.NewTask(ti.Type, ti.Payload, asynq.Queue(p.Queue), asynq.TaskID(id), asynq.Timeout(p.Timeout),
		asynq.MaxRetry(p.queueRetries()), asynq.Retention(p.Retention))
	return c.submit(ctx, t, true)
}

// submit enqueues t; on an id conflict it replaces the archived task (and,
// when person is set, the completed one) or starts a waiting retry, and
// reports any other state as a duplicate. Replacing is delete then
// enqueue: two callers racing see one win and the other a duplicate.
func (c *Client) submit(ctx context.Context, t *asynq.Task, person bool) (Submitted, error) {
	// Every kiln task's id is its content's hash (TaskID).
	id := taskID(t.Type(), t.Payload())
	var s Submitted
	for attempt := 0; ; attempt++ {
		info, err := c.c.EnqueueContext(ctx, t)
		if err == nil {
			s.Info = info
			return s, nil
		}
		if !errors.Is(err, asynq.ErrTaskIDConflict) {
			// A full Redis said in words, not as the queue's "UNKNOWN:
			// redis command error: SADD failed: OOM ...".
			return s, redismem.Wrap("enqueue "+t.Type(), err)
		}
		ti, err := c.Find(ctx, id)
		var nf *NotFoundError
		switch {
		case errors.As(err, &nf) && attempt < 3:
			continue // deleted meanwhile (retention, another replace)
		case err != nil:
			return s, &DuplicateError{ID: id}
		}
		switch {
		case ti.State == asynq.TaskStateArchived || (person && ti.State == asynq.TaskStateCompleted):
			if attempt >= 3 {
				return s, &DuplicateError{ID: id, State: ti.State.String()}
			}
			if err := c.insp.DeleteTask(ti.Queue, id); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
				return s, redismem.Wrap(fmt.Sprintf("enqueue %s again: remove the %s task %s", t.Type(), ti.State, id), err)
			}
			// A cancel mark, and the last report, belong to the ended run
			// of the work, not to the new one.
			cancelled := ti.State == asynq.TaskStateArchived && IsCancelled(ctx, c.rdb, id)
			if err := c.forget(ctx, id); err != nil {
				return s, redismem.Wrap("enqueue "+t.Type()+" again", err)
			}
			s.Was, s.LastErr, s.Cancelled = ti.State.String(), ti.LastErr, cancelled
		case person && ti.State == asynq.TaskStateRetry:
			// A task cancelled while its worker was dead waits here until a
			// worker archives it for the mark; a person running it now means
			// it to run.
			if err := c.rdb.Del(ctx, cancelKey(id)).Err(); err != nil {
				return s, redismem.Wrap("run "+id+" now", err)
			}
			// Read before it runs: the worker that takes it reports anew.
			if p, ok, err := ReadProgress(ctx, c.rdb, id); err == nil && ok {
				s.Reported = p.State
			}
			if err := c.insp.RunTask(ti.Queue, id); err != nil {
				return s, redismem.Wrap("run "+id+" now", err)
			}
			s.Info, s.Was, s.LastErr = ti, "retry", ti.LastErr
			return s, nil
		default:
			return s, &DuplicateError{ID: id, State: ti.State.String()}
		}
	}
}

// BatchResult counts the outcome of EnqueueMany.
type BatchResult struct {
	Enqueued   int
	Duplicates int
}

// EnqueueMany queues many tasks with up to concurrency enqueues in flight.
// asynq has no batch enqueue (each is one Lua script call), so throughput
// comes from overlapping round trips. Duplicates are counted, not errors.
func (c *Client) EnqueueMany(ctx context.Context, args []Args, concurrency int) (BatchResult, error) {
	if concurrency < 1 {
		concurrency = 1
	}
	var (
		mu  sync.Mutex
		res BatchResult
	)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	for _, a := range args {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			_, err := c.Enqueue(gctx, a)
			var dup *DuplicateError
			switch {
			case errors.As(err, &dup):
				mu.Lock()
				res.Duplicates++
				mu.Unlock()
				return nil
			case err != nil:
				return err
			}
			mu.Lock()
			res.Enqueued++
			mu.Unlock()
			return nil
		})
	}
	err := g.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return res, err
}

// NotFoundError is a task id that no queue holds.
type NotFoundError struct{ ID string }

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("task %q not found in queues %v; list tasks with 'sched status' or 'sched runs'", e.ID, Queues)
}
func (e *NotFoundError) BadInput() bool { return true }

// Find returns a task's info from whichever queue holds it.
func (c *Client) Find(ctx context.Context, id string) (*asynq.TaskInfo, error) {
	known, err := c.knownQueues()
	if err != nil {
		return nil, err
	}
	for _, q := range Queues {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !known[q] {
			continue
		}
		ti, err := c.insp.GetTaskInfo(q, id)
		if err == nil {
			return ti, nil
		}
		if !errors.Is(err, asynq.ErrTaskNotFound) {
			return nil, fmt.Errorf("look up task %s: %w", id, err)
		}
	}
	return nil, &NotFoundError{ID: id}
}

// Cancel stops a task so that it never runs again: a waiting one is
// archived; a running one gets its context cancelled (its handler stops at
// a safe point: a training segment checkpoints) and is archived once it
// leaves the active state. asynq moves a cancelled task to retry at once,
// without waiting for its handler, so without the archive it would run
// again after its back-off. The cancel mark outlives the task's longest
// timeout. state is "withdrawn" for a task archived as it waited (never
// begun, or waiting to be tried again), "cancelled" for one stopped, or
// "cancelling" when the task was still
// active after CancelWait (its worker did not answer: it is archived by
// the worker's middleware when the handler returns, or by a later cancel).
func (c *Client) Cancel(ctx context.Context, id string) (state string, err error) {
	ti, err := c.Find(ctx, id)
	if err != nil {
		return "", err
	}
	mark := func() error {
		// The mark tells the worker to archive, not retry, and status and
		// runs to say cancelled, not failed.
		if err := c.rdb.Set(ctx, cancelKey(id), time.Now().Unix(), 8*day).Err(); err != nil {
			return redismem.Wrap("cancel "+id, err)
		}
		return nil
	}
	switch ti.State {
	case asynq.TaskStateActive:
		if err := mark(); err != nil {
			return "", err
		}
		if err := c.insp.CancelProcessing(id); err != nil {
			return "", fmt.Errorf("cancel %s: %w", id, err)
		}
		return c.archiveWhenStopped(ctx, ti.Queue, id)
	case asynq.TaskStatePending, asynq.TaskStateScheduled, asynq.TaskStateRetry, asynq.TaskStateAggregating:
		if err := mark(); err != nil {
			return "", err
		}
		if err := c.insp.ArchiveTask(ti.Queue, id); err != nil {
			return "", fmt.Errorf("cancel %s: %w", id, err)
		}
		return "withdrawn", nil
	default:
		return "", &FinishedError{ID: id, State: ti.State.String()}
	}
}

// Stopping reports whether task id is one `sched cancel` archived whose
// handler has not returned yet (its report reads running, from a worker
// that heartbeats): asynq lets go of a cancelled task as soon as its
// context ends, and its worker still stops it (a segment finishes its
// step and writes that step's checkpoint). The same work queued again
// meanwhile ran beside it, from a checkpoint older than the one the stop
// writes, and the old handler's end read as the new task's failure.
func (c *Client) Stopping(ctx context.Context, id string) (TaskStatus, bool, error) {
	ts, err := c.Task(ctx, id)
	var nf *NotFoundError
	switch {
	case errors.As(err, &nf):
		return ts, false, nil
	case err != nil:
		return ts, false, err
	case ts.State != "archived" || !ts.Cancelled || !ts.HasProgress || ts.Progress.State != "running":
		return ts, false, nil
	}
	servers, err := c.insp.Servers()
	if err != nil {
		return ts, false, fmt.Errorf("list workers: %w", err)
	}
	for _, wp := range workerProcesses(servers) {
		if wp.Name == ts.Progress.Worker {
			return ts, true, nil
		}
	}
	return ts, false, nil
}

// WaitStopped waits while task id is Stopping, calling waiting once, as
// it begins to, and reports whether it waited. A worker that stops
// heartbeating ends the wait as the handler's return does.
func (c *Client) WaitStopped(ctx context.Context, id string, waiting func(TaskStatus)) (bool, error) {
	for waited := false; ; waited = true {
		ts, stopping, err := c.Stopping(ctx, id)
		if err != nil || !stopping {
			return waited, err
		}
		if !waited && waiting != nil {
			waiting(ts)
		}
		select {
		case <-ctx.Done():
			return waited, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CancelWait bounds how long Cancel waits for a running task to leave the
// active state before it reports "cancelling".
var CancelWait = 15 * time.Second

// archiveWhenStopped waits, up to CancelWait, for the task to leave the
// active state and archives it where asynq left it waiting to retry.
func (c *Client) archiveWhenStopped(ctx context.Context, queue, id string) (string, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(CancelWait)
	for {
		ti, err := c.insp.GetTaskInfo(queue, id)
		if err != nil {
			return "", fmt.Errorf("cancel %s: %w", id, err)
		}
		switch ti.State {
		case asynq.TaskStateActive:
		case asynq.TaskStatePending, asynq.TaskStateScheduled, asynq.TaskStateRetry:
			if err := c.insp.ArchiveTask(queue, id); err != nil {
				return "", fmt.Errorf("cancel %s: archive: %w", id, err)
			}
			return "cancelled", nil
		case asynq.TaskStateArchived:
			// The worker archived it on seeing the cancel mark.
			return "cancelled", nil
		default:
			// Finished before the cancel landed.
			return ti.State.String(), nil
		}
		select {
		case <-ctx.Done():
			return "cancelling", ctx.Err()
		case <-deadline:
			return "cancelling", nil
		case <-tick.C:
		}
	}
}

// FinishedError is Cancel's answer for a task that has already ended
// (completed, or archived: failed for good or cancelled). It is not bad
// input: the task does not run, as the cancel asked, and a task that ends
// a moment before its cancel arrives is answered so, as one that ends
// while the cancel waits is.
type FinishedError struct{ ID, State string }

func (e *FinishedError) Error() string {
	return fmt.Sprintf("task %s is already %s; nothing to cancel", e.ID, e.State)
}

// jitter spreads d by ±20% so retries of many tasks do not arrive together.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// RetryDelay is the asynq RetryDelayFunc for kiln: per-kind exponential
// backoff with jitter. Unknown kinds get a short delay; they are archived
// by the worker anyway.
func RetryDelay(n int, err error, t *asynq.Task) time.Duration {
	p, ok := PolicyFor(t.Type())
	if !ok || p.Backoff <= 0 {
		return jitter(10 * time.Second)
	}
	d := p.Backoff
	for i := 0; i < n && d < p.MaxBackoff; i++ {
		d *= 2
	}
	if p.MaxBackoff > 0 && d > p.MaxBackoff {
		d = p.MaxBackoff
	}
	return jitter(d)
}
