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

// The first stretch's file is made only where lines before the earliest
// file's first step are in none, and TensorBoard, reading a directory's
// files in the order of their names, reads it before the others.
func TestFirstStretchOnlyWhereNoFileHoldsTheRunsFirstSteps(t *testing.T) {
	loss := 2.5
	line := func(step int, elapsed float64) Record { return Record{Step: step, Loss: &loss, ElapsedS: elapsed} }
	recs := []Record{line(1, 3), line(2, 70.2), line(3, 1), line(4, 2)}
	began := time.Unix(1_800_000_000, 0)
	later := EventFile{Name: EventFileName(began, "gpu", 2), Began: began, From: 2}
	resumed := EventFile{Name: EventFileName(began.Add(time.Hour), "gpu", 3), Began: began.Add(time.Hour), From: 3}

	for _, c := range []struct {
		what  string
		files []EventFile
		recs  []Record
	}{
		{"no file", nil, recs},
		{"the first file begins at step 0", []EventFile{resumed, {Name: EventFileName(began, "gpu", 0), Began: began}}, recs},
		{"no line before the earliest file", []EventFile{later}, recs[2:]},
	} {
		if f, ok := FirstStretch(c.files, c.recs); ok {
			t.Errorf("%s: a first stretch %+v", c.what, f)
		}
	}

	f, ok := FirstStretch([]EventFile{resumed, later}, recs)
	if !ok || f.From != 0 {
		t.Fatalf("steps 1 and 2 in no file: %+v, %v; want a file from step 0", f, ok)
	}
	// 71 s of the stretch's own before the earliest file's start, and one
	// more: its lines' wall times come before that file's.
	if want := began.Add(-72 * time.Second); !f.Began.Equal(want) {
		t.Errorf("began %v; want %v", f.Began, want)
	}
	if f.Name >= later.Name {
		t.Errorf("%s sorts after %s, the earliest file's name", f.Name, later.Name)
	}
	if end := StretchEnd([]EventFile{resumed, later, f}, f, 4); end != 2 {
		t.Errorf("the first stretch ends at step %d; want 2, where the earliest file begins", end)
	}
	if again, _ := FirstStretch([]EventFile{resumed, later}, recs); again != f {
		t.Errorf("a second call gives %+v; want the same file %+v", again, f)
	}

	// The first segment's own file, which another worker's disk held while
	// this one made the first stretch's, reaches the store later: of the
	// two, begun in any order or in the same second, one holds the stretch
	// and the other no step (step 0's evaluation included), and is removed.
	for _, own := range []EventFile{
		{Name: EventFileName(f.Began.Add(-time.Second), "gpu-a", 0), Began: f.Began.Add(-time.Second)},
		{Name: EventFileName(f.Began, "gpu-a", 0), Began: f.Began},
		{Name: EventFileName(f.Began, "zz", 0), Began: f.Began},
		{Name: EventFileName(f.Began.Add(time.Second), "gpu-a", 0), Began: f.Began.Add(time.Second)},
	} {
		files := []EventFile{own, f, later, resumed}
		var held []int
		for _, g := range files[:2] {
			n, err := WriteEventStretch(&bytes.Buffer{}, append([]Record{line(0, 0)}, recs...), g.From, StretchEnd(files, g, 4), g.Began)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, n)
		}
		if min(held[0], held[1]) != 0 || max(held[0], held[1]) != 3 {
			t.Errorf("%s beside %s: they hold %v lines; want 3 (steps 0 to 2) in one, none in the other", own.Name, f.Name, held)
		}
	}
}
