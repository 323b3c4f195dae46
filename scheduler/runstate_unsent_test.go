package scheduler

import (
	"maps"
	"testing"
	"time"
)

// What a segment records while object storage does not take the run's
// checkpoints reads back as it was written, and its note says where they
// are; the fields of the zero Unsent clear it, and a state whose newest
// uploaded checkpoint is as new as the one recorded unsent has no note.
func TestUnsentReadsBackAndClears(t *testing.T) {
	since := time.Date(2026, 12, 7, 10, 43, 38, 0, time.UTC)
	u := Unsent{Since: since, Newest: 1000, Worker: "gpu-a", Store: "http://minio:9000/kiln", Err: "put: connect: connection refused"}
	h := map[string]string{"step": "1000", "total": "1500", "checkpoint": "200"}
	maps.Copy(h, u.Fields())
	st := parseRunState("r", h)
	if st.Unsent != u {
		t.Fatalf("read back %+v, want %+v", st.Unsent, u)
	}
	const want = "checkpoints after step 200 (newest: step 1000) are on gpu-a's disk only: object storage at http://minio:9000/kiln has not taken them since 2026-12-07T10:43:38Z (put: connect: connection refused)"
	if got := st.UnsentNote(); got != want {
		t.Errorf("note %q\nwant %q", got, want)
	}
	delete(h, "checkpoint")
	if got := parseRunState("r", h).UnsentNote(); got != "its checkpoints (newest: step 1000) are on gpu-a's disk only: object storage at http://minio:9000/kiln has not taken them since 2026-12-07T10:43:38Z (put: connect: connection refused)" {
		t.Errorf("note without a checkpoint uploaded: %q", got)
	}
	h["checkpoint"] = "1000"
	if got := parseRunState("r", h).UnsentNote(); got != "" {
		t.Errorf("note %q where the state records step 1000 uploaded; want none", got)
	}
	maps.Copy(h, Unsent{}.Fields())
	if st := parseRunState("r", h); st.Unsent != (Unsent{}) {
		t.Errorf("cleared, it reads %+v", st.Unsent)
	}
}

// The loss of a run's line names its step where that is not the step
// shown; a state that records no loss step, as one an earlier kiln wrote,
// reads its loss as the step's.
func TestARunsLossNamesItsStep(t *testing.T) {
	for _, c := range []struct {
		lossStep, want string
	}{
		{"995", "x: step 1000/1500, loss 3.1889 at step 995, no checkpoint yet"},
		{"1000", "x: step 1000/1500, loss 3.1889, no checkpoint yet"},
		{"", "x: step 1000/1500, loss 3.1889, no checkpoint yet"},
	} {
		h := map[string]string{"step": "1000", "total": "1500", "loss": "3.1889"}
		if c.lossStep != "" {
			h["loss_step"] = c.lossStep
		}
		if got := parseRunState("x", h).String(); got != c.want {
			t.Errorf("loss_step %q: %q, want %q", c.lossStep, got, c.want)
		}
	}
}
