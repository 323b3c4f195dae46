package cuda

import (
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
	cuModuleLoadData          func(m *uintptr, image unsafe.Pointer) int32
	cuModuleUnload            func(m uintptr) int32
	cuModuleGetFunction       func(f *uintptr, m uintptr, name *byte) int32
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shmem uint32, stream uintptr, params unsafe.Pointer, extra uintptr) int32
	cuStreamCreate            func(s *uintptr, flags uint32) int32
	cuStreamDestroy           func(s uintptr) int32
	cuStreamSynchronize       func(s uintptr) int32
	cuEventCreate             func(e *uintptr, flags uint32) int32
	cuEventDestroy            func(e uintptr) int32
	cuEventRecord             func(e uintptr, s uintptr) int32
	cuEventSynchronize        func(e uintptr) int32
	cuEventElapsedTime        func(ms *float32, start, end uintptr) int32
	cuGetErrorName            func(code int32, s **byte) int32
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
		"cuModuleLoadData":             &d.cuModuleLoadData,
		"cuModuleUnload":               &d.cuModuleUnload,
		"cuModuleGetFunction":          &d.cuModuleGetFunction,
		"cuLaunchKernel":               &d.cuLaunchKernel,
		"cuStreamCreate":               &d.cuStreamCreate,
		"cuStreamDestroy_v2":           &d.cuStreamDestroy,
		"cuStreamSynchronize":          &d.cuStreamSynchronize,
		"cuEventCreate":                &d.cuEventCreate,
		"cuEventDestroy_v2":            &d.cuEventDestroy,
		"cuEventRecord":                &d.cuEventRecord,
		"cuEventSynchronize":           &d.cuEventSynchronize,
		"cuEventElapsedTime_v2":        &d.cuEventElapsedTime,
		"cuGetErrorName":               &d.cuGetErrorName,
	})
	if err != nil {
		return nil, err
	}
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

// DeviceCount is the number of CUDA devices visible.
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n))
	return int(n), err
}

// Device is one GPU and its primary context. Its methods must run on the
// OS thread that called MakeCurrent (see the kernels package's thread).
type Device struct {
	D       *Driver
	Ordinal int
	dev     int32
	ctx     uintptr
	Name    string
	Major   int
	Minor   int
	SMs     int
	Total   uint64
}

// OpenDevice retains the primary context of device ordinal and makes it
// current on the calling thread.
func (d *Driver) OpenDevice(ordinal int) (*Device, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return nil, &UnavailableError{Err: err}
	}
	if n <= ordinal {
		return nil, &UnavailableError{Err: fmt.Errorf("no CUDA device %d (the driver sees %d)", ordinal, n)}
	}
	dv := &Device{D: d, Ordinal: ordinal}
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&dv.dev, int32(ordinal))); err != nil {
		return nil, err
	}
	name := make([]byte, 256)
	if err := d.check("cuDeviceGetName", d.cuDeviceGetName(&name[0], int32(len(name)), dv.dev)); err != nil {
		return nil, err
	}
	for i, c := range name {
		if c == 0 {
			name = name[:i]
			break
		}
	}
	dv.Name = string(name)
	if dv.Major, err = dv.Attribute(AttrComputeCapabilityMajor); err != nil {
		return nil, err
	}
	if dv.Minor, err = dv.Attribute(AttrComputeCapabilityMinor); err != nil {
		return nil, err
	}
	if dv.SMs, err = dv.Attribute(AttrMultiprocessorCount); err != nil {
		return nil, err
	}
	if err := d.check("cuDeviceTotalMem_v2", d.cuDeviceTotalMem(&dv.Total, dv.dev)); err != nil {
		return nil, err
	}
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
func (dv *Device) Synchronize() error { return dv.D.check("cuCtxSynchronize", dv.D.cuCtxSynchronize()) }

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
	return dv.D.check("cuMemcpyHtoD_v2", dv.D.cuMemcpyHtoD(uint64(dst), unsafe.Pointer(&src[0]), n))
}

