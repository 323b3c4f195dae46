package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/kernels"
	"github.com/kiln-lm/kiln/model"
)

type benchFlags struct {
	engine, model, precision string
	batch, seq, steps, warm  int
	peakTFLOPs               float64
	forceSM80                bool
	profile                  bool
}

// benchResult is the JSON line `sched bench` prints per run. Its first
// fields match trainer/results.BenchRow; tok_s, mfu and peak_gib read like
// shared/bench/torch_peer.py's line.
type benchResult struct {
	Model      string  `json:"model"`
	Vocab      int     `json:"vocab"`
	DModel     int     `json:"d_model"`
	Layers     int     `json:"layers"`
	Batch      int     `json:"batch"`
	Seq        int     `json:"seq"`
	TokPerSec  float64 `json:"tok_per_sec"`
	PeakMemory int64   `json:"peak_memory_bytes"`
	MFU        float64 `json:"mfu"`
	GPUIdle    bool    `json:"gpu_idle"`
	Device     string  `json:"device,omitempty"`

	Engine    string  `json:"engine"`
	Precision string  `json:"precision"`
	Arch      string  `json:"arch,omitempty"`
	ParamsM   float64 `json:"params_m"`
	Steps     int     `json:"steps"`
	Seconds   float64 `json:"seconds"`
	PeakGiB   float64 `json:"peak_gib"`
	Loss      float64 `json:"loss"`
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
}

