package model

import (
	"strings"
	"testing"
)

// A run that names no number of GPUs trains on the most of them that a
// step's micro-batches split evenly over: the count divides accumulate, is
// no more than the GPUs there are, and no larger count up to them does.
func TestDividingGPUsIsTheLargestCountThatDividesAccumulate(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for acc := 1; acc <= 32; acc++ {
			d := DividingGPUs(n, acc)
			if d < 1 || d > n || acc%d != 0 {
				t.Fatalf("DividingGPUs(%d, %d) = %d: want a divisor of %d between 1 and %d", n, acc, d, acc, n)
			}
			for larger := d + 1; larger <= n; larger++ {
				if acc%larger == 0 {
					t.Fatalf("DividingGPUs(%d, %d) = %d, but %d GPUs divide accumulate %d too", n, acc, d, larger, acc)
				}
			}
		}
	}
	if d := DividingGPUs(3, 16); d != 2 {
		t.Errorf("3 GPUs, accumulate 16: %d, want 2", d)
	}
	// An accumulate not known, or no GPU, leaves the count as it is.
	if d := DividingGPUs(3, 0); d != 3 {
		t.Errorf("3 GPUs, accumulate not known: %d, want 3", d)
	}
	if d := DividingGPUs(0, 16); d != 0 {
		t.Errorf("no GPU, accumulate 16: %d, want 0", d)
	}
}

// The notice says how many GPUs the run trains on and what makes it use
// them all: an accumulate that is a multiple of their number.
func TestFewerGPUsNoticeSaysWhatToSet(t *testing.T) {
	got := FewerGPUsNotice("gpus all: this process sees 3 GPUs", 3, 2, 16)
	for _, want := range []string{"gpus all: this process sees 3 GPUs", "accumulate 16", "training on 2", "multiple of 3", "15 or 18", "gpus 2"} {
		if !strings.Contains(got, want) {
			t.Errorf("notice %q does not say %q", got, want)
		}
	}
	if got := FewerGPUsNotice("x", 4, 2, 2); !strings.Contains(got, "such as 4 ") {
		t.Errorf("accumulate 2 on 4 GPUs: %q, want the one multiple above, 4", got)
	}
}
