package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// bf16Bits rounds x to bf16 (nearest even), as the device stores it.
func bf16Bits(x float32) uint16 {
	b := math.Float32bits(x)
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// BenchmarkStepGemms times each GEMM shape of a small 32 x 1024 training
// step (docs/benchmarks/gemm_peer.py's list, the same row-major names) in
// each output the engine could give it, cuBLASLt tuned over 8 candidates
// as the engine tunes: bf16 out, fp32 out from scratch, and fp32 added
// into (beta 1). It reports ms a call for each, on operands of random
// values (zeros draw less power and run faster than a training step's
// values: docs/benchmarks/gemm_peer.py times torch.mm on random ones too).
func BenchmarkStepGemms(b *testing.B) {
	d, err := LoadDriver()
	if err != nil {
		b.Skipf("no CUDA driver: %v", err)
	}
	lt, err := LoadBLASLt()
	if err != nil {
		b.Skipf("no cuBLASLt: %v", err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dv, err := d.OpenDevice(0)
	if err != nil {
		b.Skipf("no CUDA device: %v", err)
	}
	defer dv.Close()
	st, err := dv.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer st.Destroy()
	start, err := dv.NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	end, err := dv.NewEvent()
	if err != nil {
		b.Fatal(err)
	}
	timer := func(stream uintptr, run func() error) (float32, error) { return start.Time(end, stream, run) }
	alloc := func(bytes int64) Ptr {
		p, err := dv.Alloc(bytes)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dv.Free(p) })
		return p
	}
	scratch := func(bytes int64) (Ptr, func(), error) {
		p, err := dv.Alloc(bytes)
		if err != nil {
			return 0, nil, err
		}
		return p, func() { dv.Free(p) }, nil
	}
	const wsSize = 32 << 20
	ws := alloc(wsSize)
	const most = 32768 * 2816
	A, B, C := alloc(most*2), alloc(most*2), alloc(most*4)
	r := rand.New(rand.NewPCG(1, 2))
	vals := make([]uint16, most)
	for _, p := range []Ptr{A, B} {
		for i := range vals {
			vals[i] = bf16Bits(float32(r.NormFloat64()))
		}
		if err := Upload(dv, p, vals); err != nil {
			b.Fatal(err)
		}
	}
	cvals := make([]float32, most)
	for i := range cvals {
		cvals[i] = float32(r.NormFloat64())
	}
	if err := Upload(dv, C, cvals); err != nil {
		b.Fatal(err)
	}
	shapes := []struct {
		M, N, K int
		tt      string
	}{
		{2816, 512, 32768, "TN"}, {32768, 512, 2816, "NN"}, {32768, 2816, 512, "NT"}, {16384, 512, 4096, "TN"},
		{4096, 16384, 512, "NT"}, {4096, 512, 16384, "NN"}, {32768, 512, 1408, "NT"}, {512, 1408, 32768, "TN"},
		{32768, 1408, 512, "NN"}, {32768, 1024, 512, "NT"}, {1024, 512, 32768, "TN"}, {32768, 512, 512, "NT"},
		{32768, 512, 1024, "NN"}, {512, 512, 32768, "TN"}, {32768, 512, 512, "NN"},
	}
	variants := []struct {
		name  string
		ctype int32
		beta  float32
	}{
		{"bf16", DataBF16, 0}, {"f32", DataF32, 0}, {"f32add", DataF32, 1},
	}
	for _, s := range shapes {
		ta, tb := s.tt[0] == 'T', s.tt[1] == 'T'
		for _, v := range variants {
			b.Run(fmt.Sprintf("%dx%dx%d_%s/%s", s.M, s.N, s.K, s.tt, v.name), func(b *testing.B) {
				// A sub-benchmark runs on a goroutine of its own: its
				// thread needs the context too.
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				if err := dv.MakeCurrent(); err != nil {
					b.Fatal(err)
				}
				lh, err := lt.NewHandle()
				if err != nil {
					b.Fatal(err)
				}
				defer lh.Destroy()
				lh.Tune(8, timer, scratch)
				call := func() error {
					return lh.matmul(ComputeF32, DataBF16, v.ctype, ta, tb, s.M, s.N, s.K, 1, A, B, v.beta, C, C, ws, wsSize, st.Handle())
				}
				for range 10 {
					if err := call(); err != nil {
						b.Fatalf("%dx%dx%d %s out %d: %v", s.M, s.N, s.K, s.tt, v.ctype, err)
					}
				}
				b.ResetTimer()
				// Back to back between two events, as gemm_peer.py times
				// torch.mm: timing each call alone would add the gap
				// between its launch and the start event to every call.
				total, err := timer(st.Handle(), func() error {
					for range b.N {
						if err := call(); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(total)/float64(b.N), "ms/call")
			})
		}
	}
}
