package model

import (
	"errors"
	"strings"
	"testing"
)

// Several GPUs asked for are never quietly trained on one CPU: the cpu
// engine refuses them, and auto without a CUDA engine refuses too.
func TestSeveralGPUsNeverFallBackToTheCPU(t *testing.T) {
	c := Presets["tiny"]
	for _, name := range []string{"cpu", "auto"} {
		for _, gpus := range []int{2, AllGPUs} {
			e, err := NewEngine(name, c, Options{Precision: "fp32", MaxBatch: 1, MaxSeq: 16, GPUs: gpus})
			if e != nil {
				e.Close()
			}
			var ee *EngineError
			if !errors.As(err, &ee) || !strings.Contains(err.Error(), "gpus "+GPUsString(gpus)) || !strings.Contains(err.Error(), "cuda") {
				t.Errorf("engine %s, gpus %s: %v; want an EngineError naming gpus and the cuda engine", name, GPUsString(gpus), err)
			}
		}
	}
	e, err := NewEngine("cpu", c, Options{Precision: "fp32", MaxBatch: 1, MaxSeq: 16, GPUs: 1})
	if err != nil {
		t.Fatalf("gpus 1 on the CPU engine: %v", err)
	}
	e.Close()
}
