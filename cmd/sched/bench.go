package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
)

type benchFlags struct {
	engine, model, precision string
	batch, seq, steps, warm  int
	accumulate               int
	// accumulateSet: --accumulate was given, so that 0 is refused as
	// every zero size is, not read as the default.
	accumulateSet   bool
	peakTFLOPs      float64
	forceSM80       bool
	profile         bool
	checkpointEvery int
	checkpointWait  bool
	gpus            string
	moe             string
}

// benchResult is the JSON line `sched bench` prints per run: the bench
// sweep's row (trainer/results.BenchRow), then what the PyTorch peer's line
// (torch_peer.py) also reports, and the device's state.
type benchResult struct {
	results.BenchRow

	Engine  string  `json:"engine"`
	Arch    string  `json:"arch,omitempty"`
	ParamsM float64 `json:"params_m"`
	// ActiveParamsM is what one token's pass uses: with --moe, the
	// routers and top_k of the experts (trainer.ActiveParams).
	ActiveParamsM float64 `json:"active_params_m"`
	Steps         int     `json:"steps"`
	Seconds       float64 `json:"seconds"`
	PeakGiB       float64 `json:"peak_gib"`
	Loss          float64 `json:"loss"`
	// ProcessMemory is what this process holds on the device (nvidia-smi's
	// per-process figure when it answers, else the engine's own count).
	ProcessMemory int64 `json:"process_memory_bytes"`
	// ProcessMemorySource says where ProcessMemory came from: "nvidia-smi"
	// or "engine" (device memory in use beyond what was in use at start).
	ProcessMemorySource string `json:"process_memory_source"`
	// MemoryInUseBefore is device memory already in use when the engine
	// started (other processes and this process's context).
	MemoryInUseBefore int64    `json:"memory_in_use_before_bytes"`
	OtherProcesses    []string `json:"other_processes"`
	Warning           string   `json:"warning,omitempty"`
	// KernelMSPerStep is device time per kernel name and step (--profile),
	// measured on separate, serialised steps.
	KernelMSPerStep map[string]float64 `json:"kernel_ms_per_step,omitempty"`
	// Checkpoints (--checkpoint-every): tokens per second of the steps
	// that began a checkpoint, of the steps after them, and of the others.
	Checkpoints *benchCheckpoints `json:"checkpoints,omitempty"`
	// GPUs trained together (--gpus); tok_per_s is all of theirs. With
	// more than one, the same shape was first measured on one GPU in the
	// same process, and the scaling efficiency is total / (GPUs x one's).
	GPUs              int     `json:"gpus"`
	TokPerSecPerGPU   float64 `json:"tok_per_s_per_gpu"`
	OneGPUTokPerSec   float64 `json:"one_gpu_tok_per_s,omitempty"`
	ScalingEfficiency float64 `json:"scaling_efficiency,omitempty"`
	// GradientSum says how the GPUs summed a step's gradients: one
	// all-reduce after the backward, or buckets (KILN_NCCL_BUCKET_MB).
	GradientSum string `json:"gradient_sum,omitempty"`
}

type benchCheckpoints struct {
	Every                   int     `json:"every"`
	Wait                    bool    `json:"wait"`
	Written                 int     `json:"written"`
	CheckpointStepTokPerSec float64 `json:"checkpoint_step_tok_per_sec"`
	// A checkpoint's step and the two after it (the first checkpoint's
	// left out when there are more: it makes the copies' buffer), and what
	// they took beyond as many other steps, a checkpoint.
	AroundTokPerSec        float64   `json:"around_checkpoint_tok_per_sec"`
	AroundExtraSeconds     float64   `json:"around_checkpoint_extra_s"`
	OtherStepTokPerSec     float64   `json:"other_step_tok_per_sec"`
	SlowestCheckpointStepS float64   `json:"slowest_checkpoint_step_s"`
	CheckpointStepSeconds  []float64 `json:"checkpoint_step_seconds"`
}

