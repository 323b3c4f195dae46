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
