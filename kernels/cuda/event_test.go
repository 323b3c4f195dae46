package cuda

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// markSource writes 1 to *flag, in page-locked host memory the host reads.
const markSource = `extern "C" __global__ void mark(volatile unsigned int* flag) {
	*flag = 1;
	__threadfence_system();
}`

// Work queued on another stream after a graph's launch, waiting for an
// event the graph records (RecordExternal during its capture), waits for
// the graph's work before the record: here a kernel that spins until the
// test releases it. The kernel after the wait leaves its mark only then.
// This is what the gradients' buckets rely on: their all-reduces, queued
// after the backward's graph is launched, wait for the points in it where
// each bucket's gradients are final.
func TestWorkAfterAGraphLaunchWaitsForAnEventRecordedInIt(t *testing.T) {
	dv := device0(t)
	fs := testFunctions(t, dv, spinSource+"\n"+markSource, "spin", "mark")
	spin, mark := fs[0], fs[1]
	flags, err := dv.AllocHost(8)
	if err != nil {
		t.Fatal(err)
	}
	defer flags.Free()
	held, marked := (*uint32)(flags.p), (*uint32)(unsafe.Add(flags.p, 4))
	atomic.StoreUint32(held, 0)
	atomic.StoreUint32(marked, 0)
	a, err := dv.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy()
	b, err := dv.NewStreamNonBlocking()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy()
	ev, err := dv.NewMarker()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	one := Dim3{1, 1, 1}
	if err := a.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if err := spin.Launch(one, one, 0, a.Handle(), Ptr(uintptr(flags.p))); err != nil {
		t.Fatal(err)
	}
	if err := ev.RecordExternal(a.Handle()); err != nil {
		t.Fatal(err)
	}
	g, err := a.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	x, err := g.Instantiate()
	g.Destroy()
	if err != nil {
		t.Fatal(err)
	}
	defer x.Destroy()
	release := func() { atomic.StoreUint32(held, 1) }
	defer release()
	// A record the event already holds, done, as the buckets' events hold
	// the previous step's (or a direct run's): a wait bound to it would not
	// wait.
	if err := ev.Record(a.Handle()); err != nil {
		t.Fatal(err)
	}
	if err := a.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for launch := 1; launch <= 2; launch++ {
		atomic.StoreUint32(held, 0)
		atomic.StoreUint32(marked, 0)
		if err := x.Launch(a.Handle()); err != nil {
			t.Fatal(err)
		}
		if err := b.Wait(ev); err != nil {
			t.Fatal(err)
		}
		if err := mark.Launch(one, one, 0, b.Handle(), Ptr(uintptr(flags.p)+4)); err != nil {
			t.Fatal(err)
		}
		// While the graph's kernel spins, the mark must not be written;
		// a wait that missed this launch's record would let it run at
		// once.
		for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if atomic.LoadUint32(marked) != 0 {
				t.Fatalf("launch %d: the work waiting for the graph's event ran while the graph's work before the event had not", launch)
			}
		}
		release()
		if err := b.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := a.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if atomic.LoadUint32(marked) != 1 {
			t.Fatalf("launch %d: the work waiting for the graph's event did not run once the graph's work had", launch)
		}
	}
}
