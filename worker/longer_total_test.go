package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
)

// heldData is patternData that holds its first reader before the batch of
// step at+1 until released, once: the test acts while the segment trains.
type heldData struct {
	patternData
	at       int
	reached  chan struct{}
	released chan struct{}
	once     *sync.Once
}

func (d *heldData) Next(ctx context.Context, b, t int) (model.Batch, error) {
	if d.next == d.at*b {
		d.once.Do(func() {
			close(d.reached)
			<-d.released
		})
	}
	return d.patternData.Next(ctx, b, t)
}

// A run given a longer total in the runs file while its last segment
// trains towards the total it read at its start goes on past it: 'sched
// enqueue train' said the run was running and queued nothing, and the
// worker reads the entry again as the segment ends, where the run ended
// at the old total and the new one was dropped.
func TestARunGivenALongerTotalAsItsLastSegmentTrainsGoesOn(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tok := publishTestTokenizer(t, objects)
	file := filepath.Join(t.TempDir(), "runs.yaml")
	entry := func(total int) {
		t.Helper()
		y := fmt.Sprintf("grow:\n  model: tiny\n  seq: 16\n  batch: 2\n  accumulate: 1\n  lr: 1.0e-3\n  warmup: 1\n  total_steps: %d\n"+
			"  log_every: 1\n  eval_every: 2\n  eval_batches: 1\n  checkpoint_every: 2\n  seed: 3\n  engine: cpu\n  precision: fp32\n"+
			"  tokenizer: %s\n  mixture:\n    - {store: pattern, weight: 1}\n  retention:\n    keep_last: 1\n", total, tok)
		if err := os.WriteFile(file, []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	entry(4)
	t.Setenv("KILN_RUNS", file)
	reached, released, once := make(chan struct{}), make(chan struct{}), &sync.Once{}
	e.handlers.Training = &Training{
		Redis: e.rdb, Objects: objects, Dir: t.TempDir(), Owner: "gpu-test",
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
		OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) {
			return &heldData{at: 2, reached: reached, released: released, once: once}, nil
		},
		Log: zap.NewNop(),
	}
	e.serve(map[string]int{scheduler.QueueGPU: 1})
	first := e.enqueue(scheduler.TrainSegment{Run: "grow"})
	select {
	case <-reached:
	case <-time.After(2 * time.Minute):
		t.Fatal("the segment did not reach step 3")
	}
	entry(8)
	close(released)
	e.waitFor(first, time.Minute, "completed", state("completed"))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, _, err := scheduler.ReadRunState(context.Background(), e.rdb, "grow")
		if err == nil && st.Done && st.Step == 8 && st.Checkpoint == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run's state: %+v (%v); want it done at its longer total, step 8", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
