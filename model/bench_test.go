package model

import (
	"fmt"
	"runtime"
	"testing"
)

// BenchmarkMatmul compares gonum's Sgemm with the hand-written matmulNT on
// the shapes of the small model's projections at 256 tokens.
func BenchmarkMatmul(b *testing.B) {
	for _, s := range []struct{ n, in, out int }{{256, 512, 512}, {256, 512, 1408}, {256, 1408, 512}} {
		x, w, y := make([]float32, s.n*s.in), make([]float32, s.out*s.in), make([]float32, s.n*s.out)
		for i := range x {
			x[i] = float32(i%7) * 0.1
		}
		for i := range w {
			w[i] = float32(i%5) * 0.1
		}
		flops := 2 * float64(s.n*s.in*s.out)
		name := fmt.Sprintf("%dx%dx%d", s.n, s.in, s.out)
		b.Run("gonum/"+name, func(b *testing.B) {
			for b.Loop() {
				linear(y, x, w, s.n, s.in, s.out)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run("loops/"+name, func(b *testing.B) {
			for b.Loop() {
				matmulNT(runtime.GOMAXPROCS(0), y, x, w, s.n, s.in, s.out)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkTrainStep measures the CPU engine's training throughput
// (forward, backward and AdamW step) in tokens per second at seq 256.
func BenchmarkTrainStep(b *testing.B) {
	for _, name := range []string{"tiny", "small"} {
		b.Run(name, func(b *testing.B) {
			c := Presets[name]
			e, err := NewCPUEngine(c, Options{})
			if err != nil {
				b.Fatal(err)
			}
			if err := e.SetParams(InitParams(c, 1)); err != nil {
				b.Fatal(err)
			}
			batch := testBatch(c, 1, 256, 3)
			opt := AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}
			for b.Loop() {
				e.ZeroGrad()
				if err := e.ForwardBackward(batch, 1); err != nil {
					b.Fatal(err)
				}
				if err := e.Step(opt); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(256*b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
