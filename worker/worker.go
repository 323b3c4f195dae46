// Package worker runs kiln's asynq servers: it serves the queues it is
// given, dispatches each task to the handler registered for its kind,
// logs, recovers panics, publishes progress, and drains on shutdown so that
// no task is lost.
package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/redact"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
)

// Params configures a Worker. Zero values take the defaults noted.
type Params struct {
	// Redis is the queue's connection (required).
	Redis asynq.RedisConnOpt
	// Handlers are the handlers of the kinds this worker serves (required).
	Handlers Handlers
	// Redact hides the configuration's secrets (the Redis password, the S3
	// secret key, HF_TOKEN) in what a task's error and progress say, which
	// the log, Redis and sched status show: a library or a server may quote
	// one (nil: nothing is hidden).
	Redact func(string) string
	// Queues maps queue name to concurrency, e.g. {"ingest": 4}. Each
	// queue gets its own asynq server, so a concurrency is a hard bound for
	// that queue: "gpu": 1 means one training segment at a time whatever
	// else the worker serves.
	Queues map[string]int
	// ShutdownGrace is how long in-flight tasks get, after shutdown begins,
	// to reach a safe point and return; after it they are re-queued as they
	// are. Default scheduler.DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// Logger receives structured logs. Default zap.NewNop().
	Logger *zap.Logger
	// Name identifies this worker in progress records. Default host:pid.
	Name string
	// DelayedTaskCheckInterval is how often retried tasks are moved back to
	// pending. Default 5s (asynq's).
	DelayedTaskCheckInterval time.Duration
	// ProgressEvery throttles progress writes. Default 1s.
	ProgressEvery time.Duration
	// Isolate, when set, runs each task of some queues in a child process
	// of its own (see Isolation); the others run in this process.
	Isolate *Isolation
	// TaskCheckInterval is how long an idle server waits before it looks
	// for new tasks again. asynq's 1s default adds up to a second to every
	// task that arrives at an idle worker, which is most of a short task's
	// latency. Default 100ms: about ten polls a second per idle queue, which
	// Redis does not notice.
	TaskCheckInterval time.Duration
	// CancelCheckEvery is how often a running task's cancel mark is read,
	// for a `sched cancel` whose message reached no subscription of this
	// worker's (it was connecting or reconnecting to Redis as the cancel
	// was published). Default DefaultCancelCheckEvery.
	CancelCheckEvery time.Duration
	// AppendClaim is this worker's claim on the append queue (ClaimAppend),
	// required where the worker serves it outside a test. Should a worker
	// of another disk take it, this worker stops serving append and
	// re-queues the appends it runs, for that worker: two disks appending
	// the same stores would split them. Where Handlers.Ingest's Pipeline
	// has no Lease, its appends take the claim's Until: they write no
	// status once the claim may have lapsed.
	AppendClaim *AppendClaim
	// Build is the build this worker publishes in Redis while it runs
	// (BuildKey), which `sched status` compares with its own. Default
	// ThisBuild().
	Build Build
}

// DefaultCancelCheckEvery is Params.CancelCheckEvery's default: well
// inside the 15 s `sched cancel` waits for a task to stop, at one read of
// Redis a running task.
const DefaultCancelCheckEvery = 3 * time.Second

// DefaultTaskCheckInterval is Params.TaskCheckInterval's default.
const DefaultTaskCheckInterval = 100 * time.Millisecond

// Worker is a set of asynq servers sharing one drain signal.
type Worker struct {
	p       Params
	set     handlerSet
	iso     *Isolation
	rdb     redis.UniversalClient
	servers []*asynq.Server
	// queues[i] is the queue servers[i] serves.
	queues []string
	// drain is cancelled when shutdown begins; it cancels every handler's
	// context, so handlers learn of a SIGTERM at once and have the whole
	// grace period to reach a safe point.
	drain       context.Context
	cancelDrain context.CancelFunc
	// queueDrain[q] is drain for the handlers of queue q, which one queue
	// alone can end too (stopServing), with its cause.
	queueDrain map[string]context.Context
	stopQueue  map[string]context.CancelCauseFunc
	// shutdowns are the servers of queues stopped alone (stopServing)
	// still shutting down.
	shutdowns sync.WaitGroup
	// slots bound each queue's running handlers to its concurrency. asynq
	// frees a task's place as soon as the task's context is cancelled
	// (sched cancel), while its handler still writes its stop checkpoint;
	// without the slot the next gpu task would start beside it, two CUDA
	// contexts on a card sized for one.
	slots map[string]chan struct{}
	// down folds the task queue's errors while Redis does not answer, or
	// refuses writes because it is full.
	down *redisDown
	// procName is this process as asynq's heartbeat names it (host:pid),
	// the name its build is published under.
	procName string
}

