package segment

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/results"
)

// gateRow is the row of gate name in summary.md, "" for none.
func gateRow(md, name string) string {
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "| "+name+" ") {
			return l
		}
	}
	return ""
}

func readSummary(t *testing.T, obj store.Store, run string) string {
	t.Helper()
	r, err := obj.Get(context.Background(), ResultsPrefix(run)+results.SummaryFile)
	if err != nil {
		t.Fatalf("results/%s/%s: %v", run, results.SummaryFile, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The summary.md of a run short of its total steps, which `sched results`
// prints, says the gates that judge the run's end are pending, at which
// step of how many, where they read as verdicts on the whole run; the
// run's last segment judges them all.
func TestTheGatesOfARunShortOfItsEndArePending(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	run := testRun("halfway", 8)
	run.Segment.MaxSteps = 4
	sample := func(context.Context, string) ([]int32, string, error) {
		ids := make([]int32, 64)
		for i := range ids {
			ids[i] = int32(i)
		}
		return ids, "func main() {}", nil
	}
	p := Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Sample: sample}
	out, err := Run(ctx, p)
	if err != nil || out.Done || out.Step != 4 {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	md := readSummary(t, obj, run.Name)
	for _, name := range []string{"still falling", "sane generation"} {
		if row := gateRow(md, name); !strings.Contains(row, "| pending ") || !strings.Contains(row, "the run is at step 4 of 8") {
			t.Errorf("the %s gate of a run at step 4 of 8: %q\n%s", name, row, md)
		}
	}
	// A curve without a spike yet is pending too; the rate is judged.
	if row := gateRow(md, "smooth"); !strings.Contains(row, "| pending ") {
		t.Errorf("the smooth gate of a run at step 4 of 8: %q", row)
	}
	if row := gateRow(md, "tok/s vs bench"); strings.Contains(row, "pending") || row == "" {
		t.Errorf("the throughput gate of a run at step 4 of 8: %q", row)
	}

	out, err = Run(ctx, p)
	if err != nil || !out.Done || out.Step != 8 {
		t.Fatalf("last segment: %+v %v", out, err)
	}
	md = readSummary(t, obj, run.Name)
	if strings.Contains(md, "pending") {
		t.Errorf("the summary of a run at its total steps has a pending gate:\n%s", md)
	}
	if row := gateRow(md, "sane generation"); !strings.Contains(row, "| pass ") {
		t.Errorf("the generation gate of the finished run: %q", row)
	}
}

// A finished run whose sample of its final model could not be drawn says
// why in its sane-generation gate, which `sched results` prints, where it
// said that a sample of 0 tokens was too short to judge.
func TestAGenerationGateWithoutItsSampleSaysWhy(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	run := testRun("nosample", 4)
	sample := func(context.Context, string) ([]int32, string, error) {
		return nil, "", errors.New("decode: id 279 at position 9 is not in the vocabulary of 275 tokens")
	}
	out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: newRedis(t), Objects: obj, OpenData: openStream, Sample: sample})
	if err != nil || !out.Done {
		t.Fatalf("segment: %+v %v", out, err)
	}
	if row := gateRow(readSummary(t, obj, run.Name), "sane generation"); !strings.Contains(row, "| unknown ") ||
		!strings.Contains(row, "no sample of the final model: decode: id 279 at position 9 is not in the vocabulary of 275 tokens") {
		t.Errorf("the generation gate of a run whose sample failed: %q", row)
	}
}
