package kernels

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

func TestParseHeadMode(t *testing.T) {
	for v, want := range map[string]headMode{
		"":              {},
		"fp32":          {f32Fwd: true, f32Bwd: true},
		"fp32-forward":  {f32Fwd: true},
		"fp32-backward": {f32Bwd: true},
		"tf32":          {tf32: true},
	} {
		got, err := parseHeadMode(v)
		if err != nil || got != want {
			t.Errorf("parseHeadMode(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
}

// A mistyped KILN_CUDA_HEAD is refused before any device is touched (so
// this runs without a GPU) with one line naming the variable and its values.
func TestUnknownHeadModeIsBadInput(t *testing.T) {
	t.Setenv("KILN_CUDA_HEAD", "tf16")
	_, err := ParseOptions(os.Getenv)
	if err == nil {
		t.Fatal("ParseOptions accepted KILN_CUDA_HEAD=tf16")
	}
	msg := err.Error()
	for _, want := range []string{"KILN_CUDA_HEAD", `"tf16"`, "fp32-forward", "fp32-backward", "tf32"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %s: %s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error spans lines: %q", msg)
	}
	var b interface{ BadInput() bool }
	if !errors.As(err, &b) || !b.BadInput() {
		t.Errorf("error is not marked bad input: %v", err)
	}
}

// setHeadRows makes e run its LM head in chunks of rows rows.
func setHeadRows(t *testing.T, e *Engine, rows int) {
	t.Helper()
	if err := e.th.do(func() error { return e.allocHead(rows) }); err != nil {
		t.Fatal(err)
	}
}

// raggedRows is a chunk size that splits n rows into at least 3 chunks,
// the last one shorter.
func raggedRows(n int) int {
	r := n / 3
	for r > 1 && n%r == 0 {
		r--
	}
	return r
}

// headRun is what one engine computed on a batch.
type headRun struct {
	loss, eval float64
	logits     []float32
	grads      *model.Params
	xent       int // loss-kernel launches in ForwardBackward
}

func runHead(t *testing.T, e *Engine, p *model.Params, b model.Batch) headRun {
	t.Helper()
	if err := e.SetParams(p); err != nil {
		t.Fatal(err)
	}
	r := headRun{grads: model.NewParams(e.cfg)}
	before := e.LaunchCounts()["xent_fwd_bwd"]
	if err := e.ForwardBackward(b, 1); err != nil {
		t.Fatal(err)
	}
	r.xent = e.LaunchCounts()["xent_fwd_bwd"] - before
	m, err := e.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	r.loss = m.Loss
	if err := e.Grads(r.grads); err != nil {
		t.Fatal(err)
	}
	if r.logits, err = e.Logits(b); err != nil {
		t.Fatal(err)
	}
	if r.eval, err = e.EvalLoss(b); err != nil {
		t.Fatal(err)
	}
	return r
}

// maxRelDiff is the largest difference between want and got relative to
// want's largest magnitude.
func maxRelDiff(want, got []float32) float64 {
	var big, diff float64
	for i := range want {
		big = math.Max(big, math.Abs(float64(want[i])))
		diff = math.Max(diff, math.Abs(float64(want[i])-float64(got[i])))
	}
	if big == 0 {
		return diff
	}
	return diff / big
}

// Splitting the LM head into row chunks, the last one ragged, changes no
// result in fp32: every row meets the same GEMMs and loss kernel, and only
// the head weight's gradient sums its rows in another grouping, so loss,
// logits and every gradient agree with the one-chunk engine to 1e-6 of
// each tensor's largest magnitude (rounding of a few ulps). Both golden
// models: tied (tiny) and untied (hd64) head.
func TestHeadChunksMatchOneChunk(t *testing.T) {
	skipWithoutGPU(t)
	for _, dir := range goldenDirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			c, p, b := loadGolden(t, dir)
			N := b.B * b.T
			o := model.Options{Precision: "fp32", MaxBatch: b.B, MaxSeq: b.T}
			one := newEngine(t, c, o)
			if one.headRows != N {
				t.Fatalf("the golden batch of %d rows runs in chunks of %d rows, want one chunk", N, one.headRows)
			}
			many := newEngine(t, c, o)
			rows := raggedRows(N)
			setHeadRows(t, many, rows)
			chunks := (N + rows - 1) / rows
			if chunks < 3 || N%rows == 0 {
				t.Fatalf("chunks of %d rows split %d rows into %d, want at least 3 with a ragged last", rows, N, chunks)
			}
			want, got := runHead(t, one, p, b), runHead(t, many, p, b)
			if want.xent != 1 || got.xent != chunks {
				t.Errorf("the loss kernel ran %d and %d times, want 1 and %d (chunks of %d of %d rows)", want.xent, got.xent, chunks, rows, N)
			}
			const tol = 1e-6
			if d := math.Abs(got.loss-want.loss) / math.Abs(want.loss); d > tol {
				t.Errorf("loss: %d chunks %.9g, one chunk %.9g (relative %.2g)", chunks, got.loss, want.loss, d)
			}
			if d := math.Abs(got.eval-want.eval) / math.Abs(want.eval); d > tol {
				t.Errorf("eval loss: %d chunks %.9g, one chunk %.9g (relative %.2g)", chunks, got.eval, want.eval, d)
			}
			if d := maxRelDiff(want.logits, got.logits); d > tol {
				t.Errorf("logits differ by %.2g of their largest magnitude", d)
			}
			for _, s := range c.Specs() {
				if d := maxRelDiff(want.grads.Tensor(s.Name), got.grads.Tensor(s.Name)); d > tol {
					t.Errorf("gradient of %s differs by %.2g of its largest magnitude", s.Name, d)
				}
			}
			t.Logf("%d rows in chunks of %d: loss %.9g vs %.9g", N, rows, got.loss, want.loss)
		})
	}
}

