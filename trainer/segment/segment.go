// Package segment is the logic of one train:segment task: take the run's
// lock, resume from the latest complete checkpoint (local, else object
// storage), train for a bounded time or number of steps, push checkpoints
// in the background, write results, and say whether a next segment is due.
package segment

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/disk"
	"github.com/kiln-lm/kiln/internal/lapse"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// Lease is the run's lock as the queue keeps it (scheduler.RunLock): a
// segment writes the run's state and marks checkpoints complete only
// through it, so that a worker that lost the run cannot overwrite the work
// of the one that took it over.
type Lease interface {
	// Token is the lease's fencing token, recorded in completion markers.
	Token() int64
	// Lost is closed when the lease lapses or is taken over.
	Lost() <-chan struct{}
	// Fenced sets fields of the run's state while the lease holds.
	Fenced(ctx context.Context, fields map[string]string) error
	// Check fails once the lease no longer holds.
	Check(ctx context.Context) error
	Release(ctx context.Context) error
}

// Params configure one segment. Zero values take the defaults noted; the
// defaults are resolved in withDefaults and nowhere else.
type Params struct {
	// Run is the run to train (required).
	Run runs.Run
	// Dir is the worker's local run root: the run lives in Dir/<run>
	// (checkpoints, metrics.jsonl, summary.md, loss.svg). Required.
	Dir string
	// TokensDir resolves the mixture's relative store names.
	TokensDir string
	// Objects is the object store; nil trains from local checkpoints only.
	Objects Objects
	// Redis holds the run's lock and state (required).
	Redis redis.UniversalClient
	// Owner names this worker to whoever finds the run locked. Default
	// host:pid.
	Owner string
	// LockTTL is the lock's lease. Default 30s: a worker that dies holds
	// the run for at most this long.
	LockTTL time.Duration
	// ObjectsDown, when set, is why object storage did not answer just
	// before the segment: it resumes from this disk without listing the
	// store first, where the run's state allows (see restore).
	ObjectsDown error
	// UploadGrace bounds the work a segment owes object storage once its
	// context ends (SIGTERM, `sched cancel`) or its training ends: the last
	// checkpoint's upload and the results. What is not uploaded by then
	// stays on this disk for the next segment here. Keep it below the
	// worker's shutdown grace. Default 60s.
	UploadGrace time.Duration
	// AnswerWithin bounds the listing of the run's checkpoints where
	// waiting for it holds the run up: at the start of a segment that can
	// train on from the checkpoint on this disk (it is as new as any the
	// run's state records uploaded), and once the training of a segment
	// that another follows is over. A store that does not answer by then
	// (one that hangs) is taken as down, as the worker's check of it at
	// the task's start takes it, and the segment trains on from this disk,
	// where it waited on minutes of the store's timeouts and retries saying
	// nothing. Default 15s.
	AnswerWithin time.Duration
	// ListWithin bounds the listing of the run's checkpoints where waiting
	// for it holds up no training: at the start of a segment that has no
	// checkpoint on this disk to train on from, and while the uploads of
	// one that began without the listing wait for it. A store whose
	// listing takes longer than AnswerWithin (a large bucket, a loaded
	// server, a slow link) is slow, not down: taken as down, its every
	// listing failed, no checkpoint went up and the run's last segment
	// waited for good. Default 5 minutes.
	ListWithin time.Duration
	// SlowUpload is how long a checkpoint's upload may take before a
	// warning names its step, the time so far and the endpoint; the
	// warning comes again each time that time doubles. Default 1 minute.
	SlowUpload time.Duration
	// Tokenizer is tokenizer.json's bytes, copied into every checkpoint.
	Tokenizer []byte
	// Uses, when set, is the run's tokenizer: data whose stores were made
	// by another one is refused (catalog.MismatchError) before a step, as
	// their ids would mean other text than the checkpoint's tokenizer says.
	Uses *catalog.Entry
	// Engine, when set, is used instead of one made from the run's engine.
	Engine model.Engine
	// OpenData opens the run's data. Default: trainer.OpenMixture over
	// the mixture's stores.
	OpenData func(rc trainer.RunConfig, mc model.Config) (trainer.Data, error)
	// PeakFLOPS is the device's peak for MFU (0 leaves it out).
	PeakFLOPS float64
	// Bench holds `sched bench` rows for the throughput gate.
	Bench []results.BenchRow
	// Sample generates the sane-generation gate's sample from a finished
	// run's final checkpoint directory. Default: trainer.Sample with
	// Tokenizer, the run's own tokenizer.
	Sample func(ctx context.Context, checkpoint string) (ids []int32, text string, err error)
	// Progress receives every optimizer step, for progress displays.
	Progress func(step, total int, m *trainer.Metrics)
	// FreeSpace reports the free bytes of a directory's filesystem.
	// Default: statfs.
	FreeSpace func(dir string) (int64, error)
	Log       *zap.Logger

	// caughtUp holds the earlier segments' event files this segment has
	// found or made whole in object storage (catchUpEvents); Run sets it.
	caughtUp *caughtUp
	// since is this segment's part of the run's wall-clock, from its
	// start. Default time.Since; tests add the hours a run trains.
	since func(time.Time) time.Duration
}

