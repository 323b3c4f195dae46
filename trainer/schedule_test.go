package trainer

import (
	"math"
	"testing"
)

func TestScheduleWarmsUpThenDecaysToTheFloor(t *testing.T) {
	const peak, warmup, total, floor = 4e-4, 100, 1100, 0.1
	lr := func(step int) float64 { return LearningRate(step, peak, warmup, total, floor) }
	if got := lr(0); got >= peak/50 {
		t.Errorf("step 0: lr %g, want below %g", got, peak/50)
	}
	if got := lr(warmup - 1); math.Abs(got-peak) > 1e-12 {
		t.Errorf("end of warmup: lr %g, want %g", got, peak)
	}
	for step := 1; step < warmup; step++ {
		if lr(step) <= lr(step-1) {
			t.Fatalf("warmup not increasing at step %d: %g <= %g", step, lr(step), lr(step-1))
		}
	}
	if got := lr(total); math.Abs(got-peak*floor) > 1e-12 {
		t.Errorf("step %d: lr %g, want the floor %g", total, got, peak*floor)
	}
	if got := lr(total + 5000); math.Abs(got-peak*floor) > 1e-12 {
		t.Errorf("past the end: lr %g, want the floor %g", got, peak*floor)
	}
	mid := warmup + (total-warmup)/2
	if got, want := lr(mid), peak*(floor+(1-floor)/2); math.Abs(got-want) > 1e-12 {
		t.Errorf("halfway through the decay: lr %g, want %g", got, want)
	}
	for step := warmup; step < total; step++ {
		if lr(step) < lr(step+1) {
			t.Fatalf("decay not monotone at step %d: %g < %g", step, lr(step), lr(step+1))
		}
	}
}

func TestScheduleWithoutDecayStaysAtPeak(t *testing.T) {
	if got := LearningRate(500, 1e-3, 10, 10, 0.1); got != 1e-3 {
		t.Errorf("total <= warmup: lr %g, want the peak", got)
	}
	if got := LearningRate(0, 1e-3, 0, 100, 0.1); got != 1e-3 {
		t.Errorf("no warmup, step 0: lr %g, want the peak", got)
	}
}
