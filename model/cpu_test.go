package model

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// testConfig is small enough for quick tests yet has grouped-query
// attention (2 query heads per key/value head) and untied embeddings.
func testConfig(tied bool) Config {
	return Config{VocabSize: 97, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Intermediate: 48,
		MaxPositions: 64, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: tied, BOSTokenID: 1, EOSTokenID: 0, InitializerRange: 0.1}
}

func testBatch(c Config, B, T int, seed int32) Batch {
	b := Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
	x := seed
	for i := range b.Inputs {
		x = (x*1103515245 + 12345) & 0x7fffffff
		b.Inputs[i] = x % int32(c.VocabSize)
	}
	for i := range b.Targets {
		if (i+1)%T == 0 {
			b.Targets[i] = -1
		} else {
			b.Targets[i] = b.Inputs[i+1]
		}
	}
	return b
}

func newTestEngine(t testing.TB, c Config, threads int, seed uint64) *CPUEngine {
	t.Helper()
	e, err := NewCPUEngine(c, Options{Threads: threads})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetParams(InitParams(c, seed)); err != nil {
		t.Fatal(err)
	}
	return e
}

var testAdam = AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}

func train(t testing.TB, e *CPUEngine, steps int) []float64 {
	t.Helper()
	var losses []float64
	for s := 0; s < steps; s++ {
		if err := e.ZeroGrad(); err != nil {
			t.Fatal(err)
		}
		if err := e.ForwardBackward(testBatch(e.cfg, 2, 16, int32(s)), 1); err != nil {
			t.Fatal(err)
		}
		if err := e.Step(testAdam); err != nil {
			t.Fatal(err)
		}
		m, _ := e.Metrics()
		losses = append(losses, m.Loss)
	}
	return losses
}

// The trainer's exact resume relies on bit-identical steps: the same inputs
// give the same bits, run after run and for any thread count.
func TestCPUEngineIsDeterministic(t *testing.T) {
	c := testConfig(true)
	ref := newTestEngine(t, c, 1, 3)
	refLoss := train(t, ref, 3)
	for _, threads := range []int{1, 2, 3} {
		e := newTestEngine(t, c, threads, 3)
		loss := train(t, e, 3)
		for i := range loss {
			if loss[i] != refLoss[i] {
				t.Errorf("threads %d: step %d loss %v, want %v bit for bit", threads, i, loss[i], refLoss[i])
			}
		}
		for i, v := range e.p.Data {
			if math.Float32bits(v) != math.Float32bits(ref.p.Data[i]) {
				t.Fatalf("threads %d: parameter %d differs: %v vs %v", threads, i, v, ref.p.Data[i])
			}
		}
		for i, v := range e.opt.V {
			if v != ref.opt.V[i] {
				t.Fatalf("threads %d: second moment %d differs", threads, i)
			}
		}
	}
}

// Two half batches accumulated with scale 1/2 equal one batch of both: the
// loss and every gradient, to fp32 rounding.
func TestAccumulationEqualsLargerBatch(t *testing.T) {
	for _, tied := range []bool{true, false} {
		c := testConfig(tied)
		whole := testBatch(c, 2, 12, 5)
		half := func(i int) Batch {
			return Batch{B: 1, T: 12, Inputs: whole.Inputs[i*12 : (i+1)*12], Targets: whole.Targets[i*12 : (i+1)*12]}
		}
		e1 := newTestEngine(t, c, 2, 9)
		if err := e1.ForwardBackward(whole, 1); err != nil {
			t.Fatal(err)
		}
		e2 := newTestEngine(t, c, 2, 9)
		for i := 0; i < 2; i++ {
			if err := e2.ForwardBackward(half(i), 0.5); err != nil {
				t.Fatal(err)
			}
		}
		m1, _ := e1.Metrics()
		m2, _ := e2.Metrics()
		if math.Abs(m1.Loss-m2.Loss) > 1e-6*m1.Loss {
			t.Errorf("tied=%v: loss %v accumulated vs %v whole", tied, m2.Loss, m1.Loss)
		}
		gmax := maxAbs(e1.g.Data)
		if d := maxAbsDiff(e1.g.Data, e2.g.Data); d > 1e-5*gmax {
			t.Errorf("tied=%v: gradients differ by %g (largest %g)", tied, d, gmax)
		}
	}
}

