// Package bytesize reads the sizes a user writes on a command line or in a
// runs file, one way everywhere, as GNU tools read them: K, M, G and T
// (and KiB, MiB, GiB, TiB) are powers of 1024, KB, MB, GB and TB powers of
// 1000, in either case, with or without a space before the unit.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var units = []struct {
	suffix string
	mult   float64
}{
	{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// Parse reads a size in bytes: "50G", "512MiB", "2GB", "1.5 T", "4096".
// A negative size, NaN, one of 2^63 bytes or more (which would wrap
// negative), or a fraction without a unit larger than a byte ("1.5",
// "0.5B") is an error that quotes s and shows how to write one.
func Parse(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || v < 0 || v*mult >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is not a number of bytes with an optional unit, such as 50G or 512MiB "+
			"(K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB of 1000; at most 8 EiB)", s)
	}
	// A fraction of a byte has no meaning, and truncating it read "1.5"
	// as 1 byte and "0.5" as none: whoever wrote it meant a unit.
	if mult == 1 && v != math.Trunc(v) {
		return 0, fmt.Errorf("size %q is a fraction of a byte: give a unit, such as 1.5GB or 1.5GiB, or a whole number of bytes, such as 1500000000", s)
	}
	return int64(v * mult), nil
}

// Format writes n in binary units to a tenth (1.5 GiB, 4.1 MiB), or in
// bytes below a KiB: the units Parse reads back.
func Format(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
