package kernels

import (
	"errors"
	"strings"
	"testing"
)

// Every kernel file compiles without CUDA headers (NVRTC 13 ships none) and
// declares at least one extern "C" kernel that the engine can look up.
func TestKernelSourcesAreHeaderFree(t *testing.T) {
	names, err := kernelFiles()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 7 {
		t.Fatalf("found %d kernel files, want at least 7: %v", len(names), names)
	}
	for _, n := range names {
		src, err := source(n)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(src, "#include") {
			t.Errorf("%s includes a header; kernels must be header-free", n)
		}
		body, _ := sources.ReadFile(n)
		ks := kernelNames(string(body))
		if len(ks) == 0 {
			t.Errorf("%s declares no extern \"C\" __global__ kernel", n)
		}
		// The engine looks kernels up by these names: a qualifier between
		// "void" and the name (__launch_bounds__) would be taken for one.
		for _, k := range ks {
			if strings.HasPrefix(k, "__") || strings.ContainsAny(k, "() ") {
				t.Errorf("%s: kernel name %q is not a plain identifier", n, k)
			}
		}
	}
}

func TestKernelNames(t *testing.T) {
	src := "extern \"C\" __global__ void a(int x) {}\n// x\nextern \"C\" __global__ void b_c (float* y) {}\n" +
		"extern \"C\" __global__ void __launch_bounds__(128, 3) d(int n) {}"
	got := strings.Join(kernelNames(src), ",")
	if got != "a,b_c,d" {
		t.Fatalf("kernelNames = %q, want a,b_c,d", got)
	}
}

// The cache key changes with each thing that changes the compiled bytes.
func TestCacheKey(t *testing.T) {
	base := cacheKey("rope.cu", "src", "sm_90", 13, 0)
	for _, other := range []string{
		cacheKey("rope.cu", "src2", "sm_90", 13, 0),
		cacheKey("rope.cu", "src", "sm_86", 13, 0),
		cacheKey("rope.cu", "src", "sm_90", 12, 8),
		cacheKey("rope.cu", "src", "sm_90", 13, 1),
	} {
		if other == base {
			t.Errorf("cache key %s did not change", other)
		}
	}
	if base != cacheKey("rope.cu", "src", "sm_90", 13, 0) {
		t.Error("cache key is not deterministic")
	}
	if !strings.HasSuffix(cacheKey("rope.cu", "src", "compute_80", 13, 0), ".ptx") || !strings.HasSuffix(base, ".cubin") {
		t.Error("a virtual architecture must cache PTX and a real one a CUBIN")
	}
}

func TestTarget(t *testing.T) {
	cases := []struct {
		major, minor int
		force        bool
		want         string
	}{{9, 0, false, "sm_90"}, {8, 6, false, "sm_86"}, {9, 0, true, "compute_80"}, {8, 0, true, "compute_80"}}
	for _, c := range cases {
		if got := Target(c.major, c.minor, c.force); got != c.want {
			t.Errorf("Target(%d, %d, %v) = %s, want %s", c.major, c.minor, c.force, got, c.want)
		}
	}
}

func TestCapabilityBelow80IsRefused(t *testing.T) {
	err := checkCapability("Tesla T4", 7, 5)
	if err == nil || !strings.Contains(err.Error(), "Tesla T4") || !strings.Contains(err.Error(), "7.5") || !strings.Contains(err.Error(), "--engine cpu") {
		t.Fatalf("error = %v, want one naming the GPU, its capability and the way out", err)
	}
	var u interface{ Unavailable() bool }
	var b interface{ BadInput() bool }
	if !errors.As(err, &u) || !u.Unavailable() || !errors.As(err, &b) || !b.BadInput() {
		t.Error("an old GPU must be Unavailable (auto falls back) and BadInput (exit 2)")
	}
	for _, ok := range [][2]int{{8, 0}, {8, 6}, {9, 0}, {12, 0}} {
		if err := checkCapability("x", ok[0], ok[1]); err != nil {
			t.Errorf("capability %d.%d refused: %v", ok[0], ok[1], err)
		}
	}
}
