package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// While a real worker takes tasks from pending to active, some failing once
// into retry and back, LiveIngest never misses one that was live the whole
// time it read the lists, and never counts one twice. Read in another
// order (active before pending) the count missed a task that started while
// it read, and a run could have taken a store for full while a shard of it
// was still to run.
func TestLiveIngestMissesNoTaskOnTheMove(t *testing.T) {
	c, opt := newTestClient(t)
	ctx := context.Background()

	const total = 150
	done, failed := shardsOnTheMove(t, c, opt, total)

	scans := 0
	for done.Load() < total {
		n, err := c.LiveIngest(ctx, "s")
		after := done.Load()
		if err != nil {
			t.Fatal(err)
		}
		// Every task whose handler had not succeeded when the read ended
		// was live throughout it.
		if left := total - after; int64(n) < left {
			t.Fatalf("scan %d: LiveIngest counted %d, but %d tasks were still to succeed when it returned", scans, n, left)
		}
		if n > total {
			t.Fatalf("scan %d: LiveIngest counted %d of %d tasks", scans, n, total)
		}
		scans++
	}
	t.Logf("%d scans while %d tasks ran, %d failing once", scans, total, failed())
}

// A worker's client that queued on a queue before Redis lost its data (a
// restart without its append-only file) queues there after it too, and
// asynq does not name that queue again: the tasks are still found by a
// fresh client (sched status, cancel, retry, the waits for an ingest).
func TestTasksQueuedAfterRedisLostItsDataAreFound(t *testing.T) {
	worker, opt := newTestClient(t)
	ctx := context.Background()
	if _, err := worker.Enqueue(ctx, IngestAppend{Store: "s1", ShardID: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := worker.Redis().FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := worker.Enqueue(ctx, IngestAppend{Store: "s2", ShardID: "b"}); err != nil {
		t.Fatal(err)
	}
	cli := NewClient(opt)
	defer cli.Close()
	if n, err := cli.LiveIngest(ctx, "s2"); err != nil || n != 1 {
		t.Errorf("the ingest of s2, its append queued after the data loss: %d live tasks, %v; want 1", n, err)
	}
	id, _ := TaskID(IngestAppend{Store: "s2", ShardID: "b"})
	if ts, err := cli.Find(ctx, id); err != nil || ts.Queue != QueueAppend {
		t.Errorf("Find(%s) after the data loss: %+v, %v", id, ts, err)
	}
}

// While a real worker takes tasks from pending to active and to completed,
// some failing once into retry and back, a snapshot lists every task once,
// whatever moved while it read the lists. Read in another order (active
// before pending) it missed a shard that started in between, and the
// file's line read done, as one whose shard had found it in the store,
// before its append had run.
func TestSnapshotMissesNoTaskOnTheMove(t *testing.T) {
	c, opt := newTestClient(t)
	ctx := context.Background()

	const total = 150
	done, failed := shardsOnTheMove(t, c, opt, total)

	snaps := 0
	for done.Load() < total {
		s, err := c.SnapshotOf(ctx, QueueIngest)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for _, ts := range s.Tasks {
			seen[ts.ID]++
		}
		if len(seen) != total || len(s.Tasks) != total {
			t.Fatalf("snapshot %d lists %d tasks, %d of them once or more; want each of %d once", snaps, len(s.Tasks), len(seen), total)
		}
		snaps++
	}
	t.Logf("%d snapshots while %d tasks ran, %d failing once", snaps, total, failed())
}

// shardsOnTheMove queues total ingest shards and starts a real worker that
// takes them from pending to active and to completed, a third of them
// failing once into retry and back: it returns how many have succeeded,
// and how many failed once.
func shardsOnTheMove(t *testing.T, c *Client, opt asynq.RedisConnOpt, total int) (done *atomic.Int64, failedOnce func() int) {
	t.Helper()
	for i := range total {
		if _, err := c.Enqueue(context.Background(), IngestShard{Dataset: "d", Path: fmt.Sprintf("data/%03d.parquet", i), Store: "s", Tokenizer: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	done = new(atomic.Int64)
	var mu sync.Mutex
	failed := map[string]bool{}
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 1, Queues: map[string]int{QueueIngest: 1}, LogLevel: asynq.FatalLevel,
		// The shortest back-off any kind has (5 s less its jitter): a failed
		// task waits in retry before it is pending again.
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 4 * time.Second },
		TaskCheckInterval:        time.Millisecond,
		DelayedTaskCheckInterval: 10 * time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		first := !failed[id] && len(failed) < total/3 && id[len(id)-1]%2 == 0
		if first {
			failed[id] = true
		}
		mu.Unlock()
		if first {
			return errors.New("fails once")
		}
		done.Add(1)
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return done, func() int { mu.Lock(); defer mu.Unlock(); return len(failed) }
}

// A task queued by one that ends while the lists are read (a plan's
// shard, a segment's next) is found by a snapshot and by a scan of live
// work: born pending after pending was read, with the task that queued it
// gone from active by the time active was read, it was found at no read,
// and status read the plan's store as holding every file, the run as
// stopped, and a run waiting for its stores could have started.
func TestATaskQueuedByOneThatEndsWhileTheListsAreReadIsFound(t *testing.T) {
	for _, scan := range []string{"snapshot", "live"} {
		t.Run(scan, func(t *testing.T) {
			c, opt := newTestClient(t)
			ctx := context.Background()
			started, release, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
			t.Cleanup(func() { close(stop) })
			srv := asynq.NewServer(opt, asynq.Config{Concurrency: 1, Queues: map[string]int{QueueIngest: 1}, LogLevel: asynq.FatalLevel})
			if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
				a, err := Decode[IngestShard](task.Payload())
				if err != nil || a.Path != "parent" {
					<-stop
					return nil
				}
				close(started)
				<-release
				_, err = c.Enqueue(ctx, IngestShard{Dataset: "d", Path: "child", Store: "s", Tokenizer: "t"})
				return err
			})); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Shutdown)
			parent, err := c.Enqueue(ctx, IngestShard{Dataset: "d", Path: "parent", Store: "s", Tokenizer: "t"})
			if err != nil {
				t.Fatal(err)
			}
			<-started
			// No worker takes the child while the lists are read: it
			// stays pending.
			if err := c.insp.PauseQueue(QueueIngest); err != nil {
				t.Fatal(err)
			}
			once := false
			c.listed = func(q, state string) {
				if state != "pending" || once {
					return
				}
				once = true
				close(release)
				for {
					ti, err := c.insp.GetTaskInfo(QueueIngest, parent.ID)
					if err == nil && ti.State == asynq.TaskStateCompleted {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			switch scan {
			case "snapshot":
				s, err := c.SnapshotOf(ctx, QueueIngest)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, ts := range s.Tasks {
					got = append(got, ts.ID+" "+ts.State)
				}
				if len(s.Tasks) != 2 {
					t.Fatalf("the snapshot lists %v; want the parent completed and the child it queued", got)
				}
			case "live":
				n, err := c.LiveIngest(ctx, "s")
				if err != nil {
					t.Fatal(err)
				}
				if n != 1 {
					t.Fatalf("live ingest counts %d tasks; want the child the parent queued as it ended", n)
				}
			}
		})
	}
}
