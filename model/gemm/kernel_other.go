//go:build !amd64

package gemm

var hasAVX2 = false

func kernel(k int, a []float32, rs, ps int, b, c []float32, ldc int) {
	kernelGo(k, a, rs, ps, b, c, ldc)
}
