package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// Training handles train:segment, and bench:run when Bench is set, with
// the dependencies it holds; give it to New in Params.Handlers.
type Training struct {
	// Redis holds the runs' locks and state (required).
	Redis redis.UniversalClient
	// NoGPU says why no GPU starts on this worker ("" where one does):
	// the sweep, of GPU shapes, is refused where its engine would be the
	// CPU, on which it would hold the gpu queue for hours. Nil: not asked.
	NoGPU func() string
	// Objects holds checkpoints and results (required).
	Objects store.Store
	// Enqueue queues the next segment (required): scheduler.Client.Enqueue.
	Enqueue func(ctx context.Context, a scheduler.Args) error
	// Queue, when set, tells a segment what earlier work is under way: a
	// run whose tokenizer is being trained or whose stores are being
	// ingested waits for them (WaitError) instead of failing or training
	// on part of its data.
	Queue Live
	// WaitEvery is how often a waiting segment looks again. Default
	// DefaultWaitEvery.
	WaitEvery time.Duration
	// Runs resolves a payload's run name. Default: the embedded presets
	// with the runs file named by KILN_RUNS applied, read per task so that
	// an edited file takes effect at the next segment.
	Runs runs.Set
	// Dir is the local run root (checkpoints, metrics; required);
	// TokensDir the root of the mixture's token stores.
	Dir, TokensDir string
	// DataDir is the local data directory, where resolved tokenizers are
	// kept (<DataDir>/tokenizers). Default: Dir's parent.
	DataDir string
	// Owner names this worker in run locks. Default host:pid.
	Owner string
	// LockTTL is the run lock's lease: how long a run stays locked after its
	// worker dies. Default 30s.
	LockTTL time.Duration
	// ObjectsDown is why object storage did not answer when this task's
	// process opened it, nil when it did: a segment then starts from what
	// this machine holds (its copy of the tokenizer, its checkpoint)
	// without asking the store first, so that a hung one does not hold the
	// start for a stall timeout per request.
	ObjectsDown error
	// UploadGrace bounds the checkpoint upload after SIGTERM; keep it below
	// the worker's shutdown grace. Default 60s.
	UploadGrace time.Duration
	// OpenData replaces the token-store mixture (tests, the demo).
	OpenData func(rc trainer.RunConfig, mc model.Config) (trainer.Data, error)
	// Bench measures one shape for bench:run: the GPU bench routine of
	// `sched bench`. Without it bench:run is archived as unavailable.
	Bench func(ctx context.Context, b BenchSpec) (results.BenchRow, error)
	// Log receives the segment's logs. Default zap.NewNop().
	Log *zap.Logger
	// GPUs is how many GPUs a run that names none trains on: the worker's
	// KILN_GPUS (0: one).
	GPUs trainer.GPUCount
	// RequireGPU makes engine auto mean cuda on this worker (compose's GPU
	// worker sets KILN_REQUIRE_GPU): a run or a bench that names no other
	// engine fails at once, archived with the reason the CUDA engine cannot
	// start, instead of training on the CPU at a fraction of the speed.
	RequireGPU bool
}

// gpuEngine is the engine a task of this worker runs for the one it names
// ("" or "auto": the default), and whether RequireGPU made it cuda.
func (t *Training) gpuEngine(named string) (string, bool) {
	if t.RequireGPU && (named == "" || named == "auto") {
		return "cuda", true
	}
	return named, false
}

// requireGPUError says why a task of a worker that requires a GPU could not
// start one, and what to look at; other errors pass as they are.
func requireGPUError(err error) error {
	var un interface{ Unavailable() bool }
	if errors.As(err, &un) && un.Unavailable() {
		return fmt.Errorf("this worker requires a GPU (KILN_REQUIRE_GPU) and engine auto does not fall back to the CPU here: %w "+
			"(docs/operations.md, \"The GPU worker's host\")", err)
	}
	return err
}

// BenchSpec is one bench:run measurement: a shape on an engine, with the
// payload's step counts where it gives them.
type BenchSpec struct {
	Shape  runs.Shape
	Engine string
	// Steps is 0 and Warmup -1 where the payload leaves them to the bench
	// routine's defaults.
	Steps, Warmup int
	// GPUs is what this measurement trains on (0: one; model.AllGPUs):
	// one of benchGPUs, so that a row is of the GPUs a run of its shape
	// trains on here.
	GPUs int
}

