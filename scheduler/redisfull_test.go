package scheduler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/redismem"
)

// A Redis at its maxmemory refuses writes (noeviction, as compose runs
// it). What kiln writes through this package says so, in place of the
// task queue's "UNKNOWN: redis command error: SADD failed": an enqueue,
// a cancel mark, a progress record, a run's fenced write; a run lock whose renewals it
// refused for the whole lease is lost saying that, not that Redis was
// unreachable; a snapshot says Redis is full. With room
// again, the same enqueue is queued.
func TestWritesAFullRedisRefusesSaySo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, _ := newTestClient(t)
	rdb := c.Redis()
	log, logs := observed()
	lock, err := AcquireRun(ctx, rdb, "pilot", "gpu-a", 600*time.Millisecond, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Release(context.Background()) })
	queued, err := c.Enqueue(ctx, IngestPlan{Dataset: "queued", Store: "before"})
	if err != nil {
		t.Fatal(err)
	}
	if snap, err := c.Snapshot(ctx); err != nil || snap.RedisFull() || snap.Memory.Used <= 0 {
		t.Fatalf("a snapshot of a Redis with room: full %v, memory %+v, %v; want its memory read, not full", snap.RedisFull(), snap.Memory, err)
	}

	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	full := func(what string, err error, op string) {
		t.Helper()
		var fe *redismem.FullError
		if !errors.As(err, &fe) || !strings.HasPrefix(err.Error(), op+": Redis refused the write because it is full") ||
			!strings.Contains(err.Error(), "CONFIG SET maxmemory") || strings.Contains(err.Error(), "UNKNOWN") {
			t.Errorf("%s with Redis full: %v; want a *redismem.FullError beginning %q", what, err, op)
		}
	}
	_, err = c.Enqueue(ctx, IngestPlan{Dataset: "d", Store: "code"})
	full("an enqueue", err, "enqueue ingest:plan")
	_, err = c.Cancel(ctx, queued.ID)
	full("a cancel", err, "cancel "+queued.ID)
	full("a fenced write", lock.Fenced(ctx, map[string]string{"step": "1"}), "fenced write for run pilot")
	full("a progress record", WriteProgress(ctx, rdb, Progress{TaskID: "t1"}, time.Minute), "write progress of t1")
	_, err = AcquireRun(ctx, rdb, "other", "gpu-a", 600*time.Millisecond, log)
	full("a run lock taken", err, "lock run other")
	snap, err := c.Snapshot(ctx)
	if err != nil || !snap.RedisFull() || snap.Memory.Max != 1 {
		t.Fatalf("a snapshot of a full Redis: full %v, memory %+v, %v; want it full", snap.RedisFull(), snap.Memory, err)
	}

	// A renewal only extends the lease, which a full Redis allows (PEXPIRE
	// takes no memory); one that finds the lease gone takes it again, a
	// write it refuses. The lease lapses, as it would while the worker
	// paused, by its deletion, which it allows too.
	if err := rdb.Del(ctx, RunLockKey("pilot")).Err(); err != nil {
		t.Fatal(err)
	}
	lost := waitForLog(t, logs, "run lock lost")
	why, _ := lost.ContextMap()["why"].(string)
	if !strings.HasPrefix(why, "Redis refused the lease's renewals for the whole lease because it is full") || strings.Contains(why, "unreachable") {
		t.Errorf("the run lock was lost because %q; want Redis full said", why)
	}

	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, IngestPlan{Dataset: "d", Store: "code"}); err != nil {
		t.Fatalf("the enqueue once Redis has room: %v", err)
	}
}
