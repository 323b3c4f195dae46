package cuda

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"unsafe"
)

// errOutOfMemory is CUDA_ERROR_OUT_OF_MEMORY, which the allocator turns
// into a message with sizes.
const errOutOfMemory = 2

// Error is a failed CUDA driver, NVRTC or cuBLASLt call.
type Error struct {
	Call string // the function, e.g. "cuMemAlloc_v2"
	Code int
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
}

func (e *Error) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
	}
	return fmt.Sprintf("%s: error %d", e.Call, e.Code)
}

// OutOfMemory reports whether the call failed for lack of device memory.
func (e *Error) OutOfMemory() bool {
	return e.Code == errOutOfMemory && strings.HasPrefix(e.Call, "cu") && !strings.HasPrefix(e.Call, "cublas")
}

// Device attributes (CUdevice_attribute) the engine reads.
const (
	AttrMultiprocessorCount          = 16
	AttrComputeCapabilityMajor       = 75
	AttrComputeCapabilityMinor       = 76
	AttrMaxSharedMemoryPerBlockOptin = 97
)

// Driver is the bound CUDA driver API (libcuda.so.1).
type Driver struct {
	Path string

	cuInit                    func(flags uint32) int32
	cuDriverGetVersion        func(v *int32) int32
	cuDeviceGetCount          func(n *int32) int32
	cuDeviceGet               func(d *int32, ordinal int32) int32
	cuDeviceGetName           func(name *byte, n int32, d int32) int32
	cuDeviceGetAttribute      func(v *int32, attr int32, d int32) int32
	cuDeviceTotalMem          func(b *uint64, d int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, d int32) int32
	cuDevicePrimaryCtxRelease func(d int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuCtxSynchronize          func() int32
	cuMemAlloc                func(p *uint64, bytes uint64) int32
	cuMemFree                 func(p uint64) int32
	cuMemGetInfo              func(free, total *uint64) int32
	cuMemcpyHtoD              func(dst uint64, src unsafe.Pointer, bytes uint64) int32
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uint64, bytes uint64) int32
	cuMemcpyDtoD              func(dst, src uint64, bytes uint64) int32
	cuMemsetD32               func(dst uint64, v uint32, n uint64) int32
	cuMemsetD32Async          func(dst uint64, v uint32, n uint64, stream uintptr) int32
	cuMemcpyHtoDAsync         func(dst uint64, src unsafe.Pointer, bytes uint64, stream uintptr) int32
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, bytes uint64, stream uintptr) int32
	cuMemAllocHost            func(p *unsafe.Pointer, bytes uint64) int32
	cuMemFreeHost             func(p unsafe.Pointer) int32
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) int32
	cuModuleUnload            func(m uintptr) int32
	cuModuleGetFunction       func(f *uintptr, m uintptr, name *byte) int32
	cuFuncGetAttribute        func(v *int32, attr int32, f uintptr) int32
	cuFuncSetAttribute        func(f uintptr, attr int32, v int32) int32
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shmem uint32, stream uintptr, params unsafe.Pointer, extra uintptr) int32
	cuStreamCreate            func(s *uintptr, flags uint32) int32
	cuStreamDestroy           func(s uintptr) int32
	cuStreamSynchronize       func(s uintptr) int32
	cuStreamWaitEvent         func(s uintptr, e uintptr, flags uint32) int32
	cuEventCreate             func(e *uintptr, flags uint32) int32
	cuEventDestroy            func(e uintptr) int32
	cuEventRecord             func(e uintptr, s uintptr) int32
	cuEventRecordWithFlags    func(e uintptr, s uintptr, flags uint32) int32
	cuEventSynchronize        func(e uintptr) int32
	cuEventElapsedTime        func(ms *float32, start, end uintptr) int32
	cuGetErrorName            func(code int32, s **byte) int32

	cuStreamBeginCapture        func(s uintptr, mode int32) int32
	cuStreamEndCapture          func(s uintptr, g *uintptr) int32
	cuGraphInstantiateWithFlags func(x *uintptr, g uintptr, flags uint64) int32
	cuGraphLaunch               func(x uintptr, s uintptr) int32
	cuGraphExecDestroy          func(x uintptr) int32
	cuGraphDestroy              func(g uintptr) int32
	cuGraphGetNodes             func(g uintptr, nodes *uintptr, n *uint64) int32

	// graphEdit: nil where the driver cannot edit a recorded graph.
	graphEdit *graphEdit
	// tensorMapEncode: nil where the driver cannot make tensor maps.
	tensorMapEncode tensorMapEncodeTiled
}

