package kernels

import (
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
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
		sigs, err := kernelSignatures(string(body))
		if err != nil {
			t.Errorf("%s: %v", n, err)
		}
		if len(sigs) == 0 {
			t.Errorf("%s declares no extern \"C\" __global__ kernel", n)
		}
		// The engine looks kernels up by these names: a qualifier between
		// "void" and the name (__launch_bounds__) would be taken for one.
		for _, sig := range sigs {
			k := sig.name
			if strings.HasPrefix(k, "__") || strings.ContainsAny(k, "() ") {
				t.Errorf("%s: kernel name %q is not a plain identifier", n, k)
			}
		}
	}
}

func TestKernelSignatures(t *testing.T) {
	src := "extern \"C\" __global__ void a(int x) {}\n// x\nextern \"C\" __global__ void b_c (float* y, const bf16* __restrict__ z,\n" +
		"  long long n, float s) {}\nextern \"C\" __global__ void __launch_bounds__(128, 3) d(unsigned n, size_t m) {}\n" +
		"extern \"C\" __global__ void t(const __grid_constant__ TmaMap m, int c) {}"
	sigs, err := kernelSignatures(src)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sigs {
		ks := make([]int, len(s.params))
		for i, k := range s.params {
			ks[i] = int(k)
		}
		got = append(got, fmt.Sprint(s.name, ks))
	}
	want := []string{"a[1]", "b_c[0 0 2 3]", "d[1 2]", "t[4 1]"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("signatures %v, want %v", got, want)
	}
	if _, err := kernelSignatures("extern \"C\" __global__ void e(double x) {}"); err == nil || !strings.Contains(err.Error(), "double x") {
		t.Errorf("a double parameter: %v; want an error naming it", err)
	}
}

// A launch's arguments must match the kernel's parameters in number and
// kind: what Launch would pass for each Go type.
func TestLaunchArgumentsAreChecked(t *testing.T) {
	want := []paramKind{paramPtr, paramI32, paramI64, paramF32}
	if err := checkArgs("k", want, []any{cuda.Ptr(8), 3, int64(4), float32(1)}); err != nil {
		t.Fatalf("matching arguments refused: %v", err)
	}
	for _, c := range []struct {
		args []any
		want string
	}{
		{[]any{cuda.Ptr(8), 3, int64(4)}, "3 arguments for its 4 parameters"},
		{[]any{cuda.Ptr(8), 3, 4, float32(1)}, "argument 2 is int, the kernel takes a 64-bit integer"},
		{[]any{cuda.Ptr(8), 3, int64(4), 1.0}, "argument 3 is float64"},
		{[]any{int64(8), 3, int64(4), float32(1)}, "argument 0 is int64, the kernel takes a pointer"},
	} {
		if err := checkArgs("k", want, c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want an error with %q", c.args, err, c.want)
		}
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

// declaredKernels is every kernel the .cu files declare, by name, with its
// parameters.
func declaredKernels(t *testing.T) map[string][]paramKind {
	t.Helper()
	sigs := map[string][]paramKind{}
	files, err := kernelFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range files {
		body, _ := sources.ReadFile(n)
		ks, err := kernelSignatures(string(body))
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		for _, k := range ks {
			sigs[k.name] = k.params
		}
	}
	return sigs
}

// Every launch in the engine's source names a kernel that exists and
// passes arguments of the kinds it takes, in number and type: checked
// here without a GPU, by type-checking the package, for the calls whose
// kernel is a literal name (launch3 checks every call when it runs).
func TestLaunchCallsMatchTheKernels(t *testing.T) {
	// Type-checking reads the standard library's source: a test binary
	// carried to a machine without Go (the GPU host) has none.
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no Go toolchain here to type-check the engine's source: %v", err)
	}
	sigs := declaredKernels(t)
	fset := token.NewFileSet()
	goFiles, _ := filepath.Glob("*.go")
	var parsed []*ast.File
	for _, path := range goFiles {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	if _, err := conf.Check("github.com/kiln-lm/kiln/kernels", fset, parsed, info); err != nil {
		t.Fatalf("type-checking the engine: %v", err)
	}
	kinds := map[string]paramKind{"github.com/kiln-lm/kiln/kernels/cuda.Ptr": paramPtr, "int": paramI32, "int32": paramI32,
		"uint32": paramI32, "int64": paramI64, "uint64": paramI64, "float32": paramF32, "*github.com/kiln-lm/kiln/kernels/cuda.TensorMap": paramTMA}
	checked := 0
	for _, f := range parsed {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "launch" && sel.Sel.Name != "launch3") || len(call.Args) < 3 || call.Ellipsis.IsValid() {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			at := fset.Position(call.Pos())
			want, ok := sigs[name]
			if !ok {
				t.Errorf("%s: launches %s, which no .cu file declares", at, name)
				return true
			}
			args := call.Args[3:]
			if len(args) != len(want) {
				t.Errorf("%s: launches %s with %d arguments; it takes %d", at, name, len(args), len(want))
				return true
			}
			for i, a := range args {
				tv := info.Types[a]
				typ := types.Default(tv.Type).String()
				if k, ok := kinds[typ]; !ok || k != want[i] {
					t.Errorf("%s: launch %s: argument %d (%s) is %s, the kernel takes %s", at, name, i, types.ExprString(a), typ, want[i])
				}
			}
			checked++
			return true
		})
	}
	if checked < 40 {
		t.Fatalf("checked %d launches; the engine has more than 40 (is the walk finding them?)", checked)
	}
}

