package results

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Verdict is a gate's outcome.
type Verdict string

const (
	Pass Verdict = "pass"
	Fail Verdict = "fail"
	// Unknown means there is not yet enough evidence to decide, which is not
	// the same as passing: the long run waits for a pass.
	Unknown Verdict = "unknown"
	// Pending means the run has not reached its total steps, and the gate
	// judges its end: the losses it ends on, a sample of its final model.
	// A verdict on the steps so far would read as the run's.
	Pending Verdict = "pending"
)

// Gate is one of the pilot's checks: its number, its limit and its verdict,
// with a sentence a person can act on.
type Gate struct {
	Name    string
	Value   float64
	Limit   string
	Verdict Verdict
	Detail  string
}

// The seed plan's thresholds. A spike is a logged loss above SpikeRatio x
// the median of the SpikeWindow losses before it; generation is sane when at
// least MinDistinct4Grams of a sample's 4-grams are distinct; throughput is
// within ThroughputTolerance of the bench figure for the same shape.
const (
	SpikeRatio      = 1.5
	SpikeWindow     = 100
	FallingFraction = 0.10
	// FallingMin is the fewest eval losses the falling gate fits a line
	// to: a line through two is the difference of two noisy evaluations,
	// which a short run (the README's CPU day logs 12) turns into a
	// verdict on noise.
	FallingMin          = 3
	MinDistinct4Grams   = 0.5
	ThroughputTolerance = 0.10
	// BusyCPU is the share of the machine's CPU other processes may use
	// while a CPU engine's bench is measured before its figure is not
	// trusted: the engine shares the cores with them.
	BusyCPU = 0.25
)

// Evidence is what a run's gates are judged on.
type Evidence struct {
	Run     string
	Records []Record
	// Warmup is the run's warmup steps, which SmoothGate passes over.
	Warmup int
	// Sample is a generated sample of the run's final model; nil for none.
	Sample []int32
	// SampleErr is why a finished run has no sample: the gate then says
	// so, not that a sample of no tokens is too short to judge.
	SampleErr error
	// TokPerSec is the run's measured rate, Bench the bench's row of its
	// step (the zero row for none).
	TokPerSec float64
	Bench     BenchRow
	// Step is where the run is, TotalSteps its length (0: unknown, and
	// the run is judged as it is).
	Step, TotalSteps int
}

// Gates judges a run. Before its total steps a run is judged only where
// the steps so far decide: a spike is a failure whenever it comes, and the
// rate is measured as the run goes; the falling gate (its last losses),
// the generation gate (its final model) and a smooth curve without a spike
// yet are pending until the run's end.
func Gates(e Evidence) []Gate {
	smooth, falling := SmoothGate(e.Records, e.Warmup), FallingGate(e.Records)
	gen := GenerationGate(e.Sample)
	if e.Sample == nil && e.SampleErr != nil {
		gen.Detail = "no sample of the final model: " + strings.Join(strings.Fields(e.SampleErr.Error()), " ")
	}
	if e.TotalSteps > 0 && e.Step < e.TotalSteps {
		if smooth.Verdict != Fail {
			smooth = smooth.pending(e.Step, e.TotalSteps, "a spike fails it at any step, a pass waits for its end; so far: "+smooth.Detail)
		}
		falling = falling.pending(e.Step, e.TotalSteps, "the eval losses it ends on are judged; so far: "+falling.Detail)
		gen = gen.pending(e.Step, e.TotalSteps, "a sample of its final model is judged at its end")
	}
	if e.TotalSteps > 0 && e.Step >= e.TotalSteps && smooth.Verdict == Unknown {
		smooth.Detail = smoothNotJudged(e)
	}
	rate := ThroughputGate(e.TokPerSec, e.Bench, e.Run)
	if e.TotalSteps > 0 && e.Step >= e.TotalSteps && e.TokPerSec > 0 && e.Bench.TokPerSec <= 0 {
		// No segment of a finished run writes its results again: a bench
		// run now would not change them.
		rate.Detail = fmt.Sprintf("no bench figure for this run's step when it ended, and its results keep this verdict; 'sched enqueue bench %s' measures the step for the runs of it that follow", e.Run)
	}
	return []Gate{smooth, falling, gen, rate}
}

