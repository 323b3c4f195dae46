package trainer

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/model"
)

// BenchOptions describe one throughput measurement: a model shape trained
// on random tokens for Steps timed steps after Warmup untimed ones.
type BenchOptions struct {
	Model      model.Config
	Engine     string // cuda, cpu or auto
	Precision  string // bf16 (default) or fp32
	Batch, Seq int
	// Accumulate is how many micro-batches of Batch x Seq a step trains
	// before the optimizer's, over all GPUs, as a run's accumulate (0: one
	// a GPU); a multiple of the GPUs. The optimizer's share of a step
	// shrinks with it.
	Accumulate int
	Steps      int
	Warmup     int
	// PeakFLOPS overrides the device's peak for MFU; 0 looks the device up
	// in PeakFLOPS.
	PeakFLOPS float64
	ForceSM80 bool
	// Profile (CUDA engine): after the timed steps, run as many again with
	// every kernel timed by events, for BenchResult.KernelMSPerStep.
	Profile bool
	// CheckpointEvery > 0 writes a checkpoint after every that many timed
	// steps into a temporary directory under CheckpointDir (the system's
	// temporary directory when empty), removed at the end, the way a run
	// writes them: beside the next steps, one write in flight.
	// CheckpointWait waits for each write before the next step, as
	// checkpoints were written before they went beside the steps, for
	// comparison.
	CheckpointEvery int
	CheckpointWait  bool
	CheckpointDir   string
	// Log receives one-line notices (an engine fallback, a busy GPU).
	Log func(string)
	// GPUs > 1 trains data-parallel on that many GPUs (model.AllGPUs for
	// all): a step is one micro-batch of Batch x Seq on each GPU, or
	// Accumulate micro-batches shared by them, when given; all then takes
	// the most GPUs that divide Accumulate, as a training run does.
	GPUs int
}

// CheckpointTiming is what the timed steps took with checkpoints: tokens
// per second of the steps that began a checkpoint (the step and the
// checkpoint's start, or its whole write with CheckpointWait), of the steps
// around them, and of the others. Seconds includes waiting for the last
// write to end.
//
// A step's time is measured on the host, which on a GPU runs a step ahead
// of the device: a checkpoint's step waits for the device to finish the
// steps queued before it, and the step after it returns as soon as it is
// queued. Neither alone is the device's time, so the steps around a
// checkpoint are counted together: its step and the aroundCheckpoint - 1
// after it, which hold the wait and the refill both. The first checkpoint
// also makes the engine's host buffer for the copies (a fraction of a
// second, once a run), so with more than one its steps are left out of
// both kinds and the later checkpoints' are the figure: AroundTokPerSec,
// and AroundExtraSeconds, what each checkpoint's steps took beyond as many
// of the other steps.
type CheckpointTiming struct {
	Checkpoints                                   int
	CheckpointStepTokPerSec, AroundTokPerSec      float64
	AroundExtraSeconds                            float64
	OtherStepTokPerSec                            float64
	SlowestStepSeconds, SlowestCheckpointStepSecs float64
	// CheckpointStepSeconds is each checkpoint step's time, in order: the
	// first includes making the engine's host buffer for the copies.
	CheckpointStepSeconds []float64
}

// BenchResult is one measurement.
type BenchResult struct {
	Engine, Device, Arch string
	// Precision is the one the engine computed in: fp32 on the CPU engine
	// whatever BenchOptions asked (model.ComputedPrecision).
	Precision string
	TokPerSec float64
	// MFU is 0 when the device's peak is unknown (the CPU).
	MFU     float64
	Seconds float64
	Loss    float64
	// PeakAllocated is the engine's peak bytes for tensors and workspaces,
	// comparable to torch.cuda.max_memory_allocated.
	PeakAllocated int64
	// ProcessMemory is what this process holds on the device: nvidia-smi's
	// per-process figure when it answers ("nvidia-smi"), else the engine's
	// own count ("engine").
	ProcessMemory       int64
	ProcessMemorySource string
	// MemoryInUseBefore is device memory in use when the engine started.
	MemoryInUseBefore int64
	// OtherProcesses lists other processes on the GPU as "pid:MiB"; figures
	// taken beside them are not comparable (the seed plan measured a 2.14x
	// difference from that alone).
	OtherProcesses []string
	// KernelMSPerStep is device time per kernel name and step (Profile).
	KernelMSPerStep map[string]float64
	// Checkpoints is set with BenchOptions.CheckpointEvery.
	Checkpoints *CheckpointTiming
	// GPUs is how many GPUs trained; TokPerSec is all of theirs together.
	GPUs int
	// GradientSum is how several GPUs summed the gradients of a step
	// (model.Parallel's GradientSum); empty on one engine.
	GradientSum string
	// Accumulate is the micro-batches a step trained, over all GPUs.
	Accumulate int
	// OtherCPU is the share of the machine's CPU time (0 to 1) that other
	// processes used during the timed steps, from /proc/stat (0 where it
	// cannot be read): a CPU engine's figure taken beside them measures
	// them too.
	OtherCPU float64
}

