package results

import (
	"errors"
	"maps"
	"math"
	"strings"
	"testing"
)

// curve makes n training losses decaying from 6 towards 2 with a small
// deterministic wiggle, one eval loss every 10 steps.
func curve(n int) []Record {
	recs := make([]Record, n)
	for i := range recs {
		step := i + 1
		l := 2 + 4*math.Exp(-float64(step)/200) + 0.02*math.Sin(float64(step))
		recs[i] = Record{Step: step, Tokens: int64(step) * 8192, Loss: F(l)}
		if step%10 == 0 {
			recs[i].EvalLoss = F(l + 0.05)
		}
	}
	return recs
}

func TestSmoothGate(t *testing.T) {
	recs := curve(1000)
	if g := SmoothGate(recs, 100); g.Verdict != Pass || g.Value > 1.1 {
		t.Fatalf("smooth curve: %+v", g)
	}
	// A spike of 1.6x at step 700 fails and is named.
	*recs[699].Loss *= 1.6
	g := SmoothGate(recs, 100)
	if g.Verdict != Fail || g.Value < 1.5 {
		t.Fatalf("spiked curve: %+v", g)
	}
	// The same spike inside warmup is allowed: warmup exists for it.
	if g := SmoothGate(recs, 800); g.Verdict != Pass {
		t.Fatalf("spike during warmup: %+v", g)
	}
	if g := SmoothGate(curve(50), 10); g.Verdict != Unknown {
		t.Fatalf("too short a run must be unknown: %+v", g)
	}
	nan := curve(300)
	nan[250].Loss = F(math.NaN())
	if g := SmoothGate(nan, 10); g.Verdict != Fail {
		t.Fatalf("NaN loss must fail: %+v", g)
	}
}

func TestFallingGate(t *testing.T) {
	if g := FallingGate(curve(1000)); g.Verdict != Pass || g.Value >= 0 {
		t.Fatalf("falling curve: %+v", g)
	}
	// A plateau with the last eval losses rising fails.
	recs := curve(1000)
	for i := 900; i < 1000; i++ {
		if recs[i].EvalLoss != nil {
			recs[i].EvalLoss = F(2 + float64(i)/1e4)
		}
	}
	if g := FallingGate(recs); g.Verdict != Fail || g.Value <= 0 || !strings.Contains(g.Detail, " loss per billion tokens over the last ") ||
		!strings.HasSuffix(g.Detail, "or the data ran out and repeats: check that the mixture's stores hold the run's tokens, then try a higher lr") {
		t.Fatalf("rising tail: %+v; want it to say what to check and try", g)
	}
	if g := FallingGate(curve(15)); g.Verdict != Unknown {
		t.Fatalf("one eval loss: %+v", g)
	}
	if g := FallingGate(curve(29)); g.Verdict != Unknown || !strings.Contains(g.Detail, "need at least 3") {
		t.Fatalf("two eval losses: %+v", g)
	}
	// A short run's 12 eval losses, falling, the last a little above the
	// one before it (noise): the line through the last three still falls,
	// where the one through the last two would rise.
	recs = curve(120)
	*recs[119].EvalLoss = *recs[109].EvalLoss + 0.001
	if g := FallingGate(recs); g.Verdict != Pass || !strings.Contains(g.Detail, "last 3 eval losses") {
		t.Fatalf("short run, noisy last eval loss: %+v", g)
	}
}

func TestGenerationGate(t *testing.T) {
	varied := make([]int32, 256)
	for i := range varied {
		varied[i] = int32(i * 7 % 251)
	}
	if g := GenerationGate(varied); g.Verdict != Pass || g.Value < 0.95 {
		t.Fatalf("varied sample: %+v", g)
	}
	// "a b c a b c ..." has only 3 distinct 4-grams.
	rep := make([]int32, 256)
	for i := range rep {
		rep[i] = int32(i % 3)
	}
	g := GenerationGate(rep)
	if g.Verdict != Fail || math.Abs(g.Value-3.0/253) > 1e-12 ||
		!strings.HasSuffix(g.Detail, "the model repeats itself; check that its tokenizer is the one its token stores were made with (the same sha256 in their manifests), then train longer") {
		t.Fatalf("repeating sample: %+v; want it to say what to check and do", g)
	}
	if g := GenerationGate(varied); strings.Contains(g.Detail, "repeats") {
		t.Fatalf("varied sample: %+v", g)
	}
	if g := GenerationGate([]int32{1, 2}); g.Verdict != Unknown {
		t.Fatalf("short sample: %+v", g)
	}
}

