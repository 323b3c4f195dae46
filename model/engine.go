package model

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Batch is one micro-batch: B sequences of T positions. Targets[i] is the
// token that should follow Inputs[i], or -1 where no loss is taken (the
// golden files' last position). The loss is the mean cross-entropy over the
// positions whose target is not -1.
type Batch struct {
	B, T    int
	Inputs  []int32 // (B, T)
	Targets []int32 // (B, T), -1 = ignored
}

// AdamW holds one optimizer step's hyper-parameters. Weight decay is
// decoupled and applies to parameters of 2 or more dimensions only.
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	// Clip is the global gradient-norm limit; 0 disables clipping.
	Clip float64
}

// StepMetrics is what a step reports once the engine is synchronised.
type StepMetrics struct {
	// Loss is the sum over the micro-batches since ZeroGrad of
	// scale x (mean loss of the micro-batch): the mean loss of the whole
	// batch when the trainer passes scale = 1/k for k equal micro-batches.
	Loss float64
	// AuxLoss is the same sum of the load-balancing loss alone (before its
	// coefficient), for a model with experts; Loss includes
	// router_aux_loss_coef x AuxLoss.
	AuxLoss float64
	// GradNorm is the global gradient norm before clipping, of the last Step.
	GradNorm float64
	// ExpertShare is, for a model with experts, the share of the (token,
	// choice) pairs each expert received over every layer and micro-batch
	// since ZeroGrad (it sums to 1): an expert near 0 is starving.
	ExpertShare []float64
	// At is when the step was complete, where the engine knows it better
	// than the caller's clock when the metrics reach it: the CPU engine's
	// MetricsLater, whose step was complete when Step returned, sets it.
	// The zero value: when the metrics were read (Metrics, or
	// MetricsLater's wait, blocks until the step is complete).
	At time.Time
}

// Shares normalises per-expert counts into ExpertShare (nil when there
// are none).
func Shares(counts []float64) []float64 {
	var sum float64
	for _, c := range counts {
		sum += c
	}
	if len(counts) == 0 || sum <= 0 {
		return nil
	}
	out := make([]float64, len(counts))
	for i, c := range counts {
		out[i] = c / sum
	}
	return out
}

// OptimizerState is the AdamW state, laid out like Params.Data.
type OptimizerState struct {
	Step int       // number of AdamW steps taken (bias correction)
	M, V []float32 // first and second moments
}

// Sampling selects the next token in generation.
type Sampling struct {
	Temperature float64 // 0 = greedy
	TopK        int     // 0 = whole vocabulary
	Seed        uint64
	// Vocab, when above 0, is how many ids may be picked (the first): a
	// tokenizer smaller than the model's vocab_size (padded, as many
	// checkpoints are) has no text for the ids past its own.
	Vocab int
}

// MemoryStats is what an engine reports of its memory use, in bytes.
type MemoryStats struct {
	PeakAllocated int64 // tensors and workspaces (comparable to torch.cuda.max_memory_allocated)
	InUse         int64 // what the process holds on the device now
}

// Engine runs the model: both the CPU reference and the CUDA engine
// implement it, and the trainer sees nothing else. Engines are not safe for
// concurrent use; the CUDA engine pins its calls to one OS thread itself.
type Engine interface {
	Name() string
	Config() Config

	// SetParams copies p onto the engine and resets gradients; Params copies
	// the engine's current parameters back into p.
	SetParams(p *Params) error
	Params(p *Params) error
	SetOptimizerState(s *OptimizerState) error
	OptimizerState() (*OptimizerState, error)

	// ZeroGrad clears the accumulated gradients and loss.
	ZeroGrad() error
	// ForwardBackward runs one micro-batch and adds scale x its gradient
	// (of the mean loss) to the accumulated gradients. It need not wait for
	// the device; errors may surface at the next synchronising call.
	ForwardBackward(b Batch, scale float32) error
	// Step clips the global gradient norm and applies one AdamW update.
	Step(o AdamW) error
	// Metrics waits for the engine and returns the loss accumulated since
	// ZeroGrad and the last Step's gradient norm.
	Metrics() (StepMetrics, error)
	// Grads copies the accumulated gradients into g (laid out like Params).
	Grads(g *Params) error

	// Logits runs the forward pass only and returns (B, T, vocab) logits.
	Logits(b Batch) ([]float32, error)
	// EvalLoss returns the mean cross-entropy of b without touching
	// gradients (no load-balancing loss).
	EvalLoss(b Batch) (float64, error)
	// Generate extends prompt by up to n tokens with a KV cache, stopping
	// early after stop when stop >= 0. It returns the new tokens only, the
	// stop token included, drawn with a Sampler so that a seed means the
	// same draws on every engine. A cancelled ctx ends it before the next
	// token, with ctx's error.
	Generate(ctx context.Context, prompt []int32, n int, stop int32, s Sampling) ([]int32, error)

	Memory() MemoryStats
	Close() error
}

