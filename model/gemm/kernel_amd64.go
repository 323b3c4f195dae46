package gemm

import "golang.org/x/sys/cpu"

// hasAVX2 selects the assembly micro-kernel: AVX2 and FMA, which every x86
// CPU since 2013-2015 has.
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func kernelAVX2(k int, a *float32, rs, ps int, b, c *float32, ldc int)

func kernel(k int, a []float32, rs, ps int, b, c []float32, ldc int) {
	if hasAVX2 && k > 0 {
		// The bounds the assembly reads and writes, checked here.
		_ = a[(mr-1)*rs+(k-1)*ps]
		_ = b[k*nr-1]
		_ = c[(mr-1)*ldc+nr-1]
		kernelAVX2(k, &a[0], rs, ps, &b[0], &c[0], ldc)
		return
	}
	kernelGo(k, a, rs, ps, b, c, ldc)
}