func init() {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure training throughput (tok/s, MFU, peak memory) as one JSON line",
		Long: `bench trains --steps steps of a preset model on random tokens after
--warmup untimed steps and prints one JSON line: tokens per second, model
FLOPs utilisation (6N + 12 L T d FLOPs per token over the device's peak, as
the PyTorch peer, torch_peer.py, counts them), the peak bytes kiln allocated for
tensors and workspaces, and the process's device memory. It also lists
other processes on the GPU and warns when there are any: figures from a
busy GPU are not comparable (a 2.14x difference was measured from that alone).`,
		Example: `  sched bench
  sched bench --model base --batch 16 --seq 1024
  sched bench --gpus all --profile
  sched bench --engine cpu --model tiny --batch 4 --seq 256 --steps 5 --warmup 1`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.accumulateSet = cmd.Flags().Changed("accumulate")
			return runBench(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.engine, "engine", "auto", "engine: cuda, cpu or auto")
	fl.StringVar(&f.model, "model", "small", "model preset: tiny, small or base")
	fl.StringVar(&f.precision, "precision", "bf16", "precision: bf16 or fp32")
	fl.IntVar(&f.batch, "batch", 32, "sequences per micro-batch")
	fl.IntVar(&f.accumulate, "accumulate", 0, "micro-batches per optimizer step over all GPUs, as a run's accumulate (default: one a GPU); tok/s counts them all")
	fl.IntVar(&f.seq, "seq", 1024, "tokens per sequence")
	fl.IntVar(&f.steps, "steps", 30, "timed steps")
	fl.IntVar(&f.warm, "warmup", 8, "untimed steps first (compilation, allocation, clocks)")
	fl.Float64Var(&f.peakTFLOPs, "peak-tflops", 0, "the device's dense peak at --precision for MFU; 0 looks the GPU up (H100/H200 SXM bf16: 989, RTX 3060: 25.6)")
	fl.BoolVar(&f.forceSM80, "force-sm80", false, "build the CUDA kernels for sm_80 (the RTX 3060's path) on a newer GPU")
	fl.IntVar(&f.checkpointEvery, "checkpoint-every", 0, "write a checkpoint after every N timed steps, as a run does (beside the next steps), into a temporary directory removed at the end, and report the tokens per second of the steps around them")
	fl.BoolVar(&f.checkpointWait, "checkpoint-wait", false, "with --checkpoint-every: wait for each checkpoint's write before the next step, for comparison")
	fl.StringVar(&f.gpus, "gpus", "1", "GPUs to train on data-parallel, a number or all; where that is several, one GPU is measured after them for the scaling efficiency")
	fl.StringVar(&f.moe, "moe", "", "Mixtral's mixture of experts in every layer of the preset: experts=N[,top_k=K,d_ff=F,aux_coef=C], as sched train takes it")
	noEmpty(fl, "gpus", "a number or all", "1")
	noEmpty(fl, "moe", "experts=N[,top_k=K,d_ff=F,aux_coef=C]", "the preset's dense layers")
	fl.BoolVar(&f.profile, "profile", false, "CUDA engine: after the timed steps, run as many again with each kernel timed by events and print the time per kernel")
	rootCmd.AddCommand(cmd)
}

