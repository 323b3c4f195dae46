package results

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSummaryMarkdown(t *testing.T) {
	recs := curve(1000)
	for i := range recs {
		recs[i].TokPerSec = 40000 + float64(i%3)*1000
		recs[i].ElapsedS = float64(i+1) * 0.2
		recs[i].PeakMemory = 3 << 30
		recs[i].MFU = F(0.30 + float64(i%3)*0.01)
	}
	s := Summary{
		Run:        "pilot",
		Settings:   []Setting{{"model", "small"}, {"lr", "0.0004"}},
		Records:    recs,
		TotalSteps: 15258,
		Gates:      []Gate{SmoothGate(recs, 100), FallingGate(recs), GenerationGate([]int32{1, 2, 3, 4, 5}), ThroughputGate(41000, BenchRow{TokPerSec: 100000, Device: "NVIDIA H200"}, "pilot")},
		Sample:     "func main() {}",
	}
	f := s.Figures()
	if f.Steps != 1000 || f.TokensSeen != 1000*8192 || f.TokPerSec != 41000 || f.PeakMemory != 3<<30 {
		t.Fatalf("figures %+v", f)
	}
	if f.BestLoss > f.FinalLoss+0.05 || f.FirstEvalLoss <= f.FinalEvalLoss {
		t.Fatalf("losses %+v", f)
	}
	var b strings.Builder
	if err := s.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"# Run pilot", "| step ", "1000 / 15258", "8.19M", "41000", "3.00 GiB", "3m20s",
		"| smooth ", "| still falling ", "| sane generation ", "| tok/s vs bench ", "41%", "| fail ",
		"| lr ", "0.0004", "func main() {}",
		"| MFU ", "31.0%",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("summary.md lacks %q:\n%s", want, md)
		}
	}
}

func TestWriteFilesProducesSummaryAndPlot(t *testing.T) {
	dir := t.TempDir()
	s := Summary{Run: "demo", Records: curve(300), WallClock: 90 * time.Second}
	if err := s.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, SummaryFile))
	if err != nil || !strings.HasPrefix(string(md), "# Run demo") || !strings.Contains(string(md), "1m30s") {
		t.Fatalf("summary.md: %v %q", err, md)
	}
	svg, err := os.ReadFile(filepath.Join(dir, PlotFile))
	if err != nil {
		t.Fatal(err)
	}
	// The plot must be well-formed SVG with both curves drawn and named.
	dec := xml.NewDecoder(strings.NewReader(string(svg)))
	var root string
	paths := 0
	var text strings.Builder
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("loss.svg is not well-formed XML: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = e.Name.Local
			}
			if e.Name.Local == "path" {
				paths++
			}
		case xml.CharData:
			text.Write(e)
		}
	}
	if root != "svg" || paths < 4 {
		t.Fatalf("loss.svg: root %q, %d paths", root, paths)
	}
	for _, want := range []string{"train loss", "eval loss", "tokens seen"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("loss.svg has no text %q", want)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("want exactly summary.md and loss.svg, got %v", entries)
	}
}

func TestPlotWithoutLossesIsAnError(t *testing.T) {
	if _, err := LossPlotSVG("empty", []Record{{Step: 1}}); err == nil || !strings.Contains(err.Error(), "no loss") {
		t.Fatalf("want a clear error, got %v", err)
	}
}

// A month's curve (190,000 logged steps) is drawn from two points a
// stretch of the axis, the lowest and the highest: its spikes and its
// lowest loss stay in the plot, first and last too, and the file is a
// plot's size, not the curve's.
func TestALongCurveIsThinnedToWhatThePlotShows(t *testing.T) {
	const n = 190_000
	recs := make([]Record, n)
	for i := range recs {
		l := 8 - 5*float64(i)/n + 0.05*math.Sin(float64(i))
		switch i {
		case 123_457:
			l = 11 // a spike the smooth gate would see
		case 150_001:
			l = 0.5 // a dip
		}
		recs[i] = Record{Step: i + 1, Tokens: int64(i+1) * 8192, Loss: F(l)}
	}
	pts := TrainCurve(recs)
	kept := thin(pts, plotBuckets)
	if len(kept) > 2*plotBuckets || len(kept) < plotBuckets {
		t.Fatalf("thinned to %d points; want %d to %d", len(kept), plotBuckets, 2*plotBuckets)
	}
	has := func(step int) bool {
		return slices.ContainsFunc(kept, func(p Point) bool { return p.Step == step })
	}
	for _, step := range []int{123_458, 150_002} {
		if !has(step) {
			t.Errorf("step %d (a spike or a dip) is not in the thinned curve", step)
		}
	}
	if kept[0].Loss > pts[0].Loss+0.1 || kept[len(kept)-1].Loss < pts[n-1].Loss-0.1 {
		t.Errorf("thinned curve runs from %v to %v; the curve from %v to %v", kept[0], kept[len(kept)-1], pts[0], pts[n-1])
	}
	if !slices.IsSortedFunc(kept, func(a, b Point) int { return a.Step - b.Step }) {
		t.Error("thinned points are out of step order")
	}
	svg, err := LossPlotSVG("month", recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(svg) > 200_000 {
		t.Errorf("loss.svg of %d steps is %d bytes; want a plot's size", n, len(svg))
	}
	// A short curve is drawn whole.
	if short := pts[:2*plotBuckets]; len(thin(short, plotBuckets)) != len(short) {
		t.Error("a curve of two points a bucket was thinned")
	}
}

// One micro-batch of repetitive text can log a loss far below the model's
// level. The headline train-loss figures average LossWindow logged losses,
// so that such a step moves them by a tenth of its dip, and the table says
// what they are.
func TestTrainLossFiguresAverageLoggedLosses(t *testing.T) {
	var recs []Record
	for i := 1; i <= 30; i++ {
		l := 5 - 0.01*float64(i)
		if i == 12 {
			l = 1 // the dip
		}
		recs = append(recs, Record{Step: 10 * i, Loss: F(l)})
	}
	s := Summary{Run: "dip", Records: recs}
	f := s.Figures()
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	// The last ten: 5 - 0.01 * (21 ... 30). The lowest ten: the dip and
	// the nine after it, 5 - 0.01 * (13 ... 21), ending at step 210.
	if f.LossWindow != 10 || !near(f.FinalLoss, 4.745) || !near(f.BestLoss, 4.447) || f.BestLossStep != 210 {
		t.Fatalf("train-loss figures %+v: want final 4.745, best 4.447 to step 210 over 10", f)
	}
	table := s.Table()
	for _, want := range []string{"4.7450 (mean of the last 10 logged)", "4.4470 (10 logged, to step 210)"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}

	// Fewer logged losses than the window: all of them, said so.
	f = Summary{Records: recs[:3]}.Figures()
	if f.LossWindow != 3 || !near(f.FinalLoss, 4.98) || !near(f.BestLoss, 4.98) || f.BestLossStep != 30 {
		t.Fatalf("three logged losses: %+v", f)
	}
}
