package kernels

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// These tests need an NVIDIA GPU and its libraries; where none loads they
// skip and say why (CI has no GPU, so there they compile and skip).

var goldenDirs = []string{"../model/testdata/golden/tiny", "../model/testdata/golden/hd64"}

// testBuffers holds a test's device buffers, allocated on the engine's
// thread: the first error sticks (later allocations return 0), and free
// releases them all.
type testBuffers struct {
	e    *Engine
	held []cuda.Ptr
	err  error
}

// alloc returns an uninitialised buffer of n bytes.
func (b *testBuffers) alloc(n int64) cuda.Ptr {
	if b.err != nil {
		return 0
	}
	p, err := b.e.mem.alloc("test", n)
	if err != nil {
		b.err = err
		return 0
	}
	b.held = append(b.held, p)
	return p
}

// free releases every buffer and returns the first error seen.
func (b *testBuffers) free() error {
	for _, p := range b.held {
		if err := b.e.mem.free(p); err != nil && b.err == nil {
			b.err = err
		}
	}
	b.held = nil
	return b.err
}

// upload returns a buffer of b holding vals.
func upload[T any](b *testBuffers, vals []T) cuda.Ptr {
	var z T
	p := b.alloc(int64(len(vals)) * int64(unsafe.Sizeof(z)))
	if b.err == nil {
		b.err = cuda.Upload(b.e.dv, p, vals)
	}
	return p
}

func skipWithoutGPU(t testing.TB) {
	t.Helper()
	drv, err := cuda.LoadDriver()
	if err != nil {
		t.Skipf("no CUDA GPU here, skipping: %v", err)
	}
	if n, err := drv.DeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA GPU here, skipping: %d devices (%v)", n, err)
	}
	if _, err := cuda.LoadNVRTC(); err != nil {
		t.Skipf("no NVRTC here, skipping: %v", err)
	}
	if _, err := cuda.LoadBLASLt(); err != nil {
		t.Skipf("no cuBLASLt here, skipping: %v", err)
	}
}

