package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kiln-lm/kiln/scheduler"
)

// Isolation runs each task of some queues in a child process of its own,
// so that a fault no recover can catch (Go's fatal out-of-memory, a CUDA
// fault, an abort, os.Exit) ends that task's process and not the worker
// and the tasks beside it. The child reads the task on its standard input,
// runs its handler (ServeTask), writes progress to Redis itself, and hands
// its outcome back on file descriptor 3; the worker maps it to the task's
// error, SkipRetry and waiting included. A stop (shutdown, `sched cancel`,
// the task's timeout) reaches the child as SIGTERM, and it gets the
// worker's ShutdownGrace to reach its safe point before it is killed.
//
// A child that dies without an outcome crashed. Crashes are counted per
// task id in Redis, so the count survives a restart of the worker; a task
// whose process died twice in one queued life is archived as a poison
// task. A queued life runs from the task's enqueue (Enqueue, Again, sched
// retry: a task id queued anew, its retry count at 0) until it completes
// or is archived (failed for good, poison, cancelled): a task cancelled
// after a crash and enqueued again starts with no crash against it, while
// a retry, whichever worker runs it, keeps its count. A worker that dies
// itself loses its children with it (they get SIGKILL on Linux) and its
// tasks come back through asynq's lease, as they would in process.
//
// What a child leaves behind when it ends (a shell's background job, a
// helper it started) is killed with it, on Linux, where the child leads a
// process group of its own: such a process holds the child's output and
// outcome pipes open, and the worker, which reads them to their end,
// would wait for it, its task reading as running until it ended, an hour
// or never, and the queue's slot held meanwhile. One that left the group
// is waited for OutputWait at most.
type Isolation struct {
	// Queues are the queues whose tasks each run in a child (required).
	Queues []string
	// Command is the child's program and arguments (required): one that
	// calls ServeTask with handlers of the queues' kinds, such as the same
	// binary with a hidden subcommand.
	Command []string
	// Env is added to the worker's environment for the child.
	Env []string
	// Output receives the child's standard output and error (its logs).
	// Default os.Stderr.
	Output io.Writer
	// CrashTTL is how long a crash is remembered against its task id.
	// Default DefaultCrashTTL.
	CrashTTL time.Duration
	// OutputWait bounds how long, once a child has ended, the worker
	// waits for the rest of its output and outcome, which is in their
	// pipes by then unless a process it left behind, outside its process
	// group, holds them open. Default DefaultOutputWait.
	OutputWait time.Duration
}

// DefaultOutputWait is Isolation.OutputWait's default: what an ended
// child wrote is read in well under a millisecond.
const DefaultOutputWait = 5 * time.Second

// DefaultCrashTTL is Isolation.CrashTTL's default: longer than a task's
// retries take, so that two crashes a day apart still make it poison.
const DefaultCrashTTL = 7 * 24 * time.Hour

// PoisonCrashes is how many deaths of its process in one queued life
// archive a task.
const PoisonCrashes = 2

func (iso *Isolation) resolve() (*Isolation, error) {
	r := *iso
	if len(r.Queues) == 0 {
		return nil, errors.New("worker: Params.Isolate.Queues is empty: name the queues whose tasks run in a child process")
	}
	for _, q := range r.Queues {
		if !validQueue(q) {
			return nil, fmt.Errorf("worker: Params.Isolate.Queues: unknown queue %q", q)
		}
	}
	if len(r.Command) == 0 || r.Command[0] == "" {
		return nil, errors.New("worker: Params.Isolate.Command is required: the program that runs one task (ServeTask)")
	}
	if r.Output == nil {
		r.Output = os.Stderr
	}
	if r.CrashTTL <= 0 {
		r.CrashTTL = DefaultCrashTTL
	}
	if r.OutputWait <= 0 {
		r.OutputWait = DefaultOutputWait
	}
	return &r, nil
}

func (iso *Isolation) isolates(queue string) bool {
	if iso == nil {
		return false
	}
	for _, q := range iso.Queues {
		if q == queue {
			return true
		}
	}
	return false
}

// childTask is what a worker hands its child on standard input.
type childTask struct {
	ID      string    `json:"id"`
	Kind    string    `json:"kind"`
	Payload []byte    `json:"payload"`
	Retried int       `json:"retried"`
	Worker  string    `json:"worker"`
	Started time.Time `json:"started"`
	// ProgressEvery is the worker's progress throttle.
	ProgressEvery time.Duration `json:"progress_every"`
}

// childOutcome is what a child hands back on file descriptor 3: the
// handler's error, if any, with what the worker must know of it.
type childOutcome struct {
	Error     string        `json:"error,omitempty"`
	SkipRetry bool          `json:"skip_retry,omitempty"`
	WaitFor   string        `json:"wait_for,omitempty"`
	WaitEvery time.Duration `json:"wait_every,omitempty"`
}

