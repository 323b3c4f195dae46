package trainer

import (
	"context"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

func benchConfig() model.Config {
	c, _ := model.Preset("tiny")
	c.VocabSize, c.Layers = 256, 1
	return c
}

// Bench trains real steps on the CPU engine: the loss is that of random
// targets (about ln V at initialisation) and throughput is positive.
func TestBenchMeasuresRealSteps(t *testing.T) {
	c := benchConfig()
	r, err := Bench(context.Background(), BenchOptions{Model: c, Engine: "cpu", Batch: 2, Seq: 16, Steps: 2, Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.Engine != "cpu" || r.TokPerSec <= 0 || r.Seconds <= 0 {
		t.Fatalf("result %+v: want the cpu engine and a positive rate", r)
	}
	if r.Loss < 4.5 || r.Loss > 6.5 {
		t.Fatalf("loss %.3f on random targets over 256 ids; want about ln 256 = 5.55", r.Loss)
	}
	if r.MFU != 0 {
		t.Fatalf("MFU %.3g on the CPU: the peak is unknown, so it must be left out", r.MFU)
	}
}

// With accumulate, a step trains that many micro-batches before the
// optimizer's, and tok/s counts them all, as the trainer's step does.
func TestBenchAccumulatesMicroBatches(t *testing.T) {
	c := benchConfig()
	r, err := Bench(context.Background(), BenchOptions{Model: c, Engine: "cpu", Batch: 2, Seq: 16, Accumulate: 3, Steps: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r.Accumulate != 3 {
		t.Fatalf("accumulate %d, want 3", r.Accumulate)
	}
	if tokens := r.TokPerSec * r.Seconds; math.Abs(tokens-2*3*2*16) > 1e-6 {
		t.Fatalf("tok/s x seconds = %.3f tokens; want 2 steps x 3 micro-batches x 2 x 16 = 192", tokens)
	}
	if r.Loss < 4.5 || r.Loss > 6.5 {
		t.Fatalf("loss %.3f on random targets over 256 ids; want about ln 256 = 5.55", r.Loss)
	}
	one, err := Bench(context.Background(), BenchOptions{Model: c, Engine: "cpu", Batch: 2, Seq: 16, Steps: 1})
	if err != nil || one.Accumulate != 1 {
		t.Fatalf("no accumulate: %+v, %v; want one micro-batch a step", one, err)
	}
}

func TestBenchRefusesBadShapes(t *testing.T) {
	c := benchConfig()
	for _, o := range []BenchOptions{
		{Model: c, Engine: "cpu", Batch: 0, Seq: 16, Steps: 1},
		{Model: c, Engine: "cpu", Batch: 1, Seq: c.MaxPositions + 1, Steps: 1},
		{Model: c, Engine: "cpu", Batch: 1, Seq: 16, Steps: 0},
		{Model: c, Engine: "tpu", Batch: 1, Seq: 16, Steps: 1},
		{Model: c, Engine: "cpu", Batch: 1, Seq: 16, Steps: 1, Accumulate: -1},
	} {
		if _, err := Bench(context.Background(), o); err == nil {
			t.Errorf("Bench(%+v) succeeded; want an error", o)
		}
	}
	_, err := Bench(context.Background(), BenchOptions{Model: c, Engine: "cpu", Batch: 1, Seq: c.MaxPositions + 1, Steps: 1})
	if err == nil || !strings.Contains(err.Error(), "seq must be between 1 and") {
		t.Fatalf("error %v: want one naming the allowed sequence lengths", err)
	}
}

// With a checkpoint every N steps, the bench writes them as a run does and
// sorts the steps' times by their place around them; what it wrote is
// removed at the end, waited for or not.
func TestBenchWritesCheckpoints(t *testing.T) {
	c := benchConfig()
	for _, wait := range []bool{false, true} {
		dir := t.TempDir()
		r, err := Bench(context.Background(), BenchOptions{Model: c, Engine: "cpu", Batch: 2, Seq: 16, Steps: 7, Warmup: 0,
			CheckpointEvery: 3, CheckpointWait: wait, CheckpointDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		ck := r.Checkpoints
		if ck == nil || ck.Checkpoints != 2 || len(ck.CheckpointStepSeconds) != 2 || ck.CheckpointStepTokPerSec <= 0 ||
			ck.AroundTokPerSec <= 0 || ck.OtherStepTokPerSec <= 0 {
			t.Fatalf("wait %v: checkpoint timing %+v; want 2 checkpoints (after steps 3 and 6) and a rate for each kind of step", wait, ck)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Fatalf("wait %v: the bench left %d entries in its checkpoint directory", wait, len(left))
		}
	}
	if _, err := Bench(context.Background(), BenchOptions{Model: c, Engine: "cpu", Batch: 2, Seq: 16, Steps: 1, CheckpointEvery: -1}); err == nil {
		t.Fatal("a negative checkpoint interval was accepted")
	}
}

// A checkpoint's steps are its own and the two after it, whose times on a
// GPU hold the wait for the device and the refill after it; the first
// checkpoint's (which makes the copies' buffer) are left out when there
// are more; the rest are the others, and the rates are tokens over their
// seconds.
func TestCheckpointTimingCountsTheStepsAroundACheckpoint(t *testing.T) {
	// Steps 1-14 with a checkpoint after every 4: checkpoints at steps 4,
	// 8 and 12; around them steps 4-6 (left out), 8-10 and 12-14.
	secs := []float64{1, 1, 1, 9, 0.5, 0.5, 1, 3, 0.5, 0.5, 1, 3, 1, 1}
	ck := checkpointTiming(secs, 4, 100)
	if ck.Checkpoints != 3 || !slices.Equal(ck.CheckpointStepSeconds, []float64{9, 3, 3}) || ck.SlowestCheckpointStepSecs != 9 || ck.SlowestStepSeconds != 9 {
		t.Fatalf("%+v", ck)
	}
	// Around: 3 + 0.5 + 0.5 + 3 + 1 + 1 = 9 s for 6 steps; others: steps
	// 1-3, 7 and 11, 5 s for 5 steps, so each window took 4.5 - 3 s extra.
	if ck.CheckpointStepTokPerSec != 300.0/15 || ck.AroundTokPerSec != 600.0/9 || ck.OtherStepTokPerSec != 500.0/5 || ck.AroundExtraSeconds != 1.5 {
		t.Fatalf("checkpoint %g, around %g, other %g tok/s, extra %g s; want 20, 66.7, 100 and 1.5",
			ck.CheckpointStepTokPerSec, ck.AroundTokPerSec, ck.OtherStepTokPerSec, ck.AroundExtraSeconds)
	}
	// One checkpoint: its steps are the figure, the buffer's making and all.
	one := checkpointTiming(secs[:7], 4, 100)
	if one.Checkpoints != 1 || one.AroundTokPerSec != 300.0/10 || one.AroundExtraSeconds != 7 {
		t.Fatalf("one checkpoint: %+v", one)
	}
}
