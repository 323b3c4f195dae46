package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"go.uber.org/zap"
)

// sliceData serves windows of a token slice in a fixed scattered order, with
// its position as the cursor: a Data of the same shape as the token-store
// mixture, small enough to reason about in a test.
type sliceData struct {
	ids  []int32
	eval []int32
	next int // index of the next training window
}

func newSliceData(vocab, n int) *sliceData {
	d := &sliceData{ids: make([]int32, n), eval: make([]int32, n/4)}
	x := uint64(0x9e3779b97f4a7c15)
	for i := range d.ids {
		x = x*6364136223846793005 + 1442695040888963407
		d.ids[i] = int32((x >> 33) % uint64(vocab))
	}
	for i := range d.eval {
		d.eval[i] = d.ids[(i*31)%n]
	}
	return d
}

func (d *sliceData) window(src []int32, i, t int) []int32 {
	windows := (len(src) - 1) / t
	start := ((i * 7919) % windows) * t
	return src[start : start+t+1]
}

func (d *sliceData) Next(ctx context.Context, b, t int) (model.Batch, error) {
	w := make([]int32, 0, b*(t+1))
	for i := 0; i < b; i++ {
		w = append(w, d.window(d.ids, d.next, t)...)
		d.next++
	}
	return windowsToBatch(w, b, t), nil
}

func (d *sliceData) Eval(ctx context.Context, i, b, t int) (model.Batch, error) {
	w := make([]int32, 0, b*(t+1))
	for j := 0; j < b; j++ {
		w = append(w, d.window(d.eval, i*b+j, t)...)
	}
	return windowsToBatch(w, b, t), nil
}

func (d *sliceData) Cursor() (json.RawMessage, error) {
	return json.Marshal(map[string]int{"next": d.next})
}

func (d *sliceData) Seek(c json.RawMessage) error {
	var v struct{ Next int }
	if err := json.Unmarshal(c, &v); err != nil {
		return err
	}
	d.next = v.Next
	return nil
}

func (d *sliceData) Close() error { return nil }

func requireCPU(t *testing.T) {
	t.Helper()
	for _, n := range model.Engines() {
		if n == "cpu" {
			return
		}
	}
	t.Fatal("the cpu engine is not registered")
}

func testRun(total int) RunConfig {
	return RunConfig{Model: "tiny", Seq: 32, Batch: 2, Accumulate: 2, LR: 1e-3, Warmup: 2, TotalSteps: total,
		WeightDecay: 0.1, LogEvery: 1, EvalEvery: 3, EvalBatches: 2, Seed: 11, Engine: "cpu", Precision: "fp32",
		Mixture: []MixtureEntry{{Store: "slice"}}}
}

func runCollect(t *testing.T, ctx context.Context, cfg Config, hooks Hooks) (Result, map[int]Metrics, error) {
	t.Helper()
	got := map[int]Metrics{}
	inner := hooks.Metrics
	hooks.Metrics = func(m Metrics) {
		got[m.Step] = m
		if inner != nil {
			inner(m)
		}
	}
	res, err := Run(ctx, cfg, hooks)
	return res, got, err
}

