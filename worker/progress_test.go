package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// A task that starts part way (a training segment resumes its run at 50%)
// gets its ETA from the rate it measures, not from its elapsed time scaled
// by the run's fraction: 10% in 10s leaves 40% for 40s, whatever the
// minutes of setup before the first report.
func TestReporterETAFromMeasuredRate(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testsvc.Redis(t)})
	defer rdb.Close()
	ctx := context.Background()
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clock := start
	r := &Reporter{rdb: rdb, log: zap.NewNop(), ttl: time.Hour, now: func() time.Time { return clock },
		p: scheduler.Progress{TaskID: "t-eta", Kind: scheduler.KindTrainSegment, Fraction: -1, State: "running", Started: start}}

	read := func() scheduler.Progress {
		t.Helper()
		p, ok, err := scheduler.ReadProgress(ctx, rdb, "t-eta")
		if err != nil || !ok {
			t.Fatalf("progress: ok %v, %v", ok, err)
		}
		return p
	}
	clock = start.Add(5 * time.Minute) // setup: pulling the checkpoint
	r.Report(ctx, 0.5, 1000, "tok", "step 500/1000")
	if p := read(); p.ETA != 0 || p.Fraction != 0.5 {
		t.Fatalf("after one report: ETA %v fraction %v; want no ETA until a rate is measured", p.ETA, p.Fraction)
	}
	clock = clock.Add(10 * time.Second)
	r.Report(ctx, 0.6, 1000, "tok", "step 600/1000")
	if p := read(); p.ETA != 40*time.Second || !p.Updated.Equal(clock) {
		t.Fatalf("ETA %v (updated %v); want 40s: 0.4 left at 0.1 per 10s", p.ETA, p.Updated)
	}
	// No progress since the last report: the measured rate falls and the
	// ETA grows; it never turns negative or stays stale.
	clock = clock.Add(10 * time.Second)
	r.Message(ctx, "writing a checkpoint")
	if p := read(); p.ETA != 80*time.Second || p.Message != "writing a checkpoint" {
		t.Fatalf("ETA %v message %q; want 80s: 0.4 left at 0.1 per 20s", p.ETA, p.Message)
	}
	r.finish("done", "")
	if p := read(); p.ETA != 0 || p.Fraction != 1 || p.State != "done" {
		t.Fatalf("finished: %+v", p)
	}
}

// While Redis is down each throttled write of a task's progress fails;
// the log says so once, and once that a write succeeded again, with how
// many were lost. A real redis-server, stopped and started.
func TestLostProgressIsLoggedOnce(t *testing.T) {
	rs := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1})
	defer rdb.Close()
	core, logs := observer.New(zapcore.InfoLevel)
	ctx := context.Background()
	r := &Reporter{rdb: rdb, log: zap.New(core), ttl: time.Hour,
		p: scheduler.Progress{TaskID: "t-lost", Kind: scheduler.KindIngestShard, Fraction: -1, State: "running", Started: time.Now()}}
	r.Report(ctx, 0.1, 0, "", "downloading")
	rs.Stop()
	for i := 2; i <= 6; i++ {
		r.Report(ctx, float64(i)/10, 0, "", "downloading")
	}
	rs.Start()
	r.Report(ctx, 0.7, 0, "", "downloading")
	if n := logs.FilterMessageSnippet("progress not written").Len(); n != 1 {
		t.Errorf("%d lines that progress was not written over five lost writes, want 1: %v", n, logs.All())
	}
	again := logs.FilterMessageSnippet("progress written again").All()
	if len(again) != 1 || again[0].ContextMap()["writes_lost"] != int64(5) {
		t.Errorf("lines that progress is written again: %v; want one, with 5 writes lost", again)
	}
	if p, ok, err := scheduler.ReadProgress(ctx, rdb, "t-lost"); err != nil || !ok || p.Fraction != 0.7 {
		t.Errorf("progress after Redis came back: %+v, %v, %v; want 0.7", p, ok, err)
	}
}

// A report the throttle holds back is written once the interval has
// passed: the message a task gives as it starts a long wait (a hub's
// retry, a second after it began a download) is what status shows during
// the wait. Once the task's final state is written, nothing held
// overwrites it.
func TestAHeldReportIsWrittenOnceItsIntervalPasses(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: testsvc.Redis(t)})
	defer rdb.Close()
	ctx := context.Background()
	r := &Reporter{rdb: rdb, log: zap.NewNop(), ttl: time.Hour, every: 50 * time.Millisecond,
		p: scheduler.Progress{TaskID: "t-held", Kind: scheduler.KindIngestShard, Fraction: -1, State: "running"}}
	r.Report(ctx, 0.1, 0, "", "downloading a.parquet")
	r.Message(ctx, "downloading a.parquet: 503; trying again in 5m0s (attempt 2 of 9)")
	// A bound for a test that fails, not a margin: the write is due 50ms on.
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		p, ok, err := scheduler.ReadProgress(ctx, rdb, "t-held")
		if err != nil || !ok {
			t.Fatalf("progress: ok %v, %v", ok, err)
		}
		if strings.HasSuffix(p.Message, "(attempt 2 of 9)") {
			break
		}
		if wait.Err() != nil {
			t.Fatalf("the held report was not written: status shows %q", p.Message)
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.Message(ctx, "downloading b.parquet")
	r.finish("failed", "the hub refused")
	r.mu.Lock()
	held := r.held
	r.mu.Unlock()
	if held != nil {
		t.Fatal("a held write outlived the task's final state")
	}
	r.Message(ctx, "after the end")
	r.mu.Lock()
	held = r.held
	r.mu.Unlock()
	if held != nil {
		t.Fatal("a report after the task's final state was held for writing")
	}
	if p, _, _ := scheduler.ReadProgress(ctx, rdb, "t-held"); p.State != "failed" || p.Message != "the hub refused" {
		t.Errorf("final state %q %q; want failed, the hub refused", p.State, p.Message)
	}
}
