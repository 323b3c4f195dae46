package cuda

import (
	"strings"
	"testing"
)

// Without the NVIDIA driver, the driver's load error says so in a few
// words; a driver that is there but does not load, and another library,
// have no short form. Where this machine has no driver, LoadDriver's own
// error is the short one.
func TestTheDriverMissingIsSaidShort(t *testing.T) {
	missing := &LoadError{Library: "the CUDA driver (libcuda)", Tried: []string{"libcuda.so.1", "libcuda.so", "/usr/lib64/libcuda.so.1"},
		Last: "libcuda.so: cannot open shared object file: No such file or directory"}
	if got := missing.Brief(); got != "no NVIDIA driver here (libcuda.so.1 not found)" {
		t.Errorf("no driver: Brief %q", got)
	}
	for _, e := range []*LoadError{
		{Library: "the CUDA driver (libcuda)", Tried: []string{"libcuda.so.1"}, Last: "/usr/lib64/libcuda.so.1: wrong ELF class: ELFCLASS32"},
		{Library: "the CUDA driver (libcuda)", Tried: []string{"cuGraphExecUpdate_v2"}, Last: "missing symbol cuGraphExecUpdate_v2: undefined"},
		{Library: "NVRTC (libnvrtc)", Tried: []string{"libnvrtc.so.13"}, Last: "libnvrtc.so.13: cannot open shared object file: No such file or directory"},
	} {
		if got := e.Brief(); got != "" {
			t.Errorf("%v: Brief %q, want none", e, got)
		}
	}
	_, err := LoadDriver()
	le, ok := err.(*LoadError)
	switch {
	case err == nil:
		t.Log("the driver loads here: its missing form is checked on the error above only")
	case !ok || !strings.Contains(le.Last, "cannot open shared object file"):
		t.Logf("the driver is here and does not load: %v", err)
	case le.Brief() != "no NVIDIA driver here (libcuda.so.1 not found)":
		t.Errorf("no driver here: LoadDriver's error %v reads short as %q", err, le.Brief())
	}
}