var (
	driverOnce sync.Once
	driver     *Driver
	driverErr  error
)

// LoadDriver loads libcuda.so.1 once per process and initialises it.
func LoadDriver() (*Driver, error) {
	driverOnce.Do(func() { driver, driverErr = loadDriver(libDirs()) })
	return driver, driverErr
}

func loadDriver(dirs []string) (*Driver, error) {
	lib, path, err := openLibrary("the CUDA driver (libcuda)", []string{"libcuda.so.1", "libcuda.so"}, dirs)
	if err != nil {
		return nil, err
	}
	d := &Driver{Path: path}
	err = bind(lib, path, map[string]any{
		"cuInit":                       &d.cuInit,
		"cuDriverGetVersion":           &d.cuDriverGetVersion,
		"cuDeviceGetCount":             &d.cuDeviceGetCount,
		"cuDeviceGet":                  &d.cuDeviceGet,
		"cuDeviceGetName":              &d.cuDeviceGetName,
		"cuDeviceGetAttribute":         &d.cuDeviceGetAttribute,
		"cuDeviceTotalMem_v2":          &d.cuDeviceTotalMem,
		"cuDevicePrimaryCtxRetain":     &d.cuDevicePrimaryCtxRetain,
		"cuDevicePrimaryCtxRelease_v2": &d.cuDevicePrimaryCtxRelease,
		"cuCtxSetCurrent":              &d.cuCtxSetCurrent,
		"cuCtxSynchronize":             &d.cuCtxSynchronize,
		"cuMemAlloc_v2":                &d.cuMemAlloc,
		"cuMemFree_v2":                 &d.cuMemFree,
		"cuMemGetInfo_v2":              &d.cuMemGetInfo,
		"cuMemcpyHtoD_v2":              &d.cuMemcpyHtoD,
		"cuMemcpyDtoH_v2":              &d.cuMemcpyDtoH,
		"cuMemcpyDtoD_v2":              &d.cuMemcpyDtoD,
		"cuMemsetD32_v2":               &d.cuMemsetD32,
		"cuMemsetD32Async":             &d.cuMemsetD32Async,
		"cuMemcpyHtoDAsync_v2":         &d.cuMemcpyHtoDAsync,
		"cuMemcpyDtoHAsync_v2":         &d.cuMemcpyDtoHAsync,
		"cuMemAllocHost_v2":            &d.cuMemAllocHost,
		"cuMemFreeHost":                &d.cuMemFreeHost,
		"cuModuleLoadData":             &d.cuModuleLoadData,
		"cuModuleUnload":               &d.cuModuleUnload,
		"cuModuleGetFunction":          &d.cuModuleGetFunction,
		"cuFuncGetAttribute":           &d.cuFuncGetAttribute,
		"cuFuncSetAttribute":           &d.cuFuncSetAttribute,
		"cuLaunchKernel":               &d.cuLaunchKernel,
		"cuStreamCreate":               &d.cuStreamCreate,
		"cuStreamDestroy_v2":           &d.cuStreamDestroy,
		"cuStreamSynchronize":          &d.cuStreamSynchronize,
		"cuStreamWaitEvent":            &d.cuStreamWaitEvent,
		"cuEventCreate":                &d.cuEventCreate,
		"cuEventDestroy_v2":            &d.cuEventDestroy,
		"cuEventRecord":                &d.cuEventRecord,
		"cuEventRecordWithFlags":       &d.cuEventRecordWithFlags,
		"cuEventSynchronize":           &d.cuEventSynchronize,
		"cuEventElapsedTime_v2":        &d.cuEventElapsedTime,
		"cuGetErrorName":               &d.cuGetErrorName,
		"cuStreamBeginCapture_v2":      &d.cuStreamBeginCapture,
		"cuStreamEndCapture":           &d.cuStreamEndCapture,
		"cuGraphInstantiateWithFlags":  &d.cuGraphInstantiateWithFlags,
		"cuGraphLaunch":                &d.cuGraphLaunch,
		"cuGraphExecDestroy":           &d.cuGraphExecDestroy,
		"cuGraphDestroy":               &d.cuGraphDestroy,
		"cuGraphGetNodes":              &d.cuGraphGetNodes,
	})
	if err != nil {
		return nil, err
	}
	d.graphEdit = loadGraphEdit(lib)
	d.tensorMapEncode = loadTensorMaps(lib)
	if err := d.check("cuInit", d.cuInit(0)); err != nil {
		return nil, &UnavailableError{Err: err}
	}
	return d, nil
}

