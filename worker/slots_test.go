package worker

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

const (
	kindStopsSlowly = "test:stops-slowly"
	kindQuickGPU    = "test:quick-gpu"
)

// stopsSlowlyArgs runs until cancelled, then takes as long to stop as the
// test says (until kiln-test:gate is set), as a segment writing its stop
// checkpoint does.
type stopsSlowlyArgs struct{}

func (stopsSlowlyArgs) Kind() string { return kindStopsSlowly }

type quickGPUArgs struct{}

func (quickGPUArgs) Kind() string { return kindQuickGPU }

func init() {
	gpu := testPolicy
	gpu.Queue = scheduler.QueueGPU
	scheduler.Define(kindStopsSlowly, gpu)
	scheduler.Define(kindQuickGPU, gpu)
}

// A cancelled gpu task keeps its queue's place until its handler has
// stopped: the next gpu task is handed out (asynq frees its place at the
// cancel) but starts only then, so two never run on the device at once.
func TestACancelledTaskKeepsItsPlaceUntilItStops(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	order := "kiln-test:order"
	record := func(what string) error { return e.rdb.RPush(context.Background(), order, what).Err() }
	e.handlers = Handlers{Extra: []Handler{
		HandlerFunc(func(ctx context.Context, _ stopsSlowlyArgs) error {
			if err := record("A start"); err != nil {
				return err
			}
			<-ctx.Done()
			for e.rdb.Exists(context.Background(), "kiln-test:gate").Val() == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			if err := record("A return"); err != nil {
				return err
			}
			return ctx.Err()
		}),
		HandlerFunc(func(ctx context.Context, _ quickGPUArgs) error { return record("B start") }),
	}}
	e.serve(map[string]int{scheduler.QueueGPU: 1})

	a := e.enqueue(stopsSlowlyArgs{})
	waitList := func(what string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !slices.Contains(e.rdb.LRange(ctx, order, 0, -1).Val(), what) {
			if time.Now().After(deadline) {
				t.Fatalf("%q never recorded: %v", what, e.rdb.LRange(ctx, order, 0, -1).Val())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitList("A start")
	b := e.enqueue(quickGPUArgs{})
	if st, err := e.c.Cancel(ctx, a); err != nil || st != "cancelled" {
		t.Fatalf("cancel: %s %v", st, err)
	}
	// asynq hands B out once A's place is free; B either waits for the
	// slot (active) or, were there none, has already run.
	e.waitFor(b, time.Minute, "handed out", func(ts scheduler.TaskStatus) bool { return ts.State == "active" || ts.State == "completed" })
	if err := e.rdb.Set(ctx, "kiln-test:gate", 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	e.waitFor(b, time.Minute, "completed", state("completed"))
	if got := e.rdb.LRange(ctx, order, 0, -1).Val(); fmt.Sprint(got) != "[A start A return B start]" {
		t.Errorf("order %v; want A to have stopped before B started", got)
	}
}
