package model

import "testing"

// The issue fixes the preset sizes: small 32.0M, base 101.7M parameters.
func TestPresetParameterCounts(t *testing.T) {
	for name, want := range map[string]float64{"small": 32.0e6, "base": 101.7e6} {
		c, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		got := float64(c.NumParams())
		if got < want-0.05e6 || got > want+0.05e6 {
			t.Errorf("%s: %d parameters, want %.1fM", name, c.NumParams(), want/1e6)
		}
	}
}