// UnavailableError wraps a failure that means "no usable GPU here" (no
// device, driver too old, compute capability too low).
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string     { return e.Err.Error() }
func (e *UnavailableError) Unwrap() error     { return e.Err }
func (e *UnavailableError) Unavailable() bool { return true }
func (e *UnavailableError) BadInput() bool    { return true }

func (d *Driver) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(r)}
	var s *byte
	if d.cuGetErrorName != nil && d.cuGetErrorName(r, &s) == 0 {
		e.Name = goString(s)
	}
	return e
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for i := 0; ; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

func cString(s string) *byte {
	b := append([]byte(s), 0)
	return &b[0]
}

// Version returns the driver's CUDA version, e.g. 13000.
func (d *Driver) Version() (int, error) {
	var v int32
	err := d.check("cuDriverGetVersion", d.cuDriverGetVersion(&v))
	return int(v), err
}

// Devices is how many GPUs this process can use: 0 where the driver does
// not load or sees none.
func Devices() int {
	d, err := LoadDriver()
	if err != nil {
		return 0
	}
	n, err := d.DeviceCount()
	if err != nil {
		return 0
	}
	return n
}

// DeviceCount is the number of CUDA devices visible.
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n))
	return int(n), err
}

// GPU is one device as the driver describes it, read without a context
// (no device memory is taken).
type GPU struct {
	Ordinal int
	Name    string
	Major   int
	Minor   int
	SMs     int
	Total   uint64
}

// Device is one GPU and its primary context. Its methods must run on the
// OS thread that called MakeCurrent (see the kernels package's thread).
type Device struct {
	GPU
	D   *Driver
	dev int32
	ctx uintptr
}

// Describe reads device ordinal's name, compute capability, SM count and
// memory, without creating a context.
func (d *Driver) Describe(ordinal int) (GPU, error) {
	g, _, err := d.describe(ordinal)
	return g, err
}

func (d *Driver) describe(ordinal int) (GPU, int32, error) {
	g := GPU{Ordinal: ordinal}
	n, err := d.DeviceCount()
	if err != nil {
		return g, 0, &UnavailableError{Err: err}
	}
	if n <= ordinal {
		return g, 0, &UnavailableError{Err: fmt.Errorf("no CUDA device %d (the driver sees %d)", ordinal, n)}
	}
	var dev int32
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dev, int32(ordinal))); err != nil {
		return g, 0, err
	}
	name := make([]byte, 256)
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dev)); err != nil {
		return g, 0, err
	}
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	g.Name = string(name)
	for _, a := range []struct {
		attr int
		v    *int
	}{{AttrComputeCapabilityMajor, &g.Major}, {AttrComputeCapabilityMinor, &g.Minor}, {AttrMultiprocessorCount, &g.SMs}} {
		var v int32
		if err := d.check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(&v, int32(a.attr), dev)); err != nil {
			return g, 0, err
		}
		*a.v = int(v)
	}
	if err := d.check("cuDeviceTotalMem_v2", d.cuDeviceTotalMem(&g.Total, dev)); err != nil {
		return g, 0, err
	}
	return g, dev, nil
}

