package worker

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// A bench:run put into Redis with a batch no device can hold is archived
// with the sizing's one line, before any engine allocates; one that fits
// the largest card but not this host is archived by the engine's own check;
// and the worker runs the next measurement.
func TestBenchRunOfImpossibleSizeIsArchived(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e.handlers.Training = &Training{Redis: e.rdb, Objects: objects, Runs: runs.Presets(), Dir: t.TempDir(), Bench: cpuBench,
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err }}
	e.serve(map[string]int{scheduler.QueueGPU: 1})

	id := e.enqueue(scheduler.BenchRun{Model: "tiny", Engine: "cpu", Params: map[string]string{"batch": "100000000", "seq": "1024"}})
	ts := e.waitFor(id, time.Minute, "archived", state("archived"))
	for _, want := range []string{"batch 100000000 x seq 1024", "141 GB", "--batch"} {
		if !strings.Contains(ts.LastErr, want) {
			t.Errorf("archived with %q, want it to contain %q", ts.LastErr, want)
		}
	}

	if avail, ok := model.HostAvailable(); ok {
		// The smallest batch of 1024 positions this host cannot hold.
		for b := 1; b < 1<<20; b *= 2 {
			est, err := model.EstimateMemory(model.MemoryPlan{Config: model.Presets["tiny"], Engine: "cpu", Batch: b, Seq: 1024, Purpose: model.PurposeBench})
			if err != nil {
				t.Fatal(err)
			}
			if est.Total <= avail {
				continue
			}
			if est.Total < model.LargestGPU {
				id := e.enqueue(scheduler.BenchRun{Model: "tiny", Engine: "cpu", Params: map[string]string{"batch": strconv.Itoa(b), "seq": "1024"}})
				ts := e.waitFor(id, time.Minute, "archived", state("archived"))
				if !strings.Contains(ts.LastErr, "this host has") {
					t.Errorf("batch %d archived with %q, want the host's memory named", b, ts.LastErr)
				}
			}
			break
		}
	}

	id = e.enqueue(scheduler.BenchRun{Model: "tiny", Engine: "cpu", Params: map[string]string{"batch": "1", "seq": "16"}})
	e.waitFor(id, time.Minute, "completed", state("completed"))
}

// A train:segment of a run whose batch no host could hold, put into Redis
// as `sched enqueue train` would refuse it, is archived with the sizing's
// one line before any engine allocates, naming what to change in a runs
// file, and the worker trains the next run.
func TestTrainSegmentOfImpossibleSizeIsArchived(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	huge := patternRun("huge", tokName, 1e-3, 2, 0, 2)
	huge.Batch = 100000000
	fits := patternRun("fits", tokName, 1e-3, 2, 0, 2)
	e.handlers.Training = &Training{Redis: e.rdb, Objects: objects, Runs: runs.Set{"huge": huge, "fits": fits}, Dir: t.TempDir(),
		Enqueue:  func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
		OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) { return &patternData{}, nil }}
	e.serve(map[string]int{scheduler.QueueGPU: 1})

	id := e.enqueue(scheduler.TrainSegment{Run: "huge"})
	ts := e.waitFor(id, time.Minute, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, "batch 100000000 x seq 16") || !strings.Contains(ts.LastErr, "this host has") || ts.Retried != 0 {
		t.Errorf("archived after %d retries with %q; want no retry and the sizing's line naming the host's memory", ts.Retried, ts.LastErr)
	}
	// A segment's sizes are its run's fields, which a runs file sets: the
	// worker and `sched enqueue train` have no --batch.
	if fix := "in a runs file (KILN_RUNS, here and on the GPU worker), give run huge a smaller batch and a larger accumulate (the same tokens a step), or a smaller seq"; !strings.Contains(ts.LastErr, fix) ||
		strings.Contains(ts.LastErr, "--batch") {
		t.Errorf("archived with %q; want it to say what to change in the runs file (%q), and no flag", ts.LastErr, fix)
	}
	id = e.enqueue(scheduler.TrainSegment{Run: "fits"})
	e.waitFor(id, time.Minute, "completed", state("completed"))
}
