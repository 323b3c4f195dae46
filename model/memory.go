package model

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/kiln-lm/kiln/model/gemm"
)

// Purpose says what an engine is started for; it decides which buffers the
// memory estimate counts.
type Purpose string

const (
	// PurposeTrain runs forward, backward and AdamW (the zero Purpose).
	PurposeTrain Purpose = "train"
	// PurposeBench is PurposeTrain on random tokens.
	PurposeBench Purpose = "bench"
	// PurposeEval runs the forward pass only.
	PurposeEval Purpose = "eval"
	// PurposeGenerate runs a prompt and new tokens with a KV cache; Seq is
	// the prompt plus the new tokens.
	PurposeGenerate Purpose = "generate"
)

// LargestGPU is the device memory free on the largest card kiln
// supports, an H200 (sold as 141 GB: 139.8 GiB in all, about 139 GiB free
// once a context exists). Where the device that will run a task is unknown
// (at enqueue), a plan that needs more than this cannot run anywhere.
const LargestGPU = 139 << 30

// MemoryPlan is one engine start to size.
type MemoryPlan struct {
	Config     Config
	Engine     string // "cpu" or "cuda" ("auto" is sized as cuda)
	Precision  string // "bf16" (default) or "fp32"
	Batch, Seq int    // the largest micro-batch; 0 sizes the engine's own default
	Purpose    Purpose
	// NaiveAttention: the CUDA engine keeps the (B, H, T, T) attention
	// probabilities instead of running the flash kernels. It does so in fp32
	// precision, for a head_dim other than 64, and when
	// KILN_CUDA_ATTENTION=naive; the kernels package says which.
	NaiveAttention bool
}

// MemoryItem is one group of buffers of an estimate.
type MemoryItem struct {
	What  string
	Bytes int64
}

// MemoryEstimate is what an engine start needs, by group and in total.
type MemoryEstimate struct {
	Items []MemoryItem
	Total int64
}

// saturate converts a byte count computed in float64 (so that absurd
// shapes cannot overflow) to int64, capping at the largest value.
func saturate(b float64) int64 {
	if b >= math.MaxInt64 || math.IsNaN(b) {
		return math.MaxInt64
	}
	return int64(b)
}

// ParamCount is NumParams computed without listing the tensors, so that a
// configuration of 1e8 layers is counted, not materialised.
func (c Config) ParamCount() float64 {
	d, q, kv, f := float64(c.Hidden), float64(c.Heads*c.HeadDim), float64(c.KVHeads*c.HeadDim), float64(c.Intermediate)
	layer := 2*d + q*d + 2*kv*d + d*q + 3*f*d
	if c.MoE() {
		E := float64(c.Experts)
		layer += (E-1)*3*f*d + E*d // every expert, and the router
	}
	n := float64(c.VocabSize)*d + float64(c.Layers)*layer + d
	if !c.TieEmbeddings {
		n += float64(c.VocabSize) * d
	}
	return n
}

// EstimateMemory sizes p from the model shape the way each engine
// allocates: the CPU engine's Go slices (model/cpu.go, generate.go), the
// CUDA engine's device buffers (kernels/engine.go allocActs, head.go,
// generate.go). The CUDA figure is the engine's peak allocated bytes, the
// number `sched bench` reports; TestCUDAEstimateMatchesMeasuredPeaks holds
// it to the peaks measured on an H200.
func EstimateMemory(p MemoryPlan) (MemoryEstimate, error) {
	if err := p.Config.Validate(); err != nil {
		return MemoryEstimate{}, err
	}
	if p.Precision == "" {
		p.Precision = "bf16"
	}
	if p.Precision != "fp32" && p.Precision != "bf16" {
		return MemoryEstimate{}, &EngineError{Msg: fmt.Sprintf("unknown precision %q: choose fp32 or bf16", p.Precision)}
	}
	if p.Batch < 0 || p.Seq < 0 {
		return MemoryEstimate{}, &EngineError{Msg: fmt.Sprintf("batch %d and seq %d must not be negative", p.Batch, p.Seq)}
	}
	switch p.Purpose {
	case "":
		p.Purpose = PurposeTrain
	case PurposeTrain, PurposeBench, PurposeEval, PurposeGenerate:
	default:
		return MemoryEstimate{}, fmt.Errorf("unknown engine purpose %q", p.Purpose)
	}
	var b sizer
	switch p.Engine {
	case "cpu":
		b.cpu(p)
	case "cuda", "auto":
		b.cuda(p)
	default:
		return MemoryEstimate{}, &EngineError{Msg: fmt.Sprintf("unknown engine %q: choose cuda, cpu or auto", p.Engine)}
	}
	est := MemoryEstimate{}
	total := 0.0
	for _, it := range b.items {
		est.Items = append(est.Items, MemoryItem{What: it.what, Bytes: saturate(it.bytes)})
		total += it.bytes
	}
	est.Total = saturate(total)
	return est, nil
}

