package cuda

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
)

// libcGetenv reads a variable as C code (NCCL) sees it.
func libcGetenv(t *testing.T, name string) (string, bool) {
	t.Helper()
	lib, _, err := openLibrary("libc", []string{"libc.so.6"}, nil)
	if err != nil {
		t.Skipf("no libc.so.6 to read the C environment with: %v", err)
	}
	var getenv func(name *byte) *byte
	purego.RegisterLibFunc(&getenv, lib, "getenv")
	p := getenv(cString(name))
	return goString(p), p != nil
}

// A machine without NCCL gets one line that lists where it was looked for
// and says what to install, marked unavailable and bad input; and the
// environment has NVLink multicast and the connection at the first
// collective off even so, since they are set before the library is looked
// for.
func TestLoadNCCLMissingSaysWhatToInstall(t *testing.T) {
	t.Setenv(ncclNVLSEnv, "1")
	t.Setenv(ncclRuntimeConnectEnv, "1")
	dir := t.TempDir()
	_, err := loadNCCL([]string{"libkiln-no-nccl.so.2"}, []string{dir})
	if err == nil {
		t.Fatal("loading a nonexistent NCCL succeeded")
	}
	var ne *NCCLLoadError
	var le *LoadError
	if !errors.As(err, &ne) || !errors.As(err, &le) {
		t.Fatalf("error %T is not an *NCCLLoadError wrapping a *LoadError: %v", err, err)
	}
	msg := err.Error()
	for _, want := range []string{"libkiln-no-nccl.so.2", filepath.Join(dir, "libkiln-no-nccl.so.2"), "libnccl2", "nvidia-nccl-cu12", NCCLLibraryEnv} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not mention %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error is not one line:\n%s", msg)
	}
	var u interface{ Unavailable() bool }
	var b interface{ BadInput() bool }
	if !errors.As(err, &u) || !u.Unavailable() || !errors.As(err, &b) || !b.BadInput() {
		t.Error("a missing NCCL is not marked Unavailable and BadInput")
	}
	for _, name := range []string{ncclNVLSEnv, ncclRuntimeConnectEnv} {
		if v := os.Getenv(name); v != "0" {
			t.Errorf("after loading NCCL, Go sees %s=%q, want 0", name, v)
		}
		if v, ok := libcGetenv(t, name); !ok || v != "0" {
			t.Errorf("after loading NCCL, C's getenv sees %s=%q (set %v), want 0", name, v, ok)
		}
	}
}

// KILN_NCCL_LIBRARY is the only file tried when set; unset, the sonames
// go to the loader's search and then every known place.
func TestNCCLLibraryVariableIsTheOnlyFileTried(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libnccl.so.2")
	t.Setenv(NCCLLibraryEnv, path)
	sonames, dirs := ncclSearch()
	_, err := loadNCCL(sonames, dirs)
	var le *LoadError
	if !errors.As(err, &le) || !slices.Equal(le.Tried, []string{path}) {
		t.Fatalf("with %s=%s, tried %v (error %v)", NCCLLibraryEnv, path, le, err)
	}
	t.Setenv(NCCLLibraryEnv, "")
	sonames, dirs = ncclSearch()
	if !slices.Equal(sonames, []string{"libnccl.so.2", "libnccl.so"}) || !slices.Contains(dirs, "/usr/local/cuda/lib64") {
		t.Fatalf("without %s: sonames %v, directories %v", NCCLLibraryEnv, sonames, dirs)
	}
}

// The Python environments' nvidia/nccl/lib, where PyTorch's wheels put
// libnccl.so.2, are searched after the CUDA places.
func TestNCCLSearchFindsPythonEnvironments(t *testing.T) {
	venv, conda := t.TempDir(), t.TempDir()
	for _, root := range []string{venv, conda} {
		if err := os.MkdirAll(filepath.Join(root, "lib", "python3.12", "site-packages", "nvidia", "nccl", "lib"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("VIRTUAL_ENV", venv)
	t.Setenv("CONDA_PREFIX", conda)
	t.Setenv("CUDA_HOME", "/opt/cuda-x")
	dirs := ncclDirs()
	v := slices.Index(dirs, filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "nccl", "lib"))
	c := slices.Index(dirs, filepath.Join(conda, "lib", "python3.12", "site-packages", "nvidia", "nccl", "lib"))
	cuda := slices.Index(dirs, "/opt/cuda-x/lib64")
	if v < 0 || c < 0 || cuda < 0 || !(cuda < v && v < c) {
		t.Fatalf("search order wrong (CUDA_HOME %d, VIRTUAL_ENV %d, CONDA_PREFIX %d): %v", cuda, v, c, dirs)
	}
}

func TestDecodeNCCLVersion(t *testing.T) {
	for code, want := range map[int]string{2708: "2.7.8", 2804: "2.8.4", 21903: "2.19.3", 22105: "2.21.5", 22703: "2.27.3"} {
		if got := decodeNCCLVersion(code).String(); got != want {
			t.Errorf("version code %d = %s, want %s", code, got, want)
		}
	}
}

// No code of this package binds the driver's multicast objects: they span
// GPUs and can outlive a killed process on a shared host.
func TestNoMulticastObjects(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `"cuMulticast`) {
			t.Errorf("%s binds a cuMulticast function", f)
		}
	}
}