// OpenDevice retains the primary context of device ordinal and makes it
// current on the calling thread.
func (d *Driver) OpenDevice(ordinal int) (*Device, error) {
	g, dev, err := d.describe(ordinal)
	if err != nil {
		return nil, err
	}
	dv := &Device{GPU: g, D: d, dev: dev}
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&dv.ctx, dv.dev)); err != nil {
		return nil, err
	}
	if err := dv.MakeCurrent(); err != nil {
		return nil, err
	}
	return dv, nil
}

// Attribute reads one CUdevice_attribute.
func (dv *Device) Attribute(attr int) (int, error) {
	var v int32
	err := dv.D.check("cuDeviceGetAttribute", dv.D.cuDeviceGetAttribute(&v, int32(attr), dv.dev))
	return int(v), err
}

// MakeCurrent binds the device's context to the calling OS thread.
func (dv *Device) MakeCurrent() error {
	return dv.D.check("cuCtxSetCurrent", dv.D.cuCtxSetCurrent(dv.ctx))
}

// Close releases the primary context.
func (dv *Device) Close() error {
	return dv.D.check("cuDevicePrimaryCtxRelease_v2", dv.D.cuDevicePrimaryCtxRelease(dv.dev))
}

// Synchronize waits for all work on the device.
func (dv *Device) Synchronize() error {
	return dv.D.check("cuCtxSynchronize", watched("cuCtxSynchronize", dv.D.cuCtxSynchronize))
}

// MemInfo returns free and total device memory in bytes.
func (dv *Device) MemInfo() (free, total uint64, err error) {
	err = dv.D.check("cuMemGetInfo_v2", dv.D.cuMemGetInfo(&free, &total))
	return
}

// Ptr is a device address.
type Ptr uint64

// Alloc allocates bytes of device memory.
func (dv *Device) Alloc(bytes int64) (Ptr, error) {
	var p uint64
	if err := dv.D.check("cuMemAlloc_v2", dv.D.cuMemAlloc(&p, uint64(bytes))); err != nil {
		return 0, err
	}
	return Ptr(p), nil
}

// Free releases memory from Alloc.
func (dv *Device) Free(p Ptr) error { return dv.D.check("cuMemFree_v2", dv.D.cuMemFree(uint64(p))) }

// Upload copies a host slice to dst.
func Upload[T any](dv *Device, dst Ptr, src []T) error {
	if len(src) == 0 {
		return nil
	}
	n := uint64(len(src)) * uint64(unsafe.Sizeof(src[0]))
	return dv.D.check("cuMemcpyHtoD_v2", watched("cuMemcpyHtoD_v2", func() int32 { return dv.D.cuMemcpyHtoD(uint64(dst), unsafe.Pointer(&src[0]), n) }))
}

// Download copies len(dst) values from src.
func Download[T any](dv *Device, dst []T, src Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	n := uint64(len(dst)) * uint64(unsafe.Sizeof(dst[0]))
	return dv.D.check("cuMemcpyDtoH_v2", watched("cuMemcpyDtoH_v2", func() int32 { return dv.D.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), uint64(src), n) }))
}

// Copy copies bytes between device buffers.
func (dv *Device) Copy(dst, src Ptr, bytes int64) error {
	return dv.D.check("cuMemcpyDtoD_v2", dv.D.cuMemcpyDtoD(uint64(dst), uint64(src), uint64(bytes)))
}