type sizedItem struct {
	what  string
	bytes float64
}

// sizer adds up buffers by group, in float64.
type sizer struct {
	items []sizedItem
	align float64 // allocation granularity (the CUDA allocator's 256 bytes)
}

// add counts n buffers of elems values of size bytes each under what.
func (s *sizer) add(what string, n, elems, size float64) {
	if n <= 0 {
		return
	}
	b := math.Max(elems*size, 1)
	if s.align > 0 {
		b = math.Ceil(b/s.align) * s.align
	}
	for i := range s.items {
		if s.items[i].what == what {
			s.items[i].bytes += n * b
			return
		}
	}
	s.items = append(s.items, sizedItem{what, n * b})
}

func (p MemoryPlan) training() bool { return p.Purpose == PurposeTrain || p.Purpose == PurposeBench }

// cpu follows CPUEngine: parameters, gradients and both moments always
// (NewCPUEngine), the activations of one micro-batch (acts) for training
// and evaluation, the backward pass's scratch, and for generation the KV
// cache with the prompt's temporaries (Generate, decode). Go slices of
// float32; the scratch is garbage after each step, so until the collector
// runs the heap holds at least one step's worth of it beside the rest.
func (s *sizer) cpu(p MemoryPlan) {
	c := p.Config
	P := c.ParamCount()
	L, d, qd, kvd, F, V, H := float64(c.Layers), float64(c.Hidden), float64(c.Heads*c.HeadDim), float64(c.KVHeads*c.HeadDim), float64(c.Intermediate), float64(c.VocabSize), float64(c.Heads)
	B, T := float64(p.Batch), float64(p.Seq)
	N := B * T
	s.add("parameters", 1, P, 4)
	s.add("gradients", 1, P, 4)
	s.add("Adam moments", 2, P, 4)
	// The matrix products' packing buffers, one set a thread (the engine
	// runs GOMAXPROCS threads unless told fewer).
	s.add("matrix product scratch", 1, float64(gemm.ScratchBytes(runtime.GOMAXPROCS(0))), 1)
	// Per row, the feed-forward keeps: dense, gate, up and silu(gate) x up;
	// with experts (moeActs), the router softmax, the k choices (expert,
	// weight, row) and per choice its gathered input and output and the
	// expert's three F-wide activations. Its backward scratch (moeScratch)
	// is per choice two d-wide and three F-wide rows, plus the router's.
	ffAct, ffScratch, ffDecode := 3*F, 3*F, 2*F
	if c.MoE() {
		E, k := float64(c.Experts), float64(c.ExpertsPerTok)
		ffAct = E + 3*k + k*(2*d+3*F)
		ffScratch = k*(2*d+3*F) + E + k
		ffDecode = ffAct
	}
	if p.Purpose == PurposeGenerate {
		s.add("KV cache", 2*L, T, kvd*4)
		s.add("prompt activations", 1, T*(3*d+1+2*qd+ffDecode), 4)
		s.add("logits", 1, V, 4)
		s.add("rotary table", 2, T*float64(c.HeadDim/2), 4)
		return
	}
	if N == 0 {
		return
	}
	perLayer := N*(4*d+2+2*qd+2*kvd+ffAct) + B*H*T*T
	s.add("activations", 1, L*perLayer+N*(2*d+1), 4)
	s.add("logits", 1, N*V, 4)
	s.add("rotary table", 2, T*float64(c.HeadDim/2), 4)
	if p.training() {
		s.add("backward scratch", 1, N*(3*d+ffScratch+2*qd+2*kvd)+N*2, 4)
		// The attention's score gradients, a T x T matrix a thread.
		s.add("attention backward scratch", float64(runtime.GOMAXPROCS(0)), T*T, 4)
	}
}

