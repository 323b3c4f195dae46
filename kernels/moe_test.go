package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// moeGolden is transformers' MixtralForCausalLM, fp32: logits, loss
// (lm_loss + 0.02 x aux_loss), every gradient and the weights after one
// clipped AdamW step.
const moeGolden = "../model/testdata/golden/moe"

// The CUDA engine's sparse block meets the reference's tolerances in fp32
// (where its expert GEMMs run on the CUDA cores in fp32) and the dense bf16
// bounds in bf16 (tensor cores), native and with the sm_80 build.
func TestMoEGolden(t *testing.T) {
	skipWithoutGPU(t)
	for _, precision := range []string{"fp32", "bf16"} {
		for _, force := range []string{"0", "1"} {
			t.Run(precision+"/sm80="+force, func(t *testing.T) {
				t.Setenv("KILN_CUDA_FORCE_SM80", force)
				var tol *model.Tolerances
				if precision == "bf16" {
					b := BF16Tolerances
					tol = &b
				}
				verify(t, moeGolden, precision, tol)
			})
		}
	}
}

// moeConfig is the golden's model with another mixture.
func moeConfig(t *testing.T, experts, topK int) model.Config {
	c := goldenConfig(t, moeGolden)
	c.Experts, c.ExpertsPerTok = experts, topK
	return c
}

// randomBatch is a B x T batch of tokens drawn from the first `tokens` ids
// (few, so that tokens repeat past one embedding item) and random targets.
func randomBatch(c model.Config, B, T, tokens int, r *rand.Rand) model.Batch {
	b := model.Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
	for i := range b.Inputs {
		b.Inputs[i] = int32(r.IntN(tokens))
		b.Targets[i] = int32(r.IntN(c.VocabSize))
	}
	b.Targets[3] = -1
	return b
}

// fp32 steps on the CUDA engine match the CPU reference where the golden
// does not reach: more assignments than one block of the counting sort
// (4 x 512 rows, 2 choices: 4 blocks), and experts that get no row at all
// with an odd number of choices (32 experts, 3 a token, over 24 rows).
func TestMoEMatchesCPU(t *testing.T) {
	skipWithoutGPU(t)
	for _, x := range []struct {
		name           string
		experts, topK  int
		dff            int
		precision      string
		B, T           int
		wantEmptyExpts bool
	}{
		{"8x2 over 4 sort blocks", 8, 2, 96, "fp32", 4, 512, false},
		{"32x3 with idle experts", 32, 3, 96, "fp32", 1, 24, true},
		// Widths past the tiles' edges.
		{"d_ff 100", 8, 2, 100, "fp32", 1, 100, false},
	} {
		t.Run(x.name, func(t *testing.T) {
			c := moeConfig(t, x.experts, x.topK)
			c.Intermediate = x.dff
			lossTol, gradTol := 1e-5, 1e-4
			if x.precision == "bf16" {
				lossTol, gradTol = BF16Tolerances.LossRel, BF16Tolerances.GradRel
			}
			o := model.Options{Precision: x.precision, MaxBatch: x.B, MaxSeq: x.T}
			e := newEngine(t, c, o)
			if e.moeVec() != (x.dff%8 == 0 && x.precision == "bf16") {
				t.Fatalf("fast bf16 expert kernels %v for d_ff %d in %s", e.moeVec(), x.dff, x.precision)
			}
			o.Precision = "fp32"
			cpu, err := model.NewEngine("cpu", c, o)
			if err != nil {
				t.Fatal(err)
			}
			defer cpu.Close()
			p := model.InitParams(c, 3)
			b := randomBatch(c, x.B, x.T, 50, rand.New(rand.NewPCG(1, 2)))
			var ms [2]model.StepMetrics
			var grads [2]*model.Params
			for k, eng := range []model.Engine{cpu, e} {
				ms[k], grads[k] = gradStep(t, eng, c, p, b, 0.5, true)
			}
			t.Logf("cpu %+v\ncuda %+v", ms[0], ms[1])
			if math.Abs(ms[0].Loss-ms[1].Loss) > lossTol*ms[0].Loss || math.Abs(ms[0].AuxLoss-ms[1].AuxLoss) > lossTol*ms[0].AuxLoss {
				t.Errorf("loss %.8g aux %.8g on the CPU, %.8g and %.8g on the GPU", ms[0].Loss, ms[0].AuxLoss, ms[1].Loss, ms[1].AuxLoss)
			}
			if ms[0].AuxLoss == 0 {
				t.Fatal("the CPU reference reports no load-balancing loss")
			}
			// The routing is the CPU's: each expert's share of the (token,
			// choice) pairs equal, up to a pair a near tie sends elsewhere.
			pairs := float64(c.Layers * x.B * x.T * x.topK)
			if len(ms[0].ExpertShare) != x.experts || len(ms[1].ExpertShare) != x.experts {
				t.Fatalf("expert shares: %d on the CPU, %d on the GPU; want %d", len(ms[0].ExpertShare), len(ms[1].ExpertShare), x.experts)
			}
			for i := range ms[0].ExpertShare {
				if d := math.Abs(ms[0].ExpertShare[i] - ms[1].ExpertShare[i]); d > 2.5/pairs {
					t.Errorf("expert %d's share: %.6g on the CPU, %.6g on the GPU", i, ms[0].ExpertShare[i], ms[1].ExpertShare[i])
				}
			}
			idle := 0
			for _, s := range c.Specs() {
				want, got := grads[0].Tensor(s.Name), grads[1].Tensor(s.Name)
				var top, diff float64
				for i := range want {
					top = math.Max(top, math.Abs(float64(want[i])))
					diff = math.Max(diff, math.Abs(float64(want[i]-got[i])))
				}
				if top == 0 {
					idle++
				}
				if diff > gradTol*top || math.IsNaN(diff) {
					t.Errorf("%s: gradient differs by %.3g, largest %.3g", s.Name, diff, top)
				}
			}
			if x.wantEmptyExpts && idle == 0 {
				t.Errorf("no expert went without rows: the case is not covered")
			}
		})
	}
}

