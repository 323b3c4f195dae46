package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// The bench measures a shape on the GPUs a run of its step trains on, on
// this worker, then on one: the pilot's accumulate 16 on KILN_GPUS=3 on
// two (it was measured on three, a row that failed, and the run's gate,
// on two, found none), a run's own gpus where `sched enqueue bench RUN`
// carries them, and a step one GPU trains once.
func TestBenchMeasuresOnTheGPUsARunTrainsOn(t *testing.T) {
	all := trainer.GPUCount(model.AllGPUs)
	type counts = []trainer.GPUCount
	for _, c := range []struct {
		engine        string
		worker, named trainer.GPUCount
		accumulate    int
		want          counts
	}{
		{"auto", 3, 0, 16, counts{2, 1}},
		{"cuda", 3, 0, 16, counts{2, 1}},
		{"auto", 4, 0, 16, counts{4, 1}},
		{"auto", 3, 0, 18, counts{3, 1}},
		{"auto", 3, 0, 0, counts{3, 1}}, // the sweep's one micro-batch a GPU
		{"auto", 2, 0, 1, counts{1}},
		{"auto", 1, 0, 16, counts{1}},
		{"auto", 0, 0, 16, counts{0}},
		{"auto", all, 0, 16, counts{all, 1}}, // the engine counts them
		{"auto", 4, 2, 16, counts{2, 1}},
		{"auto", 4, all, 16, counts{all, 1}},
		{"auto", 0, 2, 16, counts{2, 1}},
		{"auto", 4, 1, 16, counts{1}},
		{"cpu", 3, 0, 16, counts{0}},
	} {
		w := &Training{GPUs: c.worker}
		got := w.benchGPUs(c.engine, c.named, c.accumulate)
		if !slices.Equal(got, c.want) {
			t.Errorf("engine %s, KILN_GPUS %s, run gpus %s, accumulate %d: measured on %v; want %v",
				c.engine, c.worker, c.named, c.accumulate, got, c.want)
		}
		// One rule for both: what the segment of such a run trains on.
		if run, _ := runGPUs(c.named, w.gpusFor(c.engine), max(c.accumulate, 1)); c.accumulate > 0 && got[0] != run {
			t.Errorf("engine %s, KILN_GPUS %s, run gpus %s, accumulate %d: the bench's %s, the run's %s",
				c.engine, c.worker, c.named, c.accumulate, got[0], run)
		}
	}
}

// hostBench measures one spec as the GPU worker's Bench does (sched
// worker): trainer.Bench on the spec's engine and GPUs, at one timed step.
func hostBench(ctx context.Context, b BenchSpec) (results.BenchRow, error) {
	s := b.Shape
	c, err := s.Config()
	if err != nil {
		return results.BenchRow{}, err
	}
	engine := b.Engine
	if engine == "" {
		engine = "auto"
	}
	r, err := trainer.Bench(ctx, trainer.BenchOptions{Model: c, Engine: engine, Precision: s.Precision, Batch: s.Batch, Seq: s.Seq,
		Accumulate: s.Accumulate, Steps: 1, GPUs: b.GPUs})
	if err != nil {
		return results.BenchRow{}, err
	}
	return results.Row(s.Model, c, s.Batch, s.Seq, r), nil
}

// benchLines reads every row bench:run appended, in order (ReadBench
// keeps the last of a shape).
func benchLines(t *testing.T, objects store.Store) []results.BenchRow {
	t.Helper()
	r, err := objects.Get(context.Background(), BenchKey)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	var rows []results.BenchRow
	for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
		var row results.BenchRow
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			t.Fatalf("row %q: %v", sc.Text(), err)
		}
		rows = append(rows, row)
	}
	return rows
}

// On a worker of KILN_GPUS=3, the pilot's step (accumulate 16) is
// measured on the two GPUs its run trains on and then on one, and a run's
// own gpus from the payload on those; the several's row failing (here,
// where no GPU starts: engine auto does not move several GPUs to the CPU)
// no longer costs the one-GPU row. A payload's gpus that are no count is
// archived, naming them.
func TestABenchOfAWorkerOfThreeGPUsHasTheRowsOfTheRunsGPUs(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e.handlers.Training = &Training{Redis: e.rdb, Objects: objects, Runs: runs.Presets(), Dir: t.TempDir(), Bench: hostBench, GPUs: 3,
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err }}
	e.serve(map[string]int{scheduler.QueueGPU: 1})

	step := map[string]string{"batch": "1", "seq": "16", "accumulate": "16", "warmup": "0"}
	for _, c := range []struct {
		gpus string
		want []int
	}{{"", []int{2, 1}}, {"4", []int{4, 1}}} {
		id := e.enqueue(scheduler.BenchRun{Model: "tiny", Params: step, GPUs: c.gpus})
		e.waitFor(id, time.Minute, "completed", state("completed"))
		rows := benchLines(t, objects)
		var got []int
		for _, r := range rows {
			got = append(got, r.Devices())
		}
		if !slices.Equal(got, c.want) {
			t.Fatalf("payload gpus %q on KILN_GPUS=3: rows of %v GPUs %+v; want %v", c.gpus, got, rows, c.want)
		}
		if one := rows[1]; one.Error != "" || one.TokPerSec <= 0 || one.Accumulate != 16 {
			t.Fatalf("payload gpus %q: the one-GPU row %+v; want it measured at accumulate 16", c.gpus, one)
		}
		if err := objects.Delete(context.Background(), BenchKey); err != nil {
			t.Fatal(err)
		}
	}

	id := e.enqueue(scheduler.BenchRun{Model: "tiny", Params: step, GPUs: "two"})
	if ts := e.waitFor(id, 30*time.Second, "archived", state("archived")); !strings.Contains(ts.LastErr, `gpus "two"`) {
		t.Fatalf("payload gpus two archived with %q", ts.LastErr)
	}
}
