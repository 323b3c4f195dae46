package kernels

import (
	"errors"
	"fmt"
	"maps"
	"unsafe"

	"github.com/kiln-lm/kiln/kernels/cuda"
)

// A training step's device work is recorded once into CUDA graphs and
// replayed: one launch for a micro-batch's forward and backward (one graph
// per batch shape) and one for the optimizer step, instead of some 250
// kernel launches and cuBLASLt calls from the host. What changes from step
// to step reaches the recorded kernels through device memory, staged
// before each replay: the batch's ids and targets (a.ids, a.tgt), the loss
// scale (e.scal), the learning rate and bias corrections (e.scal), the
// embedding gradient's plan (e.plan). The first call at a shape runs
// directly, which tunes its GEMMs and loads their kernels; the second
// records the graph and launches it. Nothing inside the recorded work
// waits for the host or allocates.

// graphFillBytes bounds the memsets a recorded graph runs as fill_u32
// kernels instead (cuda.Graph.MemsetsToKernels): cuBLASLt's 4-byte
// counters; larger fills (the gradients' zeroing) stay memsets, which the
// copy engines run at the memory's rate.
const graphFillBytes = 64 << 10

// graphKey names a recorded graph: a forward-backward's batch shape, and
// whether it marks the points where its step's gradients are summed in
// buckets (buckets.go), or stepGraph for the optimizer step.
type graphKey struct {
	B, T int
	sums bool
}

var stepGraph = graphKey{-1, -1, false}

// recorded is an instantiated graph and the kernel launches it replays, so
// that LaunchCounts stays what running the same work directly would give.
type recorded struct {
	exec     *cuda.GraphExec
	launches map[string]int
	nodes    int
}

// Scalars in e.scal, fp32.
const (
	scalLossScale = 0  // the head's gradient and loss scale: scale / targeted rows
	scalAdamW     = 4  // 7 values: adamw_flat's hp
	scalMoEScale  = 11 // the micro-batch's loss scale, for the load-balancing loss (moe_aux)
	scalCount     = 16
)

