package cuda

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"unsafe"
)

// A tuned GEMM's algorithm is chosen by timing, and two processes may
// choose differently for the same product (candidates within the timer's
// noise of each other), which sums in another order: a run resumed in a
// new process would not give the bits the uninterrupted run gives.
// Remember keeps every choice in a file, one per GPU model and cuBLASLt
// version, which each later handle on that machine takes instead of
// timing again: the same algorithms, the same bits, and no tuning at start.

// choiceFile is the file Remember keeps: the algorithm of each product by
// choiceKey.
type choiceFile struct {
	path    string
	Library uint64               `json:"cublaslt_version"`
	Device  string               `json:"device"`
	Algos   map[string][8]uint64 `json:"algorithms"`
}

// notInName is what a GPU's name may not keep in a file name.
var notInName = regexp.MustCompile(`[^A-Za-z0-9.]+`)

// ChoicesPath is where the choices for a GPU model and a cuBLASLt version
// are kept in dir: gemm-<device>-<version>.json.
func ChoicesPath(dir, device string, version uint64) string {
	name := notInName.ReplaceAllString(device, "-")
	return filepath.Join(dir, fmt.Sprintf("gemm-%s-%d.json", name, version))
}

// Remember makes the handle take each product's algorithm from the file at
// path when it holds one for the product (checked by cuBLASLt for the
// product's descriptors first), and write each one it times there (see
// Tune). device names the GPU model the file is for. A file that cannot be
// read as this machine's is reported in the error, and tuning goes on and
// replaces it with one that is. Choices are written after the file is read
// again, and a choice already in it is kept: two processes tuning the same
// product at once keep the first one written.
func (h *LtHandle) Remember(path, device string) error {
	c := &choiceFile{path: path, Library: h.b.Version(), Device: device}
	h.choices = c
	return c.load()
}

func choiceKey(k product, ws int64, n int) string {
	return fmt.Sprintf("%s compute %d dtype %d out %d workspace %d candidates %d",
		ProductName(k.ta, k.tb, k.M, k.N, k.K), k.compute, k.dtype, k.ctype, ws, n)
}

// load reads the file into c.Algos; a missing file is an empty one, and
// so is one that is not this machine's (the error says so).
func (c *choiceFile) load() error {
	c.Algos = map[string][8]uint64{}
	b, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("GEMM choices %s: %w", c.path, err)
	}
	var f choiceFile
	if err := json.Unmarshal(b, &f); err != nil || f.Library != c.Library || f.Device != c.Device {
		why := fmt.Sprintf("made for %q with cuBLASLt %d", f.Device, f.Library)
		if err != nil {
			why = err.Error()
		}
		return fmt.Errorf("GEMM choices %s are not this machine's (%s): timing the GEMMs again and writing them anew", c.path, why)
	}
	if f.Algos != nil {
		c.Algos = f.Algos
	}
	return nil
}

// recall is the file's algorithm for the product, read afresh.
func (c *choiceFile) recall(k product, ws int64, n int) (*algo, bool) {
	c.load()
	v, ok := c.Algos[choiceKey(k, ws, n)]
	if !ok {
		return nil, false
	}
	return &algo{data: v}, true
}

// keep adds the product's algorithm to the file, unless it holds one
// already; the file is replaced whole (written beside it, then renamed).
func (c *choiceFile) keep(k product, ws int64, n int, a *algo) {
	c.load()
	key := choiceKey(k, ws, n)
	if _, ok := c.Algos[key]; ok {
		return
	}
	c.Algos[key] = a.data
	b, err := json.MarshalIndent(c, "", " ")
	if err != nil {
		return
	}
	if os.MkdirAll(filepath.Dir(c.path), 0o755) != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), filepath.Base(c.path)+".*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), c.path) != nil {
		os.Remove(tmp.Name())
	}
}

// usable asks cuBLASLt whether algorithm a runs the product described by
// d, la, lb, lc within wsSize bytes of workspace.
func (h *LtHandle) usable(d, la, lb, lc uintptr, a *algo, wsSize int64) bool {
	var r heuristicResult
	if h.b.cublasLtMatmulAlgoCheck(h.h, d, la, lb, lc, lc, unsafe.Pointer(a), unsafe.Pointer(&r)) != 0 {
		return false
	}
	return r.state == 0 && int64(r.wsSize) <= wsSize
}
