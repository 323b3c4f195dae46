package kernels

import (
	"errors"
	"fmt"

	"github.com/kiln-lm/kiln/kernels/cuda"
)

// allocator hands out device memory and tracks the bytes kiln holds for
// tensors and workspaces, and their peak: the figure comparable to
// torch.cuda.max_memory_allocated.
type allocator struct {
	dv        *cuda.Device
	live      map[cuda.Ptr]int64
	cur, peak int64
}

func newAllocator(dv *cuda.Device) *allocator {
	return &allocator{dv: dv, live: map[cuda.Ptr]int64{}}
}

// OOMError says how much was asked, how much was free and what to change.
type OOMError struct {
	What        string
	Asked, Free int64
	Held        int64
}

func (e *OOMError) Error() string {
	return fmt.Sprintf("out of GPU memory allocating %s: asked for %d bytes (%.2f GiB) with %d bytes (%.2f GiB) free and %.2f GiB already held by kiln: lower --batch (and raise gradient accumulation to keep the batch) or lower --seq",
		e.What, e.Asked, gib(e.Asked), e.Free, gib(e.Free), gib(e.Held))
}

// BadInput: the run's size is the user's to change.
func (e *OOMError) BadInput() bool { return true }

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// alloc allocates n bytes for what (a name used in the out-of-memory error).
func (a *allocator) alloc(what string, n int64) (cuda.Ptr, error) {
	if n <= 0 {
		n = 4
	}
	n = (n + 255) &^ 255
	p, err := a.dv.Alloc(n)
	if err != nil {
		var ce *cuda.Error
		if errors.As(err, &ce) && ce.OutOfMemory() {
			free, _, _ := a.dv.MemInfo()
			return 0, &OOMError{What: what, Asked: n, Free: int64(free), Held: a.cur}
		}
		return 0, fmt.Errorf("allocate %s (%d bytes): %w", what, n, err)
	}
	a.live[p] = n
	a.cur += n
	if a.cur > a.peak {
		a.peak = a.cur
	}
	return p, nil
}

func (a *allocator) free(p cuda.Ptr) error {
	n, ok := a.live[p]
	if !ok {
		return nil
	}
	delete(a.live, p)
	a.cur -= n
	return a.dv.Free(p)
}

func (a *allocator) freeAll() error {
	var first error
	for p := range a.live {
		if err := a.free(p); err != nil && first == nil {
			first = err
		}
	}
	return first
}