func init() {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure training throughput (tok/s, MFU, peak memory) as one JSON line",
		Long: `bench trains --steps steps of a preset model on random tokens after
--warmup untimed steps and prints one JSON line: tokens per second, model
FLOPs utilisation (6N + 12 L T d FLOPs per token over --peak-tflops, as
shared/bench/torch_peer.py counts them), the peak bytes kiln allocated for
tensors and workspaces, and the process's device memory. It also lists
other processes on the GPU and warns when there are any: figures from a
busy GPU are not comparable (a 2.14x difference was measured from that alone).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.engine, "engine", "auto", "engine: cuda, cpu or auto")
	fl.StringVar(&f.model, "model", "small", "model preset: tiny, small or base")
	fl.StringVar(&f.precision, "precision", "bf16", "precision: bf16 or fp32")
	fl.IntVar(&f.batch, "batch", 32, "sequences per step")
	fl.IntVar(&f.seq, "seq", 1024, "tokens per sequence")
	fl.IntVar(&f.steps, "steps", 30, "timed steps")
	fl.IntVar(&f.warm, "warmup", 8, "untimed steps first (compilation, allocation, clocks)")
	fl.Float64Var(&f.peakTFLOPs, "peak-tflops", 989, "the device's dense bf16 peak for MFU (H100/H200 SXM: 989)")
	fl.BoolVar(&f.forceSM80, "force-sm80", false, "build the CUDA kernels for sm_80 (the RTX 3060's path) on a newer GPU")
	fl.BoolVar(&f.profile, "profile", false, "CUDA engine: after the timed steps, run as many again with each kernel timed by events and print the time per kernel")
	rootCmd.AddCommand(cmd)
}

func runBench(ctx context.Context, out, errOut io.Writer, f benchFlags) error {
	c, err := model.Preset(f.model)
	if err != nil {
		return badInput("--model: %v", err)
	}
	switch {
	case f.batch <= 0:
		return badInput("--batch must be positive, got %d", f.batch)
	case f.seq <= 0 || f.seq > c.MaxPositions:
		return badInput("--seq must be between 1 and the model's %d positions, got %d", c.MaxPositions, f.seq)
	case f.steps <= 0 || f.warm < 0:
		return badInput("--steps must be positive and --warmup not negative (got %d, %d)", f.steps, f.warm)
	case f.peakTFLOPs <= 0:
		return badInput("--peak-tflops must be positive, got %g", f.peakTFLOPs)
	}
	if f.precision != "fp32" && f.precision != "bf16" {
		return badInput("--precision: unknown precision %q: choose fp32 or bf16", f.precision)
	}
	others := gpuProcesses(ctx)
	eng, err := model.NewEngine(f.engine, c, model.Options{Precision: f.precision, MaxBatch: f.batch, MaxSeq: f.seq, ForceSM80: f.forceSM80,
		Log: func(s string) { fmt.Fprintln(errOut, s) }})
	if err != nil {
		return err
	}
	defer eng.Close()
	r := benchResult{Model: f.model, Vocab: c.VocabSize, DModel: c.Hidden, Layers: c.Layers, Batch: f.batch, Seq: f.seq,
		Engine: eng.Name(), Precision: f.precision, Steps: f.steps, ParamsM: float64(c.NumParams()) / 1e6}
	if ce, ok := eng.(*kernels.Engine); ok {
		d := ce.Device()
		r.Device, r.Arch, r.MemoryInUseBefore = d.Name, d.Arch, d.UsedAtStart
	}
	if err := eng.SetParams(model.InitParams(c, 1)); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	n := f.batch * f.seq
	b := model.Batch{B: f.batch, T: f.seq, Inputs: make([]int32, n), Targets: make([]int32, n)}
	for i := range b.Inputs {
		b.Inputs[i] = int32(rng.IntN(c.VocabSize))
		b.Targets[i] = int32(rng.IntN(c.VocabSize))
	}
	opt := model.AdamW{LR: 4e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}
	step := func() (model.StepMetrics, error) {
		if err := eng.ZeroGrad(); err != nil {
			return model.StepMetrics{}, err
		}
		if err := eng.ForwardBackward(b, 1); err != nil {
			return model.StepMetrics{}, err
		}
		if err := eng.Step(opt); err != nil {
			return model.StepMetrics{}, err
		}
		return eng.Metrics()
	}
	for i := 0; i < f.warm; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := step(); err != nil {
			return err
		}
	}
	start := time.Now()
	var m model.StepMetrics
	for i := 0; i < f.steps; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if m, err = step(); err != nil {
			return err
		}
	}
	el := time.Since(start).Seconds()
	r.Seconds = el
	r.Loss = m.Loss
	r.TokPerSec = float64(n*f.steps) / el
	flopsPerTok := 6*float64(c.NumParams()) + 12*float64(c.Layers*f.seq*c.Hidden)
	r.MFU = r.TokPerSec * flopsPerTok / (f.peakTFLOPs * 1e12)
	ms := eng.Memory()
	r.PeakMemory = ms.PeakAllocated
	r.PeakGiB = float64(ms.PeakAllocated) / (1 << 30)
	r.ProcessMemory, r.ProcessMemorySource = ms.InUse, "engine"
	if own, ok := processMemory(ctx, os.Getpid()); ok {
		r.ProcessMemory, r.ProcessMemorySource = own, "nvidia-smi"
	}
	if ce, ok := eng.(*kernels.Engine); ok && f.profile {
		if r.KernelMSPerStep, err = profileSteps(ctx, ce, step, f.steps); err != nil {
			return err
		}
		writeProfile(errOut, r.KernelMSPerStep, el*1000/float64(f.steps))
	}
	r.OtherProcesses = others
	r.GPUIdle = len(others) == 0
	if !r.GPUIdle {
		r.Warning = "other processes were using the GPU when the run started: figures from a busy GPU are not comparable"
		fmt.Fprintln(errOut, "sched bench: warning:", r.Warning, others)
	}
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(line))
	return err
}

// gpuProcesses lists the processes nvidia-smi sees on the GPU as
// "pid:MiB", other than this one; nil when nvidia-smi is absent.
func gpuProcesses(ctx context.Context) []string {
	rows := smiApps(ctx)
	var out []string
	for _, r := range rows {
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
func profileSteps(ctx context.Context, e *kernels.Engine, step func() (model.StepMetrics, error), steps int) (map[string]float64, error) {
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
