package kernels

import (
	"fmt"
	"math"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// A state copy holds the weights and moments of the step it was started
// after, bit for bit, although the engine trains two more steps before it
// is waited for; and the copies change nothing in training: the weights
// after those steps equal those of the same training without copies. One
// engine runs both, so that both use the GEMM algorithms it tuned once.
// With graphs on, the copies start before and after the step's graph is
// recorded.
func TestCopyStateIsTheStepItFollows(t *testing.T) {
	skipWithoutGPU(t)
	c := model.Presets["small"]
	c.Layers = 2
	const B, T = 2, 256
	b := patternBatch(c, B, T)
	p0 := model.InitParams(c, 11)
	type state struct{ params, m, v []float32 }
	read := func(e *Engine) state {
		p := model.NewParams(c)
		if err := e.Params(p); err != nil {
			t.Fatal(err)
		}
		o, err := e.OptimizerState()
		if err != nil {
			t.Fatal(err)
		}
		return state{p.Data, o.M, o.V}
	}
	same := func(what string, want, have state) {
		t.Helper()
		for _, x := range []struct {
			name       string
			want, have []float32
		}{{"weights", want.params, have.params}, {"first moments", want.m, have.m}, {"second moments", want.v, have.v}} {
			if len(x.want) != len(x.have) {
				t.Fatalf("%s: %s hold %d values, want %d", what, x.name, len(x.have), len(x.want))
			}
			for i := range x.want {
				if math.Float32bits(x.want[i]) != math.Float32bits(x.have[i]) {
					t.Fatalf("%s: %s[%d] = %g, want %g", what, x.name, i, x.have[i], x.want[i])
				}
			}
		}
	}
	step := func(e *Engine, s int) {
		t.Helper()
		if err := e.ZeroGrad(); err != nil {
			t.Fatal(err)
		}
		if err := e.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		o := benchAdamW
		o.LR = 1e-3 * float64(s+1)
		if err := e.Step(o); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Metrics(); err != nil {
			t.Fatal(err)
		}
	}
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
	reset := func() {
		if err := e.SetParams(p0); err != nil {
			t.Fatal(err)
		}
		n := len(p0.Data)
		if err := e.SetOptimizerState(&model.OptimizerState{M: make([]float32, n), V: make([]float32, n)}); err != nil {
			t.Fatal(err)
		}
	}
	const steps = 7
	// Copies after steps 2 and 5 (the step graph is recorded at the
	// second step), each waited for two steps later.
	reset()
	copied := map[int]state{}
	var wait func() (*model.Params, *model.OptimizerState, error)
	var waitFor int
	for s := range steps {
		step(e, s)
		if wait != nil && s == waitFor+2 {
			p, o, err := wait()
			if err != nil {
				t.Fatal(err)
			}
			if o.Step != waitFor+1 {
				t.Fatalf("the copy after step %d says optimizer step %d", waitFor+1, o.Step)
			}
			copied[waitFor] = state{append([]float32(nil), p.Data...), append([]float32(nil), o.M...), append([]float32(nil), o.V...)}
			wait = nil
		}
		if s == 1 || s == 4 {
			var err error
			if wait, err = e.CopyState(); err != nil {
				t.Fatal(err)
			}
			waitFor = s
		}
	}
	if len(copied) != 2 {
		t.Fatalf("%d copies waited for, want 2", len(copied))
	}
	last := read(e)
	// The same training without copies, read after every step.
	reset()
	var want []state
	for s := range steps {
		step(e, s)
		want = append(want, read(e))
	}
	for s, st := range copied {
		same(fmt.Sprintf("the copy after step %d", s+1), want[s], st)
	}
	same("the last step of the training with copies", want[steps-1], last)
}
