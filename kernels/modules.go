// Package kernels is kiln's CUDA engine: the model's forward and backward
// passes, AdamW and generation on an NVIDIA GPU (compute capability 8.0 and
// up), driven from Go through the purego bindings in kernels/cuda. The
// kernels are the .cu files beside this one, one per op, compiled at run
// time by NVRTC and cached on disk. It registers itself as engine "cuda".
package kernels

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kiln-lm/kiln/kernels/cuda"
)

//go:embed *.cu *.cuh
var sources embed.FS

// hopperSuffix marks a kernel file written for Hopper alone (wgmma): it is
// built as sm_90a, and only for a compute capability 9.0 device that runs
// its native build (Target "sm_90").
const hopperSuffix = "_sm90.cu"

// fileArch is what NVRTC builds kernel file name as for target arch, or ""
// when the file is not built: a Hopper file only for "sm_90", and only when
// hopper says the engine may run its kernels.
func fileArch(name, arch string, hopper bool) string {
	if !strings.HasSuffix(name, hopperSuffix) {
		return arch
	}
	if arch == "sm_90" && hopper {
		return "sm_90a"
	}
	return ""
}

// hopperAdvice is what a Hopper file that fails to build or load adds to
// its error: the setting that runs without it.
const hopperAdvice = "the Hopper attention kernels; KILN_CUDA_ATTENTION=flash-sm80 runs flash.cu's instead"

// kernelFiles lists the embedded .cu files in a fixed order.
func kernelFiles() ([]string, error) {
	ents, err := sources.ReadDir(".")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cu") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// source returns a kernel file with the common prelude in front, and for
// the flash attention files (flash*.cu) the helpers they share.
func source(name string) (string, error) {
	preludes := []string{"common.cuh"}
	if strings.HasPrefix(name, "flash") {
		preludes = append(preludes, "flash.cuh")
	}
	var b strings.Builder
	for _, p := range append(preludes, name) {
		text, err := sources.ReadFile(p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "#line 1 \"%s\"\n%s\n", p, text)
	}
	return b.String(), nil
}

// Target picks what NVRTC builds for a device of compute capability
// major.minor: a CUBIN for the device itself, or with forceSM80 PTX for
// compute_80, which the driver compiles for the device at load time. That is
// the code an sm_80/sm_86 card (the RTX 3060) runs: a CUBIN for sm_80 would
// not load on sm_90, since CUBINs are compatible only within a major version.
func Target(major, minor int, forceSM80 bool) string {
	if forceSM80 {
		return "compute_80"
	}
	return fmt.Sprintf("sm_%d%d", major, minor)
}

// CacheDir is where compiled kernels are kept: dir (KILN_KERNEL_CACHE,
// read by ParseOptions) when set, else the user cache directory's
// kiln/kernels.
func CacheDir(dir string) string {
	if dir != "" {
		return dir
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "kiln-kernels")
	}
	return filepath.Join(d, "kiln", "kernels")
}

// cacheKey names a compiled image by what determines its bytes: the source,
// the target architecture and the compiler's version.
func cacheKey(name, src, arch string, nvrtcMajor, nvrtcMinor int) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00nvrtc %d.%d\x00", src, arch, nvrtcMajor, nvrtcMinor)
	ext := ".cubin"
	if strings.HasPrefix(arch, "compute_") {
		ext = ".ptx"
	}
	return strings.TrimSuffix(name, ".cu") + "-" + arch + "-" + hex.EncodeToString(h.Sum(nil))[:16] + ext
}

// compileCached returns the image for one kernel file, from the cache when
// present. A cache that cannot be written costs a compile, not a failure.
func compileCached(nv *cuda.NVRTC, dir, name, arch string) (img []byte, hit bool, err error) {
	src, err := source(name)
	if err != nil {
		return nil, false, err
	}
	path := filepath.Join(dir, cacheKey(name, src, arch, nv.Major, nv.Minor))
	if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
		return b, true, nil
	}
	img, err = nv.Compile(name, src, arch)
	if err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(dir, 0o755); err == nil {
		tmp, err := os.CreateTemp(dir, ".tmp-*")
		if err == nil {
			_, werr := tmp.Write(img)
			cerr := tmp.Close()
			if werr == nil && cerr == nil {
				_ = os.Rename(tmp.Name(), path)
			} else {
				_ = os.Remove(tmp.Name())
			}
		}
	}
	return img, false, nil
}

// loadModules compiles (or reads from the cache) and loads every kernel file,
// and returns the kernels by name with their parameter lists, which every
// launch is checked against (checkArgs).
func loadModules(dv *cuda.Device, nv *cuda.NVRTC, arch, cacheDir string, hopper bool) (map[string]*cuda.Function, map[string][]paramKind, []*cuda.Module, int, error) {
	names, err := kernelFiles()
	if err != nil {
		return nil, nil, nil, 0, err
	}
	dir := CacheDir(cacheDir)
	fns, params := map[string]*cuda.Function{}, map[string][]paramKind{}
	var mods []*cuda.Module
	hits := 0
	for _, name := range names {
		arch := fileArch(name, arch, hopper)
		if arch == "" {
			continue
		}
		advise := func(err error) error {
			if strings.HasSuffix(name, hopperSuffix) {
				return fmt.Errorf("%w (%s)", err, hopperAdvice)
			}
			return err
		}
		src, _ := sources.ReadFile(name)
		sigs, err := kernelSignatures(string(src))
		if err != nil {
			return nil, nil, nil, 0, fmt.Errorf("%s: %w", name, err)
		}
		img, hit, err := compileCached(nv, dir, name, arch)
		if err != nil {
			return nil, nil, nil, 0, advise(err)
		}
		if hit {
			hits++
		}
		m, err := dv.LoadModule(img)
		if err != nil {
			return nil, nil, nil, 0, advise(fmt.Errorf("load %s (%s): %w", name, arch, err))
		}
		mods = append(mods, m)
		for _, k := range sigs {
			f, err := m.Function(k.name)
			if err != nil {
				return nil, nil, nil, 0, err
			}
			fns[k.name], params[k.name] = f, k.params
		}
	}
	return fns, params, mods, hits, nil
}

