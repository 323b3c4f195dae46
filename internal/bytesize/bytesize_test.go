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

// A bare number with a fraction, or one in bytes ("B"), is refused rather
// than truncated: "1.5" read as 1 byte and "0.5" as none. The message says
// how to write what was meant, and every other form reads as before.
func TestParseRefusesAFractionOfAByte(t *testing.T) {
	for _, bad := range []string{"1.5", "0.5", " 2.25 ", "1.5B", "0.5 b", "1e-3"} {
		n, err := Parse(bad)
		if err == nil {
			t.Errorf("Parse(%q) = %d, want an error", bad, n)
			continue
		}
		msg := err.Error()
		for _, want := range []string{`"` + bad + `"`, "fraction of a byte", "1.5GB", "1.5GiB", "1500000000"} {
			if !strings.Contains(msg, want) {
				t.Errorf("Parse(%q): %q lacks %q", bad, msg, want)
			}
		}
	}
	for in, want := range map[string]int64{"1.0": 1, "1e3": 1000, "2.0B": 2, "0.5K": 512, "1.1K": 1126, "0.5GB": 5e8, "1.5 T": 3 << 39} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

// Format writes sizes in the binary units Parse reads.
func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 4300 << 10: "4.2 MiB", 3 << 30: "3.0 GiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}
