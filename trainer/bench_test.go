package trainer

import (
	"context"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// The loop's cost beyond the engine: BenchmarkLoopStep runs Run's step
// (data, id checks, schedule, metrics) and BenchmarkEngineStep the same
// engine calls on pre-built batches; the difference is the overhead.
const benchSeq, benchBatch = 64, 4

func BenchmarkEngineStep(b *testing.B) {
	mc := model.Presets["tiny"]
	eng, err := model.NewEngine("cpu", mc, model.Options{Precision: "fp32", MaxBatch: benchBatch, MaxSeq: benchSeq})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	eng.SetParams(model.InitParams(mc, 1))
	d := newSliceData(mc.VocabSize, 200000)
	batch, _ := d.Next(context.Background(), benchBatch, benchSeq)
	o := model.AdamW{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, Clip: 1}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		eng.ZeroGrad()
		eng.ForwardBackward(batch, 1)
		eng.Step(o)
		if _, err := eng.Metrics(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*benchBatch*benchSeq)/b.Elapsed().Seconds(), "tok/s")
}

func BenchmarkLoopStep(b *testing.B) {
	rc := RunConfig{Model: "tiny", Seq: benchSeq, Batch: benchBatch, LR: 1e-4, TotalSteps: b.N, LogEvery: 1,
		Engine: "cpu", Precision: "fp32", Mixture: []MixtureEntry{{Store: "slice"}}}
	b.ResetTimer()
	if _, err := Run(context.Background(), Config{Run: rc, Out: b.TempDir(), Data: newSliceData(4096, 200000)}, Hooks{}); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N*benchBatch*benchSeq)/b.Elapsed().Seconds(), "tok/s")
}
