package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// Run states as `sched status` and `sched runs` name them. Only a run
// that is training has an ETA.
const (
	runTraining   = "training"
	runFinishing  = "finishing" // trained its last step; its last checkpoint or results still go up
	runLost       = "worker lost"
	runQueued     = "queued"
	runRequeued   = "interrupted, re-queued"
	runWaiting    = "waiting"
	runRetrying   = "retrying"
	runDone       = "done"
	runCancelled  = "cancelled"
	runFailed     = "failed"
	runStopped    = "stopped"
	runNotStarted = "not started"
)

// runView is a training run as the user sees it: its recorded progress
// (the run's state hash) joined with its newest segment task in the queue,
// which says whether anything is still working on it.
type runView struct {
	scheduler.RunState
	HasState bool
	Status   string
	// Detail says why: a failure's reason, a lost worker's name.
	Detail string
	Task   *scheduler.TaskStatus
	// From is the step Task starts from; QueuedTotal the run's length
	// when Task was queued (0 where it does not say).
	From, QueuedTotal int64
	// ETA is the remaining tokens over the measured rate; set only while
	// the run is training.
	ETA time.Duration
}

// runETA is the time left for s at its measured rate: the tokens of the
// steps left, (total - step) x tokens per step, over tok/s as last logged.
// Tokens per step is the run's own count (tokens seen over steps taken),
// which is batch x seq x accumulate for every kiln run.
func runETA(s scheduler.RunState) (time.Duration, bool) {
	if s.Step <= 0 || s.Tokens <= 0 || s.TokPerS <= 0 || s.Total <= s.Step {
		return 0, false
	}
	left := float64(s.Total-s.Step) * float64(s.Tokens) / float64(s.Step)
	return time.Duration(left / s.TokPerS * float64(time.Second)), true
}

// runViews joins every run that has recorded progress or has a segment
// task in the queues, sorted by name.
func runViews(states []scheduler.RunState, snap *scheduler.Snapshot) []runView {
	tasks := snap.RunTasks()
	byName := map[string]*runView{}
	for _, s := range states {
		byName[s.Run] = &runView{RunState: s, HasState: true}
	}
	for name := range tasks {
		if byName[name] == nil {
			byName[name] = &runView{RunState: scheduler.RunState{Run: name, Checkpoint: -1}}
		}
	}
	out := make([]runView, 0, len(byName))
	for name, v := range byName {
		if rt, ok := tasks[name]; ok {
			t := rt.Task
			v.Task, v.From, v.QueuedTotal = &t, rt.FromStep, rt.TotalSteps
		}
		v.classify()
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Run < out[j].Run })
	return out
}

