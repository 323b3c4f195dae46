package trainer

import "math"

// LearningRate is the rate for optimizer step `step` (counted from 0):
// linear warmup over `warmup` steps to `peak`, then cosine decay to
// floor x peak at step `total`, and the floor after that.
//
// Warmup exists because Adam's second-moment estimate starts at zero: for
// the first few hundred steps the bias correction divides by a very small
// number, and a peak rate applied there moves the weights much further than
// the same rate does later.
func LearningRate(step int, peak float64, warmup, total int, floor float64) float64 {
	if step < warmup {
		return peak * float64(step+1) / float64(warmup)
	}
	if total <= warmup {
		return peak
	}
	progress := float64(step-warmup) / float64(total-warmup)
	progress = math.Min(math.Max(progress, 0), 1)
	cosine := 0.5 * (1 + math.Cos(math.Pi*progress))
	return peak * (floor + (1-floor)*cosine)
}
