package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// sched status lists each run whose segments recorded progress, one line
// per run, in the fields a segment writes to the run's state hash.
func TestStatusShowsRuns(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0)}
	out, errOut, code := sched(t, env, "status")
	if code != 0 || !strings.Contains(out, "no training runs") {
		t.Fatalf("status without runs: exit %d, %q %q", code, out, errOut)
	}

	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	ctx := context.Background()
	for run, fields := range map[string][]string{
		"pilot": {"step", "1200", "total", "5000", "loss", "3.2571", "tok_per_s", "41000", "eta_s", "7260",
			"checkpoint", "1000", "checkpoint_at", "2026-11-30T10:00:00Z", "worker", "gpu-1:42", "done", "false"},
		"first": {"step", "300", "total", "300", "loss", "4.5", "tok_per_s", "900", "checkpoint", "300", "done", "true"},
	} {
		if err := c.HSet(ctx, segment.StateKey(run), fields).Err(); err != nil {
			t.Fatal(err)
		}
	}
	out, errOut, code = sched(t, env, "status")
	if code != 0 {
		t.Fatalf("status: exit %d, %q", code, errOut)
	}
	want := []string{
		"first: step 300/300, loss 4.5000, 900 tok/s, done, last checkpoint step 300",
		"pilot: step 1200/5000, loss 3.2571, 41000 tok/s, ETA 2h1m0s, last checkpoint step 1000 at 2026-11-30T10:00:00Z (worker gpu-1:42)",
	}
	i := strings.Index(out, want[0])
	j := strings.Index(out, want[1])
	if i < 0 || j < i {
		t.Fatalf("status does not list the runs in order, one line each:\n%s", out)
	}
}
