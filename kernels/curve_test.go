package kernels_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/kernels"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/trainer"
)

// curveConfig is the head_dim-64 model for the loss-curve check.
var curveConfig = model.Config{VocabSize: 4096, Hidden: 256, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 64, Intermediate: 704,
	MaxPositions: 256, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: true, BOSTokenID: 0, EOSTokenID: 0, InitializerRange: 0.02}

const (
	curveSteps = 200
	curveB     = 4
	curveT     = 256
)

// curveCorpus trains a 4096-entry tokenizer on the .txt files in dir and
// returns it with the files' tokens, documents separated by the EOS id.
func curveCorpus(t *testing.T, dir string) ([]byte, []int32) {
	ctx := context.Background()
	paths, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
	sort.Strings(paths)
	if len(paths) == 0 {
		t.Fatalf("no .txt files in %s", dir)
	}
	open := func() []io.Reader {
		var rs []io.Reader
		for _, p := range paths {
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			rs = append(rs, f)
		}
		return rs
	}
	tj, err := tokenizer.Train(ctx, open(), tokenizer.TrainOptions{VocabSize: curveConfig.VocabSize})
	if err != nil {
		t.Fatal(err)
	}
	return tj, encodeCorpus(t, tj, dir)
}

// encodeCorpus tokenizes the .txt files in dir with tokenizer.json tj.
func encodeCorpus(t *testing.T, tj []byte, dir string) []int32 {
	ctx := context.Background()
	paths, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
	sort.Strings(paths)
	tok, err := tokenizer.Parse(tj)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int32
	for _, p := range paths {
		r, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		err = tok.EncodeReader(ctx, r, func(b []uint32) error {
			for _, id := range b {
				ids = append(ids, int32(id))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, int32(curveConfig.EOSTokenID))
	}
	return ids
}

// curveBatch is step s's batch: windows drawn uniformly from the whole
// stream (a first run on consecutive windows met the corpus file by file,
// and the loss jumped between 3 and 9 at each change of language).
func curveBatch(ids []int32, s int) model.Batch {
	b := model.Batch{B: curveB, T: curveT, Inputs: make([]int32, curveB*curveT), Targets: make([]int32, curveB*curveT)}
	rng := rand.New(rand.NewPCG(uint64(s), 0x6375727665)) // "curve"
	for i := 0; i < curveB; i++ {
		start := rng.IntN(len(ids) - curveT - 1)
		copy(b.Inputs[i*curveT:], ids[start:start+curveT])
		copy(b.Targets[i*curveT:], ids[start+1:start+curveT+1])
	}
	return b
}

// curveLR is the trainer's schedule (trainer.LearningRate): 20 warm-up
// steps to the peak, then a cosine to a tenth of it at step 200. The peak is
// 7e-4 unless KILN_CURVE_LR sets another; the kept CPU curve in
// KILN_CURVE_OUT must have been computed with the same peak. At 7e-4 the
// CPU loss falls 30% and the bf16 GPU curve stayed within 0.18% of it in
// seven runs; at 1e-3 the loss falls no further (30.3%) but the two
// trajectories part by up to 1.2% (docs/benchmarks/cuda.md).
func curveLR(s int) float64 { return trainer.LearningRate(s, curvePeakLR(), 20, curveSteps, 0.1) }

func curvePeakLR() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("KILN_CURVE_LR"), 64); err == nil && v > 0 {
		return v
	}
	return 7e-4
}

// curveHeader heads a kept CPU curve with the schedule it was trained
// with, so that a curve from another schedule is refused, not compared.
func curveHeader() string {
	return fmt.Sprintf("# lr: warmup 20 to %g, cosine to 0.1 x peak at step %d", curvePeakLR(), curveSteps)
}

func trainCurve(t *testing.T, eng model.Engine, ids []int32) []float64 {
	if err := eng.SetParams(model.InitParams(curveConfig, 7)); err != nil {
		t.Fatal(err)
	}
	var losses []float64
	for s := 0; s < curveSteps; s++ {
		if err := eng.ZeroGrad(); err != nil {
			t.Fatal(err)
		}
		if err := eng.ForwardBackward(curveBatch(ids, s), 1); err != nil {
			t.Fatal(err)
		}
		if err := eng.Step(model.AdamW{LR: curveLR(s), Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}); err != nil {
			t.Fatal(err)
		}
		m, err := eng.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, m.Loss)
	}
	return losses
}