// Download copies len(dst) values from src.
func Download[T any](dv *Device, dst []T, src Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	n := uint64(len(dst)) * uint64(unsafe.Sizeof(dst[0]))
	return dv.D.check("cuMemcpyDtoH_v2", dv.D.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), uint64(src), n))
}

// Copy copies bytes between device buffers.
func (dv *Device) Copy(dst, src Ptr, bytes int64) error {
	return dv.D.check("cuMemcpyDtoD_v2", dv.D.cuMemcpyDtoD(uint64(dst), uint64(src), uint64(bytes)))
}

// Memset32 fills n 32-bit words at dst with v.
func (dv *Device) Memset32(dst Ptr, v uint32, n int64) error {
	return dv.D.check("cuMemsetD32_v2", dv.D.cuMemsetD32(uint64(dst), v, uint64(n)))
}

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

// Dim3 is a launch grid or block shape.
type Dim3 struct{ X, Y, Z int }

// Launch runs f on stream with args passed by value: Ptr, int64 and uint64
// as 8 bytes; int (narrowed), int32, uint32 and float32 as 4, matching the
// kernels' pointer, long long, int, unsigned and float parameters.
func (f *Function) Launch(grid, block Dim3, shmem int, stream uintptr, args ...any) error {
	// Each argument lives in its own 8-byte slot of one Go allocation that
	// stays reachable until the launch returns; the driver copies the values
	// during cuLaunchKernel.
	vals := make([]uint64, len(args))
	ptrs := make([]unsafe.Pointer, len(args)+1)
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
		default:
			return fmt.Errorf("launch %s: argument %d has unsupported type %T", f.Name, i, a)
		}
		ptrs[i] = unsafe.Pointer(&vals[i])
	}
	var pp unsafe.Pointer
	if len(args) > 0 {
		pp = unsafe.Pointer(&ptrs[0])
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
	err := f.dv.D.check("cuLaunchKernel("+f.Name+")", r)
	runtimeKeepAlive(vals, ptrs)
	return err
}

// Event is a CUDA event for timing.
type Event struct {
	dv *Device
	e  uintptr
}

// NewEvent creates an event.
func (dv *Device) NewEvent() (*Event, error) {
	var e uintptr
	if err := dv.D.check("cuEventCreate", dv.D.cuEventCreate(&e, 0)); err != nil {
		return nil, err
	}
	return &Event{dv: dv, e: e}, nil
}

// Record records the event on stream.
func (e *Event) Record(stream uintptr) error {
	return e.dv.D.check("cuEventRecord", e.dv.D.cuEventRecord(e.e, stream))
}

// Elapsed waits for end and returns the milliseconds from e to end.
func (e *Event) Elapsed(end *Event) (float32, error) {
	if err := e.dv.D.check("cuEventSynchronize", e.dv.D.cuEventSynchronize(end.e)); err != nil {
		return 0, err
	}
	var ms float32
	err := e.dv.D.check("cuEventElapsedTime_v2", e.dv.D.cuEventElapsedTime(&ms, e.e, end.e))
	return ms, err
}

// Destroy frees the event.
func (e *Event) Destroy() error { return e.dv.D.check("cuEventDestroy_v2", e.dv.D.cuEventDestroy(e.e)) }

// Stream is a CUDA stream; the engine uses the legacy default stream (0)
// today, and streams let later work overlap copies and kernels.
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

// Handle is the raw CUstream, for Launch and cuBLASLt.
func (s *Stream) Handle() uintptr { return s.s }

// Synchronize waits for the stream's work.
func (s *Stream) Synchronize() error {
	return s.dv.D.check("cuStreamSynchronize", s.dv.D.cuStreamSynchronize(s.s))
}

// Destroy frees the stream.
func (s *Stream) Destroy() error {
	return s.dv.D.check("cuStreamDestroy_v2", s.dv.D.cuStreamDestroy(s.s))
}
