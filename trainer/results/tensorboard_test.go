package results

import (
	"bytes"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/trainer/results/tfevents"
)

// readEvents decodes an event file with tfevents, a reader that shares no
// code with the writer.
func readEvents(t *testing.T, b []byte) []tfevents.Event {
	t.Helper()
	evs, err := tfevents.Read(b)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// Every scalar of every logged line comes back from the event file, at
// its step and wall time, behind the file-version event TensorBoard reads
// first.
func TestEventFilesHoldEveryScalar(t *testing.T) {
	began := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	recs := []Record{
		{Step: 0, EvalLoss: F(8.3)},
		{Step: 1, Tokens: 256, Loss: F(8.1), LR: 1e-4, GradNorm: 2.5, TokPerSec: 1500, ElapsedS: 0.5, PeakMemory: 3 << 30},
		{Step: 2, Tokens: 512, Loss: F(7.9), LR: 2e-4, GradNorm: 2.25, TokPerSec: 1600, MFU: F(0.31), EvalLoss: F(7.95), ElapsedS: 1.25, AuxLoss: F(2.5),
			EvalLossByStore: map[string]float64{"code": 7.5, "web": 8.25}},
	}
	var buf bytes.Buffer
	if err := WriteEvents(&buf, recs, began); err != nil {
		t.Fatal(err)
	}
	evs := readEvents(t, buf.Bytes())
	if len(evs) != 4 || evs[0].Version != "brain.Event:2" || evs[0].Wall != 1796126400 {
		t.Fatalf("events %+v; want the version event and three steps", evs)
	}
	want := []map[string]float32{
		{TagEvalLoss: 8.3},
		{TagLoss: 8.1, TagLR: 1e-4, TagGradNorm: 2.5, TagTokPerSec: 1500, TagPeakMemory: 3},
		{TagLoss: 7.9, TagLR: 2e-4, TagGradNorm: 2.25, TagTokPerSec: 1600, TagMFU: 0.31, TagEvalLoss: 7.95, TagAuxLoss: 2.5, "eval/loss/code": 7.5, "eval/loss/web": 8.25},
	}
	for i, e := range evs[1:] {
		if e.Step != int64(recs[i].Step) || e.Wall != 1796126400+recs[i].ElapsedS {
			t.Errorf("event %d: step %d wall %v; want step %d wall %v", i, e.Step, e.Wall, recs[i].Step, 1796126400+recs[i].ElapsedS)
		}
		if len(e.Values) != len(want[i]) {
			t.Errorf("event %d: %d values %v; want %v", i, len(e.Values), e.Values, want[i])
		}
		for tag, v := range want[i] {
			if e.Values[tag] != v {
				t.Errorf("event %d: %s = %v; want %v", i, tag, e.Values[tag], v)
			}
		}
	}
	if n := EventFileName(began, "gpu-1", 5); n != "events.out.tfevents.1796126400.gpu-1.step5" {
		t.Errorf("file name %q", n)
	}
	// The name reads back, a host with dots in it too; other names do not.
	for _, host := range []string{"gpu-1", "gpu.example.com", "h.step3"} {
		b, h, step, ok := ParseEventFileName(EventFileName(began, host, 5))
		if !ok || !b.Equal(began) || h != host || step != 5 {
			t.Errorf("ParseEventFileName of host %q: %v %q %d %v", host, b, h, step, ok)
		}
	}
	for _, name := range []string{"events.out.tfevents.1796126400.gpu-1.step5.tmp", "events.out.tfevents.1796126400.step5",
		"events.out.tfevents.x.gpu-1.step5", "events.out.tfevents.1796126400.gpu-1.step-5", "metrics.jsonl"} {
		if _, _, _, ok := ParseEventFileName(name); ok {
			t.Errorf("ParseEventFileName(%q) took it for an event file", name)
		}
	}
}
