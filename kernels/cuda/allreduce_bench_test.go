package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

// lockedThread runs functions on one goroutine locked to its OS thread,
// where a device's context stays current between calls.
type lockedThread chan func()

func newLockedThread() lockedThread {
	t := make(lockedThread)
	go func() {
		runtime.LockOSThread()
		for f := range t {
			f()
		}
	}()
	return t
}

func (t lockedThread) do(f func() error) error {
	done := make(chan error, 1)
	t <- func() { done <- f() }
	return <-done
}

// allReduceRank is one GPU of the benchmark: its thread, device, buffer
// and stream.
type allReduceRank struct {
	th  lockedThread
	dv  *Device
	buf Ptr
	s   *Stream
	c   *Comm
}

// BenchmarkAllReduce measures NCCL's in-place fp32 sum over every GPU the
// driver sees, one thread and stream a GPU as kernels.Group drives them,
// for buffers of 1 MiB to 256 MiB by x4: the bus bandwidth (2 (N - 1) / N x
// bytes / time, as nccl-tests reckon it) that small buckets reach decides
// the bucket size of a reduction overlapped with the backward, and the
// large ones' decides whether one pays at all (docs/decisions/multi-gpu.md).
// On one GPU the figure is a call's bytes over its time, the one-rank
// reduction's cost, which a one-GPU group pays each step.
//
//	cd kernels/cuda && go test -run '^$' -bench AllReduce -benchtime 20x
func BenchmarkAllReduce(b *testing.B) {
	d, err := LoadDriver()
	if err != nil {
		b.Skipf("no CUDA driver: %v", err)
	}
	nc, err := LoadNCCL()
	if err != nil {
		b.Skipf("no NCCL: %v", err)
	}
	gpus, err := d.DeviceCount()
	if err != nil || gpus == 0 {
		b.Skipf("no GPU: %v", err)
	}
	const most = 256 << 20
	ranks := make([]*allReduceRank, gpus)
	devices := make([]int, gpus)
	for r := range ranks {
		devices[r] = r
		k := &allReduceRank{th: newLockedThread()}
		ranks[r] = k
		b.Cleanup(func() {
			_ = k.th.do(func() error {
				if k.s != nil {
					_ = k.s.Destroy()
				}
				if k.buf != 0 {
					_ = k.dv.Free(k.buf)
				}
				if k.dv != nil {
					_ = k.dv.Close()
				}
				return nil
			})
			close(k.th)
		})
		if err := k.th.do(func() error {
			var err error
			if k.dv, err = d.OpenDevice(r); err != nil {
				return err
			}
			if k.buf, err = k.dv.Alloc(most); err != nil {
				return err
			}
			if err := k.dv.Memset32(k.buf, 0, most/4); err != nil { // zeros: the sums stay finite
				return err
			}
			k.s, err = k.dv.NewStream()
			return err
		}); err != nil {
			b.Fatalf("GPU %d: %v", r, err)
		}
	}
	init := newLockedThread()
	comms, err := func() ([]*Comm, error) {
		defer close(init)
		var cs []*Comm
		err := init.do(func() (err error) { cs, err = nc.InitAll(devices); return err })
		return cs, err
	}()
	if err != nil {
		b.Fatal(err)
	}
	for r, c := range comms {
		ranks[r].c = c
	}
	// The communicators go before the buffers and contexts (cleanups run
	// last first); NCCL frees them all at the last one's destroy.
	b.Cleanup(func() {
		for _, k := range ranks {
			_ = k.th.do(k.c.Destroy)
		}
	})
	// every runs count floats through calls all-reduces on every GPU at
	// once and waits for them.
	every := func(count, calls int) error {
		errs := make([]error, gpus)
		var wg sync.WaitGroup
		for r, k := range ranks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = k.th.do(func() error {
					for range calls {
						if err := k.c.AllReduceSum(k.buf, k.buf, count, k.s.Handle()); err != nil {
							return err
						}
					}
					if err := k.s.Synchronize(); err != nil {
						return err
					}
					return k.c.AsyncError()
				})
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				return fmt.Errorf("GPU %d: %w", r, err)
			}
		}
		return nil
	}
	b.Logf("NCCL %s, %d GPU(s)", nc.Version, gpus)
	for bytes := 1 << 20; bytes <= most; bytes *= 4 {
		b.Run(fmt.Sprintf("gpus=%d/MiB=%d", gpus, bytes>>20), func(b *testing.B) {
			count := bytes / 4
			if err := every(count, 2); err != nil { // connections made, kernels loaded
				b.Fatal(err)
			}
			b.ResetTimer()
			start := time.Now()
			if err := every(count, b.N); err != nil {
				b.Fatal(err)
			}
			took := time.Since(start).Seconds() / float64(b.N)
			b.StopTimer()
			moved := float64(bytes)
			if gpus > 1 {
				moved *= 2 * float64(gpus-1) / float64(gpus)
			}
			b.ReportMetric(moved/took/1e9, "busGB/s")
			b.ReportMetric(took*1e3, "ms/call")
			b.SetBytes(int64(bytes))
		})
	}
}
