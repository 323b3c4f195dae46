package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

func TestParseGraphs(t *testing.T) {
	for v, want := range map[string]bool{"": true, "on": true, "off": false} {
		if got, err := parseGraphs(v); err != nil || got != want {
			t.Errorf("parseGraphs(%q) = %v, %v; want %v", v, got, err, want)
		}
	}
}

// The embedding backward's plan lists every position once, sorted by
// token and then position, in items of at most embedItemRows positions of
// one token; a token with more has its items' partial sums in consecutive
// slots that one long entry names.
func TestEmbedPlan(t *testing.T) {
	for _, c := range []struct{ n, vocab int }{{1, 8}, {7, 3}, {1000, 5}, {4096, 4096}, {2048, 40}} {
		t.Run(fmt.Sprintf("n=%d,V=%d", c.n, c.vocab), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(c.n), uint64(c.vocab)))
			ids := make([]int32, c.n)
			for i := range ids {
				ids[i] = int32(r.IntN(c.vocab))
			}
			plan := make([]int32, embedPlanInts(c.n))
			used := embedPlan(ids, make([]int32, c.vocab), plan)
			P, M, off := int(plan[0]), int(plan[1]), int(plan[2])
			if off != 3+c.n+4*P || used != off+3*M {
				t.Fatalf("header P=%d M=%d offset %d, used %d: not where the items and long tokens end", P, M, off, used)
			}
			order := plan[3 : 3+c.n]
			want := make([]int32, c.n)
			for i := range want {
				want[i] = int32(i)
			}
			slices.SortStableFunc(want, func(a, b int32) int { return int(ids[a]) - int(ids[b]) })
			if !slices.Equal(order, want) {
				t.Fatalf("order %v, want positions sorted by token then position %v", order[:min(20, c.n)], want[:min(20, c.n)])
			}
			next, slots := 0, map[int32][]int32{}
			for k := 0; k < P; k++ {
				it := plan[3+c.n+4*k : 3+c.n+4*k+4]
				start, count, tok, slot := int(it[0]), int(it[1]), it[2], it[3]
				if start != next || count < 1 || count > embedItemRows {
					t.Fatalf("item %d covers [%d, %d+%d), want it to start at %d with 1 to %d positions", k, start, start, count, next, embedItemRows)
				}
				for _, p := range order[start : start+count] {
					if ids[p] != tok {
						t.Fatalf("item %d of token %d holds position %d of token %d", k, tok, p, ids[p])
					}
				}
				if slot >= 0 {
					slots[tok] = append(slots[tok], slot)
					if slot >= int32(embedPartRows(c.n)) {
						t.Fatalf("slot %d beyond the %d rows of scratch", slot, embedPartRows(c.n))
					}
				}
				next = start + count
			}
			if next != c.n {
				t.Fatalf("items cover %d of %d positions", next, c.n)
			}
			if M != len(slots) || M > embedLongMax(c.n) {
				t.Fatalf("%d long tokens listed, %d have slots (at most %d)", M, len(slots), embedLongMax(c.n))
			}
			for k := 0; k < M; k++ {
				m := plan[off+3*k : off+3*k+3]
				s := slots[m[0]]
				if len(s) < 2 || m[1] != s[0] || int(m[2]) != len(s) || s[len(s)-1] != s[0]+int32(len(s))-1 {
					t.Fatalf("long token %d: first slot %d of %d, its items' slots %v", m[0], m[1], m[2], s)
				}
			}
		})
	}
}

