package worker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
)

// appendSlowArgs is slowArgs on the append queue.
type appendSlowArgs struct{ slowArgs }

func (appendSlowArgs) Kind() string { return kindAppendSlow }

const kindAppendSlow = "test:append-slow"

func init() {
	p := testPolicy
	p.Queue = scheduler.QueueAppend
	scheduler.Define(kindAppendSlow, p)
}

// A data directory's id is made once and read back by every worker of
// the directory, also by workers that make it at the same moment; a file
// that holds no id is refused, naming it and what to do.
func TestADataDirectoryKeepsOneDiskID(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	ids := make([]string, 8)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := DiskID(dir)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || len(id) != 32 {
			t.Fatalf("workers starting at once on a new directory read ids %q; want one id", ids)
		}
	}
	again, err := DiskID(dir)
	if err != nil || again != ids[0] {
		t.Fatalf("read again: %q, %v; want %q", again, err, ids[0])
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != DiskIDFile {
		t.Fatalf("the data directory holds %v; want %s alone (no temporary file left)", entries, DiskIDFile)
	}
	if other, err := DiskID(t.TempDir()); err != nil || other == ids[0] {
		t.Fatalf("another directory's id: %q, %v; want another id", other, err)
	}

	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, DiskIDFile), []byte("not an id\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := DiskID(bad); err == nil || !strings.Contains(err.Error(), filepath.Join(bad, DiskIDFile)) || !strings.Contains(err.Error(), "delete it") {
		t.Fatalf("a disk-id file that holds no id: %v; want an error naming it and what to do", err)
	}
}

func claim(t *testing.T, rdb redis.UniversalClient, dir string, ttl time.Duration, log *zap.Logger) (*AppendClaim, error) {
	t.Helper()
	c, err := ClaimAppend(context.Background(), AppendClaimParams{Redis: rdb, DataDir: dir, TTL: ttl, Logger: log})
	if err == nil {
		t.Cleanup(c.Close)
	}
	return c, err
}

// The workers of one data directory share the append claim; a worker of
// another is refused while it holds, with an error that names the holder
// and reads as bad input. A claim is not deleted when its worker stops:
// it lapses after its TTL, and then another directory may claim it.
func TestTheAppendClaimBelongsToOneDataDirectory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	first, second := t.TempDir(), t.TempDir()
	// Renewed every 2 s: a claim checked right after its workers stop
	// still holds on a machine that stalls for less than 4 s.
	a, err := claim(t, e.rdb, first, 6*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := claim(t, e.rdb, first, 6*time.Second, nil)
	if err != nil {
		t.Fatalf("a second worker of the same data directory: %v; want it to share the claim", err)
	}
	_, err = claim(t, e.rdb, second, 3*time.Second, nil)
	var ce *AppendClaimedError
	if !errors.As(err, &ce) || ce.Holder.Dir != first || ce.Holder.Disk != a.Disk() || ce.Holder.PID != os.Getpid() || ce.Holder.TTL != 6*time.Second || ce.Dir != second {
		t.Fatalf("a worker of another data directory: %v; want an *AppendClaimedError naming %s", err, first)
	}
	for _, want := range []string{"data directory " + first, "serve append from one machine", "--queues ingest=N", "wait for its claim to lapse (6s after it stopped)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q lacks %q", err, want)
		}
	}
	if b, ok := err.(interface{ BadInput() bool }); !ok || !b.BadInput() {
		t.Errorf("refusal %T does not read as bad input (exit 2)", err)
	}

	// Every worker of the first directory stops.
	a.Close()
	a2.Close()
	if disk, err := e.rdb.HGet(ctx, AppendClaimKey, "disk").Result(); err != nil || disk != a.Disk() {
		t.Fatalf("the claim right after its workers stopped: %q, %v; want it left to lapse, naming disk %s", disk, err, a.Disk())
	}
	waitTill(t, "the claim to lapse", func() bool { return e.rdb.Exists(ctx, AppendClaimKey).Val() == 0 })
	b, err := claim(t, e.rdb, second, 3*time.Second, nil)
	if err != nil {
		t.Fatalf("another data directory once the claim lapsed: %v", err)
	}
	if disk := e.rdb.HGet(ctx, AppendClaimKey, "disk").Val(); disk != b.Disk() {
		t.Fatalf("the claim names disk %s; want the new holder's, %s", disk, b.Disk())
	}
}