// resolve checks t's dependencies and returns a copy with its defaults.
func (t *Training) resolve() (*Training, error) {
	r := *t
	switch {
	case r.Redis == nil:
		return nil, &requiredError{"Redis", "runs keep their locks and state there"}
	case r.Objects == nil:
		return nil, &requiredError{"Objects", "checkpoints and results live in the object store"}
	case r.Enqueue == nil:
		return nil, &requiredError{"Enqueue", "a segment queues the next one"}
	case r.Dir == "":
		return nil, &requiredError{"Dir", "the local run root holds checkpoints and metrics"}
	}
	if r.DataDir == "" {
		r.DataDir = filepath.Dir(r.Dir)
	}
	if r.Log == nil {
		r.Log = zap.NewNop()
	}
	return &r, nil
}

// BenchKey is where bench:run keeps its rows, one JSON object per line;
// `sched results bench` prints them as a table.
const BenchKey = "results/bench/sweep.jsonl"

// bench measures the sweep ("sweep", or Sweep set) or one model preset
// and appends a row per shape to results/bench/sweep.jsonl, each as soon as
// it is measured, so that a sweep cut short keeps what it measured. A shape
// that fails (out of memory) is recorded with its error and the sweep goes
// on.
func (t *Training) bench(ctx context.Context, a scheduler.BenchRun) error {
	steps, warmup := 0, -1
	for k, p := range map[string]*int{"steps": &steps, "warmup": &warmup} {
		if v, ok := a.Params[k]; ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || (k == "steps" && n == 0) {
				return fmt.Errorf("bench:run: %s %q is not a positive number (%w)", k, v, asynq.SkipRetry)
			}
			*p = n
		}
	}
	// The run's own gpus (sched enqueue bench RUN); none in a payload
	// queued before they were carried, and for a model or the sweep.
	var named trainer.GPUCount
	if a.GPUs != "" {
		var err error
		if named, err = trainer.ParseGPUs(a.GPUs); err != nil {
			return fmt.Errorf("bench:run: %w (%w)", err, asynq.SkipRetry)
		}
	}
	var shapes []runs.Shape
	switch {
	case a.Sweep == "sweep" || (a.Sweep == "" && a.Model == "sweep"):
		shapes = runs.Sweep()
		engine, _ := t.gpuEngine(a.Engine)
		if why := t.onCPU(engine); why != "" {
			return fmt.Errorf("bench:run: the sweep measures the GPU's shapes (%d of them, up to the base model at 32 x 1024), hours on a CPU, and this worker trains on the CPU (%s): run it on a worker whose GPU starts, or measure a CPU run's own step with 'sched enqueue bench RUN' (pilot-cpu, demo) (%w)",
				len(shapes), why, asynq.SkipRetry)
		}
	case a.Sweep != "":
		return fmt.Errorf("bench:run: unknown sweep %q: the one sweep is \"sweep\" (%w)", a.Sweep, asynq.SkipRetry)
	default:
		// A model alone is measured at the sweep's preset shape, 32 x 1024,
		// one micro-batch a step in bf16, unless the payload's params say
		// otherwise (`sched enqueue bench RUN` gives a run's step).
		sh := runs.Shape{Model: a.Model, Batch: 32, Seq: 1024}
		for k, p := range map[string]*int{"batch": &sh.Batch, "seq": &sh.Seq, "accumulate": &sh.Accumulate} {
			if v, ok := a.Params[k]; ok {
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 {
					return fmt.Errorf("bench:run: %s %q is not a positive number (%w)", k, v, asynq.SkipRetry)
				}
				*p = n
			}
		}
		switch v := a.Params["precision"]; v {
		case "", "bf16", "fp32":
			sh.Precision = v
		default:
			return fmt.Errorf("bench:run: precision %q: use bf16 or fp32 (%w)", v, asynq.SkipRetry)
		}
		sh.MoE = a.Params["moe"]
		c, err := sh.Config()
		if err != nil {
			return fmt.Errorf("bench:run: %w (%w)", err, asynq.SkipRetry)
		}
		// What no card can hold is refused before the engine is asked;
		// what this device cannot hold, by the engine's own check below.
		engine := a.Engine
		if engine == "" {
			engine = "auto"
		}
		plan := model.MemoryPlan{Config: c, Engine: engine, Batch: sh.Batch, Seq: sh.Seq, Purpose: model.PurposeBench}
		if err := model.CheckMemory(plan, model.LargestGPU, "the largest card kiln supports (an H200, 141 GB)"); err != nil {
			return fmt.Errorf("bench:run: %w (%w)", err, asynq.SkipRetry)
		}
		shapes = []runs.Shape{sh}
	}
	rep := Progress(ctx)
	var measured []results.BenchRow
	for i, sh := range shapes {
		if err := ctx.Err(); err != nil {
			return err
		}
		rep.Report(ctx, float64(i)/float64(len(shapes)), 0, "", "measuring "+sh.String())
		engine, gpuOnly := t.gpuEngine(a.Engine)
		counts := t.benchGPUs(engine, named, sh.Accumulate)
		gpus := counts[0]
		row, err := t.Bench(ctx, BenchSpec{Shape: sh, Engine: engine, Steps: steps, Warmup: warmup, GPUs: int(gpus)})
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			// Without its GPU every row would fail the same way.
			if gerr := requireGPUError(err); gpuOnly && gerr != err {
				return fmt.Errorf("bench:run %s: %w (%w)", sh, gerr, asynq.SkipRetry)
			}
			// One measurement that cannot fit is the payload's mistake;
			// in a sweep it is a row that says so, beside the others.
			var me *model.MemoryError
			if errors.As(err, &me) && len(shapes) == 1 {
				return fmt.Errorf("bench:run %s: %w (%w)", sh, err, asynq.SkipRetry)
			}
			row = failedRow(sh, max(int(gpus), 1), err)
		}
		if err := appendBenchRow(ctx, t.Objects, row); err != nil {
			return err
		}
		measured = append(measured, row)
		// A measure of all that found one GPU was the one-GPU row. One of
		// several that failed (NCCL, a count that does not divide a run's
		// accumulate) still leaves it to measure: runs of one GPU are held
		// to it.
		if len(counts) < 2 || row.Error == "" && row.Devices() < 2 {
			continue
		}
		// The same shape on one GPU: the table's scaling efficiency, and
		// the row a run of one GPU on this host is held to.
		rep.Report(ctx, (float64(i)+0.5)/float64(len(shapes)), 0, "", "measuring "+sh.String()+" on one GPU, for the scaling")
		one, err := t.Bench(ctx, BenchSpec{Shape: sh, Engine: engine, Steps: steps, Warmup: warmup, GPUs: 1})
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			one = failedRow(sh, 1, err)
		}
		if err := appendBenchRow(ctx, t.Objects, one); err != nil {
			return err
		}
	}
	// What `sched status` shows of the finished task: the measure, not
	// the last shape it began.
	rep.Report(ctx, 1, 0, "", benchSummary(shapes, measured))
	return nil
}

