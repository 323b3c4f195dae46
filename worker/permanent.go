package worker

import (
	"errors"
	"fmt"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/trainer"
)

// permanent wraps a handler's error with its kind and marks the errors a
// retry cannot fix, so the task is archived at once with its message
// instead of failing the same way for hours (isPermanent says which). Every
// handler classifies its errors here and nowhere else.
func permanent(kind string, err error) error {
	if isPermanent(err) {
		return fmt.Errorf("%s: %w (%w)", kind, err, asynq.SkipRetry)
	}
	return fmt.Errorf("%s: %w", kind, err)
}

// isPermanent is kiln's one classification of errors that need a person, not
// another attempt: bad input (an unknown name, a gated dataset, a refused
// overwrite, a size no device holds: any error whose BadInput says so),
// token stores made by another tokenizer than the run's
// (catalog.MismatchError is bad input), and a training run that diverged.
// A retry of any of them meets the same failure.
func isPermanent(err error) bool {
	var bad interface{ BadInput() bool }
	var diverged *trainer.NonFiniteError
	return errors.As(err, &diverged) || (errors.As(err, &bad) && bad.BadInput())
}

// atLimit says why an ingest step ended at its ingest's --max-tokens or
// --max-disk, or "", and the tokens it appended first: the end the user
// planned when they sized the store, so its task completes (progress
// state "stopped") rather than failing, and a retry would only stop
// again.
func atLimit(err error) (msg string, taken int64) {
	var stop *ingest.StopError
	if errors.As(err, &stop) {
		return stop.Msg, stop.Tokens
	}
	return "", 0
}
