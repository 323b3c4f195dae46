package runs

import "testing"

func TestSweepIsTheSeedPlansDenseShapes(t *testing.T) {
	s := Sweep()
	if len(s) != 8 {
		t.Fatalf("%d shapes, want 8", len(s))
	}
	want := []string{"v16384 d512 L8 16x512", "v16384 d512 L8 32x512", "v16384 d512 L8 16x1024",
		"v16384 d512 L12 16x512", "v16384 d768 L12 16x512", "small 32x1024", "base 32x1024", "small 8x1024"}
	for i, sh := range s {
		if sh.String() != want[i] {
			t.Errorf("shape %d = %s, want %s", i, sh, want[i])
		}
		c, err := sh.Config()
		if err != nil {
			t.Errorf("%s: %v", sh, err)
			continue
		}
		if c.HeadDim != 64 {
			t.Errorf("%s: head_dim %d; the GPU fast path needs 64", sh, c.HeadDim)
		}
	}
	// The first shape is the small preset's architecture at a smaller batch.
	c, _ := s[0].Config()
	if small, _ := s[5].Config(); c != small {
		t.Errorf("v16384 d512 L8 should equal small: %+v vs %+v", c, small)
	}
	if _, err := (Shape{Vocab: 100, DModel: 100, Layers: 2, Batch: 1, Seq: 8}).Config(); err == nil {
		t.Error("d_model 100 accepted")
	}
}