// MaxConcurrency bounds the tasks a worker runs at once from one queue.
const MaxConcurrency = 256

// ParseQueues reads "ingest=4,append=2,gpu=1".
func ParseQueues(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, n, ok := strings.Cut(part, "=")
		if !ok {
			n = "1"
		}
		c, err := strconv.Atoi(n)
		if err != nil || c < 1 {
			return nil, fmt.Errorf("queue %q: concurrency %q is not a positive number (want e.g. ingest=4,append=2,gpu=1)", name, n)
		}
		if !validQueue(name) {
			return nil, fmt.Errorf("unknown queue %q (queues: %s)", name, strings.Join(scheduler.Queues, ", "))
		}
		if _, twice := out[name]; twice {
			return nil, fmt.Errorf("queue %q is given twice: give each queue once, e.g. ingest=4,append=2,gpu=1", name)
		}
		if c > MaxConcurrency {
			return nil, fmt.Errorf("%s=%d: at most %d tasks of a queue at once (an ingest task keeps a CPU core busy: about one a core is the most that pays)", name, c, MaxConcurrency)
		}
		if name == scheduler.QueueGPU && c > 1 {
			return nil, fmt.Errorf("gpu=%d: the gpu queue runs one task at a time, since a training segment or a bench takes all of the worker's GPUs; to train a run on several GPUs set gpus: N in the run, or KILN_GPUS (docs/operations.md, \"Several GPUs\")", c)
		}
		out[name] = c
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no queues given (want e.g. ingest=4,append=2,gpu=1)")
	}
	return out, nil
}

func validQueue(q string) bool {
	for _, k := range scheduler.Queues {
		if q == k {
			return true
		}
	}
	return false
}

