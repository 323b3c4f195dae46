package cuda

import "runtime"

func runtimeKeepAlive(xs ...any) {
	for _, x := range xs {
		runtime.KeepAlive(x)
	}
}
