package trainer

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// all is taken in any case, as compose takes KILN_GPUS (ALL reserves every
// GPU there), so that a worker started with it does not exit 2 and restart
// over and over.
func TestGPUsTakesAllInAnyCase(t *testing.T) {
	for _, s := range []string{"all", "ALL", "All", " aLl "} {
		if g, err := ParseGPUs(s); err != nil || g != GPUCount(model.AllGPUs) {
			t.Errorf("ParseGPUs(%q) = %v, %v; want all", s, g, err)
		}
	}
	path := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(path, []byte("model: tiny\ngpus: ALL\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if rc, err := LoadRunConfig(path); err != nil || rc.GPUs != GPUCount(model.AllGPUs) {
		t.Errorf("gpus: ALL in YAML: %v, %v; want all", rc.GPUs, err)
	}
}

// A count above the most GPUs one host's NCCL group takes is a typo: it is
// refused where it is read, naming the input and the most allowed, and
// nothing counts up to it. The setting's own name is the one said.
func TestAHugeGPUCountIsRefusedNamingTheMost(t *testing.T) {
	for _, s := range []string{"65", "1000000000", "9223372036854775807", "99999999999999999999"} {
		_, err := ParseGPUs(s)
		if !isBadInput(err) || !strings.Contains(err.Error(), `gpus "`+s+`": more than one host's GPUs`) || !strings.Contains(err.Error(), "give 1 to 64, or all") {
			t.Errorf("ParseGPUs(%q): %v; want bad input naming it and the most, 64", s, err)
		}
	}
	if g, err := ParseGPUs("64"); err != nil || g != 64 {
		t.Errorf("ParseGPUs(64) = %v, %v", g, err)
	}
	if _, err := ParseGPUs("-99999999999999999999"); !isBadInput(err) || !strings.Contains(err.Error(), "give a number of GPUs (1 or more)") {
		t.Errorf("a huge negative count: %v; want a number of GPUs asked for", err)
	}
	if _, err := ParseGPUsOf("KILN_GPUS", "100"); err == nil || !strings.HasPrefix(err.Error(), `KILN_GPUS "100": more than one host's GPUs`) {
		t.Errorf("ParseGPUsOf(KILN_GPUS, 100): %v; want it to name KILN_GPUS", err)
	}
	path := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(path, []byte("model: tiny\naccumulate: 16\ngpus: 9223372036854775807\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadRunConfig(path); !isBadInput(err) || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "give 1 to 64") {
		t.Errorf("gpus: 9223372036854775807 in YAML: %v; want its line and the most, 64", err)
	}
	rc := RunConfig{Model: "tiny", Batch: 2, Accumulate: 16, TotalSteps: 10, Engine: "cuda", Mixture: []MixtureEntry{{Store: "s"}}, GPUs: model.MaxGPUs + 1}
	if err := rc.WithDefaults().Validate(); !isBadInput(err) || !strings.Contains(err.Error(), "gpus 65: more than one host's GPUs") {
		t.Errorf("a run config of gpus 65: %v; want it refused", err)
	}
}

// A step that does not split over a huge number of devices is refused at
// once, with the counts that divide it: they are never more than
// accumulate, and the search stops there.
func TestAStepOverAHugeDeviceCountIsRefusedAtOnce(t *testing.T) {
	_, err := NewGlobalBatch(2, 16, math.MaxInt)
	if !isBadInput(err) || !strings.Contains(err.Error(), "or train on 1, 2, 4, 8 or 16 GPUs") {
		t.Errorf("accumulate 16 on MaxInt devices: %v; want the counts that divide 16", err)
	}
}
