package trainer

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
)

// GlobalBatch is the arithmetic of one optimizer step trained on several
// devices. The run's batch and accumulate keep the meaning they have on one
// device: a step trains Accumulate micro-batches of Batch windows, whatever
// the number of devices, and each device trains Accumulate/Devices of them.
//
// A step is drawn in rounds, one micro-batch per device, in rank order: in
// round j, device r trains the one-device run's micro-batch j*Devices+r.
// Each device's micro-batch is therefore a whole micro-batch of the
// one-device run, with the same windows in the same order, and the step's
// gradient differs from one device's only in the order its micro-batches'
// gradients are summed.
type GlobalBatch struct {
	Batch      int // windows per micro-batch, on every device
	Accumulate int // micro-batches per optimizer step, all devices together
	Devices    int
}

// NewGlobalBatch checks that accumulate micro-batches of batch windows
// split evenly over devices, and refuses a combination that does not in
// one line naming the settings and what to change. Only a number of GPUs
// the run names can be refused: one given by the worker's KILN_GPUS or by
// gpus all is cut to model.DividingGPUs of them before it gets here.
func NewGlobalBatch(batch, accumulate, devices int) (GlobalBatch, error) {
	g := GlobalBatch{Batch: batch, Accumulate: accumulate, Devices: devices}
	var msg string
	switch {
	case devices < 1:
		msg = fmt.Sprintf("gpus must be at least 1, got %d", devices)
	case batch < 1:
		msg = fmt.Sprintf("batch must be at least 1, got %d", batch)
	case accumulate < 1:
		msg = fmt.Sprintf("accumulate must be at least 1, got %d", accumulate)
	case accumulate%devices != 0:
		msg = fmt.Sprintf("accumulate %d is not a multiple of gpus %d: each GPU trains accumulate/gpus micro-batches of every step, so that a step takes the same batch x accumulate windows on any number of GPUs; set accumulate to %s, or train on %s",
			accumulate, devices, multiplesNear(accumulate, devices), gpuCounts(accumulate, devices))
	}
	if msg != "" {
		return g, badInput(errors.New(msg))
	}
	return g, nil
}

// multiplesNear names the multiples of n on either side of a.
func multiplesNear(a, n int) string {
	hi := (a/n + 1) * n
	if lo := a / n * n; lo > 0 {
		return fmt.Sprintf("%d or %d", lo, hi)
	}
	return fmt.Sprint(hi)
}

// gpuCounts names the device counts below devices that divide accumulate.
// None above accumulate does, so the search stops there: a count of
// devices read from a typo ends at once.
func gpuCounts(accumulate, devices int) string {
	var ok []string
	for n := 1; n < devices && n <= accumulate; n++ {
		if accumulate%n == 0 {
			ok = append(ok, fmt.Sprint(n))
		}
	}
	if len(ok) == 1 {
		return "1 GPU"
	}
	return strings.Join(ok[:len(ok)-1], ", ") + " or " + ok[len(ok)-1] + " GPUs"
}

// PerDevice is the number of micro-batches each device trains per step,
// which is also the number of rounds in a step.
func (g GlobalBatch) PerDevice() int { return g.Accumulate / g.Devices }

// Windows is the number of windows of one optimizer step, the same on any
// number of devices.
func (g GlobalBatch) Windows() int { return g.Batch * g.Accumulate }

// Scale is the loss weight of every micro-batch on every device, 1/Accumulate
// (not 1/PerDevice): summed over the devices by the all-reduce, the
// gradients are those of the mean loss over the step's windows, as on one
// device.
func (g GlobalBatch) Scale() float32 { return 1 / float32(g.Accumulate) }

// MicroBatch is the index, among the one-device run's micro-batches of a
// step, of the micro-batch that device rank trains in round j.
func (g GlobalBatch) MicroBatch(rank, j int) int { return j*g.Devices + rank }

// SharedData is Data that the processes of a run on several hosts read
// side by side, each drawing only its own share of every round.
type SharedData interface {
	Data
	// NextShare draws the next round of sh.Ranks blocks of b windows and
	// returns block sh.Rank; the others are passed over. Every process ends
	// the round at the cursor one process drawing the whole round with Next
	// reaches.
	NextShare(ctx context.Context, b, t int, sh tokens.Share) (model.Batch, error)
}

// Round draws the next round of a step: one micro-batch of Batch windows
// of t positions for each device that this process drives, in rank order.
// host is this process's share of the run: tokens.Share{Rank: 0, Ranks: 1}
// on one host, where the round is read with one call of d.Next; with
// several hosts, each drives Devices/host.Ranks devices, ranks
// host.Rank*Devices/host.Ranks on, and d must be SharedData.
func (g GlobalBatch) Round(ctx context.Context, d Data, t int, host tokens.Share) ([]model.Batch, error) {
	if host.Ranks < 1 || host.Rank < 0 || host.Rank >= host.Ranks || g.Devices%host.Ranks != 0 {
		return nil, fmt.Errorf("round of %d devices: host %d of %d cannot drive an equal share of them", g.Devices, host.Rank, host.Ranks)
	}
	local := g.Devices / host.Ranks
	var (
		b   model.Batch
		err error
	)
	if host.Ranks == 1 {
		b, err = d.Next(ctx, local*g.Batch, t)
	} else {
		sd, ok := d.(SharedData)
		if !ok {
			return nil, fmt.Errorf("round of %d devices on %d hosts: data %T cannot be drawn in shares", g.Devices, host.Ranks, d)
		}
		b, err = sd.NextShare(ctx, local*g.Batch, t, host)
	}
	if err != nil {
		return nil, err
	}
	return splitBatch(b, local), nil
}

// splitBatch cuts b into parts micro-batches of b.B/parts windows each,
// which share b's memory.
func splitBatch(b model.Batch, parts int) []model.Batch {
	n := b.B / parts * b.T
	out := make([]model.Batch, parts)
	for i := range out {
		out[i] = model.Batch{B: b.B / parts, T: b.T, Inputs: b.Inputs[i*n : (i+1)*n : (i+1)*n], Targets: b.Targets[i*n : (i+1)*n : (i+1)*n]}
	}
	return out
}

// NextShare draws sh's block of b windows from the next round of sh.Ranks
// blocks, so that a Mixture is SharedData.
func (m *Mixture) NextShare(ctx context.Context, b, t int, sh tokens.Share) (model.Batch, error) {
	if t != m.cfg.SeqLen {
		return model.Batch{}, fmt.Errorf("mixture opened for seq %d, asked for %d", m.cfg.SeqLen, t)
	}
	w := make([]int32, b*(t+1))
	if _, err := m.sampler.NextShare(ctx, w, sh); err != nil {
		return model.Batch{}, err
	}
	return windowsToBatch(w, b, t), nil
}