// The GPU (bf16) and the CPU reference (fp32) train the same model on real
// text to loss curves within 1% of each other at every logged step, and a
// checkpoint of the GPU run is written for transformers to load (see
// docs/benchmarks/cuda.md). It takes minutes of CPU, so it runs only when
// KILN_CURVE_TEXTS names a directory of .txt files. KILN_CURVE_OUT keeps the
// tokenizer, the CPU curve (computed once, read back on later runs, so that
// it can be computed on another machine), the compared curves and the
// checkpoint; KILN_CURVE_THREADS bounds the CPU engine's threads.
func TestLossCurveMatchesCPU(t *testing.T) {
	dir := os.Getenv("KILN_CURVE_TEXTS")
	if dir == "" {
		t.Skip("set KILN_CURVE_TEXTS to a directory of .txt files to run the 200-step CPU/GPU loss-curve comparison")
	}
	out := os.Getenv("KILN_CURVE_OUT")
	if out == "" {
		out = t.TempDir()
	}
	tj, ids, cpuCurve := cpuCurveCached(t, dir, out)
	o := model.Options{Precision: "bf16", MaxBatch: curveB, MaxSeq: curveT}
	k, err := kernels.ParseOptions(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	kernels.Configure(k)
	defer kernels.Configure(kernels.Options{})
	gpu, err := model.NewEngine("cuda", curveConfig, o)
	var u interface{ Unavailable() bool }
	if errors.As(err, &u) && u.Unavailable() {
		t.Skipf("CPU curve in %s; no CUDA GPU here to compare with: %v", out, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer gpu.Close()
	t.Logf("corpus: %d tokens; %d steps of %d x %d", len(ids), curveSteps, curveB, curveT)
	cudaCurve := trainCurve(t, gpu, ids)

	var tsv strings.Builder
	tsv.WriteString("step\tcpu_fp32\tcuda_bf16\trel_diff\n")
	worst := 0.0
	for s := range cpuCurve {
		rel := math.Abs(cudaCurve[s]-cpuCurve[s]) / cpuCurve[s]
		fmt.Fprintf(&tsv, "%d\t%.6f\t%.6f\t%.2e\n", s+1, cpuCurve[s], cudaCurve[s], rel)
		logged := s == 0 || (s+1)%10 == 0
		if logged {
			worst = math.Max(worst, rel)
			if rel > 0.01 {
				t.Errorf("step %d: cpu %.5f, cuda %.5f differ by %.2f%%", s+1, cpuCurve[s], cudaCurve[s], 100*rel)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(out, "loss_curve.tsv"), []byte(tsv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	first, last := cpuCurve[0], mean(cpuCurve[len(cpuCurve)-10:])
	// Informational: trainers log the mean loss of each interval, which
	// shows a drift apart from single-batch scatter.
	worstMean := 0.0
	for s := 0; s+10 <= len(cpuCurve); s += 10 {
		c, g := mean(cpuCurve[s:s+10]), mean(cudaCurve[s:s+10])
		worstMean = math.Max(worstMean, math.Abs(g-c)/c)
	}
	t.Logf("cpu loss %.4f -> %.4f (last 10 mean), %.1f%% lower; worst logged cpu/cuda difference %.3f%%, of 10-step means %.3f%%",
		first, last, 100*(1-last/first), 100*worst, 100*worstMean)
	if last > 0.75*first {
		t.Errorf("the CPU loss fell only from %.4f to %.4f: the corpus is not learnable enough for the check", first, last)
	}

	// The GPU run's checkpoint, and its fp32 logits on one sequence for
	// transformers to reproduce.
	p := model.NewParams(curveConfig)
	if err := gpu.Params(p); err != nil {
		t.Fatal(err)
	}
	st, err := gpu.OptimizerState()
	if err != nil {
		t.Fatal(err)
	}
	ck, err := trainer.WriteCheckpoint(context.Background(), filepath.Join(out, "checkpoints"),
		&trainer.Snapshot{Config: curveConfig, Params: p, Optimizer: st, Tokenizer: tj, State: trainer.State{Step: curveSteps}})
	if err != nil {
		t.Fatal(err)
	}
	f32, err := kernels.New(curveConfig, model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: curveT})
	if err != nil {
		t.Fatal(err)
	}
	defer f32.Close()
	if err := f32.SetParams(p); err != nil {
		t.Fatal(err)
	}
	b := curveBatch(ids, 3)
	one := model.Batch{B: 1, T: curveT, Inputs: b.Inputs[:curveT]}
	logits, err := f32.Logits(one)
	if err != nil {
		t.Fatal(err)
	}
	lf := &model.SafetensorsFile{Metadata: map[string]string{"format": "pt"}, Tensors: []model.Tensor{
		model.I32Tensor("input_ids", []int{1, curveT}, one.Inputs),
		model.F32Tensor("logits", []int{1, curveT, curveConfig.VocabSize}, logits),
	}}
	if err := model.WriteSafetensors(filepath.Join(out, "kiln_logits.safetensors"), lf); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint %s", ck)
}

// cpuCurveCached returns the tokenizer, the corpus tokens and the CPU
// engine's curve, from out when an earlier run left them there.
func cpuCurveCached(t *testing.T, dir, out string) ([]byte, []int32, []float64) {
	tokPath, curvePath := filepath.Join(out, "tokenizer.json"), filepath.Join(out, "cpu_curve.tsv")
	if tj, err := os.ReadFile(tokPath); err == nil {
		if b, err := os.ReadFile(curvePath); err == nil {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if lines[0] != curveHeader() {
				t.Fatalf("%s was computed with %q, not %q: delete it to recompute, or set KILN_CURVE_LR to its peak", curvePath, lines[0], curveHeader())
			}
			var curve []float64
			for _, line := range lines[2:] {
				f := strings.Fields(line)
				v, err := strconv.ParseFloat(f[1], 64)
				if err != nil {
					t.Fatalf("%s: %v", curvePath, err)
				}
				curve = append(curve, v)
			}
			if len(curve) != curveSteps {
				t.Fatalf("%s holds %d steps, want %d: delete it to recompute", curvePath, len(curve), curveSteps)
			}
			return tj, encodeCorpus(t, tj, dir), curve
		}
	}
	tj, ids := curveCorpus(t, dir)
	threads, _ := strconv.Atoi(os.Getenv("KILN_CURVE_THREADS"))
	cpu, err := model.NewEngine("cpu", curveConfig, model.Options{Precision: "fp32", MaxBatch: curveB, MaxSeq: curveT, Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	curve := trainCurve(t, cpu, ids)
	var b strings.Builder
	b.WriteString(curveHeader() + "\nstep\tcpu_fp32\n")
	for s, v := range curve {
		fmt.Fprintf(&b, "%d\t%.6f\n", s+1, v)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokPath, tj, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(curvePath, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return tj, ids, curve
}
