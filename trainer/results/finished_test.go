package results

import (
	"bytes"
	"strings"
	"testing"
)

// A run whose total was lowered below its step ends there: lowered while
// a segment trained past it, at that segment's end; lowered after it
// stopped (cancelled, then total_steps set to its step or lower, and
// queued again), at its checkpoint. Its step reads so, true of both, where
// "1500 / 800" read as a broken run (and the words read as if every such
// run had been lowered while a segment went on).
func TestTheStepOfARunEndedPastItsTotal(t *testing.T) {
	past := Summary{Run: "r19", Records: curve(1500), TotalSteps: 800}.Table()
	want := "1500, past its total_steps of 800: the run's length was lowered to 800 after the segment that trained to step 1500 began, while it trained or after it stopped; the run ended there"
	if row := tableRow(past, "step"); row != want {
		t.Errorf("a run ended at step 1500 past its total of 800: step row %q, want %q\n%s", row, want, past)
	}
	if row := tableRow(Summary{Run: "r4", Records: curve(1500), TotalSteps: 1500}.Table(), "step"); row != "1500 / 1500" {
		t.Errorf("a run ended at its total: step row %q; want 1500 / 1500", row)
	}
}

// A run's evaluation that left out a store without a held-out window is
// said in its results, naming the stores it covers and those it leaves
// out, through metrics.jsonl; one that covers every store says nothing
// more.
func TestTheResultsSayWhichStoresTheEvalLossCovers(t *testing.T) {
	recs := curve(100)
	for i := range recs {
		if recs[i].EvalLoss != nil {
			recs[i].EvalLossByStore = map[string]float64{"the-stack-v2": *recs[i].EvalLoss}
			recs[i].EvalLeftOut = []string{"fineweb-edu", "proof-pile-2"}
		}
	}
	var b bytes.Buffer
	for _, r := range recs {
		if err := WriteRecord(&b, r); err != nil {
			t.Fatal(err)
		}
	}
	read, err := ReadMetrics(&b)
	if err != nil {
		t.Fatal(err)
	}
	table := Summary{Run: "pilot-cpu", Records: read, TotalSteps: 100}.Table()
	want := "the-stack-v2 alone: fineweb-edu, proof-pile-2 held no held-out window (too few tokens), and the eval losses and the gates leave them out; ingest more into them"
	if row := tableRow(table, "eval loss covers"); !strings.HasPrefix(row, want) {
		t.Errorf("eval loss covers: %q; want it to begin %q\n%s", row, want, table)
	}
	if table := (Summary{Run: "pilot-cpu", Records: curve(100), TotalSteps: 100}).Table(); strings.Contains(table, "eval loss covers") {
		t.Errorf("an evaluation of every store says what it covers:\n%s", table)
	}
}

// The smooth gate of a finished run that logged too few losses to judge
// says it cannot be judged and what to change, where it said "... yet"
// of a run that would log no more.
func TestTheSmoothGateOfAFinishedRunWithTooFewLosses(t *testing.T) {
	// 2000 steps logged every 20: 100 losses, none with 100 before it.
	recs := make([]Record, 100)
	for i := range recs {
		recs[i] = Record{Step: 20 * (i + 1), Tokens: int64(20*(i+1)) * 8192, Loss: F(3)}
	}
	g := Gates(Evidence{Run: "r5", Records: recs, Warmup: 10, Step: 2000, TotalSteps: 2000})[0]
	if g.Verdict != Unknown || strings.Contains(g.Detail, "yet") || !strings.Contains(g.Detail, "cannot be judged") ||
		!strings.Contains(g.Detail, "the run ended with 100 losses logged") || !strings.Contains(g.Detail, "log_every 10 or less") {
		t.Errorf("a finished run of too few losses: %+v; want it unknown, said not to be judged, with a log_every of 10 or less named", g)
	}
	// Ended within its warmup: a smaller log_every would not help.
	g = Gates(Evidence{Run: "r5", Records: recs, Warmup: 3000, Step: 2000, TotalSteps: 2000})[0]
	if g.Verdict != Unknown || !strings.Contains(g.Detail, "within its warmup of 3000 steps") || strings.Contains(g.Detail, "log_every") {
		t.Errorf("a finished run that ended within its warmup: %+v", g)
	}
}

// tableRow is the value of the results table's row named key.
func tableRow(table, key string) string {
	for _, l := range strings.Split(table, "\n") {
		cells := strings.Split(l, "|")
		if len(cells) >= 3 && strings.TrimSpace(cells[1]) == key {
			return strings.TrimSpace(strings.ReplaceAll(strings.Join(cells[2:len(cells)-1], "|"), `\`, ""))
		}
	}
	return ""
}