// classify sets Status, Detail and ETA. The queue's word comes first: a
// state hash left by a segment says what was done, not whether anything
// is still doing it.
func (v *runView) classify() {
	t := v.Task
	state, back := "", ""
	if t != nil {
		// A run's progress outlives its tasks (asynq deletes finished ones
		// after their retention): there may be none.
		state, back = t.State, setBack(*t)
	}
	switch {
	case state == "active" && t.Lost:
		v.Status = runLost
		v.Detail = lostDetail(*t)
	case state == "active" && v.Finishing() != "":
		// The last step's rate and the ETA it gives would say the run
		// still trains, for the minutes a slow store takes.
		v.Status = runFinishing
		v.Detail = "training is over: " + v.Finishing()
	case state == "active":
		v.Status = runTraining
		if eta, ok := runETA(v.RunState); ok {
			v.ETA = eta
		}
	case back == "interrupted":
		// A graceful stop, not a failed attempt: asynq holds the segment
		// in its retry state until a worker picks it up, using no retry.
		v.Status = runRequeued
		v.Detail = "stopped by its worker's shutdown at a step boundary; it resumes from its last checkpoint (no retry used)"
		if scheduler.ProcessEndedAtStop(t.Progress.Message) {
			v.Detail = "by its worker's shutdown, " + lostAtStop(t.Progress.Message) + "; it resumes from that checkpoint (no retry used)"
		}
	case back == "waiting":
		v.Status = runWaiting
		// What it waits for ends with what to do, which a cut keeps.
		v.Detail = keepRemedy(errorLine(t.Progress.Message, taskErrRunes), 240, t.ID) + " (" + waitNote(*t) + ")"
	case state == "pending" || state == "scheduled":
		v.Status = runQueued
	case state == "retry" && t.Retried == 0:
		// Set back without a failure, its worker's report of why lost.
		v.Status = runRequeued
		v.Detail = failureErr(*t, 160)
	case state == "retry":
		v.Status = runRetrying
		v.Detail = fmt.Sprintf("attempt %d of %d failed: %s", t.Retried, t.MaxRetry+1, failureErr(*t, 160))
	case v.Done && (state != "archived" || v.From < int64(v.Step)):
		// A segment that began at the run's end and was archived was
		// queued to train it further (a longer total): its failure, or
		// its cancel, is what became of the run, below.
		v.Status = runDone
	case state == "archived" && t.Cancelled:
		v.Status = runCancelled
		v.Detail = "by sched cancel; 'sched enqueue train " + v.Run + "' resumes it from its last checkpoint"
		if !v.HasState || v.Checkpoint <= 0 {
			v.Detail = "by sched cancel, before its first checkpoint; 'sched enqueue train " + v.Run + "' starts it"
		}
		if t.HasProgress && scheduler.ProcessEndedAtStop(t.Progress.Message) {
			// Killed at the worker's grace as it stopped: no checkpoint of
			// its stop step was written.
			v.Detail = "by sched cancel, " + lostAtStop(t.Progress.Message) + "; 'sched enqueue train " + v.Run + "' resumes it from that checkpoint"
		}
	case state == "archived":
		v.Status = runFailed
		v.Detail = failureErr(*t, 160)
		if retriesSpent(*t) {
			// The cause is the error's to say, with what to mend; then
			// what resumes the run, as a cancelled run's line says.
			resumes := "resumes it from its last checkpoint"
			if !v.HasState || v.Checkpoint <= 0 {
				resumes = "starts it"
			}
			v.Detail += "; once that is mended, 'sched enqueue train " + v.Run + "' " + resumes
		}
	case !v.HasState:
		v.Status = runNotStarted
	default:
		v.Status = runStopped
		v.Detail = "no segment is queued; 'sched enqueue train " + v.Run + "' resumes it from its last checkpoint"
	}
}

// total is the run's length as its line gives it: its state's, which the
// segment training it wrote as it began, or, while a segment waits to run
// (queued, set back, waiting), the longer length that segment was queued
// for: a run given a longer total and queued to go on read as done at its
// old one ("step 800/800 (100.0%)") until its segment began.
func (v runView) total() int {
	if t := v.Task; t != nil && t.State != "active" && !t.Ended() && v.QueuedTotal > int64(v.Total) {
		return int(v.QueuedTotal)
	}
	return v.Total
}

// ended reports whether nothing goes on with the run: done, cancelled,
// failed, or stopped with no segment queued; 'sched enqueue train' (or a
// retry) starts it again where it is not done.
func (v runView) ended() bool {
	switch v.Status {
	case runDone, runCancelled, runFailed, runStopped:
		return true
	}
	return false
}

// lostDetail names the worker that stopped heartbeating, or that lost the
// task's lease while it heartbeats still (cut off from Redis for longer
// than the lease: it stops the task at once).
func lostDetail(t scheduler.TaskStatus) string {
	who := "its worker"
	if t.HasProgress && t.Progress.Worker != "" {
		who = "worker " + t.Progress.Worker
	}
	what := who + " stopped heartbeating"
	if t.WorkerLive {
		what = who + " lost the task's lease (cut off from Redis for longer than it) and stops it"
	}
	if t.Cancelled {
		return what + "; cancelled: a worker on queue " + t.Queue + " that recovers it archives it without running it"
	}
	return what + "; the task runs again once a worker on queue " + t.Queue + " recovers it"
}

// trainingOn is the worker a training (or finishing) run is on: its
// segment task's, which is written as the task starts, over the run's
// state's, which its first step writes (until then, after a worker died,
// it names the dead one).
func (v runView) trainingOn() string {
	if v.Status != runTraining && v.Status != runFinishing {
		return ""
	}
	if v.Task != nil && v.Task.HasProgress && v.Task.Progress.Worker != "" {
		return v.Task.Progress.Worker
	}
	return v.Worker
}

