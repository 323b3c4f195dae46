package trainer

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/model"
)

// ckWriter writes checkpoints while training goes on: start takes the
// engine's state (on a CUDA engine, a copy into page-locked host memory
// that runs beside the next steps; on others, a plain copy) and a goroutine
// waits for it, writes the step's directory (WriteCheckpoint: every file
// hashed and synced, renamed into place last) and calls the hook. One
// write is in flight at a time, so one host copy of the state is held:
// start waits for the previous write first, and wait is called before the
// run returns, so that every checkpoint a caller is told of is complete.
type ckWriter struct {
	eng       model.Engine
	mc        model.Config
	out       string
	tokenizer []byte
	log       *zap.Logger
	// hook is Hooks.Checkpoint: called from the goroutine once the
	// directory is complete.
	hook func(ctx context.Context, dir string, step int) error
	// beforeWrite, when set, is called from the goroutine before a write
	// (tests hold a write there to see the run go on meanwhile).
	beforeWrite func(step int)

	cur *ckWrite
}

// ckWrite is one write: done is closed when it has ended; dir is set once
// the directory is complete, err when the write or the hook failed.
type ckWrite struct {
	step int
	done chan struct{}
	dir  string
	err  error
}

// start begins writing st's step with the engine's current state; the
// write in flight must have been waited for. The write reports its end
// through wait (or failed).
func (w *ckWriter) start(ctx context.Context, st State) error {
	if w.cur != nil {
		return fmt.Errorf("checkpoint at step %d: the write of step %d has not been waited for", st.Step, w.cur.step)
	}
	state, err := w.copyState()
	if err != nil {
		return fmt.Errorf("checkpoint at step %d: %w", st.Step, err)
	}
	c := &ckWrite{step: st.Step, done: make(chan struct{})}
	w.cur = c
	go func() {
		defer close(c.done)
		p, o, err := state()
		if err != nil {
			c.err = fmt.Errorf("checkpoint at step %d: %w", st.Step, err)
			return
		}
		if w.beforeWrite != nil {
			w.beforeWrite(st.Step)
		}
		dir, err := WriteCheckpoint(ctx, w.out, &Snapshot{Config: w.mc, Params: p, Optimizer: o, Tokenizer: w.tokenizer, State: st})
		if err != nil {
			c.err = err
			return
		}
		c.dir = dir
		w.log.Info("checkpoint", zap.String("dir", dir), zap.Int("step", st.Step))
		if w.hook != nil {
			if err := w.hook(ctx, dir, st.Step); err != nil {
				c.err = fmt.Errorf("checkpoint %s: %w", dir, err)
			}
		}
	}()
	return nil
}

// copyState starts taking the engine's weights and Adam moments and
// returns the function that waits for them.
func (w *ckWriter) copyState() (func() (*model.Params, *model.OptimizerState, error), error) {
	if sc, ok := w.eng.(model.StateCopier); ok {
		return sc.CopyState()
	}
	p := model.NewParams(w.mc)
	if err := w.eng.Params(p); err != nil {
		return nil, err
	}
	o, err := w.eng.OptimizerState()
	if err != nil {
		return nil, err
	}
	return func() (*model.Params, *model.OptimizerState, error) { return p, o, nil }, nil
}

// wait waits for the write in flight and returns it (nil when there was
// none).
func (w *ckWriter) wait() *ckWrite {
	c := w.cur
	if c == nil {
		return nil
	}
	<-c.done
	w.cur = nil
	return c
}

// failed returns the write in flight if it has ended with an error,
// without waiting for one that has not ended.
func (w *ckWriter) failed() *ckWrite {
	c := w.cur
	if c == nil {
		return nil
	}
	select {
	case <-c.done:
		if c.err != nil {
			w.cur = nil
			return c
		}
	default:
	}
	return nil
}

// inFlight is the step of the write in flight, -1 when none.
func (w *ckWriter) inFlight() int {
	if w.cur == nil {
		return -1
	}
	return w.cur.step
}