// At small's training shape (B 32 x T 1024, V 16384) no buffer holds N x V
// values in any head precision: the logits exist one 4096-row chunk
// (256 MiB) at a time, and a step on them gives the loss of a fresh model,
// about ln V, and a finite gradient.
func TestHeadAllocatesNoFullLogits(t *testing.T) {
	skipWithoutGPU(t)
	c := model.Presets["small"]
	const B, T = 32, 1024
	N, V := int64(B*T), int64(c.VocabSize)
	p := model.InitParams(c, 1)
	batch := patternBatch(c, B, T)
	for _, head := range []string{"", "tf32", "fp32"} {
		t.Run("head="+head, func(t *testing.T) {
			t.Setenv("KILN_CUDA_HEAD", head)
			e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
			if e.headRows != 4096 {
				t.Errorf("chunks of %d rows, want 4096 (256 MiB of fp32 logits)", e.headRows)
			}
			// A bf16 (N, V) buffer is the smallest a full logit tensor
			// could take.
			for _, a := range e.mem.list() {
				if a.Bytes >= N*V*2 {
					t.Errorf("%s holds %d bytes, as much as %d x %d bf16 logits", a.What, a.Bytes, N, V)
				}
			}
			// The bf16 head writes its training logits in bf16 and their
			// gradient over them: no gradient buffer of its own, and a
			// buffer of 4096 bf16 rows, which hands out fp32 logits 2048
			// rows at a time. The fp32 and TF32 heads keep fp32 rows.
			size, out := int64(2), 2048
			if head != "" {
				size, out = 4, 4096
			}
			if e.outRows() != out {
				t.Errorf("fp32 logits handed out in chunks of %d rows, want %d", e.outRows(), out)
			}
			wantNames := map[string]int64{"logits (chunk of 4096 rows)": 4096 * V * size}
			for _, a := range e.Allocations() {
				if strings.Contains(a.What, "logit") {
					if want, ok := wantNames[a.What]; !ok || a.Bytes != want || a.Count != 1 {
						t.Errorf("allocation %q: %d buffers, %d bytes; want one of %d", a.What, a.Count, a.Bytes, want)
					}
					delete(wantNames, a.What)
				}
			}
			for name := range wantNames {
				t.Errorf("no allocation named %q", name)
			}
			if err := e.SetParams(p); err != nil {
				t.Fatal(err)
			}
			m := stepOnce(t, e, batch)
			// Initial logits have a standard deviation near 0.02 x sqrt(512)
			// = 0.45, which lifts the loss above ln V by about its variance / 2.
			if lnV := math.Log(float64(V)); !(math.Abs(m.Loss-lnV) < 1) || !(m.GradNorm > 0 && !math.IsInf(m.GradNorm, 0)) {
				t.Errorf("first step: loss %.4f (ln V = %.4f), gradient norm %g", m.Loss, lnV, m.GradNorm)
			}
			t.Logf("loss %.4f, peak %.2f GiB", m.Loss, gib(e.Memory().PeakAllocated))
		})
	}
}