func runBench(ctx context.Context, out, errOut io.Writer, f benchFlags) error {
	c, err := model.Preset(f.model)
	if err != nil {
		return badInput("--model: %v", err)
	}
	if f.moe != "" {
		m, err := trainer.ParseMoE(f.moe)
		if err != nil {
			return err
		}
		if c, err = m.Apply(c); err != nil {
			return badInput("--moe %q: %v", f.moe, err)
		}
	}
	switch {
	case f.batch <= 0:
		return badInput("--batch must be positive, got %d", f.batch)
	case f.seq <= 0 || f.seq > c.MaxPositions:
		return badInput("--seq must be between 1 and the model's %d positions, got %d", c.MaxPositions, f.seq)
	case f.accumulate < 0 || f.accumulateSet && f.accumulate == 0:
		return badInput("--accumulate must be positive, got %d (leave it out for one micro-batch a GPU)", f.accumulate)
	case f.steps <= 0 || f.warm < 0:
		return badInput("--steps must be positive and --warmup not negative (got %d, %d)", f.steps, f.warm)
	case f.peakTFLOPs < 0 || math.IsNaN(f.peakTFLOPs) || math.IsInf(f.peakTFLOPs, 0):
		return badInput("--peak-tflops must be a finite number, not negative, got %g (0 looks the GPU up)", f.peakTFLOPs)
	case f.checkpointEvery < 0:
		return badInput("--checkpoint-every must not be negative, got %d (0 writes none)", f.checkpointEvery)
	case f.engine == "cpu" && f.profile:
		return badInput("--profile times the CUDA engine's kernels: drop it, or bench --engine cuda")
	case f.engine == "cpu" && f.forceSM80:
		return badInput("--force-sm80 builds the CUDA engine's kernels: drop it, or bench --engine cuda")
	case f.checkpointWait && f.checkpointEvery == 0:
		return badInput("--checkpoint-wait needs --checkpoint-every N: there is no checkpoint to wait for")
	}
	if err := checkEngine(f.engine); err != nil {
		return err
	}
	if f.precision != "fp32" && f.precision != "bf16" {
		return badInput("--precision: unknown precision %q: choose fp32 or bf16", f.precision)
	}
	gpus := trainer.GPUCount(1)
	if f.gpus != "" {
		if gpus, err = trainer.ParseGPUsOf("--gpus", f.gpus); err != nil {
			return err
		}
	}
	// Refused here, not after the one-GPU measurement below has run a
	// whole bench on the CPU; the rule's words name the flags.
	if err := model.CheckGPUs(f.engine, int(gpus)); err != nil {
		return badInput("--%v", err)
	}
	if gpus > 1 && f.accumulate > 0 {
		// Known before any GPU starts where the count is a number.
		if _, err := trainer.NewGlobalBatch(f.batch, f.accumulate, int(gpus)); err != nil {
			return err
		}
	}
	opts := trainer.BenchOptions{Model: c, Engine: f.engine, Precision: f.precision, Batch: f.batch, Seq: f.seq, Accumulate: f.accumulate,
		Steps: f.steps, Warmup: f.warm, PeakFLOPS: f.peakTFLOPs * 1e12, ForceSM80: f.forceSM80, Profile: f.profile,
		CheckpointEvery: f.checkpointEvery, CheckpointWait: f.checkpointWait, GPUs: int(gpus),
		Log: func(s string) { fmt.Fprintln(errOut, "sched bench:", s) }}
	res, err := trainer.Bench(ctx, opts)
	if err != nil {
		return err
	}
	var one float64
	if res.GPUs > 1 {
		// Measured after the GPUs asked for, so that "all" on a host of
		// one GPU (or on the CPU) measures once, and several GPUs that
		// fail to start fail before any bench.
		o1 := opts
		o1.GPUs, o1.Profile, o1.CheckpointEvery, o1.CheckpointWait = 1, false, 0, false
		o1.Engine = res.Engine
		r1, err := trainer.Bench(ctx, o1)
		if err != nil {
			return fmt.Errorf("one GPU, for the scaling efficiency: %w", err)
		}
		one = r1.TokPerSec
		fmt.Fprintf(errOut, "sched bench: one GPU: %.0f tok/s\n", one)
	}
	r := benchResult{BenchRow: results.Row(f.model, c, f.batch, f.seq, res), Engine: res.Engine, Arch: res.Arch, ParamsM: float64(c.NumParams()) / 1e6,
		ActiveParamsM: float64(trainer.ActiveParams(c)) / 1e6, Steps: f.steps,
		Seconds: res.Seconds, PeakGiB: float64(res.PeakAllocated) / (1 << 30), Loss: res.Loss,
		ProcessMemory: res.ProcessMemory, ProcessMemorySource: res.ProcessMemorySource, MemoryInUseBefore: res.MemoryInUseBefore,
		OtherProcesses: res.OtherProcesses, KernelMSPerStep: res.KernelMSPerStep}
	r.GPUs, r.TokPerSecPerGPU, r.GradientSum = res.GPUs, res.TokPerSec/float64(max(res.GPUs, 1)), res.GradientSum
	if one > 0 {
		r.OneGPUTokPerSec, r.ScalingEfficiency = one, res.TokPerSec/(float64(res.GPUs)*one)
	}
	if ck := res.Checkpoints; ck != nil {
		r.Checkpoints = &benchCheckpoints{Every: f.checkpointEvery, Wait: f.checkpointWait, Written: ck.Checkpoints,
			CheckpointStepTokPerSec: ck.CheckpointStepTokPerSec, AroundTokPerSec: ck.AroundTokPerSec, AroundExtraSeconds: ck.AroundExtraSeconds,
			OtherStepTokPerSec: ck.OtherStepTokPerSec, SlowestCheckpointStepS: ck.SlowestCheckpointStepSecs,
			CheckpointStepSeconds: ck.CheckpointStepSeconds}
	}
	if r.OtherProcesses == nil {
		r.OtherProcesses = []string{}
	}
	if !r.GPUIdle {
		r.Warning = "other processes were using the GPU when the run started: figures from a busy GPU are not comparable"
	}
	if r.CPUBusy() {
		r.Warning = fmt.Sprintf("other processes used %.0f%% of the CPU while the CPU engine was measured: its figure counts them too; measure again when the machine is idle", r.OtherCPU*100)
		fmt.Fprintln(errOut, "sched bench: warning:", r.Warning)
	}
	if r.KernelMSPerStep != nil {
		writeProfile(errOut, r.KernelMSPerStep, r.Seconds*1000/float64(f.steps))
	}
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(line))
	return err
}

