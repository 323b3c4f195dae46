package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// waitHeld waits for a rule of an S3Faults proxy to hold its first request.
func waitHeld(t *testing.T, what string, rule *testsvc.Fault) {
	t.Helper()
	select {
	case <-rule.Held:
	case <-time.After(3 * time.Minute): // for a request that never comes
		t.Fatalf("%s: not within 3 minutes", what)
	}
}

// A run whose last segment has trained its last step and waits for its
// last checkpoint's upload, then for its results, reads finishing in
// `sched status`, saying which and since when, with no rate or ETA: it
// read training, at the rate of its last steps and with an ETA, for the
// minutes a slow store takes. Its task's line says the same. Once both
// are stored, the run reads done.
func TestARunWaitingForItsLastUploadReadsFinishing(t *testing.T) {
	t.Parallel()
	env, rdb, _ := trainingSetup(t)
	srv := testsvc.S3(t)
	faults := srv.Faults(t)
	env = append(env, "KILN_S3_ENDPOINT="+faults.Endpoint, "KILN_S3_ACCESS_KEY="+srv.AccessKey, "KILN_S3_SECRET_KEY="+srv.SecretKey)
	const run = "fin"
	appendRuns(t, env, run+":\n  from: eta\n  total_steps: 40\n")
	last := faults.Add(testsvc.Fault{Method: "PUT", Path: segment.CheckpointPrefix(run) + trainer.StepDir(40) + "/", Action: testsvc.Hold, Count: 1})
	startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", run); code != 0 {
		t.Fatalf("enqueue train %s: exit %d: %s%s", run, code, out, errOut)
	}
	waitHeld(t, "the upload of the run's last checkpoint", last)

	noRate := func(what, line string) {
		t.Helper()
		if strings.Contains(line, "tok/s") || strings.Contains(line, "ETA") {
			t.Errorf("%s %q; want no rate or ETA: the run takes no step", what, line)
		}
	}
	uploading := "uploading its last checkpoint (step 40)"
	out := waitOutput(t, env, regexp.MustCompile(`(?m)^fin  finishing  `), time.Minute, "status")
	line := lineOf(out, "fin  ")
	if !regexp.MustCompile(`^fin  finishing  step 40/40 \(100\.0%\)  loss \S+  last checkpoint step 20 at \S+  on \S+  training ended (just now|\S+ ago): ` + regexp.QuoteMeta(uploading) + `$`).MatchString(line) {
		t.Errorf("run line %q; want it finishing at step 40, training ended and %s", line, uploading)
	}
	noRate("run line", line)
	task := lineOf(out, "train:segment:")
	if !regexp.MustCompile(`^train:segment:\S+  active  \S+%  training is over: ` + regexp.QuoteMeta(uploading) + `  `).MatchString(task) {
		t.Errorf("task line %q; want it to say the segment's training is over and it is %s", task, uploading)
	}
	noRate("task line", task)

	// Its checkpoint stored and recorded, the results after it are held.
	results := faults.Add(testsvc.Fault{Method: "PUT", Path: "/" + segment.ResultsPrefix(run), Action: testsvc.Hold})
	close(last.Release)
	waitHeld(t, "the upload of the run's results", results)
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^fin  finishing  .*: its last checkpoint \(step 40\) is uploaded; writing its results$`), time.Minute, "status")
	line = lineOf(out, "fin  ")
	if !strings.Contains(line, "  last checkpoint step 40 at ") {
		t.Errorf("run line %q; want its last checkpoint, step 40", line)
	}
	noRate("run line", line)

	close(results.Release)
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^fin  done  `), 2*time.Minute, "status")
	if line = lineOf(out, "fin  "); strings.Contains(line, "training") || !strings.Contains(line, "step 40/40 (100.0%)") {
		t.Errorf("run line %q; want it done at step 40, with nothing of its last phase", line)
	}
	noRate("run line", line)
	// The run's state keeps no phase once the run is done.
	if st, _, err := scheduler.ReadRunState(context.Background(), rdb, run); err != nil || !st.Done || st.Phase != "" {
		t.Errorf("the run's state: %+v, %v; want it done, with no phase", st, err)
	}
}

// A state that records no phase, as every state a kiln before phases
// wrote, reads as it did: an active run trains, with its rate and ETA, on
// its line and its task's.
func TestARunsStateWithoutAPhaseReadsAsBefore(t *testing.T) {
	payload, err := scheduler.Encode(scheduler.TrainSegment{Run: "r"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	task := scheduler.TaskStatus{ID: "train:segment:1", Kind: scheduler.KindTrainSegment, State: "active", Payload: payload, HasProgress: true,
		Progress: scheduler.Progress{Fraction: 0.5, Rate: 1000, Unit: "tok", Worker: "gpu-a", Updated: now}}
	rs := scheduler.RunState{Run: "r", Step: 500, Total: 1000, Tokens: 500 * 64, TokPerS: 3200, Checkpoint: 400, Updated: now}
	for _, c := range []struct {
		phase, run, task string
	}{
		{"", "r  training  step 500/1000 (50.0%)  3.2k tok/s  ETA 10s  last checkpoint step 400  on gpu-a",
			"train:segment:1  active  50.0%  3.2k tok/s  ETA 10s  on gpu-a"},
		{scheduler.PhaseResults, "r  finishing  step 500/1000 (50.0%)  last checkpoint step 400  on gpu-a  training ended just now: writing its results",
			"train:segment:1  active  50.0%  training is over: writing its results  on gpu-a"},
	} {
		rs.Phase = c.phase
		v := runView{RunState: rs, HasState: true, Task: &task}
		v.classify()
		if line := v.line(now); line != c.run {
			t.Errorf("phase %q: run line %q, want %q", c.phase, line, c.run)
		}
		if line := taskLine(task, map[string]scheduler.RunState{"r": rs}, now, false, listErrRunes); line != c.task {
			t.Errorf("phase %q: task line %q, want %q", c.phase, line, c.task)
		}
	}
}
