package results

import (
	"bytes"
	"strings"
	"testing"
)

func TestReadMetricsRewindsOnResume(t *testing.T) {
	// Steps 1-4 logged, then the worker died and the run resumed from a
	// checkpoint at step 2: steps 3 and 4 are logged again with new values.
	in := `{"step":1,"tokens":100,"loss":5}
{"step":2,"tokens":200,"loss":4}
{"step":2,"tokens":200,"eval_loss":4.5}
{"step":3,"tokens":300,"loss":3.9}
{"step":4,"tokens":400,"loss":3.8}
{"step":3,"tokens":300,"loss":3.7}
{"step":4,"tokens":400,"loss":3.6,"eval_loss":3.65}
`
	recs, err := ReadMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 {
		t.Fatalf("got %d records, want 4: %+v", len(recs), recs)
	}
	if got := *recs[2].Loss; got != 3.7 {
		t.Errorf("step 3 loss %v, want the resumed 3.7", got)
	}
	if recs[1].Loss == nil || *recs[1].Loss != 4 || recs[1].EvalLoss == nil || *recs[1].EvalLoss != 4.5 {
		t.Errorf("step 2 should merge train 4 and eval 4.5, got %+v", recs[1])
	}
	if ev := EvalCurve(recs); len(ev) != 2 || ev[1].Loss != 3.65 {
		t.Errorf("eval curve %+v", ev)
	}
}

func TestReadMetricsDropsTornLastLine(t *testing.T) {
	in := "{\"step\":1,\"loss\":5}\n{\"step\":2,\"lo"
	recs, err := ReadMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("got %d records, want 1", len(recs))
	}
}

func TestReadMetricsNamesBadLine(t *testing.T) {
	in := "{\"step\":1,\"loss\":5}\nnot json\n{\"step\":3,\"loss\":4}\n"
	_, err := ReadMetrics(strings.NewReader(in))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("want an error naming line 2, got %v", err)
	}
}

func TestWriteRecordRoundTrips(t *testing.T) {
	var buf bytes.Buffer
	for i := 1; i <= 3; i++ {
		if err := WriteRecord(&buf, Record{Step: i, Tokens: int64(i) * 10, Loss: F(float64(10 - i))}); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := ReadMetrics(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || *recs[2].Loss != 7 || recs[2].EvalLoss != nil {
		t.Fatalf("round trip: %+v", recs)
	}
}
