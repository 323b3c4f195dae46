package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// NCCLLibraryEnv names the libnccl.so.2 to load, bypassing the search: for
// an install in a place the search does not know.
const NCCLLibraryEnv = "KILN_NCCL_LIBRARY"

// ncclNVLSEnv is NCCL's switch for NVLink SHARP (NVLS), the collectives
// that run on NVSwitch multicast objects. kiln keeps it off in every
// process that loads NCCL: a multicast object spans GPUs, and on a shared
// GPU host one left behind by a killed process can take GPUs out of
// service for every user of the host until an administrator resets them.
// The data-parallel all-reduce of a few GPUs gains little from it. kiln
// never creates a multicast object itself either (no cuMulticastCreate).
const ncclNVLSEnv = "NCCL_NVLS_ENABLE"

// ncclRuntimeConnectEnv is NCCL's switch for connecting the ranks at
// their first collective instead of when the communicator is made (the
// default since NCCL 2.22). That first collective then waits on the host
// for every rank to call it, inside ncclAllReduce, where a rank that
// failed before its call leaves the others waiting with no device wait
// for the hang watch to time and no abort able to reach them (an abort
// must not free a communicator under a call). kiln connects the ranks
// when the group is made, in the one ncclCommInitAll that either joins
// them all or fails.
const ncclRuntimeConnectEnv = "NCCL_RUNTIME_CONNECT"

// ncclSettings sets NCCL_NVLS_ENABLE=0 and NCCL_RUNTIME_CONNECT=0 in the
// process environment, over any value the user set. NCCL reads its
// settings with getenv, some only once, so this runs before the library
// is loaded; os.Setenv reaches the C environment that getenv reads
// (through cgo, or purego's stand-in for it when built without cgo).
func ncclSettings() error {
	for _, name := range []string{ncclNVLSEnv, ncclRuntimeConnectEnv} {
		if err := os.Setenv(name, "0"); err != nil {
			return fmt.Errorf("set %s=0 before loading NCCL: %w", name, err)
		}
	}
	return nil
}

// NCCL is the bound NCCL library (libnccl.so.2).
type NCCL struct {
	Path    string
	Version NCCLVersion

	ncclGetVersion        func(v *int32) int32
	ncclGetErrorString    func(r int32) *byte
	ncclGetUniqueId       func(id *ncclUniqueID) int32
	ncclCommInitRank      func(comm *uintptr, nranks int32, id ncclUniqueID, rank int32) int32
	ncclCommInitAll       func(comms *uintptr, ndev int32, devlist *int32) int32
	ncclCommDestroy       func(comm uintptr) int32
	ncclCommAbort         func(comm uintptr) int32
	ncclCommGetAsyncError func(comm uintptr, r *int32) int32
	ncclCommCount         func(comm uintptr, n *int32) int32
	ncclCommUserRank      func(comm uintptr, rank *int32) int32
	ncclAllReduce         func(send, recv uint64, count uint64, dtype, op int32, comm uintptr, stream uintptr) int32
	ncclGroupStart        func() int32
	ncclGroupEnd          func() int32
}

// NCCL's enums (nccl.h): ncclFloat32 of ncclDataType_t, ncclSum of
// ncclRedOp_t.
const (
	ncclFloat32 = 7
	ncclSum     = 0
)

// NCCLVersion is NCCL's version, e.g. 2.21.5.
type NCCLVersion struct{ Major, Minor, Patch int }

func (v NCCLVersion) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// decodeNCCLVersion reads ncclGetVersion's code: X*1000+Y*100+Z up to 2.8,
// X*10000+Y*100+Z after (NCCL_VERSION in nccl.h).
func decodeNCCLVersion(code int) NCCLVersion {
	if code < 10000 {
		return NCCLVersion{Major: code / 1000, Minor: code % 1000 / 100, Patch: code % 100}
	}
	return NCCLVersion{Major: code / 10000, Minor: code % 10000 / 100, Patch: code % 100}
}

// NCCLLoadError says that NCCL could not be loaded, where it was looked
// for, and what to install.
type NCCLLoadError struct{ Load *LoadError }

func (e *NCCLLoadError) Error() string {
	return fmt.Sprintf("cannot load NCCL (tried %s; last error: %s): training on several GPUs needs NCCL 2: install the libnccl2 package from NVIDIA's CUDA repository or the nvidia-nccl-cu12 (or -cu13) Python package PyTorch uses, or set %s to the path of libnccl.so.2",
		strings.Join(e.Load.Tried, ", "), e.Load.Last, NCCLLibraryEnv)
}

func (e *NCCLLoadError) Unwrap() error { return e.Load }