// The gradient of k micro-batches each scaled by 1/k is the gradient of
// one k-times-larger batch, and so is the reported loss.
func TestAccumulatedMicroBatchesEqualOneLargeBatch(t *testing.T) {
	requireCPU(t)
	mc, _ := model.Preset("tiny")
	grads := func(batch, k int) (*model.Params, float64) {
		eng, err := model.NewEngine("cpu", mc, model.Options{Precision: "fp32", MaxBatch: batch, MaxSeq: 32})
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		if err := eng.SetParams(model.InitParams(mc, 5)); err != nil {
			t.Fatal(err)
		}
		rc := testRun(1)
		rc.Batch, rc.Accumulate = batch, k
		l := &loop{cfg: Config{Data: newSliceData(mc.VocabSize, 20000)}, rc: rc.WithDefaults(), mc: mc, eng: eng}
		if err := l.accumulate(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := eng.Step(model.AdamW{LR: 0, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
			t.Fatal(err)
		}
		m, err := eng.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		g := model.NewParams(mc)
		if err := eng.Grads(g); err != nil {
			t.Fatal(err)
		}
		return g, m.Loss
	}
	big, bigLoss := grads(8, 1)
	acc, accLoss := grads(2, 4)
	if math.Abs(bigLoss-accLoss) > 1e-6*math.Abs(bigLoss) {
		t.Errorf("loss: one batch of 8 gives %.9g, 4 x 2 accumulated %.9g", bigLoss, accLoss)
	}
	for _, s := range big.Specs() {
		a, b := big.Tensor(s.Name), acc.Tensor(s.Name)
		var maxAbs, maxDiff float64
		for i := range a {
			maxAbs = math.Max(maxAbs, math.Abs(float64(a[i])))
			maxDiff = math.Max(maxDiff, math.Abs(float64(a[i]-b[i])))
		}
		// fp32 sums in another order: within 1e-5 of the tensor's largest
		// gradient, far below any layout or scaling mistake (which is O(1)).
		if maxAbs == 0 || maxDiff > 1e-5*maxAbs {
			t.Errorf("%s: accumulated gradient differs by %g (largest %g)", s.Name, maxDiff, maxAbs)
		}
	}
}

// A run stopped at step s (by a bound, or by cancellation as SIGTERM does)
// and resumed logs bit-identical losses for s+1 onward.
func TestResumeIsBitIdentical(t *testing.T) {
	requireCPU(t)
	ctx := context.Background()
	const total = 7
	vocab := model.Presets["tiny"].VocabSize

	base := Config{Run: testRun(total), Out: t.TempDir(), Data: newSliceData(vocab, 20000)}
	res, want, err := runCollect(t, ctx, base, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Done || res.Step != total || len(want) != total || res.Devices != 1 {
		t.Fatalf("uninterrupted run: %+v, %d lines", res, len(want))
	}
	if want[3].EvalLoss == nil || want[6].EvalLoss == nil || want[2].EvalLoss != nil {
		t.Errorf("evaluation every 3 steps: %+v", want)
	}

	// Bounded: the segment handler's way of stopping.
	out := t.TempDir()
	bounded := Config{Run: testRun(total), Out: out, Data: newSliceData(vocab, 20000), MaxSteps: 3}
	res, _, err = runCollect(t, ctx, bounded, Hooks{})
	if err != nil || res.Step != 3 || res.Done || filepath.Base(res.Checkpoint) != "step-0000003" {
		t.Fatalf("bounded run: %+v, %v", res, err)
	}
	// Cancelled during step 5: a checkpoint at the step boundary, then
	// return. Step 4 is counted (its hook called) once step 5 is queued
	// behind it (the engine runs a step ahead), so step 5 is finished.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancelled := Config{Run: testRun(total), Out: out, Data: newSliceData(vocab, 20000), Resume: true}
	res, _, err = runCollect(t, cctx, cancelled, Hooks{Step: func(step, _ int) {
		if step == 4 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) || res.Step != 5 || filepath.Base(res.Checkpoint) != "step-0000005" {
		t.Fatalf("cancelled run: %+v, %v", res, err)
	}
	resumed := Config{Run: testRun(total), Out: out, Data: newSliceData(vocab, 20000), Resume: true}
	res, got, err := runCollect(t, ctx, resumed, Hooks{})
	if err != nil || !res.Done || res.Step != total {
		t.Fatalf("resumed run: %+v, %v", res, err)
	}
	for step := 6; step <= total; step++ {
		if got[step].LossOr(-1) != want[step].LossOr(-1) || got[step].GradNorm != want[step].GradNorm {
			t.Errorf("step %d: resumed loss %v grad norm %v, uninterrupted %v %v", step, got[step].LossOr(-1), got[step].GradNorm, want[step].LossOr(-1), want[step].GradNorm)
		}
	}
	// metrics.jsonl holds every step once, equal to the uninterrupted log.
	b, err := os.ReadFile(filepath.Join(out, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != total {
		t.Fatalf("metrics.jsonl has %d lines, want %d", len(lines), total)
	}
	for i, line := range lines {
		var m Metrics
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m.Step != i+1 || m.LossOr(-1) != want[i+1].LossOr(-1) {
			t.Errorf("metrics line %d: step %d loss %v, want step %d loss %v", i, m.Step, m.LossOr(-1), i+1, want[i+1].LossOr(-1))
		}
		// Each line carries the engine's peak memory (which the results
		// reader plots) and the time since the loop began.
		if m.PeakMemory <= 0 || m.ElapsedS <= 0 {
			t.Errorf("metrics line %d: peak_memory_bytes %d, elapsed_s %v; want both positive", i, m.PeakMemory, m.ElapsedS)
		}
	}
}

func TestDivergenceStopsAndKeepsTheLastGoodCheckpoint(t *testing.T) {
	requireCPU(t)
	rc := testRun(20)
	rc.LR, rc.Warmup, rc.Clip, rc.CheckpointEvery = 1e30, 0, Float(0), 1
	out := t.TempDir()
	_, err := Run(context.Background(), Config{Run: rc, Out: out, Data: newSliceData(model.Presets["tiny"].VocabSize, 20000)}, Hooks{})
	var nf *NonFiniteError
	if !errors.As(err, &nf) {
		t.Fatalf("want a NonFiniteError, got %v", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("step %d:", nf.Step)) || !strings.Contains(err.Error(), nf.LastGood) {
		t.Errorf("error must name the step and the last good checkpoint: %v", err)
	}
	latest, _, lerr := LatestIntactCheckpoint(out, zap.NewNop())
	if lerr != nil || latest != nf.LastGood || filepath.Base(latest) != StepDir(nf.Step-1) {
		t.Fatalf("latest checkpoint %s (%v); error says %s at step %d", latest, lerr, nf.LastGood, nf.Step)
	}
	s, err := ReadCheckpoint(latest, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !finite(s.State.Loss) {
		t.Errorf("the kept checkpoint has loss %v", s.State.Loss)
	}
}

// A learning rate far too high can take the loss past 709.8 nats, where
// its perplexity overflows, a step before the loss is NaN (or never): that
// is a divergence too, reported as one, and not a metrics line that cannot
// be written (an error the worker retried, to diverge again each time).
func TestALossPastWhatPerplexityHoldsIsADivergence(t *testing.T) {
	requireCPU(t)
	rc := testRun(10)
	rc.LR, rc.Warmup, rc.LogEvery, rc.CheckpointEvery = 100, 0, 1, 1
	out := t.TempDir()
	var last float64
	_, err := Run(context.Background(), Config{Run: rc, Out: out, Data: newSliceData(model.Presets["tiny"].VocabSize, 20000)},
		Hooks{Metrics: func(m Metrics) { last = m.LossOr(0) }})
	var nf *NonFiniteError
	if !errors.As(err, &nf) || !finite(nf.Loss) || nf.Loss < 709 {
		t.Fatalf("lr 100: %v; want a NonFiniteError of a finite loss past 709 (the last step logged had loss %v)", err, last)
	}
	if !strings.Contains(err.Error(), "training diverged; the last good checkpoint is "+nf.LastGood) {
		t.Errorf("error must name the last good checkpoint: %v", err)
	}
	b, rerr := os.ReadFile(filepath.Join(out, MetricsFile))
	if rerr != nil {
		t.Fatal(rerr)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, line := range lines {
		var m Metrics
		if err := json.Unmarshal([]byte(line), &m); err != nil || m.PPL == nil || !finite(*m.PPL) {
			t.Fatalf("metrics line %q: %v; want every line whole, with its perplexity", line, err)
		}
	}
	if len(lines) != nf.Step-1 {
		t.Errorf("metrics.jsonl holds %d lines; want the %d steps before the diverged one", len(lines), nf.Step-1)
	}
}

func TestIDsOutsideTheVocabularyStopTheRun(t *testing.T) {
	requireCPU(t)
	rc := testRun(3)
	d := newSliceData(2*model.Presets["tiny"].VocabSize, 20000)
	_, err := Run(context.Background(), Config{Run: rc, Out: t.TempDir(), Data: d}, Hooks{})
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "step ") || !strings.Contains(err.Error(), "vocabulary of 4096") {
		t.Fatalf("want a bad-input error naming the step and the vocabulary, got %v", err)
	}
}

func TestResumeFromAnotherShapeIsRefused(t *testing.T) {
	requireCPU(t)
	out := t.TempDir()
	vocab := model.Presets["tiny"].VocabSize
	if _, err := Run(context.Background(), Config{Run: testRun(1), Out: out, Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil {
		t.Fatal(err)
	}
	rc := testRun(2)
	rc.Model = "small"
	_, err := Run(context.Background(), Config{Run: rc, Out: out, Resume: true, Data: newSliceData(vocab, 20000)}, Hooks{})
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "step-0000001") || !strings.Contains(err.Error(), "d_model 512") {
		t.Fatalf("want a bad-input error naming the checkpoint and the shapes, got %v", err)
	}
}