// Memset32 fills n 32-bit words at dst with v.
func (dv *Device) Memset32(dst Ptr, v uint32, n int64) error {
	return dv.D.check("cuMemsetD32_v2", dv.D.cuMemsetD32(uint64(dst), v, uint64(n)))
}

// Memset32Async fills n 32-bit words at dst with v, in stream order.
func (dv *Device) Memset32Async(dst Ptr, v uint32, n int64, stream uintptr) error {
	return dv.D.check("cuMemsetD32Async", dv.D.cuMemsetD32Async(uint64(dst), v, uint64(n), stream))
}

// HostBuffer is page-locked host memory: a copy from it to the device is
// asynchronous, where one from Go's own (pageable) memory may wait for the
// device first.
type HostBuffer struct {
	dv *Device
	p  unsafe.Pointer
	n  int
}

// AllocHost allocates bytes of page-locked host memory.
func (dv *Device) AllocHost(bytes int) (*HostBuffer, error) {
	var p unsafe.Pointer
	if err := dv.D.check("cuMemAllocHost_v2", dv.D.cuMemAllocHost(&p, uint64(bytes))); err != nil {
		return nil, err
	}
	return &HostBuffer{dv: dv, p: p, n: bytes}, nil
}

// Bytes is the buffer as a slice; it must not be used after Free.
func (h *HostBuffer) Bytes() []byte { return unsafe.Slice((*byte)(h.p), h.n) }

// CopyToDevice copies bytes from offset off of the buffer to dst in stream
// order; the buffer's bytes must stay unchanged until the copy has run.
func (h *HostBuffer) CopyToDevice(dst Ptr, off, bytes int, stream uintptr) error {
	if off < 0 || bytes < 0 || off+bytes > h.n {
		return fmt.Errorf("copy of %d bytes at %d from a %d-byte host buffer", bytes, off, h.n)
	}
	return h.dv.D.check("cuMemcpyHtoDAsync_v2", h.dv.D.cuMemcpyHtoDAsync(uint64(dst), unsafe.Add(h.p, off), uint64(bytes), stream))
}

// CopyFromDevice copies bytes from src to offset off of the buffer in
// stream order; the buffer holds them once the stream has run the copy.
func (h *HostBuffer) CopyFromDevice(off int, src Ptr, bytes int, stream uintptr) error {
	if off < 0 || bytes < 0 || off+bytes > h.n {
		return fmt.Errorf("copy of %d bytes at %d into a %d-byte host buffer", bytes, off, h.n)
	}
	return h.dv.D.check("cuMemcpyDtoHAsync_v2", h.dv.D.cuMemcpyDtoHAsync(unsafe.Add(h.p, off), uint64(src), uint64(bytes), stream))
}

// Free releases the buffer.
func (h *HostBuffer) Free() error { return h.dv.D.check("cuMemFreeHost", h.dv.D.cuMemFreeHost(h.p)) }

// Module is a loaded CUBIN or PTX image.
type Module struct {
	dv *Device
	m  uintptr
}

// LoadModule loads a CUBIN, or PTX that the driver compiles for the device.
func (dv *Device) LoadModule(image []byte) (*Module, error) {
	img := append(append([]byte{}, image...), 0) // PTX must be NUL-terminated
	var m uintptr
	if err := dv.D.check("cuModuleLoadData", dv.D.cuModuleLoadData(&m, unsafe.Pointer(&img[0]))); err != nil {
		return nil, err
	}
	return &Module{dv: dv, m: m}, nil
}

// Unload frees the module.
func (m *Module) Unload() error { return m.dv.D.check("cuModuleUnload", m.dv.D.cuModuleUnload(m.m)) }

// Function is one kernel of a module.
type Function struct {
	dv   *Device
	f    uintptr
	Name string
}

// Function looks up an extern "C" kernel by name.
func (m *Module) Function(name string) (*Function, error) {
	var f uintptr
	if err := m.dv.D.check("cuModuleGetFunction("+name+")", m.dv.D.cuModuleGetFunction(&f, m.m, cString(name))); err != nil {
		return nil, err
	}
	return &Function{dv: m.dv, f: f, Name: name}, nil
}