// New builds a worker; Run starts it.
func New(p Params) (*Worker, error) {
	if p.Redis == nil {
		return nil, errors.New("worker: Params.Redis is required")
	}
	if len(p.Queues) == 0 {
		return nil, errors.New("worker: Params.Queues is empty")
	}
	if p.AppendClaim != nil && p.Queues[scheduler.QueueAppend] == 0 {
		return nil, errors.New("worker: Params.AppendClaim is set but the append queue is not in Params.Queues")
	}
	if c := p.AppendClaim; c != nil && p.Handlers.Ingest != nil && p.Handlers.Ingest.Pipeline.Lease == nil {
		// The appends speak for the stores only while the claim surely
		// holds. A copy: the caller's Pipeline may be in use (its store
		// watch), and is the caller's to fence from the start.
		in := *p.Handlers.Ingest
		in.Pipeline.Lease, in.claim = c.Until, c
		p.Handlers.Ingest = &in
	}
	set, err := p.Handlers.build()
	if err != nil {
		return nil, err
	}
	var iso *Isolation
	if p.Isolate != nil {
		if iso, err = p.Isolate.resolve(); err != nil {
			return nil, err
		}
	}
	inProcess := map[string]int{}
	for q, n := range p.Queues {
		if !iso.isolates(q) {
			inProcess[q] = n
		}
	}
	// An isolated queue's handlers are its children's.
	if err := set.checkQueues(inProcess); err != nil {
		return nil, err
	}
	if p.ShutdownGrace <= 0 {
		p.ShutdownGrace = scheduler.DefaultShutdownGrace
	}
	if p.Logger == nil {
		p.Logger = zap.NewNop()
	}
	if p.Name == "" {
		host, _ := os.Hostname()
		p.Name = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if p.ProgressEvery <= 0 {
		p.ProgressEvery = time.Second
	}
	if p.TaskCheckInterval <= 0 {
		p.TaskCheckInterval = DefaultTaskCheckInterval
	}
	if p.CancelCheckEvery <= 0 {
		p.CancelCheckEvery = DefaultCancelCheckEvery
	}
	if p.Build.Version == "" {
		p.Build = ThisBuild()
	}
	w := &Worker{p: p, set: set, iso: iso, rdb: p.Redis.MakeRedisClient().(redis.UniversalClient), procName: processName()}
	w.drain, w.cancelDrain = context.WithCancel(context.Background())
	w.slots = map[string]chan struct{}{}
	w.queueDrain, w.stopQueue = map[string]context.Context{}, map[string]context.CancelCauseFunc{}
	w.down = newRedisDown(p.Logger, redisAddr(p.Redis), func(ctx context.Context) error { return probeWrite(ctx, w.rdb) })
	for q, n := range p.Queues {
		w.slots[q] = make(chan struct{}, n)
		w.queueDrain[q], w.stopQueue[q] = context.WithCancelCause(w.drain)
		w.queues = append(w.queues, q)
		w.servers = append(w.servers, asynq.NewServer(p.Redis, asynq.Config{
			Concurrency:              n,
			Queues:                   map[string]int{q: 1},
			ShutdownTimeout:          p.ShutdownGrace + WrapUp,
			RetryDelayFunc:           retryDelay,
			IsFailure:                isFailure,
			DelayedTaskCheckInterval: p.DelayedTaskCheckInterval,
			TaskCheckInterval:        p.TaskCheckInterval,
			Logger:                   asynqLogger{p.Logger.Sugar().With("queue", q), w.down},
			LogLevel:                 asynq.WarnLevel,
		}))
	}
	return w, nil
}

// WrapUp is how long past its ShutdownGrace a worker's shutdown waits for
// its handlers before asynq re-queues what still runs: a task's process
// is killed at the grace, and its handler then says so, and what that
// lost, in the task's progress. Were asynq's wait the grace alone, it
// would end with the kill, and the worker with it, before those words
// were written: the task would read as queued, its last report that of a
// process still training.
const WrapUp = 10 * time.Second

// Run serves until ctx ends, then drains: handlers see their context
// cancelled and get ShutdownGrace to return (a task's process is killed
// then), and WrapUp more to report it; what is still running after that
// is re-queued by asynq. Shutdown order: stop fetching, cancel
// handlers, wait, delete the build's key, close Redis. The build is
// published before the servers start and deleted after they stopped, so
// that a server the heartbeat lists has its build beside it.
func (w *Worker) Run(ctx context.Context) error {
	stopBuild := w.keepBuild()
	for i, s := range w.servers {
		h := w.middleware(mux{w.set})
		if w.iso.isolates(w.queues[i]) {
			h = w.middleware(isolated{w})
		}
		if err := s.Start(h); err != nil {
			for _, started := range w.servers[:i] {
				started.Shutdown()
			}
			stopBuild()
			return fmt.Errorf("start worker: %w", err)
		}
	}
	w.p.Logger.Info("worker started", zap.Any("queues", w.p.Queues), zap.Strings("handlers", w.set.kinds()), zap.String("name", w.p.Name), zap.Stringer("build", w.p.Build))
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if c := w.p.AppendClaim; c != nil {
			select {
			case <-c.Lost():
				w.stopServing(scheduler.QueueAppend, &claimLostError{c.LostTo()})
			case <-w.drain.Done():
			}
		}
	}()
	<-ctx.Done()
	w.p.Logger.Info("worker draining", zap.Duration("grace", w.p.ShutdownGrace))
	for _, s := range w.servers {
		s.Stop()
	}
	w.cancelDrain()
	<-watched
	done := make(chan struct{})
	for _, s := range w.servers {
		go func() { s.Shutdown(); done <- struct{}{} }()
	}
	for range w.servers {
		<-done
	}
	w.shutdowns.Wait()
	stopBuild()
	w.down.close()
	w.p.Logger.Info("worker stopped")
	return w.rdb.Close()
}

// redacted is err with Params.Redact's secrets hidden in its text; it
// wraps err still, so that errors.Is and errors.As see what it was.
func (w *Worker) redacted(err error) error {
	if w.p.Redact == nil {
		return err
	}
	return redact.Err(err, w.p.Redact)
}