func (p Params) withDefaults() Params {
	if p.Owner == "" {
		host, _ := os.Hostname()
		p.Owner = host + ":" + strconv.Itoa(os.Getpid())
	}
	if p.LockTTL == 0 {
		p.LockTTL = 30 * time.Second
	}
	if p.UploadGrace == 0 {
		p.UploadGrace = 60 * time.Second
	}
	if p.SlowUpload == 0 {
		p.SlowUpload = time.Minute
	}
	if p.AnswerWithin == 0 {
		p.AnswerWithin = 15 * time.Second
	}
	if p.ListWithin == 0 {
		p.ListWithin = 5 * time.Minute
	}
	if p.FreeSpace == nil {
		p.FreeSpace = disk.Free
	}
	if p.since == nil {
		p.since = time.Since
	}
	if p.Log == nil {
		p.Log = zap.NewNop()
	}
	if p.Sample == nil && len(p.Tokenizer) > 0 {
		tj := p.Tokenizer
		p.Sample = func(ctx context.Context, dir string) ([]int32, string, error) {
			tok, err := tokenizer.Parse(tj)
			if err != nil {
				return nil, "", fmt.Errorf("the run's tokenizer: %w", err)
			}
			return trainer.Sample(ctx, dir, tok)
		}
	}
	if p.OpenData == nil {
		p.OpenData = func(rc trainer.RunConfig, mc model.Config) (trainer.Data, error) {
			return trainer.OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
		}
	}
	if p.Uses != nil {
		open, uses := p.OpenData, *p.Uses
		p.OpenData = func(rc trainer.RunConfig, mc model.Config) (trainer.Data, error) {
			d, err := open(rc, mc)
			if err != nil {
				return nil, err
			}
			if err := checkUses(d, uses); err != nil {
				d.Close()
				return nil, err
			}
			return d, nil
		}
	}
	return p
}

func (p Params) validate() error {
	switch {
	case p.Run.Name == "":
		return errors.New("segment: Params.Run has no name")
	case p.Dir == "":
		return errors.New("segment: Params.Dir is required")
	case p.Redis == nil:
		return errors.New("segment: Params.Redis is required")
	}
	return nil
}

// Outcome is where a segment stopped.
type Outcome struct {
	Step, TotalSteps int
	// Done is true when the run reached its end: no next segment is due.
	Done bool
	// Checkpoint is the local directory of the last checkpoint; Uploaded
	// the step of the last one marked complete in object storage (-1 none).
	Checkpoint string
	Uploaded   int
	// ResumedFrom is the step the segment started from, and where it found
	// it: "local", "object storage" or "" for a fresh run.
	ResumedFrom  int
	ResumeSource string
	// Wall is the run's wall-clock so far, over all its segments.
	Wall time.Duration
	// Began is when this segment began, after its restore: its event
	// file's time, and the origin of its metrics' elapsed_s.
	Began time.Time
	// Devices is how many GPUs this segment trained on (trainer.Result's).
	Devices int
	// Precision is the one this segment's engine computed in
	// (trainer.Result's): fp32 on the CPU, whatever the run asked.
	Precision string
}

// RunDir is the local directory of run under root.
func RunDir(root, run string) string { return filepath.Join(root, run) }

