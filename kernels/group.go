package kernels

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// Group trains one model data-parallel on several GPUs of this host
// (docs/decisions/multi-gpu.md): an Engine per GPU, each on its own locked
// OS thread, holding the whole model and its optimizer state. A step's
// micro-batches go to the GPUs in turn (the i-th since ZeroGrad to GPU
// i mod N), which is the split trainer.GlobalBatch describes: each GPU
// trains whole micro-batches of the one-GPU run, scaled by 1/accumulate as
// there. ForwardBackward only queues a micro-batch's work, so the GPUs run
// theirs side by side while the caller reads the next one. Step sums the
// gradients and the loss over the GPUs with one in-place NCCL all-reduce
// each, on every GPU's main stream, before the clipping and AdamW that
// every GPU then takes alike: NCCL gives every rank the same bytes and the
// update is deterministic, so the weights stay identical without being
// sent. Everything that reads the state (parameters, checkpoints,
// evaluation, generation) reads GPU 0's.
type Group struct {
	cfg   model.Config
	ranks []*Engine
	nccl  *cuda.NCCL
	// next is how many micro-batches this step has queued.
	next int
	// size is the micro-batches of a step (0: not known), which the GPUs
	// that sum their gradients in buckets (buckets.go) need: the backward
	// of each GPU's last micro-batch sums them. sums says whether this
	// step does, decided at its first micro-batch. held marks the GPUs
	// whose last micro-batch is staged but not yet queued: the last round
	// is queued whole or not at all, so that no GPU waits in an all-reduce
	// that a step stopped part-way leaves the others out of.
	size int
	sums bool
	held []*model.Batch
	// mu guards comms and broken, which a failing rank or the hang watch
	// changes while the other ranks run.
	mu    sync.Mutex
	comms []*cuda.Comm
	// calls is held for reading by each call into NCCL with a
	// communicator, and for writing by abort and Close, so that no
	// communicator is freed under a call that uses it.
	calls sync.RWMutex
	// broken is the error that aborted the communicators: the group
	// cannot train on, and every call returns it.
	broken error
	// unhang unregisters the group's abort from the hang watch.
	unhang func()
}

// NewGroup makes a Group over the first o.GPUs GPUs, loading NCCL, which
// keeps NVLink multicast off. For model.AllGPUs it takes the most GPUs the
// driver sees that divide o.Accumulate (every GPU it sees where o gives no
// accumulate), saying through o.Log when that leaves some out: gpus all
// asks for what the host has, and a host of 3 GPUs trains a step of 16
// micro-batches on 2 rather than not at all. One GPU is a Group too (a
// one-rank communicator), which tests use to hold it to the single Engine.
func NewGroup(c model.Config, o model.Options, k Options) (*Group, error) {
	drv, err := cuda.LoadDriver()
	if err != nil {
		return nil, err
	}
	seen, err := drv.DeviceCount()
	if err != nil {
		return nil, &cuda.UnavailableError{Err: err}
	}
	n, notice, err := groupSize(o.GPUs, seen, o.Accumulate)
	if err != nil {
		return nil, err
	}
	if notice != "" && o.Log != nil {
		o.Log(notice)
	}
	nc, err := cuda.LoadNCCL()
	if err != nil {
		return nil, err
	}
	g := &Group{cfg: c, nccl: nc, size: o.Accumulate}
	// One at a time: the first compiles the kernels into the on-disk
	// cache, and the others load them from it.
	for d := 0; d < n; d++ {
		kd := k
		kd.device = d
		e, err := NewWithOptions(c, o, kd)
		if err != nil {
			g.Close()
			return nil, fmt.Errorf("GPU %d of %d: %w", d, n, err)
		}
		g.ranks = append(g.ranks, e)
	}
	if err := g.join(); err != nil {
		g.Close()
		return nil, err
	}
	g.held = make([]*model.Batch, n)
	if n > 1 || k.bucketsOnOne {
		if err := g.each(func(_ int, e *Engine) error {
			return e.th.do(func() error { return e.newBuckets(k.bucketBytes) })
		}); err != nil {
			g.Close()
			return nil, err
		}
	}
	if o.Log != nil && k.bucketBytes > 0 {
		buckets := -1
		if b := g.ranks[0].bk; b != nil {
			buckets = b.count()
		}
		o.Log(bucketsNotice(k.bucketBytes, n, c.MoE(), buckets))
	}
	// A wait for a collective that a hung or lost GPU will never join
	// ends when the hang watch aborts the communicators.
	g.unhang = cuda.OnHang(func() {
		g.abort(fmt.Errorf("a wait for the GPUs lasted KILN_CUDA_HANG_TIMEOUT (%s)", cuda.HangTimeout()))
	})
	return g, nil
}

