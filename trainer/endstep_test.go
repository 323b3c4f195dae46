package trainer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// The step a call ends at is logged where log_every did not log it: a
// segment's bound, a stop, the run's last step. The results read a run's
// step and tokens from its last line, so a run cancelled at step 8177 with
// lines every 20 steps read step 8160 for good, its total then set to
// 8177 and the run done there.
func TestTheStepACallEndsAtIsLogged(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	rc := testRun(7)
	rc.LogEvery, rc.EvalEvery = 2, 0
	out := t.TempDir()

	// A segment bounded at step 3.
	if res, err := Run(context.Background(), Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), MaxSteps: 3}, Hooks{}); err != nil || res.Step != 3 {
		t.Fatalf("first segment: %+v, %v", res, err)
	}
	// A stop at step 5: during its last micro-batch (accumulate 2, so
	// after the 4th read of this call, which resumes after step 3).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &stopData{sliceData: newSliceData(vocab, 20000), cancel: cancel, afterNext: 4}
	res, err := Run(ctx, Config{Run: rc, Out: out, Data: d, Resume: true}, Hooks{})
	if !errors.Is(err, context.Canceled) || res.Step != 5 {
		t.Fatalf("stopped segment: %+v, %v; want it stopped at step 5", res, err)
	}
	// The run's end, at step 7.
	if res, err := Run(context.Background(), Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), Resume: true}, Hooks{}); err != nil || !res.Done {
		t.Fatalf("last segment: %+v, %v", res, err)
	}

	if steps := endedSteps(t, out, rc); !slices.Equal(steps, []int{2, 3, 4, 5, 6, 7}) {
		t.Errorf("metrics.jsonl logs steps %v; want 2 to 7: every second step, and each step a call ended at, once", steps)
	}

	// A run shorter than its log_every logs no step: it has no history to
	// end (sched train says why it wrote no TensorBoard file).
	short := testRun(3)
	short.LogEvery, short.EvalEvery = 10, 0
	out = t.TempDir()
	if res, err := Run(context.Background(), Config{Run: short, Out: out, Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil || !res.Done {
		t.Fatalf("a run of 3 steps: %+v, %v", res, err)
	}
	if steps := endedSteps(t, out, short); len(steps) != 0 {
		t.Errorf("a run of 3 steps with log_every 10 logged steps %v; want none", steps)
	}
}

// endedSteps is the steps of the lines of out's metrics.jsonl, each
// checked to carry its loss and the tokens of rc's steps to it.
func endedSteps(t *testing.T, out string, rc RunConfig) []int {
	t.Helper()
	f, err := os.Open(filepath.Join(out, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var steps []int
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var m Metrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		if m.Loss == nil || m.Tokens != int64(m.Step*rc.TokensPerStep()) {
			t.Errorf("line of step %d: loss %v, tokens %d; want its loss and %d tokens", m.Step, m.Loss, m.Tokens, m.Step*rc.TokensPerStep())
		}
		steps = append(steps, m.Step)
	}
	return steps
}
