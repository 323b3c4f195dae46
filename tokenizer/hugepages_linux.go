//go:build linux && !race

package tokenizer

import (
	"runtime"
	"syscall"
	"unsafe"
)

// mapsTables: large shared tables are mapped outside the Go heap.
const mapsTables = true

// sharedSlots returns n empty slots for s. A table of hugeTableMin bytes or
// more is mapped outside the Go heap, aligned to a huge page and marked for
// transparent huge pages (MADV_HUGEPAGE: the kernel's default "madvise"
// mode gives them only to memory that asks), and unmapped once s is
// unreachable. Sixteen workers look up words at random in the 24 MiB
// table: on 4 KiB pages every lookup that missed a worker's hot slots also
// missed the TLB (6,144 pages), and a virtual machine walks two page tables
// for it; on 2 MiB pages the table is 12 of them. On the 16-vCPU host,
// 1 GB on 16 cores ran 4-5% faster on the mean of four alternations, with
// a third less system time (docs/benchmarks/tokenizer.md). Where the
// mapping is refused the table is an ordinary slice. Not under the race
// detector: it does not see atomics on memory outside the heap, so it
// would miss the order that the slots' k1 publish and report the ids
// behind them as racing.
func sharedSlots(s *sharedWords, n int) []sharedSlot {
	size := n * int(unsafe.Sizeof(sharedSlot{}))
	if size < hugeTableMin {
		return make([]sharedSlot, n)
	}
	m, err := syscall.Mmap(-1, 0, size+hugePage, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return make([]sharedSlot, n)
	}
	off := -int(uintptr(unsafe.Pointer(unsafe.SliceData(m)))) & (hugePage - 1)
	table := m[off : off+size]
	// Advice only: without it (transparent huge pages off) the table
	// still works, on small pages.
	_ = syscall.Madvise(table, syscall.MADV_HUGEPAGE)
	base := uintptr(unsafe.Pointer(unsafe.SliceData(table)))
	mappedTables.Store(base, true)
	// The workers' word tables that read s hold it, so it outlives
	// every lookup in it.
	runtime.AddCleanup(s, func(m []byte) {
		_ = syscall.Munmap(m)
		mappedTables.Delete(base)
	}, m)
	// The slots hold no pointers, so memory the collector does not scan
	// may hold them.
	return unsafe.Slice((*sharedSlot)(unsafe.Pointer(unsafe.SliceData(table))), n)
}