// Training steps replayed from CUDA graphs give the same bits as the same
// steps launched one kernel at a time: losses, gradient norms, weights and
// both Adam moments, over steps of two micro-batches each, with a learning
// rate that changes every step and batches whose tokens repeat past one
// embedding item. One engine runs both, so that both use the same tuned
// GEMM algorithms; the kernels sum in fixed orders, so the eager run is
// itself the same on every run.
func TestGraphStepsMatchEagerBitForBit(t *testing.T) {
	skipWithoutGPU(t)
	for _, c := range []struct {
		name      string
		cfg       model.Config
		precision string
		B, T      int
	}{
		{"small bf16", model.Presets["small"], "bf16", 2, 256},
		{"hd64 fp32", goldenConfig(t, goldenDirs[1]), "fp32", 2, 64},
		{"tiny fp32", model.Presets["tiny"], "fp32", 2, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEngine(t, c.cfg, model.Options{Precision: c.precision, MaxBatch: c.B, MaxSeq: c.T})
			p0 := model.InitParams(c.cfg, 7)
			r := rand.New(rand.NewPCG(5, 6))
			const steps, micro = 4, 2
			var batches []model.Batch
			for range steps * micro {
				b := model.Batch{B: c.B, T: c.T, Inputs: make([]int32, c.B*c.T), Targets: make([]int32, c.B*c.T)}
				for i := range b.Inputs {
					// 40 tokens: each repeats ~N/40 times, past embedItemRows.
					b.Inputs[i] = int32(r.IntN(40))
					b.Targets[i] = int32(r.IntN(c.cfg.VocabSize))
				}
				b.Targets[3] = -1
				batches = append(batches, b)
			}
			train := func(graphs bool) trained {
				if err := e.th.do(func() error { e.graphs = graphs; return nil }); err != nil {
					t.Fatal(err)
				}
				return trainSteps(t, e, p0, batches, micro)
			}
			eager := train(false)
			if n := len(e.GraphNodes()); n != 0 {
				t.Fatalf("graphs off recorded %d graphs", n)
			}
			before := e.LaunchCounts()
			graph := train(true)
			nodes := e.GraphNodes()
			if nodes[fmt.Sprintf("%dx%d", c.B, c.T)] == 0 || nodes["step"] == 0 {
				t.Fatalf("graphs on recorded %v, want the micro-batch's and the step's", nodes)
			}
			t.Logf("graph nodes %v; losses %v", nodes, graph.losses)
			// Replays count their launches: the same work, the same counts.
			after := e.LaunchCounts()
			for k, n := range before {
				if after[k]-n != n {
					t.Errorf("%s: %d launches with graphs, %d without", k, after[k]-n, n)
				}
			}
			sameBits(t, "eager", "from graphs", eager, graph)
		})
	}
}

// A recorded graph's small memsets run as fill_u32 kernels in their place:
// each writes what the memset wrote, after the work recorded before it and
// before the work recorded after it, and a fill larger than the bound stays
// a memset. Three fills in a row on one stream show the order: a large one
// of 1s, then 7s over its first words, then a 9 after those.
func TestGraphMemsetsRunAsKernels(t *testing.T) {
	e := newEngine(t, model.Presets["tiny"], model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: 8})
	const small, large = 16, graphFillBytes/4 + 1 // words: 64 bytes, and just over the bound
	got := make([]uint32, small+large)
	var replaced, nodes int
	// Runs on the engine's thread: failures come back as errors, for this
	// goroutine to report.
	err := e.th.do(func() error {
		buf, err := e.dv.Alloc(4 * (small + large))
		if err != nil {
			return err
		}
		defer e.dv.Free(buf)
		if err := e.dv.Memset32(buf, 0, small+large); err != nil {
			return err
		}
		if err := e.st.BeginCapture(); err != nil {
			return err
		}
		err1 := e.dv.Memset32Async(buf, 1, small+large, e.sh)
		err2 := e.dv.Memset32Async(buf, 7, small, e.sh)
		err3 := e.dv.Memset32Async(buf+4*small, 9, 1, e.sh)
		g, err := e.st.EndCapture()
		if err := errors.Join(err1, err2, err3, err); err != nil {
			return err
		}
		defer g.Destroy()
		if replaced, err = g.MemsetsToKernels(e.fns["fill_u32"], graphFillBytes); err != nil {
			return err
		}
		if nodes, err = g.Nodes(); err != nil {
			return err
		}
		x, err := g.Instantiate()
		if err != nil {
			return err
		}
		defer x.Destroy()
		if err := x.Launch(e.sh); err != nil {
			return err
		}
		if err := e.st.Synchronize(); err != nil {
			return err
		}
		return cuda.Download(e.dv, got, buf)
	})
	if errors.Is(err, cuda.ErrNoGraphEdit) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if replaced != 2 || nodes != 3 {
		t.Errorf("%d memsets replaced, %d nodes after: want the two small ones, and 3 nodes", replaced, nodes)
	}
	for i, v := range got {
		want := uint32(1)
		switch {
		case i < small:
			want = 7
		case i == small:
			want = 9
		}
		if v != want {
			t.Fatalf("word %d is %d after the graph ran, want %d", i, v, want)
		}
	}
}

