package kernels

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/kiln-lm/kiln/kernels/cuda"
)

// allocator hands out device memory and tracks the bytes kiln holds for
// tensors and workspaces, and their peak: the figure comparable to
// torch.cuda.max_memory_allocated.
type allocator struct {
	dv        *cuda.Device
	live      map[cuda.Ptr]Allocation
	cur, peak int64
}

// Allocation is device memory held under one name: one buffer, or (from
// Engine.Allocations) every buffer of that name.
type Allocation struct {
	What  string
	Bytes int64
	Count int
}

func newAllocator(dv *cuda.Device) *allocator {
	return &allocator{dv: dv, live: map[cuda.Ptr]Allocation{}}
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
	a.live[p] = Allocation{What: what, Bytes: n, Count: 1}
	a.cur += n
	if a.cur > a.peak {
		a.peak = a.cur
	}
	return p, nil
}

// allocSet allocates a set of buffers and keeps the first error, so that a
// caller allocating many checks once, after the set.
type allocSet struct {
	mem *allocator
	err error
}

// one allocates bytes for what, or nothing after an earlier failure.
func (s *allocSet) one(what string, bytes int64) cuda.Ptr {
	if s.err != nil {
		return 0
	}
	var p cuda.Ptr
	p, s.err = s.mem.alloc(what, bytes)
	return p
}

// layers allocates n buffers of bytes each, one a layer.
func (s *allocSet) layers(what string, n int, bytes int64) []cuda.Ptr {
	ps := make([]cuda.Ptr, n)
	for l := range ps {
		ps[l] = s.one(what, bytes)
	}
	return ps
}

func (a *allocator) free(p cuda.Ptr) error {
	l, ok := a.live[p]
	if !ok {
		return nil
	}
	delete(a.live, p)
	a.cur -= l.Bytes
	return a.dv.Free(p)
}

// list returns every live buffer, largest first.
func (a *allocator) list() []Allocation {
	out := make([]Allocation, 0, len(a.live))
	for _, l := range a.live {
		out = append(out, l)
	}
	sortAllocations(out)
	return out
}

// byName sums the live buffers by name, largest total first: what a report
// of the engine's memory shows.
func (a *allocator) byName() []Allocation {
	sums := map[string]Allocation{}
	for _, l := range a.live {
		s := sums[l.What]
		s.What, s.Bytes, s.Count = l.What, s.Bytes+l.Bytes, s.Count+1
		sums[l.What] = s
	}
	out := make([]Allocation, 0, len(sums))
	for _, s := range sums {
		out = append(out, s)
	}
	sortAllocations(out)
	return out
}

func sortAllocations(as []Allocation) {
	slices.SortFunc(as, func(x, y Allocation) int {
		return cmp.Or(cmp.Compare(y.Bytes, x.Bytes), cmp.Compare(x.What, y.What))
	})
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

// Allocations lists the device memory the engine holds, summed by name,
// largest first: where Memory's total goes (the LM head's chunk buffers
// appear as "logits (chunk of C rows)").
func (e *Engine) Allocations() []Allocation {
	var out []Allocation
	if e.th == nil {
		return out
	}
	_ = e.th.do(func() error {
		out = e.mem.byName()
		return nil
	})
	return out
}