// DeviceInfo describes the accelerator an engine runs on, for reports.
type DeviceInfo struct {
	Name         string
	Major, Minor int
	SMs          int
	TotalBytes   int64
	// UsedAtStart is the device memory in use once the engine's context
	// existed, before its allocations: other processes plus the context.
	UsedAtStart int64
	// Arch is what the engine's kernels were built for ("sm_90", or
	// "compute_80" when the sm_80 path is forced).
	Arch string
}

// Device is an engine that runs on an accelerator: the trainer and the
// bench read its name (for the peak FLOPS of MFU) and memory from it.
type Device interface {
	Device() DeviceInfo
}

// Profiler is an engine that can time each of its kernels. With profiling
// on, every kernel is waited for, so the figures say where the device time
// goes, not how fast an unprofiled step runs.
type Profiler interface {
	// SetProfiling turns per-kernel timing on or off and clears the totals.
	SetProfiling(on bool) error
	// KernelTimes returns the device milliseconds per kernel name since
	// SetProfiling(true).
	KernelTimes() map[string]float64
}

// MetricsAhead is an engine whose step's metrics can be read after the
// next step has been queued: the trainer queues step n + 1 before it waits
// for step n's loss, so the host's work between two steps (reading the
// metrics, drawing and staging the next batch, launching its work)
// overlaps the device's instead of leaving it idle
// (docs/decisions/step-ahead.md).
type MetricsAhead interface {
	// MetricsLater starts copying the metrics of the step queued last (by
	// the last Step) and returns at once; wait blocks until they are
	// copied and returns them. wait must be called before the second
	// MetricsLater after this one, which reuses its place.
	MetricsLater() (wait func() (StepMetrics, error), err error)
}

// StateCopier is an engine that copies its training state (the weights and
// both Adam moments) to host memory without waiting for the device, so
// that a checkpoint is written while training goes on.
type StateCopier interface {
	// CopyState starts copying the state as the work issued so far leaves
	// it; later steps do not change what is copied. wait blocks until the
	// copy is complete and returns it. The returned values are the
	// engine's own host memory: they must not be written, and are valid
	// until the next CopyState or Close, which the caller must not call
	// before wait has returned.
	CopyState() (wait func() (*Params, *OptimizerState, error), err error)
}

// ParamsOver lays c's parameters over data, which must hold exactly
// c.NumParams() values: an engine's host copy read as Params without
// copying it.
func ParamsOver(c Config, data []float32) (*Params, error) {
	p := &Params{Config: c, specs: c.Specs(), offset: map[string]int{}}
	n := 0
	for _, s := range p.specs {
		p.offset[s.Name] = n
		n += s.Elements()
	}
	if len(data) != n {
		return nil, fmt.Errorf("parameters of %d values laid over %d", n, len(data))
	}
	p.Data = data
	return p, nil
}

// Options select and configure an engine.
type Options struct {
	// Precision is "fp32" or "bf16". The CPU engine computes in fp32 always.
	Precision string
	// MaxBatch and MaxSeq bound the micro-batch, so that an engine can
	// allocate its activations once.
	MaxBatch, MaxSeq int
	// Threads bounds CPU parallelism (0 = all cores).
	Threads int
	// ForceSM80 makes the CUDA engine build the sm_80 path on a newer GPU.
	ForceSM80 bool
	// GPUs is how many GPUs of this host a training engine spreads its
	// micro-batches over (data parallel): 0 or 1 for one, AllGPUs for every
	// GPU the process sees. Only the CUDA engine takes more than one.
	GPUs int
	// Accumulate is the micro-batches of a training step (0: not known).
	// With AllGPUs the engine takes the most GPUs it sees that divide it
	// (DividingGPUs), so that every GPU trains as many of them.
	Accumulate int
	// Log receives one-line notices, such as why "auto" fell back to the CPU.
	Log func(string)
	// Purpose is what the engine will run (the zero value: training); with
	// MaxBatch and MaxSeq it sizes the memory checked before allocating.
	Purpose Purpose
}

// AllGPUs as Options.GPUs asks for every GPU the process sees.
const AllGPUs = -1

// MaxGPUs is the most GPUs a run or a bench may name. gpus counts GPUs of
// one host, which one process joins in one NCCL communicator
// (kernels.NewGroup), and NCCL holds at most 64 ranks on a node
// (NCCL_MAX_LOCAL_RANKS; 72 in the releases for NVL72 racks), where the
// largest single hosts carry 8 or 16 GPUs. The host's CUDA device count
// bounds it further when the engine starts; a count above this one is a
// typo, refused where it is read, before anything counts up to it.
const MaxGPUs = 64

