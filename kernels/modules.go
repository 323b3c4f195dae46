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

//go:embed *.cu common.cuh
var sources embed.FS

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

// source returns a kernel file with the common prelude in front.
func source(name string) (string, error) {
	common, err := sources.ReadFile("common.cuh")
	if err != nil {
		return "", err
	}
	body, err := sources.ReadFile(name)
	if err != nil {
		return "", err
	}
	return string(common) + "\n#line 1 \"" + name + "\"\n" + string(body), nil
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
// and returns the kernels by name.
func loadModules(dv *cuda.Device, nv *cuda.NVRTC, arch, cacheDir string) (map[string]*cuda.Function, []*cuda.Module, int, error) {
	names, err := kernelFiles()
	if err != nil {
		return nil, nil, 0, err
	}
	dir := CacheDir(cacheDir)
	fns := map[string]*cuda.Function{}
	var mods []*cuda.Module
	hits := 0
	for _, name := range names {
		img, hit, err := compileCached(nv, dir, name, arch)
		if err != nil {
			return nil, nil, 0, err
		}
		if hit {
			hits++
		}
		m, err := dv.LoadModule(img)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("load %s (%s): %w", name, arch, err)
		}
		mods = append(mods, m)
		src, _ := sources.ReadFile(name)
		for _, k := range kernelNames(string(src)) {
			f, err := m.Function(k)
			if err != nil {
				return nil, nil, 0, err
			}
			fns[k] = f
		}
	}
	return fns, mods, hits, nil
}

// kernelNames finds the extern "C" __global__ functions in a source file,
// with or without a __launch_bounds__(...) before the name.
func kernelNames(src string) []string {
	var out []string
	const marker, bounds = `extern "C" __global__ void `, "__launch_bounds__("
	for {
		i := strings.Index(src, marker)
		if i < 0 {
			return out
		}
		src = strings.TrimSpace(src[i+len(marker):])
		if strings.HasPrefix(src, bounds) {
			j := strings.IndexByte(src, ')')
			if j < 0 {
				return out
			}
			src = src[j+1:]
		}
		j := strings.IndexByte(src, '(')
		if j < 0 {
			return out
		}
		out = append(out, strings.TrimSpace(src[:j]))
	}
}