// ncclDevice opens device 0 on a locked thread, or skips without a GPU or
// NCCL.
func ncclDevice(t *testing.T) (*NCCL, *Device) {
	t.Helper()
	if _, err := LoadDriver(); err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	n, err := LoadNCCL()
	if err != nil {
		t.Skipf("no NCCL: %v", err)
	}
	dv := device0(t)
	if v := os.Getenv(ncclNVLSEnv); v != "0" {
		t.Fatalf("NCCL was loaded with %s=%q", ncclNVLSEnv, v)
	}
	t.Logf("NCCL %s from %s on %s", n.Version, n.Path, dv.Name)
	return n, dv
}

// device0 opens device 0 on this test's goroutine, locked to its thread,
// skipping where there is no driver or no device.
func device0(t *testing.T) *Device {
	t.Helper()
	d, err := LoadDriver()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	dv, err := d.OpenDevice(0)
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	t.Cleanup(func() { dv.Close() })
	return dv
}

// allReduceOne sums a buffer over a one-rank communicator, out of place
// and in place: the result is the input.
func allReduceOne(t *testing.T, dv *Device, c *Comm) {
	t.Helper()
	if n, err := c.Count(); err != nil || n != 1 {
		t.Fatalf("communicator count %d, %v", n, err)
	}
	if r, err := c.UserRank(); err != nil || r != 0 {
		t.Fatalf("communicator rank %d, %v", r, err)
	}
	const count = 1<<20 + 3 // not a multiple of any chunk size
	in := make([]float32, count)
	for i := range in {
		in[i] = float32(math.Sin(float64(i))) * 1e3
	}
	send, err := dv.Alloc(4 * count)
	if err != nil {
		t.Fatal(err)
	}
	defer dv.Free(send)
	recv, err := dv.Alloc(4 * count)
	if err != nil {
		t.Fatal(err)
	}
	defer dv.Free(recv)
	if err := Upload(dv, send, in); err != nil {
		t.Fatal(err)
	}
	if err := dv.Memset32(recv, 0x7fc00000, count); err != nil { // NaN: a skipped write shows
		t.Fatal(err)
	}
	s, err := dv.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if err := c.AllReduceSum(send, recv, count, s.Handle()); err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduceSum(send, send, count, s.Handle()); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := c.AsyncError(); err != nil {
		t.Fatal(err)
	}
	for _, buf := range []Ptr{recv, send} {
		out := make([]float32, count)
		if err := Download(dv, out, buf); err != nil {
			t.Fatal(err)
		}
		for i := range in {
			if math.Float32bits(out[i]) != math.Float32bits(in[i]) {
				t.Fatalf("all-reduce over one rank: element %d is %v, input %v", i, out[i], in[i])
			}
		}
	}
}

func TestNCCLOneRankAllReduceOnDevice0(t *testing.T) {
	n, dv := ncclDevice(t)
	id, err := n.UniqueID()
	if err != nil {
		t.Fatal(err)
	}
	if id == (UniqueID{}) {
		t.Fatal("ncclGetUniqueId returned an all-zero id")
	}
	c, err := n.InitRank(1, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	allReduceOne(t, dv, c)
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}

	cs, err := n.InitAll([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	allReduceOne(t, dv, cs[0])
	if err := cs[0].Abort(); err != nil {
		t.Fatal(err)
	}
}

func TestNCCLRefusesBadRanks(t *testing.T) {
	n := &NCCL{}
	for _, c := range [][2]int{{0, 0}, {2, 2}, {2, -1}} {
		if _, err := n.InitRank(c[0], UniqueID{}, c[1]); err == nil || !strings.Contains(err.Error(), "ncclCommInitRank") {
			t.Errorf("InitRank(%d ranks, rank %d) = %v", c[0], c[1], err)
		}
	}
	if _, err := n.InitAll(nil); err == nil || !strings.Contains(err.Error(), "no device") {
		t.Errorf("InitAll(no devices) = %v", err)
	}
}