// childError is a child's handler error as the worker sees it: its text,
// and whether it is final.
type childError struct {
	msg  string
	skip bool
}

func (e *childError) Error() string { return e.msg }

func (e *childError) Is(target error) bool { return e.skip && target == asynq.SkipRetry }

// PoisonError archives a task whose process died PoisonCrashes times.
type PoisonError struct {
	// ID is the task's id, for the retry its message asks for.
	ID string
	// Last says how the process died the last time: its exit status and
	// its last words (lastLines.why).
	Last string
}

// Error ends with what to do as its last "; " clause, which sched status
// keeps when it cuts a long failure to fit its line.
func (e *PoisonError) Error() string {
	return "poison task: the worker died twice running it (last: " + e.Last + "); fix the cause, then `sched retry " + e.ID +
		"`, which starts the count again"
}

func (e *PoisonError) Unwrap() error { return asynq.SkipRetry }

// CrashError is a task whose process died, not yet as often as makes it
// poison: it is retried as any failure is.
type CrashError struct {
	Last    string
	Crashes int64
}

func (e *CrashError) Error() string {
	return fmt.Sprintf("the task's process died (%s); crash %d of %d before the task is archived as poison", e.Last, e.Crashes, PoisonCrashes)
}

func crashKey(taskID string) string { return "kiln:crashes:" + taskID }

// isolated is the handler of an isolated queue: each task in a child.
type isolated struct{ w *Worker }

func (h isolated) ProcessTask(ctx context.Context, t *asynq.Task) error {
	w, iso := h.w, h.w.iso
	id, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	if retried == 0 {
		// The task's first attempt since it was queued anew: crashes
		// counted against its id belong to an earlier life (one cancelled
		// or archived by a client, which the worker does not see). A
		// counted crash uses a retry, so none of this life is lost here
		// (but one that coincides with the worker's shutdown, re-queued as
		// interrupted without using a retry).
		w.forgetCrashes(ctx, id)
	}
	in, err := json.Marshal(childTask{ID: id, Kind: t.Type(), Payload: t.Payload(), Retried: retried, Worker: w.p.Name,
		Started: time.Now(), ProgressEvery: w.p.ProgressEvery})
	if err != nil {
		return err
	}
	cmd := exec.Command(iso.Command[0], iso.Command[1:]...)
	cmd.Env = append(os.Environ(), iso.Env...)
	cmd.Stdin = bytes.NewReader(in)
	lines := &lastLines{out: iso.Output}
	cmd.Stdout, cmd.Stderr = iso.Output, lines
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("start the task's process: %w", err)
	}
	defer outR.Close()
	cmd.ExtraFiles = []*os.File{outW}
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = iso.OutputWait

	// The child is started, and waited for, from one locked OS thread:
	// on Linux it is killed when the thread that started it ends, which
	// must then mean the worker's death and nothing sooner.
	started, exited := make(chan error, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		endGroup(cmd.Process.Pid)
		exited <- cmd.Wait()
	}()
	err = <-started
	outW.Close()
	if err != nil {
		return fmt.Errorf("start the task's process %s: %w", iso.Command[0], err)
	}
	// held is set where the outcome's pipe was still open OutputWait after
	// the child ended.
	outcome, held := make(chan []byte, 1), false
	go func() {
		b, err := io.ReadAll(outR)
		held = errors.Is(err, os.ErrDeadlineExceeded)
		outcome <- b
	}()

	var waitErr error
	stopped, killed := false, false
	select {
	case waitErr = <-exited:
	case <-ctx.Done():
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		grace := time.NewTimer(w.p.ShutdownGrace)
		select {
		case waitErr = <-exited:
		case <-grace.C:
			_ = cmd.Process.Kill()
			killed = true
			waitErr = <-exited
		}
		grace.Stop()
	}
	_ = outR.SetReadDeadline(time.Now().Add(iso.OutputWait))
	b := <-outcome
	if held || errors.Is(waitErr, exec.ErrWaitDelay) {
		w.p.Logger.Warn("the task's process left a process behind that holds its output open; the task ended without waiting for it",
			zap.String("task_id", id), zap.Duration("waited", iso.OutputWait))
	}
	Progress(ctx).adopt(ctx)

	var out childOutcome
	if len(b) > 0 && json.Unmarshal(b, &out) == nil {
		switch {
		case out.Error == "":
			w.forgetCrashes(ctx, id)
			return nil
		case out.WaitFor != "":
			return &WaitError{For: out.WaitFor, Every: out.WaitEvery}
		default:
			return &childError{msg: out.Error, skip: out.SkipRetry}
		}
	}
	last := describeExit(waitErr, lines.why())
	if stopped {
		// Killed or stopped on the worker's request: not the task's fault.
		return &stoppedProcessError{err: fmt.Errorf("the task's process was stopped: %s: %w", last, ctx.Err()),
			exit: last, killed: killed, grace: w.p.ShutdownGrace}
	}
	return w.countCrash(context.WithoutCancel(ctx), id, last)
}

