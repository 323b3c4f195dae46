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
// joined. The sums are element by element, so on two GPUs each gradient is
// g0 + g1 whatever the buckets, as in one all-reduce.

// The summing micro-batch runs its kernels from the host, not from a
// recorded graph: NCCL's kernels captured in a graph hold its communicator,
// and ncclCommAbort waits until every such graph is destroyed, which a GPU
// thread stuck in a wait could not do, so an abort after a failure would
// wait for ever. The other micro-batches of a step, and the optimizer
// step, are replayed from graphs as before.

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

// buckets is an engine's bucketed all-reduce: the plan, the stream the
// sums run on and the events that order it with the backward's streams.
type buckets struct {
	plan             bucketPlan
	stream           *cuda.Stream
	main, side, done *cuda.Event
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
	b := &buckets{plan: planBuckets(starts, e.n, bytes)}
	var err error
	if b.stream, err = e.dv.NewStreamNonBlocking(); err != nil {
		return err
	}
	e.bk = b
	for _, ev := range []**cuda.Event{&b.main, &b.side, &b.done} {
		if *ev, err = e.dv.NewMarker(); err != nil {
			return err
		}
	}
	return nil
}

func (b *buckets) destroy() error {
	var first error
	for _, ev := range []*cuda.Event{b.main, b.side, b.done} {
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

// bucketAfter sums the bucket that layer l's backward completes, if any,
// while the backward goes on: only in the micro-batch that sums (e.red).
func (e *Engine) bucketAfter(l int) error {
	if e.red == nil {
		return nil
	}
	s := e.bk.plan.after[l]
	if s.hi == s.lo {
		return nil
	}
	if err := e.normReduce(); err != nil {
		return err
	}
	return e.sumSpans([]span{s})
}

// bucketLast sums the last bucket and the loss once the backward is done,
// and makes the main stream wait for every bucket's sum: the step's norm
// and AdamW read them.
func (e *Engine) bucketLast() error {
	if e.red == nil {
		return nil
	}
	b := e.bk
	if err := e.sumSpans(b.plan.last); err != nil {
		return err
	}
	if err := e.red.AllReduceSum(e.lossAcc, e.lossAcc, 1, b.stream.Handle()); err != nil {
		return err
	}
	if err := b.done.Record(b.stream.Handle()); err != nil {
		return err
	}
	return e.st.Wait(b.done)
}

// sumSpans sums spans of the gradients over the GPUs on the buckets'
// stream, after the main stream's work so far and the side stream's.
func (e *Engine) sumSpans(spans []span) error {
	b := e.bk
	if err := b.main.Record(e.sh); err != nil {
		return err
	}
	if err := b.stream.Wait(b.main); err != nil {
		return err
	}
	if e.overlapping() && e.ov.any {
		if err := b.side.Record(e.ov.side.Handle()); err != nil {
			return err
		}
		if err := b.stream.Wait(b.side); err != nil {
			return err
		}
	}
	for _, s := range spans {
		p := e.grads + cuda.Ptr(s.lo*4)
		if err := e.red.AllReduceSum(p, p, int(s.hi-s.lo), b.stream.Handle()); err != nil {
			return fmt.Errorf("all-reduce of gradients %d to %d: %w", s.lo, s.hi, err)
		}
	}
	return nil
}