// Resources is what a compiled kernel holds on an SM: registers a thread,
// static shared memory and local memory (register spills) in bytes.
type Resources struct{ Registers, SharedBytes, LocalBytes int }

// Resources reads f's compiled resources (cuFuncGetAttribute).
func (f *Function) Resources() (Resources, error) {
	var r Resources
	for _, a := range []struct {
		attr int32
		dst  *int
	}{{4, &r.Registers}, {1, &r.SharedBytes}, {3, &r.LocalBytes}} { // CU_FUNC_ATTRIBUTE_NUM_REGS, SHARED_SIZE_BYTES, LOCAL_SIZE_BYTES
		var v int32
		if err := f.dv.D.check("cuFuncGetAttribute("+f.Name+")", f.dv.D.cuFuncGetAttribute(&v, a.attr, f.f)); err != nil {
			return Resources{}, err
		}
		*a.dst = int(v)
	}
	return r, nil
}

// AllowSharedMemory lets f launch with up to bytes of dynamic shared
// memory (above the 48 KB a kernel gets without asking).
func (f *Function) AllowSharedMemory(bytes int) error {
	// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	return f.dv.D.check("cuFuncSetAttribute("+f.Name+")", f.dv.D.cuFuncSetAttribute(f.f, 8, int32(bytes)))
}

// Dim3 is a launch grid or block shape.
type Dim3 struct{ X, Y, Z int }

// kernelArgs lays out a kernel's arguments as the driver takes them (a
// launch's or a graph kernel node's): each in its own 8-byte slot of one Go
// allocation, and the table of their addresses, whose address pp is nil
// when there are none. The caller keeps vals and ptrs reachable until the
// driver has copied them.
func kernelArgs(name string, args []any) (pp unsafe.Pointer, vals []uint64, ptrs []unsafe.Pointer, err error) {
	vals = make([]uint64, len(args))
	ptrs = make([]unsafe.Pointer, len(args)+1)
	for i, a := range args {
		switch v := a.(type) {
		case Ptr:
			vals[i] = uint64(v)
		case int:
			*(*int32)(unsafe.Pointer(&vals[i])) = int32(v)
		case int32:
			*(*int32)(unsafe.Pointer(&vals[i])) = v
		case uint32:
			*(*uint32)(unsafe.Pointer(&vals[i])) = v
		case float32:
			*(*float32)(unsafe.Pointer(&vals[i])) = v
		case int64:
			*(*int64)(unsafe.Pointer(&vals[i])) = v
		case uint64:
			vals[i] = v
		case *TensorMap:
			// Passed by value: the driver copies its 128 bytes from
			// the map itself.
			ptrs[i] = v.bytes()
			continue
		default:
			return nil, nil, nil, fmt.Errorf("launch %s: argument %d has unsupported type %T", name, i, a)
		}
		ptrs[i] = unsafe.Pointer(&vals[i])
	}
	if len(args) > 0 {
		pp = unsafe.Pointer(&ptrs[0])
	}
	return pp, vals, ptrs, nil
}

// Launch runs f on stream with args passed by value: Ptr, int64 and uint64
// as 8 bytes; int (narrowed), int32, uint32 and float32 as 4, matching the
// kernels' pointer, long long, int, unsigned and float parameters; a
// *TensorMap as its 128 bytes, for a `const __grid_constant__ TmaMap`.
func (f *Function) Launch(grid, block Dim3, shmem int, stream uintptr, args ...any) error {
	pp, vals, ptrs, err := kernelArgs(f.Name, args)
	if err != nil {
		return err
	}
	if grid.Y == 0 {
		grid.Y = 1
	}
	if grid.Z == 0 {
		grid.Z = 1
	}
	if block.Y == 0 {
		block.Y = 1
	}
	if block.Z == 0 {
		block.Z = 1
	}
	r := f.dv.D.cuLaunchKernel(f.f, uint32(grid.X), uint32(grid.Y), uint32(grid.Z),
		uint32(block.X), uint32(block.Y), uint32(block.Z), uint32(shmem), stream, pp, 0)
	err = f.dv.D.check("cuLaunchKernel("+f.Name+")", r)
	runtimeKeepAlive(vals, ptrs)
	return err
}

