package trainer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
)

// Config is one call of Run: a run configuration and where and how far to
// take it. The queue's segment handler bounds each call with MaxSteps or
// MaxDuration and uploads each checkpoint from Hooks.Checkpoint; `sched
// train` runs to the end.
type Config struct {
	Run RunConfig
	// Out is the run directory: checkpoints go to Out/step-NNNNNNN and the
	// logged steps to Out/metrics.jsonl.
	Out string
	// Resume continues from the newest intact checkpoint in Out when there
	// is one, setting aside newer damaged ones (LatestIntactCheckpoint).
	Resume bool
	// Data supplies the windows; Run.Mixture names the stores it reads.
	// Run closes it.
	Data Data
	// Engine, when set, is used instead of one made from Run.Engine (the
	// caller keeps ownership). Its Config must be the run's model.
	Engine model.Engine
	// Tokenizer is the bytes of tokenizer.json, copied into every checkpoint.
	// A resume refuses a checkpoint that holds another one.
	Tokenizer []byte
	// TokenizerName is what the user calls Tokenizer (a published
	// tokenizer's name, or the file it was read from), recorded in every
	// checkpoint's trainer_state.json and named in messages; it may be
	// empty.
	TokenizerName string
	// MaxSteps and MaxDuration end this call early (0 = no bound), with a
	// checkpoint, so that the next call resumes from it.
	MaxSteps    int
	MaxDuration time.Duration
	// PeakFLOPS is the device's peak for MFU; 0 leaves MFU out.
	PeakFLOPS float64
	Log       *zap.Logger
	// Wall, when set, is the run's wall-clock so far (a segment's: the
	// sum over the run's segments), recorded in each checkpoint's
	// trainer_state.json. Unset, it is the resumed checkpoint's plus the
	// time since this call began.
	Wall func() time.Duration

	// beforeWrite, when set, is called by the checkpoint writer before
	// each write, off the training loop (tests hold a write there).
	beforeWrite func(step int)
	// metricsSynced, when set, is called on the training loop once
	// metrics.jsonl is synced ahead of the checkpoint of step, before its
	// write begins (tests check that order against beforeWrite).
	metricsSynced func(step int)
}

// Hooks let a caller follow a run. Every hook is optional.
type Hooks struct {
	// Metrics receives each logged step (also written to metrics.jsonl).
	Metrics func(Metrics)
	// Step is called after every optimizer step, for progress displays.
	Step func(step, total int)
	// Checkpoint is called after a checkpoint's directory is complete, for
	// uploads. Checkpoints are written while training goes on, so it is
	// called from another goroutine than Step and Metrics, one checkpoint
	// at a time and in step order; an error stops the run at the next
	// step boundary.
	Checkpoint func(ctx context.Context, dir string, step int) error
}

// Result is where a call of Run stopped.
type Result struct {
	Step   int
	Tokens int64
	// Checkpoint is the last checkpoint written or resumed from: a
	// complete directory (Run returns only after its writes have ended).
	Checkpoint string
	// Done is true when the run reached its total steps.
	Done bool
	// Devices is how many GPUs trained (gpus: all is counted only when
	// the engine starts); 1 for an engine of one device, 0 when no engine
	// started.
	Devices int
	// Precision is the one the engine computed in: the run's, except on
	// the CPU engine, which computes in fp32 whatever was asked (an engine
	// auto without a GPU, for one); empty when no engine started. A run's
	// throughput is held to the bench row of this precision.
	Precision string
}

// NonFiniteError is a loss or gradient norm that is NaN or infinite: the
// run stops without writing the step, so the last checkpoint stays good.
type NonFiniteError struct {
	Step           int
	Loss, GradNorm float64
	LastGood       string
}

func (e *NonFiniteError) Error() string {
	if e.LastGood == "" {
		return fmt.Sprintf("step %d: loss %g, gradient norm %g: training diverged before its first checkpoint; train it again from step 0 with a lower lr or a longer warmup", e.Step, e.Loss, e.GradNorm)
	}
	return fmt.Sprintf("step %d: loss %g, gradient norm %g: training diverged; the last good checkpoint is %s: resume from it with a lower lr or a longer warmup", e.Step, e.Loss, e.GradNorm, e.LastGood)
}