// Run trains one segment of p.Run. It returns the Outcome and, when the
// segment was cancelled (SIGTERM, `sched cancel`), ctx's error after its
// last checkpoint is written and uploaded, or, when UploadGrace from the
// cancellation is not enough (object storage slow or hung), left on this
// disk for the next segment here to upload.
func Run(ctx context.Context, p Params) (Outcome, error) {
	p = p.withDefaults()
	p.caughtUp = &caughtUp{names: map[string]bool{}}
	out := Outcome{Uploaded: -1}
	if err := p.validate(); err != nil {
		return out, err
	}
	run := p.Run.Name
	rc := p.Run.RunConfig.WithDefaults()
	rc.Mixture = resolveStores(rc.Mixture, p.TokensDir)
	out.TotalSteps = rc.TotalSteps
	mc, err := rc.ModelConfig()
	if err != nil {
		return out, err
	}
	// What the checkpoints hold, in every state write: enqueue train
	// compares it with the runs entry before it queues a resume.
	holds := map[string]string{"seq": strconv.Itoa(rc.Seq), "shape": trainer.Shape(mc), "seed": strconv.FormatUint(rc.Seed, 10)}
	log := p.Log.With(zap.String("run", run))

	lock, err := acquireWaiting(ctx, p.Redis, run, p.Owner, p.LockTTL, log)
	if err != nil {
		return out, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := lock.Release(rctx); err != nil {
			log.Warn("release run lock", zap.Error(err))
		}
	}()
	if clearPhase(ctx, p.Redis, lock, run, log) {
		// Until it is cleared, every write of the run's progress clears it.
		holds["phase"] = ""
	}

	dir := RunDir(p.Dir, run)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return out, fmt.Errorf("run %s: %w", run, err)
	}
	r, err := p.restore(ctx, dir)
	if err != nil {
		return out, err
	}
	out.ResumedFrom, out.ResumeSource = r.step, r.source
	if r.step < rc.TotalSteps {
		// A run done at an earlier total and given a longer one trains
		// again: its state says so from the first write of a trained step
		// (kiln_run_done, sched status and sched retry read it), not at
		// the segment's end, hours on. A resume refused before then leaves
		// the state as it was.
		holds["done"] = "false"
	}
	behind := p.recordStored(ctx, lock, r, log)
	// Wall-clock adds up over segments; the state hash carries the sum,
	// and each checkpoint the sum at its write.
	prevWall, err := p.Redis.HGet(ctx, scheduler.RunStateKey(run), "wall_s").Float64()
	if err != nil && !errors.Is(err, redis.Nil) {
		// Read as 0, the run's summed wall-clock would restart from this
		// segment and be written back so.
		return out, fmt.Errorf("run %s: read its wall-clock so far: %w", run, err)
	}
	if r.source != "" {
		// Where Redis lost the run's state (or restarted from an older
		// copy of it), the checkpoint resumed from carries the sum on. One
		// that cannot be read is the trainer's to refuse, with its reason.
		if st, err := trainer.CheckCheckpoint(filepath.Join(dir, trainer.StepDir(r.step))); err == nil {
			prevWall = max(prevWall, st.WallClock)
		}
	}
	began := time.Now()
	out.Began = began
	wall := func() time.Duration { return time.Duration(prevWall*float64(time.Second)) + p.since(began) }

	// What the segment owes object storage after training (the last
	// uploads, the results) gets UploadGrace once ctx ends, and no more.
	gctx, startGrace, cancelGrace := graceContext(ctx, p.UploadGrace)
	defer cancelGrace()
	up := newUploader(gctx, p, lock, dir, rc, r.newest, log, wall)
	up.from, up.began = out.ResumedFrom, began
	if st, known, err := scheduler.ReadRunState(ctx, p.Redis, run); err == nil && known {
		// An outage that outlasts a segment is one: the state says since
		// when, and this segment's first upload that succeeds clears it.
		up.unsent = st.Unsent
	}
	// Retention runs after each upload. It is owed for the newest
	// checkpoint object storage holds where the worker that uploaded it
	// stopped before it ran (the run's state records an older one), and
	// may be at the run's end (a stop between the state write and
	// retention), where this segment uploads nothing that would run it:
	// left so, one checkpoint more than retention keeps stayed in object
	// storage for good. A segment resumed from a newer one uploads that.
	up.retain = p.Objects != nil && r.newest >= 0 && out.ResumedFrom == r.newest && (behind || r.step >= rc.TotalSteps)
	var owed []int // retained local checkpoints object storage lacks
	if p.Objects != nil {
		owed = slices.DeleteFunc(p.owedSteps(dir, rc, r.remote), func(s int) bool { return s == out.ResumedFrom })
	}
	if r.unknown {
		// Which of them object storage lacks is learnt once it answers;
		// until then they all stay on this disk.
		up.unsure = map[int]bool{}
		for _, s := range owed {
			up.unsure[s] = true
		}
		owed = nil
	}
	// A stop (SIGTERM, `sched cancel`) ends the segment short of the run's
	// end wherever it is: a store that has not answered since the start is
	// given AnswerWithin from then, as at the end of a segment another
	// follows.
	defer context.AfterFunc(ctx, up.end)()
	go up.loop()
	if p.Objects != nil && out.ResumeSource == "local" && out.ResumedFrom > r.newest {
		// The checkpoint resumed from never reached object storage (its
		// upload failed, or the worker stopped first): it goes now, as a
		// new one would. A finished run trains no step and writes none, so
		// its last checkpoint goes up only here.
		log.Info("uploading the local checkpoint object storage lacks", zap.Int("step", out.ResumedFrom))
		up.push(filepath.Join(dir, trainer.StepDir(out.ResumedFrom)), out.ResumedFrom)
	}
	for _, s := range owed {
		log.Info("uploading a local checkpoint retention keeps that object storage lacks", zap.Int("step", s))
		up.owe(filepath.Join(dir, trainer.StepDir(s)), s)
	}
	if err := p.guardStart(ctx, dir, up, log); err != nil {
		up.finish(false)
		return out, err
	}

	// Losing the lock stops training at once: another worker owns the run.
	tctx, cancelTrain := context.WithCancel(ctx)
	defer cancelTrain()
	go func() {
		select {
		case <-lock.Lost():
			cancelTrain()
		case <-tctx.Done():
		}
	}()

	if out.ResumeSource == "" {
		if err := p.initialEval(ctx, dir, rc, mc); err != nil {
			up.finish(false)
			return out, err
		}
	}

	data, err := p.OpenData(rc, mc)
	if err != nil {
		up.finish(false)
		return out, p.storeElsewhere(ctx, err)
	}
	var stateMu sync.Mutex
	var unrecorded lapse.Lapse
	lastState := time.Time{}
	var lastLoss *float64 // the last logged loss, for the segment's last word
	lastLossStep := 0     // its step
	hooks := trainer.Hooks{
		Metrics: func(m trainer.Metrics) {
			if p.Progress != nil {
				p.Progress(m.Step, rc.TotalSteps, &m)
			}
			stateMu.Lock()
			if m.Loss != nil {
				lastLoss, lastLossStep = m.Loss, m.Step
			}
			// An evaluation is always recorded: it is what a watcher
			// reads to see the run learn.
			due := time.Since(lastState) >= time.Second || m.EvalLoss != nil
			if due {
				lastState = time.Now()
			}
			stateMu.Unlock()
			if due {
				p.writeState(tctx, lock, rc, m, wall(), holds, &unrecorded, log)
			}
		},
		Step: func(step, total int) {
			if p.Progress != nil {
				p.Progress(step, total, nil)
			}
		},
		Checkpoint: func(_ context.Context, cdir string, step int) error {
			if err := p.guardDisk(dir, up.disk()); err != nil {
				return err
			}
			// Never waits: training goes on while object storage is
			// slow or hung.
			up.push(cdir, step)
			return nil
		},
	}
	res, terr := trainer.Run(tctx, trainer.Config{
		Run: rc, Out: dir, Resume: true, Data: data, Engine: p.Engine, Tokenizer: p.Tokenizer, TokenizerName: p.usesName(),
		MaxSteps: p.Run.Segment.MaxSteps, MaxDuration: p.Run.Segment.MaxDuration, PeakFLOPS: p.PeakFLOPS, Log: log, Wall: wall,
	}, hooks)
	out.Step, out.Done, out.Checkpoint, out.Devices, out.Precision = res.Step, res.Done, res.Checkpoint, res.Devices, res.Precision
	out.Wall = wall()
	var busy *trainer.RunDirBusyError
	if errors.As(terr, &busy) {
		terr = dirBusyError{run: run, busy: busy}
	}

	// With the last logged loss and its step: the state's own was written
	// up to a second before (writes are spaced), so it may be steps older,
	// and the segment may have stopped at a step it did not log.
	stateMu.Lock()
	final := trainer.Metrics{Step: res.Step, Tokens: res.Tokens, Loss: lastLoss}
	lossAt := map[string]string{}
	if lastLoss != nil {
		lossAt["loss_step"] = strconv.Itoa(lastLossStep)
	}
	stateMu.Unlock()
	var diverged *trainer.NonFiniteError
	if errors.As(terr, &diverged) {
		// The weights diverged, and the steps after the last good
		// checkpoint went with them: the run is where that checkpoint
		// is, as its resume, its results and its metrics say.
		final, lossAt = p.kept(res, rc, log)
		out.Step = final.Step
	}
	// Training is over and the run goes on: what is owed object storage
	// gets the grace now, not as long as a hung store would hold it. The
	// run's last segment waits for its uploads (a slow store's too): they
	// are the run's result.
	if !res.Done {
		startGrace()
	}
	// The run's last segment records that its training is over and what
	// it waits for, its last checkpoint's upload and then its results: the
	// run's state said it trained on at its last rate, with an ETA, for
	// the minutes a slow store takes.
	phase := ""
	if res.Done && terr == nil {
		phase = scheduler.PhaseResults
		if up.busy() {
			phase = scheduler.PhaseUpload
		}
		f := withPhase(holds, phase)
		maps.Copy(f, lossAt)
		p.writeState(ctx, lock, rc, final, wall(), f, &unrecorded, log)
	}
	uerr := up.finish(res.Done)
	out.Uploaded = up.uploadedStep()
	select {
	case <-lock.Lost():
		return out, fmt.Errorf("%w: run %s: stopped at step %d without marking it complete", scheduler.ErrRunLockLost, run, res.Step)
	default:
	}
	if terr != nil && res.Step < out.ResumedFrom {
		// The trainer refused the checkpoint (the run's settings no longer
		// match it) or failed before it was loaded: this segment trained
		// nothing, and the run's results and state stay as the segments
		// before it left them, where results written now would hold the
		// run at step 0 (its event files then emptied) with settings its
		// checkpoints were not trained with.
		return out, fmt.Errorf("resume from step %d: %w", out.ResumedFrom, terr)
	}
	var rerr error
	if !res.Done && up.unanswered() {
		// Object storage has not answered since before this segment began:
		// the results are written by the next segment that reaches it,
		// with its own, not waited for here as long as the grace.
		rerr = uerr
		if rerr == nil {
			rerr = fmt.Errorf("results of run %s: object storage did not answer this segment", run)
		}
	} else {
		if phase == scheduler.PhaseUpload {
			// The phase alone: the state's time stays the end of training,
			// which `sched status` counts the phase's time from.
			p.recordState(ctx, lock, map[string]string{"phase": scheduler.PhaseResults}, &unrecorded, log)
		}
		rerr = p.writeResults(gctx, dir, rc, out, log)
	}
	// The segment's last word on the run, however it ended: where it
	// stopped, and "done" to tell a waiting `sched demo` (and `sched
	// status`) that the results are final.
	done := out.Done && terr == nil && uerr == nil && rerr == nil
	last := maps.Clone(holds)
	if phase != "" {
		last["phase"] = ""
	}
	last["done"] = strconv.FormatBool(done)
	maps.Copy(last, lossAt)
	if done {
		if err := p.recordDone(ctx, lock, p.stateFields(rc, final, out.Wall, last), log); err != nil {
			return out, err
		}
	} else {
		p.writeState(context.WithoutCancel(ctx), lock, rc, final, out.Wall, last, &unrecorded, log)
	}
	if terr != nil {
		return out, terr
	}
	var notRecorded *unrecordedError
	if errors.As(uerr, &notRecorded) && rerr == nil && !out.Done && ctx.Err() == nil {
		// Object storage took every upload; Redis did not take the run's
		// state of the last one (it is full, or does not answer): the next
		// segment records it at its start, wherever it runs.
		log.Warn("this segment's last checkpoint is in object storage, but the run's state in Redis could not record it; the next segment records it",
			zap.String("run", run), zap.Int("step", notRecorded.step), zap.NamedError("redis", notRecorded.err))
		return out, nil
	}
	var fenced fenceError
	if errors.As(uerr, &fenced) && rerr == nil && !out.Done && ctx.Err() == nil {
		// Redis did not confirm the run's lease for the last upload: the
		// checkpoint is whole on this disk, and the next segment uploads it.
		log.Warn("Redis did not confirm the run's lease for this segment's last upload; the run goes on from the checkpoint on this disk",
			zap.String("run", run), zap.Int("step", res.Step), zap.NamedError("redis", fenced.err))
		return out, nil
	}
	if (uerr != nil || rerr != nil) && !out.Done && ctx.Err() == nil {
		// The run goes on while object storage is down: the checkpoint is
		// whole on this disk, the next segment here resumes from it and
		// uploads it (one on another worker resumes from the newest in
		// object storage), and the disk guard bounds what waits. A failed
		// segment would spend a retry on each outage and stop the run once
		// they ran out.
		log.Warn("object storage did not take this segment's last uploads; the run goes on from the checkpoint on this disk",
			zap.String("run", run), zap.Int("step", res.Step), zap.NamedError("upload", uerr), zap.NamedError("results", rerr))
		return out, nil
	}
	if uerr != nil {
		return out, uerr
	}
	if rerr != nil {
		return out, rerr
	}
	return out, nil
}

