package kernels

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// A checkpoint's copy of the training state (the fp32 weights and both Adam
// moments) runs on a stream of its own, into page-locked host memory, while
// the main stream goes on with the next steps: the copy starts once the
// main stream has reached the point where CopyState was called (an event),
// and the next optimizer step, the only work that writes what is copied,
// waits on the device for the copy to end (another event). The host waits
// only in the copy's wait function, which the trainer calls from the
// goroutine that writes the checkpoint.

// stateCopy is the host buffer and stream of CopyState, made at its first
// call.
type stateCopy struct {
	host    *cuda.HostBuffer
	vals    []float32 // host as 3n values: weights, first moments, second moments
	stream  *cuda.Stream
	ready   *cuda.Event // the main stream reached CopyState
	copied  *cuda.Event // the copy stream finished copying
	pending bool        // a copy the next optimizer step has not yet waited for
	waiting atomic.Bool // a copy whose wait function has not returned
}

// CopyState implements model.StateCopier.
func (e *Engine) CopyState() (func() (*model.Params, *model.OptimizerState, error), error) {
	var (
		c    *stateCopy
		step int
	)
	err := e.th.do(func() error {
		if e.ck != nil && e.ck.waiting.Load() {
			return fmt.Errorf("a state copy is still waited for: wait for it before the next")
		}
		if e.ck == nil {
			if err := e.newStateCopy(); err != nil {
				return err
			}
		}
		c, step = e.ck, e.optStep
		if err := c.ready.Record(e.sh); err != nil {
			return err
		}
		if err := c.stream.Wait(c.ready); err != nil {
			return err
		}
		n := int(e.n) * 4
		for i, src := range []cuda.Ptr{e.params, e.m, e.v} {
			if err := c.host.CopyFromDevice(i*n, src, n, c.stream.Handle()); err != nil {
				return err
			}
		}
		if err := c.copied.Record(c.stream.Handle()); err != nil {
			return err
		}
		c.pending = true
		c.waiting.Store(true)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("copy the training state: %w", err)
	}
	wait := func() (*model.Params, *model.OptimizerState, error) {
		err := syncOffThread(e.dv, c.copied)
		c.waiting.Store(false)
		if err != nil {
			return nil, nil, fmt.Errorf("copy the training state: %w", err)
		}
		n := int(e.n)
		p, err := model.ParamsOver(e.cfg, c.vals[:n:n])
		if err != nil {
			return nil, nil, err
		}
		return p, &model.OptimizerState{Step: step, M: c.vals[n : 2*n : 2*n], V: c.vals[2*n:]}, nil
	}
	return wait, nil
}

// syncOffThread waits for ev from the calling goroutine, not the engine's
// thread, which goes on issuing work meanwhile; the thread it runs on needs
// the device's context current for the driver call.
func syncOffThread(dv *cuda.Device, ev *cuda.Event) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := dv.MakeCurrent(); err != nil {
		return err
	}
	return ev.Synchronize()
}

func (e *Engine) newStateCopy() error {
	c := &stateCopy{}
	var err error
	if c.stream, err = e.dv.NewStreamNonBlocking(); err != nil {
		return err
	}
	e.ck = c
	if c.ready, err = e.dv.NewMarker(); err != nil {
		return err
	}
	if c.copied, err = e.dv.NewMarker(); err != nil {
		return err
	}
	if c.host, err = e.dv.AllocHost(int(3 * e.n * 4)); err != nil {
		return fmt.Errorf("page-locked host memory for checkpoints (%d MiB): %w", 3*e.n*4>>20, err)
	}
	c.vals = unsafe.Slice((*float32)(unsafe.Pointer(&c.host.Bytes()[0])), 3*e.n)
	return nil
}

// beforeStateWrite makes the main stream's later work wait on the device
// for a state copy in flight: called before the optimizer step, outside
// any graph capture, since the step overwrites what is copied.
func (e *Engine) beforeStateWrite() error {
	if e.ck == nil || !e.ck.pending {
		return nil
	}
	e.ck.pending = false
	return e.st.Wait(e.ck.copied)
}

// settleStateCopy waits on the host for a state copy in flight, before
// the synchronous copies of SetParams and SetOptimizerState (which the
// copy stream does not order itself with) and before Close frees the
// buffer.
func (e *Engine) settleStateCopy() error {
	if e.ck == nil {
		return nil
	}
	return e.ck.copied.Synchronize()
}

// freeStateCopy releases CopyState's buffer, stream and events.
func (e *Engine) freeStateCopy() error {
	c := e.ck
	if c == nil {
		return nil
	}
	e.ck = nil
	var errs []error
	if c.stream != nil {
		errs = append(errs, c.stream.Synchronize(), c.stream.Destroy())
	}
	for _, ev := range []*cuda.Event{c.ready, c.copied} {
		if ev != nil {
			errs = append(errs, ev.Destroy())
		}
	}
	if c.host != nil {
		errs = append(errs, c.host.Free())
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
