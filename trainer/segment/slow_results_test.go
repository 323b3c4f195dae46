package segment

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/trainer"
)

// The warning of a slow upload says what holds it, and whether training
// goes on: a store slow to take the results after a checkpoint's push was
// warned of as a slow upload, with "training goes on", after the
// checkpoint was in object storage and training was over.
func TestASlowUploadIsWarnedOfAsWhatHoldsIt(t *testing.T) {
	ctx := context.Background()
	through, faults, _ := faultyS3(t)
	rdb := newRedis(t)
	run := testRun("slowresults", 6)
	held := faults.Add(testsvc.Fault{Method: "PUT", Path: "/" + ResultsPrefix("slowresults"), Action: testsvc.Hold})
	core, logs := observer.New(zap.InfoLevel)
	var step atomic.Int64
	done := make(chan error, 1)
	go func() {
		out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a",
			Log: zap.New(core), SlowUpload: 20 * time.Millisecond,
			Progress: func(s, _ int, m *trainer.Metrics) {
				if m != nil {
					step.Store(int64(s))
				}
			}})
		if err == nil && (!out.Done || out.Uploaded != 6) {
			t.Errorf("the segment: %+v; want the run done, step 6 uploaded", out)
		}
		done <- err
	}()
	slow := func(what string) bool {
		for _, e := range logs.FilterMessageSnippet(" slow; training").All() {
			if strings.Contains(e.Message, what) {
				return true
			}
		}
		return false
	}
	waitFor(t, "the end of training", func() bool { return step.Load() == 6 })
	waitFor(t, "a warning that the segment, its training over, waits for them", func() bool {
		return slow("checkpoint uploaded, and the retention and results after it are slow; training is over, and the segment waits for it")
	})
	close(held.Release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