// bucketsNotice says what KILN_NCCL_BUCKET_MB (bytes) does for a group of
// n GPUs whose engines sum their gradients in that many buckets (-1: in
// none).
func bucketsNotice(bytes int64, n int, moe bool, buckets int) string {
	set := fmt.Sprintf("KILN_NCCL_BUCKET_MB=%d", bytes>>20)
	switch {
	case n == 1:
		return set + ": one GPU, no gradients to sum over GPUs"
	case moe:
		return set + ": a mixture of experts sums its gradients after the backward"
	}
	return fmt.Sprintf("%s: the gradients are summed over the %d GPUs in %d buckets, all but the last during the backward of each step's last micro-batch", set, n, buckets)
}

// groupSize is how many GPUs a group of gpus (a number, or model.AllGPUs)
// trains on where the driver sees seen, for steps of accumulate
// micro-batches (0: not known), and the notice to log when gpus all leaves
// some of them out. A number is taken as asked, and a step it cannot
// share is refused at the step, as the run's settings refuse it.
func groupSize(gpus, seen, accumulate int) (int, string, error) {
	n := gpus
	switch {
	case n == model.AllGPUs:
		n = model.DividingGPUs(seen, accumulate)
	case n < 1:
		return 0, "", &model.EngineError{Msg: fmt.Sprintf("gpus %d: give a number of GPUs, or all", n)}
	case n > seen:
		return 0, "", &model.EngineError{Msg: fmt.Sprintf("gpus %d: this process sees %d GPU(s) (CUDA_VISIBLE_DEVICES, KILN_GPUS in compose): ask for at most %d", n, seen, seen)}
	}
	if n < 1 {
		return 0, "", &cuda.UnavailableError{Err: errors.New("the driver sees no GPU")}
	}
	if n < seen && gpus == model.AllGPUs {
		return n, model.FewerGPUsNotice(fmt.Sprintf("gpus all: this process sees %d GPUs", seen), seen, n, accumulate), nil
	}
	return n, "", nil
}

// join makes the communicator of the group's GPUs in one call, from a
// thread of its own (NCCL makes each device current on it in turn): a
// failure returns at once instead of leaving the other ranks waiting for
// one that will not join, as separate ncclCommInitRank calls would. On
// several hosts each host's ranks would join with InitRank and an id
// passed through the run's Redis keys.
func (g *Group) join() error {
	devices := make([]int, len(g.ranks))
	for r := range devices {
		devices[r] = r
	}
	t := newThread()
	defer t.stop()
	return t.do(func() error {
		cs, err := g.nccl.InitAll(devices)
		g.comms = cs
		return err
	})
}

// each runs f for every rank at once and waits for all. An error on any
// rank aborts the communicators at once, so that no rank is left waiting
// in a collective for one that will not come. A call during which the
// communicators were aborted fails even where every rank returned: an
// aborted collective ends without an error, its sums part made, so what
// the ranks read or did after it must not count.
func (g *Group) each(f func(r int, e *Engine) error) error {
	if err := g.brokenErr(); err != nil {
		return err
	}
	errs := make([]error, len(g.ranks))
	var wg sync.WaitGroup
	for r, e := range g.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(r, e); err != nil {
				errs[r] = fmt.Errorf("GPU %d: %w", r, err)
				g.abort(errs[r])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return g.brokenErr()
}

// brokenErr is the error that aborted the group, or nil.
func (g *Group) brokenErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.broken
}

// withComm runs f with rank r's communicator, which stays whole until f
// returns; it returns the group's error once the communicators are
// aborted or closed.
func (g *Group) withComm(r int, f func(c *cuda.Comm) error) error {
	g.calls.RLock()
	defer g.calls.RUnlock()
	g.mu.Lock()
	var c *cuda.Comm
	if r < len(g.comms) {
		c = g.comms[r]
	}
	broken := g.broken
	g.mu.Unlock()
	switch {
	case broken != nil:
		return broken
	case c == nil:
		return errors.New("the GPUs' communicator is closed")
	}
	return f(c)
}

