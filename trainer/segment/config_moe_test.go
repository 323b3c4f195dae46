package segment

import (
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
)

// A run with a mixture of experts says so in its summary's configuration
// table, its absent fields at the defaults it trained with, where its
// model's name alone read as the dense preset; a dense run's table has no
// such row.
func TestTheSummaryNamesARunsExperts(t *testing.T) {
	md := func(moe *trainer.MoEConfig) string {
		r := testRun("summary-moe", 60)
		r.RunConfig.MoE = moe
		rc := r.RunConfig.WithDefaults()
		s := results.Summary{Run: r.Name, Settings: Settings(r, rc, "fp32", nil), TotalSteps: 60}
		var b strings.Builder
		if err := s.WriteMarkdown(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	for _, c := range []struct {
		moe  *trainer.MoEConfig
		want string
	}{
		{&trainer.MoEConfig{Experts: 4}, "4 experts, top 2, d_ff 176, aux_coef 0.02"},
		{&trainer.MoEConfig{Experts: 8, TopK: 1, DFF: 64, AuxCoef: trainer.Float(0)}, "8 experts, top 1, d_ff 64, aux_coef 0"},
	} {
		got := md(c.moe)
		if row := mdRow(got, "moe"); row != c.want {
			t.Errorf("a run with moe %s: moe row %q, want %q\n%s", c.moe, row, c.want, got)
		}
		if m, e := strings.Index(got, "| model "), strings.Index(got, "| moe "); m < 0 || e < m || strings.Count(got[m:e], "\n") != 1 {
			t.Errorf("a run with moe %s: its moe row is not under its model's\n%s", c.moe, got)
		}
	}
	dense := md(nil)
	if strings.Contains(dense, "| moe ") || mdRow(dense, "model") != "tiny" {
		t.Errorf("a dense run's configuration:\n%s", dense)
	}
}
