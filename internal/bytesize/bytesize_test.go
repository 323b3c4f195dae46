package bytesize

import (
	"strings"
	"testing"
)

// One reading of every unit, in either case, with a space or without; and
// nothing that is not a size reads as one, least of all as 0 or a negative
// number, which callers take as no limit.
func TestParseReadsEveryUnitOneWay(t *testing.T) {
	for in, want := range map[string]int64{
		"4096": 4096, "3b": 3, "3B": 3, "0": 0,
		"50G": 50 << 30, "50g": 50 << 30, "50GiB": 50 << 30, "50 gib": 50 << 30, "50GB": 50e9, "50 gb": 50e9,
		"512M": 512 << 20, "512MiB": 512 << 20, "512MB": 512e6, "64K": 64 << 10, "64KiB": 64 << 10, "64KB": 64e3,
		"2T": 2 << 40, " 2 TiB ": 2 << 40, "2TB": 2e12, "1.5G": 3 << 29, "1.5GB": 1.5e9,
	} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "GB", "G", "-1", "-1GiB", "NaN", "nan", "NaNGiB", "Inf", "-Inf", "1e30T", "9.3e18", "8EiB9", "1.5 X"} {
		n, err := Parse(bad)
		if err == nil {
			t.Errorf("Parse(%q) = %d, want an error", bad, n)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, `"`+bad+`"`) || !strings.Contains(msg, "512MiB") {
			t.Errorf("Parse(%q): %q does not quote the input and say how to write a size", bad, msg)
		}
	}
}