// countCrash records that task id's process died, and archives the task
// once it has died PoisonCrashes times.
func (w *Worker) countCrash(ctx context.Context, id, last string) error {
	key := crashKey(id)
	var n *redis.IntCmd
	_, err := w.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		n = p.Incr(ctx, key)
		p.Expire(ctx, key, w.iso.CrashTTL)
		return nil
	})
	if err != nil {
		// Without the count the task is retried as any failure is, within
		// its policy's MaxRetry.
		w.p.Logger.Warn("crash of a task's process not counted", zap.String("task_id", id), zap.Error(err))
		return &CrashError{Last: last, Crashes: 1}
	}
	if n.Val() >= PoisonCrashes {
		// Archived: the middleware forgets the count (taskArchived).
		return &PoisonError{ID: id, Last: last}
	}
	return &CrashError{Last: last, Crashes: n.Val()}
}

// forgetCrashes deletes the crash count of task id: its queued life began
// or ended.
func (w *Worker) forgetCrashes(ctx context.Context, id string) {
	if err := w.rdb.Del(context.WithoutCancel(ctx), crashKey(id)).Err(); err != nil {
		// The count goes at its CrashTTL, or at the task's next first
		// attempt: until then a crash of a new life may count one too many.
		w.p.Logger.Warn("crash count of a task not reset", zap.String("task_id", id), zap.Error(err))
	}
}

// taskArchived is called by the middleware when an attempt's error
// archives its task (final, poison, cancelled, or its retries used up):
// its queued life ended, and with it the crash count of an isolated task.
func (w *Worker) taskArchived(ctx context.Context, queue, id string) {
	if w.iso.isolates(queue) {
		w.forgetCrashes(ctx, id)
	}
}

func describeExit(err error, why string) string {
	s := "exited"
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		s = ee.ProcessState.String()
	case err != nil:
		s = err.Error()
	}
	if why != "" {
		s += ": " + why
	}
	return s
}

// headline matches the lines that say why a process died: Go's fatal
// errors and panics, a signal's report, a CUDA error.
var headline = regexp.MustCompile(`^(fatal error: |panic: |SIG[A-Z]+: |runtime: |unexpected fault|CUDA|cuda)`)

// escapes matches a terminal's escape sequences (a console log's colours).
var escapes = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

// lastLines passes a child's output on and keeps, for the crash report,
// the child's last words: the last line of Go's report of a fatal error,
// panic or signal; else the last log line at error level or above; else
// the last line that its logger did not write (a library's own report).
// A log line below error level (the last step's progress) never says why
// a process died, and is not kept.
type lastLines struct {
	out io.Writer

	mu                   sync.Mutex
	partial              []byte
	head, errLine, plain string
}

func (l *lastLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.note(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	if len(l.partial) > 4096 {
		l.note(string(l.partial))
		l.partial = l.partial[:0]
	}
	l.mu.Unlock()
	return l.out.Write(p)
}

func (l *lastLines) note(line string) {
	line = strings.TrimSpace(escapes.ReplaceAllString(line, ""))
	if line == "" {
		return
	}
	level, text, isLog := logLevel(line)
	switch {
	case headline.MatchString(line):
		l.head = line
	case !isLog:
		l.plain = line
	case level >= zapcore.ErrorLevel:
		l.errLine = text
	}
}

// logLevel reads line as one of zap's, JSON or console: its level and
// the text to keep of it, and whether it is a log line at all.
func logLevel(line string) (zapcore.Level, string, bool) {
	if strings.HasPrefix(line, "{") {
		var e struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Error string `json:"error"`
		}
		var lvl zapcore.Level
		if json.Unmarshal([]byte(line), &e) != nil || e.Level == "" || lvl.UnmarshalText([]byte(e.Level)) != nil {
			return 0, "", false
		}
		text := strings.ToUpper(e.Level) + " " + e.Msg
		if e.Error != "" {
			text += ": " + e.Error
		}
		return lvl, text, true
	}
	// Console: "<time>\tLEVEL\t[caller\t]msg\t{fields}"; the time may be
	// left out.
	f := strings.SplitN(line, "\t", 3)
	for i := 0; i < 2 && i < len(f)-1; i++ {
		var lvl zapcore.Level
		if f[i] != "" && lvl.UnmarshalText([]byte(f[i])) == nil {
			return lvl, strings.Join(f[i:], "\t"), true
		}
	}
	return 0, "", false
}