// waitTill polls cond until it holds; a minute is far more than any
// event here takes, even on a busy machine.
func waitTill(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

// A claim that Redis lost (a flush, a restart without its data) is made
// again at the next renewal; one that another disk's worker took meanwhile
// is lost, loudly, naming that worker.
func TestAClaimIsRenewedWhereRedisLostItAndLostWhereAnotherDiskTookIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	core, logs := observer.New(zap.InfoLevel)
	c, err := claim(t, e.rdb, t.TempDir(), 3*time.Second, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Del(ctx, AppendClaimKey).Err(); err != nil {
		t.Fatal(err)
	}
	waitTill(t, "the claim to be made again", func() bool { return e.rdb.HGet(ctx, AppendClaimKey, "disk").Val() == c.Disk() })
	if logs.FilterMessageSnippet("append claim was gone from Redis").Len() == 0 {
		t.Errorf("the claim made again was not logged: %v", logs.All())
	}
	// Said to the watch of the stores, whose statuses are this disk's to
	// mend again.
	select {
	case <-c.Remade():
	case <-time.After(time.Minute):
		t.Fatal("the claim made again was not said on Remade")
	}
	select {
	case <-c.Lost():
		t.Fatal("a claim that Redis lost, with no other disk's in its place, was taken for lost")
	default:
	}

	other := AppendHolder{Disk: strings.Repeat("0", 32), Host: "elsewhere", Dir: "/data", PID: 7, TTL: 30 * time.Second}
	if err := e.rdb.HSet(ctx, AppendClaimKey, "disk", other.Disk, "host", other.Host, "dir", other.Dir, "pid", other.PID, "ttl_ms", 30000).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Lost():
	case <-time.After(time.Minute):
		t.Fatal("a claim another disk took was not lost")
	}
	if got := c.LostTo(); got != other {
		t.Fatalf("lost to %+v; want %+v", got, other)
	}
	if u := c.Until(); !u.IsZero() {
		t.Fatalf("a lost claim holds until %v; want the zero time", u)
	}
	lost := logs.FilterMessageSnippet("append claim lost")
	if lost.Len() != 1 || lost.All()[0].Level != zap.ErrorLevel || !strings.Contains(lost.All()[0].Message, "Serve append from one machine") {
		t.Fatalf("the loss was not logged as an error saying what to do: %v", logs.All())
	}
	if disk := e.rdb.HGet(ctx, AppendClaimKey, "disk").Val(); disk != other.Disk {
		t.Fatalf("the lost claim's worker wrote over the other disk's claim: %s", disk)
	}
}

