package nearest

import "testing"

func TestDistanceCountsEachEditOnce(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "abc", 0}, {"", "abc", 3}, {"abc", "", 3},
		{"KILN_REDIS_ULR", "KILN_REDIS_URL", 1}, // a swap
		{"KILN_CUDA_GRPAH", "KILN_CUDA_GRAPH", 1},
		{"min_free_dsk", "min_free_disk", 1}, // a letter left out
		{"kitten", "sitting", 3}, {"flaw", "lawn", 2},
		{"ca", "abc", 3}, // no swap that is then edited again
	} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%q, %q) = %d; want %d", c.a, c.b, got, c.want)
		}
		if got := Distance(c.b, c.a); got != c.want {
			t.Errorf("Distance(%q, %q) = %d; want %d", c.b, c.a, got, c.want)
		}
	}
}
