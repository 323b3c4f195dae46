package segment

import (
	"context"
	"testing"

	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
)

// A run of precision bf16 (the default) that trained on the CPU trained in
// fp32, so its throughput gate is held to the CPU's fp32 bench row of its
// step: the row the bench records on the CPU whatever it was asked.
func TestTheThroughputGateOfABF16RunOnTheCPUReadsTheFP32Row(t *testing.T) {
	ctx := context.Background()
	rc := testRun("gate-precision", 1).RunConfig
	rc.Precision, rc.EvalEvery, rc.CheckpointEvery = "bf16", 0, 0
	rc = rc.WithDefaults()
	mc, err := rc.ModelConfig()
	if err != nil {
		t.Fatal(err)
	}
	// The sweep's row, measured by the routine behind `sched bench` and
	// the GPU worker's sweep, asked for the run's precision.
	b, err := trainer.Bench(ctx, trainer.BenchOptions{Model: mc, Engine: "cpu", Precision: rc.Precision, Batch: rc.Batch, Seq: rc.Seq,
		Accumulate: rc.Accumulate, Steps: 1})
	if err != nil {
		t.Fatal(err)
	}
	row := results.Row(rc.Model, mc, rc.Batch, rc.Seq, b)
	res, err := trainer.Run(ctx, trainer.Config{Run: rc, Out: t.TempDir(), Data: &streamData{}}, trainer.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Precision != "fp32" {
		t.Errorf("a bf16 run on the CPU engine: trainer.Result's precision %q, want fp32", res.Precision)
	}
	// The segment's outcome carries the result as segment.Run copies it.
	out := Outcome{Step: res.Step, Done: res.Done, Devices: res.Devices, Precision: res.Precision}
	// A bf16 row of the step on a GPU beside it must not be the one read.
	gpu := row
	gpu.Precision, gpu.Device, gpu.TokPerSec = "bf16", "NVIDIA H200", 1e9
	if got := runBench([]results.BenchRow{gpu, row}, rc, out); got.Precision != "fp32" || got.TokPerSec != row.TokPerSec {
		t.Errorf("the gate of a bf16 run on the CPU read the row %+v; want the CPU's fp32 row %+v", got, row)
	}
	// A run that started no engine is held to its own precision.
	if got := runBench([]results.BenchRow{row, gpu}, rc, Outcome{}); got.Precision != "bf16" {
		t.Errorf("a bf16 run that started no engine read the row %+v; want the bf16 one", got)
	}
}

// The summary's settings say what the run asked and, where its engine
// computed in another precision, that one too.
func TestTheSummarySaysThePrecisionComputedIn(t *testing.T) {
	r := testRun("summary-precision", 1)
	rc := r.RunConfig.WithDefaults()
	rc.Engine, rc.Precision = "auto", "bf16"
	value := func(computed string) string {
		for _, s := range Settings(r, rc, computed, nil) {
			if s.Key == "engine, precision" {
				return s.Value
			}
		}
		t.Fatal("no engine, precision setting")
		return ""
	}
	if got := value("fp32"); got != "auto, bf16, computed in fp32" {
		t.Errorf("a bf16 run that trained on the CPU: %q", got)
	}
	for _, computed := range []string{"bf16", ""} {
		if got := value(computed); got != "auto, bf16" {
			t.Errorf("computed %q: %q, want auto, bf16", computed, got)
		}
	}
}