func TestThroughputGate(t *testing.T) {
	gpu := func(tps float64) BenchRow { return BenchRow{TokPerSec: tps, Device: "NVIDIA H200"} }
	for _, c := range []struct {
		measured float64
		bench    BenchRow
		want     Verdict
		// says is what the detail must tell the user.
		says string
	}{
		{95000, gpu(100000), Pass, "95000 tok/s against 100000 in bench (95%)"},
		{109000, gpu(100000), Pass, "(109%)"},
		{85000, gpu(100000), Fail, "(85%): the data loader, or other work on this machine, holds the run back; check its CPU and disk use"},
		// Faster than the bench: the bench figure is what was held back,
		// and the way out is to measure the run's step again.
		{120000, gpu(100000), Fail, "(120%): the bench ran slower than the run, likely beside other work; measure again on an idle machine with 'sched enqueue bench pilot-cpu'"},
		{90000, BenchRow{}, Unknown, "no bench figure for this run's step: run 'sched enqueue bench pilot-cpu'"},
		{0, gpu(100000), Unknown, "no tok/s logged yet"},
		// A CPU engine's bench taken while other processes used a third of
		// the machine says nothing of the engine alone; a GPU's does, and
		// a CPU's taken beside a little other work too.
		{9400, BenchRow{TokPerSec: 4233, OtherCPU: 0.34}, Unknown,
			"9400 tok/s against 4233 in bench, but other processes used 34% of the CPU while the bench ran: measure again with 'sched enqueue bench pilot-cpu' when the machine is idle"},
		{9400, BenchRow{TokPerSec: 4233, OtherCPU: 0.34, Device: "NVIDIA H200"}, Fail, "(222%)"},
		{9400, BenchRow{TokPerSec: 9000, OtherCPU: 0.05}, Pass, "(104%)"},
	} {
		g := ThroughputGate(c.measured, c.bench, "pilot-cpu")
		if g.Verdict != c.want || !strings.Contains(g.Detail, c.says) {
			t.Errorf("%v vs %+v: %+v, want %s saying %q", c.measured, c.bench, g, c.want, c.says)
		}
	}
}

// A run short of its total steps is judged only where its steps so far
// decide: a plateau so far is no failure of the run, a spike is; at its
// total steps every gate is judged as the gates alone judge it.
func TestGatesOfARunShortOfItsEnd(t *testing.T) {
	recs := curve(1000)
	for i := 900; i < 1000; i++ {
		if recs[i].EvalLoss != nil {
			recs[i].EvalLoss = F(2 + float64(i)/1e4)
		}
	}
	sample := make([]int32, 64)
	for i := range sample {
		sample[i] = int32(i)
	}
	e := Evidence{Run: "pilot", Records: recs, Warmup: 100, Sample: sample, TokPerSec: 41000, Bench: BenchRow{TokPerSec: 100000}, Step: 1000, TotalSteps: 4000}
	verdicts := func(gs []Gate) map[string]Verdict {
		m := map[string]Verdict{}
		for _, g := range gs {
			m[g.Name] = g.Verdict
			if g.Verdict == Pending && !strings.Contains(g.Detail, "the run is at step 1000 of 4000") {
				t.Errorf("pending gate %s says %q", g.Name, g.Detail)
			}
		}
		return m
	}
	want := map[string]Verdict{"smooth": Pending, "still falling": Pending, "sane generation": Pending, "tok/s vs bench": Fail}
	if got := verdicts(Gates(e)); !maps.Equal(got, want) {
		t.Errorf("at step 1000 of 4000: %v, want %v", got, want)
	}
	*e.Records[699].Loss *= 1.6
	want["smooth"] = Fail
	if got := verdicts(Gates(e)); !maps.Equal(got, want) {
		t.Errorf("a spike at step 700 of 4000: %v, want %v", got, want)
	}
	e.Step, e.TotalSteps = 1000, 1000
	want = map[string]Verdict{"smooth": Fail, "still falling": Fail, "sane generation": Pass, "tok/s vs bench": Fail}
	if got := verdicts(Gates(e)); !maps.Equal(got, want) {
		t.Errorf("at its total steps: %v, want %v", got, want)
	}
}

// A finished run without a bench figure for its step is told that its
// results keep the verdict, not to run a bench that would not change them;
// a run still training is told to run it.
func TestThroughputGateOfAFinishedRunWithoutABench(t *testing.T) {
	last := func(step int) Gate {
		return Gates(Evidence{Run: "pilot-cpu", TokPerSec: 9000, Step: step, TotalSteps: 100})[3]
	}
	if g := last(100); g.Verdict != Unknown || !strings.Contains(g.Detail, "when it ended, and its results keep this verdict") {
		t.Errorf("a finished run: %+v", g)
	}
	if g := last(50); g.Verdict != Unknown || !strings.Contains(g.Detail, "run 'sched enqueue bench pilot-cpu'") {
		t.Errorf("a run at step 50 of 100: %+v", g)
	}
}

// A finished run whose sample could not be drawn says why, where its gate
// said the sample of no tokens was too short to judge.
func TestGenerationGateWithoutASampleSaysWhy(t *testing.T) {
	g := Gates(Evidence{Run: "pilot-cpu", Records: curve(100), SampleErr: errors.New("sample from step-0000100: decode: id 279 at position 9\nis not in the vocabulary of 275 tokens"),
		Step: 100, TotalSteps: 100})[2]
	if g.Verdict != Unknown || g.Detail != "no sample of the final model: sample from step-0000100: decode: id 279 at position 9 is not in the vocabulary of 275 tokens" {
		t.Errorf("a finished run without a sample: %+v", g)
	}
}