// stopServing stops queue q alone while the worker's other queues go on:
// its server takes no new task, and its running handlers' contexts end
// with cause, so that they stop at a safe point and are re-queued, as at
// a shutdown, for another worker to run.
func (w *Worker) stopServing(q string, cause error) {
	w.p.Logger.Warn("this worker stops serving queue "+q+"; its running tasks stop at a safe point and are re-queued",
		zap.String("queue", q), zap.NamedError("why", cause))
	var stopped []*asynq.Server
	for i, s := range w.servers {
		if w.queues[i] == q {
			s.Stop()
			stopped = append(stopped, s)
		}
	}
	if stop := w.stopQueue[q]; stop != nil {
		stop(cause)
	}
	// Shut down once its handlers have stopped: its heartbeat, which
	// `sched status` lists the worker's queues from, goes with it.
	for _, s := range stopped {
		w.shutdowns.Add(1)
		go func() {
			defer w.shutdowns.Done()
			s.Shutdown()
		}()
	}
}

// claimLostError is why a worker stopped serving append: another disk's
// worker claimed it.
type claimLostError struct{ to AppendHolder }

func (e *claimLostError) Error() string {
	return "the append claim was lost to the worker on " + e.to.String()
}

// interruptedError is a handler's error after shutdown began, or after its
// queue alone stopped: the work stopped at a safe point and must run
// again, which is not a failure, so it does not use up a retry.
type interruptedError struct {
	err error
	// by is what stopped it; nil: the worker's shutdown.
	by error
	// said, where set, says what became of it in err's place (a task's
	// process killed at the grace: stoppedSays).
	said string
}

func (e *interruptedError) Error() string {
	what := e.err.Error()
	if e.said != "" {
		what = e.said
	}
	if e.by != nil {
		return "interrupted (" + e.by.Error() + "): " + what
	}
	return scheduler.InterruptedBy + ": " + what
}
func (e *interruptedError) Unwrap() error { return e.err }

// WaitError is a handler's answer when its task needs earlier work that is
// queued or running and not yet done (an ingest whose tokenizer is still
// being trained, a run whose stores are still being filled): the task is
// tried again after Every, for as long as it takes, without using up a
// retry, and `sched status` shows what it waits for.
type WaitError struct {
	// For says what the task waits for, e.g. "the ingest of store
	// fineweb-edu (412 tasks left)".
	For string
	// Every is how long until the task looks again. Default 30s.
	Every time.Duration
}

func (e *WaitError) Error() string { return "waiting for " + e.For }

// DefaultWaitEvery is WaitError.Every's default.
const DefaultWaitEvery = 30 * time.Second

// outageWait makes a task's error that is the object store out of service
// (store.Unreachable) a *WaitError: an outage is no fault of the task, and
// a month-long run whose segment starts while the store is down for an
// hour would otherwise use up its retries and be archived. The task is
// tried again every DefaultWaitEvery until the store answers, and `sched
// status` shows it waiting for it. Other errors are returned as they are.
//
// The store refusing the worker's keys is waited out the same way: this
// worker began with keys the store took (its start checks them), so they
// were rotated or revoked since, which no retry mends, and a month-long
// run would be archived after its retries' back-offs, some 20 minutes.
// The task waits until the worker is restarted with keys the store takes
// (the restart re-queues it) or the store takes these again.
func outageWait(err error) error {
	var se *store.S3Error
	if !errors.As(err, &se) {
		return err
	}
	switch {
	case store.Unreachable(err):
		return &WaitError{For: fmt.Sprintf("the object store at %s to answer (%s)", se.Store, store.Outage(err))}
	case store.KeysRefused(err) != "":
		// Short enough that sched status's line of the run holds it whole.
		return &WaitError{For: fmt.Sprintf("the object store at %s to take this worker's keys (%s): set KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY and restart the worker", se.Store, store.KeysRefused(err))}
	}
	return err
}

func isFailure(err error) bool {
	var ie *interruptedError
	var we *WaitError
	return !errors.As(err, &ie) && !errors.As(err, &we)
}

// retryDelay re-runs interrupted work at once, waiting work after its
// interval, and backs off otherwise.
func retryDelay(n int, err error, t *asynq.Task) time.Duration {
	var ie *interruptedError
	if errors.As(err, &ie) {
		return 0
	}
	var we *WaitError
	if errors.As(err, &we) {
		if we.Every <= 0 {
			return DefaultWaitEvery
		}
		return we.Every
	}
	return scheduler.RetryDelay(n, err, t)
}

