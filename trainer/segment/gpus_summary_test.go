package segment

import (
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/trainer/results"
)

// mdRow is the value of the row key of a markdown table in md.
func mdRow(md, key string) string {
	for _, l := range strings.Split(md, "\n") {
		cells := strings.Split(l, "|")
		if len(cells) >= 3 && strings.TrimSpace(cells[1]) == key {
			return strings.TrimSpace(strings.Join(cells[2:len(cells)-1], "|"))
		}
	}
	return ""
}

// A run's summary says the GPUs it trained on (from which step, where a
// resume changed their number), and that its tok/s is all of theirs
// together while its MFU is each one's; a run of one GPU says 1 and
// nothing beside its rate, one on the CPU engine none, and one that has
// logged no step the GPUs it asks for.
func TestTheSummarySaysTheGPUsItsRateIsOf(t *testing.T) {
	r := testRun("summary-gpus", 60)
	rc := r.RunConfig.WithDefaults()
	rc.Engine = "auto"
	line := func(step, gpus int, tps float64) results.Record {
		return results.Record{Step: step, Loss: results.F(5), TokPerSec: tps, GPUs: gpus, MFU: results.F(0.4)}
	}
	summary := func(recs []results.Record) string {
		s := results.Summary{Run: r.Name, Settings: Settings(r, rc, "bf16", recs), Records: recs, TotalSteps: 60}
		var b strings.Builder
		if err := s.WriteMarkdown(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}

	two := []results.Record{line(10, 2, 2000), line(20, 2, 2100), line(30, 2, 2200)}
	md := summary(two)
	if got := mdRow(md, "gpus"); got != "2" {
		t.Errorf("a run on 2 GPUs: gpus row %q, want 2\n%s", got, md)
	}
	if got := mdRow(md, "tok/s (median)"); got != "2100 (all 2 GPUs together; MFU is each GPU's)" {
		t.Errorf("a run on 2 GPUs: tok/s row %q\n%s", got, md)
	}

	md = summary(append(two, line(40, 0, 1000), line(50, 0, 1000)))
	if got := mdRow(md, "gpus"); got != "2, then 1 from step 40" {
		t.Errorf("a run resumed on one GPU: gpus row %q\n%s", got, md)
	}
	if got := mdRow(md, "tok/s (median)"); got != "2000 (each logged rate all its GPUs together, 1 to 2; MFU is each GPU's)" {
		t.Errorf("a run resumed on one GPU: tok/s row %q\n%s", got, md)
	}

	md = summary([]results.Record{line(10, 0, 1000)})
	if got, tps := mdRow(md, "gpus"), mdRow(md, "tok/s (median)"); got != "1" || tps != "1000" {
		t.Errorf("a run on one GPU: gpus %q, tok/s %q; want 1 and the rate alone\n%s", got, tps, md)
	}
	rc.GPUs = -1
	if got := mdRow(summary(nil), "gpus"); got != "all (no step logged yet)" {
		t.Errorf("a run of gpus all with no step logged: gpus row %q", got)
	}
	rc.Engine = "cpu"
	if got := mdRow(summary([]results.Record{line(10, 0, 1000)}), "gpus"); got != "none (engine cpu)" {
		t.Errorf("a run of engine cpu: gpus row %q", got)
	}
}
