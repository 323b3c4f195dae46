package scheduler

import "testing"

func TestRunStateLine(t *testing.T) {
	if got := parseRunState("x", map[string]string{"step": "10", "total": "100", "loss": "3.5", "tok_per_s": "1000", "eta_s": "7200"}).String(); got != "x: step 10/100, loss 3.5000, 1000 tok/s, ETA 2h0m0s, no checkpoint yet" {
		t.Errorf("status line %q", got)
	}
}
