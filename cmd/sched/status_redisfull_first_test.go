package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// A Redis full before kiln added its queues to it (a fresh or shared one
// that is at its maxmemory) refuses the queues' adding, a write: `sched
// status` reads what Redis holds all the same and says Redis is full on
// its first line, with what to do, where it ended with "list queues: OOM
// command not allowed".
func TestStatusOfARedisFullBeforeKilnsQueuesSaysItIsFull(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir()}
	out, errOut, code := sched(t, env, "status")
	if code != 0 {
		t.Fatalf("sched status of a Redis full before kiln's queues: exit %d: %s%s", code, out, errOut)
	}
	first, _, _ := strings.Cut(out, "\n")
	for _, want := range []string{"REDIS IS FULL: it uses ", "over its maxmemory of 1 B", "redis-cli CONFIG SET maxmemory <size>"} {
		if !strings.Contains(first, want) {
			t.Errorf("status's first line: %q; want %q in it", first, want)
		}
	}
	if !strings.Contains(out, "\ningest        0        0       0      0         0         0\n") {
		t.Errorf("status of a Redis full before kiln's queues:\n%s\nwant the ingest queue read as empty", out)
	}
	if out, errOut, code := sched(t, env, "runs"); code != 0 {
		t.Errorf("sched runs of a Redis full before kiln's queues: exit %d: %s%s", code, out, errOut)
	}
}
