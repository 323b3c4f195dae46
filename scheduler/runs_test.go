package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// Runs gives the newest finished tasks, newest first, though asynq lists
// them oldest first: with more finished than the limit, the oldest are
// the ones left out.
func TestRunsGivesTheNewestFinishedTasks(t *testing.T) {
	c, opt := newTestClient(t)
	ctx := context.Background()
	done := make(chan string, 8)
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 1, Queues: map[string]int{QueueIngest: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		done <- id
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	// asynq records a completion to the second: each task completes in a
	// second of its own.
	var ids []string
	for i := range 3 {
		info, err := c.Enqueue(ctx, IngestShard{Dataset: "d", Path: fmt.Sprintf("data/%d.parquet", i), Store: "s", Tokenizer: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if id := <-done; id != info.ID {
			t.Fatalf("task %s ran, %s was queued", id, info.ID)
		}
		ids = append(ids, info.ID)
		for {
			ts, err := c.Task(ctx, info.ID)
			if err != nil {
				t.Fatal(err)
			}
			if ts.State == "completed" {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		for now := time.Now().Unix(); time.Now().Unix() == now; {
			time.Sleep(10 * time.Millisecond)
		}
	}
	runs, err := c.Runs(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].ID != ids[2] || runs[1].ID != ids[1] {
		got := []string{}
		for _, r := range runs {
			got = append(got, r.ID+" "+r.Finished.Format(time.RFC3339))
		}
		t.Fatalf("Runs(2) = %v; want the last two completed, newest first: %s, %s (the first, %s, left out)", got, ids[2], ids[1], ids[0])
	}
}