// benchSummary says in one line what a bench task measured: a shape's
// tok/s, or why it could not be measured; a sweep's count of shapes and
// of those that could not run. The table is `sched results bench`.
func benchSummary(shapes []runs.Shape, rows []results.BenchRow) string {
	const table = "; sched results bench shows the table"
	if len(shapes) == 1 && len(rows) == 1 {
		r := rows[0]
		if r.Error != "" {
			return fmt.Sprintf("%s could not be measured: %s%s", shapes[0], r.Error, table)
		}
		where := "the CPU"
		if r.Device != "" {
			where = plural(r.Devices(), "GPU")
		}
		// The precision the engine computed in: the CPU's fp32 whatever
		// was asked.
		sh := shapes[0]
		if r.Precision != "" {
			sh.Precision = r.Precision
		}
		return fmt.Sprintf("measured %s: %s tok/s on %s%s", sh, humanize.Comma(int64(math.Round(r.TokPerSec))), where, table)
	}
	failed := 0
	for _, r := range rows {
		if r.Error != "" {
			failed++
		}
	}
	msg := "measured " + plural(len(rows), "shape")
	if failed > 0 {
		msg += fmt.Sprintf(" (%d could not run)", failed)
	}
	return msg + table
}

// failedRow is the sweep's row of a shape that could not be measured on
// gpus GPUs: its shape and why.
func failedRow(sh runs.Shape, gpus int, err error) results.BenchRow {
	c, _ := sh.Config()
	return results.BenchRow{Model: sh.Model, Vocab: c.VocabSize, DModel: c.Hidden, Layers: c.Layers, Batch: sh.Batch, Seq: sh.Seq,
		Accumulate: sh.Accumulate, Precision: sh.Precision, MoE: results.MoEShape(c), GPUs: gpus, Error: err.Error()}
}

// appendBenchRow adds one row to BenchKey. Only the GPU worker writes it
// (queue gpu, concurrency 1), so read-modify-write needs no lock.
func appendBenchRow(ctx context.Context, obj store.Store, row results.BenchRow) error {
	var buf bytes.Buffer
	r, err := obj.Get(ctx, BenchKey)
	switch {
	case err == nil:
		_, err = io.Copy(&buf, r)
		r.Close()
		if err != nil {
			return fmt.Errorf("read %s: %w", BenchKey, err)
		}
	case !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("read %s: %w", BenchKey, err)
	}
	line, err := json.Marshal(row)
	if err != nil {
		return err
	}
	buf.Write(append(line, '\n'))
	if err := obj.Put(ctx, BenchKey, bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
		return fmt.Errorf("write %s: %w", BenchKey, err)
	}
	return nil
}