// flash_sm90.cu is built as sm_90a for a compute capability 9.0 device's
// native build and for nothing else: the forced sm_80 build and other
// devices (an RTX 3060, a Blackwell GPU, which has no wgmma) skip it, as
// does an engine that will not run it (KILN_CUDA_ATTENTION=flash-sm80 or
// naive, fp32); every other file is built for the target as it is.
func TestHopperFileOnlyForNativeSM90(t *testing.T) {
	for _, c := range []struct {
		name, arch string
		hopper     bool
		want       string
	}{
		{"flash_sm90.cu", "sm_90", true, "sm_90a"}, {"flash_sm90.cu", "sm_90", false, ""}, {"flash_sm90.cu", "compute_80", true, ""},
		{"flash_sm90.cu", "sm_86", true, ""}, {"flash_sm90.cu", "sm_100", true, ""}, {"flash.cu", "sm_90", true, "sm_90"},
		{"flash.cu", "sm_90", false, "sm_90"}, {"flash.cu", "compute_80", true, "compute_80"},
	} {
		if got := fileArch(c.name, c.arch, c.hopper); got != c.want {
			t.Errorf("fileArch(%q, %q, %v) = %q, want %q", c.name, c.arch, c.hopper, got, c.want)
		}
	}
	if got := Target(9, 0, false); fileArch("flash_sm90.cu", got, true) != "sm_90a" {
		t.Errorf("an H100/H200's native target %q does not build flash_sm90.cu", got)
	}
}

// The kernels chosen by shape, launched by a name the type-checking walk
// above cannot read: the warp-per-row RMSNorm kernels by width and the loss
// kernels by vocabulary. Each exists and takes the general kernel's
// parameters, so the call sites launch them alike.
func TestChosenKernelsMatchTheGeneralOnes(t *testing.T) {
	sigs := declaredKernels(t)
	var pairs [][2]string
	general := warpNormFor(1024)
	for _, d := range []int{512, 768, 640} {
		k := warpNormFor(d)
		pairs = append(pairs, [2]string{k.fwd, general.fwd}, [2]string{k.bwd, general.bwd}, [2]string{k.bwdB, general.bwdB}, [2]string{k.bwdB, general.bwd})
	}
	for _, V := range []int{4096, 16384, 32000, 32768, 50000, 1020} {
		pairs = append(pairs, [2]string{xentKernelFor(V, true), "xent_fwd_bwd"})
	}
	for _, pair := range pairs {
		got, ok := sigs[pair[0]]
		if !ok {
			t.Fatalf("no .cu file declares %s", pair[0])
		}
		if want := sigs[pair[1]]; !slices.Equal(got, want) {
			t.Errorf("%s takes %v, %s %v", pair[0], got, pair[1], want)
		}
	}
}
