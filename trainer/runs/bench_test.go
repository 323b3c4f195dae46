package runs

import "testing"

// The tok/s gates of pilot and long are held to the sweep's row of their
// own step: the sweep must measure it.
func TestSweepMeasuresThePresetRunsSteps(t *testing.T) {
	set, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pilot", "long"} {
		run, err := set.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		rc := run.RunConfig
		found := false
		for _, sh := range Sweep() {
			found = found || sh.Model == rc.Model && sh.Batch == rc.Batch && sh.Seq == rc.Seq && sh.Accumulate == rc.Accumulate &&
				sh.MoE == "" && (sh.Precision == rc.Precision || sh.Precision == "" && rc.Precision == "bf16")
		}
		if !found {
			t.Errorf("the sweep has no shape for %s's step (%s %dx%d, accumulate %d, %s)", name, rc.Model, rc.Batch, rc.Seq, rc.Accumulate, rc.Precision)
		}
	}
}

func TestSweepIsTheSeedPlansShapes(t *testing.T) {
	s := Sweep()
	if len(s) != 10 {
		t.Fatalf("%d shapes, want 10", len(s))
	}
	const moe = " moe experts=8,top_k=2,d_ff=352"
	want := []string{"v16384 d512 L8 16x512", "v16384 d512 L8 32x512", "v16384 d512 L8 16x1024",
		"v16384 d512 L12 16x512", "v16384 d768 L12 16x512", "small 32x1024", "base 32x1024", "small 8x1024 accumulate 16",
		"v16384 d512 L8 16x512" + moe, "small 32x1024" + moe}
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
	// The seed plan's mixture of experts: 8 of 352, top 2, in small's layers.
	m, err := s[8].Config()
	if err != nil || m.Experts != 8 || m.ExpertsPerTok != 2 || m.Intermediate != 352 || m.Hidden != 512 || m.Layers != 8 {
		t.Errorf("%s: %+v, %v", s[8], m, err)
	}
	if _, err := (Shape{Model: "small", Batch: 1, Seq: 8, MoE: "experts=1"}).Config(); err == nil {
		t.Error("a mixture of one expert accepted")
	}
}
