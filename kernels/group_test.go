package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// newGroup makes a Group of gpus GPUs, skipping where there is no GPU, too
// few of them, or no NCCL. GEMM algorithms are the library's first choice
// (not timed), so that two engines of one process run the same ones.
func newGroup(t *testing.T, c model.Config, o model.Options, gpus int) *Group {
	t.Helper()
	return newGroupWith(t, c, o, gpus, envOptions(t))
}

// newGroupWith is newGroup with the engines' options k.
func newGroupWith(t *testing.T, c model.Config, o model.Options, gpus int, k Options) *Group {
	t.Helper()
	skipWithoutGPU(t)
	if _, err := cuda.LoadNCCL(); err != nil {
		t.Skipf("no NCCL here, skipping: %v", err)
	}
	if n := cuda.Devices(); n < gpus {
		t.Skipf("%d GPU(s) here, the test needs %d", n, gpus)
	}
	o.GPUs = gpus
	g, err := NewGroup(c, o, k)
	if err != nil {
		t.Fatalf("new group of %d GPUs: %v", gpus, err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// testKernel compiles src, which defines the kernel name, with NVRTC
// (compute_80) and loads it on e's GPU; the module is unloaded when the
// test ends, before the engines its earlier cleanups close.
func testKernel(t *testing.T, e *Engine, name, src string) *cuda.Function {
	t.Helper()
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Fatal(err)
	}
	ptx, err := nv.Compile(name+".cu", src, "compute_80")
	if err != nil {
		t.Fatal(err)
	}
	var f *cuda.Function
	if err := e.th.do(func() error {
		m, err := e.dv.LoadModule(ptx)
		if err != nil {
			return err
		}
		t.Cleanup(func() { e.th.do(m.Unload) })
		f, err = m.Function(name)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return f
}

// groupBatches are steps x micro random micro-batches, a few repeated ids
// among them (the embedding's accumulation path) and a masked target.
func groupBatches(c model.Config, steps, micro, B, T int) []model.Batch {
	r := rand.New(rand.NewPCG(11, 12))
	var out []model.Batch
	for range steps * micro {
		b := model.Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
		for i := range b.Inputs {
			b.Inputs[i] = int32(r.IntN(min(40, c.VocabSize)))
			b.Targets[i] = int32(r.IntN(c.VocabSize))
		}
		b.Targets[3] = -1
		out = append(out, b)
	}
	return out
}

// A group of one GPU is one engine with a one-rank all-reduce before each
// step, which returns its input: the same steps bit for bit. So it is with
// the gradients summed in buckets during the step's last backward, where
// the norms' weight gradients are summed a bucket at a time (a bucket a
// layer, and a bucket of two layers).
func TestGroupOfOneGPUTrainsAsOneEngine(t *testing.T) {
	t.Setenv("KILN_CUDA_GEMM_TUNE", "off")
	for _, c := range []struct {
		name      string
		cfg       model.Config
		precision string
		B, T      int
	}{
		{"small bf16", model.Presets["small"], "bf16", 2, 256},
		{"hd64 fp32", goldenConfig(t, goldenDirs[1]), "fp32", 2, 64},
		{"moe bf16", goldenConfig(t, moeGolden), "bf16", 2, 64},
	} {
		starts, _ := layerStarts(c.cfg)
		for _, bytes := range []int64{0, 1, 2 * (starts[1] - starts[0]) * 4} {
			t.Run(fmt.Sprintf("%s/buckets %d", c.name, bytes), func(t *testing.T) {
				o := model.Options{Precision: c.precision, MaxBatch: c.B, MaxSeq: c.T, Accumulate: 2}
				k := envOptions(t)
				k.bucketBytes, k.bucketsOnOne = bytes, true
				g := newGroupWith(t, c.cfg, o, 1, k)
				e := newEngine(t, c.cfg, o)
				p0 := model.InitParams(c.cfg, 7)
				batches := groupBatches(c.cfg, 3, 2, c.B, c.T)
				want := trainSteps(t, e, p0, batches, 2)
				got := trainSteps(t, g, p0, batches, 2)
				sameBits(t, "on the engine", "on a group of one", want, got)
				summing := fmt.Sprintf("%dx%d+sums", c.B, c.T)
				_, recorded := g.ranks[0].GraphNodes()[summing]
				if want := bytes > 0 && !c.cfg.MoE() && !g.ranks[0].kopt.eager; recorded != want {
					t.Errorf("a graph %s recorded: %v, want %v", summing, recorded, want)
				}
				if bytes == 1 && !c.cfg.MoE() {
					// A step: the first micro-batch's one launch, and the
					// last's one a layer.
					if got, want := g.ranks[0].LaunchCounts()["rmsnorm_dw_reduce"], 3*(1+c.cfg.Layers); got != want {
						t.Errorf("rmsnorm_dw_reduce launched %d times in 3 steps of %d layers, want %d", got, c.cfg.Layers, want)
					}
				}
			})
		}
	}
}

// Two GPUs with one micro-batch each take the step one GPU takes with
// both: the same losses and weights up to the order of fp32 sums, and the
// two GPUs' weights identical to each other without ever being sent. So
// they do with the gradients summed in buckets during the last backward
// (a bucket a layer; the mixture of experts sums after the backward).
func TestGroupOfTwoGPUsMatchesOne(t *testing.T) {
	t.Setenv("KILN_CUDA_GEMM_TUNE", "off")
	for _, dir := range []string{goldenDirs[1], moeGolden} {
		for _, bytes := range []int64{0, 1} {
			t.Run(fmt.Sprintf("%s/buckets %d", filepath.Base(dir), bytes), func(t *testing.T) { twoGPUsMatchOne(t, goldenConfig(t, dir), bytes) })
		}
	}
}

func twoGPUsMatchOne(t *testing.T, c model.Config, bytes int64) {
	o := model.Options{Precision: "fp32", MaxBatch: 2, MaxSeq: 64}
	e := newEngine(t, c, o)
	p0 := model.InitParams(c, 7)
	for _, micro := range []int{2, 4} {
		o.Accumulate = micro
		k := envOptions(t)
		k.bucketBytes = bytes
		g := newGroupWith(t, c, o, 2, k)
		// What a bench line says of it: a mixture of experts takes no buckets.
		sum := "one all-reduce after the backward"
		if bytes > 0 && !c.MoE() {
			sum = fmt.Sprintf("%d buckets, all but the last during the backward", c.Layers+1)
		}
		if got := g.GradientSum(); got != sum {
			t.Errorf("accumulate %d: GradientSum %q, want %q", micro, got, sum)
		}
		batches := groupBatches(c, 4, micro, 2, 64)
		want := trainSteps(t, e, p0, batches, micro)
		got := trainSteps(t, g, p0, batches, micro)
		for i := range want.losses {
			if d := math.Abs(got.losses[i] - want.losses[i]); d > 1e-6*math.Abs(want.losses[i]) {
				t.Errorf("accumulate %d, step %d: loss on 2 GPUs %.9g, on 1 %.9g", micro, i+1, got.losses[i], want.losses[i])
			}
			if d := math.Abs(got.aux[i] - want.aux[i]); d > 1e-6*math.Abs(want.aux[i]) {
				t.Errorf("accumulate %d, step %d: load-balancing loss on 2 GPUs %.9g, on 1 %.9g", micro, i+1, got.aux[i], want.aux[i])
			}
		}
		var worst float64
		for i := range want.params {
			worst = math.Max(worst, math.Abs(float64(got.params[i]-want.params[i])))
		}
		// lr 1e-3 and more a step: a weight that moved the other way on
		// one side would be off by ~2e-3.
		if worst > 1e-5 {
			t.Errorf("accumulate %d: weights on 2 GPUs differ from 1 GPU's by up to %.3g", micro, worst)
		}
		t.Logf("accumulate %d: largest weight difference 2 GPUs vs 1: %.3g", micro, worst)
		other := model.NewParams(c)
		if err := g.ranks[1].Params(other); err != nil {
			t.Fatal(err)
		}
		for i := range other.Data {
			if math.Float32bits(other.Data[i]) != math.Float32bits(got.params[i]) {
				t.Fatalf("accumulate %d: GPU 1's weight %d is %.9g, GPU 0's %.9g", micro, i, other.Data[i], got.params[i])
			}
		}
		// After a step the gradients read are the step's, summed once
		// over the GPUs, as one GPU's.
		gg, eg := model.NewParams(c), model.NewParams(c)
		if err := g.Grads(gg); err != nil {
			t.Fatal(err)
		}
		if err := e.Grads(eg); err != nil {
			t.Fatal(err)
		}
		var gworst, gmax float64
		for i := range eg.Data {
			gworst = math.Max(gworst, math.Abs(float64(gg.Data[i]-eg.Data[i])))
			gmax = math.Max(gmax, math.Abs(float64(eg.Data[i])))
		}
		if gworst > 1e-5*gmax {
			t.Errorf("accumulate %d: the gradients read after a step on 2 GPUs differ from 1 GPU's by up to %.3g (largest %.3g)", micro, gworst, gmax)
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// On two GPUs each gradient is g0 + g1 however it is summed, so the
// buckets train bit for bit as the one all-reduce after the backward: in
// bf16, where the side stream's weight-gradient GEMMs run beside the
// backward and a bucket summed before its GEMMs were done would differ.
func TestBucketsTrainAsOneAllReduceOnTwoGPUs(t *testing.T) {
	t.Setenv("KILN_CUDA_GEMM_TUNE", "off")
	c := model.Presets["small"]
	starts, _ := layerStarts(c)
	for _, micro := range []int{2, 4} {
		o := model.Options{Precision: "bf16", MaxBatch: 2, MaxSeq: 256, Accumulate: micro}
		batches := groupBatches(c, 3, micro, 2, 256)
		p0 := model.InitParams(c, 7)
		var want trained
		for _, bytes := range []int64{0, 1, 2 * (starts[1] - starts[0]) * 4} {
			k := envOptions(t)
			k.bucketBytes = bytes
			g := newGroupWith(t, c, o, 2, k)
			got := trainSteps(t, g, p0, batches, micro)
			if err := g.Close(); err != nil {
				t.Fatal(err)
			}
			if bytes == 0 {
				want = got
				continue
			}
			sameBits(t, "with one all-reduce", fmt.Sprintf("with buckets of %d bytes, accumulate %d", bytes, micro), want, got)
		}
	}
}

// A step whose micro-batches the GPUs cannot share evenly is refused, not
// trained with one GPU's gradient missing.
func TestGroupRefusesAnUnevenStep(t *testing.T) {
	c := goldenConfig(t, goldenDirs[1])
	g := newGroup(t, c, model.Options{Precision: "fp32", MaxBatch: 2, MaxSeq: 64}, 2)
	if err := g.SetParams(model.InitParams(c, 1)); err != nil {
		t.Fatal(err)
	}
	if err := g.ZeroGrad(); err != nil {
		t.Fatal(err)
	}
	if err := g.ForwardBackward(groupBatches(c, 1, 1, 2, 64)[0], 1); err != nil {
		t.Fatal(err)
	}
	err := g.Step(benchAdamW)
	var ee *model.EngineError
	if !errors.As(err, &ee) || !strings.Contains(err.Error(), "multiple of gpus") {
		t.Fatalf("a step of 1 micro-batch on 2 GPUs: %v; want an EngineError naming accumulate and gpus", err)
	}
}

// More GPUs than the process sees is refused in one line naming both.
func TestGroupRefusesMoreGPUsThanSeen(t *testing.T) {
	skipWithoutGPU(t)
	if _, err := cuda.LoadNCCL(); err != nil {
		t.Skipf("no NCCL here, skipping: %v", err)
	}
	n := cuda.Devices()
	_, err := NewGroup(model.Presets["tiny"], model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: 16, GPUs: n + 1}, envOptions(t))
	var ee *model.EngineError
	if !errors.As(err, &ee) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("gpus %d with %d GPU(s): %v; want a one-line EngineError", n+1, n, err)
	}
}

// A wait for the group's GPUs that lasts the hang timeout aborts its
// communicators (here a one-rank group whose GPU a waiting kernel holds):
// the group is broken, says why, and trains no more.
func TestAGroupAbortsItsCommunicatorWhenAWaitHangs(t *testing.T) {
	c := model.Presets["tiny"]
	g := newGroup(t, c, model.Options{Precision: "fp32", MaxBatch: 2, MaxSeq: 16}, 1)
	e := g.ranks[0]
	spin := testKernel(t, e, "spin", `extern "C" __global__ void spin(volatile unsigned int* flag) {
	while (*flag == 0) { __nanosleep(1000); }
}`)
	var flag *cuda.HostBuffer
	if err := e.th.do(func() error {
		var err error
		if flag, err = e.dv.AllocHost(4); err != nil {
			return err
		}
		clear(flag.Bytes())
		return spin.Launch(cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 1, Y: 1, Z: 1}, 0, e.sh, cuda.Ptr(uintptr(unsafe.Pointer(&flag.Bytes()[0]))))
	}); err != nil {
		t.Fatal(err)
	}
	release := func() { atomic.StoreUint32((*uint32)(unsafe.Pointer(&flag.Bytes()[0])), 1) }
	defer release()
	hung := make(chan cuda.Hang, 4)
	defer cuda.SetHangTimeout(cuda.HangTimeout())
	cuda.SetHangTimeout(400 * time.Millisecond)
	defer cuda.SetHangHandler(func(h cuda.Hang) { hung <- h })()
	waited := make(chan error, 1)
	go func() {
		waited <- g.each(func(_ int, e *Engine) error { return e.th.do(e.st.Synchronize) })
	}()
	h := <-hung
	// The abort runs in a goroutine of its own (it may wait for the GPU).
	for deadline := time.Now().Add(time.Minute); g.brokenErr() == nil && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if err := g.brokenErr(); err == nil || !strings.Contains(err.Error(), "KILN_CUDA_HANG_TIMEOUT (400ms)") {
		t.Errorf("after a hang of %s in %s the group is broken by %v; want the hang timeout named", h.Waited, h.Call, err)
	}
	release()
	// The wait ended, but the communicator was aborted meanwhile: what
	// the ranks did cannot count.
	if err := <-waited; err == nil || !strings.Contains(err.Error(), "KILN_CUDA_HANG_TIMEOUT") {
		t.Fatalf("the wait, released after the abort: %v; want the hang's error", err)
	}
	if err := g.ForwardBackward(groupBatches(c, 1, 1, 2, 16)[0], 1); err == nil || !strings.Contains(err.Error(), "aborted") {
		t.Errorf("a broken group trained on: %v", err)
	}
}

// One GPU failing while another waits in the all-reduce ends the call for
// both: the failing rank aborts the communicators at once, which ends the
// other's wait for a peer that will not join. Without it the waiting rank
// would wait until the hang watch stopped the process.
func TestAGPUFailingEndsTheStepForAll(t *testing.T) {
	t.Run("one all-reduce", func(t *testing.T) {
		aGPUFailingEndsTheStep(t, 0, false, func(g *Group, e *Engine) error { return g.queueReduce(0, e) })
	})
	// A profile times the all-reduce, waiting for it after the
	// communicator is let go: the abort does not wait for that wait.
	t.Run("profiled", func(t *testing.T) {
		aGPUFailingEndsTheStep(t, 0, true, func(g *Group, e *Engine) error { return g.queueReduce(0, e) })
	})
	// GPU 0 in a backward that sums its buckets, after steps that did.
	t.Run("buckets", func(t *testing.T) {
		aGPUFailingEndsTheStep(t, 1, false, func(g *Group, e *Engine) error {
			b := groupBatches(g.cfg, 1, 1, 2, 64)[0]
			count, err := e.checkBatch(b, true)
			if err != nil {
				return err
			}
			return e.th.do(func() error {
				if err := e.stageMicro(b, count, 0.5); err != nil {
					return err
				}
				return e.runMicro(b, rankComm{g, 0})
			})
		})
	})
}

// aGPUFailingEndsTheStep trains a group of two GPUs with buckets of bytes
// for two steps, profiled or not, then has GPU 1 fail once GPU 0 has
// queued its all-reduce with queue and waits for it.
func aGPUFailingEndsTheStep(t *testing.T, bytes int64, profiled bool, queue func(g *Group, e *Engine) error) {
	c := goldenConfig(t, goldenDirs[1])
	k := envOptions(t)
	k.bucketBytes = bytes
	g := newGroupWith(t, c, model.Options{Precision: "fp32", MaxBatch: 2, MaxSeq: 64, Accumulate: 2}, 2, k)
	if err := g.SetProfiling(profiled); err != nil {
		t.Fatal(err)
	}
	trainSteps(t, g, model.InitParams(c, 7), groupBatches(c, 2, 2, 2, 64), 2)
	hung := make(chan cuda.Hang, 1)
	defer cuda.SetHangTimeout(cuda.HangTimeout())
	cuda.SetHangTimeout(2 * time.Minute)
	defer cuda.SetHangHandler(func(h cuda.Hang) { hung <- h })()
	failed := errors.New("a fault on this GPU")
	queued := make(chan struct{})
	err := g.each(func(r int, e *Engine) error {
		if r == 1 {
			// GPU 0's all-reduce is queued and waits for GPU 1's.
			<-queued
			return failed
		}
		err := queue(g, e)
		close(queued)
		if err != nil {
			return err
		}
		return e.th.do(func() error {
			if err := e.timedRead(allReduceName); err != nil {
				return err
			}
			return e.st.Synchronize()
		})
	})
	if !errors.Is(err, failed) || !strings.Contains(err.Error(), "GPU 1") {
		t.Fatalf("the step ended with %v; want GPU 1's fault", err)
	}
	select {
	case h := <-hung:
		t.Fatalf("GPU 0 waited for the all-reduce until the hang watch (%s in %s)", h.Waited, h.Call)
	default:
	}
	if err := g.ForwardBackward(groupBatches(c, 1, 1, 2, 64)[0], 1); err == nil || !strings.Contains(err.Error(), "a fault on this GPU") {
		t.Errorf("after the fault the group trained on: %v", err)
	}
}

// A profile of a group times the gradients' all-reduce on a line of its
// own, beside the kernels: on several GPUs, the share of a step that
// buckets overlapped with the backward could hide.
// So it does where the GPUs would sum in buckets during the backward: a
// profile sums after it, in one all-reduce it can time.
func TestAGroupsProfileTimesTheAllReduce(t *testing.T) {
	c := model.Presets["small"]
	for _, bytes := range []int64{0, 1} {
		t.Run(fmt.Sprintf("buckets %d", bytes), func(t *testing.T) {
			n := cuda.Devices()
			o := model.Options{Precision: "bf16", MaxBatch: 2, MaxSeq: 128, Accumulate: n}
			k := envOptions(t)
			k.bucketBytes, k.bucketsOnOne = bytes, true
			g := newGroupWith(t, c, o, n, k)
			if err := g.SetProfiling(true); err != nil {
				t.Fatal(err)
			}
			trainSteps(t, g, model.InitParams(c, 7), groupBatches(c, 1, n, 2, 128), n)
			times := g.KernelTimes()
			if times[allReduceName] <= 0 {
				t.Fatalf("the profile of a step on %d GPU(s) has no time for %q: %v", n, allReduceName, times)
			}
			t.Logf("%d GPU(s): %s %.3f ms in a step of %d micro-batches of 2 x 128", n, allReduceName, times[allReduceName], n)
		})
	}
}

// A step stopped part-way through its last round, where the GPUs sum the
// gradients during the last backward, leaves no GPU waiting in an
// all-reduce the other never joins: the round is queued whole or not at
// all. The next steps train as they do on GPUs that never stopped, and a
// step given more micro-batches than accumulate is refused, not summed
// twice.
func TestAStepStoppedPartWayLeavesNoGPUWaiting(t *testing.T) {
	t.Setenv("KILN_CUDA_GEMM_TUNE", "off")
	c := goldenConfig(t, goldenDirs[1])
	o := model.Options{Precision: "fp32", MaxBatch: 2, MaxSeq: 64, Accumulate: 2}
	k := envOptions(t)
	k.bucketBytes = 1
	g := newGroupWith(t, c, o, 2, k)
	unstopped := newGroupWith(t, c, o, 2, k)
	hung := make(chan cuda.Hang, 1)
	defer cuda.SetHangTimeout(cuda.HangTimeout())
	cuda.SetHangTimeout(2 * time.Minute)
	defer cuda.SetHangHandler(func(h cuda.Hang) { hung <- h })()
	p0 := model.InitParams(c, 7)
	if err := g.SetParams(p0); err != nil {
		t.Fatal(err)
	}
	if err := g.ZeroGrad(); err != nil {
		t.Fatal(err)
	}
	if err := g.ForwardBackward(groupBatches(c, 1, 1, 2, 64)[0], 0.5); err != nil {
		t.Fatal(err)
	}
	// Stopped here. The steps after it wait for both GPUs' work.
	batches := groupBatches(c, 2, 2, 2, 64)
	want := trainSteps(t, unstopped, p0, batches, 2)
	got := trainSteps(t, g, p0, batches, 2)
	sameBits(t, "on 2 GPUs", "on 2 GPUs after a step stopped part-way", want, got)
	select {
	case h := <-hung:
		t.Fatalf("a GPU waited until the hang watch (%s in %s)", h.Waited, h.Call)
	default:
	}
	if err := g.ZeroGrad(); err != nil {
		t.Fatal(err)
	}
	for i, b := range batches[:2] {
		if err := g.ForwardBackward(b, 0.5); err != nil {
			t.Fatalf("micro-batch %d: %v", i+1, err)
		}
	}
	var ee *model.EngineError
	if err := g.ForwardBackward(batches[2], 0.5); !errors.As(err, &ee) || !strings.Contains(err.Error(), "summed this step's gradients already") {
		t.Fatalf("a third micro-batch in a step of 2: %v; want an EngineError saying the gradients are summed", err)
	}
}