// kept is where a segment whose training diverged (res) leaves the run:
// at its last good checkpoint, with that step's loss, which the checkpoint
// records whether or not the step was logged; with the state's fields that
// name the loss's step, or, with no checkpoint (a run that diverged before
// its first), clear the loss of a step not kept. Where the checkpoint
// cannot be read, its step, and no loss.
func (p Params) kept(res trainer.Result, rc trainer.RunConfig, log *zap.Logger) (trainer.Metrics, map[string]string) {
	none := scheduler.NoLoss()
	if res.Checkpoint == "" {
		return trainer.Metrics{}, none
	}
	st, err := trainer.CheckCheckpoint(res.Checkpoint)
	if err != nil {
		log.Warn("the last good checkpoint of a diverged segment did not read: the run's state records its step, without a loss", zap.Error(err))
		step, _ := trainer.DirStep(filepath.Base(res.Checkpoint))
		return trainer.Metrics{Step: step, Tokens: int64(step) * int64(rc.TokensPerStep())}, none
	}
	loss := st.Loss
	return trainer.Metrics{Step: st.Step, Tokens: st.Tokens, Loss: &loss}, map[string]string{"loss_step": strconv.Itoa(st.Step)}
}

// initialEval logs the evaluation loss of the initial weights as step 0,
// before a fresh run's first step: the curve then starts where the model
// does (about ln(vocab) for a sane initialisation, a check in itself), and
// "how far has the loss fallen" has a true first point. Evaluation reads
// the held-out windows only, so training is unchanged by it.
func (p Params) initialEval(ctx context.Context, dir string, rc trainer.RunConfig, mc model.Config) error {
	if rc.EvalBatches <= 0 || rc.EvalEvery <= 0 {
		return nil
	}
	path := filepath.Join(dir, results.MetricsFile)
	if f, err := os.Open(path); err == nil {
		recs, rerr := results.ReadMetrics(f)
		f.Close()
		if rerr == nil && len(recs) > 0 && recs[0].Step == 0 {
			return nil
		}
	}
	eng := p.Engine
	if eng == nil {
		var err error
		eng, err = model.NewEngine(rc.Engine, mc, model.Options{Precision: rc.Precision, MaxBatch: rc.Batch, MaxSeq: rc.Seq})
		if err != nil {
			return fmt.Errorf("engine %s: %w", rc.Engine, err)
		}
		defer eng.Close()
	}
	if err := eng.SetParams(model.InitParams(mc, rc.Seed)); err != nil {
		return fmt.Errorf("initial evaluation: %w", err)
	}
	data, err := p.OpenData(rc, mc)
	if err != nil {
		return p.storeElsewhere(ctx, err)
	}
	defer data.Close()
	sum := 0.0
	for i := 0; i < rc.EvalBatches; i++ {
		b, err := data.Eval(ctx, i, rc.Batch, rc.Seq)
		if err != nil {
			return fmt.Errorf("initial evaluation: %w", err)
		}
		l, err := eng.EvalLoss(b)
		if err != nil {
			return fmt.Errorf("initial evaluation: %w", err)
		}
		sum += l
	}
	ev := sum / float64(rc.EvalBatches)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("initial evaluation: %w", err)
	}
	werr := results.WriteRecord(f, results.Record{Step: 0, EvalLoss: &ev})
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