// onCPU says why work on engine trains on the CPU on this worker, "" where
// it does not (or NoGPU is not there to say).
func (t *Training) onCPU(engine string) string {
	switch {
	case engine == "cpu":
		return "its engine is cpu"
	case (engine == "" || engine == "auto") && t.NoGPU != nil:
		return t.NoGPU()
	}
	return ""
}

// gpusFor is the worker's GPUs (KILN_GPUS) that a run or bench on engine
// which names no number of them takes: none on the CPU engine, which
// trains as one (the worker's GPUs are for the runs that use them).
func (t *Training) gpusFor(engine string) trainer.GPUCount {
	if engine == "cpu" {
		return 0
	}
	return t.GPUs
}

// runGPUs is the GPUs a run trains on: those it names, else the worker's
// (gpusFor). A run that names none asked for what the worker has, so of
// the worker's number it takes the most that share its accumulate
// micro-batches evenly, with the notice to log when that leaves some out;
// a number the run names is kept, and refused when the segment starts if
// its steps do not split over it, as 'sched enqueue train' refuses it.
// The worker's all is resolved by the engine (kernels.NewGroup).
func runGPUs(named, worker trainer.GPUCount, accumulate int) (trainer.GPUCount, string) {
	if named != 0 {
		return named, ""
	}
	if worker < 2 {
		return worker, ""
	}
	n := model.DividingGPUs(int(worker), accumulate)
	if n == int(worker) {
		return worker, ""
	}
	from := fmt.Sprintf("the run names no gpus and this worker's KILN_GPUS is %d", worker)
	return trainer.GPUCount(n), model.FewerGPUsNotice(from, int(worker), n, accumulate)
}

// benchGPUs is the GPUs bench measures a shape of accumulate micro-batches
// a step on (0: one a GPU), in order: those a run of that step trains on
// on this worker, naming the gpus named (the run's, from `sched enqueue
// bench RUN`) or none (runGPUs decides both), so that the run's
// 'tok/s vs bench' gate finds their row; then, where that is several (or
// all, which the engine counts), one GPU, for the scaling efficiency and
// the row a run of one GPU is held to.
func (t *Training) benchGPUs(engine string, named trainer.GPUCount, accumulate int) []trainer.GPUCount {
	gpus, _ := runGPUs(named, t.gpusFor(engine), accumulate)
	if gpus >= 2 || gpus == trainer.GPUCount(model.AllGPUs) {
		return []trainer.GPUCount{gpus, 1}
	}
	return []trainer.GPUCount{gpus}
}