// Event is a CUDA event for timing.
type Event struct {
	dv *Device
	e  uintptr
}

// NewEvent creates an event.
func (dv *Device) NewEvent() (*Event, error) { return dv.newEvent(0) }

// NewMarker creates an event without timing (CU_EVENT_DISABLE_TIMING), the
// cheaper kind, for waiting on stream work.
func (dv *Device) NewMarker() (*Event, error) { return dv.newEvent(2) }

func (dv *Device) newEvent(flags uint32) (*Event, error) {
	var e uintptr
	if err := dv.D.check("cuEventCreate", dv.D.cuEventCreate(&e, flags)); err != nil {
		return nil, err
	}
	return &Event{dv: dv, e: e}, nil
}

// Synchronize waits until the work before the event's last Record has run
// (at once for an event never recorded).
func (e *Event) Synchronize() error {
	return e.dv.D.check("cuEventSynchronize", watched("cuEventSynchronize", func() int32 { return e.dv.D.cuEventSynchronize(e.e) }))
}

// Record records the event on stream.
func (e *Event) Record(stream uintptr) error {
	return e.dv.D.check("cuEventRecord", e.dv.D.cuEventRecord(e.e, stream))
}

// RecordExternal records the event on stream, which a graph capture is
// recording, as an event record node of the graph
// (CU_EVENT_RECORD_EXTERNAL): each launch of the graph records it, so that
// work queued on another stream after the launch can wait for that point
// of the graph's work. The driver refuses it on a stream not capturing
// (CUDA_ERROR_ILLEGAL_STATE): use Record there.
func (e *Event) RecordExternal(stream uintptr) error {
	return e.dv.D.check("cuEventRecordWithFlags", e.dv.D.cuEventRecordWithFlags(e.e, stream, 1))
}

// Elapsed waits for end and returns the milliseconds from e to end.
func (e *Event) Elapsed(end *Event) (float32, error) {
	if err := e.dv.D.check("cuEventSynchronize", watched("cuEventSynchronize", func() int32 { return e.dv.D.cuEventSynchronize(end.e) })); err != nil {
		return 0, err
	}
	var ms float32
	err := e.dv.D.check("cuEventElapsedTime_v2", e.dv.D.cuEventElapsedTime(&ms, e.e, end.e))
	return ms, err
}

// Time returns the milliseconds the work run sends to stream takes there,
// between a record of e before it and of end after it.
func (e *Event) Time(end *Event, stream uintptr, run func() error) (float32, error) {
	if err := e.Record(stream); err != nil {
		return 0, err
	}
	if err := run(); err != nil {
		return 0, err
	}
	if err := end.Record(stream); err != nil {
		return 0, err
	}
	return e.Elapsed(end)
}

// Destroy frees the event.
func (e *Event) Destroy() error { return e.dv.D.check("cuEventDestroy_v2", e.dv.D.cuEventDestroy(e.e)) }

// Stream is a CUDA stream. NewStream makes a blocking one: it orders
// itself with the legacy default stream, so the synchronous copies
// (Upload, Download) still see every earlier launch on it finished.
type Stream struct {
	dv *Device
	s  uintptr
}

// NewStream creates a stream.
func (dv *Device) NewStream() (*Stream, error) {
	var s uintptr
	if err := dv.D.check("cuStreamCreate", dv.D.cuStreamCreate(&s, 0)); err != nil {
		return nil, err
	}
	return &Stream{dv: dv, s: s}, nil
}

