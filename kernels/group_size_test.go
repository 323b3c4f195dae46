package kernels

import (
	"errors"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// gpus all takes the most GPUs that divide a step's micro-batches and says
// so when that leaves some out; a number is taken as asked.
func TestGroupSizeOfAllGPUsDividesAccumulate(t *testing.T) {
	for _, c := range []struct {
		gpus, seen, accumulate, want int
		notice                       bool
	}{
		{model.AllGPUs, 3, 16, 2, true},
		{model.AllGPUs, 4, 16, 4, false},
		{model.AllGPUs, 8, 2, 2, true},
		{model.AllGPUs, 3, 15, 3, false},
		{model.AllGPUs, 3, 0, 3, false}, // accumulate not known: every GPU
		{model.AllGPUs, 1, 16, 1, false},
		// A number is the user's: kept, and a step it cannot share is
		// refused at the step.
		{3, 3, 16, 3, false},
		{2, 3, 16, 2, false},
	} {
		n, notice, err := groupSize(c.gpus, c.seen, c.accumulate)
		if err != nil || n != c.want || (notice != "") != c.notice {
			t.Errorf("gpus %s, %d seen, accumulate %d: %d, notice %q, %v; want %d, a notice %v",
				model.GPUsString(c.gpus), c.seen, c.accumulate, n, notice, err, c.want, c.notice)
		}
		if c.notice && (!strings.Contains(notice, "gpus all") || !strings.Contains(notice, "training on")) {
			t.Errorf("gpus all on %d GPUs, accumulate %d: notice %q does not say gpus all and what it trains on", c.seen, c.accumulate, notice)
		}
	}
	var ee *model.EngineError
	if _, _, err := groupSize(4, 3, 16); !errors.As(err, &ee) {
		t.Errorf("gpus 4 of 3 seen: %v, want an EngineError", err)
	}
	var un interface{ Unavailable() bool }
	if _, _, err := groupSize(model.AllGPUs, 0, 16); !errors.As(err, &un) || !un.Unavailable() {
		t.Errorf("gpus all with no GPU seen: %v, want an unavailable error", err)
	}
}
