package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
)

// formatRate writes a rate with its unit per second, scaled to be read at
// a glance: "1.2M tok/s", "89.1 MB/s", "3.40 tasks/s". unit is what is
// counted ("tok", "B" for bytes, "files"); a trailing "/s" is accepted.
func formatRate(v float64, unit string) string {
	unit = strings.TrimSuffix(unit, "/s")
	if unit == "" {
		unit = "units"
	}
	return scaled(v, unit) + "/s"
}

// formatBytes is a byte count in SI units: "512 B", "89.1 MB".
func formatBytes(n int64) string { return scaled(float64(n), "B") }

// formatCount is a count in SI units with its noun: "5.8M tok".
func formatCount(n int64, noun string) string { return scaled(float64(n), noun) }

// scaled writes v with an SI prefix and three significant digits; bytes
// take the prefix on the unit ("MB"), other units after the number ("1.2M tok").
func scaled(v float64, unit string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "? " + unit
	}
	x, prefix := v, ""
	if math.Abs(v) >= 1000 {
		// Rounded to three digits first, so 999.96M reads 1.0G, not 1000M;
		// below 1000 ComputeSI would give milli-tokens.
		e := math.Pow(10, math.Floor(math.Log10(math.Abs(v)))-2)
		x, prefix = humanize.ComputeSI(math.Round(v/e) * e)
	}
	var num string
	switch ax := math.Abs(x); {
	case prefix == "" && ax == math.Trunc(ax):
		num = fmt.Sprintf("%.0f", x)
	case ax >= 100:
		num = fmt.Sprintf("%.0f", x)
	case ax >= 1 || prefix != "":
		num = fmt.Sprintf("%.1f", x)
	default:
		num = fmt.Sprintf("%.2f", x)
	}
	if unit == "B" {
		return num + " " + prefix + "B"
	}
	return num + prefix + " " + unit
}

// formatETA is a time left, to the second under an hour and to the
// minute above: "42s", "12m5s", "3h33m", "2d4h".
func formatETA(d time.Duration) string {
	switch {
	case d < time.Second:
		return "<1s"
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// formatAge is how long ago t was, as formatETA writes durations.
func formatAge(t, now time.Time) string {
	if now.Sub(t) < time.Second {
		return "just now"
	}
	return formatETA(now.Sub(t)) + " ago"
}

// bar draws a progress bar of width cells for fraction f in [0,1].
func bar(f float64, width int) string {
	f = min(max(f, 0), 1)
	full := int(math.Round(f * float64(width)))
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", width-full) + "]"
}
