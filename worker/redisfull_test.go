package worker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/redismem"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
)

// setMaxmemory sets a real redis-server's maxmemory: "1" makes it full
// (it uses more, and refuses every write under the noeviction policy
// testsvc starts it with, as compose does), "0" gives it room again.
func setMaxmemory(t *testing.T, rdb redis.UniversalClient, v string) {
	t.Helper()
	if err := rdb.ConfigSet(context.Background(), "maxmemory", v).Err(); err != nil {
		t.Fatal(err)
	}
}

// While Redis is full it answers and refuses writes, and each queue's
// server logs the refusal at every poll. The worker's log says instead,
// once, that Redis refuses writes because it is full and how to give it
// room, not that it does not answer; then that it takes writes again;
// then the worker takes tasks as before.
func TestTheLogSaysOnceThatRedisIsFullAndWhenItHasRoom(t *testing.T) {
	e := newEnv(t)
	core, logs := observer.New(zapcore.DebugLevel)
	w, err := New(Params{Redis: e.opt, Queues: map[string]int{scheduler.QueueIngest: 2},
		Handlers: Handlers{Extra: testHandlers()}, Logger: zap.New(core), DelayedTaskCheckInterval: 100 * time.Millisecond,
		TaskCheckInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w.down.every = 50 * time.Millisecond
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
	count := func(snippet string) int { return logs.FilterMessageSnippet(snippet).Len() }
	waitTill(t, "the worker's start", func() bool { return count("worker started") == 1 })

	setMaxmemory(t, e.rdb, "1")
	waitTill(t, "the warning that Redis is full", func() bool { return count("Redis refuses writes because it is full") == 1 })
	warn := logs.FilterMessageSnippet("Redis refuses writes because it is full").All()[0]
	for _, want := range []string{"it answers, and loses nothing", "redis-cli CONFIG SET maxmemory <size>", "KILN_REDIS_MAXMEMORY=<size> in .env"} {
		if !strings.Contains(warn.Message, want) {
			t.Errorf("the warning %q does not say %q", warn.Message, want)
		}
	}
	if warn.Level != zapcore.WarnLevel || warn.ContextMap()["redis"] != e.redis.Addr {
		t.Errorf("the warning is %s naming Redis %v; want a warning naming %s", warn.Level, warn.ContextMap()["redis"], e.redis.Addr)
	}
	// The queue's servers go on polling (a refused poll is logged every
	// few seconds), and are refused: left out.
	waitTill(t, "the queue's refusals to be counted", func() bool {
		w.down.mu.Lock()
		defer w.down.mu.Unlock()
		return w.down.hidden >= 2
	})

	setMaxmemory(t, e.rdb, "0")
	waitTill(t, "the line that Redis takes writes again", func() bool { return count("Redis takes writes again: it has room") == 1 })
	back := logs.FilterMessageSnippet("Redis takes writes again: it has room").All()[0].ContextMap()
	if n, _ := back["errors_left_out"].(int64); n < 2 {
		t.Errorf("Redis takes writes again with %v errors left out, want the 2 or more counted", back["errors_left_out"])
	}
	if n := count("Redis refuses writes because it is full"); n != 1 {
		t.Errorf("%d warnings that Redis is full over one episode, want 1", n)
	}
	for _, l := range logs.All() {
		if strings.Contains(l.Message, "does not answer") {
			t.Errorf("the log says Redis does not answer of a Redis that is full: %s %q", l.Level, l.Message)
		}
		if l.Level >= zapcore.WarnLevel && redismem.RefusedIn(l.Message) {
			t.Errorf("the task queue's refusal is in the log: %s %q", l.Level, l.Message)
		}
	}
	// The worker takes tasks again.
	id := e.enqueue(slowArgs{Name: "after", Steps: 1, StepMS: 1})
	e.waitFor(id, time.Minute, "completed", state("completed"))
}

// A claim whose renewals a full Redis refuses says so, not that Redis
// does not answer; an append once the claim may have lapsed is refused
// saying that Redis refuses the renewals because it is full, and is
// retried (not permanent); once Redis has room the claim is renewed.
func TestAnAppendWhoseClaimAFullRedisRefusesSaysRedisIsFull(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	// The claim's Redis is another than the queue's, so that it alone
	// fills.
	r := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	core, logs := observer.New(zapcore.InfoLevel)
	c, err := claim(t, rdb, t.TempDir(), 600*time.Millisecond, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	in := &Ingest{Pipeline: ingest.Pipeline{Objects: objects, StoresDir: t.TempDir()},
		Enqueue: func(context.Context, scheduler.Args) error { return nil }}
	w, err := New(Params{Redis: e.opt, Queues: map[string]int{scheduler.QueueAppend: 1}, Handlers: Handlers{Ingest: in}, AppendClaim: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.rdb.Close() })
	task, err := scheduler.NewTask(ingest.AppendJob{Store: "code", ShardID: "owner/corpus/data/bad.parquet", Source: "data/bad.parquet",
		SkipReason: ingest.SkipCorruptFile, SkipMessage: "not parquet", Tokenizer: tokens.Tokenizer{Name: "t", SHA256: strings.Repeat("ab", 32), VocabSize: 300}})
	if err != nil {
		t.Fatal(err)
	}
	appendTask := w.set[ingest.KindAppend]

	setMaxmemory(t, rdb, "1")
	waitTill(t, "the claim's Until to pass", func() bool { return c.Until().Before(time.Now()) })
	// The last renewal before Until passed may have been sent before
	// Redis filled: the next one is refused.
	waitTill(t, "a renewal refused", func() bool { return redismem.Refused(c.RenewalError()) })
	err = appendTask.ProcessTask(ctx, task)
	var lapsed *ingest.LeaseError
	if !errors.As(err, &lapsed) || !strings.Contains(err.Error(), "may have lapsed because Redis refuses its renewals, being full (its maxmemory reached)") {
		t.Fatalf("an append once a full Redis refused the claim's renewals: %v; want an ingest.LeaseError saying Redis is full", err)
	}
	if strings.Contains(err.Error(), "does not answer") {
		t.Errorf("the append's refusal %q says Redis does not answer", err)
	}
	if isPermanent(err) {
		t.Fatalf("the append's refusal %v reads as permanent; want it retried", err)
	}
	warned := logs.FilterMessageSnippet("append claim not renewed").All()
	if len(warned) != 1 || !strings.Contains(warned[0].Message, "Redis refuses writes because it is full") || strings.Contains(warned[0].Message, "does not answer") {
		t.Errorf("the claim's warnings %v; want one saying Redis refuses writes because it is full", warned)
	}

	setMaxmemory(t, rdb, "0")
	waitTill(t, "the claim to be renewed", func() bool { return c.Until().After(time.Now()) })
	if err := c.RenewalError(); err != nil {
		t.Errorf("the renewal error once Redis has room: %v; want none", err)
	}
	if err := appendTask.ProcessTask(ctx, task); err != nil {
		t.Fatal(err)
	}
}