// GPUIdle reports whether no other process was on the GPU.
func (r BenchResult) GPUIdle() bool { return len(r.OtherProcesses) == 0 }

// Bench measures training throughput the way the trainer trains: ZeroGrad,
// ForwardBackward, Step, and the step's metrics (the one wait for the
// device, one step behind where the engine runs a step ahead).
func Bench(ctx context.Context, o BenchOptions) (BenchResult, error) {
	c := o.Model
	if err := c.Validate(); err != nil {
		return BenchResult{}, err
	}
	switch {
	case o.Batch <= 0:
		return BenchResult{}, fmt.Errorf("batch must be positive, got %d", o.Batch)
	case o.Seq <= 0 || o.Seq > c.MaxPositions:
		return BenchResult{}, fmt.Errorf("seq must be between 1 and the model's %d positions, got %d", c.MaxPositions, o.Seq)
	case o.Steps <= 0 || o.Warmup < 0:
		return BenchResult{}, fmt.Errorf("steps must be positive and warmup not negative (got %d, %d)", o.Steps, o.Warmup)
	case o.Accumulate < 0:
		return BenchResult{}, fmt.Errorf("accumulate must be positive (or 0 for one micro-batch a step), got %d", o.Accumulate)
	case o.CheckpointEvery < 0:
		return BenchResult{}, fmt.Errorf("checkpoint every %d steps: give 0 for none or a positive number", o.CheckpointEvery)
	}
	if o.Precision == "" {
		o.Precision = "bf16"
	}
	logf := o.Log
	if logf == nil {
		logf = func(string) {}
	}
	others := GPUProcesses(ctx)
	eng, err := model.NewEngine(o.Engine, c, model.Options{Precision: o.Precision, MaxBatch: o.Batch, MaxSeq: o.Seq, ForceSM80: o.ForceSM80,
		GPUs: o.GPUs, Accumulate: o.Accumulate, Log: logf})
	if err != nil {
		return BenchResult{}, err
	}
	defer eng.Close()
	// The row records what was measured: a CPU engine asked for bf16
	// trains in fp32, and a row saying bf16 would pass for a bf16 figure.
	r := BenchResult{Engine: eng.Name(), Precision: model.ComputedPrecision(eng.Name(), o.Precision), OtherProcesses: others, GPUs: 1}
	if r.Precision != o.Precision {
		logf(fmt.Sprintf("the %s engine computes in %s only: measured in %s, not %s", r.Engine, r.Precision, r.Precision, o.Precision))
	}
	if p, ok := eng.(model.Parallel); ok {
		r.GPUs = p.Devices()
	}
	// The trainer's step: accumulate micro-batches shared by the GPUs, each
	// weighted by its share of the step, then one optimizer step.
	micro := o.Accumulate
	if micro == 0 {
		micro = r.GPUs
	}
	if _, err := NewGlobalBatch(o.Batch, micro, r.GPUs); err != nil {
		return r, err
	}
	r.Accumulate = micro
	if p, ok := eng.(model.Parallel); ok {
		p.SetAccumulate(micro)
		r.GradientSum = p.GradientSum()
	}
	if dev, ok := eng.(model.Device); ok {
		d := dev.Device()
		r.Device, r.Arch, r.MemoryInUseBefore = d.Name, d.Arch, d.UsedAtStart
	}
	if err := eng.SetParams(model.InitParams(c, 1)); err != nil {
		return r, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	n := o.Batch * o.Seq
	b := model.Batch{B: o.Batch, T: o.Seq, Inputs: make([]int32, n), Targets: make([]int32, n)}
	for i := range b.Inputs {
		b.Inputs[i] = int32(rng.IntN(c.VocabSize))
		b.Targets[i] = int32(rng.IntN(c.VocabSize))
	}
	opt := model.AdamW{LR: 4e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}
	// The trainer's steps, a step ahead where the engine can be
	// (model.MetricsAhead): a step's metrics are read once the next one is
	// queued, and the steps the trainer completes at once (a checkpoint's,
	// the last) are completed at once here too.
	ahead, _ := eng.(model.MetricsAhead)
	var pending func() (model.StepMetrics, error)
	run := func(complete bool) (model.StepMetrics, error) {
		if err := eng.ZeroGrad(); err != nil {
			return model.StepMetrics{}, err
		}
		for range micro {
			if err := eng.ForwardBackward(b, 1/float32(micro)); err != nil {
				return model.StepMetrics{}, err
			}
		}
		if err := eng.Step(opt); err != nil {
			return model.StepMetrics{}, err
		}
		if wait := pending; wait != nil {
			pending = nil
			if _, err := wait(); err != nil {
				return model.StepMetrics{}, err
			}
		}
		if ahead != nil && !complete {
			var err error
			pending, err = ahead.MetricsLater()
			return model.StepMetrics{}, err
		}
		return eng.Metrics()
	}
	step := func() (model.StepMetrics, error) { return run(true) }
	for i := 0; i < o.Warmup; i++ {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		if _, err := run(i == o.Warmup-1); err != nil {
			return r, err
		}
	}
	var ck *ckWriter
	if o.CheckpointEvery > 0 {
		dir, err := os.MkdirTemp(o.CheckpointDir, "kiln-bench-checkpoints-*")
		if err != nil {
			return r, fmt.Errorf("bench checkpoints: %w", err)
		}
		defer os.RemoveAll(dir)
		ck = &ckWriter{eng: eng, mc: c, out: filepath.Join(dir, "run"), log: zap.NewNop()}
		// Whatever the return, no write may still read the engine's
		// state copy when the engine is closed.
		defer ck.wait()
	}
	cpu0 := sampleCPU()
	start := time.Now()
	var m model.StepMetrics
	secs := make([]float64, o.Steps)
	for i := 0; i < o.Steps; i++ {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		t0 := time.Now()
		ckStep := ck != nil && (i+1)%o.CheckpointEvery == 0
		if m, err = run(ckStep || i == o.Steps-1); err != nil {
			return r, err
		}
		if ckStep {
			if err := benchCheckpoint(ctx, ck, i+1, o.CheckpointWait); err != nil {
				return r, err
			}
		}
		secs[i] = time.Since(t0).Seconds()
	}
	if ck != nil {
		if w := ck.wait(); w != nil && w.err != nil {
			return r, w.err
		}
		r.Checkpoints = checkpointTiming(secs, o.CheckpointEvery, n*micro)
	}
	r.Seconds = time.Since(start).Seconds()
	r.OtherCPU, _ = othersShare(cpu0, sampleCPU())
	r.Loss = m.Loss
	r.TokPerSec = float64(n*micro*o.Steps) / r.Seconds
	peak := o.PeakFLOPS
	if peak <= 0 {
		peak = PeakFor(r.Device, r.Precision)
	}
	if mfu := MFU(r.TokPerSec/float64(r.GPUs), FLOPsPerToken(c, o.Seq), peak); mfu != nil {
		r.MFU = *mfu
	}
	ms := eng.Memory()
	r.PeakAllocated = ms.PeakAllocated
	r.ProcessMemory, r.ProcessMemorySource = ms.InUse, "engine"
	if own, ok := processMemory(ctx, os.Getpid()); ok {
		r.ProcessMemory, r.ProcessMemorySource = own, "nvidia-smi"
	}
	if pr, ok := eng.(model.Profiler); ok && o.Profile {
		if r.KernelMSPerStep, err = profileSteps(ctx, pr, step, o.Steps); err != nil {
			return r, err
		}
	}
	if !r.GPUIdle() {
		logf(fmt.Sprintf("warning: other processes were using the GPU when the run started (%s): figures from a busy GPU are not comparable", strings.Join(others, ", ")))
	}
	return r, nil
}

// GPUProcesses lists the processes nvidia-smi sees on the GPU as
// "pid:MiB", other than this one; nil when nvidia-smi is absent.
func GPUProcesses(ctx context.Context) []string {
	var out []string
	for _, r := range smiApps(ctx) {
		if r[0] != strconv.Itoa(os.Getpid()) {
			out = append(out, r[0]+":"+r[1]+"MiB")
		}
	}
	return out
}

// processMemory is pid's device memory according to nvidia-smi.
func processMemory(ctx context.Context, pid int) (int64, bool) {
	for _, r := range smiApps(ctx) {
		if r[0] == strconv.Itoa(pid) {
			mib, err := strconv.ParseInt(r[1], 10, 64)
			return mib << 20, err == nil
		}
	}
	return 0, false
}

// smiApps asks nvidia-smi for the compute processes: (pid, MiB) rows.
func smiApps(ctx context.Context) [][2]string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, "nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return nil
	}
	var rows [][2]string
	for _, line := range bytes.Split(b, []byte("\n")) {
		parts := strings.Split(string(line), ",")
		if len(parts) == 2 {
			rows = append(rows, [2]string{strings.TrimSpace(parts[0]), strings.TrimSpace(parts[1])})
		}
	}
	return rows
}

