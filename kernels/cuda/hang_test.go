package cuda

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// spinSource is a kernel that waits until the host sets *flag: a hang
// for as long as the test wants.
const spinSource = `extern "C" __global__ void spin(volatile unsigned int* flag) {
	while (*flag == 0) { __nanosleep(1000); }
}`

// Spin is a GPU stream held by a kernel that waits for Release.
type Spin struct {
	Stream *Stream
	flag   *HostBuffer
}

// startSpin launches the waiting kernel on a new stream of device 0,
// skipping where there is no GPU or no NVRTC.
func startSpin(t *testing.T) *Spin {
	t.Helper()
	dv := device0(t)
	f := testFunctions(t, dv, spinSource, "spin")[0]
	flag, err := dv.AllocHost(4)
	if err != nil {
		t.Fatal(err)
	}
	st, err := dv.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	s := &Spin{Stream: st, flag: flag}
	// Page-locked host memory is the device's to read at the same address.
	if err := f.Launch(Dim3{1, 1, 1}, Dim3{1, 1, 1}, 0, st.Handle(), Ptr(uintptr(flag.p))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Release()
		st.Synchronize()
		st.Destroy()
		flag.Free()
	})
	return s
}

// testFunctions compiles src with NVRTC (compute_80), loads it on dv and
// returns its functions of names, skipping where there is no NVRTC. The
// module is unloaded once the test and its cleanups registered after this
// call are done.
func testFunctions(t *testing.T, dv *Device, src string, names ...string) []*Function {
	t.Helper()
	nv, err := LoadNVRTC()
	if err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	ptx, err := nv.Compile("test.cu", src, "compute_80")
	if err != nil {
		t.Fatal(err)
	}
	m, err := dv.LoadModule(ptx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unload() })
	fs := make([]*Function, len(names))
	for i, name := range names {
		if fs[i], err = m.Function(name); err != nil {
			t.Fatal(err)
		}
	}
	return fs
}

// Release lets the kernel end.
func (s *Spin) Release() { atomic.StoreUint32((*uint32)(s.flag.p), 1) }

// A wait for the GPU that lasts the hang timeout aborts the registered
// communicators; one that still lasts half as long again is a hang, said
// once, with the call that waits.
func TestAHangingWaitAbortsTheCommunicatorsAndIsSaid(t *testing.T) {
	spin := startSpin(t)
	hung := make(chan Hang, 4)
	defer SetHangTimeout(HangTimeout())
	SetHangTimeout(400 * time.Millisecond)
	defer SetHangHandler(func(h Hang) { hung <- h })()
	aborted := make(chan struct{})
	var once atomic.Bool
	defer OnHang(func() {
		if once.CompareAndSwap(false, true) {
			close(aborted)
		}
	})()
	returned := make(chan error, 1)
	began := time.Now()
	go func() {
		runtime.LockOSThread()
		returned <- spin.Stream.Synchronize()
	}()
	<-aborted
	h := <-hung
	select {
	case err := <-returned:
		t.Fatalf("the wait returned (%v) before it was said to hang", err)
	default:
	}
	if h.Call != "cuStreamSynchronize" || h.Waited < 600*time.Millisecond || time.Since(began) < h.Waited {
		t.Errorf("hang %+v after %s; want cuStreamSynchronize after at least 600ms", h, time.Since(began))
	}
	if s := h.String(); !strings.HasPrefix(s, "CUDA: cuStreamSynchronize has waited") || !strings.Contains(s, "KILN_CUDA_HANG_TIMEOUT") {
		t.Errorf("the hang says %q", s)
	}
	spin.Release()
	if err := <-returned; err != nil {
		t.Fatalf("the wait, released: %v", err)
	}
	if len(hung) != 0 {
		t.Errorf("the hang was said %d more times", len(hung))
	}
}

// By default a hang ends the process with status 3, its reason on
// standard error where the worker reads a dead task's last words.
func TestAHangEndsTheProcess(t *testing.T) {
	if os.Getenv("KILN_TEST_HANG_CHILD") == "1" {
		SetHangTimeout(500 * time.Millisecond)
		spin := startSpin(t)
		spin.Stream.Synchronize()
		t.Fatal("the hung wait returned")
	}
	if _, err := LoadDriver(); err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if Devices() == 0 {
		t.Skip("no CUDA device")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAHangEndsTheProcess$")
	cmd.Env = append(os.Environ(), "KILN_TEST_HANG_CHILD=1")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 3 || !strings.Contains(string(out), "CUDA: cuStreamSynchronize has waited") ||
		!strings.Contains(string(out), "KILN_CUDA_HANG_TIMEOUT 500ms") {
		t.Fatalf("the process: %v\n%s\nwant exit status 3 and the hang said", err, out)
	}
}

// The watch times any wait, whatever it waits for: here one for a
// channel. The aborts run once, and the hang is said only after they had
// a tick to end the wait; a wait that an abort ends is no hang. On any
// machine.
func TestTheHangWatchAbortsThenSaysTheHang(t *testing.T) {
	defer SetHangTimeout(HangTimeout())
	SetHangTimeout(200 * time.Millisecond)
	hung := make(chan Hang, 4)
	defer SetHangHandler(func(h Hang) { hung <- h })()
	var aborts atomic.Int32
	abortedAt := make(chan time.Time, 4)
	defer OnHang(func() { aborts.Add(1); abortedAt <- time.Now() })()

	if r := watched("quick", func() int32 { return 7 }); r != 7 {
		t.Fatalf("a watched call returned %d, want its 7", r)
	}
	release := make(chan struct{})
	done := make(chan int32, 1)
	began := time.Now()
	go func() { done <- watched("cuTestWait", func() int32 { <-release; return 0 }) }()
	at := <-abortedAt
	h := <-hung
	said := time.Now()
	close(release)
	if r := <-done; r != 0 {
		t.Fatalf("the released wait returned %d", r)
	}
	if h.Call != "cuTestWait" || h.Waited < 300*time.Millisecond || at.Sub(began) < 200*time.Millisecond {
		t.Errorf("hang %+v said %s after the start, aborted %s after it; want the abort after 200ms and the hang after 300ms",
			h, said.Sub(began), at.Sub(began))
	}
	if n := aborts.Load(); n != 1 || len(hung) != 0 {
		t.Errorf("%d aborts and %d more hangs for one wait, want 1 and 0", n, len(hung))
	}
	// A wait an abort ends is no hang (a second's timeout: the abort's
	// goroutine has half a second to run).
	SetHangTimeout(time.Second)
	release = make(chan struct{})
	stop := OnHang(func() { close(release) })
	defer stop()
	if r := watched("cuTestCollective", func() int32 { <-release; return 0 }); r != 0 {
		t.Fatalf("the aborted wait returned %d", r)
	}
	if len(hung) != 0 {
		t.Errorf("a wait that the abort ended was said to hang: %+v", <-hung)
	}
}