// Central finite differences of the loss agree with the backward pass on a
// sample of parameters from every tensor; fp64 is not available, so the
// step and tolerance are chosen for fp32 losses near 4.6.
func TestGradientMatchesFiniteDifferences(t *testing.T) {
	c := testConfig(false)
	e := newTestEngine(t, c, 2, 11)
	b := testBatch(c, 1, 10, 2)
	if err := e.ForwardBackward(b, 1); err != nil {
		t.Fatal(err)
	}
	g := append([]float32(nil), e.g.Data...)
	off := 0
	for _, s := range e.p.Specs() {
		// The largest gradient of the tensor: small ones drown in fp32 noise.
		best := off
		for i := off; i < off+s.Elements(); i++ {
			if math.Abs(float64(g[i])) > math.Abs(float64(g[best])) {
				best = i
			}
		}
		const h = 1e-2
		orig := e.p.Data[best]
		e.p.Data[best] = orig + h
		lp, _ := e.EvalLoss(b)
		e.p.Data[best] = orig - h
		lm, _ := e.EvalLoss(b)
		e.p.Data[best] = orig
		fd := (lp - lm) / (2 * h)
		if math.Abs(fd-float64(g[best])) > 2e-2*math.Abs(fd)+1e-4 {
			t.Errorf("%s[%d]: backward %g, finite difference %g", s.Name, best-off, g[best], fd)
		}
		off += s.Elements()
	}
}

func TestTrainingLowersTheLoss(t *testing.T) {
	c := testConfig(true)
	e := newTestEngine(t, c, 2, 1)
	b := testBatch(c, 2, 16, 42)
	first, _ := e.EvalLoss(b)
	for s := 0; s < 30; s++ {
		e.ZeroGrad()
		if err := e.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		if err := e.Step(testAdam); err != nil {
			t.Fatal(err)
		}
	}
	last, _ := e.EvalLoss(b)
	if !(last < first/2) {
		t.Errorf("loss %v -> %v after 30 steps on one batch: not learning", first, last)
	}
	// EvalLoss leaves gradients alone.
	before := append([]float32(nil), e.g.Data...)
	if _, err := e.EvalLoss(b); err != nil {
		t.Fatal(err)
	}
	if maxAbsDiff(before, e.g.Data) != 0 {
		t.Error("EvalLoss changed the gradients")
	}
}

// Generation with the KV cache picks, greedily, exactly the arg-max of a
// full forward pass over the sequence so far.
func TestGenerateMatchesFullForward(t *testing.T) {
	c := testConfig(false)
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
		want := NewSampler(Sampling{}).Next(last)
		if tok != want {
			t.Fatalf("token %d: cache gave %d, full forward %d", i, tok, want)
		}
		seq = append(seq, tok)
	}
	// Stopping: the stop token ends the run and is returned.
	stopped, _ := e.Generate(context.Background(), prompt, 8, out[2], Sampling{})
	if len(stopped) != 3 || stopped[2] != out[2] {
		t.Errorf("stop at %d: got %v from %v", out[2], stopped, out)
	}
}

// countdown is a context that is cancelled once Err has been asked n
// times: a stop that comes in the middle of a generation, at a point the
// test chooses.
type countdown struct {
	context.Context
	n int
}