// profileSteps runs steps more steps with every kernel timed and returns
// the milliseconds per step of each kernel name.
func profileSteps(ctx context.Context, e model.Profiler, step func() (model.StepMetrics, error), steps int) (map[string]float64, error) {
	if err := e.SetProfiling(true); err != nil {
		return nil, err
	}
	for i := 0; i < steps; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if _, err := step(); err != nil {
			return nil, err
		}
	}
	t := e.KernelTimes()
	if err := e.SetProfiling(false); err != nil {
		return nil, err
	}
	for k := range t {
		t[k] /= float64(steps)
	}
	return t, nil
}

// benchCheckpoint writes the checkpoint after step as a run does: it waits
// for the write in flight, then begins this one; with wait it also waits
// for this one.
func benchCheckpoint(ctx context.Context, ck *ckWriter, step int, wait bool) error {
	if w := ck.wait(); w != nil && w.err != nil {
		return w.err
	}
	if err := ck.start(ctx, State{Step: step, Cursor: []byte("null")}); err != nil {
		return err
	}
	if wait {
		if w := ck.wait(); w != nil && w.err != nil {
			return w.err
		}
	}
	return nil
}

// aroundCheckpoint is the steps counted as a checkpoint's: its own and the
// two after it (CheckpointTiming says why).
const aroundCheckpoint = 3