// paramKind is how a kernel parameter is passed: what cuda.Function.Launch
// writes for each Go type.
type paramKind int

const (
	paramPtr paramKind = iota // any pointer: cuda.Ptr
	paramI32                  // int, unsigned: int, int32, uint32
	paramI64                  // long long, size_t: int64, uint64
	paramF32                  // float: float32
	paramTMA                  // const __grid_constant__ TmaMap: *cuda.TensorMap
)

func (k paramKind) String() string {
	return [...]string{"a pointer (cuda.Ptr)", "a 32-bit integer (int, int32, uint32)", "a 64-bit integer (int64, uint64)", "a float (float32)",
		"a tensor map (*cuda.TensorMap)"}[k]
}

// kindOf is the parameter kind a Go argument is passed as, or false for a
// type Launch does not take.
func kindOf(a any) (paramKind, bool) {
	switch a.(type) {
	case cuda.Ptr:
		return paramPtr, true
	case int, int32, uint32:
		return paramI32, true
	case int64, uint64:
		return paramI64, true
	case float32:
		return paramF32, true
	case *cuda.TensorMap:
		return paramTMA, true
	}
	return 0, false
}

// checkArgs refuses a launch whose arguments do not match the kernel's
// parameters in number and kind: a wrong one is not an error the driver
// can see, it is a kernel reading garbage.
func checkArgs(name string, want []paramKind, args []any) error {
	if len(args) != len(want) {
		return fmt.Errorf("launch %s: %d arguments for its %d parameters", name, len(args), len(want))
	}
	for i, a := range args {
		k, ok := kindOf(a)
		if !ok || k != want[i] {
			return fmt.Errorf("launch %s: argument %d is %T, the kernel takes %s", name, i, a, want[i])
		}
	}
	return nil
}

// kernelSig is one extern "C" __global__ function: its name and the kinds
// of its parameters.
type kernelSig struct {
	name   string
	params []paramKind
}

// kernelSignatures finds the extern "C" __global__ functions in a source
// file, with or without a __launch_bounds__(...) before the name, and
// reads their parameter lists; a parameter type it does not know is an
// error, so that no kernel escapes the launch check.
func kernelSignatures(src string) ([]kernelSig, error) {
	var out []kernelSig
	const marker, bounds = `extern "C" __global__ void `, "__launch_bounds__("
	for {
		i := strings.Index(src, marker)
		if i < 0 {
			return out, nil
		}
		src = strings.TrimSpace(src[i+len(marker):])
		if strings.HasPrefix(src, bounds) {
			j := strings.IndexByte(src, ')')
			if j < 0 {
				return out, fmt.Errorf("unterminated __launch_bounds__")
			}
			src = strings.TrimSpace(src[j+1:])
		}
		j := strings.IndexByte(src, '(')
		k := strings.IndexByte(src, ')')
		if j < 0 || k < j {
			return out, fmt.Errorf("kernel without a parameter list near %.40q", src)
		}
		sig := kernelSig{name: strings.TrimSpace(src[:j])}
		if list := strings.TrimSpace(src[j+1 : k]); list != "" && list != "void" {
			for _, p := range strings.Split(list, ",") {
				kind, err := paramKindOf(p)
				if err != nil {
					return out, fmt.Errorf("kernel %s: %w", sig.name, err)
				}
				sig.params = append(sig.params, kind)
			}
		}
		out = append(out, sig)
		src = src[k+1:]
	}
}

// paramKindOf reads one C parameter declaration ("const float* __restrict__
// x", "long long n").
func paramKindOf(decl string) (paramKind, error) {
	decl = strings.TrimSpace(decl)
	if strings.Contains(decl, "*") {
		return paramPtr, nil
	}
	f := strings.Fields(decl)
	if len(f) < 2 {
		return 0, fmt.Errorf("parameter %q has no name", decl)
	}
	var words []string
	for _, w := range f[:len(f)-1] {
		if w != "const" && w != "__restrict__" && w != "__grid_constant__" {
			words = append(words, w)
		}
	}
	switch strings.Join(words, " ") {
	case "int", "unsigned", "unsigned int", "int32_t", "uint32_t":
		return paramI32, nil
	case "long long", "unsigned long long", "size_t", "int64_t", "uint64_t", "long long int":
		return paramI64, nil
	case "float":
		return paramF32, nil
	case "TmaMap":
		return paramTMA, nil
	}
	return 0, fmt.Errorf("parameter %q: a type the launch check does not know", decl)
}