// middleware wraps every handler: progress reporter in the context, panic
// recovery, logging with task id and kind, and the mapping of errors after
// shutdown or `sched cancel`, and of an ingest's limit to completion.
func (w *Worker) middleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) (err error) {
		id, _ := asynq.GetTaskID(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		drain := w.drain
		if q, ok := asynq.GetQueueName(ctx); ok && w.queueDrain[q] != nil {
			drain = w.queueDrain[q]
		}
		log := w.p.Logger.With(zap.String("task_id", id), zap.String("kind", t.Type()), zap.Int("retried", retried))
		ttl := 7 * 24 * time.Hour
		if p, ok := scheduler.PolicyFor(t.Type()); ok {
			ttl = p.Retention
		}
		start := time.Now()
		rep := &Reporter{rdb: w.rdb, log: log, ttl: ttl, every: w.p.ProgressEvery, redact: w.p.Redact,
			p: scheduler.Progress{TaskID: id, Kind: t.Type(), Fraction: -1, State: "running", Worker: w.p.Name, Started: start, Updated: start}}
		// A task found cancelled as it starts is not run (below), and
		// its progress is its last attempt's, which its end keeps.
		notAgain := scheduler.IsCancelled(ctx, w.rdb, id)
		if !notAgain {
			rep.write(ctx, rep.p)
		}
		ctx = context.WithValue(ctx, reporterKey{}, rep)
		// The handler's context ends when shutdown begins. asynq's own
		// context is left alone: were it cancelled, asynq would treat the
		// task as failed at once, while the handler is still saving state.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(drain, cancel)
		defer stop()
		if !notAgain {
			defer w.watchCancel(ctx, id, cancel)()
		}
		log.Info("task started")

		// Registered first, so run last: once the task's end is said, and
		// before asynq records it.
		defer w.holdForRedis(rep, log)
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("task %s panicked: %v", t.Type(), r)
				log.Error("task panicked", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			}
			err = w.redacted(err)
			err = outageWait(err)
			limitMsg, taken := atLimit(err)
			// ended is the handler's own error, which a cancel's words
			// replace.
			ended, cancelled, kept := err, false, false
			switch {
			case err == nil:
				rep.finish("done", "")
				log.Info("task done", zap.Duration("took", time.Since(start)))
				return
			case limitMsg != "":
				err = nil
				rep.took(taken)
				rep.finish("stopped", limitMsg)
				log.Info("task done: the ingest reached its limit", zap.String("reason", limitMsg), zap.Duration("took", time.Since(start)))
				return
			case drain.Err() != nil && !errors.Is(err, asynq.SkipRetry):
				ie := &interruptedError{err: err}
				if w.drain.Err() == nil {
					ie.by = context.Cause(drain)
				}
				if stopped := (*stoppedProcessError)(nil); errors.As(err, &stopped) {
					ie.said = w.stoppedSays(context.WithoutCancel(ctx), t, stopped, lastReport(rep))
				}
				err = ie
				rep.finish("interrupted", err.Error())
				log.Warn("task interrupted; re-queued", zap.Error(err))
				return
			case errors.As(err, new(*WaitError)):
				rep.finish("waiting", err.Error())
				log.Info("task waits; tried again later", zap.Error(err))
				return
			case scheduler.IsCancelled(context.Background(), w.rdb, id):
				// An earlier attempt's end says more than this one's.
				kept = errors.Is(ended, errNotStartedAgain) && w.endedBefore(ctx, rep)
				err = &cancelledError{said: w.cancelledSays(context.WithoutCancel(ctx), t, id, ended, lastReport(rep)), err: ended}
				cancelled = true
			}
			if !kept {
				rep.finish("failed", err.Error())
			}
			switch {
			case cancelled && errors.As(ended, new(*stoppedProcessError)):
				// Asked for, but what the task had not saved is lost.
				log.Warn("task cancelled by sched cancel; its process was killed at the grace, or died, before it stopped",
					zap.String("outcome", err.Error()), zap.NamedError("ended_with", ended), zap.Duration("took", time.Since(start)))
			case cancelled:
				// Asked for, not gone wrong: no error in the log.
				log.Info("task cancelled by sched cancel", zap.String("outcome", err.Error()), zap.NamedError("ended_with", ended), zap.Duration("took", time.Since(start)))
			default:
				log.Error("task failed", zap.Error(err), zap.Duration("took", time.Since(start)))
			}
			// A failure at the kind's MaxRetry is archived here: asynq,
			// which would archive any error at its own, interrupted and
			// waiting ones too, holds one more (scheduler.Options).
			if maxRetry, ok := asynq.GetMaxRetry(ctx); ok && !errors.Is(err, asynq.SkipRetry) && retried >= scheduler.Retries(t.Type(), maxRetry) {
				err = fmt.Errorf("%w (%w)", err, asynq.SkipRetry)
			}
			if errors.Is(err, asynq.SkipRetry) {
				q, _ := asynq.GetQueueName(ctx)
				w.taskArchived(ctx, q, id)
			}
		}()
		// `sched cancel` of a task whose worker had stopped answering
		// reaches no handler: asynq's recoverer brings the task back with
		// the cancel's mark on it; and a handler that a cancel stopped
		// may be tried again by asynq before the cancel archives it. It
		// is archived here, not run again (enqueuing the work again, or
		// sched retry, clears the mark).
		if notAgain {
			return errNotStartedAgain
		}
		if err := diedInLastRetry(ctx, t.Type(), id, retried); err != nil {
			return err
		}
		if q, ok := asynq.GetQueueName(ctx); ok && w.slots[q] != nil {
			select {
			case w.slots[q] <- struct{}{}:
			default:
				rep.Message(ctx, "waiting for the "+q+" queue's previous task to finish stopping")
				select {
				case w.slots[q] <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			defer func() { <-w.slots[q] }()
		}
		return next.ProcessTask(ctx, t)
	})
}