// cuda follows kernels.Engine.open and allocActs with the default
// KILN_CUDA_HEAD (the bf16 LM head): every start allocates the training
// buffers for Batch x Seq whatever it runs, and generation adds its KV
// cache and attention probabilities.
func (s *sizer) cuda(p MemoryPlan) {
	s.align = 256
	c := p.Config
	bf16 := p.Precision == "bf16"
	flash := bf16 && c.HeadDim == 64 && !p.NaiveAttention
	P := c.ParamCount()
	L, d, qd, kvd, F, V, H := float64(c.Layers), float64(c.Hidden), float64(c.Heads*c.HeadDim), float64(c.KVHeads*c.HeadDim), float64(c.Intermediate), float64(c.VocabSize), float64(c.Heads)
	Bi, Ti := p.Batch, p.Seq
	if Bi <= 0 || Ti <= 0 {
		Bi, Ti = 1, min(c.MaxPositions, 1024)
	}
	B, T := float64(Bi), float64(Ti)
	N := B * T

	s.add("parameters", 1, P, 4)
	s.add("gradients", 1, P, 4)
	s.add("Adam moments", 2, P, 4)
	if bf16 {
		s.add("bf16 weight copy", 1, P, 2)
	}
	s.add("small buffers", 3, 1, 4)
	s.add("small buffers", 1, 1024, 4)
	// One for the main stream; with flash attention the weight-gradient
	// GEMMs' second stream has its own (kernels/overlap.go).
	workspaces := 1.0
	if flash {
		workspaces = 2
	}
	s.add("cuBLASLt workspace", workspaces, 32<<20, 1)
	s.add("small buffers", 1, 2*(2*L+1), 8)
	positions := math.Max(float64(c.MaxPositions), T)
	s.add("rotary table", 2, positions*float64(c.HeadDim/2), 4)

	act, scratch := "activations", "gradient scratch"
	s.add(act, L+1, N*d, 4) // residual stream entering each layer, then the last
	s.add(act, L, N*d, 4)   // after attention
	if !bf16 {
		s.add(act, 2*L, N*d, 4) // the norms' outputs
	}
	s.add(act, 2*L, N, 4) // their 1/rms
	if flash {
		s.add(act, L, N*(qd+2*kvd), 2)
		s.add(scratch, 1, N*(qd+2*kvd), 2)
		s.add(scratch, 1, N*qd, 2)
		s.add(act, L, B*H*T, 4) // log-sum-exp
		s.add(scratch, 1, B*H*T, 4)
		s.add(scratch, 1, B*H*math.Ceil(T/64), 4) // the order of the dq sums
	} else {
		s.add(act, 2*L, N*qd, 4)
		s.add(act, 2*L, N*kvd, 4)
		s.add(act, L, B*H*T*T, 4) // attention probabilities
		s.add(scratch, 1, B*H*T*T, 4)
	}
	dense := !c.MoE()
	if !bf16 && dense {
		s.add(act, 3*L, N*F, 4)
	}
	if !bf16 {
		s.add(act, 1, N*d, 4) // final norm output for the fp32 head
	}
	s.add(act, 1, N, 4) // final 1/rms
	s.add(act, 3, N, 4) // losses, ids, targets
	dlnBF := flash && c.Hidden%128 == 0 && c.Hidden <= 1024
	if !dlnBF || !dense {
		s.add(scratch, 1, N*d, 4) // dresid, which the dense bf16 path keeps in bf16 alone
	}
	if dlnBF {
		s.add(scratch, 1, N*d, 2)
	} else {
		s.add(scratch, 1, N*d, 4)
	}
	if !flash {
		s.add(scratch, 2, N*qd, 4)
		s.add(scratch, 2, N*kvd, 4)
	}
	if !bf16 && dense {
		s.add(scratch, 3, N*F, 4)
	}
	if bf16 {
		s.add(act, 2*L, N*d, 2) // norms' outputs
		if dense {
			s.add(act, L, N*F, 2)   // silu(gate) x up
			s.add(act, L, 2*N*F, 2) // gate | up
			s.add(scratch, 1, 2*N*F, 2)
			s.add(scratch, 1, N*F, 2)
		}
		if flash {
			s.add(act, L, N*qd, 2)
		} else {
			s.add(scratch, 1, N*qd, 2)
			s.add(scratch, 1, N*kvd, 2)
		}
		s.add(act, 1, N*d, 2)     // final norm output
		s.add(scratch, 1, N*d, 2) // dresid copy
		s.add("bf16 GEMM operands", 2, N*math.Max(qd, math.Max(kvd, d)), 2)
	}
	if c.MoE() {
		s.moeCUDA(c, L, N, d, F, bf16)
	}
	// The LM head's chunk, as the engine sizes it (HeadChunkRows); the
	// default head writes bf16 training logits.
	rows := HeadChunkRows(int(min(N, 1<<40)), c.VocabSize, bf16)
	_, size := HeadLogitRows(rows, bf16)
	s.add("logits (one chunk)", 1, float64(rows)*V, float64(size))
	if bf16 {
		// The first step times each bf16 GEMM's candidates; a product that
		// adds into its output writes them to scratch, the largest being the
		// (V, d) fp32 weight gradient of the LM head.
		s.add("GEMM tuning scratch", 1, V*d, 4)
	}

	if p.Purpose == PurposeGenerate {
		s.add("KV cache", 2*L, T*kvd, 4)
		s.add("attention probabilities", 1, H*T*T, 4)
		if flash {
			// The prompt's fp32 queries, output, keys and values, which
			// the flash path's training buffers do not hold.
			s.add("attention scratch", 2, T*qd, 4)
			s.add("attention scratch", 2, T*kvd, 4)
		}
	}
}

