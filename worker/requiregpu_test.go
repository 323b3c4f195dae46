package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	_ "github.com/kiln-lm/kiln/kernels" // the CUDA engine, as `sched worker` has it
	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// A worker that requires a GPU (compose's GPU worker, KILN_REQUIRE_GPU)
// on a machine where the CUDA engine cannot start archives a run of engine
// auto at once, with the reason and the setting named, and trains nothing
// on the CPU; a bench is archived the same way. A run that names the CPU
// engine still trains there.
func TestWorkerThatRequiresAGPUArchivesAutoRunsWithoutOne(t *testing.T) {
	if cuda.Devices() > 0 {
		t.Skip("a GPU is present; this test covers machines without one")
	}
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	auto := patternRun("auto-run", tokName, 1e-3, 4, 2, 2)
	auto.Engine = "auto"
	cpu := patternRun("cpu-run", tokName, 1e-3, 4, 2, 2)
	dir := t.TempDir()
	e.handlers.Training = &Training{
		Redis: e.rdb, Objects: objects, Runs: runs.Set{auto.Name: auto, cpu.Name: cpu}, Dir: dir, Owner: "gpu-test",
		Enqueue:    func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
		OpenData:   func(trainer.RunConfig, model.Config) (trainer.Data, error) { return &patternData{}, nil },
		Bench:      cpuBench,
		Log:        zap.NewNop(),
		RequireGPU: true,
	}
	e.serve(map[string]int{scheduler.QueueGPU: 1})

	id := e.enqueue(scheduler.TrainSegment{Run: auto.Name})
	st := e.waitFor(id, time.Minute, "archived", state("archived"))
	for _, want := range []string{"run auto-run", "KILN_REQUIRE_GPU", "does not fall back to the CPU", "engine cuda: "} {
		if !strings.Contains(st.LastErr, want) {
			t.Errorf("archived with %q; it lacks %q", st.LastErr, want)
		}
	}
	t.Log(st.LastErr)
	if st.Retried != 0 {
		t.Errorf("retried %d times; a missing GPU needs a person, not a retry", st.Retried)
	}
	if keys, err := objects.List(context.Background(), "checkpoints/"+auto.Name+"/"); err != nil || len(keys) != 0 {
		t.Errorf("checkpoints of the refused run: %v %v", keys, err)
	}

	id = e.enqueue(scheduler.BenchRun{Model: "tiny", Params: map[string]string{"batch": "1", "seq": "16"}})
	st = e.waitFor(id, time.Minute, "archived", state("archived"))
	if !strings.Contains(st.LastErr, "KILN_REQUIRE_GPU") || st.Retried != 0 {
		t.Errorf("bench archived with %q after %d retries; want the setting named, no retry", st.LastErr, st.Retried)
	}

	id = e.enqueue(scheduler.TrainSegment{Run: cpu.Name})
	e.waitFor(id, time.Minute, "completed", state("completed"))
}