// smoothNotJudged says why the smooth gate of the finished run e has no
// verdict, which no later segment gives it ("... yet" read as if one
// would), and what gives the runs after it one: a smaller log_every, so
// that SpikeWindow losses are logged before the ones it checks.
func smoothNotJudged(e Evidence) string {
	if e.Warmup >= e.Step {
		return fmt.Sprintf("the run ended at step %d, within its warmup of %d steps: there is no loss after warmup to judge, so this gate cannot be judged for it; give a run a warmup shorter than its length", e.Step, e.Warmup)
	}
	// Twice the window: the later half of the losses is checked.
	every := max(1, e.TotalSteps/(2*SpikeWindow))
	return fmt.Sprintf("the run ended with %d losses logged, none of them after warmup (step %d) with the %d before it that the gate compares a loss with: this gate cannot be judged for it; "+
		"a run of %d steps given log_every %d or less in its runs entry logs %d losses or more, enough to judge (the pilot-cpu preset logs every step)",
		len(TrainCurve(e.Records)), e.Warmup, SpikeWindow, e.TotalSteps, every, e.TotalSteps/every)
}

// pending is g for a run at step of total, with what waits for its end.
func (g Gate) pending(step, total int, why string) Gate {
	g.Verdict, g.Value = Pending, 0
	g.Detail = fmt.Sprintf("the run is at step %d of %d: %s", step, total, why)
	return g
}

// SmoothGate checks that after warmup no logged training loss exceeds
// SpikeRatio x the median of the SpikeWindow losses logged before it.
func SmoothGate(recs []Record, warmupSteps int) Gate {
	g := Gate{Name: "smooth", Limit: fmt.Sprintf("<= %.1fx the median of the %d losses before", SpikeRatio, SpikeWindow)}
	pts := TrainCurve(recs)
	worst, worstStep, checked := 0.0, 0, 0
	window := make([]float64, 0, SpikeWindow)
	for i, p := range pts {
		if p.Step <= warmupSteps || i < SpikeWindow {
			continue
		}
		window = window[:0]
		for _, q := range pts[i-SpikeWindow : i] {
			window = append(window, q.Loss)
		}
		m := median(window)
		if m <= 0 {
			continue
		}
		checked++
		if r := p.Loss / m; r > worst || math.IsNaN(p.Loss) {
			worst, worstStep = r, p.Step
		}
	}
	g.Value = worst
	switch {
	case checked == 0:
		g.Verdict = Unknown
		g.Detail = fmt.Sprintf("no loss logged after warmup (step %d) with %d losses before it yet", warmupSteps, SpikeWindow)
	case math.IsNaN(worst) || worst > SpikeRatio:
		g.Verdict = Fail
		g.Detail = fmt.Sprintf("loss at step %d is %.2fx the median before it: lengthen warmup or lower the learning rate", worstStep, worst)
	default:
		g.Verdict = Pass
		g.Detail = fmt.Sprintf("largest ratio %.2fx at step %d over %d checked losses", worst, worstStep, checked)
	}
	return g
}

// FallingGate fits a line to the last FallingFraction of the evaluation
// losses, at least FallingMin of them, against tokens and checks that its
// slope is negative. The value is the slope in loss per billion tokens.
func FallingGate(recs []Record) Gate {
	g := Gate{Name: "still falling", Limit: fmt.Sprintf("slope < 0 over the last 10%% of eval losses (at least %d)", FallingMin)}
	pts := EvalCurve(recs)
	n := int(math.Ceil(float64(len(pts)) * FallingFraction))
	n = max(n, FallingMin)
	if len(pts) < n {
		g.Verdict = Unknown
		g.Detail = fmt.Sprintf("%d eval losses logged; need at least %d", len(pts), FallingMin)
		return g
	}
	tail := pts[len(pts)-n:]
	x := make([]float64, n)
	y := make([]float64, n)
	for i, p := range tail {
		x[i], y[i] = float64(p.Tokens)/1e9, p.Loss
	}
	slope, ok := fitSlope(x, y)
	if !ok {
		g.Verdict = Unknown
		g.Detail = "the last eval losses were all logged at the same token count"
		return g
	}
	g.Value = slope
	if slope < 0 {
		g.Verdict = Pass
		g.Detail = fmt.Sprintf("slope %.4g loss per billion tokens over the last %d eval losses", slope, n)
	} else {
		g.Verdict = Fail
		g.Detail = fmt.Sprintf("slope %.4g loss per billion tokens over the last %d eval losses: a plateau means the learning rate is wrong, or the data ran out and repeats: "+
			"check that the mixture's stores hold the run's tokens, then try a higher lr", slope, n)
	}
	return g
}

