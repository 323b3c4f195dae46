package kernels

import (
	"fmt"

	"github.com/kiln-lm/kiln/kernels/cuda"
)

// On several GPUs a step's gradients can be summed in buckets while the
// backward of the step's last micro-batch still runs (docs/decisions/
// multi-gpu.md): the backward finishes the layers' gradients last layer
// first, so once a few layers are done their range of e.grads is summed
// over the GPUs on a stream of its own, beside the backward of the layers
// below, and only the last bucket (the embedding, which the tied head and
// the embedding's backward both add to, and the layers left) is summed
// after the backward. KILN_NCCL_BUCKET_MB sets the bucket's size; off
// (the default until two GPUs have measured it) sums every gradient in one
// all-reduce after the backward, in Group.Step.
//
// A bucket's range is summed once every gradient in it is final: after its
// lowest layer's backward, with that layer's norms summed into their weight
// gradients (normReduce, which then runs once a bucket instead of once a
// backward: the same sums) and the side stream's weight-gradient GEMMs
// for it done. The sums are element by element, so on two GPUs each gradient is
// g0 + g1 whatever the buckets, as in one all-reduce.

// The summing micro-batch is recorded as a graph of its own, like the
// others, but NCCL's calls are not in it: at each bucket's point the
// backward records events (event record nodes in the graph, which every
// launch records), and the all-reduces are queued from the host after the
// micro-batch, on the buckets' stream, each waiting for its bucket's
// events. NCCL's kernels captured in a graph would hold its communicator,
// and ncclCommAbort waits until every such graph is destroyed, which a GPU
// thread stuck in a wait cannot do: an abort after a failure would wait
// for ever.

// allReducer sums count fp32 values over the GPUs in place on a stream: a
// communicator, through the group, which keeps it whole for the call.
type allReducer interface {
	AllReduceSum(send, recv cuda.Ptr, count int, stream uintptr) error
}

// span is a [lo, hi) range of elements of the flat gradient buffer.
type span struct{ lo, hi int64 }

// bucketPlan says which ranges of the gradients are summed when: after[l]
// once layer l's backward is done (an empty span: nothing), and last after
// the whole backward.
type bucketPlan struct {
	after []span
	last  []span
}

// planBuckets groups the layers into buckets of at least bytes of fp32
// gradients, from the last layer down. layerStart[l] is the first element
// of layer l's gradients (its first norm), layerStart[layers] the first
// after the layers (the final norm), and n every element's count. The
// layers left over when layer 0 is reached go with the embedding before
// them into the last bucket, and so does what follows the layers (the final
// norm, an untied head).
func planBuckets(layerStart []int64, n, bytes int64) bucketPlan {
	layers := len(layerStart) - 1
	p := bucketPlan{after: make([]span, layers)}
	hi := layerStart[layers]
	for l := layers - 1; l >= 0; l-- {
		if (hi-layerStart[l])*4 >= bytes {
			p.after[l] = span{layerStart[l], hi}
			hi = layerStart[l]
		}
	}
	if hi > 0 {
		p.last = append(p.last, span{0, hi})
	}
	if end := layerStart[layers]; end < n {
		p.last = append(p.last, span{end, n})
	}
	return p
}

// buckets is an engine's bucketed all-reduce: a mark for each layer
// whose backward completes a bucket, the last bucket's spans, and the
// stream the sums run on.
type buckets struct {
	// marks[l] is the bucket layer l's backward completes; a layer that
	// completes none has an empty span and no events.
	marks      []bucketMark
	last       []span
	stream     *cuda.Stream
	tail, done *cuda.Event
}

// bucketMark is where a bucket's gradients are final in the backward:
// the main stream's work there (main), and the side stream's GEMMs (side,
// recorded wherever the engine has a side stream, so that a graph and the
// waits queued after it agree whatever ran when it was recorded).
type bucketMark struct {
	span       span
	main, side *cuda.Event
}