// A worker whose append claim is lost stops serving append: the append it
// runs stops at its safe point and is re-queued, not failed and not run
// again here, while its other queues go on.
func TestAWorkerStopsServingAppendWhenItsClaimIsLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	c, err := claim(t, e.rdb, t.TempDir(), 3*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.handlers.Extra = append(e.handlers.Extra, HandlerFunc(func(ctx context.Context, a appendSlowArgs) error { return slow(ctx, a.slowArgs) }))
	rctx, cancel := context.WithCancel(ctx)
	w, err := New(Params{Redis: e.opt, Queues: map[string]int{scheduler.QueueIngest: 1, scheduler.QueueAppend: 1}, Handlers: e.handlers,
		AppendClaim: c, DelayedTaskCheckInterval: 200 * time.Millisecond, ProgressEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })

	id := e.enqueue(appendSlowArgs{slowArgs{Name: "append", Steps: 100000, StepMS: 10}})
	e.waitFor(id, time.Minute, "running", func(ts scheduler.TaskStatus) bool {
		return ts.State == "active" && ts.HasProgress && ts.Progress.Fraction > 0
	})
	if err := e.rdb.HSet(ctx, AppendClaimKey, "disk", strings.Repeat("0", 32), "host", "elsewhere", "dir", "/data", "pid", 7).Err(); err != nil {
		t.Fatal(err)
	}
	// Re-queued: pending, or waiting in retry (no delay, no retry used)
	// for a worker that serves append to forward it, this one's append
	// server being shut down.
	requeued := func(ts scheduler.TaskStatus) bool {
		return ts.State == "pending" || ts.State == "retry" && ts.Retried == 0
	}
	ts := e.waitFor(id, time.Minute, "re-queued", requeued)
	if ts.Progress.State != "interrupted" || !strings.Contains(ts.Progress.Message, "the append claim was lost to the worker on host elsewhere") || ts.Retried != 0 {
		t.Fatalf("the append after the claim was lost: retried %d, progress %+v; want interrupted, naming the claim's loss, no retry used", ts.Retried, ts.Progress)
	}
	// The ingest queue still serves; by the time its task is done, the
	// append queue would have taken its task again had it not stopped.
	e.waitFor(e.enqueue(slowArgs{Name: "ingest", Steps: 1, StepMS: 1}), time.Minute, "completed", state("completed"))
	if ts, err := e.c.Task(ctx, id); err != nil || !requeued(ts) {
		t.Fatalf("the append after an ingest task ran: %+v, %v; want it still waiting", ts, err)
	}
	// Its heartbeat no longer lists append, which sched status's WORKERS
	// read as served still, while ingest is.
	deadline := time.Now().Add(time.Minute) // for a test that fails
	for {
		snap, err := e.c.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		appends, ingests := 0, 0
		for _, wp := range snap.Workers {
			appends += wp.Queues[scheduler.QueueAppend]
			ingests += wp.Queues[scheduler.QueueIngest]
		}
		if appends == 0 && ingests > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after its claim was lost, the worker's heartbeats list append=%d, ingest=%d; want append gone, ingest served", appends, ingests)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A claim's Until is ahead of now while Redis confirms its renewals, and
// never past the moment its hash lapses in Redis, after which another
// disk's worker may claim the queue: checked against the lapse itself
// once its worker stops renewing it.
func TestAClaimHoldsUntilNoLaterThanItsHashLapses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const ttl = 3 * time.Second
	start := time.Now()
	c, err := claim(t, e.rdb, t.TempDir(), ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := c.Until()
	// Counted from before the claim was sent: a TTL less its margin
	// after a moment no earlier than start.
	if first.Before(start.Add(ttl-untilMargin(ttl))) || first.After(start.Add(ttl)) {
		t.Fatalf("a claim made at %v holds until %v; want a TTL (%v) less its margin after it at least, and within the TTL", start, first, ttl)
	}
	waitTill(t, "a renewal to move the claim's Until on", func() bool { return c.Until().After(first) })
	c.Close()
	for {
		until := c.Until()
		if e.rdb.Exists(ctx, AppendClaimKey).Val() == 0 {
			if now := time.Now(); !until.Before(now) {
				t.Fatalf("the claim's hash lapsed by %v, and its Until says it holds until %v", now, until)
			}
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatal("waited a minute for the claim to lapse")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A claim whose Redis stops answering stops advancing its Until: once a
// TTL less its margin has passed since the last renewal Redis confirmed,
// Until is behind now, and the worker writes no status; once Redis is
// back, a renewal puts it ahead of now again.
func TestAClaimWhoseRedisStopsStopsAdvancing(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"stopped", "killed"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			r := testsvc.StartRedis(t)
			rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
			t.Cleanup(func() { rdb.Close() })
			const ttl = 3 * time.Second
			start := time.Now()
			c, err := claim(t, rdb, t.TempDir(), ttl, nil)
			if err != nil {
				t.Fatal(err)
			}
			if u := c.Until(); u.Before(start.Add(ttl - untilMargin(ttl))) {
				t.Fatalf("a claim made at %v holds until %v; want a TTL (%v) less its margin after it at least", start, u, ttl)
			}
			if how == "stopped" {
				r.Stop()
			} else {
				r.Kill()
			}
			gone := time.Now()
			waitTill(t, "the claim's Until to pass with its Redis "+how, func() bool { return c.Until().Before(time.Now()) })
			// The last renewal confirmed was sent before Redis went.
			if u := c.Until(); u.After(gone.Add(ttl - untilMargin(ttl))) {
				t.Fatalf("the claim holds until %v; want no later than a TTL less its margin after Redis went at %v", u, gone)
			}
			r.Start()
			waitTill(t, "a renewal to put the claim's Until ahead of now again", func() bool { return c.Until().After(time.Now()) })
		})
	}
}

// A worker given its append claim appends under it: an append that runs
// once the claim may have lapsed (its Redis gone) publishes no status and
// fails with the error that says why, and runs once the claim is
// renewed. The caller's Pipeline is left as it was.
func TestAWorkerAppendsUnderItsClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	// The claim's Redis is another than the queue's, so that it alone
	// can go.
	r := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	c, err := claim(t, rdb, t.TempDir(), 3*time.Second, nil)
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
	if in.Pipeline.Lease != nil {
		t.Fatal("New set the caller's Pipeline.Lease")
	}
	task, err := scheduler.NewTask(ingest.AppendJob{Store: "code", ShardID: "owner/corpus/data/bad.parquet", Source: "data/bad.parquet",
		SkipReason: ingest.SkipCorruptFile, SkipMessage: "not parquet", Tokenizer: tokens.Tokenizer{Name: "t", SHA256: strings.Repeat("ab", 32), VocabSize: 300}})
	if err != nil {
		t.Fatal(err)
	}
	appendTask := w.set[ingest.KindAppend]

	r.Kill()
	waitTill(t, "the claim's Until to pass", func() bool { return c.Until().Before(time.Now()) })
	err = appendTask.ProcessTask(ctx, task)
	var lapsed *ingest.LeaseError
	if !errors.As(err, &lapsed) || !strings.Contains(err.Error(), "may have lapsed because Redis does not answer") {
		t.Fatalf("an append once the claim may have lapsed: %v; want an ingest.LeaseError saying why", err)
	}
	if isPermanent(err) {
		t.Fatalf("the append's refusal %v reads as permanent; want it retried", err)
	}
	if _, err := objects.Get(ctx, ingest.StatusKey("code")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an append once the claim may have lapsed published a status: %v", err)
	}

	r.Start()
	waitTill(t, "the claim to be renewed", func() bool { return c.Until().After(time.Now()) })
	if err := appendTask.ProcessTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	st, err := (&ingest.Pipeline{Objects: objects}).Status(ctx, "code")
	if err != nil || len(st.Done) != 1 {
		t.Fatalf("the status after the append ran under the renewed claim: %+v, %v; want it to list the file", st, err)
	}
}
