package cuda

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Choices kept by one handle are recalled by another (a later process on
// the machine): for the same product, workspace and candidate count only;
// a choice already kept is not replaced by a second one for the same
// product; a file made for another GPU or cuBLASLt, or not one at all, is
// reported and replaced by one that is this machine's.
func TestGemmChoicesAreRecalledByTheNextHandle(t *testing.T) {
	dir := t.TempDir()
	path := ChoicesPath(dir, "NVIDIA H200", 130100)
	if filepath.Base(path) != "gemm-NVIDIA-H200-130100.json" {
		t.Fatalf("choices path %s", path)
	}
	open := func() *choiceFile {
		c := &choiceFile{path: path, Library: 130100, Device: "NVIDIA H200"}
		if err := c.load(); err != nil {
			t.Fatalf("load %s: %v", path, err)
		}
		return c
	}
	p := product{compute: ComputeF32, dtype: DataBF16, ctype: DataBF16, ta: false, tb: true, M: 32768, N: 2816, K: 768}
	first, second := &algo{data: [8]uint64{1, 2, 3, 4, 5, 6, 7, 8}}, &algo{data: [8]uint64{9}}
	if _, ok := open().recall(p, 32<<20, 8); ok {
		t.Fatal("a choice recalled from no file")
	}
	open().keep(p, 32<<20, 8, first)
	open().keep(p, 32<<20, 8, second)
	if a, ok := open().recall(p, 32<<20, 8); !ok || *a != *first {
		t.Fatalf("recalled %v, %v; want the first choice kept, %v", a, ok, first)
	}
	for name, miss := range map[string]func() (*algo, bool){
		"another workspace":       func() (*algo, bool) { return open().recall(p, 0, 8) },
		"another candidate count": func() (*algo, bool) { return open().recall(p, 32<<20, 16) },
		"another shape":           func() (*algo, bool) { q := p; q.M = 16384; return open().recall(q, 32<<20, 8) },
	} {
		if a, ok := miss(); ok {
			t.Errorf("%s: recalled %v", name, a)
		}
	}
	for name, body := range map[string]string{
		"another GPU's":     `{"cublaslt_version":130100,"device":"NVIDIA GeForce RTX 3060","algorithms":{}}`,
		"another library's": `{"cublaslt_version":120900,"device":"NVIDIA H200","algorithms":{}}`,
		"not one at all":    `{"cublaslt_version":`,
	} {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		c := &choiceFile{path: path, Library: 130100, Device: "NVIDIA H200"}
		if err := c.load(); err == nil || !strings.Contains(err.Error(), "not this machine's") || !strings.Contains(err.Error(), path) {
			t.Errorf("%s file: %v; want an error naming it and saying it is not this machine's", name, err)
		}
		if _, ok := c.recall(p, 32<<20, 8); ok {
			t.Errorf("%s file: a choice recalled from it", name)
		}
		c.keep(p, 32<<20, 8, second)
		var f choiceFile
		b, _ := os.ReadFile(path)
		if err := json.Unmarshal(b, &f); err != nil || f.Device != "NVIDIA H200" || f.Library != 130100 || len(f.Algos) != 1 {
			t.Errorf("%s file replaced by %s (%v); want this machine's with one choice", name, b, err)
		}
		if a, ok := open().recall(p, 32<<20, 8); !ok || *a != *second {
			t.Errorf("%s file: after it was replaced, recalled %v, %v", name, a, ok)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 1 {
		t.Errorf("the directory holds %v; want the choices file alone (no temporary files left)", left)
	}
}
