package main

import "testing"

// An error cut to its line keeps its remedy whole, and closes a
// parenthesis the cut leaves open: a poison task's line read "(last:
// signal…; fix the cause, ...", its parenthesis never closed.
func TestKeepRemedyClosesWhatItCuts(t *testing.T) {
	const id = "train:segment:d4e9d078d7b1bc102ff1"
	poison := "poison task: the worker died twice running it (last: signal: killed); fix the cause, then `sched retry " + id + "`, which starts the count again"
	for _, c := range []struct {
		msg  string
		n    int
		want string
	}{
		{poison, 1000, poison},
		{poison, 160, "poison task: the worker died twice running it (last: signal…); fix the cause, then `sched retry " + id + "`, which starts the count again"},
		{"a (b (c d e f g h i j k l m n o p q r s t); do this", 40, "a (b (c d e f g h i j k l m n …)); do this"},
		{"a b c d e f g h i j k l m n o p q r s t u; do this", 30, "a b c d e f g h i j …; do this"},
	} {
		if got := keepRemedy(c.msg, c.n, id); got != c.want {
			t.Errorf("keepRemedy(%q, %d):\n%q\nwant\n%q", c.msg, c.n, got, c.want)
		}
	}
}