// watchCancel reads task id's cancel mark every CancelCheckEvery until
// the returned function is called, and calls cancel once it is there.
// `sched cancel` marks the task, then publishes the cancel, which asynq's
// subscription hands to the task's handler; a publish while the worker's
// subscription is not live (connecting at its start, or again after a
// connection to Redis dropped) reaches no one, and the task ran on, the
// cancel answered "cancelling". The mark stays: the task stops once it is
// read, as if the message had come.
func (w *Worker) watchCancel(ctx context.Context, id string, cancel context.CancelFunc) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(w.p.CancelCheckEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if scheduler.IsCancelled(ctx, w.rdb, id) {
					cancel()
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// RedisEndWait bounds how long a task's end is held back while Redis does
// not answer (holdForRedis): under the task's lease in the queue (30 s),
// which the worker renews only while Redis answers, so that asynq's own
// record of the end still finds the task its worker's.
const RedisEndWait = 20 * time.Second

// holdForRedis holds a task's end back from asynq while Redis does not
// answer (or refuses writes), for up to RedisEndWait. asynq records a
// task's end (done, failed, to retry) in one write; where that write
// fails, its later tries all fail at once (asynq v0.26.0 hands them a
// context it has already cancelled), so the task stays active until its
// lease lapses, and a recoverer runs it again, minutes later, as a
// failure that uses a retry, for work that had ended: `sched status`
// meanwhile reads it as running, then as its worker lost. Held until Redis
// answers, the end is recorded as it was. The task's last state, whose
// own write failed, is written again first.
func (w *Worker) holdForRedis(rep *Reporter, log *zap.Logger) {
	answers := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return probeWrite(ctx, w.rdb) == nil
	}
	if answers() {
		return
	}
	log.Warn("the task ended while Redis does not answer: its end is recorded in the queue once Redis answers", zap.Duration("wait_at_most", RedisEndWait))
	for deadline := time.Now().Add(RedisEndWait); time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		if answers() {
			rep.publish(context.Background())
			log.Info("Redis answers again: the task's end is recorded in the queue")
			return
		}
	}
	log.Warn("Redis did not answer within the wait: the task's end is left to the queue, which runs it again once its lease lapses", zap.Duration("waited", RedisEndWait))
}

// errNotStartedAgain is the end of a task found cancelled as it starts: a
// worker took it back from one that stopped answering, or asynq tried it
// again before the cancel archived it.
var errNotStartedAgain = errors.New("not started again")

// cancelledError is the end of a task that `sched cancel` stopped: what
// it says of it (cancelledSays), which sched status and sched runs show,
// with the handler's own error kept for errors.Is and the log. It is
// final: the task is archived, not retried.
type cancelledError struct {
	said string
	err  error
}

func (e *cancelledError) Error() string   { return e.said }
func (e *cancelledError) Unwrap() []error { return []error{e.err, asynq.SkipRetry} }

