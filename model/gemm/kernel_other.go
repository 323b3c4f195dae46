//go:build !amd64

package gemm

var hasAVX2 = false

func kernel(k int, a, b, c []float32, ldc int) { kernelGo(k, a, b, c, ldc) }