func goldenConfig(t *testing.T, dir string) model.Config {
	c, _, _ := loadGolden(t, dir)
	return c
}

// trained is what a few optimizer steps leave: each step's figures and the
// final weights and moments.
type trained struct {
	losses, norms, aux []float64
	params, m, v       []float32
}

// trainSteps starts e from p0 and zero moments and trains the batches micro
// at a time as optimizer steps, each micro-batch scaled by 1/micro as the
// trainer does, with a learning rate that changes every step (so that a
// replayed step must read the new one).
func trainSteps(t *testing.T, e model.Engine, p0 *model.Params, batches []model.Batch, micro int) trained {
	t.Helper()
	if err := e.SetParams(p0); err != nil {
		t.Fatal(err)
	}
	n := len(p0.Data)
	if err := e.SetOptimizerState(&model.OptimizerState{M: make([]float32, n), V: make([]float32, n)}); err != nil {
		t.Fatal(err)
	}
	var r trained
	for s := 0; s < len(batches)/micro; s++ {
		if err := e.ZeroGrad(); err != nil {
			t.Fatal(err)
		}
		for _, b := range batches[s*micro : (s+1)*micro] {
			if err := e.ForwardBackward(b, 1/float32(micro)); err != nil {
				t.Fatal(err)
			}
		}
		o := benchAdamW
		o.LR = 1e-3 * float64(s+1)
		if err := e.Step(o); err != nil {
			t.Fatal(err)
		}
		m, err := e.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		r.losses, r.norms, r.aux = append(r.losses, m.Loss), append(r.norms, m.GradNorm), append(r.aux, m.AuxLoss)
	}
	p := model.NewParams(e.Config())
	if err := e.Params(p); err != nil {
		t.Fatal(err)
	}
	st, err := e.OptimizerState()
	if err != nil {
		t.Fatal(err)
	}
	r.params, r.m, r.v = p.Data, st.M, st.V
	return r
}

// sameBits fails t unless two trainings agree bit for bit: every step's
// loss, load-balancing loss and gradient norm, the weights and both moments.
func sameBits(t *testing.T, wantName, gotName string, want, got trained) {
	t.Helper()
	if !slices.Equal(want.losses, got.losses) || !slices.Equal(want.aux, got.aux) || !slices.Equal(want.norms, got.norms) {
		t.Errorf("losses %v, aux %v, norms %v %s; %v, %v, %v %s", want.losses, want.aux, want.norms, wantName, got.losses, got.aux, got.norms, gotName)
	}
	for _, x := range []struct {
		name       string
		want, have []float32
	}{{"weights", want.params, got.params}, {"first moments", want.m, got.m}, {"second moments", want.v, got.v}} {
		for i := range x.want {
			if math.Float32bits(x.want[i]) != math.Float32bits(x.have[i]) {
				t.Fatalf("%s[%d]: %g %s, %g %s", x.name, i, x.want[i], wantName, x.have[i], gotName)
			}
		}
	}
}
