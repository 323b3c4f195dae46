package model

import (
	"math"
	"testing"
)

// exp32 is within 2 ulp of e^x rounded to float32 over the whole range a
// max-subtracted softmax feeds it, and saturates outside its range.
func TestExp32(t *testing.T) {
	worst := 0.0
	for x := float32(-87.3); x <= 88.7; x = math.Nextafter32(x, 100) + 1e-4*float32(math.Abs(float64(x))+1e-3) {
		want := math.Exp(float64(x))
		got := float64(exp32(x))
		ulp := float64(math.Nextafter32(float32(want), float32(math.Inf(1))) - float32(want))
		if d := math.Abs(got-want) / ulp; d > worst {
			worst = d
			if d > 2 {
				t.Fatalf("exp32(%g) = %g, e^x = %g: %.1f ulp", x, got, want, d)
			}
		}
	}
	t.Logf("largest error %.2f ulp", worst)
	for x, want := range map[float32]float32{0: 1, -100: 0, float32(math.Inf(-1)): 0, 100: float32(math.Inf(1))} {
		if got := exp32(x); got != want {
			t.Errorf("exp32(%g) = %g, want %g", x, got, want)
		}
	}
	if got := exp32(1); math.Abs(float64(got)-math.E) > 3e-7 {
		t.Errorf("exp32(1) = %g", got)
	}
}

// expSum, with the AVX2 kernel and without, gives each e^(x-m) within 2 ulp
// and their sum as float64 adds them, for lengths around its 8 lanes.
func TestExpSum(t *testing.T) {
	modes := []bool{false}
	if hasAVX2 {
		modes = append(modes, true)
	}
	defer func(v bool) { hasAVX2 = v }(hasAVX2)
	for _, avx := range modes {
		hasAVX2 = avx
		for _, n := range []int{0, 1, 7, 8, 9, 64, 4099} {
			src := make([]float32, n)
			m := float32(3.5)
			for i := range src {
				src[i] = m - float32(i%97)*0.91 + float32(i%5)*0.013
			}
			if n > 3 {
				src[3] = m - 200 // far below: (almost) nothing
			}
			dst := make([]float32, n)
			sum := expSum(dst, src, m)
			var want float64
			for i, v := range dst {
				e := math.Exp(float64(src[i] - m))
				ulp := float64(math.Nextafter32(float32(e), 1e30) - float32(e))
				if math.Abs(float64(v)-e) > 2*ulp+1.2e-38 {
					t.Fatalf("avx2 %v, n %d: e^(%g) = %g, want %g", avx, n, src[i]-m, v, e)
				}
				want += float64(v)
			}
			if math.Abs(sum-want) > 1e-12*want {
				t.Errorf("avx2 %v, n %d: sum %.17g, the values add to %.17g", avx, n, sum, want)
			}
		}
	}
	// In place, as the loss uses it.
	z := []float32{0, -1, -2, -3, -4, -5, -6, -7, -8}
	expSum(z, z, 0)
	if math.Abs(float64(z[1])-math.Exp(-1)) > 1e-7 || z[0] != 1 {
		t.Errorf("in place: %v", z)
	}
}
