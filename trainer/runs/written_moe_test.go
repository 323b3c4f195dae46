package runs

import (
	"strings"
	"testing"
)

const moeRun = `moe-a:
  model: tiny
  total_steps: 300
  mixture: [{store: gosrc}]
  moe: {experts: 4, top_k: 2, d_ff: 64}
  floor: 0.1
`

// A run whose moe: has nothing under it is refused, naming the run and the
// line, where it has no experts to turn off: it queued a dense run without
// a word. Under from: a run with experts it turns them off.
func TestEmptyMoEInARunsFile(t *testing.T) {
	for _, body := range []string{"moe:\n", "moe: ~\n"} {
		_, err := parse([]byte(moeRun+"x2:\n  model: tiny\n  total_steps: 2\n  "+body), "runs.yaml", Presets())
		want := "runs file runs.yaml: run x2: line 10: moe is empty: give its experts under it"
		if err == nil || !isBadInput(err) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("x2 with %q: %v; want bad input starting %q", body, err, want)
		}
	}
	s, err := parse([]byte(moeRun+"moe-d:\n  from: moe-a\n  moe: ~\n"), "runs.yaml", Presets())
	if err != nil {
		t.Fatal(err)
	}
	if s["moe-d"].MoE != nil || s["moe-a"].MoE == nil {
		t.Errorf("moe-d from moe-a with moe: ~ has experts %v, moe-a %v; want moe-d dense, moe-a as written", s["moe-d"].MoE, s["moe-a"].MoE)
	}
}

// A run from: another, changing a setting held by a pointer (moe:'s keys,
// floor, clip), leaves the other's as it was: the body was decoded into
// what the two shared, and moe-c's top_k 1 became moe-a's too, a shape its
// checkpoints would refuse.
func TestFromLeavesItsRunAlone(t *testing.T) {
	s, err := parse([]byte(moeRun+"moe-c:\n  from: moe-a\n  moe: {top_k: 1, aux_coef: 0}\n  floor: 0.2\n  clip: 0.5\n"+
		"pilot-b:\n  from: pilot\n  floor: 0.3\n  clip: 0.25\n"), "runs.yaml", Presets())
	if err != nil {
		t.Fatal(err)
	}
	a, c := s["moe-a"], s["moe-c"]
	if a.MoE.TopK != 2 || a.MoE.AuxCoef != nil || a.FloorOr() != 0.1 || a.Clip != nil {
		t.Errorf("moe-a after moe-c: experts %+v, floor %v, clip %v; want top_k 2, aux_coef and clip unset, floor 0.1", *a.MoE, a.FloorOr(), a.Clip)
	}
	if c.MoE.Experts != 4 || c.MoE.TopK != 1 || c.MoE.DFF != 64 || c.MoE.AuxCoef == nil || *c.MoE.AuxCoef != 0 || c.FloorOr() != 0.2 || c.ClipOr() != 0.5 {
		t.Errorf("moe-c: experts %+v, floor %v, clip %v; want moe-a's experts with top_k 1 and aux_coef 0, floor 0.2, clip 0.5", *c.MoE, c.FloorOr(), c.ClipOr())
	}
	if p := s["pilot"]; p.FloorOr() != 0.1 || p.ClipOr() != 1 {
		t.Errorf("pilot after pilot-b: floor %v, clip %v; want the preset's 0.1 and 1", p.FloorOr(), p.ClipOr())
	}
}
