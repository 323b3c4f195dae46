package model

import (
	"fmt"
	"testing"
)

// BenchmarkTrainStep measures the CPU engine's training throughput
// (forward, backward and AdamW step) in tokens per second: tiny and small
// at one sequence of 256, and tiny at the demo's 4 x 64.
func BenchmarkTrainStep(b *testing.B) {
	for _, s := range []struct {
		model string
		B, T  int
	}{{"tiny", 1, 256}, {"small", 1, 256}, {"tiny", 4, 64}} {
		b.Run(fmt.Sprintf("%s/%dx%d", s.model, s.B, s.T), func(b *testing.B) {
			c := Presets[s.model]
			e, err := NewCPUEngine(c, Options{})
			if err != nil {
				b.Fatal(err)
			}
			if err := e.SetParams(InitParams(c, 1)); err != nil {
				b.Fatal(err)
			}
			batch := testBatch(c, s.B, s.T, 3)
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
			b.ReportMetric(float64(s.B*s.T*b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