// segment trains one segment of a run and, unless the run is done or
// the segment was stopped, queues the next one. A run another worker holds
// is retried later; a run name this build does not know is archived.
func (t *Training) segment(ctx context.Context, a scheduler.TrainSegment) error {
	file := os.Getenv("KILN_RUNS")
	// A run under way whose runs file is being edited (caught half
	// written, or with a mistake in it) waits, its checkpoint kept, and
	// goes on once the file is mended, where it was archived for good; a
	// new run's segment is archived, naming the file's error.
	edited := t.Runs == nil && file != "" && a.FromStep > 0
	set := t.Runs
	if set == nil {
		var err error
		if set, err = runs.Load(file); err != nil && edited {
			// One clause after the file's error: a line too short for
			// the whole keeps its last clause, what to do.
			return &WaitError{For: fmt.Sprintf("this worker's KILN_RUNS to read (%v): mend it on the worker, and the run goes on from step %d once it reads", err, a.FromStep)}
		} else if err != nil {
			return fmt.Errorf("train:segment: this worker's KILN_RUNS: %w; mend it on the worker, then 'sched enqueue train %s' (%w)", err, a.Run, asynq.SkipRetry)
		}
	}
	run, err := set.Get(a.Run)
	if err != nil {
		// The enqueuing machine knew the run: the worker reads its own
		// runs file, which may differ.
		where := t.runsFrom(file)
		if edited {
			// 'sched cancel' stops a run; an entry gone may be a file
			// an editor empties before it writes.
			return &WaitError{For: fmt.Sprintf("run %s's entry in this worker's runs file (%v; %s): put it back; the run goes on from step %d once it is there, or 'sched cancel' its segment", a.Run, err, where, a.FromStep)}
		}
		return fmt.Errorf("train:segment: %w; %s: define the run there, then 'sched enqueue train %s' (%w)", err, where, a.Run, asynq.SkipRetry)
	}
	if err := t.queuedPastItsEnd(ctx, a, run.RunConfig.WithDefaults().TotalSteps, file); err != nil {
		return err
	}
	if a.Engine != "" {
		run.Engine = a.Engine
	}
	var gpuOnly bool
	run.Engine, gpuOnly = t.gpuEngine(run.Engine)
	log := t.Log
	var notice string
	if run.GPUs, notice = runGPUs(run.GPUs, t.gpusFor(run.Engine), run.RunConfig.WithDefaults().Accumulate); notice != "" {
		log.Warn(notice, zap.String("run", a.Run))
	}
	// The payload pins the tokenizer the run was queued with; the runs
	// entry names it for payloads that do not.
	name := a.Tokenizer
	if name == "" {
		name = run.Tokenizer
	}
	if name == "" {
		return fmt.Errorf("train:segment run %s names no tokenizer: set tokenizer in its runs entry or queue it with KILN_TOKENIZER set (%w)", a.Run, asynq.SkipRetry)
	}
	if t.Queue != nil {
		// Run again after its worker stopped answering, once it had
		// queued the next segment: that one goes on with the run.
		sup, err := t.Queue.SupersedingSegment(ctx, a.Run, Progress(ctx).TaskID(), a.FromStep)
		if err != nil {
			return fmt.Errorf("train:segment run %s: %w", a.Run, err)
		}
		if sup != nil {
			from := int64(0)
			if b, err := scheduler.Decode[scheduler.TrainSegment](sup.Payload); err == nil {
				from = b.FromStep
			}
			msg := fmt.Sprintf("superseded: run %s goes on with segment %s (queued from step %d); this segment, run again after its worker stopped answering once it had queued the next, trains nothing", a.Run, sup.ID, from)
			log.Warn("training segment superseded: the run's chain goes on with another", zap.String("run", a.Run), zap.String("superseded_by", sup.ID), zap.Int64("from_step", from))
			Progress(ctx).Message(ctx, msg)
			return nil
		}
	}
	if err := waitForInputs(ctx, t.Queue, a.Run, name, run.Mixture); err != nil {
		var we *WaitError
		if errors.As(err, &we) {
			we.Every = t.WaitEvery
			Progress(ctx).Message(ctx, err.Error())
		}
		return err
	}
	warnPartialStores(ctx, t.Queue, a.Run, run.Mixture, log)
	// Object storage known silent is not asked (it may hang).
	var uses catalog.Entry
	err = t.ObjectsDown
	if err == nil {
		uses, _, err = catalog.New(t.Objects, t.DataDir).Resolve(ctx, name)
	}
	if store.Unreachable(err) {
		// This machine's copy, checked against object storage when it was
		// fetched, serves (a machine without one waits).
		if local, _, lerr := catalog.New(nil, t.DataDir).Resolve(ctx, name); lerr == nil {
			log.Warn("object storage does not answer: the run's tokenizer is this machine's copy", zap.String("tokenizer", name), zap.String("path", local.Path), zap.Error(err))
			uses, err = local, nil
		}
	}
	if gone := (*catalog.NotFoundError)(nil); errors.As(err, &gone) {
		// Deleted from object storage and from this disk: a run with
		// checkpoints trains with the tokenizer they were trained with,
		// which each holds a copy of, and which nothing else gives back
		// (a tokenizer trained again under its name is another, which
		// the run refuses and which a published name never gives way
		// to). That copy, checked against its checkpoint's record, is
		// published again; a run not begun takes another run's copy
		// where stores and runs record the name, and is otherwise told
		// how to make one.
		var said string
		if uses, said, err = segment.RestoreTokenizer(ctx, t.Objects, t.DataDir, a.Run, segment.RunDir(t.Dir, a.Run), gone); err == nil {
			log.Warn(said, zap.String("run", a.Run), zap.String("tokenizer", name))
		}
	}
	if err != nil {
		// An unknown or conflicting name does not fix itself by waiting.
		// The catalog's errors name the tokenizer (they read "tokenizer
		// x: tokenizer "x" is not known" where it was named again).
		if !strings.Contains(err.Error(), name) {
			err = fmt.Errorf("tokenizer %s: %w", name, err)
		}
		return permanent(scheduler.KindTrainSegment, ofRun(a.Run, err))
	}
	tok, err := os.ReadFile(uses.Path)
	if err != nil {
		return fmt.Errorf("train:segment run %s: %w", a.Run, err)
	}
	run.Tokenizer = name
	var bench []results.BenchRow
	if t.ObjectsDown == nil {
		if bench, err = benchRows(ctx, t.Objects); err != nil {
			log.Warn("the tok/s gate has no bench figures", zap.Error(err))
		}
	}
	rep := Progress(ctx)
	rate := rateWindow{span: rateSpan.Seconds()}
	out, err := segment.Run(ctx, segment.Params{
		Run: run, Dir: t.Dir, TokensDir: t.TokensDir, Objects: t.Objects, Redis: t.Redis, Owner: t.Owner,
		LockTTL: t.LockTTL, UploadGrace: t.UploadGrace, Bench: bench, Tokenizer: tok, Uses: &uses, OpenData: t.OpenData, Log: log,
		ObjectsDown: t.ObjectsDown,
		Progress: func(step, total int, m *trainer.Metrics) {
			if m == nil || total <= 0 {
				return
			}
			// The run's state, which the segment writes from *m once this
			// returns, records the rate of the last rateSpan's steps, and
			// sched status the ETA it gives, not the step's own.
			own := m.TokPerSec
			m.TokPerSec = rate.add(*m)
			rep.Report(ctx, float64(step)/float64(total), m.TokPerSec, "tok",
				fmt.Sprintf("run %s step %d/%d loss %.4f", a.Run, step, total, m.LossOr(0)))
			// Every logged step in the worker's log too, for a user who
			// follows it (docker compose logs -f worker-gpu), with its own
			// rate.
			fields := []zap.Field{zap.String("run", a.Run), zap.Int("step", step), zap.Int("total", total),
				zap.Float64("loss", m.LossOr(0)), zap.Float64("tok_per_s", math.Round(own))}
			if m.EvalLoss != nil {
				fields = append(fields, zap.Float64("eval_loss", *m.EvalLoss))
			}
			log.Info("step", fields...)
		},
	})
	if err != nil {
		if gpuOnly {
			err = requireGPUError(err)
		}
		return permanent(scheduler.KindTrainSegment, ofRun(a.Run, runs.SizeAdvice(a.Run, t.noStoreAdvice(ctx, a.Run, err))))
	}
	total := out.TotalSteps
	if out.Done {
		longer, ok := t.longerTotal(a.Run, file, out.Step)
		if !ok {
			rep.Message(ctx, fmt.Sprintf("run %s done at step %d", a.Run, out.Step))
			return nil
		}
		// The entry was given a longer total while this segment trained
		// towards the one it read at its start ('sched enqueue train'
		// then said the run was running, and queued nothing): the run
		// goes on, as it would have from a segment that began later.
		total = longer
		log.Info("the run's entry now gives a longer total: the run goes on", zap.String("run", a.Run), zap.Int("step", out.Step), zap.Int("total", total))
		rep.Message(ctx, fmt.Sprintf("run %s reached step %d, its total when this segment began; its runs entry now gives %d, and the next segment goes on", a.Run, out.Step, total))
	}
	next := scheduler.TrainSegment{Run: a.Run, Tokenizer: name, Engine: a.Engine, FromStep: int64(out.Step), TotalSteps: int64(total)}
	if err := t.Enqueue(ctx, next); err != nil {
		var dup *scheduler.DuplicateError
		if !errors.As(err, &dup) {
			return fmt.Errorf("train:segment run %s: queue the segment from step %d: %w", a.Run, out.Step, err)
		}
	}
	return nil
}

