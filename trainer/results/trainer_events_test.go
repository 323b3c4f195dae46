package results_test

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/results/tfevents"
)

// A real training run's metrics.jsonl, turned into an event file the way a
// segment and `sched train` do, decodes (with a reader that shares no code
// with the writer) to exactly the run's logged values, as float32.
func TestEventsOfATrainingRunEqualItsMetrics(t *testing.T) {
	mc := model.Presets["tiny"]
	dir := filepath.Join(t.TempDir(), "code")
	a, err := tokens.OpenAppender(context.Background(), dir, tokens.Tokenizer{Name: "t", SHA256: strings.Repeat("ab", 32), VocabSize: mc.VocabSize}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uint32, 200000)
	x := uint64(7)
	for i := range ids[:len(ids)-1] {
		x = x*6364136223846793005 + 1442695040888963407
		ids[i] = uint32(1 + (x>>33)%uint64(mc.VocabSize-1))
	}
	if _, err := a.Append(context.Background(), tokens.ShardInfo{ID: "s0", Source: "test"}, bytes.NewReader(tokens.Encode(nil, tokens.DtypeFor(mc.VocabSize), ids))); err != nil {
		t.Fatal(err)
	}
	a.Close()
	rc := trainer.RunConfig{Model: "tiny", Seq: 32, Batch: 2, Accumulate: 2, LR: 1e-3, Warmup: 2, TotalSteps: 6, LogEvery: 1,
		EvalEvery: 3, EvalBatches: 1, Seed: 5, Engine: "cpu", Precision: "fp32", Mixture: []trainer.MixtureEntry{{Store: dir, Weight: 1}}}
	data, err := trainer.OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	began := time.Now()
	if _, err := trainer.Run(context.Background(), trainer.Config{Run: rc, Out: out, Data: data}, trainer.Hooks{}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(out, trainer.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := results.ReadMetrics(f)
	f.Close()
	if err != nil || len(recs) != 6 {
		t.Fatalf("metrics: %d lines, %v", len(recs), err)
	}
	name, err := results.WriteEventFile(out, recs, 0, 6, began)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	evs, err := tfevents.Read(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 7 {
		t.Fatalf("%d events; want the version event and six steps", len(evs))
	}
	f32 := func(v float64) float32 { return float32(v) }
	for i, r := range recs {
		got := evs[i+1]
		want := map[string]float32{results.TagLoss: f32(*r.Loss), results.TagLR: f32(r.LR), results.TagGradNorm: f32(r.GradNorm),
			results.TagTokPerSec: f32(r.TokPerSec), results.TagPeakMemory: f32(float64(r.PeakMemory) / (1 << 30))}
		if r.EvalLoss != nil {
			want[results.TagEvalLoss] = f32(*r.EvalLoss)
		}
		if got.Step != int64(r.Step) || len(got.Values) != len(want) {
			t.Errorf("event of step %d: step %d, values %v; want %v", r.Step, got.Step, got.Values, want)
		}
		for tag, v := range want {
			if g := got.Values[tag]; g != v || math.IsNaN(float64(g)) {
				t.Errorf("step %d %s = %v, metrics.jsonl has %v", r.Step, tag, g, v)
			}
		}
	}
}
