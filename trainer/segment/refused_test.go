package segment

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer/results"
)

// A segment whose run's settings can no longer resume its checkpoint (the
// runs file changed the model) fails without touching what the
// run has: its TensorBoard file, summary and metrics in object storage and
// on the disk, and its state in Redis, stay as the last segment left them.
func TestASegmentThatCannotResumeLeavesTheRunsResultsAlone(t *testing.T) {
	p, eventsKey := eightStepSegment(t, "refused")
	ctx := context.Background()
	read := func(key string) []byte {
		t.Helper()
		r, err := p.Objects.Get(ctx, key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		defer r.Close()
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	keys := []string{eventsKey, ResultsPrefix("refused") + results.SummaryFile, ResultsPrefix("refused") + results.MetricsFile}
	before := map[string][]byte{}
	for _, k := range keys {
		before[k] = read(k)
	}
	local := map[string][]byte{}
	root := filepath.Join(p.Dir, "refused")
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (filepath.Base(path) == results.SummaryFile || filepath.Base(path) == results.MetricsFile || filepath.Base(filepath.Dir(path)) == results.TensorBoardDir) {
			b, _ := os.ReadFile(path)
			local[path] = b
		}
		return nil
	})
	if len(local) < 3 {
		t.Fatalf("the first segment left %d result files on its disk under %s; want the summary, the metrics and an event file", len(local), root)
	}

	q := p
	q.Run.Model = "small"
	q.Run.Segment.MaxSteps = 8
	if out, err := Run(ctx, q); err == nil {
		t.Fatalf("a segment of model small resumed a checkpoint of model tiny: %+v", out)
	}
	for _, k := range keys {
		if got := read(k); !bytes.Equal(got, before[k]) {
			t.Errorf("%s in object storage changed by a segment that trained nothing", k)
		}
	}
	files, err := p.Objects.List(ctx, ResultsPrefix("refused")+results.TensorBoardDir+"/")
	if err != nil || len(files) != 1 || files[0].Key != eventsKey {
		t.Errorf("event files in object storage after the refused segment: %v, %v; want %s alone", files, err, eventsKey)
	}
	if st, err := p.Redis.HGetAll(ctx, scheduler.RunStateKey("refused")).Result(); err != nil || st["step"] != "8" {
		t.Errorf("the run's state after the refused segment: %v, %v; want it at step 8 still", st, err)
	}
	for path, b := range local {
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, b) {
			t.Errorf("%s on the disk changed or went: %v", path, err)
		}
	}
}
