package model

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func expSumAVX2(dst, src *float32, n int, m float32) float64

// expSum sets dst[i] = e^(src[i]-m), for src[i] <= m (a max-subtracted
// softmax), and returns their sum in float64. dst may be src.
func expSum(dst, src []float32, m float32) float64 {
	dst = dst[:len(src)]
	var sum float64
	n := 0
	if hasAVX2 && len(src) >= 8 {
		n = len(src) &^ 7
		sum = expSumAVX2(&dst[0], &src[0], n, m)
	}
	for i := n; i < len(src); i++ {
		e := exp32(src[i] - m)
		dst[i] = e
		sum += float64(e)
	}
	return sum
}