// writeProfile prints the per-kernel table, largest first, beside the
// unprofiled step time.
func writeProfile(w io.Writer, ms map[string]float64, stepMS float64) {
	names := make([]string, 0, len(ms))
	total := 0.0
	for k, v := range ms {
		names = append(names, k)
		total += v
	}
	sort.Slice(names, func(i, j int) bool { return ms[names[i]] > ms[names[j]] })
	fmt.Fprintf(w, "kernel time per step (serialised): %.2f ms; unprofiled step %.2f ms\n", total, stepMS)
	for _, k := range names {
		fmt.Fprintf(w, "  %-24s %9.3f ms %5.1f%%\n", k, ms[k], 100*ms[k]/total)
	}
}

// checkEngine refuses an --engine that is not registered, listing those
// that are.
func checkEngine(name string) error {
	names := append(model.Engines(), "auto")
	if !slices.Contains(names, name) {
		return badInput("unknown --engine %q: choose one of %s", name, strings.Join(names, ", "))
	}
	return nil
}

// checkFinite refuses NaN and infinities in a float flag, by name: they
// pass every comparison a range check makes.
func checkFinite(flag string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return badInput("--%s %g: give a finite number", flag, v)
	}
	return nil
}

// benchFits refuses, at enqueue, a model's bench:run shape that no device
// kiln supports could hold. The GPU worker's device is unknown here, so the
// bound is the largest supported card (an H200, 141 GB); the worker checks
// its own device again before allocating. An unknown model is left to the
// worker, which archives it naming the models.
func benchFits(name, engine string, batch, seq int) error {
	c, err := model.Preset(name)
	if err != nil {
		return nil
	}
	if err := checkEngine(engine); err != nil {
		return err
	}
	if batch == 0 {
		batch = 32
	}
	if seq == 0 {
		seq = 1024
	}
	if seq > c.MaxPositions {
		return badInput("--seq %d: model %s takes 1 to %d positions", seq, name, c.MaxPositions)
	}
	plan := model.MemoryPlan{Config: c, Engine: engine, Batch: batch, Seq: seq, Purpose: model.PurposeBench}
	return model.CheckMemory(plan, model.LargestGPU, "the largest card kiln supports (an H200, 141 GB; the worker's device is unknown at enqueue)")
}
