package main

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// While object storage refuses a training run's checkpoints, the run's
// line in `sched status` and `sched runs` says that those after its last
// uploaded one are on its worker's disk only, since when, and what the
// store answers: it read as a healthy run, its last checkpoint falling
// further behind, while each checkpoint since had a single copy. Once an
// upload goes through, the line reads as before.
func TestARunWhoseUploadsFailSaysItsCheckpointsAreOnOneDisk(t *testing.T) {
	t.Parallel()
	env, rdb, _ := trainingSetup(t)
	srv := testsvc.S3(t)
	faults := srv.Faults(t)
	env = append(env, "KILN_S3_ENDPOINT="+faults.Endpoint, "KILN_S3_ACCESS_KEY="+srv.AccessKey, "KILN_S3_SECRET_KEY="+srv.SecretKey)
	startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", "eta"); code != 0 {
		t.Fatalf("enqueue train eta: exit %d: %s%s", code, out, errOut)
	}
	ctx := context.Background()
	waitUntil(t, "the run's first checkpoint uploaded", func() bool {
		st, _, err := scheduler.ReadRunState(ctx, rdb, "eta")
		return err == nil && st.Checkpoint >= 20
	})

	faults.Add(testsvc.Fault{Method: "PUT", Path: segment.CheckpointPrefix("eta"), Action: testsvc.Status, Code: 503})
	store := "http://" + faults.Endpoint + "/kiln"
	note := regexp.MustCompile(`  last checkpoint step (\d+) at \S+  on (\S+)  checkpoints after step (\d+) \(newest: step (\d+)\) are on (\S+)'s disk only: object storage at ` +
		regexp.QuoteMeta(store) + ` has not taken them since (\S+) \(put: 503 SlowDown: injected by the test\)$`)
	for _, cmd := range []string{"status", "runs"} {
		out := waitOutput(t, env, regexp.MustCompile(`(?m)^eta  training  .* are on \S+'s disk only: `), 2*time.Minute, cmd)
		line := lineOf(out, "eta  ")
		m := note.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("sched %s: run line %q; want its last checkpoint, its worker, and that the checkpoints after it are on that worker's disk only, as %v", cmd, line, note)
		}
		last, after, newest := atoi(t, m[1]), atoi(t, m[3]), atoi(t, m[4])
		if after != last || newest <= last || m[5] != m[2] {
			t.Errorf("sched %s: run line %q; want the checkpoints after the last uploaded one, newer than it, on the worker it trains on", cmd, line)
		}
		if since, err := time.Parse(time.RFC3339, m[6]); err != nil || time.Since(since) > time.Hour {
			t.Errorf("sched %s: run line %q; want since when, as a time", cmd, line)
		}
	}

	faults.Clear()
	out := waitOutput(t, env, regexp.MustCompile(`(?m)^eta  training  .*  last checkpoint step \d+ at \S+  on \S+$`), 2*time.Minute, "status")
	if line := lineOf(out, "eta  "); strings.Contains(line, "disk only") {
		t.Errorf("run line %q once the store takes checkpoints again; want nothing of them on one disk", line)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