// abort ends every communicator's pending work after a failure on one
// rank, or a hang; the group is unusable after it. It is called from any
// goroutine while the ranks' threads may wait in a collective, which
// ncclCommAbort ends: it is not run on them.
func (g *Group) abort(cause error) {
	g.mu.Lock()
	if g.broken != nil {
		g.mu.Unlock()
		return
	}
	g.broken = fmt.Errorf("the GPUs' communicator was aborted after: %w", cause)
	comms := g.comms
	g.comms = make([]*cuda.Comm, len(comms))
	g.mu.Unlock()
	// After the calls under way: ncclCommAbort frees the communicator.
	g.calls.Lock()
	defer g.calls.Unlock()
	for _, c := range comms {
		if c != nil {
			_ = c.Abort()
		}
	}
}

// Devices implements model.Parallel.
func (g *Group) Devices() int { return len(g.ranks) }

// SetAccumulate implements model.Parallel: each step trains micro
// micro-batches.
func (g *Group) SetAccumulate(micro int) { g.size = micro }

// Name implements model.Engine.
func (g *Group) Name() string { return "cuda" }

// Config implements model.Engine.
func (g *Group) Config() model.Config { return g.cfg }

// SetParams implements model.Engine: every GPU gets the same weights.
func (g *Group) SetParams(p *model.Params) error {
	return g.each(func(_ int, e *Engine) error { return e.SetParams(p) })
}

// Params implements model.Engine (GPU 0's, which every GPU holds).
func (g *Group) Params(p *model.Params) error { return g.ranks[0].Params(p) }

// SetOptimizerState implements model.Engine.
func (g *Group) SetOptimizerState(s *model.OptimizerState) error {
	return g.each(func(_ int, e *Engine) error { return e.SetOptimizerState(s) })
}

// OptimizerState implements model.Engine.
func (g *Group) OptimizerState() (*model.OptimizerState, error) { return g.ranks[0].OptimizerState() }

// CopyState implements model.StateCopier with GPU 0's state.
func (g *Group) CopyState() (func() (*model.Params, *model.OptimizerState, error), error) {
	if err := g.brokenErr(); err != nil {
		return nil, err
	}
	return g.ranks[0].CopyState()
}

// ZeroGrad implements model.Engine. A last round that a stopped step left
// part-way is dropped unqueued.
func (g *Group) ZeroGrad() error {
	g.next = 0
	clear(g.held)
	return g.each(func(_ int, e *Engine) error { return e.ZeroGrad() })
}

// ForwardBackward implements model.Engine: the micro-batch goes to the
// next GPU in turn. It returns once the work is queued on that GPU; where
// the GPUs sum their gradients during the backward, a GPU's last
// micro-batch of the step is staged and queued with the others' once the
// step's last micro-batch is in.
func (g *Group) ForwardBackward(b model.Batch, scale float32) error {
	if err := g.brokenErr(); err != nil {
		return err
	}
	n := len(g.ranks)
	i, r := g.next, g.next%n
	if i == 0 {
		g.sums = g.sumsInBackward()
	}
	if g.sums && i >= g.size {
		return &model.EngineError{Msg: fmt.Sprintf("micro-batch %d of a step of %d (accumulate): the GPUs have summed this step's gradients already", i+1, g.size)}
	}
	g.next++
	if !g.sums || i < g.size-n {
		if err := g.ranks[r].ForwardBackward(b, scale); err != nil {
			err = fmt.Errorf("GPU %d: %w", r, err)
			g.abort(err)
			return err
		}
		return nil
	}
	e := g.ranks[r]
	count, err := e.checkBatch(b, true)
	if err == nil {
		err = e.th.do(func() error { return e.stageMicro(b, count, scale) })
	}
	if err != nil {
		err = fmt.Errorf("GPU %d: %w", r, err)
		g.abort(err)
		return err
	}
	g.held[r] = &b
	if i < g.size-1 {
		return nil
	}
	defer clear(g.held)
	return g.each(func(r int, e *Engine) error {
		return e.th.do(func() error { return e.runMicro(*g.held[r], rankComm{g, r}) })
	})
}

