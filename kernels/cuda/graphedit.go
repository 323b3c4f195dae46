package cuda

import (
	"errors"
	"unsafe"

	"github.com/ebitengine/purego"
)

// graphEdit is the driver's graph editing, bound apart from the rest: its
// calls with edge data (the _v2 forms) came with CUDA 12.3, and a driver
// without them still runs kiln, with its graphs as recorded.
type graphEdit struct {
	nodeGetType         func(n uintptr, t *int32) int32
	memsetNodeGetParams func(n uintptr, p *memsetParams) int32
	nodeGetDependencies func(n uintptr, deps *uintptr, edges unsafe.Pointer, count *uint64) int32
	nodeGetDependents   func(n uintptr, deps *uintptr, edges unsafe.Pointer, count *uint64) int32
	addKernelNode       func(n *uintptr, g uintptr, deps *uintptr, count uint64, p *kernelNodeParams) int32
	addDependencies     func(g uintptr, from, to *uintptr, edges unsafe.Pointer, count uint64) int32
	destroyNode         func(n uintptr) int32
}

// loadGraphEdit binds the graph editing calls, or returns nil when the
// driver lacks one.
func loadGraphEdit(lib uintptr) *graphEdit {
	g := &graphEdit{}
	for sym, fptr := range map[string]any{
		"cuGraphNodeGetType":              &g.nodeGetType,
		"cuGraphMemsetNodeGetParams":      &g.memsetNodeGetParams,
		"cuGraphNodeGetDependencies_v2":   &g.nodeGetDependencies,
		"cuGraphNodeGetDependentNodes_v2": &g.nodeGetDependents,
		"cuGraphAddKernelNode_v2":         &g.addKernelNode,
		"cuGraphAddDependencies_v2":       &g.addDependencies,
		"cuGraphDestroyNode":              &g.destroyNode,
	} {
		addr, err := purego.Dlsym(lib, sym)
		if err != nil {
			return nil
		}
		purego.RegisterFunc(fptr, addr)
	}
	return g
}

// Graph node types (CUgraphNodeType).
const graphNodeMemset = 2 // CU_GRAPH_NODE_TYPE_MEMSET

// memsetParams is CUDA_MEMSET_NODE_PARAMS.
type memsetParams struct {
	dst         uint64
	pitch       uint64
	value       uint32
	elementSize uint32
	width       uint64
	height      uint64
}

// kernelNodeParams is CUDA_KERNEL_NODE_PARAMS_v2 (kern and ctx left zero:
// the node runs fn in the graph's context).
type kernelNodeParams struct {
	fn                     uintptr
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	shared                 uint32
	_                      uint32
	params                 unsafe.Pointer
	extra                  unsafe.Pointer
	kern                   uintptr
	ctx                    uintptr
}

// ErrNoGraphEdit says the driver cannot edit a recorded graph (older than
// CUDA 12.3): the graph runs as it was recorded.
var ErrNoGraphEdit = errors.New("the CUDA driver cannot edit graphs (CUDA 12.3 or newer can)")

// MemsetsToKernels replaces each memset node of the graph that fills one
// row of at most maxBytes, in whole 32-bit words, with a node running fill
// (a kernel fill(unsigned* p, unsigned v, long long n)) that writes the
// same words, after the same nodes and before the same nodes. It returns
// how many it replaced. cuBLASLt clears a 4-byte counter of its workspace
// before each product that uses one; recorded into a graph, the memset and
// its hand-overs put about 10 us between the kernel before it and the
// product, a fill kernel node about 2 (docs/benchmarks/cuda.md).
func (g *Graph) MemsetsToKernels(fill *Function, maxBytes int64) (int, error) {
	d := g.dv.D
	ge := d.graphEdit
	if ge == nil {
		return 0, ErrNoGraphEdit
	}
	nodes, err := d.handles("cuGraphGetNodes", func(out *uintptr, n *uint64) int32 { return d.cuGraphGetNodes(g.g, out, n) })
	if err != nil {
		return 0, err
	}
	replaced := 0
	for _, node := range nodes {
		var t int32
		if err := d.check("cuGraphNodeGetType", ge.nodeGetType(node, &t)); err != nil {
			return replaced, err
		}
		if t != graphNodeMemset {
			continue
		}
		var p memsetParams
		if err := d.check("cuGraphMemsetNodeGetParams", ge.memsetNodeGetParams(node, &p)); err != nil {
			return replaced, err
		}
		bytes := uint64(p.elementSize) * p.width
		if p.height != 1 || bytes == 0 || bytes%4 != 0 || p.dst%4 != 0 || bytes > uint64(maxBytes) {
			continue
		}
		word := p.value
		switch p.elementSize {
		case 1:
			word &= 0xff
			word |= word<<8 | word<<16 | word<<24
		case 2:
			word &= 0xffff
			word |= word << 16
		case 4:
		default:
			continue
		}
		// A recorded graph's edges are the default kind: listed without
		// their data (the driver refuses the query if one is not).
		deps, err := d.handles("cuGraphNodeGetDependencies_v2", func(out *uintptr, n *uint64) int32 { return ge.nodeGetDependencies(node, out, nil, n) })
		if err != nil {
			return replaced, err
		}
		outs, err := d.handles("cuGraphNodeGetDependentNodes_v2", func(out *uintptr, n *uint64) int32 { return ge.nodeGetDependents(node, out, nil, n) })
		if err != nil {
			return replaced, err
		}
		words := int64(bytes / 4)
		pp, vals, ptrs, err := kernelArgs(fill.Name, []any{Ptr(p.dst), word, words})
		if err != nil {
			return replaced, err
		}
		kp := &kernelNodeParams{fn: fill.f, gridX: uint32((words + 255) / 256), gridY: 1, gridZ: 1,
			blockX: 256, blockY: 1, blockZ: 1, params: pp}
		var k uintptr
		var dp *uintptr
		if len(deps) > 0 {
			dp = &deps[0]
		}
		r := ge.addKernelNode(&k, g.g, dp, uint64(len(deps)), kp)
		runtimeKeepAlive(vals, ptrs, kp)
		if err := d.check("cuGraphAddKernelNode_v2", r); err != nil {
			return replaced, err
		}
		if len(outs) > 0 {
			from := make([]uintptr, len(outs))
			for i := range from {
				from[i] = k
			}
			if err := d.check("cuGraphAddDependencies_v2", ge.addDependencies(g.g, &from[0], &outs[0], nil, uint64(len(outs)))); err != nil {
				return replaced, err
			}
		}
		if err := d.check("cuGraphDestroyNode", ge.destroyNode(node)); err != nil {
			return replaced, err
		}
		replaced++
	}
	return replaced, nil
}

// handles lists what get returns (graph nodes), asking first how many
// there are.
func (d *Driver) handles(call string, get func(out *uintptr, n *uint64) int32) ([]uintptr, error) {
	var n uint64
	if err := d.check(call, get(nil, &n)); err != nil || n == 0 {
		return nil, err
	}
	out := make([]uintptr, n)
	if err := d.check(call, get(&out[0], &n)); err != nil {
		return nil, err
	}
	return out[:n], nil
}
