package cuda

import (
	"fmt"
	"strings"
	"sync"
)

// NVRTC is the bound runtime compiler (libnvrtc.so.13 or .12).
type NVRTC struct {
	Path         string
	Major, Minor int

	nvrtcVersion           func(major, minor *int32) int32
	nvrtcGetErrorString    func(r int32) *byte
	nvrtcCreateProgram     func(prog *uintptr, src *byte, name *byte, nh int32, headers, names uintptr) int32
	nvrtcDestroyProgram    func(prog *uintptr) int32
	nvrtcCompileProgram    func(prog uintptr, n int32, opts **byte) int32
	nvrtcGetProgramLogSize func(prog uintptr, n *uint64) int32
	nvrtcGetProgramLog     func(prog uintptr, log *byte) int32
	nvrtcGetCUBINSize      func(prog uintptr, n *uint64) int32
	nvrtcGetCUBIN          func(prog uintptr, out *byte) int32
	nvrtcGetPTXSize        func(prog uintptr, n *uint64) int32
	nvrtcGetPTX            func(prog uintptr, out *byte) int32
}

var (
	nvrtcOnce sync.Once
	nvrtcLib  *NVRTC
	nvrtcErr  error
)

// LoadNVRTC loads NVRTC once per process, preferring CUDA 13 over 12.
func LoadNVRTC() (*NVRTC, error) {
	nvrtcOnce.Do(func() { nvrtcLib, nvrtcErr = loadNVRTC(libDirs()) })
	return nvrtcLib, nvrtcErr
}

func loadNVRTC(dirs []string) (*NVRTC, error) {
	lib, path, err := openLibrary("NVRTC (libnvrtc)", []string{"libnvrtc.so.13", "libnvrtc.so.12"}, dirs)
	if err != nil {
		return nil, err
	}
	n := &NVRTC{Path: path}
	err = bind(lib, path, map[string]any{
		"nvrtcVersion":           &n.nvrtcVersion,
		"nvrtcGetErrorString":    &n.nvrtcGetErrorString,
		"nvrtcCreateProgram":     &n.nvrtcCreateProgram,
		"nvrtcDestroyProgram":    &n.nvrtcDestroyProgram,
		"nvrtcCompileProgram":    &n.nvrtcCompileProgram,
		"nvrtcGetProgramLogSize": &n.nvrtcGetProgramLogSize,
		"nvrtcGetProgramLog":     &n.nvrtcGetProgramLog,
		"nvrtcGetCUBINSize":      &n.nvrtcGetCUBINSize,
		"nvrtcGetCUBIN":          &n.nvrtcGetCUBIN,
		"nvrtcGetPTXSize":        &n.nvrtcGetPTXSize,
		"nvrtcGetPTX":            &n.nvrtcGetPTX,
	})
	if err != nil {
		return nil, err
	}
	var ma, mi int32
	if err := n.check("nvrtcVersion", n.nvrtcVersion(&ma, &mi)); err != nil {
		return nil, err
	}
	n.Major, n.Minor = int(ma), int(mi)
	return n, nil
}

func (n *NVRTC) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Name: goString(n.nvrtcGetErrorString(r))}
}

// CompileError carries the compiler's log.
type CompileError struct {
	Name, Arch, Log string
	Err             error
}

func (e *CompileError) Error() string {
	return fmt.Sprintf("compile %s for %s: %v\n%s", e.Name, e.Arch, e.Err, strings.TrimSpace(e.Log))
}

func (e *CompileError) Unwrap() error { return e.Err }

// Compile builds src for arch. A real architecture ("sm_90") yields a
// CUBIN; a virtual one ("compute_80") yields PTX that the driver compiles
// when the module loads, which is how an sm_80 build runs on a newer GPU
// (a CUBIN runs only within its major architecture).
func (n *NVRTC) Compile(name, src, arch string, extra ...string) ([]byte, error) {
	var prog uintptr
	if err := n.check("nvrtcCreateProgram", n.nvrtcCreateProgram(&prog, cString(src), cString(name), 0, 0, 0)); err != nil {
		return nil, err
	}
	defer n.nvrtcDestroyProgram(&prog)
	opts := append([]string{"--gpu-architecture=" + arch, "--std=c++17", "-default-device"}, extra...)
	copts := make([]*byte, len(opts))
	for i, o := range opts {
		copts[i] = cString(o)
	}
	r := n.nvrtcCompileProgram(prog, int32(len(copts)), &copts[0])
	runtimeKeepAlive(copts)
	if r != 0 {
		return nil, &CompileError{Name: name, Arch: arch, Log: n.log(prog), Err: n.check("nvrtcCompileProgram", r)}
	}
	sizeFn, getFn, call := n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN, "nvrtcGetCUBIN"
	if strings.HasPrefix(arch, "compute_") {
		sizeFn, getFn, call = n.nvrtcGetPTXSize, n.nvrtcGetPTX, "nvrtcGetPTX"
	}
	var size uint64
	if err := n.check(call+"Size", sizeFn(prog, &size)); err != nil {
		return nil, err
	}
	out := make([]byte, size)
	if size > 0 {
		if err := n.check(call, getFn(prog, &out[0])); err != nil {
			return nil, err
		}
	}
	if call == "nvrtcGetPTX" {
		out = []byte(strings.TrimRight(string(out), "\x00"))
	}
	return out, nil
}

func (n *NVRTC) log(prog uintptr) string {
	var size uint64
	if n.nvrtcGetProgramLogSize(prog, &size) != 0 || size == 0 {
		return ""
	}
	b := make([]byte, size)
	if n.nvrtcGetProgramLog(prog, &b[0]) != 0 {
		return ""
	}
	return strings.TrimRight(string(b), "\x00")
}
