package kernels

import (
	"errors"
	"regexp"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// ProbeHost says what New will find without opening a device: where no GPU
// starts, New's own error; where one does, the GPU New opens, as the engine
// reports it.
func TestProbeHostDescribesWhatNewOpens(t *testing.T) {
	c := model.Presets["tiny"]
	o := model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: 16}
	h, err := ProbeHost()
	if cuda.Devices() == 0 {
		var u interface{ Unavailable() bool }
		if err == nil || !errors.As(err, &u) || !u.Unavailable() {
			t.Fatalf("ProbeHost without a GPU = %v, want an Unavailable error", err)
		}
		_, nerr := New(c, o)
		if nerr == nil || nerr.Error() != err.Error() {
			t.Fatalf("ProbeHost says %q, New %q", err, nerr)
		}
		if len(h.GPUs) != 0 {
			t.Fatalf("ProbeHost without a GPU lists %v", h.GPUs)
		}
		return
	}
	if err != nil {
		t.Fatalf("ProbeHost with %d GPUs: %v", cuda.Devices(), err)
	}
	if len(h.GPUs) != cuda.Devices() {
		t.Errorf("ProbeHost lists %d GPUs, the driver sees %d", len(h.GPUs), cuda.Devices())
	}
	for i, g := range h.GPUs {
		if g.Ordinal != i || g.Name == "" || g.SMs == 0 || g.Total == 0 {
			t.Errorf("GPU %d described as %+v", i, g)
		}
	}
	if lib := h.Libraries(); !regexp.MustCompile(`^driver CUDA \d+\.\d, NVRTC \d+\.\d+, cuBLASLt \d+\.\d+\.\d+$`).MatchString(lib) {
		t.Errorf("Libraries() = %q", lib)
	}
	e := newEngine(t, c, o)
	d, g := e.Device(), h.GPUs[0]
	if d.Name != g.Name || d.Major != g.Major || d.Minor != g.Minor || d.SMs != g.SMs || d.TotalBytes != int64(g.Total) {
		t.Errorf("the engine opened %+v, ProbeHost described %+v", d, g)
	}
	t.Logf("%s; %s", DescribeGPU(g), h.Libraries())
}
