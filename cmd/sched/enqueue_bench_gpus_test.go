package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// `sched enqueue bench RUN` carries the run's gpus to the worker, which
// measures on the GPUs the run trains on: a run of gpus 2 on a worker of
// four was measured on four and one, and its tok/s gate found no row. A
// run that names none leaves the choice to the worker (KILN_GPUS), and
// --engine cpu on a run of several GPUs is refused, nothing queued.
func TestEnqueueBenchOfARunCarriesItsGPUs(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	runsFile := filepath.Join(t.TempDir(), "runs.yaml")
	if err := os.WriteFile(runsFile, []byte("two:\n  from: pilot\n  gpus: 2\nevery:\n  from: pilot\n  gpus: all\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_RUNS=" + runsFile}
	opt, err := asynq.ParseRedisURI(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	in := asynq.NewInspector(opt)
	defer in.Close()

	for run, want := range map[string]string{"two": "2", "every": "all", "pilot": ""} {
		out, errOut, code := sched(t, env, "enqueue", "bench", run)
		m := regexp.MustCompile(`queued (bench:run:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("enqueue bench %s: exit %d, %q %q", run, code, out, errOut)
		}
		info, err := in.GetTaskInfo(scheduler.QueueGPU, m[1])
		if err != nil {
			t.Fatal(err)
		}
		a, err := scheduler.DecodeTask[scheduler.BenchRun](info.Payload)
		if err != nil {
			t.Fatalf("payload %q: %v", info.Payload, err)
		}
		if a.GPUs != want || a.Model != "small" || a.Params["accumulate"] != "16" {
			t.Errorf("bench of run %s queued %+v; want gpus %q beside its model small and accumulate 16", run, a, want)
		}
	}

	wantRefused(t, env, "--engine cpu: run two trains on gpus 2, which needs the cuda engine", "enqueue", "bench", "two", "--engine", "cpu")
	if pending, err := in.ListPendingTasks(scheduler.QueueGPU); err != nil || len(pending) != 3 {
		t.Errorf("%d tasks pending (%v); want the three benches and nothing for the refused one", len(pending), err)
	}
}
