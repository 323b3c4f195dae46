package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/results/tfevents"
)

// eventsArgs is a tiny CPU run into a fresh directory that logs and
// checkpoints often, without its length (--steps).
func eventsArgs(t *testing.T) (out string, args []string) {
	t.Helper()
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	out = filepath.Join(t.TempDir(), "run")
	return out, []string{"train", "--model", "tiny", "--tokens", store, "--engine", "cpu", "--precision", "fp32",
		"--seq", "32", "--batch", "2", "--log-every", "1", "--checkpoint-every", "2", "--out", out, "--tokenizer-file", tokJSON}
}

// checkEventsMatchMetrics holds the run directory's TensorBoard files to
// its metrics.jsonl: every logged step's training loss in exactly one file,
// with metrics.jsonl's value, and no other step.
func checkEventsMatchMetrics(t *testing.T, out string) {
	t.Helper()
	f, err := os.Open(filepath.Join(out, trainer.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := results.ReadMetrics(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]float32{}
	for _, r := range recs {
		if r.Loss != nil {
			want[int64(r.Step)] = float32(*r.Loss)
		}
	}
	files, _ := filepath.Glob(filepath.Join(out, results.TensorBoardDir, "events.out.tfevents.*"))
	seen := map[int64][]string{}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		events, err := tfevents.Read(b)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for _, e := range events {
			loss, ok := e.Values[results.TagLoss]
			if !ok {
				continue
			}
			seen[e.Step] = append(seen[e.Step], filepath.Base(file))
			if w, ok := want[e.Step]; !ok || w != loss {
				t.Errorf("%s: step %d loss %v; metrics.jsonl has %v (logged: %v)", filepath.Base(file), e.Step, loss, w, ok)
			}
		}
	}
	for step := range want {
		if len(seen[step]) != 1 {
			t.Errorf("step %d is in %d event files %v; want one", step, len(seen[step]), seen[step])
		}
	}
	if t.Failed() {
		t.Logf("%d logged steps, event files %v", len(want), files)
	}
}

// A run killed (SIGKILL) after some checkpoints keeps the steps up to its
// last one in TensorBoard: its event file was written only when the
// process ended, so the killed stretch never had one and the resumed run's
// file began at the checkpoint, leaving the steps before it out.
func TestTrainKilledMidRunKeepsItsStepsInTensorBoard(t *testing.T) {
	t.Parallel()
	out, args := eventsArgs(t)
	cmd := exec.Command(os.Args[0], append(args, "--steps", "1000000")...)
	cmd.Env = baseEnv(t)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Killed once its second checkpoint is on disk.
	for {
		if _, err := os.Stat(filepath.Join(out, "step-0000004")); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("train ended before its second checkpoint: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	cmd.Process.Kill()
	<-exited
	dirs, _ := filepath.Glob(filepath.Join(out, "step-*"))
	last, _ := trainer.DirStep(filepath.Base(dirs[len(dirs)-1]))
	if text, err := runTrainCmd(append(args, "--steps", strconv.Itoa(last+2), "--resume")...); err != nil {
		t.Fatalf("resume from step %d: %v\n%s", last, err, text)
	}
	checkEventsMatchMetrics(t, out)
}

// A resume from an older checkpoint than the newest (the newer ones
// damaged and set aside) trains those steps again: TensorBoard holds each
// once, from the resumed run, where the first run's file kept them too.
func TestTrainResumedFromAnOlderCheckpointLogsEachStepOnceInTensorBoard(t *testing.T) {
	t.Parallel()
	out, args := eventsArgs(t)
	args = append(args, "--steps", "6")
	if text, err := runTrainCmd(args...); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	for _, step := range []string{"step-0000004", "step-0000006"} {
		if err := os.Truncate(filepath.Join(out, step, trainer.ModelFile), 100); err != nil {
			t.Fatal(err)
		}
	}
	text, err := runTrainCmd(append(args, "--resume")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if _, err := os.Stat(filepath.Join(out, "step-0000004.damaged")); err != nil {
		t.Fatalf("the damaged checkpoint was not set aside: %v\n%s", err, text)
	}
	checkEventsMatchMetrics(t, out)
}

// A first call killed after its first checkpoint and before its event
// file was written (what a kill between the two leaves: the checkpoint,
// its metrics lines, no file) has its steps in a file of their own once
// the run resumes: every later file begins after them, and no earlier one
// is there to catch them up.
func TestTrainKilledBeforeItsFirstEventFileKeepsItsStepsInTensorBoard(t *testing.T) {
	t.Parallel()
	out, args := eventsArgs(t)
	if text, err := runTrainCmd(append(args, "--steps", "4")...); err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if err := os.RemoveAll(filepath.Join(out, results.TensorBoardDir)); err != nil {
		t.Fatal(err)
	}
	for _, steps := range []string{"6", "8"} {
		if text, err := runTrainCmd(append(args, "--steps", steps, "--resume")...); err != nil {
			t.Fatalf("resume to step %s: %v\n%s", steps, err, text)
		}
		checkEventsMatchMetrics(t, out)
	}
	if files, _ := filepath.Glob(filepath.Join(out, results.TensorBoardDir, "events.out.tfevents.*")); len(files) != 3 {
		t.Errorf("event files %v; want three: the first stretch's and the two resumed calls'", files)
	}
}