// rateSpan is about how much of a segment's latest training the rate its
// run's state records is measured over (rateWindow).
const rateSpan = 30 * time.Second

// rateWindow is the rate of a segment's training as its run's state
// records it, and sched status shows it with the ETA it gives: the tokens
// of its logged steps of about the last span seconds over the wall time
// they took, all of it, the checkpoints and evaluations among them
// included, as the steps left will take theirs. A logged step's own rate
// (trainer.Metrics.TokPerSec) is that of the steps since the line before:
// logged every step (pilot-cpu's log_every 1), the step that writes a
// checkpoint reads a sixth of the others', and the ETA status gave from
// the last one swung between one minute and six from refresh to refresh.
type rateWindow struct {
	span float64 // seconds
	// logged are the logged steps the window begins at or holds, oldest
	// first.
	logged []loggedStep
}

// loggedStep is a logged step's place in its segment's training: the wall
// time since the segment's loop began (trainer.Metrics.ElapsedS) and the
// run's tokens.
type loggedStep struct {
	elapsed float64
	tokens  int64
}

// add takes the metrics of a logged step, m, and returns the rate of the
// window that ends at it: from the newest logged step at least span
// before it (so that the window spans span and one interval between
// logged lines at most), or the segment's first logged step while span
// has not passed since it. m's own rate stands where there is no earlier
// logged step to measure from (the segment's first), or no wall time.
func (r *rateWindow) add(m trainer.Metrics) float64 {
	if m.ElapsedS <= 0 {
		return m.TokPerSec
	}
	if n := len(r.logged); n > 0 && (m.ElapsedS <= r.logged[n-1].elapsed || m.Tokens < r.logged[n-1].tokens) {
		r.logged = r.logged[:0] // another loop's count: measured afresh
	}
	r.logged = append(r.logged, loggedStep{m.ElapsedS, m.Tokens})
	for len(r.logged) > 1 && m.ElapsedS-r.logged[1].elapsed >= r.span {
		r.logged = r.logged[1:]
	}
	if len(r.logged) < 2 {
		return m.TokPerSec
	}
	first := r.logged[0]
	return float64(m.Tokens-first.tokens) / (m.ElapsedS - first.elapsed)
}

