package cuda

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// A wait for the GPU that never ends (a kernel that hangs, a GPU fallen off
// the bus, an NCCL collective whose peer will never join) would hold a
// training task for as long as its timeout, days, with no error anywhere.
// Every blocking wait for the device (the synchronizations and the
// synchronous copies) is watched: when one has lasted HangTimeout, the
// communicators registered with OnHang are aborted (each in a goroutine of
// its own, since an abort may wait for the hung GPU too), which ends the
// waits for a collective; a wait that still has not ended HangTimeout/2
// later (at most a minute) is a GPU that will not come back in this
// process, and the hang handler runs: by default it says so on standard
// error and exits the process with status 3, so that the task runs again,
// in a new process, from its last checkpoint.

// DefaultHangTimeout is HangTimeout's default: far above any wait of a
// training step, a checkpoint's copy or an evaluation.
const DefaultHangTimeout = 10 * time.Minute

// Hang is a wait for the device that did not end.
type Hang struct {
	// Call is the driver call that waits, Waited how long it had.
	Call   string
	Waited time.Duration
}

func (h Hang) String() string {
	return fmt.Sprintf("CUDA: %s has waited %s for the GPU (KILN_CUDA_HANG_TIMEOUT %s): the GPU does not finish its work, "+
		"so this process stops; a worker's task starts again in a new one from its last checkpoint ('sched train': run it again with --resume)",
		h.Call, h.Waited.Round(time.Millisecond), hangs.timeout())
}

type hangWatch struct {
	mu      sync.Mutex
	limit   time.Duration // < 0: off
	waits   map[uint64]*wait
	next    uint64
	aborts  map[uint64]func()
	running bool
	handler func(Hang)
}

type wait struct {
	call          string
	began         time.Time
	aborted, hung bool
}

var hangs = &hangWatch{limit: DefaultHangTimeout, waits: map[uint64]*wait{}, aborts: map[uint64]func(){}}

// timeout is the wait that counts as a hang (< 0: none does).
func (h *hangWatch) timeout() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.limit
}

// HangTimeout is how long a wait for the device may last before it counts
// as a hang; negative when none does.
func HangTimeout() time.Duration { return hangs.timeout() }

// SetHangTimeout sets how long a wait for the device may last before it
// counts as a hang (KILN_CUDA_HANG_TIMEOUT); d <= 0 turns the watch off.
func SetHangTimeout(d time.Duration) {
	if d <= 0 {
		d = -1
	}
	hangs.mu.Lock()
	hangs.limit = d
	hangs.mu.Unlock()
}

// SetHangHandler makes handler, instead of the exit, what a hang runs; it
// returns a function that restores the one before. For tests.
func SetHangHandler(handler func(Hang)) (restore func()) {
	h := hangs
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.handler
	h.handler = handler
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.handler = old
	}
}

// OnHang registers abort, which ends the collectives of communicators
// that a hang may hold; it runs once a wait has lasted the hang timeout.
// The returned function unregisters it.
func OnHang(abort func()) (unregister func()) {
	h := hangs
	h.mu.Lock()
	defer h.mu.Unlock()
	id := h.next
	h.next++
	h.aborts[id] = abort
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.aborts, id)
	}
}

// watched runs a driver call that waits for the device, watched.
func watched(call string, f func() int32) int32 {
	h := hangs
	h.mu.Lock()
	if h.limit < 0 {
		h.mu.Unlock()
		return f()
	}
	id := h.next
	h.next++
	h.waits[id] = &wait{call: call, began: time.Now()}
	if !h.running {
		h.running = true
		go h.watch()
	}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.waits, id)
		h.mu.Unlock()
	}()
	return f()
}

// watch looks at the waits under way until there are none.
func (h *hangWatch) watch() {
	for {
		h.mu.Lock()
		limit := h.limit
		if len(h.waits) == 0 || limit < 0 {
			h.running = false
			h.mu.Unlock()
			return
		}
		tick := min(max(limit/20, 10*time.Millisecond), time.Second)
		var abort []func()
		var hung *Hang
		for _, w := range h.waits {
			waited := time.Since(w.began)
			switch {
			case waited >= limit && !w.aborted:
				// The aborts get a tick to end the wait before it is a
				// hang, however late the watch looked.
				w.aborted = true
				for _, a := range h.aborts {
					abort = append(abort, a)
				}
			case w.aborted && !w.hung && waited >= limit+min(limit/2, time.Minute):
				// Said once.
				w.hung = true
				hung = &Hang{Call: w.call, Waited: waited}
			}
		}
		handler := h.handler
		h.mu.Unlock()
		// Not waited for: an abort may itself wait for the hung GPU (NCCL
		// frees device memory), and the watch must go on to end the
		// process then.
		for _, a := range abort {
			go a()
		}
		if hung != nil {
			if handler == nil {
				fmt.Fprintln(os.Stderr, hung.String())
				os.Exit(3)
			}
			handler(*hung)
		}
		time.Sleep(tick)
	}
}
