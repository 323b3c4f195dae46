package worker

import (
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/trainer"
)

// A run that names no gpus takes the worker's KILN_GPUS, as many of them as
// divide its accumulate, and says so when that is fewer; a run that names a
// number keeps it (the segment refuses it at its start, as enqueue does).
func TestRunGPUsTakesTheWorkersThatDivideAccumulate(t *testing.T) {
	all := trainer.GPUCount(model.AllGPUs)
	for _, c := range []struct {
		named, worker trainer.GPUCount
		accumulate    int
		want          trainer.GPUCount
		notice        bool
	}{
		{0, 3, 16, 2, true},
		{0, 4, 16, 4, false},
		{0, 3, 18, 3, false},
		{0, 0, 16, 0, false},
		{0, 1, 16, 1, false},
		{0, all, 16, all, false}, // the engine counts the GPUs
		{3, 4, 16, 3, false},
		{3, 0, 16, 3, false},
		{all, 2, 16, all, false},
	} {
		got, notice := runGPUs(c.named, c.worker, c.accumulate)
		if got != c.want || (notice != "") != c.notice {
			t.Errorf("run gpus %s, KILN_GPUS %s, accumulate %d: %s, notice %q; want %s, a notice %v",
				c.named, c.worker, c.accumulate, got, notice, c.want, c.notice)
		}
	}
	_, notice := runGPUs(0, 3, 16)
	for _, want := range []string{"KILN_GPUS is 3", "training on 2", "15 or 18"} {
		if !strings.Contains(notice, want) {
			t.Errorf("notice %q does not say %q", notice, want)
		}
	}
}
