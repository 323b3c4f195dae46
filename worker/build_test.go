package worker

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// waitListed waits until asynq's heartbeat lists the worker process name.
func (e *env) waitListed(name string) {
	e.t.Helper()
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		servers, err := insp.Servers()
		if err != nil {
			e.t.Fatal(err)
		}
		for _, s := range servers {
			if s.Host+":"+strconv.Itoa(s.PID) == name {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("worker %s is not listed by its heartbeat", name)
}

// A worker process publishes its build in Redis under the name its
// heartbeat gives it, from before its heartbeat lists it, with a TTL; it
// writes it again while it runs, so that a Redis that lost it has it
// again within BuildEvery; and a clean stop deletes it.
func TestAWorkerPublishesItsBuildBesideItsHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	child := e.startChild()
	// The child's name: this process's host, the child's pid.
	name := strings.TrimSuffix(processName(), strconv.Itoa(os.Getpid())) + strconv.Itoa(child.Process.Pid)
	key := BuildKey(name)
	e.waitListed(name)
	builds, err := ReadBuilds(ctx, e.rdb, []string{name, "gone:1"})
	if err != nil {
		t.Fatal(err)
	}
	b, ok := builds[name]
	if !ok || b.String() != ThisBuild().String() || !b.Same(ThisBuild()) || len(b.Payloads) != len(scheduler.Kinds()) {
		t.Fatalf("worker %s listed by its heartbeat publishes %+v (found %v); want this build, %+v", name, b, ok, ThisBuild())
	}
	if _, ok := builds["gone:1"]; ok || len(builds) != 1 {
		t.Errorf("builds %v: want none for a worker that publishes none", builds)
	}
	if ttl := e.rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > BuildTTL {
		t.Errorf("key %s has TTL %v; want one of at most %v", key, ttl, BuildTTL)
	}

	// Redis lost it (a restart without its data): the next write brings
	// it back.
	if err := e.rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(BuildTTL)
	for e.rdb.Exists(ctx, key).Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("key %s deleted is not written again within %v", key, BuildTTL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ttl := e.rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > BuildTTL {
		t.Errorf("key %s written again has TTL %v; want one of at most %v", key, ttl, BuildTTL)
	}

	// A clean stop deletes it.
	if err := child.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("worker stopped by SIGTERM: %v", err)
	}
	if n := e.rdb.Exists(ctx, key).Val(); n != 0 {
		t.Errorf("key %s is left behind by a worker that stopped cleanly", key)
	}
}

// A worker publishes the build it is given in place of this program's,
// which is how a worker of another build reads: the kinds whose payload
// versions differ are told apart, as what the workers of either refuse of
// the other's.
func TestAWorkerOfAnotherBuildReadsAsOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	other := ThisBuild()
	other.Version, other.Commit = "v0.0.9", "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"
	other.Payloads = map[string]int{scheduler.KindIngestShard: other.Payloads[scheduler.KindIngestShard] - 1, scheduler.KindIngestPlan: other.Payloads[scheduler.KindIngestPlan], "kind:gone": 1}
	w, err := New(Params{Redis: e.opt, Queues: map[string]int{scheduler.QueueIngest: 1}, Handlers: e.handlers, Build: other})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	stop := sync.OnceValue(func() error { cancel(); return <-done })
	t.Cleanup(func() { stop() })
	e.waitListed(processName())

	builds, err := ReadBuilds(ctx, e.rdb, []string{processName()})
	if err != nil {
		t.Fatal(err)
	}
	b := builds[processName()]
	if b.String() != other.String() || b.Short() != "v0.0.9 (commit 9f8e7d6c5b4a)" || b.Same(ThisBuild()) {
		t.Fatalf("published %+v (%s); want %+v, not this build", b, b.Short(), other)
	}
	// Only the kinds both know, and of those only the one whose version
	// differs.
	if got := b.OtherPayloads(ThisBuild()); !slices.Equal(got, []string{scheduler.KindIngestShard}) {
		t.Errorf("other payloads %v; want [%s]", got, scheduler.KindIngestShard)
	}
	// The same version and commit at another payload version is another
	// build too: two builds outside a checkout both read "dev (commit
	// unknown)".
	same := ThisBuild()
	if !same.Same(ThisBuild()) {
		t.Errorf("this build is not the same as itself")
	}
	same.Payloads = other.Payloads
	if same.Same(ThisBuild()) {
		t.Errorf("a build at other payload versions reads as this one")
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := e.rdb.Exists(ctx, BuildKey(processName())).Val(); n != 0 {
		t.Errorf("key %s is left behind by a worker that stopped cleanly", BuildKey(processName()))
	}
}

// RedisUptime is how long Redis has run: at most the time since it was
// started, growing while it runs, and from 0 again once it restarts.
func TestRedisUptimeIsHowLongRedisHasRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	started := time.Now()
	r := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	read := func() time.Duration {
		t.Helper()
		up, err := RedisUptime(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		return up
	}
	// Whole seconds, as Redis counts them.
	first := read()
	if first < 0 || first > time.Since(started) {
		t.Fatalf("uptime %s of a Redis started %s ago", first, time.Since(started))
	}
	deadline := time.Now().Add(30 * time.Second)
	for up := first; up <= first; up = read() {
		if time.Now().After(deadline) {
			t.Fatalf("uptime still %s 30 s later", up)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.Stop()
	restarted := time.Now()
	r.Start()
	if up := read(); up > time.Since(restarted) {
		t.Fatalf("uptime %s of a Redis restarted %s ago", up, time.Since(restarted))
	}
}