// Unavailable marks NCCL as missing on this machine.
func (e *NCCLLoadError) Unavailable() bool { return true }

// BadInput makes a run that asks for several GPUs on a machine without
// NCCL exit with code 2: the user must install it or train on one GPU.
func (e *NCCLLoadError) BadInput() bool { return true }

var (
	ncclOnce sync.Once
	ncclLib  *NCCL
	ncclErr  error
)

// LoadNCCL loads NCCL once per process, after turning NVLink multicast
// off in the environment. KILN_NCCL_LIBRARY, when set, is the only file
// tried; otherwise the loader's own search, the CUDA places and the
// Python environments' nvidia/nccl/lib (where PyTorch's wheels put it).
func LoadNCCL() (*NCCL, error) {
	ncclOnce.Do(func() { ncclLib, ncclErr = loadNCCL(ncclSearch()) })
	return ncclLib, ncclErr
}

// ncclSearch is what LoadNCCL tries: the file KILN_NCCL_LIBRARY names, or
// NCCL's sonames in the loader's search and then ncclDirs.
func ncclSearch() (sonames, dirs []string) {
	if p := os.Getenv(NCCLLibraryEnv); p != "" {
		return []string{p}, nil
	}
	return []string{"libnccl.so.2", "libnccl.so"}, ncclDirs()
}

// ncclDirs is libDirs followed by the nvidia/nccl/lib of the Python
// environments in use or in the usual places.
func ncclDirs() []string {
	dirs := libDirs()
	var roots []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if p := os.Getenv(env); p != "" {
			roots = append(roots, p)
		}
	}
	if h, err := os.UserHomeDir(); err == nil {
		roots = append(roots, filepath.Join(h, ".local"))
	}
	roots = append(roots, "/usr/local", "/usr", "/opt/conda")
	for _, r := range roots {
		for _, pat := range []string{"lib/python3*/site-packages/nvidia/nccl/lib", "lib/python3*/dist-packages/nvidia/nccl/lib"} {
			m, _ := filepath.Glob(filepath.Join(r, pat))
			dirs = append(dirs, m...)
		}
	}
	return append(dirs, "/usr/lib/python3/dist-packages/nvidia/nccl/lib")
}

func loadNCCL(sonames, dirs []string) (*NCCL, error) {
	if err := ncclSettings(); err != nil {
		return nil, err
	}
	lib, path, err := openLibrary("NCCL (libnccl)", sonames, dirs)
	if err != nil {
		var le *LoadError
		if errors.As(err, &le) {
			return nil, &NCCLLoadError{Load: le}
		}
		return nil, err
	}
	n := &NCCL{Path: path}
	err = bind(lib, path, map[string]any{
		"ncclGetVersion":        &n.ncclGetVersion,
		"ncclGetErrorString":    &n.ncclGetErrorString,
		"ncclGetUniqueId":       &n.ncclGetUniqueId,
		"ncclCommInitRank":      &n.ncclCommInitRank,
		"ncclCommInitAll":       &n.ncclCommInitAll,
		"ncclCommDestroy":       &n.ncclCommDestroy,
		"ncclCommAbort":         &n.ncclCommAbort,
		"ncclCommGetAsyncError": &n.ncclCommGetAsyncError,
		"ncclCommCount":         &n.ncclCommCount,
		"ncclCommUserRank":      &n.ncclCommUserRank,
		"ncclAllReduce":         &n.ncclAllReduce,
		"ncclGroupStart":        &n.ncclGroupStart,
		"ncclGroupEnd":          &n.ncclGroupEnd,
	})
	if err != nil {
		return nil, err
	}
	var v int32
	if err := n.check("ncclGetVersion", n.ncclGetVersion(&v)); err != nil {
		return nil, err
	}
	n.Version = decodeNCCLVersion(int(v))
	return n, nil
}

func (n *NCCL) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: goString(n.ncclGetErrorString(r))}
}

// UniqueID is the bootstrap address every rank of a communicator is
// given: rank 0 makes it, the others receive its bytes.
type UniqueID [128]byte

// ncclUniqueID is ncclUniqueId as the C functions take it: a 128-byte
// struct, passed by value to ncclCommInitRank.
type ncclUniqueID struct{ Internal [128]byte }

// UniqueID makes a new bootstrap id. It opens a listening socket in this
// process, which the other ranks connect to.
func (n *NCCL) UniqueID() (UniqueID, error) {
	var id ncclUniqueID
	err := n.check("ncclGetUniqueId", n.ncclGetUniqueId(&id))
	return UniqueID(id.Internal), err
}

