package scheduler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
