package kernels

import (
	"fmt"
	"unsafe"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// A step's metrics (the loss, the gradient norm and, with experts, the
// load-balancing loss and the experts' shares) are copied on the main
// stream, after the step's optimizer, into one of two slots of page-locked
// host memory: MetricsLater (model.MetricsAhead) queues the copy and
// returns, and its wait function waits for that copy alone. The trainer
// calls it once step n + 1 is queued, so the device goes from one step to
// the next without waiting for the host (docs/decisions/step-ahead.md).

// metricsCopy is MetricsLater's host memory and events, made at its first
// call: slot i holds floats [loss, norm, aux, shares...] at i x stride.
type metricsCopy struct {
	host   *cuda.HostBuffer
	vals   []float32
	stride int // floats a slot
	done   [2]*cuda.Event
	gen    [2]uint64 // copies queued into each slot
	next   int
}

// MetricsLater implements model.MetricsAhead.
func (e *Engine) MetricsLater() (func() (model.StepMetrics, error), error) {
	var (
		slot int
		gen  uint64
	)
	err := e.th.do(func() error {
		if e.ahead == nil {
			if err := e.newMetricsCopy(); err != nil {
				return err
			}
		}
		c := e.ahead
		slot, c.next = c.next, 1-c.next
		c.gen[slot]++
		gen = c.gen[slot]
		off := slot * c.stride * 4
		if err := c.host.CopyFromDevice(off, e.lossAcc, 4, e.sh); err != nil {
			return err
		}
		if err := c.host.CopyFromDevice(off+4, e.norm, 4, e.sh); err != nil {
			return err
		}
		if e.moe != nil {
			if err := c.host.CopyFromDevice(off+8, e.moe.auxAcc, 4, e.sh); err != nil {
				return err
			}
			if err := c.host.CopyFromDevice(off+12, e.moe.shareAcc, 4*e.cfg.Experts, e.sh); err != nil {
				return err
			}
		}
		return c.done[slot].Record(e.sh)
	})
	if err != nil {
		return nil, fmt.Errorf("queue the step's metrics: %w", err)
	}
	return func() (model.StepMetrics, error) {
		var m model.StepMetrics
		err := e.th.do(func() error {
			c := e.ahead
			if c == nil || c.gen[slot] != gen {
				return fmt.Errorf("the step's metrics were overwritten: read them before the second MetricsLater after theirs")
			}
			if err := c.done[slot].Synchronize(); err != nil {
				return err
			}
			v := c.vals[slot*c.stride : (slot+1)*c.stride]
			m.Loss, m.GradNorm = float64(v[0]), float64(v[1])
			if e.moe != nil {
				m.AuxLoss = float64(v[2])
				m.ExpertShare = expertShares(v[3 : 3+e.cfg.Experts])
			}
			return nil
		})
		return m, err
	}, nil
}

// expertShares is each expert's share of the routing from the rows it
// was given (moe.shareAcc).
func expertShares(counts []float32) []float64 {
	share := make([]float64, len(counts))
	for i, c := range counts {
		share[i] = float64(c)
	}
	return model.Shares(share)
}

func (e *Engine) newMetricsCopy() error {
	c := &metricsCopy{stride: (3 + e.cfg.Experts + 15) &^ 15}
	e.ahead = c
	for i := range c.done {
		var err error
		if c.done[i], err = e.dv.NewMarker(); err != nil {
			return err
		}
	}
	var err error
	if c.host, err = e.dv.AllocHost(2 * c.stride * 4); err != nil {
		return err
	}
	c.vals = unsafe.Slice((*float32)(unsafe.Pointer(&c.host.Bytes()[0])), 2*c.stride)
	return nil
}

func (e *Engine) freeMetricsCopy() error {
	c := e.ahead
	if c == nil {
		return nil
	}
	e.ahead = nil
	var first error
	for _, ev := range c.done {
		if ev != nil {
			if err := ev.Destroy(); err != nil && first == nil {
				first = err
			}
		}
	}
	if c.host != nil {
		if err := c.host.Free(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