func (l *lastLines) why() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.note(string(l.partial))
		l.partial = nil
	}
	s := l.plain
	switch {
	case l.head != "":
		s = l.head
	case l.errLine != "":
		s = l.errLine
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// TaskParams configure ServeTask.
type TaskParams struct {
	// Redis is the queue's connection (required): progress and the
	// handlers' own state.
	Redis asynq.RedisConnOpt
	// Handlers are those of the isolated queues' kinds; or Open makes
	// them, when opening their dependencies can fail (an object store that
	// is down): its error is then the task's, retried as any failure is,
	// not a crash of the process.
	Handlers Handlers
	Open     func(ctx context.Context) (Handlers, error)
	// Logger receives the task's logs. Default zap.NewNop().
	Logger *zap.Logger
	// In carries the task (default os.Stdin); Outcome takes the outcome
	// (default file descriptor 3, which the worker opens).
	In      io.Reader
	Outcome io.Writer
}

// ServeTask runs, in a child process started by a worker's Isolation, the
// one task the worker hands it, until its handler returns or ctx ends (the
// caller cancels ctx on SIGTERM). It returns the process's exit status: 0
// when the task is done, 1 when it failed, the outcome written either way.
func ServeTask(ctx context.Context, p TaskParams) int {
	if p.Logger == nil {
		p.Logger = zap.NewNop()
	}
	if p.In == nil {
		p.In = os.Stdin
	}
	if p.Outcome == nil {
		f := os.NewFile(3, "outcome")
		if f == nil {
			fmt.Fprintln(os.Stderr, "worker task: no outcome pipe on file descriptor 3: this process is started by a worker")
			return 2
		}
		defer f.Close()
		p.Outcome = f
	}
	err := outageWait(serveTask(ctx, p))
	out := childOutcome{}
	if err != nil {
		out.Error = err.Error()
		out.SkipRetry = errors.Is(err, asynq.SkipRetry)
		var we *WaitError
		if errors.As(err, &we) {
			out.WaitFor, out.WaitEvery = we.For, we.Every
		}
	}
	b, _ := json.Marshal(out)
	if _, werr := p.Outcome.Write(b); werr != nil {
		fmt.Fprintln(os.Stderr, "worker task: outcome not handed back:", werr)
		return 2
	}
	if err != nil {
		return 1
	}
	return 0
}

func serveTask(ctx context.Context, p TaskParams) (err error) {
	var t childTask
	if err := json.NewDecoder(p.In).Decode(&t); err != nil {
		return fmt.Errorf("worker task: read the task from the worker: %w", err)
	}
	if p.Redis == nil {
		return errors.New("worker task: TaskParams.Redis is required")
	}
	hs := p.Handlers
	if p.Open != nil {
		if hs, err = p.Open(ctx); err != nil {
			return fmt.Errorf("%s: %w", t.Kind, err)
		}
	}
	if hs.Training != nil && hs.Training.Owner == "" {
		// The run's lock and state name the worker, as its task's
		// progress does, not this process, which `sched status` never
		// lists.
		tr := *hs.Training
		tr.Owner = t.Worker
		hs.Training = &tr
	}
	set, err := hs.build()
	if err != nil {
		return err
	}
	if len(set) == 0 {
		return errors.New("worker task: TaskParams.Handlers is empty")
	}
	rdb := p.Redis.MakeRedisClient().(redis.UniversalClient)
	defer rdb.Close()
	ttl := 7 * 24 * time.Hour
	if pol, ok := scheduler.PolicyFor(t.Kind); ok {
		ttl = pol.Retention
	}
	log := p.Logger.With(zap.String("task_id", t.ID), zap.String("kind", t.Kind), zap.Int("retried", t.Retried))
	rep := &Reporter{rdb: rdb, log: log, ttl: ttl, every: t.ProgressEvery,
		p: scheduler.Progress{TaskID: t.ID, Kind: t.Kind, Fraction: -1, State: "running", Worker: t.Worker, Started: t.Started, Updated: time.Now()}}
	if prev, ok, err := scheduler.ReadProgress(ctx, rdb, t.ID); err == nil && ok {
		rep.p.Started = prev.Started
	}
	// What the task last reported is written whatever the throttle: the
	// worker reads it back when the process ends.
	defer rep.flush()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("task %s panicked: %v", t.Kind, r)
			log.Error("task panicked", zap.Any("panic", r), zap.Stack("stack"))
		}
	}()
	ctx = context.WithValue(ctx, reporterKey{}, rep)
	return mux{set}.ProcessTask(ctx, asynq.NewTask(t.Kind, t.Payload))
}
