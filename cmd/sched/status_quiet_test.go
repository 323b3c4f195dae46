package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// A run whose segment stopped reporting (its process stopped, as a hung
// GPU leaves it) read training at the rate and ETA of its last logged step
// for as long, with no age, and its tok/s metric kept that rate, so an
// alert on the rate could never fire on a hang. With its last report over
// five minutes old, its RUNS line and its task's line say when it last
// reported in place of the rate and ETA, the metrics read its tok/s as 0
// (not while its training is over and it waits for its last upload) and
// give the time of its last report; once it reports again, both show its
// rate again.
func TestARunThatStoppedReportingSaysSoInStatusAndMetrics(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	ctx := context.Background()
	w := startWorker(t, env, "--queues", "gpu=1", "--metrics-addr", "127.0.0.1:0")
	if _, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"}); err != nil {
		t.Fatal(err)
	}
	url := ""
	deadline := time.Now().Add(time.Minute) // for a line that never comes
	for url == "" {
		if m := regexp.MustCompile(`"url":"(http://[^"]+/metrics)"`).FindStringSubmatch(workerLog(t, w)); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("the worker did not open its metrics endpoint within a minute:\n%s", workerLog(t, w))
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	scrape := func() string {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
		}
		return string(b)
	}
	id := waitRunningSegment(t, q)
	deadline = time.Now().Add(2 * time.Minute)
	for rdb.HGet(ctx, scheduler.RunStateKey("eta"), "tok_per_s").Val() == "" {
		if time.Now().After(deadline) {
			t.Fatalf("run eta recorded no rate within 2 minutes: %v", rdb.HGetAll(ctx, scheduler.RunStateKey("eta")).Val())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Stopped, the segment writes nothing; its last report is made seven
	// minutes old, in its state and in its task's progress.
	resume := freezeChildren(t, w.Process.Pid)
	t.Cleanup(resume)
	old := time.Now().Add(-7 * time.Minute).UTC().Truncate(time.Second)
	var out, page string
	for tries := 0; ; tries++ {
		if tries == 10 {
			t.Fatalf("the stopped segment's writes kept landing after the test's")
		}
		if err := rdb.HSet(ctx, scheduler.RunStateKey("eta"), "updated", old.Format(time.RFC3339)).Err(); err != nil {
			t.Fatal(err)
		}
		p, ok, err := scheduler.ReadProgress(ctx, rdb, id)
		if err != nil || !ok {
			t.Fatalf("progress of %s: %v %v", id, ok, err)
		}
		p.Updated = old
		if err := scheduler.WriteProgress(ctx, rdb, p, time.Hour); err != nil {
			t.Fatal(err)
		}
		var errOut string
		var code int
		if out, errOut, code = sched(t, env, "status"); code != 0 {
			t.Fatalf("status: exit %d: %s", code, errOut)
		}
		page = scrape()
		// A write the segment sent just before it stopped may land after
		// the test's: what was read is of the old time only if it stands.
		p, _, _ = scheduler.ReadProgress(ctx, rdb, id)
		if rdb.HGet(ctx, scheduler.RunStateKey("eta"), "updated").Val() == old.Format(time.RFC3339) && p.Updated.Equal(old) {
			break
		}
	}
	quiet := regexp.MustCompile(`  on \S+  last report 7m\ds ago$`)
	run, task := lineOf(out, "eta  training  "), lineOf(out, id+"  active  ")
	if !quiet.MatchString(run) || strings.Contains(run, "tok/s") || strings.Contains(run, "ETA") {
		t.Errorf("run line %q; want no rate or ETA, and that it last reported 7 minutes ago", run)
	}
	if !quiet.MatchString(task) || strings.Contains(task, "tok/s") || strings.Contains(task, "ETA") {
		t.Errorf("task line %q; want no rate or ETA, and that it last reported 7 minutes ago", task)
	}
	if r := series(page, "kiln_run_tokens_per_second", `run="eta"`); r != 0 {
		t.Errorf("kiln_run_tokens_per_second of the stopped run: %v, want 0", r)
	}
	if at := series(page, "kiln_run_last_report_timestamp_seconds", `run="eta"`); at != float64(old.Unix()) {
		t.Errorf("kiln_run_last_report_timestamp_seconds of the stopped run: %v, want %d", at, old.Unix())
	}

	// A last segment whose training is over writes nothing while it waits
	// for its uploads: that is no hang of its training, whose rate stands.
	rate, _ := strconv.ParseFloat(rdb.HGet(ctx, scheduler.RunStateKey("eta"), "tok_per_s").Val(), 64)
	if err := rdb.HSet(ctx, scheduler.RunStateKey("eta"), "phase", scheduler.PhaseUpload).Err(); err != nil {
		t.Fatal(err)
	}
	if r := series(scrape(), "kiln_run_tokens_per_second", `run="eta"`); r != rate || rate <= 0 {
		t.Errorf("kiln_run_tokens_per_second of a run waiting for its last upload: %v, want its last rate %v", r, rate)
	}
	if err := rdb.HDel(ctx, scheduler.RunStateKey("eta"), "phase").Err(); err != nil {
		t.Fatal(err)
	}

	// Let go, it reports again, and reads as training.
	resume()
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^eta  training  .*  \S+ tok/s  ETA `), time.Minute, "status")
	if run := lineOf(out, "eta  "); strings.Contains(run, "last report") {
		t.Errorf("run line %q of a run that reports again", run)
	}
	deadline = time.Now().Add(time.Minute)
	for page = scrape(); series(page, "kiln_run_tokens_per_second", `run="eta"`) <= 0; page = scrape() {
		if time.Now().After(deadline) {
			t.Fatalf("kiln_run_tokens_per_second stayed 0 after the run reported again:\n%s", page)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if at := series(page, "kiln_run_last_report_timestamp_seconds", `run="eta"`); at <= float64(old.Unix()) {
		t.Errorf("kiln_run_last_report_timestamp_seconds after the run reported again: %v, want after %d", at, old.Unix())
	}
}

// A segment that has just begun, after its run waited (for the GPU, a
// retry), has logged no step yet: its run's state is as old as the wait,
// and the task's start is its last report, so it is not quiet. A done run
// is not quiet however old its state.
func TestARunsLineIsQuietOnlyWhileItsSegmentRunsSilent(t *testing.T) {
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	rs := scheduler.RunState{Run: "r", Step: 500, Total: 1000, Tokens: 500 * 64, TokPerS: 3200, Checkpoint: 400, Updated: now.Add(-time.Hour)}
	task := scheduler.TaskStatus{ID: "train:segment:1", Kind: scheduler.KindTrainSegment, State: "active", HasProgress: true,
		Progress: scheduler.Progress{Fraction: 0.5, Worker: "gpu-a", Updated: now.Add(-time.Second)}}
	v := runView{RunState: rs, HasState: true, Task: &task}
	v.classify()
	if line, want := v.line(now), "r  training  step 500/1000 (50.0%)  3.2k tok/s  ETA 10s  last checkpoint step 400  on gpu-a"; line != want {
		t.Errorf("a segment that began a second ago: %q, want %q", line, want)
	}
	task.Progress.Updated = now.Add(-6 * time.Minute)
	if line, want := v.line(now), "r  training  step 500/1000 (50.0%)  last checkpoint step 400  on gpu-a  last report 6m0s ago"; line != want {
		t.Errorf("a segment silent for 6 minutes: %q, want %q", line, want)
	}
	done := runView{RunState: rs, HasState: true}
	done.Step, done.Checkpoint, done.Done = 1000, 1000, true
	done.classify()
	if line := done.line(now); strings.Contains(line, "last report") || done.Status != runDone {
		t.Errorf("a done run: %q", line)
	}
}

// A run whose length was lowered below the step its segment under way went
// on to ends there, past its total: its line read "step 1500/800
// (187.5%)", which looks broken. It says the step, and that it is past its
// total and why, in `sched status` and `sched runs`.
func TestARunEndedPastItsLoweredTotalSaysSo(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0)}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	// As the segment that ended the run writes its state.
	if err := rdb.HSet(context.Background(), scheduler.RunStateKey("r19"), "step", "1500", "total", "800", "tokens", "384000",
		"loss", "4.5402", "checkpoint", "1500", "done", "true", "worker", "gpu-a", "updated", time.Now().UTC().Format(time.RFC3339)).Err(); err != nil {
		t.Fatal(err)
	}
	want := "r19  done  step 1500 (past its total of 800: the run's length was lowered after the segment that trained to step 1500 began)  loss 4.5402  last checkpoint step 1500"
	for _, cmd := range []string{"status", "runs"} {
		out, errOut, code := sched(t, env, cmd)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", cmd, code, errOut)
		}
		if line := lineOf(out, "r19  "); line != want {
			t.Errorf("sched %s: run line %q, want %q", cmd, line, want)
		}
	}
}

// A run that ended (cancelled, failed, stopped with no segment queued,
// done) said when it last reported ("last report 11m22s ago" on a run
// cancelled an hour before), which status promises of a run still going:
// one that waits to go on (queued, retrying) still says it.
func TestOnlyARunStillGoingSaysWhenItLastReported(t *testing.T) {
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	rs := scheduler.RunState{Run: "r", Step: 500, Total: 1000, Tokens: 500 * 64, TokPerS: 3200, Checkpoint: 400, Updated: now.Add(-11 * time.Minute)}
	for _, c := range []struct {
		task *scheduler.TaskStatus
		want string // the run's state as its line says it
		says bool   // whether it says when it last reported
	}{
		{&scheduler.TaskStatus{ID: "train:segment:1", Kind: scheduler.KindTrainSegment, State: "archived", Cancelled: true}, runCancelled, false},
		{&scheduler.TaskStatus{ID: "train:segment:1", Kind: scheduler.KindTrainSegment, State: "archived", LastErr: "diverged"}, runFailed, false},
		{nil, runStopped, false},
		{&scheduler.TaskStatus{ID: "train:segment:1", Kind: scheduler.KindTrainSegment, State: "pending"}, runQueued, true},
		{&scheduler.TaskStatus{ID: "train:segment:1", Kind: scheduler.KindTrainSegment, State: "retry", Retried: 1, MaxRetry: 8, LastErr: "boom"}, runRetrying, true},
	} {
		v := runView{RunState: rs, HasState: true, Task: c.task}
		v.classify()
		line := v.line(now)
		if v.Status != c.want || strings.Contains(line, "last report 11m0s ago") != c.says {
			t.Errorf("a run %s: %q; want it to say when it last reported: %v", c.want, line, c.says)
		}
	}
}