// acquireWaiting takes the run's lock, waiting up to one lease for it: a
// worker that died (SIGKILL, power loss) holds the run until its lease runs
// out, and its replacement should take over then, not after a retry
// back-off. A run still locked after a whole lease has a live holder.
func acquireWaiting(ctx context.Context, rdb redis.UniversalClient, run, owner string, ttl time.Duration, log *zap.Logger) (Lease, error) {
	deadline := time.Now().Add(ttl + ttl/10)
	for {
		l, err := scheduler.AcquireRun(ctx, rdb, run, owner, ttl, log)
		if !errors.Is(err, scheduler.ErrRunLocked) || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(ttl/10, time.Second)):
		}
	}
}

func resolveStores(m []trainer.MixtureEntry, root string) []trainer.MixtureEntry {
	out := append([]trainer.MixtureEntry(nil), m...)
	for i := range out {
		if root != "" && !filepath.IsAbs(out[i].Store) {
			out[i].Store = filepath.Join(root, out[i].Store)
		}
	}
	return out
}

// restored is where a segment resumes (restore).
type restored struct {
	step   int    // the step resumed from
	source string // where it was found, as Outcome.ResumeSource; "" for a run that begins
	// remote lists the complete checkpoints in object storage (none
	// without object storage), unless unknown: object storage did not
	// answer.
	remote  []int
	unknown bool
	// newest is the newest step object storage holds complete: remote's
	// last, or, unknown, the newest the run's state records uploaded; -1
	// none. The local checkpoints up to it are safe there, which the disk
	// guard may remove.
	newest int
	// newestAt is when newest was marked complete, as object storage
	// lists it; zero where unknown.
	newestAt time.Time
}

