package durlimit

import "testing"

func TestPastTellsSizeFromSpelling(t *testing.T) {
	for s, want := range map[string]bool{
		"3000000h":  true,
		"2562048h":  true,
		"-3000000h": true,
		"2562047h":  false, // in range
		"30s":       false,
		"1h30m":     false,
		"30":        false, // no unit
		"5 m":       false,
		"5mins":     false,
		"":          false,
		"h":         false,
	} {
		if got := Past(s); got != want {
			t.Errorf("Past(%q) = %v, want %v", s, got, want)
		}
	}
}