// GPUsString writes a GPU count as the settings take it: a number or all.
func GPUsString(n int) string {
	if n == AllGPUs {
		return "all"
	}
	return strconv.Itoa(n)
}

// CheckGPUs refuses several GPUs (gpus other than 0 or 1, AllGPUs among
// them) on the CPU engine: the one rule NewEngine, a run's settings and
// the bench check before anything starts.
func CheckGPUs(engine string, gpus int) error {
	if gpus != 0 && gpus != 1 && engine == "cpu" {
		return fmt.Errorf("gpus %s needs the cuda engine, not cpu: set engine cuda (or auto), or gpus 1", GPUsString(gpus))
	}
	return nil
}

// DividingGPUs is how many of n GPUs a run trains on when it names no
// number itself (the worker's KILN_GPUS, or gpus all): the largest count
// not above n that divides accumulate, since each GPU trains
// accumulate/gpus micro-batches of every step. Such a run asked for what
// the host has, so it trains on fewer GPUs rather than not at all; a run
// that names a number is refused instead (trainer.NewGlobalBatch).
// accumulate below 1 (not known) or n below 1 (no GPU) leaves n.
func DividingGPUs(n, accumulate int) int {
	if accumulate < 1 || n < 1 {
		return n
	}
	// No count above accumulate divides it: the search starts there.
	d := min(n, accumulate)
	for accumulate%d != 0 {
		d--
	}
	return d
}

// FewerGPUsNotice is the line that says a run trains on use of the n GPUs
// it was given, and by what (from: "gpus all: this process sees 3 GPUs"),
// because accumulate does not split evenly over more, and what to set to
// train on all n.
func FewerGPUsNotice(from string, n, use, accumulate int) string {
	lo := accumulate / n * n
	multiples := strconv.Itoa(lo + n)
	if lo > 0 {
		multiples = fmt.Sprintf("%d or %d", lo, lo+n)
	}
	return fmt.Sprintf("%s, and accumulate %d does not split evenly over %d (each GPU trains accumulate/gpus micro-batches of every step): training on %d GPU(s); to train on all %d, set accumulate to a multiple of %d, such as %s (or set gpus %d to keep to %d without this notice)",
		from, accumulate, n, use, n, n, multiples, use, use)
}

// Parallel is an engine that trains on several devices at once: each
// micro-batch of a step goes to one of them, in turn, so a step's
// micro-batches must be a multiple of Devices. SetAccumulate tells it the
// micro-batches of every step where Options.Accumulate could not (0), so
// that it can sum the gradients over the devices during the last ones.
// GradientSum says how a step's gradients are summed over the devices, in
// words, for a benchmark's line: one all-reduce after the backward, or
// buckets during it.
type Parallel interface {
	Devices() int
	SetAccumulate(micro int)
	GradientSum() string
}

// Plan is the memory plan of an engine start with these options.
func (o Options) Plan(engine string, c Config) MemoryPlan {
	return MemoryPlan{Config: c, Engine: engine, Precision: o.Precision, Batch: o.MaxBatch, Seq: o.MaxSeq, Purpose: o.Purpose}
}

// Factory makes an engine for c. An error that implements
// Unavailable() bool means the engine cannot run here (no device, no
// library); "auto" then falls back to the CPU.
type Factory func(c Config, o Options) (Engine, error)

var (
	enginesMu sync.Mutex
	engines   = map[string]Factory{}
)

// Register makes an engine available by name. Engines register from init.
func Register(name string, f Factory) {
	enginesMu.Lock()
	defer enginesMu.Unlock()
	engines[name] = f
}

