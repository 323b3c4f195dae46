package results

import (
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Setting is one row of the configuration table, in the order given.
type Setting struct{ Key, Value string }

// Summary is everything summary.md reports about a run.
type Summary struct {
	Run      string
	Settings []Setting
	Records  []Record
	// TotalSteps is the run's planned length, for progress.
	TotalSteps int
	Gates      []Gate
	// Sample is a generated text shown under the gates, when there is one.
	Sample string
	// WallClock is the run's wall-clock across segments, when the caller
	// knows it better than the records do.
	WallClock time.Duration
}

// Figures are the headline numbers derived from the records.
type Figures struct {
	Steps      int
	TokensSeen int64
	// FinalLoss and BestLoss are means of LossWindow logged training
	// losses: the last ones, and the lowest such run of them (BestLossStep
	// its last step). One step's loss is one micro-batch's, and a batch of
	// repetitive text can read far below the model's level.
	FinalLoss      float64
	BestLoss       float64
	BestLossStep   int
	LossWindow     int
	FirstEvalLoss  float64
	FinalEvalLoss  float64
	BestEvalLoss   float64
	BestEvalStep   int
	TokPerSec      float64
	MFU            float64
	PeakMemory     int64
	WallClock      time.Duration
	HaveTrain      bool
	HaveEval       bool
	HaveThroughput bool

	// FewestGPUs and MostGPUs are the GPUs the logged rates were measured
	// on (1 where a line records none): each rate is all of theirs
	// together, MFU each one's.
	FewestGPUs, MostGPUs int

	// EvalStores and EvalLeftOut are the stores the last evaluation of a
	// run of several covered, and those it left out, holding no held-out
	// window (Record.EvalLeftOut).
	EvalStores, EvalLeftOut []string
}

// LossWindow is how many logged training losses the headline train-loss
// figures average.
const LossWindow = 10

// Figures computes the headline numbers. Throughput is the median of the
// logged tok/s, so that the first steps (compilation, cold caches) and a
// checkpoint upload do not move it.
func (s Summary) Figures() Figures {
	var f Figures
	var rates, mfus, losses []float64
	var steps []int
	for _, r := range s.Records {
		f.Steps = max(f.Steps, r.Step)
		f.TokensSeen = max(f.TokensSeen, r.Tokens)
		f.PeakMemory = max(f.PeakMemory, r.PeakMemory)
		f.WallClock = max(f.WallClock, time.Duration(r.ElapsedS*float64(time.Second)))
		if r.TokPerSec > 0 {
			rates = append(rates, r.TokPerSec)
			n := max(r.GPUs, 1)
			if f.FewestGPUs == 0 || n < f.FewestGPUs {
				f.FewestGPUs = n
			}
			f.MostGPUs = max(f.MostGPUs, n)
		}
		if r.MFU != nil {
			mfus = append(mfus, *r.MFU)
		}
		if r.Loss != nil {
			losses, steps = append(losses, *r.Loss), append(steps, r.Step)
		}
		if r.EvalLoss != nil {
			if !f.HaveEval {
				f.FirstEvalLoss = *r.EvalLoss
			}
			if !f.HaveEval || *r.EvalLoss < f.BestEvalLoss {
				f.BestEvalLoss, f.BestEvalStep = *r.EvalLoss, r.Step
			}
			f.FinalEvalLoss, f.HaveEval = *r.EvalLoss, true
			f.EvalStores, f.EvalLeftOut = slices.Sorted(maps.Keys(r.EvalLossByStore)), r.EvalLeftOut
		}
	}
	if len(losses) > 0 {
		f.HaveTrain = true
		f.LossWindow = min(LossWindow, len(losses))
		sum := 0.0
		for i, l := range losses {
			sum += l
			if i >= f.LossWindow {
				sum -= losses[i-f.LossWindow]
			}
			if i+1 < f.LossWindow {
				continue
			}
			m := sum / float64(f.LossWindow)
			if i+1 == f.LossWindow || m < f.BestLoss {
				f.BestLoss, f.BestLossStep = m, steps[i]
			}
			f.FinalLoss = m
		}
	}
	if len(rates) > 0 {
		f.TokPerSec, f.HaveThroughput = median(rates), true
	}
	if len(mfus) > 0 {
		f.MFU = median(mfus)
	}
	if s.WallClock > 0 {
		f.WallClock = s.WallClock
	}
	return f
}

// WriteMarkdown renders summary.md.
func (s Summary) WriteMarkdown(w io.Writer) error {
	f := s.Figures()
	var b strings.Builder
	fmt.Fprintf(&b, "# Run %s\n\n", s.Run)

	b.WriteString("## Results\n\n")
	table(&b, []string{"", ""}, s.resultRows(f))

	if len(s.Gates) > 0 {
		b.WriteString("\n## Gates\n\n")
		var rows [][]string
		for _, g := range s.Gates {
			rows = append(rows, []string{g.Name, formatValue(g), g.Limit, string(g.Verdict), g.Detail})
		}
		table(&b, []string{"gate", "value", "limit", "verdict", "detail"}, rows)
	}

	if len(s.Settings) > 0 {
		b.WriteString("\n## Configuration\n\n")
		var rows [][]string
		for _, st := range s.Settings {
			rows = append(rows, []string{st.Key, st.Value})
		}
		table(&b, []string{"setting", "value"}, rows)
	}

	if s.Sample != "" {
		b.WriteString("\n## Sample\n\n```\n")
		b.WriteString(strings.ReplaceAll(s.Sample, "```", "` ` `"))
		b.WriteString("\n```\n")
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write summary of run %s: %w", s.Run, err)
	}
	return nil
}

// Table renders the results table alone, for a terminal.
func (s Summary) Table() string {
	var b strings.Builder
	table(&b, []string{"", ""}, s.resultRows(s.Figures()))
	return b.String()
}

// LoweredTotal says why a run ended at step at, past its total steps: its
// length was lowered below at after the segment that trained to at began,
// as that segment trained (it keeps the length it began with) or once it
// had stopped (a cancelled or failed run then queued again ends at its
// checkpoint).
func LoweredTotal(at, total int) string {
	return fmt.Sprintf("the run's length was lowered to %d after the segment that trained to step %d began, while it trained or after it stopped; the run ended there", total, at)
}

func (s Summary) resultRows(f Figures) [][]string {
	na := "n/a"
	step := fmt.Sprint(f.Steps)
	switch {
	case s.TotalSteps > 0 && f.Steps > s.TotalSteps:
		// A segment reads the run's total as it begins: one lowered
		// meanwhile below the step it trains to ends the run at the
		// segment's end, past it; one lowered after the run stopped
		// (cancelled, or failed) ends it at its checkpoint, where a
		// segment queued then trains no step. "1500 / 800" read as a
		// broken run. The same words as `sched status` (stepOfTotal).
		step = fmt.Sprintf("%d, past its total_steps of %d: %s", f.Steps, s.TotalSteps, LoweredTotal(f.Steps, s.TotalSteps))
	case s.TotalSteps > 0:
		step = fmt.Sprintf("%d / %d", f.Steps, s.TotalSteps)
	}
	rows := [][]string{{"step", step}, {"tokens seen", humanCount(float64(f.TokensSeen))}}
	final, best := na, na
	if f.HaveTrain {
		final = fmt.Sprintf("%.4f (mean of the last %d logged)", f.FinalLoss, f.LossWindow)
		best = fmt.Sprintf("%.4f (%d logged, to step %d)", f.BestLoss, f.LossWindow, f.BestLossStep)
	}
	rows = append(rows, []string{"final train loss", final}, []string{"best train loss", best})
	firstE, finalE, bestE := na, na, na
	if f.HaveEval {
		firstE = fmt.Sprintf("%.4f", f.FirstEvalLoss)
		finalE = fmt.Sprintf("%.4f", f.FinalEvalLoss)
		bestE = fmt.Sprintf("%.4f (step %d)", f.BestEvalLoss, f.BestEvalStep)
	}
	rows = append(rows, []string{"first eval loss", firstE}, []string{"final eval loss", finalE}, []string{"best eval loss", bestE})
	if len(f.EvalLeftOut) > 0 {
		// Said where it happens: nothing else tells a mixed eval loss of
		// some of the stores from one of all of them.
		them := "it"
		if len(f.EvalLeftOut) > 1 {
			them = "them"
		}
		rows = append(rows, []string{"eval loss covers", fmt.Sprintf("%s alone: %s held no held-out window (too few tokens), and the eval losses and the gates leave %s out; ingest more into %s",
			strings.Join(f.EvalStores, ", "), strings.Join(f.EvalLeftOut, ", "), them, them)})
	}
	tps, mfu := na, na
	if f.HaveThroughput {
		tps = fmt.Sprintf("%.0f", f.TokPerSec)
	}
	switch {
	case f.MostGPUs > 1 && f.FewestGPUs == f.MostGPUs:
		tps += fmt.Sprintf(" (all %d GPUs together; MFU is each GPU's)", f.MostGPUs)
	case f.MostGPUs > 1:
		tps += fmt.Sprintf(" (each logged rate all its GPUs together, %d to %d; MFU is each GPU's)", f.FewestGPUs, f.MostGPUs)
	}
	if f.MFU > 0 {
		mfu = fmt.Sprintf("%.1f%%", f.MFU*100)
	}
	mem := na
	if f.PeakMemory > 0 {
		mem = fmt.Sprintf("%.2f GiB", float64(f.PeakMemory)/(1<<30))
	}
	wall := na
	if f.WallClock > 0 {
		wall = f.WallClock.Round(time.Second).String()
	}
	rows = append(rows, []string{"tok/s (median)", tps}, []string{"MFU", mfu}, []string{"peak memory", mem},
		[]string{"wall-clock", wall})
	return rows
}

func formatValue(g Gate) string {
	if g.Verdict == Unknown || g.Verdict == Pending {
		return "-"
	}
	switch g.Name {
	case "sane generation", "tok/s vs bench":
		return fmt.Sprintf("%.0f%%", g.Value*100)
	case "smooth":
		return fmt.Sprintf("%.2fx", g.Value)
	}
	return fmt.Sprintf("%.4g", g.Value)
}

func humanCount(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e9:
		return fmt.Sprintf("%.2fB", v/1e9)
	case a >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case a >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// table writes a Markdown table whose columns are padded so that it also
// reads well as plain text on a terminal.
func table(b *strings.Builder, head []string, rows [][]string) {
	width := make([]int, len(head))
	for i, h := range head {
		width[i] = max(len(h), 3)
	}
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len(escape(c)))
		}
	}
	line := func(cells []string) {
		b.WriteString("|")
		for i, c := range cells {
			fmt.Fprintf(b, " %-*s |", width[i], escape(c))
		}
		b.WriteString("\n")
	}
	line(head)
	sep := make([]string, len(head))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
}

func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// WriteFiles writes summary.md and loss.svg into dir, each through a
// temporary file and a rename so that a reader never sees half a file.
// metrics.jsonl is the trainer's to append; it is not touched here.
func (s Summary) WriteFiles(dir string) error {
	var md strings.Builder
	if err := s.WriteMarkdown(&md); err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, SummaryFile), []byte(md.String())); err != nil {
		return err
	}
	svg, err := LossPlotSVG(s.Run, s.Records)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, PlotFile), svg)
}

// The files of a results directory (results/<run>/ in object storage).
const (
	MetricsFile = "metrics.jsonl"
	SummaryFile = "summary.md"
	PlotFile    = "loss.svg"
)

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