// rankComm is rank r's communicator as the summing backward calls it:
// each all-reduce holds the communicator whole for its call only, so that
// an abort waits for no more than one enqueue.
type rankComm struct {
	g *Group
	r int
}

func (rc rankComm) AllReduceSum(send, recv cuda.Ptr, count int, stream uintptr) error {
	return rc.g.withComm(rc.r, func(c *cuda.Comm) error { return c.AllReduceSum(send, recv, count, stream) })
}

// GradientSum implements model.Parallel, for the step SetAccumulate set.
func (g *Group) GradientSum() string {
	switch {
	case len(g.ranks) == 1:
		return "none: one GPU"
	case g.sumsInBackward():
		return fmt.Sprintf("%d buckets, all but the last during the backward", g.ranks[0].bk.count())
	}
	return "one all-reduce after the backward"
}

// sumsInBackward says whether the GPUs sum a step's gradients during the
// backward of its last micro-batch: with buckets, a step of known size
// that every GPU takes a share of.
func (g *Group) sumsInBackward() bool {
	n := len(g.ranks)
	return g.size >= n && g.size%n == 0 && g.ranks[0].sumsInBackward()
}

// Step implements model.Engine: the all-reduce of the gradients and the
// loss (unless the backward summed them), then the clipping and AdamW, on
// every GPU. A last round left part-way is never a multiple of the GPUs,
// so the first check refuses it.
func (g *Group) Step(o model.AdamW) error {
	if g.next == 0 || g.next%len(g.ranks) != 0 {
		return &model.EngineError{Msg: fmt.Sprintf("a step of %d micro-batches on %d GPUs: every GPU must train the same number, so accumulate must be a multiple of gpus",
			g.next, len(g.ranks))}
	}
	return g.each(func(r int, e *Engine) error {
		if !e.summed {
			if err := g.queueReduce(r, e); err != nil {
				return err
			}
			// A profile's time for the all-reduce, read once the
			// communicator is let go: an abort must not wait for a
			// collective a failed GPU will never join.
			if err := e.th.do(func() error { return e.timedRead(allReduceName) }); err != nil {
				return err
			}
		}
		return e.Step(o)
	})
}

// queueReduce queues rank r's sums of the step's gradients and loss over
// the GPUs (reduce), holding the communicator for the enqueue only.
func (g *Group) queueReduce(r int, e *Engine) error {
	return g.withComm(r, func(c *cuda.Comm) error { return e.th.do(func() error { return e.reduce(c) }) })
}

// reduce sums the gradients and the loss (and a mixture of experts'
// load-balancing loss, which Metrics reports beside it) over c's ranks in
// place, on the main stream, which the backward's side stream has joined:
// the step's norm and AdamW, queued after it, read the sums. Each
// micro-batch's load-balancing loss is its own, on one GPU as on several,
// so the sum is the one-GPU step's. In a profile the gradients' reduction
// is a line of its own, which holds the wait for the slowest GPU too:
// reduce queues it (timedQueue), and the caller reads its time
// (timedRead).
func (e *Engine) reduce(c *cuda.Comm) error {
	if err := e.timedQueue(func() error { return c.AllReduceSum(e.grads, e.grads, int(e.n), e.sh) }); err != nil {
		return err
	}
	if e.moe != nil {
		if err := c.AllReduceSum(e.moe.auxAcc, e.moe.auxAcc, 1, e.sh); err != nil {
			return err
		}
		if err := c.AllReduceSum(e.moe.shareAcc, e.moe.shareAcc, e.cfg.Experts, e.sh); err != nil {
			return err
		}
	}
	if err := c.AllReduceSum(e.lossAcc, e.lossAcc, 1, e.sh); err != nil {
		return err
	}
	e.summed = true
	return nil
}

// allReduceName is the gradients' all-reduce in a profile.
const allReduceName = "NCCL all-reduce (grads)"

// Metrics implements model.Engine: it waits for every GPU, so that an
// error on any of them surfaces here, and returns GPU 0's figures, which
// after the all-reduce are the step's.
func (g *Group) Metrics() (model.StepMetrics, error) {
	return g.metrics(func(_ int, e *Engine) (model.StepMetrics, error) { return e.Metrics() })
}