func (c *countdown) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// A cancelled context ends a generation before its next token: a stop
// (Ctrl-C on sched generate) does not wait for the tokens still to come.
func TestGenerateEndsWhenItsContextIs(t *testing.T) {
	c := testConfig(false)
	e := newTestEngine(t, c, 2, 4)
	prompt := []int32{5, 17, 3, 88, 40}
	whole, err := e.Generate(context.Background(), prompt, 20, -1, Sampling{})
	if err != nil || len(whole) != 20 {
		t.Fatalf("uncancelled: %d tokens, %v", len(whole), err)
	}
	ctx := &countdown{Context: context.Background(), n: 3}
	out, err := e.Generate(ctx, prompt, 20, -1, Sampling{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled after 3 tokens: err %v, want context.Canceled", err)
	}
	if !slices.Equal(out, whole[:3]) {
		t.Errorf("cancelled after 3 tokens: returned %v, want the first 3 of %v", out, whole)
	}
}

func TestSampling(t *testing.T) {
	c := testConfig(true)
	e := newTestEngine(t, c, 1, 4)
	prompt := []int32{1, 2, 3}
	a, _ := e.Generate(context.Background(), prompt, 20, -1, Sampling{Temperature: 1, Seed: 9})
	b, _ := e.Generate(context.Background(), prompt, 20, -1, Sampling{Temperature: 1, Seed: 9})
	d, _ := e.Generate(context.Background(), prompt, 20, -1, Sampling{Temperature: 1, Seed: 10})
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different tokens: %v vs %v", a, b)
	}
	if slices.Equal(a, d) {
		t.Errorf("seeds 9 and 10 drew the same 20 tokens %v", a)
	}
	greedy, _ := e.Generate(context.Background(), prompt, 20, -1, Sampling{})
	top1, _ := e.Generate(context.Background(), prompt, 20, -1, Sampling{Temperature: 0.7, TopK: 1, Seed: 3})
	if !slices.Equal(greedy, top1) {
		t.Errorf("top-k 1 %v differs from greedy %v", top1, greedy)
	}
	// Top-k keeps draws among the k largest logits.
	logits := []float32{0, 5, 1, 4, 2, 3}
	s := NewSampler(Sampling{Temperature: 10, TopK: 2, Seed: 1})
	seen := map[int32]bool{}
	for i := 0; i < 200; i++ {
		seen[s.Next(logits)] = true
	}
	if len(seen) != 2 || !seen[1] || !seen[3] {
		t.Errorf("top-2 drew %v, want only 1 and 3", seen)
	}
}

func TestInitParams(t *testing.T) {
	c := Presets["tiny"]
	a, b := InitParams(c, 1), InitParams(c, 1)
	if maxAbsDiff(a.Data, b.Data) != 0 {
		t.Fatal("same seed, different weights")
	}
	if maxAbsDiff(a.Data, InitParams(c, 2).Data) == 0 {
		t.Fatal("seeds 1 and 2 gave the same weights")
	}
	for _, w := range a.Tensor("model.norm.weight") {
		if w != 1 {
			t.Fatalf("norm weight %v, want 1", w)
		}
	}
	emb := a.Tensor("model.embed_tokens.weight")
	var ss, sum float64
	for _, v := range emb {
		ss += float64(v) * float64(v)
		sum += float64(v)
	}
	std := math.Sqrt(ss / float64(len(emb)))
	if math.Abs(std-c.InitializerRange) > 0.02*c.InitializerRange || math.Abs(sum/float64(len(emb))) > 1e-3 {
		t.Errorf("embedding std %g mean %g, want normal(0, %g)", std, sum/float64(len(emb)), c.InitializerRange)
	}
}

func TestBadBatches(t *testing.T) {
	c := testConfig(true)
	e := newTestEngine(t, c, 1, 1)
	b := testBatch(c, 1, 4, 1)
	b.Inputs[2] = int32(c.VocabSize)
	if err := e.ForwardBackward(b, 1); err == nil || !strings.Contains(err.Error(), "position 2") {
		t.Errorf("out-of-vocabulary input: %v", err)
	}
	b = testBatch(c, 1, 4, 1)
	for i := range b.Targets {
		b.Targets[i] = -1
	}
	if err := e.ForwardBackward(b, 1); err == nil || !strings.Contains(err.Error(), "no targets") {
		t.Errorf("all targets ignored: %v", err)
	}
	if _, err := e.Generate(context.Background(), nil, 3, -1, Sampling{}); err == nil {
		t.Error("empty prompt accepted")
	}
}

func TestNewEngineByName(t *testing.T) {
	var notes []string
	e, err := NewEngine("auto", testConfig(true), Options{Log: func(s string) { notes = append(notes, s) }})
	if err != nil {
		t.Fatal(err)
	}
	if e.Name() != "cpu" && e.Name() != "cuda" {
		t.Errorf("auto made %q", e.Name())
	}
	if e.Name() == "cpu" && len(notes) == 0 {
		t.Error("auto fell back to the CPU without saying why")
	}
}