// KILN_CUDA_HEAD=tf32 in bf16 precision gives the fp32 engine's loss on the
// golden tiny model within the bf16 loss tolerance (5e-3 relative), and its
// head GEMMs are the TF32 ones.
func TestTF32HeadLossMatchesFP32(t *testing.T) {
	skipWithoutGPU(t)
	c, p, b := loadGolden(t, goldenDirs[0])
	o := model.Options{Precision: "fp32", MaxBatch: b.B, MaxSeq: b.T}
	loss := func(e *Engine) float64 {
		if err := e.SetParams(p); err != nil {
			t.Fatal(err)
		}
		if err := e.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		m, err := e.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		return m.Loss
	}
	want := loss(newEngine(t, c, o))
	t.Setenv("KILN_CUDA_HEAD", "tf32")
	o.Precision = "bf16"
	e := newEngine(t, c, o)
	if !e.headMode.tf32 || e.a.dlogitsb != 0 {
		t.Fatalf("KILN_CUDA_HEAD=tf32: head mode %+v, bf16 gradient buffer %#x; want tf32 and none", e.headMode, e.a.dlogitsb)
	}
	if err := e.SetProfiling(true); err != nil {
		t.Fatal(err)
	}
	got := loss(e)
	if d := math.Abs(got-want) / want; d > BF16Tolerances.LossRel {
		t.Errorf("bf16 with a tf32 head: loss %.7g, fp32 %.7g (relative %.2g)", got, want, d)
	}
	if _, ok := e.KernelTimes()["cublasLt tf32 GEMM (LM head)"]; !ok {
		t.Errorf("no TF32 head GEMM ran; timed: %v", keys(e.KernelTimes()))
	}
	t.Logf("loss: bf16 + tf32 head %.7g, fp32 %.7g", got, want)
}

func keys(m map[string]float64) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return fmt.Sprint(ks)
}

// BenchmarkLMHead times the LM head alone (the chunked logits GEMM, loss and
// both backward GEMMs over every row) at small's B 32 x T 1024 in bf16
// precision, for each head precision: what the tf32 and fp32 heads cost
// over the bf16 one.
func BenchmarkLMHead(b *testing.B) {
	c := model.Presets["small"]
	const B, T = 32, 1024
	N := B * T
	batch := patternBatch(c, B, T)
	for _, h := range []struct{ name, env string }{{"bf16", ""}, {"tf32", "tf32"}, {"fp32", "fp32"}} {
		b.Run(h.name, func(b *testing.B) {
			b.Setenv("KILN_CUDA_HEAD", h.env)
			e := newEngine(b, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
			if err := e.SetParams(model.InitParams(c, 1)); err != nil {
				b.Fatal(err)
			}
			head := func() error {
				if err := e.lmHead(batch, headTrain, e.lossAcc, nil); err != nil {
					return err
				}
				return e.dv.Synchronize()
			}
			if err := e.th.do(func() error {
				if err := e.stageIDs(batch.Inputs); err != nil {
					return err
				}
				if err := e.stageTargets(batch, N, 1); err != nil {
					return err
				}
				if err := e.forward(batch); err != nil {
					return err
				}
				return head() // cuBLASLt's heuristics and layouts
			}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := e.th.do(head); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(N*b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// The bf16 engine hands out fp32 logits from its buffer of bf16 training
// rows in chunks of half the rows: every row of them, within the bf16
// tolerances of the fp32 engine's logits, and its training loss and eval
// loss those of one chunk of every row (within 1e-4).
func TestBF16LogitsInHalfChunks(t *testing.T) {
	skipWithoutGPU(t)
	c := model.Config{VocabSize: 1024, Hidden: 128, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 64, Intermediate: 256,
		MaxPositions: 512, RopeTheta: 10000, RMSNormEps: 1e-5, InitializerRange: 0.02}
	const B, T = 2, 512
	b := patternBatch(c, B, T)
	p := model.InitParams(c, 5)
	want := runHead(t, newEngine(t, c, model.Options{Precision: "fp32", MaxBatch: B, MaxSeq: T}), p, b)
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
	setHeadRows(t, e, 384) // fp32 logits 128 rows at a time: 8 chunks, 3 training chunks, the last ragged
	if e.outRows() != 128 {
		t.Fatalf("fp32 logits in chunks of %d rows, want 128", e.outRows())
	}
	got := runHead(t, e, p, b)
	one := runHead(t, newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T}), p, b)
	tol := BF16Tolerances
	if d := maxRelDiff(want.logits, got.logits); d > tol.LogitsRel {
		t.Errorf("logits differ from fp32's by %.2g of their largest magnitude (limit %g)", d, tol.LogitsRel)
	}
	for r := 0; r < B*T; r++ {
		row := got.logits[r*c.VocabSize : (r+1)*c.VocabSize]
		if slices.Max(row) == 0 && slices.Min(row) == 0 {
			t.Fatalf("logits of row %d are all 0", r)
		}
	}
	for _, l := range []struct {
		what      string
		got, want float64
	}{{"loss", got.loss, one.loss}, {"eval loss", got.eval, one.eval}} {
		// The head's GEMMs may take other algorithms at other row counts,
		// and round a few bf16 logits the other way.
		if d := math.Abs(l.got-l.want) / math.Abs(l.want); d > 1e-4 {
			t.Errorf("%s: chunks of 384 rows %.9g, one chunk %.9g", l.what, l.got, l.want)
		}
	}
}
