package scheduler

import "testing"

// A run whose last segment's training is over says what it waits for in
// place of its last rate and an ETA; a state that records no phase, as
// every state before phases did, or one this kiln does not know, reads as
// before, and a done run is done whatever phase its state still holds.
func TestARunsLastPhaseReadsInPlaceOfItsRate(t *testing.T) {
	at := func(fields map[string]string) map[string]string {
		h := map[string]string{"step": "40", "total": "40", "tok_per_s": "1000", "eta_s": "60", "checkpoint": "20"}
		for k, v := range fields {
			h[k] = v
		}
		return h
	}
	for _, c := range []struct {
		name   string
		fields map[string]string
		want   string
	}{
		{"no phase", nil, "x: step 40/40, 1000 tok/s, ETA 1m0s, last checkpoint step 20"},
		{"a phase of a later kiln", map[string]string{"phase": "sampling"}, "x: step 40/40, 1000 tok/s, ETA 1m0s, last checkpoint step 20"},
		{"uploading", map[string]string{"phase": PhaseUpload}, "x: step 40/40, training is over: uploading its last checkpoint (step 40), last checkpoint step 20"},
		{"uploaded, the results after it", map[string]string{"phase": PhaseUpload, "checkpoint": "40"},
			"x: step 40/40, training is over: its last checkpoint (step 40) is uploaded; writing its results, last checkpoint step 40"},
		{"results", map[string]string{"phase": PhaseResults, "checkpoint": "40"},
			"x: step 40/40, training is over: its last checkpoint (step 40) is uploaded; writing its results, last checkpoint step 40"},
		{"results, no object storage", map[string]string{"phase": PhaseResults, "checkpoint": ""},
			"x: step 40/40, training is over: writing its results, no checkpoint yet"},
		{"done", map[string]string{"phase": PhaseUpload, "done": "true"}, "x: step 40/40, 1000 tok/s, done, last checkpoint step 20"},
	} {
		if got := parseRunState("x", at(c.fields)).String(); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
