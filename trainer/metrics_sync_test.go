package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/model"
)

// A checkpoint makes the steps up to its own the run's history for good (a
// resume truncates metrics.jsonl to it), so their lines are synced before
// its write begins, and so before its rename: after a power cut no durable
// checkpoint stands past lines that were lost. A sync's effect cannot be
// seen without a power cut; its order against the write, once for each
// checkpoint, and the lines the file held when it was synced can.
func TestMetricsAreSyncedBeforeEachCheckpoint(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	rc := testRun(6)
	rc.CheckpointEvery = 2
	out := t.TempDir()
	var (
		mu     sync.Mutex
		events []string
	)
	record := func(e string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	}
	cfg := Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000),
		metricsSynced: func(step int) {
			// On the training loop, so nothing is appended meanwhile: the
			// file holds each step's line up to the checkpoint's, none after.
			got, err := loggedSteps(filepath.Join(out, MetricsFile))
			if err != nil {
				t.Errorf("metrics synced for step %d: %v", step, err)
			}
			var want []int
			for s := 1; s <= step; s++ {
				want = append(want, s)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("metrics synced for step %d held steps %v, want %v", step, got, want)
			}
			record(fmt.Sprintf("sync %d", step))
		},
		beforeWrite: func(step int) { record(fmt.Sprintf("write %d", step)) },
	}
	res, err := Run(context.Background(), cfg, Hooks{})
	if err != nil || !res.Done {
		t.Fatalf("run: %+v %v", res, err)
	}
	want := []string{"sync 2", "write 2", "sync 4", "write 4", "sync 6", "write 6"}
	if !reflect.DeepEqual(events, want) {
		t.Fatalf("events %v, want %v", events, want)
	}
}

// A resume rewrites metrics.jsonl through a synced temporary file renamed
// into place: the steps past the checkpoint go, the rest are kept, and no
// temporary file is left beside it.
func TestResumeTruncatesMetricsThroughARename(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	rc := testRun(6)
	rc.CheckpointEvery = 2
	out := t.TempDir()
	if res, err := Run(context.Background(), Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), MaxSteps: 3}, Hooks{}); err != nil || res.Step != 3 {
		t.Fatalf("first call: %+v %v", res, err)
	}
	// Step 3 was checkpointed at the call's end; without it the resume is
	// from step 2 and step 3's line must go.
	if err := os.RemoveAll(filepath.Join(out, StepDir(3))); err != nil {
		t.Fatal(err)
	}
	var synced []int
	cfg := Config{Run: rc, Out: out, Resume: true, Data: newSliceData(vocab, 20000), MaxSteps: 2,
		metricsSynced: func(step int) { synced = append(synced, step) }}
	if res, err := Run(context.Background(), cfg, Hooks{}); err != nil || res.Step != 4 {
		t.Fatalf("resumed call: %+v %v", res, err)
	}
	got, err := loggedSteps(filepath.Join(out, MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{1, 2, 3, 4}; !reflect.DeepEqual(got, want) {
		t.Errorf("logged steps %v, want %v (each once)", got, want)
	}
	if !reflect.DeepEqual(synced, []int{4}) {
		t.Errorf("metrics synced for checkpoints %v, want step 4's", synced)
	}
	if _, err := os.Stat(filepath.Join(out, MetricsFile+".tmp")); !os.IsNotExist(err) {
		t.Errorf("temporary file of the rewrite left: %v", err)
	}
}

// loggedSteps is the steps of the complete lines of the metrics file.
func loggedSteps(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var steps []int
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if !bytes.HasSuffix(line, []byte("\n")) {
			return steps, fmt.Errorf("torn last line %q", line)
		}
		var m Metrics
		if err := json.Unmarshal(line, &m); err != nil {
			return steps, fmt.Errorf("line %q: %w", line, err)
		}
		steps = append(steps, m.Step)
	}
	return steps, nil
}

// A duration bound shorter than a call's setup still takes one step, and a
// resume under it one more: a call that ended before its first step left
// the next to end the same way, and a segment chain never advanced.
func TestADurationBoundTakesAtLeastOneStep(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	rc := testRun(6)
	out := t.TempDir()
	for i, want := range []int{1, 2} {
		cfg := Config{Run: rc, Out: out, Resume: i > 0, Data: newSliceData(vocab, 20000), MaxDuration: time.Nanosecond}
		if res, err := Run(context.Background(), cfg, Hooks{}); err != nil || res.Step != want {
			t.Fatalf("call %d under a 1ns bound: %+v %v; want step %d", i+1, res, err, want)
		}
	}
}