// envOptions is what the command line would read from this test's
// environment: tests select the engine's variants with t.Setenv.
func envOptions(t testing.TB) Options {
	t.Helper()
	o, err := ParseOptions(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func newEngine(t testing.TB, c model.Config, o model.Options) *Engine {
	t.Helper()
	skipWithoutGPU(t)
	e, err := NewWithOptions(c, o, envOptions(t))
	if err != nil {
		t.Fatalf("new CUDA engine: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func loadGolden(t testing.TB, dir string) (model.Config, *model.Params, model.Batch) {
	t.Helper()
	c, err := model.ReadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := model.LoadParams(filepath.Join(dir, "model.safetensors"), c)
	if err != nil {
		t.Fatal(err)
	}
	f, err := model.ReadSafetensors(filepath.Join(dir, "batch.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	ids := f.Tensor("input_ids")
	in, err := ids.Int32s()
	if err != nil {
		t.Fatal(err)
	}
	B, T := ids.Shape[0], ids.Shape[1]
	tg := make([]int32, len(in))
	for i := range tg {
		tg[i] = -1
		if (i+1)%T != 0 {
			tg[i] = in[i+1]
		}
	}
	return c, p, model.Batch{B: B, T: T, Inputs: in, Targets: tg}
}

// NVRTC compiles a header-free kernel, the driver runs it exactly, and the
// on-disk cache returns the same image on the second compile, for the
// native CUBIN and the sm_80 PTX path.
func TestDeviceCompileRunAndCache(t *testing.T) {
	skipWithoutGPU(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	drv, _ := cuda.LoadDriver()
	nv, _ := cuda.LoadNVRTC()
	dv, err := drv.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dv.Close()
	t.Logf("device %s, compute capability %d.%d, %d SMs; NVRTC %d.%d", dv.Name, dv.Major, dv.Minor, dv.SMs, nv.Major, nv.Minor)
	cache := t.TempDir()
	for _, arch := range []string{Target(dv.Major, dv.Minor, false), Target(dv.Major, dv.Minor, true)} {
		img, hit, err := compileCached(nv, CacheDir(cache), "convert.cu", arch)
		if err != nil || hit {
			t.Fatalf("%s: first compile: hit=%v err=%v", arch, hit, err)
		}
		img2, hit, err := compileCached(nv, CacheDir(cache), "convert.cu", arch)
		if err != nil || !hit || !bytes.Equal(img, img2) {
			t.Fatalf("%s: second compile: hit=%v err=%v same=%v", arch, hit, err, bytes.Equal(img, img2))
		}
		mod, err := dv.LoadModule(img)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		f, err := mod.Function("bf16_round")
		if err != nil {
			t.Fatal(err)
		}
		const n = 1 << 16
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(math.Sin(float64(i))) * float32(i+1)
		}
		// Ties to even both ways, subnormals, signed zero, overflow to
		// infinity, infinities and NaN: one instruction rounds them all.
		special := []float32{1 + 1.0/256, 1 + 3.0/256, -(1 + 1.0/256), 1e-40, -3e-39, float32(math.Copysign(0, -1)),
			math.MaxFloat32, -math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
		copy(x, special)
		p, err := dv.Alloc(n * 4)
		if err != nil {
			t.Fatal(err)
		}
		if err := cuda.Upload(dv, p, x); err != nil {
			t.Fatal(err)
		}
		st, err := dv.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		start, err := dv.NewEvent()
		if err != nil {
			t.Fatal(err)
		}
		end, _ := dv.NewEvent()
		if err := start.Record(st.Handle()); err != nil {
			t.Fatal(err)
		}
		if err := f.Launch(cuda.Dim3{X: n / 256}, cuda.Dim3{X: 256}, 0, st.Handle(), p, int64(n)); err != nil {
			t.Fatal(err)
		}
		if err := end.Record(st.Handle()); err != nil {
			t.Fatal(err)
		}
		ms, err := start.Elapsed(end)
		if err != nil || ms < 0 {
			t.Fatalf("event timing: %g ms, %v", ms, err)
		}
		if err := st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: bf16_round over %d values took %.3f ms", arch, n, ms)
		start.Destroy()
		end.Destroy()
		st.Destroy()
		got := make([]float32, n)
		if err := cuda.Download(dv, got, p); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if math.IsNaN(float64(x[i])) {
				if !math.IsNaN(float64(got[i])) {
					t.Fatalf("%s: bf16 rounding of NaN = %g", arch, got[i])
				}
				continue
			}
			if want := model.FromBF16(model.ToBF16(x[i])); math.Float32bits(got[i]) != math.Float32bits(want) {
				t.Fatalf("%s: bf16 rounding of %g = %g, want %g", arch, x[i], got[i], want)
			}
		}
		dv.Free(p)
		mod.Unload()
	}
}

func verify(t *testing.T, dir, precision string, tol *model.Tolerances) {
	t.Helper()
	// model.Verify starts its engine by name, so the environment's
	// settings reach it the way the command line passes them.
	Configure(envOptions(t))
	t.Cleanup(func() { Configure(Options{}) })
	r, err := model.Verify(context.Background(), dir, model.VerifyOptions{Engine: "cuda", Precision: precision, Tol: tol})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	r.Write(&b)
	t.Log("\n" + b.String())
	if !r.Pass {
		t.Fatalf("%s %s: engine differs from transformers beyond tolerance", dir, precision)
	}
}

// fp32 meets the CPU reference's tolerances on both golden models, with the
// native build and with the sm_80 build an RTX 3060 runs.
func TestGoldenFP32(t *testing.T) {
	skipWithoutGPU(t)
	for _, force := range []string{"0", "1"} {
		for _, dir := range goldenDirs {
			t.Run(filepath.Base(dir)+"/sm80="+force, func(t *testing.T) {
				t.Setenv("KILN_CUDA_FORCE_SM80", force)
				verify(t, dir, "fp32", nil)
			})
		}
	}
}

// BF16Tolerances are derived for bf16 GEMM operands with fp32 accumulation:
// rounding each operand to 8 mantissa bits errs by up to 2^-9 relative, and
// a dot product of K such terms with random signs errs by about
// 2^-9 x sqrt(K) x typical term, i.e. 2e-3 to 5e-3 of the result's scale for
// K of 64 to 704; through a few layers that stays under 1e-2 of each
// tensor's largest magnitude, so gradients and logits are held to 3e-2. The
// loss averages that error over every position, so it lands far closer:
// held to 5e-3 relative. Weights after Adam's first step move by about lr x
// sign(gradient), so where the gradient is significant they agree to 1e-5.
var BF16Tolerances = model.Tolerances{LossRel: 5e-3, LogitsRel: 3e-2, GradRel: 3e-2, Significant: 3e-2, WeightAbs: 1e-5, WeightLRs: 2}

func TestGoldenBF16(t *testing.T) {
	skipWithoutGPU(t)
	for _, force := range []string{"0", "1"} {
		for _, dir := range goldenDirs {
			t.Run(filepath.Base(dir)+"/sm80="+force, func(t *testing.T) {
				t.Setenv("KILN_CUDA_FORCE_SM80", force)
				tol := BF16Tolerances
				verify(t, dir, "bf16", &tol)
			})
		}
	}
}

func halves(b model.Batch) (model.Batch, model.Batch) {
	h := b.B / 2 * b.T
	return model.Batch{B: b.B / 2, T: b.T, Inputs: b.Inputs[:h], Targets: b.Targets[:h]},
		model.Batch{B: b.B - b.B/2, T: b.T, Inputs: b.Inputs[h:], Targets: b.Targets[h:]}
}

// Two accumulated half-batches give the gradient and loss of the whole batch.
func TestAccumulationEqualsWholeBatch(t *testing.T) {
	c, p, b := loadGolden(t, goldenDirs[1])
	e := newEngine(t, c, model.Options{Precision: "fp32", MaxBatch: b.B, MaxSeq: b.T})
	if err := e.SetParams(p); err != nil {
		t.Fatal(err)
	}
	whole, acc := model.NewParams(c), model.NewParams(c)
	if err := e.ForwardBackward(b, 1); err != nil {
		t.Fatal(err)
	}
	mw, err := e.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Grads(whole); err != nil {
		t.Fatal(err)
	}
	if err := e.ZeroGrad(); err != nil {
		t.Fatal(err)
	}
	b1, b2 := halves(b)
	for _, h := range []model.Batch{b1, b2} {
		if err := e.ForwardBackward(h, 0.5); err != nil {
			t.Fatal(err)
		}
	}
	ma, err := e.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Grads(acc); err != nil {
		t.Fatal(err)
	}
	if math.Abs(ma.Loss-mw.Loss) > 1e-6*math.Abs(mw.Loss) {
		t.Errorf("accumulated loss %.9g, whole batch %.9g", ma.Loss, mw.Loss)
	}
	for _, s := range c.Specs() {
		w, a := whole.Tensor(s.Name), acc.Tensor(s.Name)
		var big, diff float64
		for i := range w {
			big = math.Max(big, math.Abs(float64(w[i])))
			diff = math.Max(diff, math.Abs(float64(w[i]-a[i])))
		}
		// fp32 summation in another order: far under the 1e-4 golden bound.
		if diff > 1e-5*big {
			t.Errorf("%s: accumulated gradient differs by %.3g (largest %.3g)", s.Name, diff, big)
		}
	}
}

// Greedy generation on the golden weights gives the CPU engine's tokens.
func TestGenerateMatchesCPU(t *testing.T) {
	// The mixture of experts' golden too: its KV cache and routing, a
	// token at a time.
	for _, dir := range append(goldenDirs[:len(goldenDirs):len(goldenDirs)], moeGolden) {
		c, p, b := loadGolden(t, dir)
		const n = 64
		prompt := b.Inputs[:8]
		o := model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: len(prompt) + n}
		e := newEngine(t, c, o)
		cpu, err := model.NewEngine("cpu", c, o)
		if err != nil {
			t.Fatal(err)
		}
		defer cpu.Close()
		var outs [][]int32
		for _, eng := range []model.Engine{cpu, e} {
			if err := eng.SetParams(p); err != nil {
				t.Fatal(err)
			}
			out, err := eng.Generate(context.Background(), prompt, n, -1, model.Sampling{})
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != n {
				t.Fatalf("%s generated %d tokens, want %d", eng.Name(), len(out), n)
			}
			outs = append(outs, out)
		}
		for i := range outs[0] {
			if outs[0][i] != outs[1][i] {
				t.Fatalf("%s: token %d: cpu %d, cuda %d\ncpu:  %v\ncuda: %v", dir, i, outs[0][i], outs[1][i], outs[0], outs[1])
			}
		}
		// Stopping: a stop token ends the run and is included.
		stop := outs[1][3]
		out, err := e.Generate(context.Background(), prompt, n, stop, model.Sampling{})
		if err != nil {
			t.Fatal(err)
		}
		if len(out) == 0 || out[len(out)-1] != stop || len(out) > 4 {
			t.Fatalf("generation with stop %d returned %v", stop, out)
		}
		// A cancelled context ends it before its first new token.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if out, err := e.Generate(ctx, prompt, n, -1, model.Sampling{}); !errors.Is(err, context.Canceled) || len(out) != 0 {
			t.Fatalf("generation with a cancelled context returned %v, %v; want no tokens and context.Canceled", out, err)
		}
	}
}

// Asking for more device memory than exists is refused before allocating,
// naming the bytes and what to change.
func TestOutOfMemoryNamesSizes(t *testing.T) {
	skipWithoutGPU(t)
	c := model.Presets["small"]
	_, err := New(c, model.Options{Precision: "bf16", MaxBatch: 4096, MaxSeq: 4096})
	if err == nil {
		t.Fatal("an engine for a 4096 x 4096 batch fit on the GPU; the test needs a larger one")
	}
	var me *model.MemoryError
	if !errors.As(err, &me) {
		t.Fatalf("error is not a model.MemoryError: %v", err)
	}
	for _, want := range []string{"needs", "available", "--batch", "--seq"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
	if me.Needed <= me.Available {
		t.Errorf("needed %d <= available %d", me.Needed, me.Available)
	}
	var b interface{ BadInput() bool }
	if !errors.As(err, &b) || !b.BadInput() {
		t.Error("out of memory is not marked bad input")
	}
}

// Training on the GPU moves the loss like the CPU engine (fp32, a few steps).
func TestTrainingStepsMatchCPU(t *testing.T) {
	c, p, b := loadGolden(t, goldenDirs[1])
	o := model.Options{Precision: "fp32", MaxBatch: b.B, MaxSeq: b.T}
	e := newEngine(t, c, o)
	cpu, err := model.NewEngine("cpu", c, o)
	if err != nil {
		t.Fatal(err)
	}
	defer cpu.Close()
	opt := model.AdamW{LR: 3e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}
	var curves [2][]float64
	for k, eng := range []model.Engine{cpu, e} {
		if err := eng.SetParams(p); err != nil {
			t.Fatal(err)
		}
		for s := 0; s < 10; s++ {
			if err := eng.ZeroGrad(); err != nil {
				t.Fatal(err)
			}
			if err := eng.ForwardBackward(b, 1); err != nil {
				t.Fatal(err)
			}
			if err := eng.Step(opt); err != nil {
				t.Fatal(err)
			}
			m, err := eng.Metrics()
			if err != nil {
				t.Fatal(err)
			}
			curves[k] = append(curves[k], m.Loss)
		}
	}
	for s := range curves[0] {
		if math.Abs(curves[0][s]-curves[1][s]) > 1e-4*curves[0][s] {
			t.Errorf("step %d: cpu loss %.7g, cuda %.7g", s, curves[0][s], curves[1][s])
		}
	}
	if curves[1][9] >= curves[1][0] {
		t.Errorf("loss did not fall over 10 steps on one batch: %v", curves[1])
	}
	t.Logf("cpu %v\ncuda %v", curves[0], curves[1])
}

// patternBatch is a B x T batch of ids spread over the vocabulary by two
// primes: the same every time, with no data to load.
func patternBatch(c model.Config, B, T int) model.Batch {
	n := B * T
	b := model.Batch{B: B, T: T, Inputs: make([]int32, n), Targets: make([]int32, n)}
	for i := range b.Inputs {
		b.Inputs[i] = int32((i * 7919) % c.VocabSize)
		b.Targets[i] = int32((i * 104729) % c.VocabSize)
	}
	return b
}

// benchAdamW is the optimizer of the speed checks, as sched bench sets it.
var benchAdamW = model.AdamW{LR: 4e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}

// stepOnce runs a forward, backward and optimizer step on b and returns
// the step's metrics.
func stepOnce(t testing.TB, e *Engine, b model.Batch) model.StepMetrics {
	t.Helper()
	if err := e.ForwardBackward(b, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.Step(benchAdamW); err != nil {
		t.Fatal(err)
	}
	m, err := e.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// BenchmarkTrainStep times one training step (forward, backward, AdamW,
// Metrics) of the small preset in bf16; tok/s is the figure to compare.
func BenchmarkTrainStep(b *testing.B) {
	for _, sz := range []struct {
		name string
		B, T int
	}{{"small-8x1024", 8, 1024}, {"small-32x1024", 32, 1024}} {
		b.Run(sz.name, func(b *testing.B) {
			c := model.Presets["small"]
			e := newEngine(b, c, model.Options{Precision: "bf16", MaxBatch: sz.B, MaxSeq: sz.T})
			if err := e.SetParams(model.InitParams(c, 1)); err != nil {
				b.Fatal(err)
			}
			n := sz.B * sz.T
			batch := patternBatch(c, sz.B, sz.T)
			opt := benchAdamW
			step := func() {
				if err := e.ZeroGrad(); err != nil {
					b.Fatal(err)
				}
				if err := e.ForwardBackward(batch, 1); err != nil {
					b.Fatal(err)
				}
				if err := e.Step(opt); err != nil {
					b.Fatal(err)
				}
				if _, err := e.Metrics(); err != nil {
					b.Fatal(err)
				}
			}
			step() // allocation, module load, cuBLASLt heuristics
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step()
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(float64(e.Memory().PeakAllocated)/(1<<30), "peakGiB")
		})
	}
}
