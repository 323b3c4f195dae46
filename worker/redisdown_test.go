package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/scheduler"
)

// While Redis is down, each queue's server logs an error at every poll.
// The worker's log says instead that Redis does not answer, reminds that
// it still does not, and says when it answers again; then the worker
// takes tasks as before. Twice, with a real redis-server stopped and
// started.
func TestTheLogSaysOnceThatRedisIsDownAndWhenItIsBack(t *testing.T) {
	e := newEnv(t)
	core, logs := observer.New(zapcore.DebugLevel)
	w, err := New(Params{Redis: e.opt, Queues: map[string]int{scheduler.QueueIngest: 2},
		Handlers: Handlers{Extra: testHandlers()}, Logger: zap.New(core), DelayedTaskCheckInterval: 100 * time.Millisecond,
		TaskCheckInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w.down.every, w.down.remind = 50*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			for _, l := range logs.All() {
				t.Logf("%s %s %v", l.Level, l.Message, l.ContextMap())
			}
		}
	})
	count := func(prefix string) int { return logs.FilterMessageSnippet(prefix).Len() }
	waitLog := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s in the worker's log within a minute", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitLog("start", func() bool { return count("worker started") == 1 })

	for outage := 1; outage <= 2; outage++ {
		e.redis.Stop()
		waitLog("warning that Redis does not answer", func() bool { return count("Redis does not answer") == outage })
		// The queue's servers go on polling: their errors are counted, and
		// the reminder says Redis is still down.
		waitLog("reminder", func() bool {
			w.down.mu.Lock()
			defer w.down.mu.Unlock()
			return w.down.hidden >= 5 && count("Redis still does not answer") >= outage
		})
		e.redis.Start()
		waitLog("line that Redis answers again", func() bool { return count("Redis answers again") == outage })
		back := logs.FilterMessageSnippet("Redis answers again").All()[outage-1].ContextMap()
		if n, _ := back["errors_left_out"].(int64); n < 5 {
			t.Errorf("outage %d: Redis answers again with %v errors left out, want the 5 or more counted", outage, back["errors_left_out"])
		}
		if back["redis"] != e.redis.Addr {
			t.Errorf("outage %d: the line names Redis %v, want %s", outage, back["redis"], e.redis.Addr)
		}
	}
	if n := count("Redis does not answer"); n != 2 {
		t.Errorf("%d warnings that Redis does not answer over two outages, want 2", n)
	}
	for _, l := range logs.All() {
		if l.Level >= zapcore.WarnLevel && !strings.HasPrefix(l.Message, "Redis ") && unreachable(l.Message) {
			t.Errorf("the task queue's error is in the log: %s %q", l.Level, l.Message)
		}
	}
	// The worker takes tasks again.
	id := e.enqueue(slowArgs{Name: "after", Steps: 1, StepMS: 1})
	e.waitFor(id, time.Minute, "completed", state("completed"))
}

func TestUnreachableKnowsRedisNotAnswering(t *testing.T) {
	for msg, want := range map[string]bool{
		"Dequeue error: UNKNOWN: redis eval error: dial tcp 127.0.0.1:6399: connect: connection refused":                                               true,
		"Failed to write server state data: UNKNOWN: redis command error: SADD failed: dial tcp 10.0.0.3:6379: i/o timeout":                            true,
		"Failed to forward scheduled tasks: INTERNAL_ERROR: redis eval error: LOADING Redis is loading the dataset in memory":                          true,
		"Failed to forward scheduled tasks: INTERNAL_ERROR: redis eval error: read tcp 127.0.0.1:5012->127.0.0.1:6379: read: connection reset by peer": true,
		"Dequeue error: UNKNOWN: redis eval error: dial tcp: lookup redis on 127.0.0.11:53: no such host":                                              true,
		"Could not find task id=abc type=ingest:shard in the active set":                                                                               false,
		"Failed to delete expired completed tasks from queue \"ingest\": INTERNAL_ERROR: NOSCRIPT No matching script":                                  false,
	} {
		if got := unreachable(msg); got != want {
			t.Errorf("unreachable(%q) = %v, want %v", msg, got, want)
		}
	}
}

// A connection error of the task queue logged while Redis answers (a
// command that failed just before Redis came back, logged after) is no
// outage: the log says nothing of one, and keeps the error at debug level.
func TestAnErrorWhileRedisAnswersIsNoOutage(t *testing.T) {
	e := newEnv(t)
	core, logs := observer.New(zapcore.DebugLevel)
	d := newRedisDown(zap.New(core), e.redis.Addr, func(ctx context.Context) error { return e.rdb.Ping(ctx).Err() })
	t.Cleanup(d.close)
	stale := "Dequeue error: UNKNOWN: redis eval error: dial tcp " + e.redis.Addr + ": connect: connection refused"
	if !d.hide(stale) {
		t.Fatal("a connection error of the queue was logged as it came")
	}
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	<-done
	if n := logs.FilterLevelExact(zapcore.WarnLevel).Len() + logs.FilterLevelExact(zapcore.InfoLevel).Len(); n != 0 {
		t.Errorf("%d lines at info or above for an error with Redis answering: %v", n, logs.All())
	}
	if dbg := logs.FilterMessageSnippet("with Redis answering").All(); len(dbg) != 1 || dbg[0].ContextMap()["error"] != stale {
		t.Errorf("debug lines %v, want the error once", dbg)
	}
	// The watch ended: a later error starts one again.
	if !d.hide("Failed to write server state data: UNKNOWN: redis command error: SADD failed: " + stale) {
		t.Error("the next connection error was logged as it came")
	}
}