// parseGraphs reads KILN_CUDA_GRAPH: unset or "on" records and replays
// training steps as graphs, "off" launches every kernel from the host.
func parseGraphs(v string) (bool, error) {
	switch v {
	case "", "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, &envError{fmt.Sprintf("KILN_CUDA_GRAPH=%q is not a setting it takes: set on or off, or unset it for on", v)}
}

// run runs body, the device work of key: directly when graphs are off or
// profiling is on (its timing waits on each kernel) and at key's first
// call; after that from the graph recorded at the second.
func (e *Engine) run(key graphKey, body func() error) error {
	if !e.graphs || e.profiling {
		return body()
	}
	if g, ok := e.recorded[key]; ok {
		return e.replay(g)
	}
	if !e.warm[key] {
		if err := body(); err != nil {
			return err
		}
		e.warm[key] = true
		return nil
	}
	g, err := e.record(body)
	if err != nil {
		return err
	}
	e.recorded[key] = g
	return e.replay(g)
}

func (e *Engine) replay(g *recorded) error {
	for k, n := range g.launches {
		e.launches[k] += n
	}
	return g.exec.Launch(e.sh)
}

// record captures body's work on the engine's stream into a graph.
func (e *Engine) record(body func() error) (*recorded, error) {
	before := maps.Clone(e.launches)
	if err := e.st.BeginCapture(); err != nil {
		return nil, err
	}
	e.lt.Freeze(true)
	e.capturing = true
	err := body()
	e.capturing = false
	e.lt.Freeze(false)
	g, endErr := e.st.EndCapture()
	counts := map[string]int{}
	for k, n := range e.launches {
		if d := n - before[k]; d > 0 {
			counts[k] = d
		}
	}
	e.launches = before
	if err != nil || endErr != nil {
		if g != nil {
			_ = g.Destroy()
		}
		if err == nil {
			err = endErr
		}
		return nil, fmt.Errorf("recording a CUDA graph (KILN_CUDA_GRAPH=off runs without): %w", err)
	}
	defer g.Destroy()
	if !e.kopt.keepMemsets {
		if _, err := g.MemsetsToKernels(e.fns["fill_u32"], graphFillBytes); err != nil && !errors.Is(err, cuda.ErrNoGraphEdit) {
			return nil, fmt.Errorf("replacing a recorded graph's memsets with kernels (KILN_CUDA_GRAPH_MEMSETS=keep leaves them): %w", err)
		}
	}
	nodes, err := g.Nodes()
	if err != nil {
		return nil, err
	}
	x, err := g.Instantiate()
	if err != nil {
		return nil, fmt.Errorf("instantiating a CUDA graph (KILN_CUDA_GRAPH=off runs without): %w", err)
	}
	return &recorded{exec: x, launches: counts, nodes: nodes}, nil
}

// dropGraphs forgets every recorded graph: a buffer they use is about to
// be freed or replaced.
func (e *Engine) dropGraphs() error {
	var first error
	for k, g := range e.recorded {
		if err := g.exec.Destroy(); err != nil && first == nil {
			first = err
		}
		delete(e.recorded, k)
	}
	return first
}

// GraphNodes reports the operations of each recorded forward-backward
// graph by batch shape ("8x1024", "8x1024+sums" for a step's last
// micro-batch where it marks its buckets) and of the optimizer step's
// ("step").
func (e *Engine) GraphNodes() map[string]int {
	out := map[string]int{}
	_ = e.th.do(func() error {
		for k, g := range e.recorded {
			name := fmt.Sprintf("%dx%d", k.B, k.T)
			if k.sums {
				name += "+sums"
			}
			if k == stepGraph {
				name = "step"
			}
			out[name] = g.nodes
		}
		return nil
	})
	return out
}

// staging is a ring of page-locked host slots through which the host's
// per-step values reach the device in stream order: a copy from one is
// asynchronous, and a slot is reused only once its last copy has run.
type staging struct {
	host  *cuda.HostBuffer
	slot  int // bytes a slot
	done  []*cuda.Event
	next  int
	bytes []byte
}

const stagingSlots = 8

func newStaging(dv *cuda.Device, slotBytes int) (*staging, error) {
	slotBytes = (slotBytes + 255) &^ 255
	h, err := dv.AllocHost(slotBytes * stagingSlots)
	if err != nil {
		return nil, err
	}
	s := &staging{host: h, slot: slotBytes, bytes: h.Bytes()}
	for range stagingSlots {
		ev, err := dv.NewMarker()
		if err != nil {
			s.free()
			return nil, err
		}
		s.done = append(s.done, ev)
	}
	return s, nil
}

func (s *staging) free() error {
	var first error
	for _, ev := range s.done {
		if err := ev.Destroy(); err != nil && first == nil {
			first = err
		}
	}
	if err := s.host.Free(); err != nil && first == nil {
		first = err
	}
	return first
}

// put copies src to dst after the stream's earlier work.
func (s *staging) put(dst cuda.Ptr, src []byte, stream uintptr) error {
	if len(src) > s.slot {
		return fmt.Errorf("staging %d bytes through %d-byte slots", len(src), s.slot)
	}
	i := s.next
	s.next = (s.next + 1) % stagingSlots
	if err := s.done[i].Synchronize(); err != nil {
		return err
	}
	off := i * s.slot
	copy(s.bytes[off:off+len(src)], src)
	if err := s.host.CopyToDevice(dst, off, len(src), stream); err != nil {
		return err
	}
	return s.done[i].Record(stream)
}

// stage copies vals to dst in stream order, through the staging ring.
func stage[T any](e *Engine, dst cuda.Ptr, vals []T) error {
	if len(vals) == 0 {
		return nil
	}
	n := len(vals) * int(unsafe.Sizeof(vals[0]))
	return e.stage.put(dst, unsafe.Slice((*byte)(unsafe.Pointer(&vals[0])), n), e.sh)
}
