package results

import (
	"bytes"
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// LossPlotSVG draws the training and evaluation losses against tokens seen
// as an SVG document (loss.svg).
func LossPlotSVG(run string, recs []Record) ([]byte, error) {
	train, eval := TrainCurve(recs), EvalCurve(recs)
	if len(train) == 0 && len(eval) == 0 {
		return nil, fmt.Errorf("plot run %s: metrics hold no loss yet", run)
	}
	p := plot.New()
	p.Title.Text = "kiln run " + run
	p.X.Label.Text = "tokens seen (millions)"
	p.Y.Label.Text = "loss (nats/token)"
	p.Add(plotter.NewGrid())
	p.Legend.Top = true

	add := func(pts []Point, name string, c color.Color, dashed bool) error {
		if len(pts) == 0 {
			return nil
		}
		pts = thin(pts, plotBuckets)
		xys := make(plotter.XYs, len(pts))
		for i, q := range pts {
			xys[i].X, xys[i].Y = float64(q.Tokens)/1e6, q.Loss
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return fmt.Errorf("plot run %s: %s: %w", run, name, err)
		}
		l.Color = c
		l.Width = vg.Points(1)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l)
		p.Legend.Add(name, l)
		if len(pts) == 1 {
			// A single point draws no line; a marker shows it exists.
			s, err := plotter.NewScatter(xys)
			if err != nil {
				return fmt.Errorf("plot run %s: %s: %w", run, name, err)
			}
			s.Color, s.Shape = c, draw.CircleGlyph{}
			p.Add(s)
		}
		return nil
	}
	if err := add(train, "train loss", color.RGBA{R: 31, G: 119, B: 180, A: 255}, false); err != nil {
		return nil, err
	}
	if err := add(eval, "eval loss", color.RGBA{R: 214, G: 39, B: 40, A: 255}, true); err != nil {
		return nil, err
	}
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "svg")
	if err != nil {
		return nil, fmt.Errorf("plot run %s: %w", run, err)
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("plot run %s: %w", run, err)
	}
	return buf.Bytes(), nil
}

// plotBuckets is how many stretches of the x axis a long curve is thinned
// to: about two a point of the plot's width, more than a screen shows.
const plotBuckets = 1200

// thin keeps, of a curve of more than two points a bucket, the lowest and
// the highest point of each of buckets equal runs of points, in their
// order: the line drawn is the same to the eye, every spike included, and
// a month's curve of 190,000 logged steps is a plot of kilobytes, not
// megabytes.
func thin(pts []Point, buckets int) []Point {
	if len(pts) <= 2*buckets {
		return pts
	}
	out := make([]Point, 0, 2*buckets)
	for b := range buckets {
		run := pts[b*len(pts)/buckets : (b+1)*len(pts)/buckets]
		lo, hi := 0, 0
		for i, q := range run {
			if q.Loss < run[lo].Loss {
				lo = i
			}
			if q.Loss > run[hi].Loss {
				hi = i
			}
		}
		out = append(out, run[min(lo, hi)])
		if lo != hi {
			out = append(out, run[max(lo, hi)])
		}
	}
	return out
}
