package trainer

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kiln-lm/kiln/model"
)

// Data supplies the windows a run trains and evaluates on. The token-store
// mixture (OpenMixture) implements it; the loop asks nothing else of its
// data, so a resumed run needs only the cursor to continue exactly.
type Data interface {
	// Next returns the next training micro-batch: b windows of t+1 ids,
	// split into inputs and next-token targets.
	Next(ctx context.Context, b, t int) (model.Batch, error)
	// Eval returns held-out micro-batch i; the same i gives the same batch
	// at every evaluation, so that evaluation losses are comparable.
	Eval(ctx context.Context, i, b, t int) (model.Batch, error)
	// Cursor is the position in the training stream; Seek returns to it.
	Cursor() (json.RawMessage, error)
	Seek(cursor json.RawMessage) error
	Close() error
}

// StoreEval is Data over several stores that can also evaluate each store
// alone (the token-store mixture does): the trainer then logs each store's
// held-out loss beside the mixed one, which tells a plateau of one kind of
// text from the others'.
type StoreEval interface {
	// EvalStores names the stores, in order.
	EvalStores() []string
	// EvalStore returns held-out batch i of store s; ok is false when the
	// store holds no held-out window.
	EvalStore(ctx context.Context, s, i, b, t int) (batch model.Batch, ok bool, err error)
}

// HeldOutLister is Data over several stores that can say which of them
// hold no held-out window (the token-store mixture can): the trainer warns
// at its start that the run's evaluation leaves them out, where it said
// nothing and the mixed eval loss, and the gates judged on it, covered the
// other stores alone.
type HeldOutLister interface {
	WithoutHeldOut() []ShortStore
}

// checkIDs reports the first id of b outside the vocabulary. The stores are
// checked when opened; this guards the engines (which index embedding rows
// with these ids) against a store whose manifest lies.
func checkIDs(b model.Batch, vocab int) error {
	for i, id := range b.Inputs {
		if id < 0 || int(id) >= vocab {
			return badInput(fmt.Errorf("token id %d at position %d of the batch is outside the model's vocabulary of %d: the token store was made with another tokenizer; retokenize it or pick a model with a larger vocab_size", id, i, vocab))
		}
	}
	for i, id := range b.Targets {
		if id < -1 || int(id) >= vocab {
			return badInput(fmt.Errorf("target id %d at position %d of the batch is outside the model's vocabulary of %d: the token store was made with another tokenizer; retokenize it or pick a model with a larger vocab_size", id, i, vocab))
		}
	}
	return nil
}

// windowsToBatch splits b windows of t+1 ids into inputs and targets.
func windowsToBatch(windows []int32, b, t int) model.Batch {
	batch := model.Batch{B: b, T: t, Inputs: make([]int32, b*t), Targets: make([]int32, b*t)}
	for i := 0; i < b; i++ {
		w := windows[i*(t+1) : (i+1)*(t+1)]
		copy(batch.Inputs[i*t:(i+1)*t], w[:t])
		copy(batch.Targets[i*t:(i+1)*t], w[1:])
	}
	return batch
}