// line is the run's one-line status.
func (v runView) line(now time.Time) string {
	parts := []string{v.Run, v.Status}
	if v.HasState {
		// The step and its loss are written at most once a second, a
		// checkpoint as soon as it is uploaded: the run has trained at
		// least to its checkpoint. The loss is that of the last logged
		// step, which a segment that stopped between logged steps, or a
		// checkpoint newer than the state's step, leaves behind the step
		// shown: it names its own step then.
		at := max(v.Step, v.Checkpoint)
		parts = append(parts, stepOfTotal(at, v.total()))
		if v.Loss > 0 && v.LossAt() != at {
			parts = append(parts, fmt.Sprintf("loss %.4f at step %d", v.Loss, v.LossAt()))
		} else if v.Loss > 0 {
			parts = append(parts, fmt.Sprintf("loss %.4f", v.Loss))
		}
		// A segment that stopped reporting (a stopped process, a hung
		// GPU) would show the rate and ETA of its last logged step for as
		// long: it says when it last reported in their place.
		var running *scheduler.TaskStatus
		if v.Task != nil && v.Task.State == "active" {
			running = v.Task
		}
		last, silent := v.Silent(running, now)
		quiet := v.Status == runTraining && silent
		if v.Status == runTraining && v.TokPerS > 0 && !quiet {
			parts = append(parts, formatRate(v.TokPerS, "tok")+v.OnGPUs())
		}
		if v.ETA > 0 && !quiet {
			parts = append(parts, "ETA "+formatETA(v.ETA))
		}
		if v.Checkpoint >= 0 {
			ck := fmt.Sprintf("last checkpoint step %d", v.Checkpoint)
			if !v.CheckpointAt.IsZero() {
				ck += " at " + v.CheckpointAt.Format(time.RFC3339)
			}
			parts = append(parts, ck)
		} else {
			parts = append(parts, "no checkpoint yet")
		}
		if w := v.trainingOn(); w != "" {
			parts = append(parts, "on "+w)
		}
		if note := v.UnsentNote(); note != "" && v.Status != runDone {
			// The last checkpoint named falls behind and nothing else
			// changes: a watcher would take the run for healthy while
			// everything after it has one copy, on one disk.
			parts = append(parts, note)
		}
		// When it last reported: of a segment silent as it trains, and of
		// a run that waits to go on (queued, waiting, retrying, its worker
		// lost); not of one that ended, done, cancelled, failed or
		// stopped, whose last report is no news.
		if (quiet || v.Status != runTraining && v.Status != runFinishing && !v.ended()) && !last.IsZero() {
			parts = append(parts, "last report "+formatAge(last, now))
		}
	} else if v.From > 0 {
		// Its record in Redis lost (its data lost): the segment queued
		// says where it resumes, from object storage's newest checkpoint.
		parts = append(parts, fmt.Sprintf("from checkpoint step %d", v.From))
	}
	if v.Status == runFinishing && !v.Updated.IsZero() {
		// The state's time is the end of training, which the phase's
		// writes leave as it is.
		parts = append(parts, "training ended "+formatAge(v.Updated, now)+": "+v.Finishing())
	} else if v.Detail != "" {
		parts = append(parts, v.Detail)
	}
	return strings.Join(parts, "  ")
}

// stepOfTotal is a run's step at of its total steps, with the percentage
// done: "step 600/20000 (3.0%)". A run whose length (total_steps or
// total_tokens) was lowered below the step a segment already under way
// went on to (a segment reads the runs file as it begins) ended past its
// total, which a percentage over 100 would make read as a fault.
func stepOfTotal(at, total int) string {
	switch {
	case total <= 0:
		return fmt.Sprintf("step %d/%d", at, total)
	case at > total:
		return fmt.Sprintf("step %d (past its total of %d: the run's length was lowered after the segment that trained to step %d began)", at, total, at)
	}
	return fmt.Sprintf("step %d/%d (%.1f%%)", at, total, 100*float64(at)/float64(total))
}

// storedRuns is what object storage says of runs: the step of the newest
// complete checkpoint of each run it holds, or why it was not read. A run
// Redis has no record of (its data lost: restarted without its
// append-only file, flushed) is known by these alone.
type storedRuns struct {
	newest map[string]int
	err    error
	// objects is the store they were read from, for the total a run's
	// newest checkpoint records (checkpointTotal), read where the runs
	// file here does not name the run, once: totals keeps what was read.
	objects store.Store
	totals  map[string]int
}

// checkpointTotal is the total steps run's checkpoint of step step records
// in its run configuration: whether the run is done where the runs file
// here does not say (0 where it was not read).
func (s storedRuns) checkpointTotal(run string, step int) int {
	if s.objects == nil {
		return 0
	}
	if t, ok := s.totals[run]; ok {
		return t
	}
	ctx, cancel := context.WithTimeout(context.Background(), storedListWait)
	defer cancel()
	total := 0
	if r, err := s.objects.Get(ctx, segment.CheckpointPrefix(run)+trainer.StepDir(step)+"/"+trainer.StateFile); err == nil {
		var st struct {
			Run trainer.RunConfig `json:"run_config"`
		}
		if json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&st) == nil {
			total = st.Run.WithDefaults().TotalSteps
		}
		r.Close()
	}
	s.totals[run] = total
	return total
}