// NewStreamNonBlocking creates a stream that does not order itself with
// the legacy default stream: its work neither waits for the synchronous
// copies nor makes them wait, for copies that run beside everything else.
func (dv *Device) NewStreamNonBlocking() (*Stream, error) {
	var s uintptr
	if err := dv.D.check("cuStreamCreate", dv.D.cuStreamCreate(&s, 1)); err != nil { // CU_STREAM_NON_BLOCKING
		return nil, err
	}
	return &Stream{dv: dv, s: s}, nil
}

// Handle is the raw CUstream, for Launch and cuBLASLt.
func (s *Stream) Handle() uintptr { return s.s }

// Synchronize waits for the stream's work.
func (s *Stream) Synchronize() error {
	return s.dv.D.check("cuStreamSynchronize", watched("cuStreamSynchronize", func() int32 { return s.dv.D.cuStreamSynchronize(s.s) }))
}

// Wait makes the stream's later work wait for the work before ev's last
// Record, without the host waiting; in a graph capture it joins the two
// streams' work as dependencies.
func (s *Stream) Wait(ev *Event) error {
	return s.dv.D.check("cuStreamWaitEvent", s.dv.D.cuStreamWaitEvent(s.s, ev.e, 0))
}

// Destroy frees the stream.
func (s *Stream) Destroy() error {
	return s.dv.D.check("cuStreamDestroy_v2", s.dv.D.cuStreamDestroy(s.s))
}

// Capture modes (CUstreamCaptureMode).
const captureThreadLocal = 1 // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL

// BeginCapture starts recording the stream's work into a graph instead of
// running it, until EndCapture on the same OS thread. Calls on this thread
// that could synchronise with the captured work (a synchronous copy, a
// context synchronise) fail meanwhile, and the capture with them.
func (s *Stream) BeginCapture() error {
	return s.dv.D.check("cuStreamBeginCapture_v2", s.dv.D.cuStreamBeginCapture(s.s, captureThreadLocal))
}

// EndCapture ends the capture and returns what it recorded.
func (s *Stream) EndCapture() (*Graph, error) {
	var g uintptr
	if err := s.dv.D.check("cuStreamEndCapture", s.dv.D.cuStreamEndCapture(s.s, &g)); err != nil {
		return nil, err
	}
	return &Graph{dv: s.dv, g: g}, nil
}

// Graph is a recorded sequence of device work (CUgraph).
type Graph struct {
	dv *Device
	g  uintptr
}

// Nodes is how many operations the graph holds.
func (g *Graph) Nodes() (int, error) {
	var n uint64
	err := g.dv.D.check("cuGraphGetNodes", g.dv.D.cuGraphGetNodes(g.g, nil, &n))
	return int(n), err
}

// Instantiate makes the graph launchable; the result does not depend on g,
// which may be destroyed after.
func (g *Graph) Instantiate() (*GraphExec, error) {
	var x uintptr
	if err := g.dv.D.check("cuGraphInstantiateWithFlags", g.dv.D.cuGraphInstantiateWithFlags(&x, g.g, 0)); err != nil {
		return nil, err
	}
	return &GraphExec{dv: g.dv, x: x}, nil
}

// Destroy frees the graph.
func (g *Graph) Destroy() error { return g.dv.D.check("cuGraphDestroy", g.dv.D.cuGraphDestroy(g.g)) }

// GraphExec is an instantiated graph (CUgraphExec): one launch replays all
// of its operations with the arguments they were recorded with.
type GraphExec struct {
	dv *Device
	x  uintptr
}

// Launch replays the graph on stream.
func (x *GraphExec) Launch(stream uintptr) error {
	return x.dv.D.check("cuGraphLaunch", x.dv.D.cuGraphLaunch(x.x, stream))
}

// Destroy frees the executable graph.
func (x *GraphExec) Destroy() error {
	return x.dv.D.check("cuGraphExecDestroy", x.dv.D.cuGraphExecDestroy(x.x))
}