// Engines lists the registered engine names.
func Engines() []string {
	enginesMu.Lock()
	defer enginesMu.Unlock()
	var names []string
	for n := range engines {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// NewEngine makes the named engine: "cpu", "cuda", or "auto" (cuda when it
// loads, else cpu with a one-line notice through o.Log). Every engine start
// passes here, and none allocates before its memory is sized: the CPU
// engine's against the host's available memory here, the CUDA engine's
// against the device's free memory once its context exists (kernels.New).
// Too much is a *MemoryError, which "auto" does not fall back from: a run
// that does not fit the GPU is the user's to resize, not the CPU's to crawl
// through.
func NewEngine(name string, c Config, o Options) (Engine, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if o.Precision == "" {
		o.Precision = "bf16"
	}
	if o.Precision != "fp32" && o.Precision != "bf16" {
		return nil, &EngineError{Msg: fmt.Sprintf("unknown precision %q: choose fp32 or bf16", o.Precision)}
	}
	if o.MaxBatch < 0 || o.MaxSeq < 0 {
		return nil, &EngineError{Msg: fmt.Sprintf("batch %d and seq %d must not be negative", o.MaxBatch, o.MaxSeq)}
	}
	several := o.GPUs != 0 && o.GPUs != 1
	if o.GPUs < AllGPUs || o.GPUs > MaxGPUs {
		return nil, &EngineError{Msg: fmt.Sprintf("gpus %d: give a number of GPUs (1 to %d), or all", o.GPUs, MaxGPUs)}
	}
	if err := CheckGPUs(name, o.GPUs); err != nil {
		return nil, &EngineError{Msg: err.Error()}
	}
	if _, err := EstimateMemory(o.Plan("cpu", c)); err != nil {
		return nil, err
	}
	enginesMu.Lock()
	cuda, cpu := engines["cuda"], engines["cpu"]
	f, ok := engines[name]
	enginesMu.Unlock()
	startCPU := func() (Engine, error) {
		if err := checkHost(c, o); err != nil {
			return nil, err
		}
		return cpu(c, o)
	}
	if name == "auto" {
		if cuda != nil {
			e, err := cuda(c, o)
			if err == nil {
				return e, nil
			}
			var me *MemoryError
			if errors.As(err, &me) {
				return nil, err
			}
			// Several GPUs asked for are never replaced by one CPU.
			var un interface{ Unavailable() bool }
			if several && errors.As(err, &un) && un.Unavailable() {
				return nil, &GPUsUnavailableError{GPUs: o.GPUs, Err: err}
			}
			if several {
				return nil, err
			}
			if o.Log != nil {
				o.Log("engine auto: using the CPU: " + err.Error())
			}
		} else if several {
			return nil, &EngineError{Msg: fmt.Sprintf("gpus %s needs the cuda engine, and this build has none", GPUsString(o.GPUs))}
		} else if o.Log != nil {
			o.Log("engine auto: using the CPU: this build has no CUDA engine")
		}
		if cpu == nil {
			return nil, fmt.Errorf("engine auto: no CPU engine registered")
		}
		return startCPU()
	}
	if !ok {
		return nil, &EngineError{Msg: fmt.Sprintf("unknown engine %q: choose one of %s", name, strings.Join(append(Engines(), "auto"), ", "))}
	}
	if name == "cpu" {
		return startCPU()
	}
	return f(c, o)
}

// checkHost refuses a CPU engine start that needs more than the host (or
// its cgroup) has available. Where that cannot be read, nothing is refused.
func checkHost(c Config, o Options) error {
	avail, ok := HostAvailable()
	if !ok {
		return nil
	}
	return CheckMemory(o.Plan("cpu", c), avail, "this host")
}

// GPUsUnavailableError refuses engine auto on several GPUs (gpus 2, all)
// where the GPUs do not start: auto moves a run of one GPU to the CPU, but
// a run that asked for several is not moved to one CPU, so it is the
// user's to choose. It says which setting ruled the CPU out and what to
// change, the driver's reason short (Brief), and ends with the remedy:
// sched status keeps an error's last "; " clause when it cuts the line.
type GPUsUnavailableError struct {
	GPUs int   // as Options.GPUs: a number above 1, or AllGPUs
	Err  error // the CUDA engine's, Unavailable
}

func (e *GPUsUnavailableError) Error() string {
	why, noDriver := Brief(e.Err)
	mend := "make the GPUs start (above)"
	if noDriver {
		mend = "install the NVIDIA driver"
	}
	return fmt.Sprintf("gpus %s (--gpus, the run's gpus, or the worker's KILN_GPUS where the run names none) and no GPU starts here (%s): "+
		"engine auto moves a run of one GPU to the CPU, never one of several; "+
		"to train on the CPU set --gpus 1, gpus: 1 in the run (or drop it, with KILN_GPUS=1) or engine cpu, or %s",
		GPUsString(e.GPUs), why, mend)
}

func (e *GPUsUnavailableError) Unwrap() error { return e.Err }

// BadInput: the run's settings or the host are the user's to change; a
// retry meets the same refusal.
func (e *GPUsUnavailableError) BadInput() bool { return true }

// Brief is err in one line for a message that says what to do itself:
// the short form an error in its chain gives, and true, else the whole
// error. Only the CUDA driver missing from the machine has one ("no NVIDIA
// driver here (libcuda.so.1 not found)", not every path the loader
// tried), so a short form also says that the driver is to be installed.
func Brief(err error) (string, bool) {
	var b interface{ Brief() string }
	if errors.As(err, &b) {
		if s := b.Brief(); s != "" {
			return s, true
		}
	}
	return err.Error(), false
}

// EngineError is an engine choice or setting the caller has to fix: an
// unknown engine or precision.
type EngineError struct{ Msg string }

func (e *EngineError) Error() string { return e.Msg }

// BadInput marks the choice as the caller's to change.
func (e *EngineError) BadInput() bool { return true }
