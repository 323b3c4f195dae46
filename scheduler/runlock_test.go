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
	// A lease long enough that only a stall of two thirds of it (on a
	// machine busy with every other package's tests) lets it lapse between
	// renewals; a 90 ms lease once lapsed that way.
	l, err := AcquireRun(ctx, rdb, "demo", "w", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	// Several lease lengths later the lock must still be ours.
	time.Sleep(3500 * time.Millisecond)
	if err := l.Check(ctx); err != nil {
		t.Fatalf("lock expired although renewed: %v", err)
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
