package kernels

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// aheadEngine is an engine that runs a step ahead: Engine and Group.
type aheadEngine interface {
	model.Engine
	model.MetricsAhead
}

// MetricsLater hands back each step's metrics after the next step has
// been queued and has rewritten the loss and the gradient norm on the
// device: equal to what Metrics read once the step was complete, the
// load-balancing loss and the experts' shares included; a third call
// reuses the first's slot, and the first's wait then says so. The same
// for a group of one GPU.
func TestMetricsLaterOutlivesTheNextStep(t *testing.T) {
	skipWithoutGPU(t)
	moe := model.Presets["small"]
	moe.Experts, moe.ExpertsPerTok, moe.Intermediate, moe.RouterAuxCoef = 8, 2, 352, 0.02
	const B, T = 2, 128
	o := model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T}
	for _, x := range []struct {
		name string
		cfg  model.Config
	}{{"small", model.Presets["small"]}, {"small moe", moe}} {
		t.Run(x.name, func(t *testing.T) { metricsLater(t, newEngine(t, x.cfg, o), x.cfg, B, T) })
		t.Run(x.name+" group of one", func(t *testing.T) { metricsLater(t, newGroup(t, x.cfg, o, 1), x.cfg, B, T) })
	}
}

// metricsLater trains three steps of B x T on e, taking each step's
// metrics both ways, and checks them as TestMetricsLaterOutlivesTheNextStep
// says.
func metricsLater(t *testing.T, e aheadEngine, c model.Config, B, T int) {
	t.Helper()
	if err := e.SetParams(model.InitParams(c, 3)); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var waits []func() (model.StepMetrics, error)
	var want []model.StepMetrics
	for range 3 {
		b := randomBatch(c, B, T, c.VocabSize, r)
		if err := e.ZeroGrad(); err != nil {
			t.Fatal(err)
		}
		if err := e.ForwardBackward(b, 1); err != nil {
			t.Fatal(err)
		}
		if err := e.Step(benchAdamW); err != nil {
			t.Fatal(err)
		}
		w, err := e.MetricsLater()
		if err != nil {
			t.Fatal(err)
		}
		m, err := e.Metrics()
		if err != nil {
			t.Fatal(err)
		}
		waits, want = append(waits, w), append(want, m)
	}
	if want[0].Loss == want[1].Loss || want[1].GradNorm == want[2].GradNorm {
		t.Fatalf("consecutive steps' metrics are equal (%+v): the test cannot tell them apart", want)
	}
	if c.MoE() && (want[2].AuxLoss == 0 || len(want[2].ExpertShare) != c.Experts) {
		t.Fatalf("metrics %+v: no load-balancing loss or shares", want[2])
	}
	for i := 1; i < 3; i++ {
		got, err := waits[i]()
		if err != nil || !reflect.DeepEqual(got, want[i]) {
			t.Errorf("step %d: MetricsLater gave %+v, %v; Metrics %+v", i+1, got, err, want[i])
		}
	}
	if _, err := waits[0](); err == nil {
		t.Errorf("step 1's wait after two more MetricsLater calls returned no error")
	}
}
