package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// A run that names no gpus takes the worker's KILN_GPUS, as many of them as
// divide its accumulate, and says so when that is fewer; a run that names a
// number keeps it (the segment refuses it at its start, as enqueue does).
func TestRunGPUsTakesTheWorkersThatDivideAccumulate(t *testing.T) {
	all := trainer.GPUCount(model.AllGPUs)
	for _, c := range []struct {
		named, worker trainer.GPUCount
		accumulate    int
		want          trainer.GPUCount
		notice        bool
	}{
		{0, 3, 16, 2, true},
		{0, 4, 16, 4, false},
		{0, 3, 18, 3, false},
		{0, 0, 16, 0, false},
		{0, 1, 16, 1, false},
		{0, all, 16, all, false}, // the engine counts the GPUs
		{3, 4, 16, 3, false},
		{3, 0, 16, 3, false},
		{all, 2, 16, all, false},
	} {
		got, notice := runGPUs(c.named, (&Training{GPUs: c.worker}).gpusFor("auto"), c.accumulate)
		if got != c.want || (notice != "") != c.notice {
			t.Errorf("run gpus %s, KILN_GPUS %s, accumulate %d: %s, notice %q; want %s, a notice %v",
				c.named, c.worker, c.accumulate, got, notice, c.want, c.notice)
		}
	}
	// On the CPU engine the worker's GPUs are not the run's: it trains as
	// one, where it was refused for naming several GPUs on the CPU.
	for _, worker := range []trainer.GPUCount{2, 3, all} {
		if got, notice := runGPUs(0, (&Training{GPUs: worker}).gpusFor("cpu"), 16); got != 0 || notice != "" {
			t.Errorf("a cpu run naming no gpus on a worker of KILN_GPUS %s: %s, notice %q; want 0 and none", worker, got, notice)
		}
	}
	if got, _ := runGPUs(2, (&Training{GPUs: 4}).gpusFor("cpu"), 16); got != 2 {
		t.Errorf("a cpu run naming gpus 2: %s; want it kept, for the engine to refuse", got)
	}
	_, notice := runGPUs(0, (&Training{GPUs: 3}).gpusFor("cuda"), 16)
	for _, want := range []string{"KILN_GPUS is 3", "training on 2", "15 or 18"} {
		if !strings.Contains(notice, want) {
			t.Errorf("notice %q does not say %q", notice, want)
		}
	}
}

// segmentOnTwoGPUs trains one segment of a pattern run on engine, its
// accumulate 4 as pilot-cpu's (two GPUs divide it), on a worker that
// reserves two GPUs (KILN_GPUS=2), and returns the task once it completed
// or was archived.
func segmentOnTwoGPUs(t *testing.T, name, engine string) scheduler.TaskStatus {
	t.Helper()
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	run := patternRun(name, publishTestTokenizer(t, objects), 1e-3, 3, 3, 3)
	run.Accumulate, run.Engine = 4, engine
	e.handlers.Training = &Training{
		Redis: e.rdb, Objects: objects, Runs: runs.Set{run.Name: run}, Dir: t.TempDir(), Owner: "gpu-test", GPUs: 2,
		Enqueue:  func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
		OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) { return &patternData{}, nil },
		Log:      zap.NewNop(),
	}
	e.serve(map[string]int{scheduler.QueueGPU: 1})
	id := e.enqueue(scheduler.TrainSegment{Run: run.Name})
	ended := func(ts scheduler.TaskStatus) bool { return ts.State == "completed" || ts.State == "archived" }
	return e.waitFor(id, 2*time.Minute, "ended", ended)
}

// A run on the CPU engine that names no gpus trains on a worker that
// reserves several GPUs (KILN_GPUS=2) as on any other: the worker's GPUs
// are for the runs that use them. It was archived as "gpus 2 needs the
// cuda engine, not cpu".
func TestACPURunTrainsOnAWorkerOfSeveralGPUs(t *testing.T) {
	if ts := segmentOnTwoGPUs(t, "cpu-beside-gpus", "cpu"); ts.State != "completed" {
		t.Fatalf("the segment ended %s: %s", ts.State, ts.LastErr)
	}
}

// A run of engine auto that names no gpus, on a worker of several GPUs
// where none starts, is archived at once with the reason (what did not
// load), as operations.md says: the worker's GPUs are never replaced by
// the CPU.
func TestAnAutoRunOnAWorkerOfSeveralGPUsWithoutOneIsArchivedSayingWhy(t *testing.T) {
	ts := segmentOnTwoGPUs(t, "auto-beside-gpus", "auto")
	if ts.State == "completed" {
		t.Skip("two GPUs started here")
	}
	if ts.Retried != 0 || !strings.Contains(ts.LastErr, "run auto-beside-gpus: engine auto: ") {
		t.Fatalf("archived after %d retries with %q; want it archived at once naming the engine's reason", ts.Retried, ts.LastErr)
	}
}
