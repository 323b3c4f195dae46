package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/trainer"
)

// metricsSteps is the step of every line of a metrics.jsonl, in order,
// repeats kept.
func metricsSteps(t *testing.T, out string) (steps []int, loss map[int]float64) {
	t.Helper()
	f, err := os.Open(filepath.Join(out, trainer.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	loss = map[int]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m trainer.Metrics
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("metrics.jsonl line %q: %v", sc.Text(), err)
		}
		steps = append(steps, m.Step)
		loss[m.Step] = m.LossOr(-1)
	}
	return steps, loss
}

// A disk that fills up while a checkpoint is written ends the run with an
// error naming the run's directory, what its disk has free and what a
// checkpoint needs; the earlier checkpoints stay whole and nothing half
// written is left to resume from. Once space is freed, --resume continues
// the same loss curve (the CPU engine's resume is exact), each step logged
// once in metrics.jsonl and in TensorBoard, where the steps the failed
// checkpoint did not keep were logged before as well.
func TestTrainOnAFullDiskResumesOnceSpaceIsFreed(t *testing.T) {
	t.Parallel()
	_, args := eventsArgs(t)
	// Each run here names its own --out.
	args = append(slices.Delete(args, len(args)-4, len(args)-2), "--steps", "6")
	ref := filepath.Join(t.TempDir(), "ref")
	if text, err := runTrainCmd(append(args, "--out", ref)...); err != nil {
		t.Fatalf("uninterrupted run: %v\n%s", err, text)
	}
	_, want := metricsSteps(t, ref)

	// A checkpoint of the tiny model is about 4.1 MiB: two fit, the third
	// (step 6) does not.
	out := filepath.Join(testsvc.SmallDisk(t, 10<<20), "run")
	text, err := runTrainCmd(append(args, "--out", out)...)
	if err == nil || !strings.Contains(err.Error(), "no space left on device") ||
		!strings.Contains(err.Error(), "the disk of "+out+" has ") || !strings.Contains(err.Error(), "free and a checkpoint of this model takes about") {
		t.Fatalf("a run whose disk filled: %v\n%s", err, text)
	}
	if !strings.Contains(text, "the last checkpoint is "+filepath.Join(out, "step-0000004")+" (step 4): --resume continues from it") {
		t.Errorf("the run's last lines do not say where a resume continues:\n%s", text)
	}
	entries, _ := os.ReadDir(out)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, ".tmp-") || n == "step-0000006" }) {
		t.Errorf("the failed checkpoint left %v", names)
	}
	for _, step := range []string{"step-0000002", "step-0000004"} {
		if _, err := trainer.VerifyCheckpoint(filepath.Join(out, step)); err != nil {
			t.Errorf("an earlier checkpoint is damaged: %v", err)
		}
	}

	if err := os.RemoveAll(filepath.Join(out, "step-0000002")); err != nil {
		t.Fatal(err)
	}
	if text, err := runTrainCmd(append(args, "--out", out, "--resume")...); err != nil {
		t.Fatalf("resume once space was freed: %v\n%s", err, text)
	}
	steps, got := metricsSteps(t, out)
	if !slices.Equal(steps, []int{1, 2, 3, 4, 5, 6}) {
		t.Errorf("metrics.jsonl holds steps %v; want 1 to 6, each once", steps)
	}
	for step, l := range want {
		if got[step] != l {
			t.Errorf("step %d: loss %v after the full disk, %v uninterrupted", step, got[step], l)
		}
	}
	checkEventsMatchMetrics(t, out)
}
