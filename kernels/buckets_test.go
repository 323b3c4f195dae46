package kernels

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// layerStarts is where each layer's gradients begin in the flat buffer
// (the engine's layout: the embedding, then each layer's specs, then the
// final norm and an untied head), the end of the layers last, and the
// count of every element.
func layerStarts(c model.Config) ([]int64, int64) {
	specs := c.Specs()
	off := make([]int64, len(specs)+1)
	for i, s := range specs {
		off[i+1] = off[i] + int64(s.Elements())
	}
	perLayer := (len(specs) - 2) / c.Layers
	if !c.TieEmbeddings {
		perLayer = (len(specs) - 3) / c.Layers
	}
	starts := make([]int64, c.Layers+1)
	for l := range starts {
		starts[l] = off[1+perLayer*l]
	}
	return starts, off[len(specs)]
}

// Every gradient is summed once, in a bucket summed only once its every
// gradient is final: a bucket summed after layer l's backward begins at
// layer l and holds nothing of the layers below it, and the embedding and
// what follows the layers wait for the whole backward.
func TestBucketsSumEveryGradientOnceItIsFinal(t *testing.T) {
	for _, name := range []string{"tiny", "small", "base"} {
		c := model.Presets[name]
		starts, n := layerStarts(c)
		layerBytes := (starts[1] - starts[0]) * 4
		for _, bytes := range []int64{1, layerBytes, layerBytes + 1, 25 << 20, 100 << 20, n * 4} {
			t.Run(fmt.Sprintf("%s/%d", name, bytes), func(t *testing.T) {
				p := planBuckets(starts, n, bytes)
				var all []span
				for l, s := range p.after {
					if s.lo == s.hi {
						continue
					}
					if s.lo != starts[l] || s.hi > starts[c.Layers] {
						t.Errorf("the bucket summed after layer %d's backward is %d to %d; layer %d begins at %d and the layers end at %d", l, s.lo, s.hi, l, starts[l], starts[c.Layers])
					}
					if (s.hi-s.lo)*4 < bytes {
						t.Errorf("the bucket after layer %d holds %d bytes, less than %d", l, (s.hi-s.lo)*4, bytes)
					}
					all = append(all, s)
				}
				all = append(all, p.last...)
				slices.SortFunc(all, func(a, b span) int { return int(a.lo - b.lo) })
				at := int64(0)
				for _, s := range all {
					if s.lo != at || s.hi <= s.lo {
						t.Fatalf("buckets %v do not cover 0 to %d once, in order: at %d", all, n, at)
					}
					at = s.hi
				}
				if at != n {
					t.Fatalf("buckets %v end at %d of %d", all, at, n)
				}
				if len(p.last) == 0 || p.last[0].lo != 0 || p.last[len(p.last)-1].hi != n {
					t.Errorf("the last buckets %v hold neither the embedding nor what follows the layers", p.last)
				}
				if bytes <= layerBytes && len(all) != c.Layers+len(p.last) {
					t.Errorf("buckets of %d bytes, a layer's %d: %d buckets, want a bucket a layer and the last %d", bytes, layerBytes, len(all), len(p.last))
				}
			})
		}
	}
}

// The worker's log says what KILN_NCCL_BUCKET_MB does for the run's group.
func TestBucketsNoticeSaysWhatTheSettingDoes(t *testing.T) {
	for _, c := range []struct {
		n       int
		moe     bool
		buckets int
		want    string
	}{
		{1, false, -1, "KILN_NCCL_BUCKET_MB=25: one GPU, no gradients to sum over GPUs"},
		{2, true, -1, "KILN_NCCL_BUCKET_MB=25: a mixture of experts sums its gradients after the backward"},
		{2, false, 3, "KILN_NCCL_BUCKET_MB=25: the gradients are summed over the 2 GPUs in 3 buckets, all but the last during the backward of each step's last micro-batch"},
	} {
		if got := bucketsNotice(25<<20, c.n, c.moe, c.buckets); got != c.want {
			t.Errorf("%d GPUs, moe %v: %q, want %q", c.n, c.moe, got, c.want)
		}
	}
}

// doubler stands where a group's communicator sums a bucket: it doubles
// the bucket in place on the buckets' stream, as the sum over two GPUs
// that hold the same gradients would. A bucket doubled before every
// gradient in it was final, one doubled twice or one left out shows in
// the gradients read after the backward.
type doubler struct{ f *cuda.Function }

func (d doubler) AllReduceSum(_, recv cuda.Ptr, count int, stream uintptr) error {
	return d.f.Launch(cuda.Dim3{X: (count + 255) / 256, Y: 1, Z: 1}, cuda.Dim3{X: 256, Y: 1, Z: 1}, 0, stream, recv, count)
}

// The buckets' sums wait for their gradients: on one GPU, with each sum
// doubling its bucket, the backward that sums in buckets (a bucket a
// layer, the weight-gradient GEMMs on the side stream beside it) leaves
// exactly twice the gradients of a backward at twice the loss scale, run
// directly, recorded and replayed.
func TestBucketsSumOnlyFinalGradients(t *testing.T) {
	t.Setenv("KILN_CUDA_GEMM_TUNE", "off")
	c := model.Presets["small"]
	o := model.Options{Precision: "bf16", MaxBatch: 2, MaxSeq: 256, Accumulate: 1}
	k := envOptions(t)
	k.bucketBytes, k.bucketsOnOne = 1, true
	g := newGroupWith(t, c, o, 1, k)
	e := newEngine(t, c, o)
	r := g.ranks[0]
	d := doubler{testKernel(t, r, "twice", `extern "C" __global__ void twice(float* x, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) x[i] *= 2.0f;
}`)}
	p0 := model.InitParams(c, 7)
	for _, eng := range []model.Engine{g, e} {
		if err := eng.SetParams(p0); err != nil {
			t.Fatal(err)
		}
	}
	const scale = 0.5
	for i, b := range groupBatches(c, 3, 1, 2, 256) {
		if err := e.ZeroGrad(); err != nil {
			t.Fatal(err)
		}
		if err := e.ForwardBackward(b, 2*scale); err != nil {
			t.Fatal(err)
		}
		want := model.NewParams(c)
		if err := e.Grads(want); err != nil {
			t.Fatal(err)
		}
		if err := g.ZeroGrad(); err != nil {
			t.Fatal(err)
		}
		count, err := r.checkBatch(b, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.th.do(func() error {
			if err := r.stageMicro(b, count, scale); err != nil {
				return err
			}
			return r.runMicro(b, d)
		}); err != nil {
			t.Fatal(err)
		}
		got := model.NewParams(c)
		if err := r.Grads(got); err != nil {
			t.Fatal(err)
		}
		for j := range want.Data {
			if math.Float32bits(got.Data[j]) != math.Float32bits(want.Data[j]) {
				t.Fatalf("run %d: gradient %d is %g after the buckets' sums, %g at twice the loss scale", i+1, j, got.Data[j], want.Data[j])
			}
		}
	}
	if _, ok := r.GraphNodes()["2x256+sums"]; !ok && !r.kopt.eager {
		t.Errorf("the summing micro-batch was not recorded as a graph: %v", r.GraphNodes())
	}
}
