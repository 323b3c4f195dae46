package worker

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
)

// One classification for every handler: what needs a person is archived
// at once (SkipRetry), wrapped or not; everything else is retried.
func TestPermanentErrorsAreArchivedAtOnce(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&ingest.StopError{Msg: "store code reached its limit of 300000 tokens"}, false},
		{&trainer.NonFiniteError{Step: 7}, true},
		{&catalog.MismatchError{}, true},
		{&catalog.NotFoundError{Name: "mix"}, true},
		{&model.MemoryError{Plan: model.MemoryPlan{Batch: 1 << 20}}, true},
		{&scheduler.PayloadError{Kind: "x", Msg: "bad"}, true},
		{fmt.Errorf("step 3: %w", &trainer.NonFiniteError{Step: 3}), true},
		{errors.New("object storage unreachable"), false},
		{fmt.Errorf("read shard: %w", errors.New("connection reset")), false},
	} {
		err := permanent("kind:x", c.err)
		if got := errors.Is(err, asynq.SkipRetry); got != c.want {
			t.Errorf("%T %v: archived at once %v, want %v", c.err, c.err, got, c.want)
		}
		if !strings.HasPrefix(err.Error(), "kind:x: ") || !errors.Is(err, c.err) {
			t.Errorf("%v: not wrapped with its kind", err)
		}
	}
}