// metrics reads every GPU's metrics with get, asks each communicator for
// an error of its own, and returns GPU 0's.
func (g *Group) metrics(get func(r int, e *Engine) (model.StepMetrics, error)) (model.StepMetrics, error) {
	ms := make([]model.StepMetrics, len(g.ranks))
	err := g.each(func(r int, e *Engine) error {
		m, err := get(r, e)
		ms[r] = m
		if err == nil {
			err = g.withComm(r, func(c *cuda.Comm) error { return e.th.do(c.AsyncError) })
		}
		return err
	})
	return ms[0], err
}

// MetricsLater implements model.MetricsAhead: each GPU copies its metrics
// behind its own step; the wait waits for every GPU's copy, asks each
// communicator for an error of its own, and returns GPU 0's metrics, as
// Metrics does.
func (g *Group) MetricsLater() (func() (model.StepMetrics, error), error) {
	waits := make([]func() (model.StepMetrics, error), len(g.ranks))
	if err := g.each(func(r int, e *Engine) error {
		var err error
		waits[r], err = e.MetricsLater()
		return err
	}); err != nil {
		return nil, err
	}
	return func() (model.StepMetrics, error) {
		return g.metrics(func(r int, _ *Engine) (model.StepMetrics, error) { return waits[r]() })
	}, nil
}

// Grads implements model.Engine: the gradients accumulated on every GPU
// since ZeroGrad, summed in rank order. Once summed over the GPUs (by Step,
// or during the last backward) every GPU holds the sum; it reads GPU 0's
// then.
func (g *Group) Grads(p *model.Params) error {
	if err := g.ranks[0].Grads(p); err != nil {
		return err
	}
	if g.next == 0 || g.ranks[0].summed {
		return nil
	}
	part, err := model.ParamsOver(g.cfg, make([]float32, len(p.Data)))
	if err != nil {
		return err
	}
	for _, e := range g.ranks[1:] {
		if err := e.Grads(part); err != nil {
			return err
		}
		for i, v := range part.Data {
			p.Data[i] += v
		}
	}
	return nil
}

// Logits implements model.Engine on GPU 0.
func (g *Group) Logits(b model.Batch) ([]float32, error) { return g.ranks[0].Logits(b) }

// EvalLoss implements model.Engine on GPU 0.
func (g *Group) EvalLoss(b model.Batch) (float64, error) { return g.ranks[0].EvalLoss(b) }

// Generate implements model.Engine on GPU 0.
func (g *Group) Generate(ctx context.Context, prompt []int32, n int, stop int32, s model.Sampling) ([]int32, error) {
	return g.ranks[0].Generate(ctx, prompt, n, stop, s)
}

// Memory implements model.Engine: GPU 0's, which every GPU matches.
func (g *Group) Memory() model.MemoryStats { return g.ranks[0].Memory() }

// Device implements model.Device: GPU 0's.
func (g *Group) Device() Device { return g.ranks[0].Device() }

// SetProfiling implements model.Profiler on every GPU.
func (g *Group) SetProfiling(on bool) error {
	return g.each(func(_ int, e *Engine) error { return e.SetProfiling(on) })
}

// KernelTimes implements model.Profiler: GPU 0's, the gradients'
// all-reduce included (allReduceName).
func (g *Group) KernelTimes() map[string]float64 { return g.ranks[0].KernelTimes() }

// Close implements model.Engine: the communicators, then the engines.
func (g *Group) Close() error {
	if g.unhang != nil {
		g.unhang()
	}
	var errs []error
	g.mu.Lock()
	comms := g.comms
	g.comms = nil
	g.mu.Unlock()
	// After the calls under way; let go before the engines close, which
	// waits for their GPUs: an abort that took the communicators first
	// must still end a collective they wait for.
	g.calls.Lock()
	for r, c := range comms {
		if c != nil {
			errs = append(errs, g.ranks[r].th.do(c.Destroy))
		}
	}
	g.calls.Unlock()
	for _, e := range g.ranks {
		errs = append(errs, e.Close())
	}
	g.ranks = nil
	return errors.Join(errs...)
}