// Run trains cfg.Run from its start or its last checkpoint, until the
// run's end, a bound of cfg, or ctx is cancelled. On cancellation it writes
// a checkpoint at the next step boundary and returns ctx's error with the
// Result, so that a stopped worker loses no step.
func Run(ctx context.Context, cfg Config, hooks Hooks) (Result, error) {
	if cfg.Data == nil {
		return Result{}, errors.New("trainer: Config.Data is nil")
	}
	defer cfg.Data.Close()
	rc := cfg.Run.WithDefaults()
	if err := rc.Validate(); err != nil {
		return Result{}, err
	}
	mc, err := rc.ModelConfig()
	if err != nil {
		return Result{}, err
	}
	// A fresh run's evaluation is checked before anything is written; a
	// resume's once its checkpoint is (below).
	if !cfg.Resume {
		if err := checkEvalData(ctx, cfg.Data, rc); err != nil {
			return Result{}, err
		}
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	l := &loop{cfg: cfg, rc: rc, mc: mc, hooks: hooks, log: log, ckStep: -1}
	// The checkpoint is read before the engine is made, so that one of
	// another shape is refused before a large model is allocated.
	if err := makeRunDir(cfg.Out); err != nil {
		return Result{}, err
	}
	lock, err := lockRunDir(cfg.Out)
	if err != nil {
		return Result{}, err
	}
	defer lock.Close()
	var snap *Snapshot
	if !cfg.Resume {
		// Again under the lock: another run may have begun there since.
		if err := refuseHeldCheckpoints(cfg.Out); err != nil {
			return Result{}, err
		}
	}
	if cfg.Resume {
		dir, err := newestUsable(cfg.Out, log, func(dir string) (err error) {
			snap, err = ReadCheckpoint(dir, &mc)
			return err
		})
		var lost AllDamagedError
		switch {
		case errors.As(err, &lost):
			return Result{}, badInput(fmt.Errorf("%w: to train the run again from step 0, run without --resume (the damaged ones stay beside it as *.damaged)", err))
		case errors.Is(err, ErrNoCheckpoint):
			log.Info("no checkpoint to resume from; starting the run", zap.String("out", cfg.Out))
		case err != nil:
			return Result{}, err
		default:
			// Refused before anything is written: the run's checkpoints
			// and metrics.jsonl stay as the first tokenizer left them.
			if err := CheckResume(dir, snap.State, rc, tokenizerOf(cfg.TokenizerName, cfg.Tokenizer)); err != nil {
				return Result{}, err
			}
			if changed := settingsChanged(snap.State.Run, rc); len(changed) > 0 {
				log.Info("the run's settings differ from its checkpoint's: the new ones apply from its step on",
					zap.String("checkpoint", dir), zap.Int("step", snap.State.Step), zap.Strings("changed", changed))
			}
			l.lastCk = dir
		}
		// After the checkpoint's checks: a sequence length changed since
		// it leaves the stores fewer windows of the new length, often none
		// held out, and the change, which no ingest mends, is what to say.
		if err := checkEvalData(ctx, cfg.Data, rc); err != nil {
			return Result{}, err
		}
	}
	warnWithoutHeldOut(log, cfg.Data, rc)
	if len(cfg.Tokenizer) > 0 {
		l.tokName = cfg.TokenizerName
		// The tokenizer is the checkpoint's (checked above): a resume
		// that does not name it keeps the name the checkpoint recorded.
		if l.tokName == "" && snap != nil && len(snap.Tokenizer) > 0 {
			l.tokName = snap.State.TokenizerName
		}
	}

	eng := cfg.Engine
	if eng == nil {
		eng, err = model.NewEngine(rc.Engine, mc, model.Options{Precision: rc.Precision, MaxBatch: rc.Batch, MaxSeq: rc.Seq,
			GPUs: int(rc.GPUs), Accumulate: rc.Accumulate, Log: func(s string) { log.Info(s) }})
		if err != nil {
			err = fmt.Errorf("engine %s: %w", rc.Engine, err)
			if snap != nil {
				err = &ResumedError{Step: snap.State.Step, Err: err}
			}
			return Result{}, err
		}
		defer eng.Close()
	}
	if err := checkDevices(eng, rc); err != nil {
		return Result{}, err
	}
	l.eng = eng
	l.ck = &ckWriter{eng: eng, mc: mc, out: cfg.Out, tokenizer: cfg.Tokenizer, log: log, hook: hooks.Checkpoint,
		beforeWrite: cfg.beforeWrite}
	// An engine on a device knows it, so MFU needs no configured peak.
	if l.cfg.PeakFLOPS <= 0 {
		if d, ok := eng.(model.Device); ok {
			l.cfg.PeakFLOPS = PeakFor(d.Device().Name, rc.Precision)
		}
	}
	l.wall = cfg.Wall
	if l.wall == nil {
		var before time.Duration
		if snap != nil {
			before = snap.State.Wall()
		}
		began := time.Now()
		l.wall = func() time.Duration { return before + time.Since(began) }
	}
	if err := l.start(snap); err != nil {
		return l.result(), err
	}
	if err := l.openMetrics(); err != nil {
		return l.result(), err
	}
	defer l.metrics.Close()
	return l.finish(l.run(ctx))
}

// checkEvalData refuses a run that evaluates on data with no held-out
// window before its first step, not at its first evaluation, after
// eval_every steps of training that no checkpoint would keep.
func checkEvalData(ctx context.Context, d Data, rc RunConfig) error {
	if rc.EvalEvery <= 0 || rc.EvalBatches <= 0 {
		return nil
	}
	if _, err := d.Eval(ctx, 0, rc.Batch, rc.Seq); err != nil {
		return fmt.Errorf("evaluation every %d steps: %w", rc.EvalEvery, err)
	}
	return nil
}

// warnWithoutHeldOut warns, once a call (a segment), of each store of the
// data that holds no held-out window: the run's evaluation leaves it out,
// so its eval loss, each store's and the gates judged on them cover the
// other stores alone (a run none of whose stores holds one is refused by
// checkEvalData).
func warnWithoutHeldOut(log *zap.Logger, d Data, rc RunConfig) {
	hl, ok := d.(HeldOutLister)
	if !ok || rc.EvalEvery <= 0 || rc.EvalBatches <= 0 {
		return
	}
	for _, s := range hl.WithoutHeldOut() {
		log.Warn("a token store of the run holds too few tokens for a held-out window: the run's eval loss, and the gates judged on it, leave that store out until it holds them; ingest more into it",
			zap.String("store", s.Name), zap.Int64("tokens", s.Tokens), zap.Int64("needs", s.Need), zap.Int("seq", rc.Seq))
	}
}

// CheckResume refuses to resume rc, with the tokenizer tok (its name, and
// its tokenizer.json's SHA-256; none where the run gives none), from the
// checkpoint whose trainer_state.json, read from dir, is st: another
// tokenizer, another number of tokens a step for a length in tokens,
// other stores in the mixture, another seed or sequence length, or
// another model layout, each refused as bad input naming both and what to
// do. A resume runs it on the
// checkpoint it has read, and `sched enqueue train` on the run's newest in
// object storage, so that a segment the worker would refuse is not queued.
func CheckResume(dir string, st State, rc RunConfig, tok tokens.Tokenizer) error {
	if err := checkTokenizer(dir, st, tok); err != nil {
		return err
	}
	if err := checkRunLength(dir, st, rc); err != nil {
		return err
	}
	if err := checkMixture(dir, st, rc); err != nil {
		return err
	}
	if err := checkDataOrder(dir, st, rc); err != nil {
		return err
	}
	return checkModel(dir, st, rc)
}

// checkModel refuses to resume rc from the checkpoint st, read from dir,
// where rc's model is of another layout than the one st's run gave (both
// as this build's presets make them): its weights cannot be read into it.
// A resume reads the layout from the checkpoint's config.json too, and
// refuses it in the same words (ReadCheckpoint); this check, on
// trainer_state.json alone, is what `sched enqueue train` can make without
// the weights, where Redis no longer holds the run's layout. A checkpoint
// of a build that did not record its run's model is left to the weights.
func checkModel(dir string, st State, rc RunConfig) error {
	if st.Run.Model == "" {
		return nil
	}
	was, err := st.Run.ModelConfig()
	if err != nil {
		return nil
	}
	now, err := rc.ModelConfig()
	if err != nil {
		return err
	}
	if a, b := Shape(was), Shape(now); a != b {
		return badInput(fmt.Errorf("checkpoint %s (step %d) holds a model of another layout, %s: %s", dir, st.Step, ShapeDiff(a, b), otherModelFix))
	}
	return nil
}

// ResumedError is Err, an error of a run resumed from its checkpoint of
// Step: the run's sequence length, seed, model and mixture are its
// checkpoints', which advice on what to change in the run leaves alone
// (runs.SizeAdvice). It reads as Err.
type ResumedError struct {
	Step int
	Err  error
}

func (e *ResumedError) Error() string { return e.Err.Error() }
func (e *ResumedError) Unwrap() error { return e.Err }

// checkRunLength refuses to resume a run whose length is total_tokens
// (RunConfig.LengthInTokens) with another number of tokens a step than
// the checkpoint st, read from dir, trained with. total_steps is derived from
// the new size alone, as if every step had been of it: a larger batch
// would end the run early, or at once as done, a smaller one train past
// its tokens, and the cosine would jump to another point of its decay.
func checkRunLength(dir string, st State, rc RunConfig) error {
	was, now := st.Run.TokensPerStep(), rc.TokensPerStep()
	if !rc.LengthInTokens() || was <= 0 || was == now {
		return nil
	}
	end := st.Tokens + int64(max(rc.TotalSteps-st.Step, 0))*int64(now)
	return badInput(fmt.Errorf("checkpoint %s (step %d, %d tokens) trained %d tokens a step (seq %d x batch %d x accumulate %d); "+
		"this run gives %d (%d x %d x %d), and its length is total_tokens %d, which in steps of the new size ends at step %d after %d tokens: "+
		"keep seq x batch x accumulate at %d (a smaller batch with accumulate raised as much), or give the run's length as total_steps",
		dir, st.Step, st.Tokens, was, st.Run.Seq, st.Run.Batch, st.Run.Accumulate,
		now, rc.Seq, rc.Batch, rc.Accumulate, rc.TotalTokens, rc.TotalSteps, end, was))
}

// checkMixture refuses to resume with a mixture of other stores than the
// checkpoint st, read from dir, trained on, or of the same in another
// order: its data cursor holds each store's place in the order the
// mixture lists them, and a store would go on from another's (skipping
// windows it never trained on, repeating others) where the stores'
// sizes do not give it away. A store is known by its directory's name,
// so that a store moved elsewhere whole is still itself; the weights may
// change (settingsChanged logs it).
func checkMixture(dir string, st State, rc RunConfig) error {
	names := func(m []MixtureEntry) []string {
		out := make([]string, len(m))
		for i, e := range m {
			out[i] = e.storeName()
		}
		return out
	}
	was, now := names(st.Run.Mixture), names(rc.Mixture)
	if len(was) == 0 || slices.Equal(was, now) {
		return nil
	}
	return badInput(fmt.Errorf("checkpoint %s (step %d) trained on the stores %s, in that order; this run names %s: each store's place in the data is kept in that order, so the run would go on with other windows than its own. "+
		"Give the mixture its stores as they were, in the same order (their weights may change), or train a run of another name",
		dir, st.Step, strings.Join(was, ", "), strings.Join(now, ", ")))
}

// checkDataOrder refuses a resume with another seed or sequence length
// than the checkpoint's, before anything is written: the data cursor it
// resumes was made with them (and the model's first weights with the
// seed), so the run could not go on over its own windows. A checkpoint of
// a build that did not record them is left to the cursor's own check.
func checkDataOrder(dir string, st State, rc RunConfig) error {
	was := st.Run
	if was.Seq == 0 || was.Seed == rc.Seed && was.Seq == rc.Seq {
		return nil
	}
	return badInput(fmt.Errorf("checkpoint %s (step %d) was trained with seed %d and seq %d; this run asks for seed %d and seq %d: its data order was drawn with the checkpoint's, and a resume can only go on with it. "+
		"Resume with seed %d and seq %d (sched train's --seed and --seq, or the run's entry), or train a run of another name or --out",
		dir, st.Step, was.Seed, was.Seq, rc.Seed, rc.Seq, was.Seed, was.Seq))
}

// storeName is what a resume knows e's store by: its directory's name,
// wherever the directory now is.
func (e MixtureEntry) storeName() string { return filepath.Base(filepath.Clean(e.Store)) }

// settingsChanged lists the settings of rc that differ from was, the
// checkpoint's, as "lr 0.0003 -> 0.0001": a resume trains on with rc's
// (the model's shape, the seed, the mixture and the tokenizer are checked
// before, and refused when changed).
func settingsChanged(was, rc RunConfig) []string {
	var out []string
	add := func(name string, a, b any) {
		if as, bs := fmt.Sprint(a), fmt.Sprint(b); as != bs {
			out = append(out, name+" "+as+" -> "+bs)
		}
	}
	add("lr", was.LR, rc.LR)
	add("warmup", was.Warmup, rc.Warmup)
	add("floor", was.FloorOr(), rc.FloorOr())
	add("total_steps", was.TotalSteps, rc.TotalSteps)
	add("batch", was.Batch, rc.Batch)
	add("accumulate", was.Accumulate, rc.Accumulate)
	add("clip", was.ClipOr(), rc.ClipOr())
	add("weight_decay", was.WeightDecay, rc.WeightDecay)
	add("beta1", was.Beta1, rc.Beta1)
	add("beta2", was.Beta2, rc.Beta2)
	add("eps", was.Eps, rc.Eps)
	add("eval_every", was.EvalEvery, rc.EvalEvery)
	add("eval_batches", was.EvalBatches, rc.EvalBatches)
	add("checkpoint_every", was.CheckpointEvery, rc.CheckpointEvery)
	add("log_every", was.LogEvery, rc.LogEvery)
	add("engine", was.Engine, rc.Engine)
	add("precision", was.Precision, rc.Precision)
	weights := func(m []MixtureEntry) string {
		var ws []string
		for _, e := range m {
			ws = append(ws, fmt.Sprintf("%s=%g", e.storeName(), e.Weight))
		}
		return strings.Join(ws, ",")
	}
	add("mixture", weights(was.Mixture), weights(rc.Mixture))
	return out
}

// checkDevices refuses a step that the engine's GPUs cannot share evenly
// (gpus: all is counted only once the engine has found its GPUs).
func checkDevices(eng model.Engine, rc RunConfig) error {
	p, ok := eng.(model.Parallel)
	if !ok {
		return nil
	}
	_, err := NewGlobalBatch(rc.Batch, rc.Accumulate, p.Devices())
	return err
}

// loop is the state of one Run call.
type loop struct {
	cfg   Config
	rc    RunConfig
	mc    model.Config
	hooks Hooks
	log   *zap.Logger
	eng   model.Engine
	ck    *ckWriter

	step     int   // optimizer steps taken
	tokens   int64 // target tokens trained on
	lastCk   string
	ckStep   int    // step of lastCk, -1 when none
	tokName  string // trainer_state.json's tokenizer_name; empty without a tokenizer
	loss     float64
	metrics  *os.File
	markTime time.Time // start of the current logging interval: when the last logged step ended
	began    time.Time // start of this process's part of the run
	markTok  int64
	// wall is the run's wall-clock so far, over all its calls (Config.Wall).
	wall func() time.Duration
	// paused is the time inside the current logging interval that was
	// not training: the evaluation at the step that opened it.
	paused time.Duration
	// pend is the step queued on the engine whose metrics are read once
	// the next step is queued (step-ahead; nil when none).
	pend *pendingStep
	// last is the step this call trained last, with its metrics and
	// learning rate (last.step 0: none yet), and logged the step of the
	// run's last line with a training loss (0: none): a call that ends at
	// a step not logged logs it (logEnd).
	last   doneStep
	logged int
}

// doneStep is a trained step's metrics, kept until the next step.
type doneStep struct {
	step int
	m    model.StepMetrics
	lr   float64
}

// pendingStep is a queued step whose metrics are still on their way: the
// learning rate it was given, and the engine's wait for its metrics.
type pendingStep struct {
	lr   float64
	wait func() (model.StepMetrics, error)
}

// queued is the number of optimizer steps queued on the engine: those
// taken and the one whose metrics are pending.
func (l *loop) queued() int {
	if l.pend != nil {
		return l.step + 1
	}
	return l.step
}

// start puts the resumed snapshot, or freshly initialised weights, on the
// engine.
func (l *loop) start(s *Snapshot) error {
	if s == nil {
		return l.eng.SetParams(model.InitParams(l.mc, l.rc.Seed))
	}
	if err := l.eng.SetParams(s.Params); err != nil {
		return fmt.Errorf("resume from %s: %w", l.lastCk, err)
	}
	if err := l.eng.SetOptimizerState(s.Optimizer); err != nil {
		return fmt.Errorf("resume from %s: %w", l.lastCk, err)
	}
	if err := l.cfg.Data.Seek(s.State.Cursor); err != nil {
		return fmt.Errorf("resume from %s: data cursor: %w", l.lastCk, err)
	}
	l.step, l.tokens, l.ckStep, l.loss = s.State.Step, s.State.Tokens, s.State.Step, s.State.Loss
	l.log.Info("resumed", zap.String("checkpoint", l.lastCk), zap.Int("step", l.step), zap.Int64("tokens", l.tokens))
	return nil
}

func (l *loop) result() Result {
	r := Result{Step: l.step, Tokens: l.tokens, Checkpoint: l.lastCk, Done: l.step >= l.rc.TotalSteps}
	if l.eng != nil {
		r.Devices = l.devices()
		r.Precision = model.ComputedPrecision(l.eng.Name(), l.rc.Precision)
	}
	return r
}

// devices is how many devices the engine trains on: its GPUs, or 1.
func (l *loop) devices() int {
	if p, ok := l.eng.(model.Parallel); ok {
		return p.Devices()
	}
	return 1
}

func (l *loop) run(ctx context.Context) (Result, error) {
	began, first := time.Now(), l.step
	l.began = began
	l.markTime, l.markTok = began, l.tokens
	// A step, once begun, is either finished or abandoned as a whole, and
	// a checkpoint, once begun, is always finished: a stop never leaves
	// half of either. Checkpoints run on work, which a stop does not
	// cancel; the stop is read from ctx at step boundaries, to abandon a
	// step while its data is read, and between a step's evaluation
	// batches, to give up that evaluation (the step stands).
	work := context.WithoutCancel(ctx)
	for l.step < l.rc.TotalSteps {
		// A checkpoint written beside the steps that failed stops the run
		// at the next boundary, as it did when written in line.
		if c := l.ck.failed(); c != nil {
			l.ended(c)
			return l.result(), l.fail(work, c.err)
		}
		if ctx.Err() != nil {
			return l.stop(ctx)
		}
		// The duration bound takes at least one step: a call that ended
		// before its first would end the next the same way (a segment
		// bound shorter than the run's setup chained segments for ever).
		if (l.cfg.MaxSteps > 0 && l.queued()-first >= l.cfg.MaxSteps) ||
			(l.cfg.MaxDuration > 0 && l.queued() > first && time.Since(began) >= l.cfg.MaxDuration) {
			if err := l.logEnd(work); err != nil {
				return l.result(), err
			}
			err := l.checkpointNow(work)
			return l.result(), err
		}
		if err := l.trainStep(ctx, first); err != nil {
			if errors.Is(err, errAbandoned) {
				return l.stop(ctx)
			}
			return l.result(), l.fail(work, err)
		}
		// A checkpoint's step is never left pending (ahead), so with none
		// pending l.step is the step just trained.
		if l.pend == nil && l.rc.CheckpointEvery > 0 && l.step%l.rc.CheckpointEvery == 0 {
			if err := l.checkpoint(work); err != nil {
				return l.result(), err
			}
		}
	}
	if err := l.logEnd(work); err != nil {
		return l.result(), err
	}
	err := l.checkpointNow(work)
	return l.result(), err
}

// finish waits for a checkpoint still being written, so that the Result
// names a complete directory and the engine's state copy is no longer
// read when the caller closes the engine.
func (l *loop) finish(_ Result, err error) (Result, error) {
	if c := l.ck.wait(); c != nil {
		l.ended(c)
		if c.err != nil {
			err = errors.Join(err, c.err)
		}
	}
	return l.result(), err
}

// stop ends a cancelled run at the last completed step: its checkpoint is
// written (unless it is already on disk) and ctx's error returned, so that
// the caller knows the run stopped and resumes exactly there.
func (l *loop) stop(ctx context.Context) (Result, error) {
	if err := l.logEnd(context.WithoutCancel(ctx)); err != nil {
		return l.result(), errors.Join(ctx.Err(), err)
	}
	l.log.Info("stopping: writing a checkpoint at the step boundary", zap.Int("step", l.step))
	if err := l.checkpointNow(context.WithoutCancel(ctx)); err != nil {
		return l.result(), errors.Join(ctx.Err(), err)
	}
	return l.result(), ctx.Err()
}

// errAbandoned is a step given up part-way because the run was stopped:
// its micro-batches are undone (the data cursor is back at the step's
// start; the weights and optimizer state were never touched), so the
// checkpoint of the step before it is exact.
var errAbandoned = errors.New("step abandoned")

// accumulate runs the step's micro-batches, each scaled by 1/k so that the
// accumulated gradient is that of the mean loss over all k x Batch windows.
// A stop (ctx) before the last micro-batch's data is read abandons the
// step: the data cursor is returned to the step's start and errAbandoned
// returned, so the step is trained again, whole, after the resume. A stop
// after that read lets the step finish: only the compute is left.
func (l *loop) accumulate(ctx context.Context) error {
	if ctx.Err() != nil {
		return errAbandoned
	}
	n := l.queued() + 1
	start, err := l.cfg.Data.Cursor()
	if err != nil {
		return fmt.Errorf("step %d: data cursor: %w", n, err)
	}
	abandon := func(done int) error {
		if err := l.cfg.Data.Seek(start); err != nil {
			return fmt.Errorf("step %d: abandoned by a stop, and its data cursor could not be returned: %w", n, err)
		}
		l.log.Info("stopping: abandoned the step part-way", zap.Int("step", n),
			zap.Int("micro_batches_done", done), zap.Int("of", l.rc.Accumulate))
		return errAbandoned
	}
	if err := l.eng.ZeroGrad(); err != nil {
		return err
	}
	k := l.rc.Accumulate
	for i := 0; i < k; i++ {
		if ctx.Err() != nil {
			return abandon(i)
		}
		b, err := l.cfg.Data.Next(ctx, l.rc.Batch, l.rc.Seq)
		if err != nil {
			if ctx.Err() != nil {
				return abandon(i)
			}
			return fmt.Errorf("step %d: data: %w", n, err)
		}
		if err := checkIDs(b, l.mc.VocabSize); err != nil {
			return fmt.Errorf("step %d: %w", n, err)
		}
		if err := l.eng.ForwardBackward(b, 1/float32(k)); err != nil {
			return fmt.Errorf("step %d: %w", n, err)
		}
	}
	return nil
}

func (l *loop) trainStep(ctx context.Context, first int) error {
	if err := l.accumulate(ctx); err != nil {
		return err
	}
	n := l.queued() + 1
	lr := LearningRate(n-1, l.rc.LR, l.rc.Warmup, l.rc.TotalSteps, l.rc.FloorOr())
	if err := l.eng.Step(model.AdamW{LR: lr, Beta1: l.rc.Beta1, Beta2: l.rc.Beta2, Eps: l.rc.Eps,
		WeightDecay: l.rc.WeightDecay, Clip: l.rc.ClipOr()}); err != nil {
		// A pending step that diverged is the error to report.
		if serr := l.settle(context.WithoutCancel(ctx)); serr != nil {
			return serr
		}
		// An engine may refuse to apply a non-finite gradient; that is a
		// divergence like a non-finite loss, and is reported as one.
		if m, merr := l.eng.Metrics(); merr == nil && diverging(m) {
			return l.diverged(m)
		}
		return fmt.Errorf("step %d: %w", n, err)
	}
	// The step before this one, whose metrics have arrived while this one
	// was being queued; the device is busy with this one meanwhile.
	if err := l.settle(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	if l.ahead(ctx, n, first) {
		wait, err := l.eng.(model.MetricsAhead).MetricsLater()
		if err != nil {
			return fmt.Errorf("step %d: %w", n, err)
		}
		l.pend = &pendingStep{lr: lr, wait: wait}
		return nil
	}
	m, err := l.eng.Metrics()
	if err != nil {
		return fmt.Errorf("step %d: %w", n, err)
	}
	return l.finishStep(ctx, m, lr)
}

// ahead says whether step n, just queued, may be left pending while the
// next is queued: on an engine that can (model.MetricsAhead), for a step
// after which nothing reads the engine's state or ends the call. A
// checkpoint's step, an evaluation's, the last step, the last of this
// call (MaxSteps) and a step during a stop are completed at once.
func (l *loop) ahead(ctx context.Context, n, first int) bool {
	if _, ok := l.eng.(model.MetricsAhead); !ok || ctx.Err() != nil {
		return false
	}
	every := func(k int) bool { return k > 0 && n%k == 0 }
	return n < l.rc.TotalSteps && !every(l.rc.CheckpointEvery) && !every(l.rc.EvalEvery) &&
		(l.cfg.MaxSteps <= 0 || n-first < l.cfg.MaxSteps)
}

// settle completes the pending step, if any: it waits for its metrics and
// counts it, as finishStep does for a step completed at once.
func (l *loop) settle(ctx context.Context) error {
	p := l.pend
	if p == nil {
		return nil
	}
	l.pend = nil
	m, err := p.wait()
	if err != nil {
		return fmt.Errorf("step %d: %w", l.step+1, err)
	}
	return l.finishStep(ctx, m, p.lr)
}

// fail is err, the end of the call, once the pending step is settled (and
// its own error, should it have one, joined to err).
func (l *loop) fail(ctx context.Context, err error) error {
	if serr := l.settle(ctx); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// finishStep counts step l.step + 1, whose metrics are m: a non-finite
// loss or gradient norm ends the run; a logged step writes its line (and
// runs its evaluation).
func (l *loop) finishStep(ctx context.Context, m model.StepMetrics, lr float64) error {
	if diverging(m) {
		return l.diverged(m)
	}
	l.step++
	l.tokens += int64(l.rc.TokensPerStep())
	l.loss = m.Loss
	// When the step ended, which its line's rate counts to, also where
	// the line is written as the call ends (logEnd).
	if m.At.IsZero() {
		m.At = time.Now()
	}
	l.last = doneStep{step: l.step, m: m, lr: lr}
	if l.rc.LogEvery > 0 && l.step%l.rc.LogEvery == 0 || l.rc.EvalEvery > 0 && l.step%l.rc.EvalEvery == 0 {
		// The step is complete: its evaluation and log line are part of it.
		if err := l.logStep(ctx, m, lr); err != nil {
			return err
		}
	}
	if l.hooks.Step != nil {
		l.hooks.Step(l.step, l.rc.TotalSteps)
	}
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// diverging says whether a step's metrics are those of a run that has
// diverged: a loss or gradient norm that is not a number, or a loss whose
// perplexity is not (past ln of the largest float64, about 709.8 nats:
// some 75 times a fresh model's loss over a vocabulary of 16384, a figure
// no run that learns comes near). A learning rate far too high reaches
// such a loss a step before NaN, or never.
func diverging(m model.StepMetrics) bool {
	return !finite(m.Loss) || !finite(math.Exp(m.Loss)) || !finite(m.GradNorm)
}

// diverged is the NonFiniteError of the step being trained, naming the
// last checkpoint once a write in flight has ended.
func (l *loop) diverged(m model.StepMetrics) error {
	var werr error
	if c := l.ck.wait(); c != nil {
		l.ended(c)
		werr = c.err
	}
	nf := &NonFiniteError{Step: l.step + 1, Loss: m.Loss, GradNorm: m.GradNorm, LastGood: l.lastCk}
	if werr != nil {
		return errors.Join(nf, werr)
	}
	return nf
}

// logStep writes one metrics line for the step complete at m.At;
// throughput covers the steps since the previous line's, from when that
// one was complete to when this one was, evaluation time excluded. A step
// read a step late (a step ahead, on an engine whose Step computes it, the
// metrics wait until the next step is computed) counts from its own end,
// not from when it was read, so that each interval holds its own steps.
func (l *loop) logStep(ctx context.Context, m model.StepMetrics, lr float64) error {
	now := time.Now()
	var tps float64
	if d := m.At.Sub(l.markTime) - l.paused; d > 0 {
		tps = float64(l.tokens-l.markTok) / d.Seconds()
	}
	loss, ppl := m.Loss, math.Exp(m.Loss)
	// The peak is one device's: on several, each trains its share.
	gpus := l.devices()
	line := Metrics{Step: l.step, Tokens: l.tokens, Loss: &loss, PPL: &ppl, LR: lr, GradNorm: m.GradNorm,
		TokPerSec: tps, MFU: MFU(tps/float64(gpus), FLOPsPerToken(l.mc, l.rc.Seq), l.cfg.PeakFLOPS),
		PeakMemory: l.eng.Memory().PeakAllocated, ElapsedS: now.Sub(l.began).Seconds()}
	if gpus > 1 {
		line.GPUs = gpus
	}
	if l.mc.MoE() {
		aux := m.AuxLoss
		line.AuxLoss, line.ExpertShare = &aux, m.ExpertShare
	}
	var evaluating time.Duration
	if l.rc.EvalEvery > 0 && l.step%l.rc.EvalEvery == 0 && l.rc.EvalBatches > 0 {
		start := time.Now()
		// The last step's figure is the run's result, which the gates
		// read: it is made whole, the stop or not.
		evalCtx := ctx
		if l.step >= l.rc.TotalSteps {
			evalCtx = context.WithoutCancel(ctx)
		}
		ev, err := l.evaluate(evalCtx)
		if err == nil {
			line.EvalLoss = &ev
			if ppl := math.Exp(ev); finite(ppl) {
				line.EvalPPL = &ppl
			}
			line.EvalLossByStore, line.EvalLeftOut, err = l.evaluateStores(evalCtx)
		}
		switch {
		case errors.Is(err, errEvalStopped):
			// The step is trained and counted; only its figure of the
			// held-out loss is not, so that the stop checkpoints now,
			// not after an evaluation of minutes.
			line.EvalLoss, line.EvalPPL, line.EvalLossByStore, line.EvalLeftOut = nil, nil, nil, nil
			l.log.Info("stopping: the evaluation of this step was cut short, its held-out loss is not recorded", zap.Int("step", l.step))
		case err != nil:
			return err
		}
		evaluating = time.Since(start)
	}
	if err := line.WriteJSONL(l.metrics); err != nil {
		return fmt.Errorf("write %s: %w", l.metrics.Name(), err)
	}
	if l.hooks.Metrics != nil {
		l.hooks.Metrics(line)
	}
	l.markTime, l.markTok, l.paused = m.At, l.tokens, evaluating
	l.logged = l.step
	return nil
}

// logEnd logs the step this call ends at (a stop, a segment's bound, the
// run's end) where it was not logged, once the step pending is settled:
// the results read the run's step and tokens from its last line, and a
// run cancelled at step 8177 between lines every 20 steps read 8160 there
// for good, its total set to 8177 and done. A call that trained no step
// has no line of its own to write, and a run that has logged none (it is
// shorter than its log_every) has no history to end, nor results.
func (l *loop) logEnd(ctx context.Context) error {
	if err := l.settle(ctx); err != nil {
		return err
	}
	if l.rc.LogEvery <= 0 || l.last.step != l.step || l.logged == 0 || l.logged >= l.step {
		return nil
	}
	return l.logStep(ctx, l.last.m, l.last.lr)
}

// errEvalStopped is an evaluation given up between its batches because
// the run was stopped (ctx): it changes nothing, and the step it was of
// stands.
var errEvalStopped = errors.New("evaluation stopped")

// evaluateStores is each store's mean loss over its first EvalBatches
// held-out batches, for data of several stores; nil otherwise. A store
// without a held-out window is left out, and named in left (the mixed
// loss leaves it out too). A stop (ctx) between batches gives it up
// (errEvalStopped); what it reads is read whole.
func (l *loop) evaluateStores(ctx context.Context) (out map[string]float64, left []string, err error) {
	work := context.WithoutCancel(ctx)
	se, ok := l.cfg.Data.(StoreEval)
	if !ok || len(se.EvalStores()) < 2 {
		return nil, nil, nil
	}
	out = map[string]float64{}
	for s, name := range se.EvalStores() {
		sum, n := 0.0, 0
		for i := 0; i < l.rc.EvalBatches; i++ {
			if ctx.Err() != nil {
				return nil, nil, errEvalStopped
			}
			b, ok, err := se.EvalStore(work, s, i, l.rc.Batch, l.rc.Seq)
			if err != nil {
				return nil, nil, fmt.Errorf("step %d: evaluation of store %s: %w", l.step, name, err)
			}
			if !ok {
				break
			}
			if err := checkIDs(b, l.mc.VocabSize); err != nil {
				return nil, nil, fmt.Errorf("step %d: evaluation of store %s: %w", l.step, name, err)
			}
			loss, err := l.eng.EvalLoss(b)
			if err != nil {
				return nil, nil, fmt.Errorf("step %d: evaluation of store %s: %w", l.step, name, err)
			}
			sum, n = sum+loss, n+1
		}
		if n > 0 {
			out[name] = sum / float64(n)
		} else {
			left = append(left, name)
		}
	}
	return out, left, nil
}

// evaluate is the mean loss over the first EvalBatches held-out batches;
// a stop (ctx) between batches gives it up, as evaluateStores.
func (l *loop) evaluate(ctx context.Context) (float64, error) {
	work := context.WithoutCancel(ctx)
	sum := 0.0
	for i := 0; i < l.rc.EvalBatches; i++ {
		if ctx.Err() != nil {
			return 0, errEvalStopped
		}
		b, err := l.cfg.Data.Eval(work, i, l.rc.Batch, l.rc.Seq)
		if err != nil {
			return 0, fmt.Errorf("step %d: evaluation data: %w", l.step, err)
		}
		if err := checkIDs(b, l.mc.VocabSize); err != nil {
			return 0, fmt.Errorf("step %d: evaluation: %w", l.step, err)
		}
		loss, err := l.eng.EvalLoss(b)
		if err != nil {
			return 0, fmt.Errorf("step %d: evaluation: %w", l.step, err)
		}
		sum += loss
	}
	return sum / float64(l.rc.EvalBatches), nil
}

// checkpoint begins writing the state after l.step, unless it is already
// on disk or being written; the write goes on beside the next steps. It
// first waits for the write in flight, whose error it returns.
func (l *loop) checkpoint(ctx context.Context) error {
	if l.ck.inFlight() == l.step {
		return nil
	}
	if c := l.ck.wait(); c != nil {
		l.ended(c)
		if c.err != nil {
			return c.err
		}
	}
	if l.ckStep == l.step {
		return nil
	}
	cur, err := l.cfg.Data.Cursor()
	if err != nil {
		return fmt.Errorf("checkpoint at step %d: data cursor: %w", l.step, err)
	}
	if err := l.syncMetrics(); err != nil {
		return fmt.Errorf("checkpoint at step %d: %w", l.step, err)
	}
	return l.ck.start(ctx, State{Step: l.step, Tokens: l.tokens, Cursor: cur, RNG: RNGState{Seed: l.rc.Seed}, Run: l.rc, Loss: l.loss, TokenizerName: l.tokName,
		WallClock: l.wall().Seconds()})
}

// syncMetrics makes metrics.jsonl's lines durable before the checkpoint
// of l.step is begun: every line up to l.step is written by then, and a
// resume from the checkpoint keeps the file only up to its step, so a
// checkpoint that outlived a power cut beside lines that did not would
// leave a gap in the run's history for good. Once per checkpoint, on a
// file appended a line at a time, it costs little, and no write of ours
// is in flight meanwhile (the previous one was waited for).
func (l *loop) syncMetrics() error {
	if err := l.metrics.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", l.metrics.Name(), err)
	}
	if l.cfg.metricsSynced != nil {
		l.cfg.metricsSynced(l.step)
	}
	return nil
}

// checkpointNow writes the state after l.step and waits until the write
// (and the hook) have ended: at a stop and at the end of a call.
func (l *loop) checkpointNow(ctx context.Context) error {
	if err := l.settle(ctx); err != nil {
		return err
	}
	if err := l.checkpoint(ctx); err != nil {
		return err
	}
	if c := l.ck.wait(); c != nil {
		l.ended(c)
		return c.err
	}
	return nil
}

// ended records a finished write: a complete directory is the last
// checkpoint even when its hook failed, as it is on disk.
func (l *loop) ended(c *ckWrite) {
	if c.dir != "" {
		l.lastCk, l.ckStep = c.dir, c.step
	}
}

// CheckRunDir refuses, as the caller's to fix, a run directory that Run
// would refuse before it trains (a token store's, a tokenizer's, a
// checkpoint's, or one holding checkpoints where resume is false), and
// writes nothing: a command checks its --out so before it reads its data
// or logs a word. Run checks it again.
func CheckRunDir(out string, resume bool) error {
	if err := refuseRunDir(out); err != nil {
		return err
	}
	if !resume {
		return refuseHeldCheckpoints(out)
	}
	return nil
}

// refuseHeldCheckpoints refuses a fresh run into a directory that holds
// another's checkpoints: it would overwrite them step by step and cut
// their metrics.
func refuseHeldCheckpoints(out string) error {
	dirs, err := StepDirs(out)
	if err != nil {
		return err
	}
	if len(dirs) > 0 {
		return badInput(fmt.Errorf("%s already holds a run's checkpoints (the newest %s): continue it with --resume, or train into another --out directory (or delete it first)",
			out, filepath.Base(dirs[0])))
	}
	return nil
}

// makeRunDir makes the run directory, before the engine takes its memory:
// a path that is a file, or that this user may not write, is refused as
// the caller's to fix, naming it. Other failures (a full disk) are not.
func makeRunDir(out string) error {
	if err := refuseRunDir(out); err != nil {
		return err
	}
	err := os.MkdirAll(out, 0o755)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) ||
		errors.Is(err, fs.ErrExist) || errors.Is(err, fs.ErrNotExist) {
		return badInput(fmt.Errorf("run directory %s: %v: choose a directory this user can create and write (--out)", out, errors.Unwrap(err)))
	}
	return fmt.Errorf("run directory %s: %w", out, err)
}

// refuseRunDir refuses a run directory that is not a run's to write in.
func refuseRunDir(out string) error {
	if strings.TrimSpace(out) == "" {
		return badInput(errors.New("run directory is empty: give --out a directory for the run's checkpoints and metrics (default runs/train)"))
	}
	// A token store's or a published tokenizer's directory is not a
	// run's: the run's checkpoints and metrics would be written among the
	// files that ingest, `sched datasets` and `sched tokenizers` read and
	// own. (A tokenizer.json lying in any other directory is the user's.)
	abs, _ := filepath.Abs(out)
	for _, f := range []struct {
		name, what string
		here       bool
	}{{tokens.ManifestFile, "a token store", true}, {TokenizerFile, "a tokenizer", filepath.Base(filepath.Dir(abs)) == "tokenizers"}} {
		if _, err := os.Stat(filepath.Join(out, f.name)); err == nil && f.here {
			return badInput(fmt.Errorf("run directory %s holds %s (its %s): give the run a directory of its own (--out)", out, f.what, f.name))
		}
	}
	// A checkpoint's directory is its run's: a run there would nest its
	// own among the checkpoint's files. Typed for "resume from it", it
	// says how that is asked.
	if HoldsCheckpoint(out) {
		run := filepath.Dir(filepath.Clean(out))
		return badInput(fmt.Errorf("run directory %s is a checkpoint (it holds %s) of the run in %s: to go on from its run's checkpoints give --out %s with --resume; for a new run, give it a directory of its own (--out)", out, StateFile, run, run))
	}
	return nil
}

// MetricsFile is the run directory's log of steps.
const MetricsFile = "metrics.jsonl"

// openMetrics opens Out/metrics.jsonl for appending. A resumed run first
// drops the lines past its checkpoint: those steps are trained again and
// logged anew, so each step appears once. The directory is synced once
// the file is there, so that a file just made (or moved in from a pulled
// checkpoint) stays in it after a power cut: its lines are synced before
// each checkpoint (syncMetrics), its name only here.
func (l *loop) openMetrics() error {
	if err := os.MkdirAll(l.cfg.Out, 0o755); err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	path := filepath.Join(l.cfg.Out, MetricsFile)
	logged, err := truncateMetrics(path, l.step)
	if err != nil {
		return err
	}
	l.logged = logged
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if err := SyncDir(l.cfg.Out); err != nil {
		f.Close()
		return fmt.Errorf("open %s: sync its directory: %w", path, err)
	}
	l.metrics = f
	return nil
}