// ofRun is err, a segment's, said of run: named once, where the segment's
// own words name it already (several begin "run <name>: "), where they
// read "run he: run he: no checkpoint of it ...".
func ofRun(run string, err error) error {
	if msg := err.Error(); strings.HasPrefix(msg, "run "+run+": ") || strings.HasPrefix(msg, "run "+run+" ") {
		return err
	}
	return fmt.Errorf("run %s: %w", run, err)
}

// longerTotal is the total steps run's entry gives now, in the runs the
// segment read its own from, where it is past step.
func (t *Training) longerTotal(run, file string, step int) (int, bool) {
	set := t.Runs
	if set == nil {
		var err error
		if set, err = runs.Load(file); err != nil {
			return 0, false // read again by the next enqueue, which says what is wrong
		}
	}
	r, err := set.Get(run)
	if err != nil {
		return 0, false
	}
	total := r.RunConfig.WithDefaults().TotalSteps
	return total, total > step
}

// queuedPastItsEnd is the wait of a segment queued to train a done run
// on to a.TotalSteps, the length the runs entry where it was queued gives,
// where this worker's entry gives less, total: 'sched enqueue train' after
// a longer total in a runs file of the enqueuing machine, the worker's own
// (KILN_RUNS on the worker, compose's KILN_WORKER_RUNS) left as it was, or
// given another. The segment would end the run at once, or at the
// worker's length, as done, the length it was queued for dropped without
// a word. It waits for the worker's entry to give that length, as a
// segment whose entry is missing does. A run not done whose length was
// lowered after its segment was queued ends where its entry now says; a
// run Redis holds no state of is not judged.
func (t *Training) queuedPastItsEnd(ctx context.Context, a scheduler.TrainSegment, total int, file string) error {
	if a.TotalSteps <= int64(total) || t.Redis == nil {
		return nil
	}
	st, ok, err := scheduler.ReadRunState(ctx, t.Redis, a.Run)
	if err != nil || !ok || !st.Done {
		return nil
	}
	return &WaitError{For: fmt.Sprintf("this worker's runs entry of run %s to give the length it was queued for (step %d; it gives %d, and the run is done at step %d; %s); give it that length and the run goes on from step %d, or 'sched cancel' its segment",
		a.Run, a.TotalSteps, total, st.Step, t.runsFrom(file), a.FromStep)}
}

// runsFrom says where this worker's runs come from, file being its
// KILN_RUNS: the enqueuing machine reads its own, which may differ.
func (t *Training) runsFrom(file string) string {
	switch {
	case file != "":
		return "this worker's KILN_RUNS is " + file
	case t.Runs != nil:
		return "this worker's runs"
	}
	return "this worker has no KILN_RUNS"
}

// noStoreAdvice adds to the error of a run whose token store this
// worker's disk lacks (a run moved to another machine) what to do once the
// store is there: the segment is archived, and the run waits for an
// enqueue. Where the worker that appends holds the stores on another disk
// (a GPU worker started on another machine), the error names both disks:
// an ingest there fills no store here.
func (t *Training) noStoreAdvice(ctx context.Context, run string, err error) error {
	var no *tokens.NoStoreError
	if !errors.As(err, &no) {
		return err
	}
	if h, herr := AppendHolderNow(ctx, t.Redis); herr == nil && h != nil && t.DataDir != "" {
		if id, derr := DiskID(t.DataDir); derr == nil && id != h.Disk {
			host, _ := os.Hostname()
			no.Appender, no.Here = h.String(), fmt.Sprintf("host %s, data directory %s", host, t.DataDir)
		}
	}
	return fmt.Errorf("%w, then 'sched enqueue train %s' resumes the run", err, run)
}