// The fast bf16 expert kernels (16-byte copies, ldmatrix, the weight
// gradients split over an expert's rows, the input gradient as one product
// over both weights) compute what the straightforward ones do: the same
// forward bits, so the same routing and loss, and gradients that differ
// only by the order their sums take. That order moves some bf16 roundings
// of the block's input gradient by a unit, which the layers below carry:
// on an H200 up to 2.3e-3 of a tensor's largest value (the embedding's),
// held here to 5e-3, six times inside the bf16 tolerance; a wrong row or
// weight in a kernel errs by the whole of its term.
func TestMoEFastKernelsMatchStraightforward(t *testing.T) {
	skipWithoutGPU(t)
	c := goldenConfig(t, moeGolden)
	const B, T = 4, 512
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
	if !e.moeVec() {
		t.Fatal("the golden's widths do not take the fast kernels")
	}
	NK := B * T * c.ExpertsPerTok
	if s := e.dwSplit(blocks(int64(c.Intermediate), 64)*blocks(int64(c.Hidden), moeVecRows)*c.Experts, NK); s < 2 {
		t.Fatalf("the weight gradients are not split at this shape (%d parts): the case is not covered", s)
	}
	p := model.InitParams(c, 9)
	b := randomBatch(c, B, T, 60, rand.New(rand.NewPCG(3, 4)))
	var ms [2]model.StepMetrics
	var grads [2]*model.Params
	for k, scalar := range []bool{false, true} {
		if err := e.th.do(func() error { e.graphs, e.moeScalar = false, scalar; return nil }); err != nil {
			t.Fatal(err)
		}
		ms[k], grads[k] = gradStep(t, e, c, p, b, 1, false)
	}
	launches := e.LaunchCounts()
	if launches["moe_gemm_dw_bf_v"] == 0 || launches["moe_dw_reduce"] == 0 || launches["moe_gemm_dw_bf"] == 0 {
		t.Fatalf("launches %v: both kernel sets should have run", launches)
	}
	if ms[0].Loss != ms[1].Loss || ms[0].AuxLoss != ms[1].AuxLoss {
		t.Errorf("loss %v, aux %v with the fast kernels; %v, %v without", ms[0].Loss, ms[0].AuxLoss, ms[1].Loss, ms[1].AuxLoss)
	}
	for _, s := range c.Specs() {
		fast, slow := grads[0].Tensor(s.Name), grads[1].Tensor(s.Name)
		var top, diff float64
		for i := range slow {
			top = math.Max(top, math.Abs(float64(slow[i])))
			diff = math.Max(diff, math.Abs(float64(fast[i]-slow[i])))
		}
		if diff > 5e-3*top || math.IsNaN(diff) {
			t.Errorf("%s: gradients differ by %.3g, largest %.3g", s.Name, diff, top)
		}
	}
}