// moeCUDA follows kernels.Engine.allocMoE: per layer the routing (router
// softmax, the k choices' expert, weight and grouped row, each grouped
// row's token, the experts' offsets) and the experts' activations over the
// N k grouped rows (fp32: gate, up, silu(gate) x up and the outputs; bf16:
// gate | up, silu(gate) x up and the outputs in bf16), then the counting
// sort's per-block tables, the load-balancing tally and the backward
// scratch shared by the layers.
func (s *sizer) moeCUDA(c Config, L, N, d, F float64, bf16 bool) {
	E, K := float64(c.Experts), float64(c.ExpertsPerTok)
	NK := N * K
	routing, act, scratch := "activations (experts' routing)", "activations (experts)", "gradient scratch (experts)"
	s.add(routing, L, N*E, 4)
	s.add(routing, 4*L, NK, 4)
	s.add(routing, L, E+1, 4)
	s.add(routing, 2, math.Ceil(NK/1024)*E, 4)
	s.add("load-balancing tally", 4, E, 4)
	s.add("small buffers", 1, 1, 4)
	if bf16 {
		s.add(act, L, NK*2*F, 2)
		s.add(act, L, NK*F, 2)
		s.add(act, L, NK*d, 2)
		s.add(scratch, 1, NK*d, 2)
		s.add(scratch, 1, NK*F, 2)
		s.add(scratch, 1, NK*2*F, 2)
		s.add(scratch, 1, N*E, 2)
	} else {
		s.add(act, 3*L, NK*F, 4)
		s.add(act, L, NK*d, 4)
		s.add(scratch, 1, NK*d, 4)
		s.add(scratch, 3, NK*F, 4)
	}
	s.add(scratch, 1, NK*d, 4)
	s.add(scratch, 1, N*E, 4)
	if bf16 && c.Hidden%8 == 0 && c.Intermediate%8 == 0 {
		s.add(scratch, 1, 4*E*d*F, 4) // the fast weight-gradient kernel's partial sums (kernels.moeMaxSplit)
	}
}

