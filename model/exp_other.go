//go:build !amd64

package model

var hasAVX2 = false

// expSum sets dst[i] = e^(src[i]-m), for src[i] <= m (a max-subtracted
// softmax), and returns their sum in float64. dst may be src.
func expSum(dst, src []float32, m float32) float64 {
	dst = dst[:len(src)]
	var sum float64
	for i, v := range src {
		e := exp32(v - m)
		dst[i] = e
		sum += float64(e)
	}
	return sum
}