// checkpointTiming sums the timed steps' seconds by their place relative
// to the checkpoints (after every steps).
func checkpointTiming(secs []float64, every, tokens int) *CheckpointTiming {
	t := &CheckpointTiming{}
	var ckS, aroundS, otherS float64
	var nAround, nOther, windows int
	skipFirst := len(secs) >= 2*every
	for i, s := range secs {
		t.SlowestStepSeconds = max(t.SlowestStepSeconds, s)
		if (i+1)%every == 0 {
			t.Checkpoints++
			ckS += s
			t.CheckpointStepSeconds = append(t.CheckpointStepSeconds, s)
			t.SlowestCheckpointStepSecs = max(t.SlowestCheckpointStepSecs, s)
		}
		// Steps since the last checkpoint's step, counting it as 0.
		since, nth := (i+1)%every, (i+1)/every
		switch {
		case nth == 0 || since >= aroundCheckpoint:
			nOther++
			otherS += s
		case nth == 1 && skipFirst:
			// The first checkpoint's steps: counted with neither.
		default:
			nAround++
			aroundS += s
			if since == 0 {
				windows++
			}
		}
	}
	rate := func(n int, s float64) float64 {
		if n == 0 || s <= 0 {
			return 0
		}
		return float64(n*tokens) / s
	}
	t.CheckpointStepTokPerSec, t.AroundTokPerSec, t.OtherStepTokPerSec = rate(t.Checkpoints, ckS), rate(nAround, aroundS), rate(nOther, otherS)
	if windows > 0 && nOther > 0 {
		t.AroundExtraSeconds = (aroundS - float64(nAround)*otherS/float64(nOther)) / float64(windows)
	}
	return t
}
