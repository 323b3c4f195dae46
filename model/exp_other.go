//go:build !amd64

package model

var hasAVX2 = false

func expSumAVX2(dst, src *float32, n int, m float32) float64 {
	panic("expSumAVX2: no AVX2 on this architecture")
}