// newBuckets sets the engine up to sum its gradients in buckets of bytes;
// a mixture of experts keeps the one all-reduce after the backward.
func (e *Engine) newBuckets(bytes int64) error {
	if bytes <= 0 || e.moe != nil {
		return nil
	}
	starts := make([]int64, e.cfg.Layers+1)
	for l := range starts {
		starts[l] = e.off[e.layerSpec(l, 0)]
	}
	p := planBuckets(starts, e.n, bytes)
	b := &buckets{marks: make([]bucketMark, len(p.after)), last: p.last}
	var err error
	if b.stream, err = e.dv.NewStreamNonBlocking(); err != nil {
		return err
	}
	e.bk = b
	events := []**cuda.Event{&b.tail, &b.done}
	for l, s := range p.after {
		if s.hi > s.lo {
			b.marks[l].span = s
			events = append(events, &b.marks[l].main, &b.marks[l].side)
		}
	}
	for _, ev := range events {
		if *ev, err = e.dv.NewMarker(); err != nil {
			return err
		}
	}
	return nil
}

// count is how many buckets the gradients are summed in.
func (b *buckets) count() int {
	n := 1
	for _, m := range b.marks {
		if m.main != nil {
			n++
		}
	}
	return n
}

func (b *buckets) destroy() error {
	var first error
	events := []*cuda.Event{b.tail, b.done}
	for _, m := range b.marks {
		events = append(events, m.main, m.side)
	}
	for _, ev := range events {
		if ev != nil {
			if err := ev.Destroy(); err != nil && first == nil {
				first = err
			}
		}
	}
	if err := b.stream.Destroy(); err != nil && first == nil {
		first = err
	}
	return first
}

// sumsInBackward says whether the step's last micro-batch sums the
// gradients in buckets as its backward runs: not while profiling, whose
// line for the all-reduce times the whole of it after the backward.
func (e *Engine) sumsInBackward() bool { return e.bk != nil && !e.profiling }

// bucketAfter marks the point where layer l's backward completes a
// bucket, if it does, in the micro-batch that sums (e.summing): the
// bucket's norms are summed into their weight gradients, and events record
// the main stream's work so far and the side stream's.
func (e *Engine) bucketAfter(l int) error {
	if !e.summing {
		return nil
	}
	m := e.bk.marks[l]
	if m.main == nil {
		return nil
	}
	if err := e.normReduce(); err != nil {
		return err
	}
	if err := e.recordMark(m.main, e.sh); err != nil {
		return err
	}
	if e.ov == nil {
		return nil
	}
	// In a capture the side stream has joined it by now: every layer's
	// backward sends GEMMs there. Profiled, it has no work, and the event
	// is recorded on it idle.
	return e.recordMark(m.side, e.ov.side.Handle())
}

// recordMark records ev on stream: in a graph capture as an event record
// node, which each launch of the graph records, and directly otherwise.
func (e *Engine) recordMark(ev *cuda.Event, stream uintptr) error {
	if e.capturing {
		return ev.RecordExternal(stream)
	}
	return ev.Record(stream)
}

// sumBuckets queues the step's sums over the GPUs after its last
// micro-batch's backward was queued: each bucket once its mark's events
// are recorded, the last bucket and the loss after the whole backward;
// the main stream then waits for them all, since the step's norm and
// AdamW read the sums.
func (e *Engine) sumBuckets(red allReducer) error {
	b := e.bk
	h := b.stream.Handle()
	sum := func(spans ...span) error {
		for _, s := range spans {
			p := e.grads + cuda.Ptr(s.lo*4)
			if err := red.AllReduceSum(p, p, int(s.hi-s.lo), h); err != nil {
				return fmt.Errorf("all-reduce of gradients %d to %d: %w", s.lo, s.hi, err)
			}
		}
		return nil
	}
	// In the backward's order, last layer first.
	for l := len(b.marks) - 1; l >= 0; l-- {
		m := b.marks[l]
		if m.main == nil {
			continue
		}
		if err := b.stream.Wait(m.main); err != nil {
			return err
		}
		if e.ov != nil {
			if err := b.stream.Wait(m.side); err != nil {
				return err
			}
		}
		if err := sum(m.span); err != nil {
			return err
		}
	}
	if err := b.tail.Record(e.sh); err != nil {
		return err
	}
	if err := b.stream.Wait(b.tail); err != nil {
		return err
	}
	if err := sum(b.last...); err != nil {
		return err
	}
	if err := red.AllReduceSum(e.lossAcc, e.lossAcc, 1, h); err != nil {
		return err
	}
	if err := b.done.Record(h); err != nil {
		return err
	}
	return e.st.Wait(b.done)
}
