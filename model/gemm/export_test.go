package gemm

import "runtime"

func threadsForBench() int { return runtime.GOMAXPROCS(0) }

func setAVX2(on bool) { hasAVX2 = on }
