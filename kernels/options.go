package kernels

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-lm/kiln/internal/durlimit"
	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// Options are the CUDA engine's settings beyond model.Options. The zero
// value is the production path; the other values are variants kept for
// comparisons and for the RTX 3060's path on a newer GPU. They come from
// the environment (KILN_CUDA_* and KILN_KERNEL_CACHE), read once by
// ParseOptions, which the command line calls before it starts anything, so
// that a mistyped setting is refused at once instead of when an engine is
// made deep inside a run.
type Options struct {
	// head: how the LM head's GEMMs run in bf16 precision (head.go).
	head headMode
	// gemmTune: candidates each bf16 GEMM shape times; 0 for
	// gemmCandidates, -1 for the library's first choice.
	gemmTune int
	// gemmChoices: where the tuned GEMMs' algorithms are remembered: ""
	// for the kernel cache's directory, "off" for nowhere (each engine
	// times its own), or a directory.
	gemmChoices string
	// gemmWorkspace: the cuBLASLt workspace a GEMM may use, in MiB: 0 for
	// all of wsBytes (the production path), -1 for none.
	gemmWorkspace int
	// naive: the straightforward attention in bf16 too, instead of the
	// flash kernels.
	naive bool
	// flashSM80: flash.cu's kernels on a Hopper GPU too, instead of
	// flash_sm90.cu's.
	flashSM80 bool
	// flash64: the flash forward with 64 query rows a block (flash_fwd)
	// instead of 128 (flash_fwd128).
	flash64 bool
	// flashCopyAsync: the Hopper flash kernels that copy their tiles with
	// every thread's cp.async (flash_fwd_h, flash_bwd_dq_h, flash_bwd_dkv_h)
	// instead of the tensor memory accelerator's (the _ht kernels).
	flashCopyAsync bool
	// flashFused: the flash backward in one pass (flash_bwd, or
	// flash_bwd_h on Hopper, which sum dq in a fixed order across blocks,
	// between flash_bwd_dvec and flash_bwd_dq_final) instead of two
	// kernels that each compute the probabilities (dq, then dk and dv).
	flashFused bool
	// flashPair: "off" runs the Hopper forward and dq a query tile a
	// block, instead of a pair of tiles, the longest and the shortest left
	// (flashPairs).
	flashPair string
	// dresidFP32: the residual stream's gradient kept in fp32 with a bf16
	// copy for the GEMMs, instead of in bf16 alone (dresidBF in step.go).
	dresidFP32 bool
	// serialGrads: the weight-gradient GEMMs on the main stream instead of
	// a side stream beside it (overlap.go).
	serialGrads bool
	// eager: every kernel launched from the host; no CUDA graphs.
	eager bool
	// keepMemsets: recorded graphs keep the library's small memsets as
	// memset nodes instead of fill_u32 kernel nodes (graph.go).
	keepMemsets bool
	// forceSM80: the sm_80 (compute_80) build on a newer GPU.
	forceSM80 bool
	// kernelCache: where compiled kernels are kept ("" for CacheDir's
	// default).
	kernelCache string
	// hangTimeout: how long a wait for the device may last before it
	// counts as a hang (cuda.SetHangTimeout): 0 for
	// cuda.DefaultHangTimeout, -1 for never.
	hangTimeout time.Duration
	// bucketBytes: in a group of GPUs, the bytes of fp32 gradients summed
	// in one all-reduce during the backward of a step's last micro-batch
	// (buckets.go); 0 sums them all after the backward.
	bucketBytes int64
	// bucketsOnOne: a group of one GPU sums in buckets too, which gains it
	// nothing (its one-rank all-reduce does nothing); tests hold that path
	// to the engine's.
	bucketsOnOne bool
	// device: the ordinal of the GPU an engine opens (a Group sets it for
	// each of its engines; 0 otherwise).
	device int
}

