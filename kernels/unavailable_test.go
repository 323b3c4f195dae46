package kernels

import (
	"errors"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// Without a GPU (as in CI) the engine reports itself unavailable, and
// "auto" falls back to the CPU with a one-line notice.
func TestNoGPUFallsBackWithOneLine(t *testing.T) {
	if cuda.Devices() > 0 {
		t.Skip("a GPU is present; this test covers machines without one")
	}
	c := model.Presets["tiny"]
	_, err := New(c, model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: 16})
	var u interface{ Unavailable() bool }
	if err == nil || !errors.As(err, &u) || !u.Unavailable() {
		t.Fatalf("New without a GPU = %v, want an Unavailable error", err)
	}
	var notes []string
	e, err := model.NewEngine("auto", c, model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: 16, Log: func(s string) { notes = append(notes, s) }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if e.Name() != "cpu" {
		t.Fatalf("auto chose %s without a GPU", e.Name())
	}
	if len(notes) != 1 || strings.Contains(notes[0], "\n") || !strings.Contains(notes[0], "CPU") {
		t.Fatalf("auto's notice = %q, want one line naming the CPU fallback", notes)
	}
	t.Log(notes[0])
}
