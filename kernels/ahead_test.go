package kernels

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// MetricsLater hands back each step's metrics after the next step has
// been queued and has rewritten the loss and the gradient norm on the
// device: equal to what Metrics read once the step was complete, the
// load-balancing loss and the experts' shares included; a third call
// reuses the first's slot, and the first's wait then says so.
func TestMetricsLaterOutlivesTheNextStep(t *testing.T) {
	skipWithoutGPU(t)
	moe := model.Presets["small"]
	moe.Experts, moe.ExpertsPerTok, moe.Intermediate, moe.RouterAuxCoef = 8, 2, 352, 0.02
	for _, x := range []struct {
		name string
		cfg  model.Config
	}{{"small", model.Presets["small"]}, {"small moe", moe}} {
		t.Run(x.name, func(t *testing.T) {
			const B, T = 2, 128
			e := newEngine(t, x.cfg, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
			if err := e.SetParams(model.InitParams(x.cfg, 3)); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			opt := model.AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1}
			step := func() {
				t.Helper()
				b := model.Batch{B: B, T: T, Inputs: make([]int32, B*T), Targets: make([]int32, B*T)}
				for i := range b.Inputs {
					b.Inputs[i], b.Targets[i] = int32(r.IntN(x.cfg.VocabSize)), int32(r.IntN(x.cfg.VocabSize))
				}
				if err := e.ZeroGrad(); err != nil {
					t.Fatal(err)
				}
				if err := e.ForwardBackward(b, 1); err != nil {
					t.Fatal(err)
				}
				if err := e.Step(opt); err != nil {
					t.Fatal(err)
				}
			}
			var waits []func() (model.StepMetrics, error)
			var want []model.StepMetrics
			for range 3 {
				step()
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
			if x.cfg.MoE() && (want[2].AuxLoss == 0 || len(want[2].ExpertShare) != x.cfg.Experts) {
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
		})
	}
}