// GenerationGate checks that at least MinDistinct4Grams of the 4-grams in a
// generated sample are distinct; a model stuck repeating itself fails.
func GenerationGate(sample []int32) Gate {
	g := Gate{Name: "sane generation", Limit: fmt.Sprintf(">= %.0f%% distinct 4-grams", MinDistinct4Grams*100)}
	if len(sample) < 4 {
		g.Verdict = Unknown
		g.Detail = fmt.Sprintf("the sample has %d tokens; need at least 4", len(sample))
		return g
	}
	g.Value = Distinct4Grams(sample)
	if g.Value >= MinDistinct4Grams {
		g.Verdict = Pass
	} else {
		g.Verdict = Fail
	}
	g.Detail = fmt.Sprintf("%.0f%% of the %d 4-grams in a %d-token sample are distinct", g.Value*100, len(sample)-3, len(sample))
	if g.Verdict == Fail {
		g.Detail += ": the model repeats itself; check that its tokenizer is the one its token stores were made with (the same sha256 in their manifests), then train longer"
	}
	return g
}

// Distinct4Grams is the fraction of a sequence's 4-grams that are distinct.
func Distinct4Grams(s []int32) float64 {
	if len(s) < 4 {
		return 0
	}
	seen := make(map[[4]int32]struct{}, len(s))
	for i := 0; i+4 <= len(s); i++ {
		seen[[4]int32(s[i:i+4])] = struct{}{}
	}
	return float64(len(seen)) / float64(len(s)-3)
}

// ThroughputGate compares the run's tok/s with what `sched bench` measured
// for the run's step (`sched enqueue bench RUN`; bench is its row, the zero
// row for none); a run well below it is held back by its data loader, not
// by the engine. The value is measured/bench.
func ThroughputGate(measured float64, row BenchRow, run string) Gate {
	g := Gate{Name: "tok/s vs bench", Limit: fmt.Sprintf("within %.0f%% of bench", ThroughputTolerance*100)}
	bench := row.TokPerSec
	switch {
	case measured <= 0:
		g.Verdict, g.Detail = Unknown, "no tok/s logged yet"
		return g
	case bench <= 0:
		g.Verdict = Unknown
		g.Detail = fmt.Sprintf("no bench figure for this run's step: run 'sched enqueue bench %s'", run)
		return g
	case row.CPUBusy():
		g.Verdict, g.Value = Unknown, measured/bench
		g.Detail = fmt.Sprintf("%.0f tok/s against %.0f in bench, but other processes used %.0f%% of the CPU while the bench ran: measure again with 'sched enqueue bench %s' when the machine is idle",
			measured, bench, row.OtherCPU*100, run)
		return g
	}
	g.Value = measured / bench
	g.Detail = fmt.Sprintf("%.0f tok/s against %.0f in bench (%.0f%%)", measured, bench, g.Value*100)
	switch {
	case math.Abs(g.Value-1) <= ThroughputTolerance:
		g.Verdict = Pass
	case g.Value < 1:
		g.Verdict = Fail
		g.Detail += ": the data loader, or other work on this machine, holds the run back; check its CPU and disk use"
	default:
		// Faster than the engine alone: the bench was held back instead.
		g.Verdict = Fail
		g.Detail += fmt.Sprintf(": the bench ran slower than the run, likely beside other work; measure again on an idle machine with 'sched enqueue bench %s'", run)
	}
	return g
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// fitSlope is the least-squares slope of y against x.
func fitSlope(x, y []float64) (float64, bool) {
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx /= float64(len(x))
	my /= float64(len(y))
	var sxy, sxx float64
	for i := range x {
		sxy += (x[i] - mx) * (y[i] - my)
		sxx += (x[i] - mx) * (x[i] - mx)
	}
	if sxx == 0 {
		return 0, false
	}
	return sxy / sxx, true
}
