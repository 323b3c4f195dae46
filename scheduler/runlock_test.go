package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

func newRunRedis(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testsvc.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestLockIsExclusiveAndTokensGrow(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	a, err := AcquireRun(ctx, rdb, "pilot", "gpu-a", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = AcquireRun(ctx, rdb, "pilot", "gpu-b", time.Second, nil)
	if !errors.Is(err, ErrRunLocked) || !strings.Contains(err.Error(), "gpu-a") {
		t.Fatalf("second worker: want ErrRunLocked naming gpu-a, got %v", err)
	}
	// Another run is independent.
	o, err := AcquireRun(ctx, rdb, "long", "gpu-b", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Release(ctx)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := AcquireRun(ctx, rdb, "pilot", "gpu-b", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Token() <= a.Token() {
		t.Fatalf("tokens must grow: %d then %d", a.Token(), b.Token())
	}
}

func TestStaleHolderIsFencedOut(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	a, err := AcquireRun(ctx, rdb, "pilot", "gpu-a", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Fenced(ctx, map[string]string{"checkpoint": "1000"}); err != nil {
		t.Fatal(err)
	}
	// gpu-a freezes: its renewals stop and its lease runs out (deleting the
	// key is what expiry does, without waiting for it).
	a.stop()
	<-a.done
	rdb.Del(ctx, RunLockKey("pilot"))

	b, err := AcquireRun(ctx, rdb, "pilot", "gpu-b", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if err := b.Fenced(ctx, map[string]string{"checkpoint": "2000"}); err != nil {
		t.Fatal(err)
	}
	// gpu-a wakes up and tries to record an older checkpoint.
	err = a.Fenced(ctx, map[string]string{"checkpoint": "1500"})
	if !errors.Is(err, ErrRunLockLost) {
		t.Fatalf("stale holder: want ErrRunLockLost, got %v", err)
	}
	select {
	case <-a.Lost():
	default:
		t.Fatal("Lost not closed after a refused write")
	}
	if got := rdb.HGet(ctx, RunStateKey("pilot"), "checkpoint").Val(); got != "2000" {
		t.Fatalf("state checkpoint = %s, want the new holder's 2000", got)
	}
	// Releasing the stale lock must not delete the new holder's.
	a.Release(ctx)
	if err := b.Check(ctx); err != nil {
		t.Fatalf("new holder lost its lock to a stale release: %v", err)
	}
}

func TestLeaseIsRenewedWhileHeld(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	// The test waits for renewals, seen as the key's remaining time going
	// up, rather than for a time: a 90 ms and then a 1 s lease, slept past
	// for a few lengths, once lapsed on a machine busy with every other
	// package's tests. A 6 s lease renews every 2 s, so only a stall of
	// 4 s would let it lapse between two renewals.
	l, err := AcquireRun(ctx, rdb, "demo", "w", 6*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	renewals, last := 0, rdb.PTTL(ctx, RunLockKey("demo")).Val()
	for deadline := time.Now().Add(time.Minute); renewals < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals of a 6 s lease in a minute", renewals)
		}
		left := rdb.PTTL(ctx, RunLockKey("demo")).Val()
		if left <= 0 {
			t.Fatalf("the lease's key has no time left (%v): not renewed", left)
		}
		if left > last+500*time.Millisecond {
			renewals++
		}
		last = left
	}
	if err := l.Check(ctx); err != nil {
		t.Fatalf("lock lost although renewed: %v", err)
	}
	if _, err := AcquireRun(ctx, rdb, "demo", "x", time.Second, nil); !errors.Is(err, ErrRunLocked) {
		t.Fatalf("want ErrRunLocked, got %v", err)
	}
}

func TestTakeoverIsNoticedByRenewal(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	l, err := AcquireRun(ctx, rdb, "demo", "w", 90*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	rdb.Set(ctx, RunLockKey("demo"), "99:intruder", time.Minute)
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("renewal did not notice that another worker holds the lock")
	}
	// The intruder's lock survives our release.
	l.Release(ctx)
	if v := rdb.Get(ctx, RunLockKey("demo")).Val(); v != "99:intruder" {
		t.Fatalf("lock value %q after release", v)
	}
}

// observed is a logger whose entries a test can read.
func observed() (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.WarnLevel)
	return zap.New(core), logs
}

// waitForLog waits for an entry with msg, for up to a minute.
func waitForLog(t *testing.T, logs *observer.ObservedLogs, msg string) observer.LoggedEntry {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if es := logs.FilterMessage(msg).All(); len(es) > 0 {
			return es[0]
		}
	}
	t.Fatalf("no log %q in a minute; logged: %v", msg, logs.All())
	return observer.LoggedEntry{}
}

const retaken = "run lock's lease expired and nobody took the run: held again with the same token"

// A lease that expired while its holder was paused (SIGSTOP, a stalled
// machine) and that no other worker took is taken again by the renewal
// with the same token, and the holder carries on: a takeover is not
// reported where none happened.
func TestAnExpiredLeaseNobodyTookIsHeldAgain(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	log, logs := observed()
	// Renewed every 100 ms, so that the test waits for a renewal, not for
	// the lease: deleting the key is what its expiry does.
	l, err := AcquireRun(ctx, rdb, "paused", "gpu-a", 300*time.Millisecond, log)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	rdb.Del(ctx, RunLockKey("paused"))
	e := waitForLog(t, logs, retaken)
	if e.ContextMap()["token"] != l.Token() {
		t.Errorf("logged %v; want the holder's token %d", e.ContextMap(), l.Token())
	}
	select {
	case <-l.Lost():
		t.Fatalf("the holder was told it lost the run that nobody took: %v", logs.All())
	default:
	}
	if v := rdb.Get(ctx, RunLockKey("paused")).Val(); v != l.value {
		t.Errorf("lock value %q; want the holder's %q", v, l.value)
	}
	if err := l.Fenced(ctx, map[string]string{"step": "7"}); err != nil {
		t.Fatalf("the holder's write after its lease was taken again: %v", err)
	}
	if _, err := AcquireRun(ctx, rdb, "paused", "gpu-b", time.Second, nil); !errors.Is(err, ErrRunLocked) {
		t.Fatalf("another worker: want ErrRunLocked, got %v", err)
	}
}

// A fenced write that finds the lease expired, while nobody took the run,
// takes it again and writes; one after the holder released the lock does
// not, and says the lease expired.
func TestAFencedWriteTakesBackAnExpiredLease(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	log, logs := observed()
	// A lease of a minute is not renewed while the test runs: the write,
	// not the renewal, finds it expired.
	l, err := AcquireRun(ctx, rdb, "paused", "gpu-a", time.Minute, log)
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, RunLockKey("paused"))
	if err := l.Fenced(ctx, map[string]string{"step": "7"}); err != nil {
		t.Fatalf("write after the lease expired with nobody else: %v", err)
	}
	if got := rdb.HGet(ctx, RunStateKey("paused"), "step").Val(); got != "7" {
		t.Errorf("state step = %q, want 7", got)
	}
	if v, ttl := rdb.Get(ctx, RunLockKey("paused")).Val(), rdb.PTTL(ctx, RunLockKey("paused")).Val(); v != l.value || ttl <= 0 {
		t.Errorf("lock %q with %v left; want the holder's %q with a lease", v, ttl, l.value)
	}
	if logs.FilterMessage(retaken).Len() != 1 {
		t.Errorf("logged %v; want that the lease was taken again", logs.All())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	err = l.Check(ctx)
	if !errors.Is(err, ErrRunLockLost) || !strings.Contains(err.Error(), "the lease expired after this holder stopped renewing it") {
		t.Fatalf("check after release: %v; want ErrRunLockLost saying the lease expired", err)
	}
	if rdb.Exists(ctx, RunLockKey("paused")).Val() != 0 {
		t.Error("a released lock was taken again")
	}
}

// A holder whose lease expired stops when another worker took the run
// since, whether that worker holds it still or has let it go, and says
// which happened: a renewal and a fenced write alike.
func TestATakeoverAfterTheLeaseExpiredStopsTheHolder(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	for _, tc := range []struct {
		name    string
		release bool   // the other worker has released the run again
		renewal bool   // the renewal notices, not a write
		want    string // in the log and the error
	}{
		{"holds/write", false, false, "another worker holds the lock: gpu-b, with token 2"},
		{"held since/write", true, false, "the lease expired and another worker has taken the run since (newest token 2)"},
		{"holds/renewal", false, true, "another worker holds the lock: gpu-b, with token 2"},
		{"held since/renewal", true, true, "the lease expired and another worker has taken the run since (newest token 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := strings.ReplaceAll(tc.name, "/", "-")
			log, logs := observed()
			ttl := time.Minute
			if tc.renewal {
				ttl = 300 * time.Millisecond
			}
			l, err := AcquireRun(ctx, rdb, run, "gpu-a", ttl, log)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(ctx)
			// The lease expires and gpu-b acquires the run, as one step so
			// that the renewal cannot take the lease back in between:
			// what AcquireRun does, after the key's expiry.
			_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Del(ctx, RunLockKey(run))
				p.Incr(ctx, runFenceKey(run))
				if !tc.release {
					p.Set(ctx, RunLockKey(run), "2:gpu-b", time.Minute)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.renewal {
				err := l.Fenced(ctx, map[string]string{"step": "1500"})
				if !errors.Is(err, ErrRunLockLost) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("stale write: %v; want ErrRunLockLost saying %q", err, tc.want)
				}
				if rdb.HExists(ctx, RunStateKey(run), "step").Val() {
					t.Error("the stale write reached the run's state")
				}
			}
			select {
			case <-l.Lost():
			case <-time.After(time.Minute):
				t.Fatal("the holder was not told it lost the run")
			}
			lost := logs.FilterMessage("run lock lost").All()
			if len(lost) != 1 || lost[0].ContextMap()["why"] != tc.want {
				t.Errorf("logged %v; want one loss saying %q", logs.All(), tc.want)
			}
			// (A renewal may take back a lease that really expired before
			// gpu-b came, on a stalled machine: only the write is exact.)
			if !tc.renewal && logs.FilterMessage(retaken).Len() != 0 {
				t.Error("the lease was taken again over a newer token")
			}
			if err := l.Check(ctx); !errors.Is(err, ErrRunLockLost) {
				t.Errorf("check after the loss: %v", err)
			}
			l.Release(ctx)
			if tc.release {
				if rdb.Exists(ctx, RunLockKey(run)).Val() != 0 {
					t.Error("the stale holder took the run again")
				}
			} else if v := rdb.Get(ctx, RunLockKey(run)).Val(); v != "2:gpu-b" {
				t.Errorf("lock value %q after the stale holder's release; want gpu-b's", v)
			}
		})
	}
}

// A holder whose Redis lost its data (restarted without its append-only
// file) stops at its next write or renewal, saying so and how to resume
// the run, not that another worker took it.
func TestAHolderWhoseRedisLostItsDataSaysSo(t *testing.T) {
	ctx := context.Background()
	rdb := newRunRedis(t)
	for _, renewal := range []bool{false, true} {
		run := fmt.Sprintf("lost-data-%v", renewal)
		log, logs := observed()
		ttl := time.Minute
		if renewal {
			ttl = 300 * time.Millisecond
		}
		l, err := AcquireRun(ctx, rdb, run, "gpu-a", ttl, log)
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.Del(ctx, RunLockKey(run), runFenceKey(run), RunStateKey(run)).Err(); err != nil {
			t.Fatal(err)
		}
		want := "the run's lock and fencing token are gone from Redis (it lost its data: restarted without its append-only file, or flushed), and its queued segment with them: 'sched enqueue train " + run + "' resumes the run from its last checkpoint"
		if !renewal {
			err := l.Fenced(ctx, map[string]string{"step": "1500"})
			if !errors.Is(err, ErrRunLockLost) || !strings.Contains(err.Error(), want) {
				t.Fatalf("write after the loss of Redis's data: %v; want ErrRunLockLost saying %q", err, want)
			}
		}
		select {
		case <-l.Lost():
		case <-time.After(time.Minute):
			t.Fatal("the holder was not told it lost the run")
		}
		if lost := logs.FilterMessage("run lock lost").All(); len(lost) != 1 || lost[0].ContextMap()["why"] != want {
			t.Errorf("renewal %v: logged %v; want one loss saying %q", renewal, logs.All(), want)
		}
		l.Release(ctx)
	}
}
