package kernels

import "runtime"

// thread runs closures on one locked OS thread: a CUDA context is current
// per OS thread, and Go moves goroutines between threads (a probe that did
// not pin failed its next cuMemAlloc with CUDA_ERROR_INVALID_CONTEXT).
type thread struct {
	work chan func()
	done chan struct{}
}

func newThread() *thread {
	t := &thread{work: make(chan func()), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		defer close(t.done)
		for f := range t.work {
			f()
		}
	}()
	return t
}

// do runs f on the thread and returns its error.
func (t *thread) do(f func() error) error {
	errc := make(chan error, 1)
	t.work <- func() { errc <- f() }
	return <-errc
}

// stop ends the thread after the work already sent.
func (t *thread) stop() {
	close(t.work)
	<-t.done
}