// restore makes dir's newest checkpoint the run's newest anywhere: when
// object storage holds a newer complete one (this worker's disk was lost,
// or the run moved here), it is pulled. The run's metrics.jsonl comes along
// when dir has none, so that the results keep the whole history.
//
// When object storage does not answer (store.Unreachable, or p.ObjectsDown
// without asking it), the run still resumes from dir's newest checkpoint if
// that is at least the newest the run's state records uploaded: object
// storage then holds none newer, and training goes on through the outage.
// Otherwise (the run's newest checkpoint is there and not here, or this
// disk holds none, or the run has no state to say) the outage is returned,
// and the task waits for the store.
func (p Params) restore(ctx context.Context, dir string) (restored, error) {
	r := restored{newest: -1}
	// A pull a kill cut off left its temporary directory: up to a whole
	// checkpoint that nothing else removes.
	if stale, _ := filepath.Glob(filepath.Join(dir, pullTempPattern)); len(stale) > 0 {
		for _, d := range stale {
			if err := os.RemoveAll(d); err != nil {
				return r, fmt.Errorf("run %s: remove an interrupted pull: %w", p.Run.Name, err)
			}
		}
		p.Log.Info("removed interrupted checkpoint pulls", zap.String("run", p.Run.Name), zap.Strings("dirs", stale))
	}
	local := -1
	var lost trainer.AllDamagedError
	if _, st, err := trainer.LatestIntactCheckpoint(dir, p.Log); err == nil {
		local = st.Step
	} else if !errors.As(err, &lost) && !errors.Is(err, trainer.ErrNoCheckpoint) {
		return r, err
	}
	if p.Objects != nil {
		// One listing serves the pull and the segment: the run's lock keeps
		// any other worker from adding to it meanwhile.
		err := p.ObjectsDown
		var pulled string
		pulledStep := -1
		passed := map[int]error{} // damaged ones passed over
		var marked map[int]time.Time
		if err == nil {
			if r.remote, marked, err = p.remoteSteps(ctx, p.listWithin(ctx, local), nil); err == nil {
				pulled, pulledStep, err = pullNewestOf(ctx, p.Objects, p.Run.Name, r.remote, local, dir, pullReport{
					damaged: func(step int, err error) {
						passed[step] = err
						p.Log.Warn("checkpoint in object storage passed over, as it did not download intact; trying the one before",
							zap.String("run", p.Run.Name), zap.Int("step", step), zap.Error(err))
					},
					again: func(step int, err error) {
						p.Log.Warn("checkpoint download does not match what was uploaded; downloading it again",
							zap.String("run", p.Run.Name), zap.Int("step", step), zap.String("endpoint", describe(p.Objects)), zap.Error(err))
					},
				})
			}
		}
		if store.Unreachable(err) {
			return p.restoreOffline(ctx, local, err)
		}
		if err != nil {
			return r, err
		}
		// A damaged one is not held: its step is no newest to count the
		// uploads and the disk guard against.
		for _, s := range r.remote {
			if passed[s] == nil {
				r.newest = s
			}
		}
		r.newestAt = marked[r.newest]
		if pulledStep < 0 && local < 0 && len(passed) > 0 {
			// None of them downloaded intact, and this disk holds none:
			// training from step 0 would overwrite the run's history
			// (its metrics, its results) with a new one. Each download
			// was made several times, and what differed each time may
			// still be a proxy's doing, not the store's: the stored
			// copies are checked before anything is deleted.
			steps := slices.Sorted(maps.Keys(passed))
			newest := steps[len(steps)-1]
			return r, notResumable{fmt.Errorf("run %s: no checkpoint of it in object storage downloaded intact (steps %v; the newest: %v), and this disk holds no intact one. "+
				"Before deleting anything, check the stored copies: hash each file of the newest, %s at %s, as the store holds it, from a machine with nothing between it and the store "+
				"(with MinIO's client: 'mc cat ALIAS/BUCKET/%sFILE | sha256sum'), and compare with the sha256 its %s lists (trainer_state.json's, where the marker was written by an earlier kiln and lists none). "+
				"Where they match, the stored copies are intact and something between this worker and the store (a proxy, a faulty link) changes what it downloads: mend that and enqueue the run again ('sched enqueue train %s'). "+
				"Where they differ, copy an intact checkpoint of the run into %s on this worker and enqueue the run again, or, to train it from step 0, delete %s in object storage and enqueue it again",
				p.Run.Name, steps, passed[newest], checkpointKey(p.Run.Name, newest), describe(p.Objects), checkpointKey(p.Run.Name, newest), MarkerFile,
				p.Run.Name, dir, CheckpointPrefix(p.Run.Name))}
		}
		if pulledStep > local {
			// The checkpoint carries the run's metrics up to its step: the
			// history continues from there, whatever this disk held.
			if err := os.Rename(filepath.Join(pulled, results.MetricsFile), filepath.Join(dir, results.MetricsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return r, fmt.Errorf("restore metrics of run %s: %w", p.Run.Name, err)
			}
			p.Log.Info("resuming from object storage", zap.String("run", p.Run.Name), zap.Int("step", pulledStep))
			r.step, r.source = pulledStep, "object storage"
			return r, nil
		}
	}
	if local >= 0 {
		p.Log.Info("resuming from the local checkpoint", zap.String("run", p.Run.Name), zap.Int("step", local))
		r.step, r.source = local, "local"
		return r, nil
	}
	if len(lost.SetAside) > 0 {
		// Training from step 0 would overwrite the run's history with a
		// new one: said once, for good. The damaged checkpoints stay set
		// aside, so the next enqueue does start the run over.
		return r, notResumable{fmt.Errorf("run %s: %w, and object storage holds no complete one: to train the run from step 0, enqueue it again ('sched enqueue train %s'; the damaged ones stay beside it as *.damaged)", p.Run.Name, lost, p.Run.Name)}
	}
	return r, nil
}

// recordStored records in the run's state the newest checkpoint object
// storage holds complete, where the state records an older one or none,
// and reports whether it did: Redis lost the run's state, or the worker
// that uploaded the checkpoint stopped between its marker and its state
// write (SIGKILL, power loss). Mid-run the segment's first upload would
// record a newer one, hours away at the pilot's interval, and until then
// `sched status` and kiln_run_checkpoint_step named an older one, or none;
// after a run's last checkpoint no upload comes, and they did for good.
func (p Params) recordStored(ctx context.Context, lock Lease, r restored, log *zap.Logger) bool {
	if r.unknown || r.newest < 0 {
		return false
	}
	st, known, err := scheduler.ReadRunState(ctx, p.Redis, p.Run.Name)
	if err != nil || known && st.Checkpoint >= r.newest {
		// A state Redis does not give is not written either: the segment
		// reads it again at once, and stops where it cannot.
		return false
	}
	// When the marker was stored, as the state's own time of a checkpoint
	// is when its upload ended; none where the listing gives none.
	at := ""
	if !r.newestAt.IsZero() {
		at = r.newestAt.UTC().Format(time.RFC3339)
	}
	log.Info("recording the newest checkpoint in object storage in the run's state, which recorded an older one or none", zap.Int("step", r.newest), zap.Int("recorded", st.Checkpoint))
	if err := lock.Fenced(ctx, map[string]string{"checkpoint": strconv.Itoa(r.newest), "checkpoint_at": at}); err != nil {
		log.Warn("record the newest checkpoint in object storage in the run's state", zap.Int("step", r.newest), zap.Error(err))
	}
	return true
}

// restoreOffline is restore while object storage does not answer (outage
// says how): from local, the step of dir's newest intact checkpoint (-1
// none), when the run's state says object storage holds none newer.
func (p Params) restoreOffline(ctx context.Context, local int, outage error) (restored, error) {
	st, known, err := scheduler.ReadRunState(ctx, p.Redis, p.Run.Name)
	if err != nil || !known {
		// Without the run's state (a run not begun, or Redis lost it)
		// nothing says what object storage holds.
		return restored{}, outage
	}
	if local < 0 || local < st.Checkpoint {
		where := "no checkpoint"
		if local >= 0 {
			where = fmt.Sprintf("step %d", local)
		}
		return restored{}, fmt.Errorf("run %s: its newest checkpoint, step %d, is in object storage, and this disk holds %s: %w", p.Run.Name, st.Checkpoint, where, outage)
	}
	p.Log.Warn("object storage does not answer: resuming from the local checkpoint, as new as any it holds; the uploads catch up once it answers",
		zap.String("run", p.Run.Name), zap.Int("step", local), zap.Int("recorded_uploaded", st.Checkpoint), zap.String("endpoint", describe(p.Objects)), zap.Error(outage))
	return restored{step: local, source: "local", unknown: true, newest: st.Checkpoint}, nil
}

// listWithin is how long a segment starting with local, the step of the
// newest intact checkpoint on this disk (-1 none), gives the listing of the
// run's checkpoints: AnswerWithin where it can train on from that
// checkpoint without it (restoreOffline), ListWithin where it cannot and
// waits for the store whatever the bound.
func (p Params) listWithin(ctx context.Context, local int) time.Duration {
	if local < 0 {
		return p.ListWithin
	}
	st, known, err := scheduler.ReadRunState(ctx, p.Redis, p.Run.Name)
	if err != nil || !known || local < st.Checkpoint {
		return p.ListWithin
	}
	return p.AnswerWithin
}

// remoteSteps is RemoteSteps of the run, with when each was marked
// complete, given within, and once ending is closed (nil: never)
// AnswerWithin from then where that is sooner: a store that does not
// answer by then is taken as one that is down (the error names the bound;
// store.Unreachable where within ran out), where it held the segment for
// its timeouts and retries.
func (p Params) remoteSteps(ctx context.Context, within time.Duration, ending <-chan struct{}) ([]int, map[int]time.Time, error) {
	lctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var cut atomic.Bool
	if ending != nil {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-ending:
			case <-stop:
				return
			}
			t := time.NewTimer(p.AnswerWithin)
			defer t.Stop()
			select {
			case <-t.C:
				cut.Store(true)
				cancel()
			case <-stop:
			}
		}()
	}
	steps, marked, err := remoteCheckpoints(lctx, p.Objects, p.Run.Name)
	if err != nil && ctx.Err() == nil {
		switch {
		case cut.Load():
			err = fmt.Errorf("object storage at %s does not answer (no listing of the run's checkpoints within %v of the segment's training ending): %w", describe(p.Objects), p.AnswerWithin, err)
		case errors.Is(lctx.Err(), context.DeadlineExceeded):
			err = fmt.Errorf("object storage at %s does not answer (no listing of the run's checkpoints within %v): %w", describe(p.Objects), within, err)
		}
	}
	return steps, marked, err
}

