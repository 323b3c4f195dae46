package main

import (
	"os"
	"path/filepath"
	"testing"
)

// sched train given a run's name, as sched enqueue train takes it, says
// both ways to train it: queued by its name, or here with the stores and
// the model named. A run of KILN_RUNS's file is a run's name too; any
// other word is refused as before.
func TestTrainGivenARunsNameSaysHowToTrainIt(t *testing.T) {
	t.Parallel()
	wantRefused(t, nil, "sched train takes no run name: 'sched enqueue train pilot' queues run pilot for a worker; to train here and now, name the token stores with --tokens", "train", "pilot")
	file := filepath.Join(t.TempDir(), "runs.yaml")
	os.WriteFile(file, []byte("mine:\n  from: pilot-cpu\n"), 0o644)
	wantRefused(t, []string{"KILN_RUNS=" + file}, "'sched enqueue train mine' queues run mine", "train", "mine")
	wantRefused(t, nil, `sched train expects no arguments (got 1: ["pilot2"])`, "train", "pilot2")
}
