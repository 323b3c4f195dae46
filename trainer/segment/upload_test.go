package segment

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/trainer"
)

// A checkpoint pushed once the uploader's loop has returned (a stop's last
// checkpoint, written after the upload grace ended) prunes the local ones
// itself: no upload's end will, and the disk keeps the newest two, as at
// any other time, not three.
func TestACheckpointPushedAfterTheGraceKeepsTheNewestTwo(t *testing.T) {
	obj, _ := newS3(t)
	run := testRun("late", 100)
	dir := t.TempDir()
	mkStep := func(s int) string {
		d := filepath.Join(dir, trainer.StepDir(s))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, s := range []int{8, 10} {
		mkStep(s)
	}
	graceOver, cancel := context.WithCancel(context.Background())
	cancel()
	u := newUploader(graceOver, Params{Run: run, Objects: obj}, nil, dir, run.RunConfig, 10, zap.NewNop(), nil)
	go u.loop()
	<-u.done
	if got := localSteps(dir); !slices.Equal(got, []int{8, 10}) {
		t.Fatalf("local checkpoints %v before the push; want [8 10] untouched", got)
	}
	u.push(mkStep(12), 12)
	if got := localSteps(dir); !slices.Equal(got, []int{10, 12}) {
		t.Errorf("local checkpoints %v after the last push; want the newest two, [10 12]", got)
	}
	if err := u.finish(false); err == nil {
		t.Error("finish: nil; want step 12's upload named as not done")
	}
}
