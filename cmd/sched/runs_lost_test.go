package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// After Redis lost its data, a run whose checkpoints object storage holds
// is still listed by `sched runs`, and by `sched status` while Redis knows
// no run, with its newest checkpoint and the command that resumes it (or,
// at its total steps, as done), where both said "no training runs". A
// run not in the runs file here says where to name it. A watch reads the
// store once, not at every frame. Without object storage, `sched runs`
// and `sched status` print what Redis knows and say why the store was
// not read.
func TestRunsListsARunRedisLostByItsCheckpoints(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	s3 := testsvc.S3(t)
	env = append(env, "KILN_S3_ENDPOINT="+s3.Endpoint, "KILN_S3_ACCESS_KEY="+s3.AccessKey, "KILN_S3_SECRET_KEY="+s3.SecretKey,
		"KILN_SHUTDOWN_GRACE=4s")
	ctx := context.Background()
	appendRuns(t, env, "fin:\n  from: eta\n  total_steps: 40\n  segment: {max_steps: 20}\nlost:\n  from: eta\n  segment: {max_steps: 20}\n")
	trainToTheEnd(t, env, rdb, q, "fin")
	w := startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", "lost"); code != 0 {
		t.Fatalf("enqueue train lost: exit %d: %s%s", code, out, errOut)
	}
	waitUntil(t, "run lost's checkpoint of step 20 uploaded", func() bool {
		st, ok, err := scheduler.ReadRunState(ctx, rdb, "lost")
		return err == nil && ok && st.Checkpoint >= 20
	})
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	objects, err := store.NewS3(store.S3Options{Endpoint: s3.Endpoint, Bucket: "kiln", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	steps, err := segment.RemoteSteps(ctx, objects, "lost")
	if err != nil || len(steps) == 0 {
		t.Fatalf("checkpoints of run lost in object storage: %v, %v", steps, err)
	}
	newest := steps[len(steps)-1]

	fin := "fin  done: checkpoints in object storage up to step 40 of 40, and no record in Redis\n"
	lost := fmt.Sprintf("lost  not queued: checkpoints in object storage up to step %d, and no record in Redis; 'sched enqueue train lost' resumes it\n", newest)
	for _, args := range [][]string{{"runs"}, {"status"}} {
		out, errOut, code := sched(t, env, args...)
		if code != 0 || !strings.Contains("\n"+out, "\nRUNS\n"+fin+lost+"\n") {
			t.Errorf("sched %s after Redis lost its data: exit %d, stderr %q; want under RUNS:\n%s%sgot:\n%s", args[0], code, errOut, fin, lost, out)
		}
	}
	// The runs file here lacks them: 'sched enqueue train' would not know
	// the name. Whether a run is done, its newest checkpoint says (its run
	// configuration, total included), where fin was said to be resumed.
	out, errOut, code := sched(t, append(env[:len(env):len(env)], "KILN_RUNS="), "runs")
	unknown := " (with KILN_RUNS naming the runs file that defines it, as the GPU worker's does)\n"
	want := "RUNS\n" + fin + strings.TrimSuffix(lost, "\n") + unknown + "\n"
	if code != 0 || !strings.HasPrefix(out, want) {
		t.Errorf("sched runs without the runs file: exit %d, stderr %q; want it to begin\n%sgot:\n%s", code, errOut, want, out)
	}

	// A watch reads object storage once while Redis knows no run, not at
	// every frame: a frame drawn after the store stopped lists them still.
	wt := startWatch(t, env)
	kill := time.AfterFunc(2*time.Minute, func() { wt.cmd.Process.Kill() })
	defer kill.Stop()
	frame := func(want func(string) bool) string {
		t.Helper()
		var cur strings.Builder
		for wt.sc.Scan() {
			if strings.HasPrefix(wt.sc.Text(), "kiln status at ") {
				if f := cur.String(); want(f) {
					return f
				}
				cur.Reset()
			}
			cur.WriteString(wt.sc.Text() + "\n")
		}
		t.Fatalf("status --watch ended before the frame wanted:\n%s\nstderr: %s", wt.out.String(), wt.errOut.String())
		return ""
	}
	if f := frame(func(f string) bool { return strings.Contains(f, "\nRUNS\n") }); !strings.Contains(f, "\nRUNS\n"+fin+lost+"\n") {
		t.Errorf("status --watch after Redis lost its data: want under RUNS:\n%s%sgot:\n%s", fin, lost, f)
	}
	s3.Stop()
	// A task Redis knows that is no run's marks the frames drawn since.
	if _, err := q.Enqueue(ctx, scheduler.BenchRun{Sweep: "sweep"}); err != nil {
		t.Fatal(err)
	}
	queued := regexp.MustCompile(`(?m)^gpu +1 +1 `)
	if f := frame(queued.MatchString); !strings.Contains(f, "\nRUNS\n"+fin+lost+"\n") {
		t.Errorf("status --watch, a frame drawn with object storage down: want under RUNS, as read before:\n%s%sgot:\n%s", fin, lost, f)
	}
	wt.interrupt()
	s3.Start()

	// Redis knows a run again: status reads it alone, runs both.
	if out, errOut, code := sched(t, env, "enqueue", "train", "lost"); code != 0 || !regexp.MustCompile(fmt.Sprintf(`resumes from its last checkpoint \(step %d[,)]`, newest)).MatchString(out) {
		t.Fatalf("enqueue train lost after Redis lost its data: exit %d: %s%s", code, out, errOut)
	}
	out, errOut, code = sched(t, env, "status")
	queuedLost := fmt.Sprintf("lost  queued  from checkpoint step %d\n", newest)
	if code != 0 || !strings.Contains(out, "\nRUNS\n"+queuedLost+"\n") {
		t.Errorf("sched status with run lost queued: exit %d, stderr %q; want lost queued alone under RUNS, got:\n%s", code, errOut, out)
	}
	out, errOut, code = sched(t, env, "runs")
	if code != 0 || !strings.HasPrefix(out, "RUNS\n"+fin+queuedLost+"\n") {
		t.Errorf("sched runs with run lost queued: exit %d, stderr %q; want fin from object storage and lost queued, got:\n%s", code, errOut, out)
	}

	// Object storage down: what Redis knows, and why the rest is not.
	s3.Stop()
	out, errOut, code = sched(t, env, "runs")
	notRead := regexp.MustCompile(`^RUNS\n` + regexp.QuoteMeta(queuedLost) + `object storage not read, so a run that only its checkpoints there still record is not listed: cannot reach the object store at http://` +
		regexp.QuoteMeta(s3.Endpoint) + ` \(KILN_S3_ENDPOINT or --s3-endpoint, https with KILN_S3_SECURE\): .*connection refused.*; check the endpoint, http or https, and that it is running\n\nTASKS\n`)
	if code != 0 || !notRead.MatchString(out) {
		t.Errorf("sched runs with object storage down: exit %d, stderr %q; want %s, got:\n%s", code, errOut, notRead, out)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = sched(t, env, "status")
	if want := "\nRUNS\nno training runs in Redis (start one with 'sched enqueue train <run>')\nobject storage not read, so a run that only its checkpoints there still record is not listed: cannot reach the object store at http://" + s3.Endpoint + " "; code != 0 || !strings.Contains(out, want) {
		t.Errorf("sched status with object storage down, Redis knowing no run: exit %d, stderr %q; want %q..., got:\n%s", code, errOut, want, out)
	}
}