// MoE training steps replayed from CUDA graphs give the same bits as the
// same steps launched one kernel at a time (routing, sort, grouped GEMMs
// and the aux loss included): losses, aux losses, gradient norms, weights
// and Adam moments over steps of two micro-batches.
func TestMoEGraphStepsMatchEagerBitForBit(t *testing.T) {
	skipWithoutGPU(t)
	small := model.Presets["small"]
	small.Experts, small.ExpertsPerTok, small.Intermediate, small.RouterAuxCoef = 8, 2, 352, 0.02
	for _, x := range []struct {
		name      string
		cfg       model.Config
		precision string
		B, T      int
	}{
		{"golden fp32", goldenConfig(t, moeGolden), "fp32", 2, 64},
		{"golden bf16", goldenConfig(t, moeGolden), "bf16", 2, 64},
		// 4096 grouped rows: the weight gradients split each expert's rows.
		{"small 8x2 bf16", small, "bf16", 8, 256},
	} {
		t.Run(x.name, func(t *testing.T) {
			c := x.cfg
			e := newEngine(t, c, model.Options{Precision: x.precision, MaxBatch: x.B, MaxSeq: x.T})
			p0 := model.InitParams(c, 7)
			r := rand.New(rand.NewPCG(5, 6))
			const steps, micro = 3, 2
			var batches []model.Batch
			for range steps * micro {
				batches = append(batches, randomBatch(c, x.B, x.T, 40, r))
			}
			train := func(graphs bool) trained {
				if err := e.th.do(func() error { e.graphs = graphs; return nil }); err != nil {
					t.Fatal(err)
				}
				return trainSteps(t, e, p0, batches, micro)
			}
			eager := train(false)
			graph := train(true)
			nodes := e.GraphNodes()
			if nodes[fmt.Sprintf("%dx%d", x.B, x.T)] == 0 {
				t.Fatalf("graphs on recorded %v, want the micro-batch's", nodes)
			}
			t.Logf("graph nodes %v; losses %v, aux %v", nodes, graph.losses, graph.aux)
			if graph.aux[0] <= 0 {
				t.Errorf("aux loss %v: the load-balancing loss did not run", graph.aux)
			}
			sameBits(t, "eager", "from graphs", eager, graph)
		})
	}
}

// BenchmarkMoETrainStep times a training step of the small model with
// Mixtral's block (8 experts, 2 a token, d_ff 352) in bf16.
func BenchmarkMoETrainStep(b *testing.B) {
	c := model.Presets["small"]
	c.Experts, c.ExpertsPerTok, c.Intermediate, c.RouterAuxCoef = 8, 2, 352, 0.02
	for _, sz := range []struct{ B, T int }{{16, 512}, {32, 1024}} {
		b.Run(fmt.Sprintf("%dx%d", sz.B, sz.T), func(b *testing.B) {
			e := newEngine(b, c, model.Options{Precision: "bf16", MaxBatch: sz.B, MaxSeq: sz.T})
			if err := e.SetParams(model.InitParams(c, 1)); err != nil {
				b.Fatal(err)
			}
			batch := patternBatch(c, sz.B, sz.T)
			stepOnce(b, e, batch)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := e.ZeroGrad(); err != nil {
					b.Fatal(err)
				}
				stepOnce(b, e, batch)
			}
			b.ReportMetric(float64(sz.B*sz.T*b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// model.EstimateMemory's CUDA plan, which refuses a run before the engine
// allocates, counts the sparse block's buffers: the engine's peak after a
// training step lands within the bounds the dense plan is held to.
func TestMoEMemoryPlanMatchesAllocation(t *testing.T) {
	skipWithoutGPU(t)
	small := model.Presets["small"]
	small.Experts, small.ExpertsPerTok, small.Intermediate, small.RouterAuxCoef = 8, 2, 352, 0.02
	for _, x := range []struct {
		name      string
		cfg       model.Config
		precision string
		B, T      int
	}{
		{"small 8x2 bf16 8x1024", small, "bf16", 8, 1024},
		{"small 8x2 fp32 2x1024", small, "fp32", 2, 1024},
	} {
		t.Run(x.name, func(t *testing.T) {
			plan := model.MemoryPlan{Config: x.cfg, Engine: "cuda", Precision: x.precision, Batch: x.B, Seq: x.T, Purpose: model.PurposeBench}
			est, err := model.EstimateMemory(plan)
			if err != nil {
				t.Fatal(err)
			}
			e := newEngine(t, x.cfg, model.Options{Precision: x.precision, MaxBatch: x.B, MaxSeq: x.T, Purpose: model.PurposeBench})
			if err := e.SetParams(model.InitParams(x.cfg, 1)); err != nil {
				t.Fatal(err)
			}
			stepOnce(t, e, patternBatch(x.cfg, x.B, x.T))
			peak := e.Memory().PeakAllocated
			ratio := float64(est.Total) / float64(peak)
			t.Logf("estimate %s, peak %s (x%.3f)", model.GiB(est.Total), model.GiB(peak), ratio)
			if ratio < 0.95 || ratio > 1.10 {
				t.Errorf("estimate %s is x%.3f the engine's peak %s, want within 0.95-1.10", model.GiB(est.Total), ratio, model.GiB(peak))
			}
		})
	}
}

// gradStep sets p on eng, runs one forward and backward of b with the
// loss scaled by scale, and returns the step's gradients and its metrics,
// read after an optimizer step when step is set.
func gradStep(t *testing.T, eng model.Engine, c model.Config, p *model.Params, b model.Batch, scale float32, step bool) (model.StepMetrics, *model.Params) {
	t.Helper()
	if err := eng.SetParams(p); err != nil {
		t.Fatal(err)
	}
	if err := eng.ForwardBackward(b, scale); err != nil {
		t.Fatal(err)
	}
	g := model.NewParams(c)
	if err := eng.Grads(g); err != nil {
		t.Fatal(err)
	}
	if step {
		if err := eng.Step(benchAdamW); err != nil {
			t.Fatal(err)
		}
	}
	m, err := eng.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return m, g
}
