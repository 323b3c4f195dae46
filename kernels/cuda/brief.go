package cuda

import "strings"

// Brief is e in a few words, for a message that says what to do itself
// (sched config --check's engine line, a refusal of several GPUs): on a
// machine without the NVIDIA driver, that alone, not the dozen paths
// tried. A driver that is there but does not load (a missing symbol, a
// file of another architecture), and every other library, have no short
// form: "" (the whole error says it).
func (e *LoadError) Brief() string {
	if len(e.Tried) == 0 || e.Tried[0] != "libcuda.so.1" {
		return ""
	}
	// Candidates that are absent are passed over without a dlopen (Last
	// is then the bare names' "cannot open shared object file"), and
	// "no candidate file exists" is openLibrary's own word for none.
	if e.Last != "no candidate file exists" && !strings.Contains(e.Last, "cannot open shared object file") {
		return ""
	}
	return "no NVIDIA driver here (libcuda.so.1 not found)"
}
