package gemm

import "golang.org/x/sys/cpu"

// hasAVX2 selects the assembly micro-kernel: AVX2 and FMA, which every x86
// CPU since 2013-2015 has.
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func kernelAVX2(k int, a, b, c *float32, ldc int)

func kernel(k int, a, b, c []float32, ldc int) {
	if hasAVX2 {
		// The bounds the assembly reads and writes, checked here.
		_ = a[k*mr-1]
		_ = b[k*nr-1]
		_ = c[(mr-1)*ldc+nr-1]
		kernelAVX2(k, &a[0], &b[0], &c[0], ldc)
		return
	}
	kernelGo(k, a, b, c, ldc)
}
