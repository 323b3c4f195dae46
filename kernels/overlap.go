package kernels

import "github.com/kiln-lm/kiln/kernels/cuda"

// In the backward pass the weight-gradient GEMMs run on a second stream,
// beside the main stream's input-gradient GEMMs and kernels: nothing but
// the optimizer step reads a weight gradient, and at small batches the
// main stream's kernels leave SMs idle (a wave's tail, a GEMM of a few
// dozen tiles) that they fill. The side stream forks from the main stream
// before each such GEMM (so it sees its operands written) and the main
// stream waits for it before rewriting a scratch buffer the GEMM reads, and
// at the end of the backward pass. Each gradient is still added to by the
// same GEMMs in the same order, so the results do not change. Recorded in
// a graph, the forks and joins become the graph's dependencies.

// What the side stream's GEMMs read that the main stream rewrites later.
const (
	readsDresid = iota // a.dresidb: the residual stream's gradient, rewritten by each norm's backward
	readsDgub          // a.dgub: the gate and up gradient, rewritten by the next layer's SwiGLU backward
	readsDqkv          // a.dqkvb: the q, k, v gradient, rewritten by the next layer's flash backward
	readsLogits        // a.logits: a head chunk's logit gradient, rewritten by the next chunk's forward
	sideReads
)

type overlap struct {
	side    *cuda.Stream
	ws      cuda.Ptr // the side stream's cuBLASLt workspace
	fork    *cuda.Event
	read    [sideReads]*cuda.Event
	all     *cuda.Event
	pending [sideReads]bool
	any     bool
	now     bool // GEMMs are being sent to the side stream
}

// newOverlap makes the side stream; only the bf16 flash path with the
// bf16 head uses it, where every operand of a weight-gradient GEMM already
// has its bf16 copy (no conversion into the main stream's scratch), and
// not with KILN_CUDA_OVERLAP=off.
func (e *Engine) newOverlap() error {
	if !e.flash || e.headMode != (headMode{}) || e.kopt.serialGrads {
		return nil
	}
	o := &overlap{}
	var err error
	if o.side, err = e.dv.NewStream(); err != nil {
		return err
	}
	e.ov = o
	if o.ws, err = e.mem.alloc("cuBLASLt workspace (side stream)", wsBytes); err != nil {
		return err
	}
	if o.fork, err = e.dv.NewMarker(); err != nil {
		return err
	}
	if o.all, err = e.dv.NewMarker(); err != nil {
		return err
	}
	for i := range o.read {
		if o.read[i], err = e.dv.NewMarker(); err != nil {
			return err
		}
	}
	return nil
}

func (o *overlap) destroy() error {
	var first error
	for _, ev := range append([]*cuda.Event{o.fork, o.all}, o.read[:]...) {
		if ev != nil {
			if err := ev.Destroy(); err != nil && first == nil {
				first = err
			}
		}
	}
	if err := o.side.Destroy(); err != nil && first == nil {
		first = err
	}
	return first
}

// overlapping says whether weight gradients go to the side stream: not
// while profiling, whose events time the main stream.
func (e *Engine) overlapping() bool { return e.ov != nil && !e.profiling }

// onSide runs f's GEMMs on the side stream after the main stream's work so
// far; reads names the scratch buffer they read (sideReads: none).
func (e *Engine) onSide(reads int, f func() error) error {
	if !e.overlapping() {
		return f()
	}
	o := e.ov
	if err := o.fork.Record(e.sh); err != nil {
		return err
	}
	if err := o.side.Wait(o.fork); err != nil {
		return err
	}
	e.gs, e.gws, o.now = o.side.Handle(), o.ws, true
	err := f()
	e.gs, e.gws, o.now = e.sh, e.ws, false
	if err != nil {
		return err
	}
	o.any = true
	if reads == sideReads {
		return nil
	}
	o.pending[reads] = true
	return o.read[reads].Record(o.side.Handle())
}

// beforeWrite makes the main stream wait for the side stream's GEMMs that
// read the scratch buffer reads before it rewrites it.
func (e *Engine) beforeWrite(reads int) error {
	if !e.overlapping() || !e.ov.pending[reads] {
		return nil
	}
	e.ov.pending[reads] = false
	return e.st.Wait(e.ov.read[reads])
}

// joinSide makes the main stream wait for all the side stream's work.
func (e *Engine) joinSide() error {
	if !e.overlapping() || !e.ov.any {
		return nil
	}
	o := e.ov
	o.any, o.pending = false, [sideReads]bool{}
	if err := o.all.Record(o.side.Handle()); err != nil {
		return err
	}
	return e.st.Wait(o.all)
}