// ParseOptions reads the CUDA engine's settings through getenv (os.Getenv
// on the command line): KILN_CUDA_HEAD, KILN_CUDA_GEMM_TUNE,
// KILN_CUDA_GEMM_CHOICES, KILN_CUDA_GEMM_WORKSPACE, KILN_CUDA_ATTENTION,
// KILN_CUDA_FLASH_FWD, KILN_CUDA_FLASH_BWD, KILN_CUDA_FLASH_PAIR,
// KILN_CUDA_FLASH_TMA, KILN_CUDA_DRESID, KILN_CUDA_OVERLAP, KILN_CUDA_GRAPH,
// KILN_CUDA_GRAPH_MEMSETS, KILN_CUDA_FORCE_SM80, KILN_CUDA_HANG_TIMEOUT,
// KILN_NCCL_BUCKET_MB and KILN_KERNEL_CACHE. A
// value a setting does not take is bad input naming the variable and the
// values it takes.
func ParseOptions(getenv func(string) string) (Options, error) {
	var o Options
	var err error
	if o.head, err = parseHeadMode(getenv("KILN_CUDA_HEAD")); err != nil {
		return Options{}, err
	}
	tune, err := parseGemmTune(getenv("KILN_CUDA_GEMM_TUNE"))
	if err != nil {
		return Options{}, err
	}
	switch tune {
	case gemmCandidates:
	case 0:
		o.gemmTune = -1
	default:
		o.gemmTune = tune
	}
	o.gemmChoices = getenv("KILN_CUDA_GEMM_CHOICES")
	if o.gemmWorkspace, err = parseGemmWorkspace(getenv("KILN_CUDA_GEMM_WORKSPACE")); err != nil {
		return Options{}, err
	}
	attention, err := envChoice(getenv, "KILN_CUDA_ATTENTION", "flash", "flash-sm80", "naive")
	if err != nil {
		return Options{}, err
	}
	o.naive = attention == "naive"
	o.flashSM80 = attention == "flash-sm80"
	flashFwd, err := envChoice(getenv, "KILN_CUDA_FLASH_FWD", "64", "128")
	if err != nil {
		return Options{}, err
	}
	o.flash64 = flashFwd == "64"
	tma, err := envChoice(getenv, "KILN_CUDA_FLASH_TMA", "on", "off")
	if err != nil {
		return Options{}, err
	}
	o.flashCopyAsync = tma == "off"
	flashBwd, err := envChoice(getenv, "KILN_CUDA_FLASH_BWD", "split", "fused")
	if err != nil {
		return Options{}, err
	}
	o.flashFused = flashBwd == "fused"
	if o.flashPair, err = envChoice(getenv, "KILN_CUDA_FLASH_PAIR", "on", "off"); err != nil {
		return Options{}, err
	}
	dresid, err := envChoice(getenv, "KILN_CUDA_DRESID", "bf16", "fp32")
	if err != nil {
		return Options{}, err
	}
	o.dresidFP32 = dresid == "fp32"
	overlapGrads, err := envChoice(getenv, "KILN_CUDA_OVERLAP", "on", "off")
	if err != nil {
		return Options{}, err
	}
	o.serialGrads = overlapGrads == "off"
	graphs, err := parseGraphs(getenv("KILN_CUDA_GRAPH"))
	if err != nil {
		return Options{}, err
	}
	o.eager = !graphs
	memsets, err := envChoice(getenv, "KILN_CUDA_GRAPH_MEMSETS", "kernel", "keep")
	if err != nil {
		return Options{}, err
	}
	o.keepMemsets = memsets == "keep"
	force, err := envChoice(getenv, "KILN_CUDA_FORCE_SM80", "0", "1")
	if err != nil {
		return Options{}, err
	}
	o.forceSM80 = force == "1"
	if o.hangTimeout, err = parseHangTimeout(getenv("KILN_CUDA_HANG_TIMEOUT")); err != nil {
		return Options{}, err
	}
	mib, err := parseBucketMiB(getenv("KILN_NCCL_BUCKET_MB"))
	if err != nil {
		return Options{}, err
	}
	o.bucketBytes = int64(mib) << 20
	o.kernelCache = getenv("KILN_KERNEL_CACHE")
	return o, nil
}

// maxBucketMiB bounds KILN_NCCL_BUCKET_MB: a bucket larger than the base
// model's gradients (407 MB) is one all-reduce after the backward anyway.
const maxBucketMiB = 1024