// Live is what a task asks the queue about earlier work under way
// (scheduler.Client implements it).
type Live interface {
	SupersedingSegment(ctx context.Context, run, id string, from int64) (*asynq.TaskInfo, error)
	LiveTokenizer(ctx context.Context, name string) (*asynq.TaskInfo, error)
	LiveIngest(ctx context.Context, store string) (int, error)
	FailedIngests(ctx context.Context) (map[string]scheduler.DatasetProgress, error)
}

// waitForTokenizer returns a *WaitError while tokenizer name is being
// sampled or trained.
func waitForTokenizer(ctx context.Context, q Live, name string) error {
	ti, err := q.LiveTokenizer(ctx, name)
	if err != nil || ti == nil {
		return err
	}
	return &WaitError{For: fmt.Sprintf("tokenizer %s (%s, %s)", name, ti.ID, ti.State)}
}

// waitForInputs returns a *WaitError while run's tokenizer is being made or
// one of its stores is being ingested: a run queued right after them (the
// README's day, typed in one go) starts once they are done, on all of its
// data.
func waitForInputs(ctx context.Context, q Live, run, tok string, mixture []trainer.MixtureEntry) error {
	if q == nil {
		return nil
	}
	if err := waitForTokenizer(ctx, q, tok); err != nil {
		return fmt.Errorf("train:segment run %s: %w", run, err)
	}
	for _, m := range mixture {
		if filepath.IsAbs(m.Store) {
			continue
		}
		n, err := q.LiveIngest(ctx, m.Store)
		if err != nil {
			return fmt.Errorf("train:segment run %s: %w", run, err)
		}
		if n > 0 {
			return &WaitError{For: fmt.Sprintf("the ingest of token store %s (%s left)", m.Store, plural(n, "task"))}
		}
	}
	return nil
}

// plural is n with its noun, plural but for one: "1 task", "3 tasks".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// warnPartialStores says, in the worker's log, when a store of the run's
// mixture lacks files whose ingest failed for good or was cancelled: the
// run trains on what the store holds, and the warning says what adds the
// rest. A file that any of its appends put in the store does not count.
func warnPartialStores(ctx context.Context, q Live, run string, mixture []trainer.MixtureEntry, log *zap.Logger) {
	if q == nil {
		return
	}
	failed, err := q.FailedIngests(ctx)
	if err != nil {
		return
	}
	for _, m := range mixture {
		d, ok := failed[m.Store]
		if filepath.IsAbs(m.Store) || !ok {
			continue
		}
		log.Warn(fmt.Sprintf("run %s trains on part of token store %s: %s", run, m.Store, partialStore(d)),
			zap.String("run", run), zap.String("store", m.Store), zap.Int("failed_files", d.Failed), zap.Bool("plan_failed", d.PlanFailed),
			zap.Int("older_kiln_files", d.FailedOlder), zap.Bool("older_kiln_plan", d.PlanOlder))
	}
}

// partialStore says what store d lacks for good and what adds it: 'sched
// retry' of the tasks that failed, unless an older kiln queued some of
// them, which this build's workers refuse and which a retry queues
// unchanged; then the ingest's command enqueued again, which queues every
// file the store lacks (an archived task of the same work is replaced).
func partialStore(d scheduler.DatasetProgress) string {
	var all, again []string
	if d.Failed > 0 {
		all = append(all, plural(d.Failed, "file"))
	}
	if d.PlanFailed {
		all = append(all, "its plan (and so its unplanned files)")
	}
	msg := "the ingest of " + strings.Join(all, " and ") + " failed for good or was cancelled; "
	if d.FailedOlder > 0 {
		again = append(again, "the tasks of "+plural(d.FailedOlder, "file"))
	}
	if d.PlanOlder {
		again = append(again, "its plan")
	}
	if len(again) == 0 {
		return msg + "'sched runs' lists those tasks, 'sched retry <task-id>' adds them to the store"
	}
	return msg + fmt.Sprintf("an older kiln queued %s, which this kiln's workers refuse and a retry queues unchanged: "+
		"enqueue the ingest again, not sched retry: %s", strings.Join(again, " and "), d.EnqueueAgain())
}

// benchRows reads the bench sweep's rows, for the run's tok/s gate; none
// yet is not an error.
func benchRows(ctx context.Context, obj store.Store) ([]results.BenchRow, error) {
	r, err := obj.Get(ctx, BenchKey)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return results.ReadBench(r)
}