// storedListWait bounds the listing of checkpoints/ once the store has
// answered openStore's check (15 s): a few requests of 1000 keys each,
// where a store that stalls part-way would hold the command for its
// client's stall timeout of two minutes, a retry, and more.
const storedListWait = 30 * time.Second

// readStoredRuns lists the runs that object storage, opened as every
// command opens it, holds complete checkpoints of. A local directory
// store that does not exist holds none; looking does not make it.
func readStoredRuns(ctx context.Context, cfg scheduler.Config) storedRuns {
	where := cfg.LocalStoreDir()
	if cfg.S3Endpoint == "" {
		if _, err := os.Stat(where); errors.Is(err, fs.ErrNotExist) {
			return storedRuns{}
		}
	} else {
		where = "the object store at " + s3Address(cfg)
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		return storedRuns{err: err}
	}
	lctx, cancel := context.WithTimeout(ctx, storedListWait)
	defer cancel()
	newest, err := segment.RemoteRuns(lctx, st)
	if err != nil {
		if lctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (no listing within %s)", err, storedListWait)
		}
		return storedRuns{err: redactErr(cfg, fmt.Errorf("%s: %w", where, err))}
	}
	return storedRuns{newest: newest, objects: st, totals: map[string]int{}}
}

// printRunLines writes a line for each run of views and each run that
// stored holds checkpoints of and views lack, by name; then, where object
// storage was not read, one line that says so and why. none is the line
// for no run at all.
func printRunLines(w io.Writer, views []runView, stored storedRuns, now time.Time, none string) {
	type line struct{ run, text string }
	var lines []line
	known := map[string]bool{}
	for _, v := range views {
		lines = append(lines, line{v.Run, v.line(now)})
		known[v.Run] = true
	}
	var set runs.Set
	loaded := false
	for run, step := range stored.newest {
		if known[run] {
			continue
		}
		if !loaded {
			loaded = true
			// The runs file here, which 'sched enqueue train' reads:
			// whether a run is done, and whether it is known by that name.
			set, _ = runs.Load(os.Getenv("KILN_RUNS"))
		}
		lines = append(lines, line{run, storedLine(run, step, set, stored)})
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].run < lines[j].run })
	switch {
	case len(lines) == 0 && stored.err != nil:
		fmt.Fprintln(w, strings.Replace(none, "no training runs", "no training runs in Redis", 1))
	case len(lines) == 0:
		fmt.Fprintln(w, none)
	}
	for _, l := range lines {
		fmt.Fprintln(w, l.text)
	}
	if stored.err != nil {
		fmt.Fprintf(w, "object storage not read, so a run that only its checkpoints there still record is not listed: %s\n",
			scheduler.OneLine(stored.err.Error(), 400))
	}
}

// storedLine is a run that Redis has no record of and object storage
// holds checkpoints of, up to step: what 'sched enqueue train' would do
// with it, as the runs file here (set; nil where it does not read) says,
// or where it does not name the run, its newest checkpoint's total.
func storedLine(run string, step int, set runs.Set, stored storedRuns) string {
	total := 0
	if r, err := set.Get(run); err == nil {
		total = r.RunConfig.TotalSteps
	} else {
		total = stored.checkpointTotal(run, step)
	}
	if total > 0 && step >= total {
		return fmt.Sprintf("%s  done: checkpoints in object storage up to step %d of %d, and no record in Redis", run, step, total)
	}
	l := fmt.Sprintf("%s  not queued: checkpoints in object storage up to step %d, and no record in Redis; 'sched enqueue train %s' resumes it", run, step, run)
	if _, ok := set[run]; set != nil && !ok {
		l += " (with KILN_RUNS naming the runs file that defines it, as the GPU worker's does)"
	}
	return l
}

// lostAtStop says what a segment whose process was killed at the
// worker's grace, or died, as it stopped (scheduler.ProcessEndedAtStop:
// msg is what it said of its end) lost: no checkpoint of its stop step
// was written.
func lostAtStop(msg string) string {
	if strings.Contains(msg, "and was killed") {
		return "its process killed before it stopped: the steps after its last checkpoint are lost"
	}
	return "its process ended before it stopped: the steps after its last checkpoint may be lost"
}
