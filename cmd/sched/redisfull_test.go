package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/redismem"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// A Redis at its maxmemory (noeviction, as compose runs it) answers reads
// and refuses writes. `sched status` says so first, with what to do, and
// does not take the workers whose heartbeats it refuses for none running;
// `sched enqueue` says Redis is full and refuses the task, with what to
// do, and exits 2 as for a Redis it cannot reach, not with the task
// queue's "UNKNOWN: redis command error: SADD failed". Once Redis has room
// neither says so, and the same enqueue is queued.
func TestAFullRedisIsSaidByStatusAndEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir()}
	// Work queued before: a dataset waiting for workers.
	for _, args := range [][]string{{"enqueue", "tokenizer", "mix-16384"}, {"enqueue", "ingest", "fineweb-edu"}} {
		if out, errOut, code := sched(t, env, args...); code != 0 {
			t.Fatalf("sched %v: exit %d: %s%s", args, code, out, errOut)
		}
	}

	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := sched(t, env, "status")
	if code != 0 {
		t.Fatalf("sched status with Redis full: exit %d: %s%s", code, out, errOut)
	}
	first, _, _ := strings.Cut(out, "\n")
	for _, want := range []string{"REDIS IS FULL: it uses ", "over its maxmemory of 1 B", "refuses every write", "losing nothing",
		"redis-cli CONFIG SET maxmemory <size>", "KILN_REDIS_MAXMEMORY=<size> in .env"} {
		if !strings.Contains(first, want) {
			t.Errorf("status's first line with Redis full: %q; want %q in it", first, want)
		}
	}
	if !strings.Contains(out, "WORKERS\nunknown while Redis is full: it refuses the workers' heartbeats") {
		t.Errorf("status's WORKERS with Redis full:\n%s\nwant them said unknown", out)
	}
	for _, not := range []string{"no worker is running", "start one with 'sched worker"} {
		if strings.Contains(out, not) {
			t.Errorf("status with Redis full says %q, of workers whose heartbeats Redis refuses:\n%s", not, out)
		}
	}

	wantRefused(t, env, "sched: enqueue ingest:plan: Redis refused the write because it is full", "enqueue", "ingest", "fineweb-edu", "--store", "other")
	out, errOut, _ = sched(t, env, "enqueue", "ingest", "fineweb-edu", "--store", "other")
	for _, want := range []string{"redis-cli CONFIG SET maxmemory <size>", "ingest:plan was not queued: run this again once Redis takes writes"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("enqueue with Redis full: %q; want %q in it", errOut, want)
		}
	}
	for _, not := range []string{"UNKNOWN", "redis command error", "SADD failed"} {
		if strings.Contains(errOut, not) {
			t.Errorf("enqueue with Redis full: %q; want the task queue's words (%q) left out", errOut, not)
		}
	}

	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = sched(t, env, "status")
	if code != 0 || strings.Contains(out, "REDIS IS FULL") || !strings.Contains(out, "no worker is running (start one with") {
		t.Errorf("sched status once Redis has room: exit %d:\n%s%s\nwant no word of a full Redis, and no worker running", code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "enqueue", "ingest", "fineweb-edu", "--store", "other"); code != 0 || !strings.Contains(out, "queued ingest:plan:") {
		t.Errorf("enqueue once Redis has room: exit %d: %s%s; want it queued", code, out, errOut)
	}
}

// A dataset whose files wait says no worker serves their queue where no
// worker heartbeats, unless Redis is full: then it refuses the heartbeats,
// and the workers are unknown (status's first line says why).
func TestADatasetWaitingWhileRedisIsFullBlamesNoWorker(t *testing.T) {
	d := scheduler.DatasetProgress{Store: "code", Files: 3, Waiting: 3}
	if line := datasetLine(d, &scheduler.Snapshot{}, time.Time{}); !strings.Contains(line, "no worker serves queue ingest") {
		t.Fatalf("a waiting dataset with no worker: %q; want it to say no worker serves its queue", line)
	}
	full := &scheduler.Snapshot{Memory: redismem.Memory{Used: 2 << 20, Max: 1 << 20}}
	if line := datasetLine(d, full, time.Time{}); strings.Contains(line, "no worker serves") || !strings.Contains(line, "3 waiting") {
		t.Errorf("a waiting dataset with Redis full: %q; want it waiting, and no word of workers", line)
	}
}
