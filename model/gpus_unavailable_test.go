package model

import (
	"errors"
	"math"
	"strings"
	"testing"
	"unicode/utf8"
)

// noDriver stands for the CUDA engine's error on a machine without the
// NVIDIA driver (kernels/cuda's LoadError): unavailable, with a short form.
type noDriver struct{}

func (noDriver) Error() string {
	return "cannot load the CUDA driver (libcuda) (tried libcuda.so.1, libcuda.so, /usr/local/cuda/lib64/libcuda.so.1; last error: libcuda.so: cannot open shared object file: No such file or directory): install the NVIDIA driver"
}
func (noDriver) Unavailable() bool { return true }
func (noDriver) Brief() string     { return "no NVIDIA driver here (libcuda.so.1 not found)" }

// unavailable is one without a short form (a driver too old, no device).
type unavailable struct{ msg string }

func (e unavailable) Error() string   { return e.msg }
func (unavailable) Unavailable() bool { return true }
func (unavailable) Brief() string     { return "" }

// Several GPUs that do not start are refused naming the settings that ask
// for them and why in short, and ending, after the error's last "; ", with
// what to do, short enough that sched status keeps it when it cuts the
// line (200 characters, at least a third of them the error's start); the
// cause stays in the chain, unavailable, and a refusal of input.
func TestSeveralGPUsThatDoNotStartSayWhichSettingAndWhatToDo(t *testing.T) {
	for _, gpus := range []int{2, AllGPUs} {
		err := error(&GPUsUnavailableError{GPUs: gpus, Err: noDriver{}})
		msg := err.Error()
		for _, want := range []string{"gpus " + GPUsString(gpus) + " (", "--gpus", "the run's gpus", "KILN_GPUS", "(no NVIDIA driver here (libcuda.so.1 not found))"} {
			if !strings.Contains(msg, want) {
				t.Errorf("gpus %s: %q does not say %q", GPUsString(gpus), msg, want)
			}
		}
		if strings.Contains(msg, "/usr/local/cuda") {
			t.Errorf("gpus %s: %q lists the loader's paths", GPUsString(gpus), msg)
		}
		remedy := msg[strings.LastIndex(msg, "; ")+2:]
		if remedy != "to train on the CPU set --gpus 1, gpus: 1 in the run (or drop it, with KILN_GPUS=1) or engine cpu, or install the NVIDIA driver" {
			t.Errorf("gpus %s: the last clause is %q, want the remedy", GPUsString(gpus), remedy)
		}
		if n := utf8.RuneCountInString(remedy); n > 200-200/3-3 {
			t.Errorf("gpus %s: the remedy is %d runes, more than a cut FAILURES line keeps", GPUsString(gpus), n)
		}
		var un interface{ Unavailable() bool }
		var bad interface{ BadInput() bool }
		if !errors.As(err, &un) || !errors.As(err, &bad) || !bad.BadInput() {
			t.Errorf("gpus %s: %T is not unavailable and bad input", GPUsString(gpus), err)
		}
	}
	// Without a short form, the whole cause, and no driver to install.
	why := "CUDA 12.2 driver is older than the libraries' CUDA 13.0: update the driver to branch 580 or newer"
	msg := (&GPUsUnavailableError{GPUs: 2, Err: unavailable{why}}).Error()
	if !strings.Contains(msg, "("+why+")") || !strings.HasSuffix(msg, "or engine cpu, or make the GPUs start (above)") {
		t.Errorf("a cause without a short form: %q; want it whole and the GPUs to start", msg)
	}
}

// Brief takes the short form an error in the chain gives, else the whole.
func TestBriefTakesTheShortFormInTheChain(t *testing.T) {
	if s, short := Brief(errWrap{noDriver{}}); s != "no NVIDIA driver here (libcuda.so.1 not found)" || !short {
		t.Errorf("Brief of a wrapped driver error: %q, %v", s, short)
	}
	e := errWrap{unavailable{"the driver sees no GPU"}}
	if s, short := Brief(e); s != e.Error() || short {
		t.Errorf("Brief of an error without a short form: %q, %v; want it whole", s, short)
	}
}

type errWrap struct{ err error }

func (e errWrap) Error() string { return "start: " + e.err.Error() }
func (e errWrap) Unwrap() error { return e.err }

// A count of GPUs from a typo is refused, and the count a run takes of a
// huge one is found at once: no loop counts down from it.
func TestAHugeGPUCountIsRefusedAndNotCountedDown(t *testing.T) {
	_, err := NewEngine("auto", Presets["tiny"], Options{Precision: "fp32", MaxBatch: 1, MaxSeq: 16, GPUs: MaxGPUs + 1})
	var ee *EngineError
	if !errors.As(err, &ee) || !strings.Contains(err.Error(), "(1 to 64)") {
		t.Errorf("gpus %d: %v; want an EngineError naming the most, 64", MaxGPUs+1, err)
	}
	if d := DividingGPUs(math.MaxInt, 16); d != 16 {
		t.Errorf("DividingGPUs(MaxInt, 16) = %d, want 16", d)
	}
}