// Comm is one rank's NCCL communicator. Its collectives run on the device
// it was made for, whose context must be current on the calling thread.
type Comm struct {
	n           *NCCL
	c           uintptr
	Rank, Ranks int
}

// InitRank joins the communicator of ranks ranks named by id as rank. The
// calling thread must have rank's device current (Device.MakeCurrent). It
// returns once every rank has joined, so each rank calls it from its own
// thread, or all of them between GroupStart and GroupEnd.
func (n *NCCL) InitRank(ranks int, id UniqueID, rank int) (*Comm, error) {
	if ranks < 1 || rank < 0 || rank >= ranks {
		return nil, fmt.Errorf("ncclCommInitRank: rank %d of %d: the rank must lie in [0, %d)", rank, ranks, ranks)
	}
	var c uintptr
	if err := n.check(fmt.Sprintf("ncclCommInitRank(rank %d of %d)", rank, ranks), n.ncclCommInitRank(&c, int32(ranks), ncclUniqueID{Internal: id}, int32(rank))); err != nil {
		return nil, err
	}
	return &Comm{n: n, c: c, Rank: rank, Ranks: ranks}, nil
}

// InitAll makes the communicators of one process driving devices, rank i
// on device ordinal devices[i].
func (n *NCCL) InitAll(devices []int) ([]*Comm, error) {
	if len(devices) == 0 {
		return nil, errors.New("ncclCommInitAll: no device given")
	}
	list := make([]int32, len(devices))
	for i, d := range devices {
		list[i] = int32(d)
	}
	cs := make([]uintptr, len(devices))
	if err := n.check(fmt.Sprintf("ncclCommInitAll(devices %v)", devices), n.ncclCommInitAll(&cs[0], int32(len(devices)), &list[0])); err != nil {
		return nil, err
	}
	out := make([]*Comm, len(cs))
	for i, c := range cs {
		out[i] = &Comm{n: n, c: c, Rank: i, Ranks: len(cs)}
	}
	return out, nil
}

// GroupStart begins a group of NCCL calls that one thread makes for
// several ranks (a communicator per device, or InitRank for several);
// GroupEnd issues them together, so that none waits for a call not yet
// made.
func (n *NCCL) GroupStart() error { return n.check("ncclGroupStart", n.ncclGroupStart()) }

// GroupEnd ends the group GroupStart began.
func (n *NCCL) GroupEnd() error { return n.check("ncclGroupEnd", n.ncclGroupEnd()) }

func (c *Comm) call(name string) string {
	return fmt.Sprintf("%s(rank %d of %d)", name, c.Rank, c.Ranks)
}

// Count is the number of ranks as NCCL has it.
func (c *Comm) Count() (int, error) {
	var v int32
	err := c.n.check(c.call("ncclCommCount"), c.n.ncclCommCount(c.c, &v))
	return int(v), err
}

// UserRank is this communicator's rank as NCCL has it.
func (c *Comm) UserRank() (int, error) {
	var v int32
	err := c.n.check(c.call("ncclCommUserRank"), c.n.ncclCommUserRank(c.c, &v))
	return int(v), err
}

// AllReduceSum sums count float32 values of send over the ranks into recv
// of every rank, in stream order; send and recv may be the same buffer.
// Every rank must make the same calls in the same order.
func (c *Comm) AllReduceSum(send, recv Ptr, count int, stream uintptr) error {
	if count < 0 {
		return fmt.Errorf("%s: count %d", c.call("ncclAllReduce"), count)
	}
	// Queued, not waited for; but the first calls connect the ranks and
	// may wait for the peers, so it is watched as a wait.
	return c.n.check(c.call("ncclAllReduce"), watched("ncclAllReduce", func() int32 {
		return c.n.ncclAllReduce(uint64(send), uint64(recv), uint64(count), ncclFloat32, ncclSum, c.c, stream)
	}))
}

// AsyncError reports an error NCCL met in work already issued (a peer
// gone, a network failure); nil while there is none.
func (c *Comm) AsyncError() error {
	var r int32
	if err := c.n.check(c.call("ncclCommGetAsyncError"), c.n.ncclCommGetAsyncError(c.c, &r)); err != nil {
		return err
	}
	return c.n.check(c.call("ncclCommGetAsyncError"), r)
}

// Destroy frees the communicator once its issued work has run.
func (c *Comm) Destroy() error { return c.n.check(c.call("ncclCommDestroy"), c.n.ncclCommDestroy(c.c)) }

// Abort frees the communicator at once, ending any of its work still on
// the device: how a rank leaves a step that a failed peer will never end.
func (c *Comm) Abort() error { return c.n.check(c.call("ncclCommAbort"), c.n.ncclCommAbort(c.c)) }
