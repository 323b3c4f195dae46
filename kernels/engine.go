package kernels

import (
	"errors"
	"fmt"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// wsBytes is cuBLASLt's workspace: enough for its split-K and stream-K
// algorithms at the model sizes kiln trains.
const wsBytes = 32 << 20

// gemmCandidates is how many of cuBLASLt's heuristic algorithms each bf16
// GEMM shape times before keeping the fastest, unless Options say
// otherwise (KILN_CUDA_GEMM_TUNE).
const gemmCandidates = 8

// Engine is the CUDA implementation of model.Engine. FP32 master weights,
// gradients and both Adam moments live on the device in one flat buffer
// each, laid out in model.Params order, so that the norm and AdamW run over
// whole buffers. Every device call runs on th, one locked OS thread.
type Engine struct {
	cfg  model.Config
	opt  model.Options
	kopt Options
	th   *thread
	dv   *cuda.Device
	lt   *cuda.LtHandle
	fns  map[string]*cuda.Function
	// kparams: each kernel's parameter kinds, which launch3 checks its
	// arguments against.
	kparams map[string][]paramKind
	// shared: the dynamic shared memory a kernel launches with, in bytes,
	// for the kernels that take any (chooseFlashKernels).
	shared map[string]int
	mods   []*cuda.Module
	mem    *allocator
	Arch   string // what NVRTC built: "sm_90", or "compute_80" when forced
	// CacheHits is how many kernel files came from the on-disk cache.
	CacheHits int

	bf16 bool
	// flash: training attention runs the tiled kernels of flash.cu (bf16,
	// head_dim 64) instead of keeping the (T, T) probabilities.
	flash bool
	// flashRows: the query rows a block of the flash forward takes, 128
	// (flash_fwd128) or 64 (flash_fwd), from KILN_CUDA_FLASH_FWD.
	flashRows int
	// flashFused: the flash backward as flash_bwd_dvec, flash_bwd (or on
	// Hopper flash_bwd_h) and flash_bwd_dq_final (KILN_CUDA_FLASH_BWD=fused)
	// instead of the dq then the dk/dv kernel.
	flashFused bool
	// hopper: the flash kernels of flash_sm90.cu (wgmma) in place of
	// flash.cu's, on a compute capability 9.0 GPU's native build unless
	// KILN_CUDA_ATTENTION=flash-sm80 (chooseFlashKernels).
	hopper bool
	// flashPair: KILN_CUDA_FLASH_PAIR ("", "on" or "off"; flashPairs).
	flashPair string
	// flashTMA: the Hopper flash kernels are the _ht ones, whose tiles the
	// tensor memory accelerator copies: the default where the driver makes
	// tensor maps, KILN_CUDA_FLASH_TMA=off for the _h ones (cp.async). Set
	// only with hopper (chooseFlashKernels).
	flashTMA bool
	// headMode: how the LM head's GEMMs run in bf16 precision (head.go).
	headMode headMode
	// gemmTune: candidates each bf16 GEMM shape times (0: none).
	gemmTune int
	// wsLimit: the bytes of the cuBLASLt workspace (wsBytes allocated) a
	// GEMM may use.
	wsLimit int64
	// headRows: how many rows of logits one chunk of the LM head holds.
	headRows int
	// launches counts kernel launches by name, so tests can tell which
	// attention path ran.
	launches map[string]int
	// With profiling on, every kernel and GEMM is timed by events and
	// waited for: the figures say where a step's device time goes, at the
	// cost of the overlap a normal step has.
	profiling bool
	profMS    map[string]float64
	evA, evB  *cuda.Event
	specs     []model.TensorSpec
	off       []int64 // element offset of each spec in the flat buffers
	n         int64   // total parameters

	params, grads, m, v cuda.Ptr // (n) fp32 each
	// nodecay: the [start, end) element ranges of the flat buffer that AdamW
	// does not decay (the vectors), as pairs of int64, sorted.
	nodecay cuda.Ptr
	nranges int
	wbf     cuda.Ptr // (n) bf16 copy of params for the GEMMs (bf16 precision)
	optStep int

	maxB, maxT int
	a          *acts
	// moe holds the sparse feed-forward's buffers (moe.go); nil for a
	// dense model.
	moe *moeActs
	// moeScalar makes the bf16 expert GEMMs take the straightforward
	// kernels where the fast ones could run, for comparisons in tests.
	moeScalar bool
	// perLayer is the number of specs a layer has: 9 dense, 7 + 3
	// experts with experts.
	perLayer   int
	lossAcc    cuda.Ptr // (1) sum of scale x mean loss since ZeroGrad
	evalAcc    cuda.Ptr // (1)
	norm       cuda.Ptr // (1) last Step's gradient norm
	partial    cuda.Ptr // (normBlocks)
	ws         cuda.Ptr // cuBLASLt workspace
	cosT, sinT cuda.Ptr // (positions, D/2)
	positions  int
	usedAtOpen int64 // device memory in use once the context existed

	// st is the stream every launch, copy and GEMM of the engine runs on
	// (sh its handle): a blocking stream, so the synchronous copies on the
	// legacy stream (Upload, Download) still wait for its work, and the
	// one a graph can be recorded from.
	st *cuda.Stream
	sh uintptr
	// stage carries the per-step values to the device (graph.go).
	stage *staging
	// scal holds the per-step scalars the kernels read (graph.go's scal*).
	scal cuda.Ptr
	// graphs: training steps are recorded as CUDA graphs and replayed
	// (KILN_CUDA_GRAPH, on unless set to off).
	graphs   bool
	recorded map[graphKey]*recorded
	warm     map[graphKey]bool
	// plan is the embedding backward's plan, made on the host
	// (embedding.go) in planHost with planCount as scratch; embPart holds
	// its partial sums and normPart the RMSNorm backwards' per-block dw,
	// a region for each norm of a backward (normSlots of them) until
	// normReduce sums them into the gradients whose addresses normDst
	// lists (normG shares each), through the device table normTab (which
	// holds normTable).
	plan, embPart, normPart cuda.Ptr
	normTab                 cuda.Ptr
	normSlots, normG        int
	normDst, normTable      []uint64
	// normDone: the norms of normDst already summed in this backward.
	normDone int
	// capturing is set while a graph is being recorded.
	capturing           bool
	planHost, planCount []int32
	// GEMMs run on gs with workspace gws: the main stream and e.ws, or
	// the side stream and its own workspace (overlap.go).
	gs  uintptr
	gws cuda.Ptr
	ov  *overlap
	// bk sums the gradients over a group's GPUs in buckets during the
	// backward (buckets.go; nil: one all-reduce in Group.Step); summing is
	// set while the step's last micro-batch queues its backward, and
	// summed says that this step's gradients and loss are summed over the
	// GPUs (by the buckets, or by reduce after the backward).
	bk      *buckets
	summing bool
	summed  bool
	// ck is CopyState's host buffer and stream (snapshot.go).
	ck *stateCopy
	// ahead is MetricsLater's host slots (ahead.go).
	ahead *metricsCopy
}

const normBlocks = 1024

// acts holds the forward activations kept for the backward pass and the
// backward scratch, sized for maxB x maxT rows (N).
type acts struct {
	resid        []cuda.Ptr // L+1 x (N, d): the residual stream entering each layer, then the last
	mid          []cuda.Ptr // L x (N, d): after attention
	ln1, ln2     []cuda.Ptr // L x (N, d)
	rstd1, rstd2 []cuda.Ptr // L x (N)
	q, y         []cuda.Ptr // L x (N, H*D): rotated queries, attention output (one buffer for every layer with flash attention)
	k, v         []cuda.Ptr // L x (N, KV*D): rotated keys, values (likewise)
	att          []cuda.Ptr // L x (B, H, T, T), without flash attention
	lse          []cuda.Ptr // L x (B, H, T) base-2 log-sum-exp, with flash attention
	dvec         cuda.Ptr   // (B, H, T) rowsum(dy * y), with flash attention: flash_bwd_dvec (or flash_bwd_dq) writes it for the backward
	dqsem        cuda.Ptr   // (B, H, tiles) int32, with flash attention: flash_bwd's order of the dq sums, zeroed before each launch
	g, u, h      []cuda.Ptr // L x (N, F)
	lnf, rstdf   cuda.Ptr   // (N, d), (N)
	logits       cuda.Ptr   // one chunk's logits: (headRows, V) in bf16 where logitsBF, overwritten by their gradient, and (outRows(), V) in fp32 handed out; (headRows, V) fp32 otherwise, overwritten by their gradient unless dlogitsb takes it
	losses       cuda.Ptr   // (N)
	ids, tgt     cuda.Ptr   // (N) int32
	dresid, dln  cuda.Ptr   // (N, d)
	dlnb         cuda.Ptr   // (N, d) bf16: the norms' output gradient, where dlnBF
	dy, dq       cuda.Ptr   // (N, H*D), without flash attention
	dk, dv       cuda.Ptr   // (N, KV*D), without flash attention
	ds           cuda.Ptr   // (B, H, T, T), without flash attention
	dh, dg, du   cuda.Ptr   // (N, F)
	bfA, bfB     cuda.Ptr   // bf16 GEMM operands converted on the way (bf16 precision)
	bfElems      int64

	// bf16 precision: what feeds GEMMs is written in bf16 by the kernel
	// that produces it, so that no conversion pass runs inside a step.
	// ln1, ln2, h, dg and du then have no fp32 buffer at all (0): only
	// GEMMs read them (g, u and dh likewise, below). Without flash
	// attention y, dq, dk and dv keep fp32 for the attention and rotary
	// kernels; lnf stays for the fp32 LM-head diagnostic.
	ln1b, ln2b []cuda.Ptr // L x (N, d) bf16
	yb, hb     []cuda.Ptr // L x (N, H*D), L x (N, F) bf16; yb with flash attention only
	lnfb       cuda.Ptr   // (N, d) bf16
	dlogitsb   cuda.Ptr   // (headRows, V) bf16 logit gradient of one chunk, for an fp32 head forward with a bf16 backward (KILN_CUDA_HEAD=fp32-forward)
	dresidb    cuda.Ptr   // (N, d) bf16 residual gradient (dresidBF, the default; no fp32 dresid then), else its bf16 copy after each norm's backward
	dqb, dkb   cuda.Ptr   // (N, H*D), (N, KV*D) bf16 copies after the inverse rotation, without flash attention
	// The gate and up projections run as one GEMM over their stacked
	// weights (consecutive in the flat buffer), written in bf16 and read so
	// by the SwiGLU kernels; their gradient is laid out the same way, so
	// one GEMM takes both weight gradients and one the input gradient. g, u
	// and dh then have no fp32 buffer.
	gub  []cuda.Ptr // L x (N, 2F) bf16: gate | up
	dgub cuda.Ptr   // (N, 2F) bf16
	dhb  cuda.Ptr   // (N, F) bf16

	// With flash attention the query, key and value projections run as
	// one GEMM (their weights are consecutive in the flat buffer) that
	// writes bf16 rows of H*D + 2 KV*D values; rope rotates the query and
	// key columns in place and the flash kernels read all three from there.
	// Their gradients land in one matrix of the same layout, for one
	// weight-gradient and one input-gradient GEMM. The fp32 q, k, v and y
	// are then not allocated (generation brings its own: genState).
	qkvb  []cuda.Ptr // L x (N, H*D + 2 KV*D) bf16
	dqkvb cuda.Ptr   // (N, H*D + 2 KV*D) bf16
	dyb   cuda.Ptr   // (N, H*D) bf16
}

// New makes a CUDA engine for c on device 0 on the production path (the
// zero Options). When the libraries or a device are missing the error
// implements Unavailable() bool.
func New(c model.Config, o model.Options) (*Engine, error) { return NewWithOptions(c, o, Options{}) }

// NewWithOptions is New with the engine's own settings, as ParseOptions
// read them.
func NewWithOptions(c model.Config, o model.Options, k Options) (*Engine, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := checkMoE(c); err != nil {
		return nil, err
	}
	if o.Precision == "" {
		o.Precision = "bf16"
	}
	if o.Precision != "fp32" && o.Precision != "bf16" {
		return nil, fmt.Errorf("unknown precision %q: choose fp32 or bf16", o.Precision)
	}
	if c.HeadDim > 256 {
		return nil, fmt.Errorf("head_dim %d is above the CUDA engine's limit of 256", c.HeadDim)
	}
	drv, nv, lt, err := loadLibraries()
	if err != nil {
		return nil, err
	}
	// KILN_CUDA_FORCE_SM80=1 forces the sm_80 build where no flag reaches
	// the engine (sched verify, tests).
	if k.forceSM80 {
		o.ForceSM80 = true
	}
	e := &Engine{cfg: c, opt: o, kopt: k, bf16: o.Precision == "bf16", specs: c.Specs(), th: newThread(), launches: map[string]int{},
		graphs: !k.eager, recorded: map[graphKey]*recorded{}, warm: map[graphKey]bool{}}
	// fp32 precision keeps the exact straightforward attention: the flash
	// kernels round to bf16 for the tensor cores. KILN_CUDA_ATTENTION=naive
	// selects it in bf16 too, for comparisons.
	e.flash = e.bf16 && c.HeadDim == flashHeadDim && !k.naive
	// 128 query rows a block (flash_fwd128): the forward 1.74 -> 1.41 ms
	// a step at small 32 x 1024 on an H200, 1.5-1.9% more tokens a second
	// (docs/benchmarks/cuda.md); 64 (flash_fwd) stays for comparisons.
	e.flashRows = 128
	if k.flash64 {
		e.flashRows = 64
	}
	e.flashFused = k.flashFused
	e.flashPair = k.flashPair
	e.flashTMA = !k.flashCopyAsync
	e.wsLimit = k.workspace()
	// fp32 precision runs every GEMM in fp32 already.
	if e.bf16 {
		e.headMode = k.head
		e.gemmTune = k.candidates()
	}
	e.maxB, e.maxT = max(o.MaxBatch, 1), max(o.MaxSeq, 1)
	if o.MaxBatch <= 0 || o.MaxSeq <= 0 {
		e.maxB, e.maxT = 1, min(c.MaxPositions, 1024)
	}
	e.perLayer = 9
	if c.MoE() {
		e.perLayer = sExperts + 3*c.Experts
	}
	for _, s := range e.specs {
		e.off = append(e.off, e.n)
		e.n += int64(s.Elements())
	}
	err = e.th.do(func() error { return e.open(drv, nv, lt) })
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Engine) open(drv *cuda.Driver, nv *cuda.NVRTC, lt *cuda.BLASLt) error {
	dv, err := drv.OpenDevice(e.kopt.device)
	if err != nil {
		return err
	}
	e.dv = dv
	e.mem = newAllocator(dv)
	if free, total, err := dv.MemInfo(); err == nil {
		e.usedAtOpen = int64(total - free)
		// Sized before the first allocation, so that a run that cannot fit
		// is refused in one line instead of failing halfway through.
		plan := model.MemoryPlan{Config: e.cfg, Engine: "cuda", Precision: e.opt.Precision, Batch: e.maxB, Seq: e.maxT,
			Purpose: e.opt.Purpose, NaiveAttention: !e.flash}
		if err := model.CheckMemory(plan, int64(free), "GPU 0 ("+dv.Name+")"); err != nil {
			return err
		}
	}
	if err := checkCapability(dv.Name, dv.Major, dv.Minor); err != nil {
		return err
	}
	e.Arch = Target(dv.Major, dv.Minor, e.opt.ForceSM80)
	// The Hopper attention kernels are built only where they may run.
	hopper := e.flash && !e.kopt.flashSM80
	if e.fns, e.kparams, e.mods, e.CacheHits, err = loadModules(dv, nv, e.Arch, e.kopt.kernelCache, hopper); err != nil {
		return err
	}
	if err := e.chooseFlashKernels(); err != nil {
		return err
	}
	if e.st, err = dv.NewStream(); err != nil {
		return err
	}
	e.sh = e.st.Handle()
	e.gs = e.sh
	if e.lt, err = lt.NewHandle(); err != nil {
		return err
	}
	// bf16 GEMMs run the fastest of cuBLASLt's candidates for their shape,
	// timed at the shape's first call (KILN_CUDA_GEMM_TUNE=off keeps the
	// library's first choice, for comparisons).
	if e.bf16 && e.gemmTune > 0 {
		start, err := dv.NewEvent()
		if err != nil {
			return err
		}
		end, err := dv.NewEvent()
		if err != nil {
			return err
		}
		e.lt.Tune(e.gemmTune, func(stream uintptr, run func() error) (float32, error) {
			return start.Time(end, stream, run)
		}, func(bytes int64) (cuda.Ptr, func(), error) {
			p, err := e.mem.alloc("GEMM tuning scratch", bytes)
			if err != nil {
				return 0, nil, err
			}
			return p, func() { e.mem.free(p) }, nil
		})
		if dir := e.kopt.choicesDir(); dir != "" {
			// The choices of earlier engines on this machine, so that a
			// run resumed in a new process sums as before (and skips the
			// timing); a file that is not this machine's is written anew.
			if err := e.lt.Remember(cuda.ChoicesPath(dir, dv.Name, lt.Version()), dv.Name); err != nil && e.opt.Log != nil {
				e.opt.Log(err.Error())
			}
		}
	}
	set := &allocSet{mem: e.mem}
	alloc := set.one
	e.params = alloc("parameters", e.n*4)
	e.grads = alloc("gradients", e.n*4)
	e.m = alloc("Adam first moments", e.n*4)
	e.v = alloc("Adam second moments", e.n*4)
	if e.bf16 {
		e.wbf = alloc("bf16 weight copy", e.n*2)
	}
	e.lossAcc = alloc("loss", 4)
	e.evalAcc = alloc("loss", 4)
	e.norm = alloc("gradient norm", 4)
	e.partial = alloc("gradient norm", normBlocks*4)
	e.ws = alloc("cuBLASLt workspace", wsBytes)
	e.gws = e.ws
	e.scal = alloc("step scalars", scalCount*4)
	maxN := e.maxB * e.maxT
	e.plan = alloc("embedding gradient plan", int64(embedPlanInts(maxN))*4)
	e.embPart = alloc("embedding gradient scratch", int64(embedPartRows(maxN))*int64(e.cfg.Hidden)*4)
	e.normSlots = 2*e.cfg.Layers + 1
	e.normPart = alloc("norm gradient scratch", int64(e.normSlots)*e.normStride()*4)
	e.normTab = alloc("norm gradient table", int64(e.normSlots)*8)
	e.planHost, e.planCount = make([]int32, embedPlanInts(maxN)), make([]int32, e.cfg.VocabSize)
	nodecay := e.noDecayRanges()
	e.nodecay, e.nranges = alloc("optimizer table", int64(len(nodecay))*8), len(nodecay)/2
	if set.err != nil {
		return set.err
	}
	if err := cuda.Upload(e.dv, e.nodecay, nodecay); err != nil {
		return err
	}
	if e.stage, err = newStaging(dv, max(4*maxN, 4*embedPlanInts(maxN), 4*scalCount)); err != nil {
		return err
	}
	if err := e.newOverlap(); err != nil {
		return err
	}
	e.positions = max(e.cfg.MaxPositions, e.maxT)
	if err := e.ropeTables(e.positions); err != nil {
		return err
	}
	if e.a, err = e.allocActs(e.maxB, e.maxT); err != nil {
		return err
	}
	if e.cfg.MoE() {
		if e.moe, err = e.allocMoE(e.maxB * e.maxT); err != nil {
			return err
		}
		if err := e.zero(e.moe.auxAcc, 1); err != nil {
			return err
		}
	}
	if err := e.allocHead(model.HeadChunkRows(e.maxB*e.maxT, e.cfg.VocabSize, e.logitsBF())); err != nil {
		return err
	}
	for _, p := range []cuda.Ptr{e.params, e.grads, e.m, e.v, e.lossAcc, e.evalAcc, e.norm} {
		if err := e.zero(p, 1); err != nil {
			return err
		}
	}
	for _, p := range []cuda.Ptr{e.params, e.grads, e.m, e.v} {
		if err := e.dv.Memset32(p, 0, e.n); err != nil {
			return err
		}
	}
	return nil
}

// ropeTables uploads the cos and sin tables of model.RopeTables, the CPU
// engine's, for positions.
func (e *Engine) ropeTables(positions int) error {
	cs, sn := model.RopeTables(e.cfg.HeadDim, e.cfg.RopeTheta, positions)
	var err error
	if e.cosT, err = e.mem.alloc("rotary table", int64(len(cs))*4); err != nil {
		return err
	}
	if e.sinT, err = e.mem.alloc("rotary table", int64(len(sn))*4); err != nil {
		return err
	}
	if err := cuda.Upload(e.dv, e.cosT, cs); err != nil {
		return err
	}
	return cuda.Upload(e.dv, e.sinT, sn)
}

func (e *Engine) allocActs(B, T int) (*acts, error) {
	c := e.cfg
	N := int64(B * T)
	d, qd, kvd, F := int64(c.Hidden), int64(c.Heads*c.HeadDim), int64(c.KVHeads*c.HeadDim), int64(c.Intermediate)
	attN := int64(B*c.Heads) * int64(T) * int64(T)
	a := &acts{}
	set := &allocSet{mem: e.mem}
	f32 := func(what string, n int64) cuda.Ptr { return set.one(what, n*4) }
	bf := func(what string, n int64) cuda.Ptr { return set.one(what, n*2) }
	layer := func(what string, n int64) []cuda.Ptr { return set.layers(what, c.Layers, n*4) }
	layerBF := func(what string, n int64) []cuda.Ptr { return set.layers(what, c.Layers, n*2) }
	// f32Unless allocates an fp32 buffer unless bf16 precision writes that
	// tensor in bf16 only.
	f32Unless := func(what string, n int64) cuda.Ptr {
		if e.bf16 {
			return 0
		}
		return f32(what, n)
	}
	layerUnless := func(what string, n int64) []cuda.Ptr {
		if e.bf16 {
			return make([]cuda.Ptr, c.Layers)
		}
		return layer(what, n)
	}
	a.resid = append(layer("activations (residual)", N*d), f32("activations (residual)", N*d))
	a.mid = layer("activations (residual)", N*d)
	a.ln1, a.ln2 = layerUnless("activations (norm)", N*d), layerUnless("activations (norm)", N*d)
	a.rstd1, a.rstd2 = layer("activations (norm)", N), layer("activations (norm)", N)
	if e.flash {
		shared := func(what string, n int64) []cuda.Ptr {
			ps, p := make([]cuda.Ptr, c.Layers), f32(what, n)
			for l := range ps {
				ps[l] = p
			}
			return ps
		}
		// Training's flash attention reads and writes bf16 alone (qkvb,
		// yb). The fp32 queries, keys, values and output are generation's
		// straightforward attention's, which allocates them for its own
		// rows (Generate); only the one-pass backward
		// (KILN_CUDA_FLASH_BWD=fused) sums dq in the queries' buffer.
		a.q, a.y, a.k, a.v = make([]cuda.Ptr, c.Layers), make([]cuda.Ptr, c.Layers), make([]cuda.Ptr, c.Layers), make([]cuda.Ptr, c.Layers)
		if e.flashFused {
			a.q = shared("attention gradient scratch (dq sums)", N*qd)
		}
		a.qkvb = layerBF("activations (queries, keys, values, bf16)", N*(qd+2*kvd))
		a.dqkvb = bf("gradient scratch (bf16)", N*(qd+2*kvd))
		a.dyb = bf("gradient scratch (bf16)", N*qd)
		a.lse = layer("activations (attention log-sum-exp)", int64(B*c.Heads*T))
		a.dvec = f32("attention gradient scratch", int64(B*c.Heads*T))
		a.dqsem = f32("attention gradient scratch", int64(B*c.Heads*flashTiles(T)))
	} else {
		a.q, a.y = layer("activations (queries)", N*qd), layer("activations (attention)", N*qd)
		a.k, a.v = layer("activations (keys)", N*kvd), layer("activations (values)", N*kvd)
		a.att = layer("activations (attention probabilities)", attN)
		a.ds = f32("attention gradient scratch", attN)
	}
	// With experts the sparse block keeps its own (allocMoE); N x F
	// buffers of the dense feed-forward would go unused.
	dense := !c.MoE()
	if dense {
		a.g, a.u, a.h = layerUnless("activations (MLP)", N*F), layerUnless("activations (MLP)", N*F), layerUnless("activations (MLP)", N*F)
	} else {
		a.g, a.u, a.h = make([]cuda.Ptr, c.Layers), make([]cuda.Ptr, c.Layers), make([]cuda.Ptr, c.Layers)
	}
	// The final norm's fp32 output is read only by an LM head that runs on
	// fp32 operands; the bf16 head reads a.lnfb.
	if hm := e.headMode; !e.bf16 || hm.f32Fwd || hm.f32Bwd || hm.tf32 {
		a.lnf = f32("activations (norm)", N*d)
	}
	a.rstdf = f32("activations (norm)", N)
	a.losses = f32("losses", N)
	a.ids, a.tgt = f32("token ids", N), f32("targets", N)
	// The residual stream's gradient in bf16 alone (a.dresidb) needs no
	// fp32 buffer.
	if !e.dresidBF() {
		a.dresid = f32("gradient scratch", N*d)
	}
	if e.dlnBF() {
		a.dlnb = bf("gradient scratch (bf16)", N*d)
	} else {
		a.dln = f32("gradient scratch", N*d)
	}
	// Flash attention reads the output gradient in bf16 and writes dq, dk
	// (rotated back in its kernels) and dv in bf16 only.
	if !e.flash {
		a.dy, a.dv = f32("gradient scratch", N*qd), f32("gradient scratch", N*kvd)
		a.dq, a.dk = f32("gradient scratch", N*qd), f32("gradient scratch", N*kvd)
	}
	if dense {
		a.dh, a.dg, a.du = f32Unless("gradient scratch", N*F), f32Unless("gradient scratch", N*F), f32Unless("gradient scratch", N*F)
	}
	if e.bf16 {
		a.ln1b, a.ln2b = layerBF("activations (norm, bf16)", N*d), layerBF("activations (norm, bf16)", N*d)
		if dense {
			a.hb = layerBF("activations (MLP, bf16)", N*F)
			a.gub = layerBF("activations (MLP, bf16)", 2*N*F)
			a.dgub, a.dhb = bf("gradient scratch (bf16)", 2*N*F), bf("gradient scratch (bf16)", N*F)
		}
		if e.flash {
			a.yb = layerBF("activations (attention, bf16)", N*qd)
		} else {
			a.dqb, a.dkb = bf("gradient scratch (bf16)", N*qd), bf("gradient scratch (bf16)", N*kvd)
		}
		a.lnfb = bf("activations (norm, bf16)", N*d)
		a.dresidb = bf("gradient scratch (bf16)", N*d)
		// What is still converted on the way: the attention output and dv
		// without flash attention, and generation's attention output.
		a.bfElems = N * max(qd, kvd, d)
		a.bfA = bf("bf16 GEMM operands", a.bfElems)
		a.bfB = bf("bf16 GEMM operands", a.bfElems)
	}
	return a, set.err
}

// noDecayRanges lists the element ranges of the specs AdamW does not decay
// (fewer than two dimensions), neighbours merged, as start, end pairs.
func (e *Engine) noDecayRanges() []int64 {
	var r []int64
	for i, s := range e.specs {
		if len(s.Shape) >= 2 {
			continue
		}
		start, end := e.off[i], e.off[i]+int64(s.Elements())
		if n := len(r); n > 0 && r[n-1] == start {
			r[n-1] = end
			continue
		}
		r = append(r, start, end)
	}
	if len(r) == 0 {
		// One empty range keeps the table's allocation non-empty.
		r = []int64{0, 0}
	}
	return r
}

func (e *Engine) zero(p cuda.Ptr, n int64) error { return e.dv.Memset32Async(p, 0, n, e.sh) }

// w returns the fp32 and (in bf16 precision) bf16 address of spec i.
func (e *Engine) w(i int) operand {
	op := operand{f32: e.params + cuda.Ptr(e.off[i]*4)}
	if e.bf16 {
		op.bf = e.wbf + cuda.Ptr(e.off[i]*2)
	}
	return op
}

func (e *Engine) gw(i int) cuda.Ptr { return e.grads + cuda.Ptr(e.off[i]*4) }

// Indices into Specs: embed, then perLayer per layer, then the final norm
// and the untied head.
func (e *Engine) layerSpec(l, k int) int { return 1 + e.perLayer*l + k }

const (
	sLN1 = iota
	sQ
	sK
	sV
	sO
	sLN2
	sGate
	sUp
	sDown
)

func (e *Engine) normSpec() int { return 1 + e.perLayer*e.cfg.Layers }
func (e *Engine) headSpec() int {
	if e.cfg.TieEmbeddings {
		return 0
	}
	return e.normSpec() + 1
}

// operand is a GEMM input: its fp32 data and, when one is kept, its bf16 copy.
type operand struct{ f32, bf cuda.Ptr }

func act(p cuda.Ptr) operand { return operand{f32: p} }

// actBF is an activation that its producer also (or only) wrote in bf16.
func actBF(p, b cuda.Ptr) operand { return operand{f32: p, bf: b} }

// gemm computes C (M x N) = op(A) op(B) + beta C in row-major terms (see
// cuda.LtHandle.Gemm). In bf16 precision fp32 operands are rounded to bf16
// first; accumulation is fp32 either way, and fp32 precision never uses TF32.
func (e *Engine) gemm(ta, tb bool, M, N, K int, A, B operand, beta float32, C cuda.Ptr) error {
	if !e.bf16 {
		return e.lt.Gemm(cuda.ComputeF32, cuda.DataF32, ta, tb, M, N, K, 1, A.f32, B.f32, beta, C, e.gws, e.wsLimit, e.gs)
	}
	pa, pb, err := e.bfOperands(M, N, K, A, B)
	if err != nil {
		return err
	}
	return e.timed(e.gemmName("bf16", ta, tb, M, N, K), func() error {
		return e.lt.Gemm(cuda.ComputeF32, cuda.DataBF16, ta, tb, M, N, K, 1, pa, pb, beta, C, e.gws, e.wsLimit, e.gs)
	})
}

// bfOperands returns the bf16 buffers of A (M x K) and B (K x N), converting
// into scratch an operand whose producer wrote none.
func (e *Engine) bfOperands(M, N, K int, A, B operand) (cuda.Ptr, cuda.Ptr, error) {
	pa, pb := A.bf, B.bf
	if (pa == 0 && A.f32 == 0) || (pb == 0 && B.f32 == 0) {
		return 0, 0, fmt.Errorf("GEMM %dx%dx%d has an operand with neither an fp32 nor a bf16 buffer", M, N, K)
	}
	if (pa == 0 || pb == 0) && e.ov != nil && e.ov.now {
		return 0, 0, fmt.Errorf("GEMM %dx%dx%d on the side stream would convert an operand in the main stream's scratch", M, N, K)
	}
	if pa == 0 {
		if err := e.toBF16(e.a.bfA, A.f32, int64(M)*int64(K)); err != nil {
			return 0, 0, err
		}
		pa = e.a.bfA
	}
	if pb == 0 {
		if err := e.toBF16(e.a.bfB, B.f32, int64(K)*int64(N)); err != nil {
			return 0, 0, err
		}
		pb = e.a.bfB
	}
	return pa, pb, nil
}

// gemmAdd is D = op(A) op(B) + C in fp32: the output and down projections
// add into the residual stream this way, reading the stream entering the
// sublayer and writing the one leaving it, with no copy between.
func (e *Engine) gemmAdd(ta, tb bool, M, N, K int, A, B operand, C, D cuda.Ptr) error {
	if !e.bf16 {
		return e.lt.GemmAdd(cuda.ComputeF32, cuda.DataF32, ta, tb, M, N, K, 1, A.f32, B.f32, 1, C, D, e.gws, e.wsLimit, e.gs)
	}
	pa, pb, err := e.bfOperands(M, N, K, A, B)
	if err != nil {
		return err
	}
	return e.timed(e.gemmName("bf16 + residual", ta, tb, M, N, K), func() error {
		return e.lt.GemmAdd(cuda.ComputeF32, cuda.DataBF16, ta, tb, M, N, K, 1, pa, pb, 1, C, D, e.gws, e.wsLimit, e.gs)
	})
}

// gemmBF is gemm writing C in bf16 (beta 0), for a product whose only
// readers take bf16; both operands must have their bf16 copies.
func (e *Engine) gemmBF(ta, tb bool, M, N, K int, A, B operand, C cuda.Ptr) error {
	if !e.bf16 || A.bf == 0 || B.bf == 0 {
		return fmt.Errorf("GEMM %dx%dx%d to bf16 needs bf16 precision and bf16 operands", M, N, K)
	}
	return e.timed(e.gemmName("bf16 -> bf16", ta, tb, M, N, K), func() error {
		return e.lt.GemmTo(cuda.ComputeF32, cuda.DataBF16, cuda.DataBF16, ta, tb, M, N, K, 1, A.bf, B.bf, 0, C, e.gws, e.wsLimit, e.gs)
	})
}

func (e *Engine) toBF16(dst, src cuda.Ptr, n int64) error {
	if n > e.a.bfElems {
		return fmt.Errorf("bf16 operand of %d values exceeds its %d-value buffer", n, e.a.bfElems)
	}
	return e.launch("f32_to_bf16", blocks(n, 256), 256, dst, src, n)
}

func blocks(n int64, per int) int { return int((n + int64(per) - 1) / int64(per)) }

func (e *Engine) launch(name string, grid, block int, args ...any) error {
	return e.launch3(name, cuda.Dim3{X: grid}, cuda.Dim3{X: block}, args...)
}

func (e *Engine) launch3(name string, grid, block cuda.Dim3, args ...any) error {
	f, ok := e.fns[name]
	if !ok {
		return fmt.Errorf("kernel %s is not loaded", name)
	}
	if err := checkArgs(name, e.kparams[name], args); err != nil {
		return err
	}
	e.launches[name]++
	return e.timed(name, func() error { return f.Launch(grid, block, e.shared[name], e.sh, args...) })
}

// gemmName is a GEMM's line in the profile: by shape, so that the table
// says which products take the time. ta/tb mark a transposed operand.
func (e *Engine) gemmName(kind string, ta, tb bool, M, N, K int) string {
	if !e.profiling {
		return ""
	}
	return fmt.Sprintf("GEMM %s %s", kind, cuda.ProductName(ta, tb, M, N, K))
}

// timed runs op, and with profiling on adds its device time to name's.
// Each op is timed alone between two events, which adds the gap between
// the first event and the op's start to every op: a profile's small
// kernels read slower than they run in a step (docs/benchmarks/cuda.md).
func (e *Engine) timed(name string, op func() error) error {
	if err := e.timedQueue(op); err != nil {
		return err
	}
	return e.timedRead(name)
}

// timedQueue is timed's first half: op queued between the profile's two
// events. timedRead, the second, waits for the second event and adds the
// time to name's. Apart, a caller that must not hold a lock while the GPU
// works (the group's communicator: the all-reduce) queues under it and
// waits after it.
func (e *Engine) timedQueue(op func() error) error {
	if !e.profiling {
		return op()
	}
	if err := e.evA.Record(e.sh); err != nil {
		return err
	}
	if err := op(); err != nil {
		return err
	}
	return e.evB.Record(e.sh)
}

// timedRead ends what timedQueue began (nothing without profiling).
func (e *Engine) timedRead(name string) error {
	if !e.profiling {
		return nil
	}
	ms, err := e.evA.Elapsed(e.evB)
	e.profMS[name] += float64(ms)
	return err
}

// SetProfiling turns per-kernel timing on or off and clears the totals.
func (e *Engine) SetProfiling(on bool) error {
	return e.th.do(func() error {
		e.profiling, e.profMS = on, map[string]float64{}
		if on && e.evA == nil {
			var err error
			if e.evA, err = e.dv.NewEvent(); err != nil {
				return err
			}
			if e.evB, err = e.dv.NewEvent(); err != nil {
				return err
			}
		}
		return nil
	})
}

// KernelTimes returns the device milliseconds per kernel name since
// SetProfiling(true): each bf16 GEMM by kind and shape (gemmName), the
// fp32 GEMMs untimed.
func (e *Engine) KernelTimes() map[string]float64 {
	out := map[string]float64{}
	_ = e.th.do(func() error {
		for k, v := range e.profMS {
			out[k] = v
		}
		return nil
	})
	return out
}

// LaunchCounts returns how many times each kernel has been launched.
func (e *Engine) LaunchCounts() map[string]int {
	out := map[string]int{}
	_ = e.th.do(func() error {
		for k, v := range e.launches {
			out[k] = v
		}
		return nil
	})
	return out
}

// refreshBF16 rounds the master weights into their GEMM copy.
func (e *Engine) refreshBF16() error {
	if !e.bf16 {
		return nil
	}
	return e.launch("f32_to_bf16", blocks(e.n, 256), 256, e.wbf, e.params, e.n)
}

// Name implements model.Engine.
func (e *Engine) Name() string { return "cuda" }

// Config implements model.Engine.
func (e *Engine) Config() model.Config { return e.cfg }

func (e *Engine) checkParams(p *model.Params) error {
	if int64(len(p.Data)) != e.n {
		return fmt.Errorf("parameters hold %d values, the model needs %d: the checkpoint is for another configuration", len(p.Data), e.n)
	}
	return nil
}

// SetParams implements model.Engine.
func (e *Engine) SetParams(p *model.Params) error {
	if err := e.checkParams(p); err != nil {
		return err
	}
	return e.th.do(func() error {
		if err := e.settleStateCopy(); err != nil {
			return err
		}
		if err := cuda.Upload(e.dv, e.params, p.Data); err != nil {
			return err
		}
		if err := e.refreshBF16(); err != nil {
			return err
		}
		return e.zeroGrad()
	})
}

// Params implements model.Engine.
func (e *Engine) Params(p *model.Params) error {
	if err := e.checkParams(p); err != nil {
		return err
	}
	return e.th.do(func() error { return cuda.Download(e.dv, p.Data, e.params) })
}

// SetOptimizerState implements model.Engine.
func (e *Engine) SetOptimizerState(s *model.OptimizerState) error {
	if int64(len(s.M)) != e.n || int64(len(s.V)) != e.n {
		return fmt.Errorf("optimizer state holds %d and %d values, the model needs %d: it belongs to another configuration", len(s.M), len(s.V), e.n)
	}
	return e.th.do(func() error {
		if err := e.settleStateCopy(); err != nil {
			return err
		}
		e.optStep = s.Step
		if err := cuda.Upload(e.dv, e.m, s.M); err != nil {
			return err
		}
		return cuda.Upload(e.dv, e.v, s.V)
	})
}

// OptimizerState implements model.Engine.
func (e *Engine) OptimizerState() (*model.OptimizerState, error) {
	s := &model.OptimizerState{M: make([]float32, e.n), V: make([]float32, e.n)}
	err := e.th.do(func() error {
		s.Step = e.optStep
		if err := cuda.Download(e.dv, s.M, e.m); err != nil {
			return err
		}
		return cuda.Download(e.dv, s.V, e.v)
	})
	return s, err
}

// ZeroGrad implements model.Engine.
func (e *Engine) ZeroGrad() error { return e.th.do(e.zeroGrad) }

func (e *Engine) zeroGrad() error {
	e.summed = false
	if err := e.zero(e.grads, e.n); err != nil {
		return err
	}
	if e.moe != nil {
		if err := e.zero(e.moe.auxAcc, 1); err != nil {
			return err
		}
		if err := e.zero(e.moe.shareAcc, int64(e.cfg.Experts)); err != nil {
			return err
		}
	}
	return e.zero(e.lossAcc, 1)
}

// Grads implements model.Engine.
func (e *Engine) Grads(g *model.Params) error {
	if err := e.checkParams(g); err != nil {
		return err
	}
	return e.th.do(func() error { return cuda.Download(e.dv, g.Data, e.grads) })
}

// Metrics implements model.Engine; it waits for the device: for the main
// stream (which the side stream joins), not for a checkpoint's state copy
// (snapshot.go), which runs on beside it. The trainer reads a step's
// metrics through MetricsLater instead, one step behind.
func (e *Engine) Metrics() (model.StepMetrics, error) {
	var m model.StepMetrics
	err := e.th.do(func() error {
		if err := e.st.Synchronize(); err != nil {
			return err
		}
		v := make([]float32, 1)
		if err := cuda.Download(e.dv, v, e.lossAcc); err != nil {
			return err
		}
		m.Loss = float64(v[0])
		if err := cuda.Download(e.dv, v, e.norm); err != nil {
			return err
		}
		m.GradNorm = float64(v[0])
		if e.moe != nil {
			if err := cuda.Download(e.dv, v, e.moe.auxAcc); err != nil {
				return err
			}
			m.AuxLoss = float64(v[0])
			counts := make([]float32, e.cfg.Experts)
			if err := cuda.Download(e.dv, counts, e.moe.shareAcc); err != nil {
				return err
			}
			m.ExpertShare = expertShares(counts)
		}
		return nil
	})
	return m, err
}

// Memory implements model.Engine.
func (e *Engine) Memory() model.MemoryStats {
	var s model.MemoryStats
	if e.th == nil {
		return s
	}
	_ = e.th.do(func() error {
		s.PeakAllocated = e.mem.peak
		free, total, err := e.dv.MemInfo()
		if err == nil {
			// What the device has in use beyond what it had when the
			// engine's context was made: the engine's allocations plus
			// cuBLASLt's and the modules' own, not other processes'
			// (unless they grew meanwhile; bench reports those apart).
			s.InUse = int64(total-free) - e.usedAtOpen
		}
		return nil
	})
	return s
}

// Close implements model.Engine.
func (e *Engine) Close() error {
	if e.th == nil {
		return nil
	}
	err := e.th.do(func() error {
		var errs []error
		errs = append(errs, e.freeStateCopy(), e.freeMetricsCopy())
		if e.recorded != nil {
			errs = append(errs, e.dropGraphs())
		}
		if e.stage != nil {
			errs = append(errs, e.stage.free())
		}
		if e.st != nil {
			errs = append(errs, e.dv.Synchronize(), e.st.Destroy())
		}
		if e.ov != nil {
			errs = append(errs, e.ov.destroy())
		}
		if e.bk != nil {
			errs = append(errs, e.bk.destroy())
		}
		if e.mem != nil {
			errs = append(errs, e.mem.freeAll())
		}
		if e.lt != nil {
			errs = append(errs, e.lt.Destroy())
		}
		for _, m := range e.mods {
			errs = append(errs, m.Unload())
		}
		if e.dv != nil {
			errs = append(errs, e.dv.Close())
		}
		return errors.Join(errs...)
	})
	e.th.stop()
	e.th = nil
	return err
}

// Device describes the GPU the engine runs on, for reports.
type Device = model.DeviceInfo

// Device reports the engine's GPU (model.Device).
func (e *Engine) Device() Device {
	return Device{Name: e.dv.Name, Major: e.dv.Major, Minor: e.dv.Minor, SMs: e.dv.SMs, TotalBytes: int64(e.dv.Total), UsedAtStart: e.usedAtOpen, Arch: e.Arch}
}

// checkCapability refuses GPUs older than compute capability 8.0 (bf16
// tensor cores, cp.async): "auto" falls back, and --engine cuda exits 2.
func checkCapability(name string, major, minor int) error {
	if major < 8 {
		return &cuda.UnavailableError{Err: fmt.Errorf("GPU %s has compute capability %d.%d; kiln's CUDA engine needs 8.0 or newer: use --engine cpu", name, major, minor)}
	}
	return nil
}

// dlnBF says whether the GEMMs that end at a norm's output (the q/k/v and
// gate/up input gradients, the LM head's) write that gradient in bf16 for
// the warp-per-row norm backward, as PyTorch's autocast does: half the
// bytes written and read again. It needs the fused bf16 paths, whose only
// GEMM into each norm's gradient overwrites it (the unfused ones add
// three), and a head whose backward runs in bf16.
func (e *Engine) dlnBF() bool {
	return e.flash && e.warpNorm() && !e.headMode.fp32Grad()
}

// dlnGemm writes the gradient of a norm's output, rows r0 on, as
// op(A) (rows x K) times B (K x d): in bf16 where dlnBF, else in fp32.
func (e *Engine) dlnGemm(r0, rows, K int, A, B operand) error {
	d := e.cfg.Hidden
	if e.dlnBF() {
		return e.gemmBF(false, false, rows, d, K, A, B, rowsAt(e.a.dlnb, r0, d, 2))
	}
	return e.gemm(false, false, rows, d, K, A, B, 0, rowsAt(e.a.dln, r0, d, 4))
}