// GiB formats bytes as GiB with two decimals.
func GiB(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

// MemoryError is an engine start that does not fit where it would run. It
// is bad input: the run's shape is the user's to change.
type MemoryError struct {
	Plan      MemoryPlan
	Needed    int64
	Available int64
	// Where names the memory: "GPU 0 (NVIDIA H200)", "this host", ...
	Where string
	// Fix is what to change in a training or bench step whose sizes are
	// not the command's flags (a run's entry in a runs file); empty for
	// the flags.
	Fix string
}

func (e *MemoryError) Error() string {
	p := e.Plan
	what := fmt.Sprintf("batch %d x seq %d", p.Batch, p.Seq)
	fix := "lower --batch or --seq, or keep the tokens per step with a smaller --batch and a larger --accumulate"
	switch p.Purpose {
	case PurposeGenerate:
		what = fmt.Sprintf("generating %d positions", p.Seq)
		fix = "lower --max-tokens or shorten the prompt"
	case PurposeEval:
		fix = "use a smaller batch or sequence"
	default:
		if e.Fix != "" {
			fix = e.Fix
		}
		// Weights, gradients and AdamW's two moments in fp32: no batch
		// makes a model fit whose state alone does not.
		if state := 16 * p.Config.ParamCount(); state >= float64(e.Available) {
			fix = fmt.Sprintf("its weights, gradients and optimizer state alone need %s at any batch: choose a smaller model", GiB(saturate(state)))
			if p.Config.MoE() {
				fix += " or fewer experts (--moe experts=N)"
			}
		}
	}
	return fmt.Sprintf("%s of a %.1fM-parameter model on the %s engine (%s) needs %s but %s has %s available: %s",
		what, p.Config.ParamCount()/1e6, p.Engine, ComputedPrecision(p.Engine, p.Precision), GiB(e.Needed), e.Where, GiB(e.Available), fix)
}

// ComputedPrecision is the precision an engine named engine (its Name)
// computes in when asked for asked: the CPU engine computes in fp32 only
// (Options.Precision), whatever was asked; others compute in the precision
// asked.
func ComputedPrecision(engine, asked string) string {
	if engine == "cpu" {
		return "fp32"
	}
	return asked
}

// BadInput marks the size as the caller's to change.
func (e *MemoryError) BadInput() bool { return true }

// CheckMemory estimates p and refuses it when it needs more than available
// bytes of the memory named by where.
func CheckMemory(p MemoryPlan, available int64, where string) error {
	est, err := EstimateMemory(p)
	if err != nil {
		return err
	}
	if est.Total > available {
		if p.Precision == "" {
			p.Precision = "bf16"
		}
		if p.Purpose == "" {
			p.Purpose = PurposeTrain
		}
		return &MemoryError{Plan: p, Needed: est.Total, Available: available, Where: where}
	}
	return nil
}

// HostAvailable is the memory this process may still take: the kernel's
// MemAvailable, or what the cgroup's limit leaves when that is lower. ok is
// false where neither can be read (not Linux).
func HostAvailable() (avail int64, ok bool) {
	avail = math.MaxInt64
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if v, found := meminfoAvailable(b); found {
			avail, ok = v, true
		}
	}
	if left, found := cgroupLeft(); found && left < avail {
		avail, ok = left, true
	}
	return avail, ok
}

// meminfoAvailable reads MemAvailable (in kB) from /proc/meminfo's text.
func meminfoAvailable(b []byte) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, false
			}
			return kb * 1024, true
		}
	}
	return 0, false
}

// cgroupLeft is the cgroup's memory limit less its usage (v2, then v1); a
// limit of "max" or v1's page-counter maximum means none.
func cgroupLeft() (int64, bool) {
	for _, f := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		limit, ok := readBytesFile(f[0])
		if !ok || limit >= 1<<60 {
			continue
		}
		used, _ := readBytesFile(f[1])
		return max(limit-used, 0), true
	}
	return 0, false
}

func readBytesFile(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}