// stoppedProcessError is the end of a task run in a child process
// (Isolation) that was asked to stop and ended without handing back an
// outcome: killed, where it did not stop within ShutdownGrace (grace), or
// dead on its own meanwhile, exit saying how. Either way, what it had not
// saved is lost, a training segment's steps since its last checkpoint,
// and no stop of its own says where it stopped. Its text is err's.
type stoppedProcessError struct {
	err    error
	exit   string
	killed bool
	grace  time.Duration
}

func (e *stoppedProcessError) Error() string { return e.err.Error() }
func (e *stoppedProcessError) Unwrap() error { return e.err }

// cancelledSays is what a task that `sched cancel` stopped says of its
// end, for sched status and sched runs, in place of the handler's error
// (a stop's "context canceled" says nothing to a person): that the cancel
// stopped it; where it had got to, where known (a training segment's step
// and checkpoint, from its run's state; another task's last report, last);
// what its stop lost, where the worker killed it at the grace, or the
// handler's error where it ended with another than the stop's; and, as its
// last "; " clause, which status keeps when it cuts the line, what runs it
// again (scheduler.RedoCancelled).
func (w *Worker) cancelledSays(ctx context.Context, t *asynq.Task, id string, ended error, last string) string {
	redo := scheduler.RedoCancelled(t.Type(), id, t.Payload())
	var stopped *stoppedProcessError
	if errors.As(ended, &stopped) {
		return scheduler.CancelledBy + ": " + w.stoppedSays(ctx, t, stopped, last) + "; " + redo
	}
	var said string
	if errors.Is(ended, errNotStartedAgain) {
		said = scheduler.CancelledBy + ": not started again" + lastReportSays(last)
	} else if st, ok := w.segmentState(ctx, t); ok {
		said = fmt.Sprintf("%s at step %d of %d", scheduler.CancelledBy, st.Step, st.Total)
		switch {
		case besidesStop(ended) != "":
			said += " (" + storedCheckpoint(st) + ")"
		case st.Checkpoint == st.Step:
			said += ", whose checkpoint is in object storage"
		default:
			// A stop at a step boundary writes that step's checkpoint;
			// its upload did not end within the grace.
			said += fmt.Sprintf(", whose checkpoint is on the disk of worker %s only (%s)", w.p.Name, storedCheckpoint(st))
		}
	} else {
		said = scheduler.CancelledBy + lastReportSays(last)
	}
	if rest := besidesStop(ended); rest != "" && !errors.Is(ended, errNotStartedAgain) {
		said += ", ending with: " + scheduler.OneLine(rest, 300)
	}
	return said + "; " + redo
}

// stoppedSays is what a task whose process was asked to stop and ended
// without its outcome (stopped) says of that end: that it was killed at
// the grace, or died, and what that lost, with where a training segment
// had got to (the step it had reached, object storage's newest
// checkpoint), or another task's last report.
func (w *Worker) stoppedSays(ctx context.Context, t *asynq.Task, stopped *stoppedProcessError, last string) string {
	said := fmt.Sprintf("its process outlasted the worker's grace (KILN_SHUTDOWN_GRACE, %s) and was killed", stopped.grace)
	lost := ", losing the steps since its last checkpoint"
	if !stopped.killed {
		said = fmt.Sprintf("its process ended as it stopped, without saying where (%s)", scheduler.OneLine(stopped.exit, 120))
		lost = ", so the steps since its last checkpoint may be lost"
	}
	if st, ok := w.segmentState(ctx, t); ok {
		return said + fmt.Sprintf("%s (it had reached step %d of %d; %s)", lost, st.Step, st.Total, storedCheckpoint(st))
	} else if t.Type() == scheduler.KindTrainSegment {
		return said + lost
	}
	return said + lastReportSays(last)
}

// lastReportSays is the clause that gives a stopped task's last report,
// last, where it made one.
func lastReportSays(last string) string {
	if last == "" {
		return ""
	}
	return " (its last report: " + scheduler.OneLine(last, 120) + ")"
}

// segmentState is the state of the run a training segment trains, as it
// recorded it in Redis; ok is false for another task, and where none is
// recorded or it cannot be read. Its Step is the step the run has
// reached, as `sched status` reads it: the state's step, which is written
// at most once a second, or its checkpoint's, where that is newer.
func (w *Worker) segmentState(ctx context.Context, t *asynq.Task) (scheduler.RunState, bool) {
	if t.Type() != scheduler.KindTrainSegment {
		return scheduler.RunState{}, false
	}
	a, err := scheduler.DecodeTask[scheduler.TrainSegment](t.Payload())
	if err != nil || a.Run == "" {
		return scheduler.RunState{}, false
	}
	st, ok, err := scheduler.ReadRunState(ctx, w.rdb, a.Run)
	st.Step = max(st.Step, st.Checkpoint)
	return st, ok && err == nil
}

