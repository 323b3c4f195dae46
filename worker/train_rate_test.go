package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// A run logged every step (pilot-cpu: log_every 1, a checkpoint every 10
// steps) recorded the rate of its last logged step, and the step that
// wrote a checkpoint reads a sixth of the others': sched status's rate and
// ETA swung sixfold from one refresh to the next. Measured over the steps
// of the last 30 s, all of their time counted, the rate holds within a
// few percent once 30 s have passed, at the steps' true average.
func TestARunsRecordedRateIsSteadyThroughItsCheckpoints(t *testing.T) {
	const (
		perStep = 2048     // tokens a step
		fast    = 0.165    // seconds a step: 12.4k tok/s
		slow    = 6 * fast // a step that writes a checkpoint
		every   = 10       // a checkpoint every 10 steps
		steps   = 3000     // pilot-cpu's
		average = every * perStep / ((every-1)*fast + slow)
	)
	r := rateWindow{span: rateSpan.Seconds()}
	elapsed, lowest, highest := 0.0, math.Inf(1), 0.0
	lowestOwn, highestOwn := math.Inf(1), 0.0
	for step := 1; step <= steps; step++ {
		took := fast
		if step%every == 0 {
			took = slow
		}
		elapsed += took
		own := perStep / took
		got := r.add(trainer.Metrics{Step: step, Tokens: int64(step * perStep), TokPerSec: own, ElapsedS: elapsed})
		if elapsed < rateSpan.Seconds()+slow {
			continue // the window fills
		}
		lowest, highest = min(lowest, got), max(highest, got)
		lowestOwn, highestOwn = min(lowestOwn, own), max(highestOwn, own)
	}
	if highestOwn/lowestOwn < 5 {
		t.Fatalf("the steps' own rates range %.0f to %.0f tok/s: not the swing this test is of", lowestOwn, highestOwn)
	}
	if highest/lowest > 1.05 || lowest < 0.97*average || highest > 1.03*average {
		t.Errorf("the recorded rate ranged %.0f to %.0f tok/s; want within 3%% of the steps' average %.0f", lowest, highest, average)
	}
	if n := len(r.logged); float64(n) > (rateSpan.Seconds()+slow)/fast+2 {
		t.Errorf("the window holds %d logged steps, more than 30 s of them", n)
	}
}

// The first logged step of a segment has no step before it to measure
// from: its own rate stands, as does a line without a wall time.
func TestARunsRecordedRateBeginsAtTheSegmentsFirstLoggedStep(t *testing.T) {
	r := rateWindow{span: rateSpan.Seconds()}
	if got := r.add(trainer.Metrics{Step: 1, Tokens: 100, TokPerSec: 50, ElapsedS: 2}); got != 50 {
		t.Errorf("first logged step: %v tok/s, want its own 50", got)
	}
	if got := r.add(trainer.Metrics{Step: 2, Tokens: 300, TokPerSec: 400, ElapsedS: 2.5}); got != 400 {
		t.Errorf("second logged step: %v tok/s, want (300-100)/(2.5-2) = 400", got)
	}
	if got := r.add(trainer.Metrics{Step: 3, Tokens: 400, TokPerSec: 25, ElapsedS: 6.5}); got != 300.0/4.5 {
		t.Errorf("third logged step: %v tok/s, want (400-100)/(6.5-2)", got)
	}
	if got := r.add(trainer.Metrics{Step: 4, Tokens: 500, TokPerSec: 7}); got != 7 {
		t.Errorf("a line without its wall time: %v tok/s, want its own 7", got)
	}
}

// slowStepData is patternData whose slow-th batch comes pause late: the
// step that waits for it reads a rate far below the others'.
type slowStepData struct {
	patternData
	calls atomic.Int64
	slow  int64
	pause time.Duration
}

func (d *slowStepData) Next(ctx context.Context, b, t int) (model.Batch, error) {
	if d.calls.Add(1) == d.slow {
		time.Sleep(d.pause)
	}
	return d.patternData.Next(ctx, b, t)
}

// The rate the run's state records, which sched status shows and counts
// the ETA from, is that of the segment's logged steps over the wall time
// they took (the window's, here all of the segment's, as it lasts less
// than 30 s), not the last logged step's own: with one slow step among
// eight, the two differ tenfold.
func TestARunsStateRecordsTheRateOfItsLatestSteps(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	// Its last step evaluates, so the state is written at that step.
	const total = 8
	run := patternRun("steady", tokName, 1e-3, total, total, total)
	dir := t.TempDir()
	e.handlers.Training = &Training{
		Redis: e.rdb, Objects: objects, Runs: runs.Set{run.Name: run}, Dir: dir, Owner: "gpu-test",
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
		OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) {
			return &slowStepData{slow: 5, pause: 300 * time.Millisecond}, nil
		},
		Log: zap.NewNop(),
	}
	e.serve(map[string]int{scheduler.QueueGPU: 1})
	id := e.enqueue(scheduler.TrainSegment{Run: run.Name})
	e.waitFor(id, 2*time.Minute, "completed", state("completed"))
	st := e.rdb.HGetAll(context.Background(), scheduler.RunStateKey(run.Name)).Val()
	if st["step"] != strconv.Itoa(total) || st["done"] != "true" {
		t.Fatalf("run state %v: want step %d, done", st, total)
	}

	// The window, read back from the segment's metrics: from the newest
	// logged step 30 s or more before the last, else the first.
	f, err := os.Open(filepath.Join(segment.RunDir(dir, run.Name), trainer.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var logged []trainer.Metrics
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m trainer.Metrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		if m.ElapsedS > 0 {
			logged = append(logged, m)
		}
	}
	if len(logged) != total || logged[total-1].Step != total {
		t.Fatalf("%d logged steps in the metrics, want %d", len(logged), total)
	}
	last, from := logged[total-1], logged[0]
	for _, m := range logged[:total-1] {
		if last.ElapsedS-m.ElapsedS >= rateSpan.Seconds() {
			from = m
		}
	}
	want := float64(last.Tokens-from.Tokens) / (last.ElapsedS - from.ElapsedS)
	if st["tok_per_s"] != strconv.FormatFloat(want, 'f', 0, 64) {
		t.Errorf("the run's state records %s tok/s; want %.0f, the rate of steps %d to %d (the last step's own: %.0f)",
			st["tok_per_s"], want, from.Step, last.Step, last.TokPerSec)
	}
}