// dirBusyError is trainer.RunDirBusyError as a segment meets it: another
// process on this machine still trains the run in its directory, a segment
// whose worker lost the run's lock (stopped, frozen, cut off from Redis)
// and that has not ended yet.
type dirBusyError struct {
	run  string
	busy *trainer.RunDirBusyError
}

func (e dirBusyError) Error() string {
	return fmt.Sprintf("run %s: its directory %s on this machine is held by %s, a segment of the run that has not ended (its worker stopped, frozen or cut off from Redis): this segment is tried again; where that process hangs, stop it", e.run, e.busy.Dir, e.busy.Holder())
}

func (e dirBusyError) Unwrap() error { return e.busy }

// notResumable is a run that has trained but has no checkpoint left to
// resume from: no retry can change that (bad input: archived at once).
type notResumable struct{ error }

func (e notResumable) Unwrap() error  { return e.error }
func (e notResumable) BadInput() bool { return true }

// guardStart is the disk guard at a segment's start, once the uploads of
// what object storage lacks are queued. When the disk is short and those
// checkpoints are what holds it (object storage was down when they were
// written), it waits for their uploads before it decides: then the older
// ones are removable, and a run stopped by the guard during an outage
// resumes once object storage is back instead of failing on every retry.
func (p Params) guardStart(ctx context.Context, dir string, up *uploader, log *zap.Logger) error {
	err := p.guardDisk(dir, up.disk())
	if !errors.Is(err, ErrDiskFull) || !up.busy() {
		return err
	}
	log.Info("local disk below min_free_disk: uploading the local checkpoints object storage lacks before the disk guard decides", zap.Error(err))
	if err := up.idle(ctx); err != nil {
		return err
	}
	return p.guardDisk(dir, up.disk())
}

// graceContext is a context that ends grace after ctx does, or after
// start is called (the segment's training ended), whichever is first, or
// at the returned cancel: for the work a segment still owes once it is
// told to stop or has trained its steps.
func graceContext(ctx context.Context, grace time.Duration) (g context.Context, start func(), cancelAll context.CancelFunc) {
	g, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var once sync.Once
	start = func() {
		once.Do(func() {
			t := time.AfterFunc(grace, cancel)
			context.AfterFunc(g, func() { t.Stop() })
		})
	}
	stop := context.AfterFunc(ctx, start)
	return g, start, func() {
		stop()
		cancel()
	}
}

// usesName is the run's tokenizer's name, which its checkpoints record
// beside its tokenizer.json; empty when the segment was given none.
func (p Params) usesName() string {
	if p.Uses == nil {
		return ""
	}
	return p.Uses.Name
}

// withPhase is fields with the run's phase (scheduler.PhaseUpload, ...)
// set to phase, "" for none.
func withPhase(fields map[string]string, phase string) map[string]string {
	f := maps.Clone(fields)
	f["phase"] = phase
	return f
}

// clearPhase clears the phase that a segment stopped in its last phase
// (its worker killed as the run's last checkpoint uploaded) left in the
// run's state, where `sched status` would say of this segment, which may
// pull a checkpoint and train for hours, that its training is over. It
// reports whether the state may still record one: Redis did not take the
// write, or did not say.
func clearPhase(ctx context.Context, rdb redis.UniversalClient, lock Lease, run string, log *zap.Logger) bool {
	phase, err := rdb.HGet(ctx, scheduler.RunStateKey(run), "phase").Result()
	if errors.Is(err, redis.Nil) || err == nil && phase == "" {
		return false
	}
	if err == nil {
		err = lock.Fenced(ctx, map[string]string{"phase": ""})
	}
	if err != nil {
		log.Warn("the run's state may still record the last phase of an earlier segment that stopped in it; this segment's first record of its progress clears it",
			zap.String("phase", phase), zap.Error(err))
		return true
	}
	return false
}

// doneRetry is how often recordDone makes its write again while Redis
// does not take it.
const doneRetry = time.Second

