// Package results turns a run's metrics.jsonl into what a person reads: the
// summary.md tables, the loss-curve plot, the pilot's gates with their
// numbers and verdicts, and the bench sweep table.
package results

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/kiln-lm/kiln/trainer"
)

// Record is one line of metrics.jsonl: trainer.Metrics, the type that
// writes it.
type Record = trainer.Metrics

// F returns a pointer to v, for building records.
func F(v float64) *float64 { return &v }

// ReadMetrics reads metrics.jsonl. A run resumed from a checkpoint logs the
// steps after that checkpoint again, so a line whose step is lower than one
// already read rewinds the series to that step: the resumed trajectory
// replaces the lost one, and lines for the same step merge (later fields
// win). A last line without its newline is what a killed writer leaves; it
// is dropped when it does not parse, as nothing after it can depend on it.
func ReadMetrics(r io.Reader) ([]Record, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var out []Record
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read metrics line %d: %w", line, err)
		}
		complete := err == nil
		if t := bytes.TrimSpace(b); len(t) > 0 {
			var rec Record
			if jerr := json.Unmarshal(t, &rec); jerr != nil {
				if !complete {
					break
				}
				return nil, fmt.Errorf("metrics line %d is not a JSON record (%v): fix or delete that line", line, jerr)
			}
			out = merge(out, rec)
		}
		if !complete {
			break
		}
	}
	return out, nil
}

func merge(out []Record, rec Record) []Record {
	// Records are sorted by step, so the rewind point is a binary search.
	i := sort.Search(len(out), func(i int) bool { return out[i].Step >= rec.Step })
	if i < len(out) && out[i].Step == rec.Step {
		prev := out[i]
		out = out[:i]
		if rec.Loss == nil {
			rec.Loss = prev.Loss
		}
		if rec.EvalLoss == nil {
			rec.EvalLoss, rec.EvalLossByStore, rec.EvalLeftOut = prev.EvalLoss, prev.EvalLossByStore, prev.EvalLeftOut
		}
		if rec.Tokens == 0 {
			rec.Tokens = prev.Tokens
		}
		if rec.TokPerSec == 0 {
			rec.TokPerSec = prev.TokPerSec
		}
		if rec.LR == 0 {
			rec.LR = prev.LR
		}
		if rec.MFU == nil {
			rec.MFU = prev.MFU
		}
		if rec.GradNorm == 0 {
			rec.GradNorm = prev.GradNorm
		}
		if rec.ElapsedS == 0 {
			rec.ElapsedS = prev.ElapsedS
		}
		rec.PeakMemory = max(rec.PeakMemory, prev.PeakMemory)
	}
	return append(out[:i], rec)
}

// WriteRecord appends one record as a JSON line.
func WriteRecord(w io.Writer, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode metrics step %d: %w", rec.Step, err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write metrics step %d: %w", rec.Step, err)
	}
	return nil
}

// Point is one (tokens, loss) pair of a curve.
type Point struct {
	Step   int
	Tokens int64
	Loss   float64
}

// TrainCurve returns the training losses in step order.
func TrainCurve(recs []Record) []Point {
	var pts []Point
	for _, r := range recs {
		if r.Loss != nil {
			pts = append(pts, Point{r.Step, r.Tokens, *r.Loss})
		}
	}
	return pts
}

// EvalCurve returns the evaluation losses in step order.
func EvalCurve(recs []Record) []Point {
	var pts []Point
	for _, r := range recs {
		if r.EvalLoss != nil {
			pts = append(pts, Point{r.Step, r.Tokens, *r.EvalLoss})
		}
	}
	return pts
}