// storedCheckpoint names a run's newest checkpoint in object storage.
func storedCheckpoint(st scheduler.RunState) string {
	if st.Checkpoint < 0 {
		return "object storage holds no checkpoint of it yet"
	}
	return fmt.Sprintf("object storage's newest checkpoint: step %d", st.Checkpoint)
}

// besidesStop is what a handler's error says besides the stop a cancel
// asks for (the context's error, with what the handler was doing, a line
// of its own where errors.Join put a failure beside it: a stop checkpoint
// not written), its lines joined by "; "; "" where the stop is all of it.
// An isolated task's error comes back as text.
func besidesStop(err error) string {
	var rest []string
	for _, l := range strings.Split(err.Error(), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasSuffix(l, context.Canceled.Error()) {
			rest = append(rest, l)
		}
	}
	return strings.Join(rest, "; ")
}

// endedBefore reports whether the task rep reports on, found cancelled as
// it started and not run, ended in an earlier attempt, which said how in
// its progress (where it stopped, what it lost): asynq may try a task
// that a cancel stopped again before the cancel archives it, and that
// try's end must not say less in its place. Where the earlier attempt
// still reads running (its handler still stops, and says how when it
// ends; or its worker died), rep takes its last report, for the end the
// caller writes.
func (w *Worker) endedBefore(ctx context.Context, rep *Reporter) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	p, ok, err := scheduler.ReadProgress(ctx, w.rdb, rep.p.TaskID)
	if err == nil && ok && p.State != "running" {
		return true
	}
	rep.adopt(ctx)
	return false
}

// lastReport is the message a task last reported (an isolated task's
// child's, once adopted).
func lastReport(rep *Reporter) string {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.p.Message
}

// diedInLastRetry archives a task whose worker stopped answering (a kill,
// an OOM kill, a power loss) during the retry that was its kind's last.
// Only asynq's recoverer brings a task back with more retries used than
// its kind has: a failure at the last is archived by the middleware, and a
// stop or a wait uses none. asynq holds one retry more than the kind
// (scheduler.Options), so that a stop after the last failure re-queues;
// without this a death would use that one too, and a stop after it would
// archive the task.
func diedInLastRetry(ctx context.Context, kind, id string, retried int) error {
	queued, ok := asynq.GetMaxRetry(ctx)
	if !ok {
		return nil
	}
	if max := scheduler.Retries(kind, queued); retried > max {
		return fmt.Errorf("its worker stopped answering (killed, or cut off from Redis) while it ran with no retry left (its kind has %d), so it is archived, not run again; `sched retry %s` runs it again (%w)",
			max, id, asynq.SkipRetry)
	}
	return nil
}

// asynqLogger routes asynq's own logs into zap, leaving out its warnings
// and errors that only repeat that Redis does not answer, or is full
// (redisDown says that).
type asynqLogger struct {
	s    *zap.SugaredLogger
	down *redisDown
}

func (l asynqLogger) Debug(args ...any) { l.s.Debug(args...) }
func (l asynqLogger) Info(args ...any)  { l.s.Info(args...) }
func (l asynqLogger) Warn(args ...any) {
	if !l.down.hide(fmt.Sprint(args...)) {
		l.s.Warn(args...)
	}
}
func (l asynqLogger) Error(args ...any) {
	if !l.down.hide(fmt.Sprint(args...)) {
		l.s.Error(args...)
	}
}
func (l asynqLogger) Fatal(args ...any) { l.s.Fatal(args...) }

// redisAddr names the Redis that opt reaches, for the log (no password).
func redisAddr(opt asynq.RedisConnOpt) string {
	switch o := opt.(type) {
	case asynq.RedisClientOpt:
		return o.Addr
	case asynq.RedisFailoverClientOpt:
		return "sentinel master " + o.MasterName
	case asynq.RedisClusterClientOpt:
		return strings.Join(o.Addrs, ",")
	}
	return fmt.Sprintf("%T", opt)
}
