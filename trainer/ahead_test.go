package trainer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// stepByStep is an engine with only model.Engine's methods: it has no
// model.MetricsAhead, so the trainer completes every step before it
// queues the next.
type stepByStep struct{ model.Engine }

// aheadRuns trains rc on a fresh CPU engine twice, a step ahead and step
// by step, each into its own directory, and returns the two results,
// logs, errors and directories.
func aheadRuns(t *testing.T, rc RunConfig) (res [2]Result, logs [2]map[int]Metrics, errs [2]error, dirs [2]string) {
	t.Helper()
	mc, err := model.Preset(rc.Model)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		eng, err := model.NewEngine("cpu", mc, model.Options{Precision: rc.Precision, MaxBatch: rc.Batch, MaxSeq: rc.Seq})
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		var e model.Engine = eng
		if i == 1 {
			e = stepByStep{eng}
		} else if _, ok := e.(model.MetricsAhead); !ok {
			t.Fatal("the CPU engine does not run a step ahead")
		}
		dirs[i] = t.TempDir()
		cfg := Config{Run: rc, Out: dirs[i], Data: newSliceData(mc.VocabSize, 20000), Engine: e}
		res[i], logs[i], errs[i] = runCollect(t, context.Background(), cfg, Hooks{})
	}
	return res, logs, errs, dirs
}

// A step ahead, the run trains, logs, evaluates and checkpoints exactly
// as step by step: the same losses, gradient norms, evaluations and
// learning rates at every step, and the same checkpoints, byte for byte.
func TestStepAheadTrainsAsStepByStep(t *testing.T) {
	requireCPU(t)
	rc := testRun(10)
	rc.CheckpointEvery = 4
	res, logs, errs, dirs := aheadRuns(t, rc)
	for i := range 2 {
		if errs[i] != nil || !res[i].Done || res[i].Step != 10 {
			t.Fatalf("run %d: %+v, %v", i, res[i], errs[i])
		}
	}
	for step := 1; step <= 10; step++ {
		a, b := logs[0][step], logs[1][step]
		if a.Step != step || a.LossOr(-1) != b.LossOr(-1) || a.GradNorm != b.GradNorm || a.LR != b.LR || a.Tokens != b.Tokens {
			t.Errorf("step %d: ahead %+v, step by step %+v", step, a, b)
		}
		if (a.EvalLoss == nil) != (step%3 != 0) || a.EvalLoss != nil && b.EvalLoss != nil && *a.EvalLoss != *b.EvalLoss {
			t.Errorf("step %d: evaluation ahead %v, step by step %v", step, a.EvalLoss, b.EvalLoss)
		}
	}
	var names [2][]string
	for i := range 2 {
		ents, err := os.ReadDir(dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.IsDir() {
				names[i] = append(names[i], e.Name())
			}
		}
	}
	want := []string{StepDir(4), StepDir(8), StepDir(10)}
	if !slices.Equal(names[0], want) || !slices.Equal(names[1], want) {
		t.Fatalf("checkpoints ahead %v, step by step %v; want %v", names[0], names[1], want)
	}
	for _, d := range want {
		a, err := os.ReadFile(filepath.Join(dirs[0], d, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dirs[1], d, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s: the weights differ between the two runs", d)
		}
	}
}

// A step whose loss is not finite is found a step later when the run is a
// step ahead, and reported as that step, as step by step: the error names
// it, no checkpoint holds a step at or after it, and the metrics log ends
// before it.
func TestStepAheadReportsTheDivergedStep(t *testing.T) {
	requireCPU(t)
	rc := testRun(20)
	rc.LR, rc.Warmup, rc.Clip, rc.CheckpointEvery, rc.EvalEvery = 1e30, 0, Float(0), 5, 0
	_, logs, errs, dirs := aheadRuns(t, rc)
	var nf [2]*NonFiniteError
	for i := range 2 {
		if !errors.As(errs[i], &nf[i]) {
			t.Fatalf("run %d: want a NonFiniteError, got %v", i, errs[i])
		}
	}
	if nf[0].Step != nf[1].Step || nf[0].Step < 1 {
		t.Fatalf("diverged at step %d ahead, %d step by step", nf[0].Step, nf[1].Step)
	}
	if nf[0].Step%rc.CheckpointEvery == 0 {
		t.Fatalf("diverged at step %d, a checkpoint's step, which is never left pending: the test needs another", nf[0].Step)
	}
	for i := range 2 {
		for step := range logs[i] {
			if step >= nf[i].Step {
				t.Errorf("run %d logged step %d, at or after the diverged step %d", i, step, nf[i].Step)
			}
		}
		ents, err := os.ReadDir(dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.IsDir() && e.Name() >= StepDir(nf[i].Step) {
				t.Errorf("run %d wrote checkpoint %s at or after the diverged step %d", i, e.Name(), nf[i].Step)
			}
		}
	}
}