// parseBucketMiB reads KILN_NCCL_BUCKET_MB: unset, off or 0 for one
// all-reduce after the backward (0), or a bucket's MiB.
func parseBucketMiB(v string) (int, error) {
	switch v {
	case "", "off", "0":
		return 0, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= maxBucketMiB {
		return n, nil
	}
	return 0, &envError{fmt.Sprintf("KILN_NCCL_BUCKET_MB=%q is not a bucket size: set a number of MiB from 1 to %d (the gradients of several GPUs summed in buckets of that size during the backward), or off (one all-reduce after the backward, the default)", v, maxBucketMiB)}
}

// parseHangTimeout reads KILN_CUDA_HANG_TIMEOUT: unset for the default
// (0), a duration, or off (-1).
func parseHangTimeout(v string) (time.Duration, error) {
	switch v {
	case "":
		return 0, nil
	case "off":
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil && durlimit.Past(v) {
		return 0, &envError{fmt.Sprintf("KILN_CUDA_HANG_TIMEOUT=%q is out of range: %s; set a duration such as 10m, or off", v, durlimit.Longest)}
	}
	if err != nil || d <= 0 {
		return 0, &envError{fmt.Sprintf("KILN_CUDA_HANG_TIMEOUT=%q is not a setting it takes: set a duration such as 10m (how long a wait for the GPU may last before the process stops as hung; default %s), or off", v, cuda.DefaultHangTimeout)}
	}
	return d, nil
}

// Configure makes the "cuda" engine that model.NewEngine starts (for the
// trainer, the bench, verify, generation and the worker) use o. The
// command line calls it once, with what ParseOptions read; without it the
// engine runs the production path.
func Configure(o Options) {
	hang := o.hangTimeout
	if hang == 0 {
		hang = cuda.DefaultHangTimeout
	}
	cuda.SetHangTimeout(hang)
	model.Register("cuda", func(c model.Config, mo model.Options) (model.Engine, error) {
		if mo.GPUs != 1 && mo.GPUs != 0 {
			return NewGroup(c, mo, o)
		}
		return NewWithOptions(c, mo, o)
	})
}

func init() { Configure(Options{}) }

// candidates is how many of cuBLASLt's algorithms each bf16 GEMM shape
// times (0: the library's first choice).
func (o Options) candidates() int { return sized(o.gemmTune, gemmCandidates) }

// sized reads a setting kept as 0 for its default def, -1 for none (0)
// and any other value as itself.
func sized(v, def int) int {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

// envChoice reads the environment variable name, which must be unset or
// one of values; anything else is bad input naming the variable and them.
func envChoice(getenv func(string) string, name string, values ...string) (string, error) {
	v := getenv(name)
	if v == "" || slices.Contains(values, v) {
		return v, nil
	}
	return "", &envError{fmt.Sprintf("%s=%q is not a setting it takes: set one of %s, or unset it", name, v, strings.Join(values, ", "))}
}

// parseGemmWorkspace reads KILN_CUDA_GEMM_WORKSPACE: unset for all of
// wsBytes (0), a number of MiB up to it, or 0 MiB for none (-1).
func parseGemmWorkspace(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	switch {
	case err != nil || n < 0 || n > wsBytes>>20:
		return 0, &envError{fmt.Sprintf("KILN_CUDA_GEMM_WORKSPACE=%q is not a workspace size: set a number of MiB from 0 (none) to %d, or unset it for %d", v, wsBytes>>20, wsBytes>>20)}
	case n == 0:
		return -1, nil
	}
	return n, nil
}

// choicesDir is where tuned GEMM choices are remembered ("" for nowhere).
func (o Options) choicesDir() string {
	switch o.gemmChoices {
	case "off":
		return ""
	case "":
		return CacheDir(o.kernelCache)
	}
	return o.gemmChoices
}

// workspace is the bytes of cuBLASLt workspace a GEMM may use.
func (o Options) workspace() int64 { return int64(sized(o.gemmWorkspace, wsBytes>>20)) << 20 }

// parseGemmTune reads KILN_CUDA_GEMM_TUNE: unset for gemmCandidates, "off"
// for the library's first choice (0), or a number of candidates, 1 to 64.
func parseGemmTune(v string) (int, error) {
	switch v {
	case "":
		return gemmCandidates, nil
	case "off":
		return 0, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= 64 {
		return n, nil
	}
	return 0, &envError{fmt.Sprintf("KILN_CUDA_GEMM_TUNE=%q is not a GEMM tuning setting: set off, or a number of candidates from 1 to 64, or unset it for %d", v, gemmCandidates)}
}
