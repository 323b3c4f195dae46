// Package cuda binds the CUDA driver API, NVRTC and cuBLASLt at run time
// through purego, so that kiln builds with CGO_ENABLED=0 on any machine and
// the same binary runs on a GPU host. Nothing here calls exit: every failing
// call becomes an error that names it.
package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ebitengine/purego"
)

// LoadError says that a library could not be loaded and lists every path
// tried, so that a user can see which install is missing.
type LoadError struct {
	Library string
	Tried   []string
	Last    string // the dynamic loader's last message
}

func (e *LoadError) Error() string {
	return fmt.Sprintf("cannot load %s (tried %s; last error: %s): install the NVIDIA driver and CUDA 12 or 13 runtime libraries, or set CUDA_HOME or LD_LIBRARY_PATH",
		e.Library, strings.Join(e.Tried, ", "), e.Last)
}

// Unavailable marks the error as "this engine cannot run here", so that
// engine "auto" falls back to the CPU.
func (e *LoadError) Unavailable() bool { return true }

// BadInput makes an explicit --engine cuda on a machine without the
// libraries exit with code 2: the user must change the machine or the flag.
func (e *LoadError) BadInput() bool { return true }

// libDirs lists the directories searched after the loader's own search, in
// order: CUDA_HOME, LD_LIBRARY_PATH, then the usual install places.
func libDirs() []string {
	var dirs []string
	if h := os.Getenv("CUDA_HOME"); h != "" {
		dirs = append(dirs, filepath.Join(h, "lib64"), filepath.Join(h, "targets", "x86_64-linux", "lib"), filepath.Join(h, "lib"))
	}
	for _, d := range filepath.SplitList(os.Getenv("LD_LIBRARY_PATH")) {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	dirs = append(dirs,
		"/usr/local/cuda/lib64",
		"/usr/local/cuda/targets/x86_64-linux/lib",
		"/usr/local/nvidia/lib64",
		"/usr/lib/x86_64-linux-gnu",
		"/usr/lib64",
	)
	return dirs
}

// candidates expands sonames into the loader's bare-name search first and
// then each directory, without duplicates.
func candidates(sonames []string, dirs []string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, s := range sonames {
		add(s)
	}
	for _, s := range sonames {
		for _, d := range dirs {
			add(filepath.Join(d, s))
		}
	}
	return out
}

// openLibrary dlopens the first candidate that loads.
func openLibrary(name string, sonames []string, dirs []string) (uintptr, string, error) {
	e := &LoadError{Library: name}
	for _, p := range candidates(sonames, dirs) {
		if strings.Contains(p, "/") {
			if _, err := os.Stat(p); err != nil {
				e.Tried = append(e.Tried, p)
				continue
			}
		}
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, p, nil
		}
		e.Tried = append(e.Tried, p)
		e.Last = err.Error()
	}
	if e.Last == "" {
		e.Last = "no candidate file exists"
	}
	return 0, "", e
}

// bind resolves each symbol into the function pointer beside it, returning
// an error that names the first missing symbol instead of panicking.
func bind(lib uintptr, libName string, fns map[string]any) error {
	for sym, fptr := range fns {
		addr, err := purego.Dlsym(lib, sym)
		if err != nil {
			return &LoadError{Library: libName, Tried: []string{sym}, Last: "missing symbol " + sym + ": " + err.Error()}
		}
		purego.RegisterFunc(fptr, addr)
	}
	return nil
}
