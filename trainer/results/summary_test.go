package results

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
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
