package model

import (
	"context"
	"math"
	"testing"
)

// moeTestConfig is testConfig with 4 experts, 2 a token, each 24 wide, and
// a load-balancing coefficient large enough that its gradient shows.
func moeTestConfig() Config {
	c := testConfig(false)
	c.Experts, c.ExpertsPerTok, c.Intermediate, c.RouterAuxCoef = 4, 2, 24, 0.1
	return c
}

// objective is what ForwardBackward differentiates: the cross-entropy plus
// the coefficient x the load-balancing loss.
func objective(t *testing.T, e *CPUEngine, b Batch) float64 {
	t.Helper()
	a := e.forward(b)
	lm, _, err := e.lossAndGrad(a, b.Targets, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	return lm + e.cfg.RouterAuxCoef*a.aux
}

// Central finite differences agree with the backward pass on the largest
// gradient of every tensor, the routers included: their gradient comes
// through the renormalised top-k weights and the load-balancing loss.
func TestMoEGradientMatchesFiniteDifferences(t *testing.T) {
	c := moeTestConfig()
	e := newTestEngine(t, c, 2, 11)
	b := testBatch(c, 1, 10, 2)
	if err := e.ForwardBackward(b, 1); err != nil {
		t.Fatal(err)
	}
	m, _ := e.Metrics()
	if got := objective(t, e, b); math.Abs(got-m.Loss) > 1e-6*m.Loss || m.AuxLoss <= 0 {
		t.Fatalf("loss %v, objective %v, aux %v", m.Loss, got, m.AuxLoss)
	}
	g := append([]float32(nil), e.g.Data...)
	off := 0
	for _, s := range e.p.Specs() {
		best := off
		for i := off; i < off+s.Elements(); i++ {
			if math.Abs(float64(g[i])) > math.Abs(float64(g[best])) {
				best = i
			}
		}
		const h = 1e-2
		orig := e.p.Data[best]
		e.p.Data[best] = orig + h
		lp := objective(t, e, b)
		e.p.Data[best] = orig - h
		lm := objective(t, e, b)
		e.p.Data[best] = orig
		fd := (lp - lm) / (2 * h)
		if math.Abs(fd-float64(g[best])) > 2e-2*math.Abs(fd)+1e-4 {
			t.Errorf("%s[%d]: backward %g, finite difference %g", s.Name, best-off, g[best], fd)
		}
		off += s.Elements()
	}
}

// The load-balancing loss alone: with the cross-entropy's gradient zeroed,
// the routers' gradient is that of coef x aux, checked by finite
// differences on every router value. The routers are drawn wide (as the
// golden's are) so that routing has clear winners; a value whose nudge
// changes a choice is skipped, since the choices carry no gradient.
func TestMoEAuxLossGradient(t *testing.T) {
	c := moeTestConfig()
	e := newTestEngine(t, c, 1, 5)
	for l := 0; l < c.Layers; l++ {
		for i := range e.pv.layers[l].router {
			e.pv.layers[l].router[i] *= 10
		}
	}
	b := testBatch(c, 2, 8, 3)
	a := e.forward(b)
	var sel []int32
	for _, la := range a.layers {
		sel = append(sel, la.moe.sel...)
	}
	clear(a.logits) // no cross-entropy gradient
	clear(e.g.Data)
	e.backward(a, b, 1)
	aux := func() (float64, bool) {
		a := e.forward(b)
		same := true
		for l, la := range a.layers {
			for i, x := range la.moe.sel {
				same = same && x == sel[l*len(la.moe.sel)+i]
			}
		}
		return a.aux * c.RouterAuxCoef, same
	}
	checked, skipped := 0, 0
	for l := 0; l < c.Layers; l++ {
		w, gw := e.pv.layers[l].router, e.gv.layers[l].router
		for i := range w {
			const h = 1e-3
			orig := w[i]
			w[i] = orig + h
			ap, sameP := aux()
			w[i] = orig - h
			am, sameM := aux()
			w[i] = orig
			if !sameP || !sameM {
				skipped++
				continue
			}
			checked++
			fd := (ap - am) / (2 * h)
			if math.Abs(fd-float64(gw[i])) > 1e-2*math.Abs(fd)+1e-5 {
				t.Errorf("layer %d router[%d]: backward %g, finite difference %g", l, i, gw[i], fd)
			}
		}
	}
	t.Logf("%d router values checked, %d skipped", checked, skipped)
	if skipped > checked/10 {
		t.Errorf("%d router values changed the routing, %d checked: too few checked", skipped, checked)
	}
}

// The trainer's exact resume holds with experts too: the same bits for
// every thread count.
func TestMoEIsDeterministic(t *testing.T) {
	c := moeTestConfig()
	ref := newTestEngine(t, c, 1, 3)
	refLoss := train(t, ref, 3)
	for _, threads := range []int{2, 3} {
		e := newTestEngine(t, c, threads, 3)
		loss := train(t, e, 3)
		for i := range loss {
			if loss[i] != refLoss[i] {
				t.Errorf("threads %d: step %d loss %v, want %v bit for bit", threads, i, loss[i], refLoss[i])
			}
		}
		for i, v := range e.p.Data {
			if math.Float32bits(v) != math.Float32bits(ref.p.Data[i]) {
				t.Fatalf("threads %d: parameter %d differs", threads, i)
			}
		}
	}
}

// Generation with the KV cache through the experts picks, greedily, the
// arg-max of a full forward pass over the sequence so far.
func TestMoEGenerateMatchesFullForward(t *testing.T) {
	c := moeTestConfig()
	e := newTestEngine(t, c, 2, 4)
	prompt := []int32{5, 17, 3, 88, 40}
	out, err := e.Generate(context.Background(), prompt, 8, -1, Sampling{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 8 {
		t.Fatalf("generated %d tokens, want 8", len(out))
	}
	seq := append([]int32(nil), prompt...)
	for i, tok := range out {
		logits, err := e.Logits(Batch{B: 1, T: len(seq), Inputs: seq})
		if err != nil {
			t.Fatal(err)
		}
		last := logits[(len(seq)-1)*c.VocabSize:]
		if want := NewSampler(Sampling{}).Next(last); tok != want {
			t.Fatalf("token %d: cache gave %d, full forward %d", i, tok, want)
		}
		seq = append(seq, tok)
	}
}

// Training with experts lowers the loss, and the load-balancing loss stays
// near its balanced value k (every expert used): no expert starves.
func TestMoETrainingLowersTheLoss(t *testing.T) {
	c := moeTestConfig()
	e := newTestEngine(t, c, 2, 1)
	b := testBatch(c, 2, 16, 42)
	first, _ := e.EvalLoss(b)
	var m StepMetrics
	for s := 0; s < 30; s++ {
		e.ZeroGrad()
		if err := e.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		if err := e.Step(testAdam); err != nil {
			t.Fatal(err)
		}
		m, _ = e.Metrics()
	}
	last, _ := e.EvalLoss(b)
	if !(last < first/2) {
		t.Errorf("loss %v -> %v after 30 steps on one batch: not learning", first, last)
	}
	// Every expert of every layer still gets tokens, and the load-balancing
	// loss stays near its balanced value k.
	for l, la := range e.forward(b).layers {
		for x := 0; x < c.Experts; x++ {
			if la.moe.off[x+1] == la.moe.off[x] {
				t.Errorf("layer %d: expert %d gets no tokens after training", l, x)
			}
		}
	}
	if k := float64(c.ExpertsPerTok); m.AuxLoss > 1.25*k {
		t.Errorf("aux loss %v after training, want near %v (balanced)", m.AuxLoss, k)
	}
}

// Metrics' ExpertShare is each expert's share of the (row, choice) pairs
// of every layer and micro-batch since ZeroGrad: the counts of the
// routing, summed over two micro-batches, then cleared by ZeroGrad. A
// dense model reports none.
func TestExpertShareCountsTheRouting(t *testing.T) {
	c := moeTestConfig()
	e := newTestEngine(t, c, 1, 3)
	b1, b2 := testBatch(c, 2, 16, 1), testBatch(c, 2, 16, 2)
	want := make([]float64, c.Experts)
	for _, b := range []Batch{b1, b2} {
		for _, la := range e.forward(b).layers {
			for x := range want {
				want[x] += float64(la.moe.off[x+1] - la.moe.off[x])
			}
		}
	}
	pairs := float64(2 * c.Layers * 2 * 16 * c.ExpertsPerTok)
	if err := e.ZeroGrad(); err != nil {
		t.Fatal(err)
	}
	for _, b := range []Batch{b1, b2} {
		if err := e.ForwardBackward(b, 0.5); err != nil {
			t.Fatal(err)
		}
	}
	m, err := e.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.ExpertShare) != c.Experts {
		t.Fatalf("expert shares %v; want %d", m.ExpertShare, c.Experts)
	}
	for x, s := range m.ExpertShare {
		if s != want[x]/pairs {
			t.Errorf("expert %d: share %v, want %v of %v pairs", x, s, want[x], pairs)
		}
	}
	if err := e.ZeroGrad(); err != nil {
		t.Fatal(err)
	}
	if m, _ := e.Metrics(); m.ExpertShare != nil {
		t.Errorf("after ZeroGrad: shares %v, want none", m.ExpertShare)
	}
	d := newTestEngine(t, testConfig(false), 1, 3)
	train(t, d, 1)
	if m, _ := d.Metrics(); m.ExpertShare != nil {
		t.Errorf("a dense model reports expert shares %v", m.ExpertShare)
	}
}