// recordDone sets fields, the run's state at its end with done true,
// fenced; while Redis does not take the write (it is full, or does not
// answer) it is made again every doneRetry for as long as ctx lasts and
// the lock holds. A lost write left the run not done (`sched status`,
// kiln_run_done, a waiting `sched demo`) until someone queued another
// segment. Where the write is not made by then, the error says so: the
// task is tried again, and its retry, which trains nothing, records the
// run done, as asynq takes a task back whose completion Redis did not
// record by the end of its lease.
func (p Params) recordDone(ctx context.Context, lock Lease, fields map[string]string, log *zap.Logger) error {
	// Made once whatever ctx: a segment stopped as the run ends records it.
	err := lock.Fenced(context.WithoutCancel(ctx), fields)
	if err == nil {
		return nil
	}
	if !errors.Is(err, scheduler.ErrRunLockLost) && ctx.Err() == nil {
		log.Warn("the run reached its end, and Redis did not take the write that records it done: it is made again every second until Redis takes it, for as long as the task runs",
			zap.String("step", fields["step"]), zap.NamedError("redis", err))
		begun := time.Now()
		t := time.NewTicker(doneRetry)
		defer t.Stop()
	retry:
		for tries := 2; ; tries++ {
			select {
			case <-ctx.Done():
				break retry
			case <-lock.Lost():
				err = fmt.Errorf("%w (Redis: %w)", scheduler.ErrRunLockLost, err)
				break retry
			case <-t.C:
			}
			if err = lock.Fenced(ctx, fields); err == nil {
				log.Info("the run's end recorded: Redis took the write", zap.String("step", fields["step"]),
					zap.Int("tries", tries), zap.Duration("waited", time.Since(begun).Round(time.Millisecond)))
				return nil
			}
			if errors.Is(err, scheduler.ErrRunLockLost) || ctx.Err() != nil {
				break retry
			}
		}
	}
	return fmt.Errorf("run %s reached its end at step %s, and its state in Redis does not record it done: %w; the segment is tried again, and its retry, which trains nothing, records it",
		p.Run.Name, fields["step"], err)
}

// writeState records the run's progress in its state hash, fenced. While
// Redis does not answer every write fails (one a second at most):
// unrecorded folds them into a line when the first fails and one when a
// write succeeds again.
func (p Params) writeState(ctx context.Context, lock Lease, rc trainer.RunConfig, m trainer.Metrics, wall time.Duration, extra map[string]string,
	unrecorded *lapse.Lapse, log *zap.Logger) {
	p.recordState(ctx, lock, p.stateFields(rc, m, wall, extra), unrecorded, log)
}

// stateFields are the fields of the run's state that record its progress
// at m, with extra's over them.
func (p Params) stateFields(rc trainer.RunConfig, m trainer.Metrics, wall time.Duration, extra map[string]string) map[string]string {
	f := map[string]string{
		"step":    strconv.Itoa(m.Step),
		"total":   strconv.Itoa(rc.TotalSteps),
		"tokens":  strconv.FormatInt(m.Tokens, 10),
		"worker":  p.Owner,
		"updated": time.Now().UTC().Format(time.RFC3339),
		"wall_s":  strconv.FormatFloat(wall.Seconds(), 'f', 3, 64),
	}
	if m.Loss != nil {
		maps.Copy(f, scheduler.LossFields(*m.Loss, m.Step))
	}
	// After the loss: the segment's last word names the step of a loss
	// logged before the step it stopped at, or clears one not kept.
	for k, v := range extra {
		f[k] = v
	}
	if m.EvalLoss != nil {
		f["eval_loss"] = strconv.FormatFloat(*m.EvalLoss, 'f', 4, 64)
		f["eval_step"] = strconv.Itoa(m.Step)
	}
	if m.TokPerSec > 0 {
		f["tok_per_s"] = strconv.FormatFloat(m.TokPerSec, 'f', 0, 64)
		// Beside the rate, always: a run resumed on fewer GPUs says so.
		f["gpus"] = strconv.Itoa(max(m.GPUs, 1))
		left := float64(rc.TotalSteps-m.Step) * float64(rc.TokensPerStep()) / m.TokPerSec
		f["eta_s"] = strconv.FormatFloat(left, 'f', 0, 64)
	}
	return f
}

// recordState sets fields of the run's state, fenced, as writeState does.
func (p Params) recordState(ctx context.Context, lock Lease, f map[string]string, unrecorded *lapse.Lapse, log *zap.Logger) {
	err := lock.Fenced(ctx, f)
	if errors.Is(err, context.Canceled) {
		return
	}
	switch first, lost := unrecorded.Note(err); {
	case first:
		log.Warn("run state not recorded; further failures are not logged until a write succeeds", zap.Error(err))
	case lost > 0:
		log.Info("run state recorded again", zap.Int("writes_lost", lost))
	}
}

// checkUses refuses data over a store made by another tokenizer than
// uses. Data that is not a mixture of stores (tests, the demo's own) has
// nothing to check.
func checkUses(d trainer.Data, uses catalog.Entry) error {
	m, ok := d.(interface{ Stores() []catalog.Store })
	if !ok {
		return nil
	}
	for _, s := range m.Stores() {
		if err := catalog.CheckUses(s, uses); err != nil {
			return err
		}
	}
	return nil
}

// storeElsewhere adds to the error of a mixture's store that this disk
// lacks (tokens.NoStoreError) the tokens its status in object storage
// records, where it records some: the store was ingested on the disk of
// another worker, the one that serves append, and the error then says to
// train there or copy the store here, not to ingest into it.
func (p Params) storeElsewhere(ctx context.Context, err error) error {
	var no *tokens.NoStoreError
	if !errors.As(err, &no) || p.Objects == nil || p.TokensDir == "" {
		return err
	}
	name := filepath.Base(no.Dir)
	if filepath.Join(p.TokensDir, name) != filepath.Clean(no.Dir) || ingest.CheckStoreName(name) != nil {
		return err // a store named by its path, which no ingest publishes
	}
	sctx, cancel := context.WithTimeout(ctx, p.AnswerWithin)
	defer cancel()
	st, serr := (&ingest.Pipeline{Objects: p.Objects}).Status(sctx, name)
	if serr != nil {
		// The error as it was: what it says of the store still holds.
		p.Log.Warn("the status of a token store this disk lacks was not read", zap.String("store", name), zap.Error(serr))
		return err
	}
	no.Stored = st.Tokens
	return err
}
