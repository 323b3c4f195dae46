package trainer

import (
	"context"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/model"
)

// timedSteps is the CPU engine with a clock on its optimizer steps: took
// holds each step's time from ZeroGrad to Step's return, the least wall
// time any account of that step can give it.
type timedSteps struct {
	model.Engine
	start time.Time
	took  []time.Duration
}

func (e *timedSteps) ZeroGrad() error {
	e.start = time.Now()
	return e.Engine.ZeroGrad()
}

func (e *timedSteps) Step(o model.AdamW) error {
	err := e.Engine.Step(o)
	e.took = append(e.took, time.Since(e.start))
	return err
}

// timedAhead is timedSteps that runs a step ahead, as the engine it wraps.
type timedAhead struct {
	*timedSteps
	model.MetricsAhead
}

// Each logged line's tokens per second covers its own step's time: at
// least the time the engine took for that step, so never more tokens a
// second than the step's own, on the step read a step late (a step ahead),
// the step completed at once after it (a checkpoint's, an evaluation's,
// the last), and the step after an evaluation (whose time is left out).
// The CPU engine computes a step when Step is called, so a step ahead its
// metrics wait for the next step's compute; the interval must end where
// the step ended, not where it was read, or the step after it shows next
// to no time (tens of millions of tokens a second).
func TestLoggedThroughputCoversEachStepsOwnTime(t *testing.T) {
	requireCPU(t)
	rc := testRun(9)
	rc.CheckpointEvery = 4
	mc, err := model.Preset(rc.Model)
	if err != nil {
		t.Fatal(err)
	}
	for _, ahead := range []bool{true, false} {
		eng, err := model.NewEngine("cpu", mc, model.Options{Precision: rc.Precision, MaxBatch: rc.Batch, MaxSeq: rc.Seq})
		if err != nil {
			t.Fatal(err)
		}
		defer eng.Close()
		timed := &timedSteps{Engine: eng}
		var e model.Engine = timed
		if ahead {
			e = timedAhead{timed, eng.(model.MetricsAhead)}
		}
		cfg := Config{Run: rc, Out: t.TempDir(), Data: newSliceData(mc.VocabSize, 20000), Engine: e}
		res, logs, err := runCollect(t, context.Background(), cfg, Hooks{})
		if err != nil || !res.Done || len(timed.took) != rc.TotalSteps {
			t.Fatalf("ahead %v: %+v, %d steps timed, %v", ahead, res, len(timed.took), err)
		}
		perStep := float64(rc.TokensPerStep())
		for step := 1; step <= rc.TotalSteps; step++ {
			line, ok := logs[step]
			if !ok {
				t.Fatalf("ahead %v: no line for step %d", ahead, step)
			}
			most := perStep / timed.took[step-1].Seconds()
			if line.TokPerSec <= 0 || line.TokPerSec > most*(1+1e-9) {
				t.Errorf("ahead %v, step %d: %.0f tok/s logged; the step took %v, at most %.0f tok/s",
					ahead, step, line.TokPerSec, timed.took[step-1], most)
			}
		}
	}
}
