package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
)

// Tolerances bound how far an engine's one training step may land from the
// reference written by transformers (see Verify).
type Tolerances struct {
	// LossRel: |loss - want| <= LossRel x |want|.
	LossRel float64
	// LogitsRel, GradRel: per tensor, max |x - want| <= Rel x max |want|.
	// The gradient norm is held to GradRel relative as well.
	LogitsRel, GradRel float64
	// Significant: a gradient element counts as significant when its
	// magnitude exceeds Significant x its tensor's largest magnitude.
	Significant float64
	// WeightAbs bounds the weights after the step where the gradient is
	// significant; elsewhere they may differ by up to WeightLRs x lr, since
	// Adam's first step moves a weight by about lr x sign(gradient) and
	// summation order may flip the sign of a gradient near zero.
	WeightAbs, WeightLRs float64
}

// FP32Tolerances are the reference's bounds, fixed by the project: loss
// within 1e-5 relative, gradients within 1e-4 of their largest magnitude,
// weights within 1e-6 where the gradient exceeds 1e-4 of its tensor's
// largest magnitude and within 2 x lr elsewhere. Logits are held to the
// gradients' bound.
var FP32Tolerances = Tolerances{LossRel: 1e-5, LogitsRel: 1e-4, GradRel: 1e-4, Significant: 1e-4, WeightAbs: 1e-6, WeightLRs: 2}

// BF16Tolerances are the defaults for --precision bf16. bf16 keeps 8
// mantissa bits (relative rounding 2^-9 ~ 2e-3 per element); a dot product
// of K rounded terms errs by about 2^-9 x sqrt(K) of its scale, 2e-3 to
// 5e-3 for the widths trained here, and two layers of forward and backward
// GEMMs stay under 1e-2 of each tensor's largest value: logits and gradients
// are held to 3e-2. The loss is a mean over every position, so its errors
// average out: 5e-3. Weights after Adam's first step depend on the
// gradient's sign only, so where the gradient is clearly non-zero (3e-2 of
// its tensor's largest) they still agree to float rounding.
var BF16Tolerances = Tolerances{LossRel: 5e-3, LogitsRel: 3e-2, GradRel: 3e-2, Significant: 3e-2, WeightAbs: 1e-5, WeightLRs: 2}

// TolerancesFor returns the default tolerances of a precision.
func TolerancesFor(precision string) (Tolerances, error) {
	switch precision {
	case "fp32":
		return FP32Tolerances, nil
	case "bf16", "":
		return BF16Tolerances, nil
	}
	return Tolerances{}, fmt.Errorf("unknown precision %q: choose fp32 or bf16", precision)
}

// Expected is a golden directory's expected.json.
type Expected struct {
	Loss float64 `json:"loss"`
	// AuxLoss is a Mixtral golden's load-balancing loss alone (Loss
	// includes router_aux_loss_coef x AuxLoss); nil for a dense model.
	AuxLoss  *float64 `json:"aux_loss"`
	GradNorm float64  `json:"grad_norm_before_clip"`
	Clip     float64  `json:"clip"`
	AdamW    struct {
		LR          float64 `json:"lr"`
		Beta1       float64 `json:"beta1"`
		Beta2       float64 `json:"beta2"`
		Eps         float64 `json:"eps"`
		WeightDecay float64 `json:"weight_decay"`
	} `json:"adamw"`
	Batch int `json:"batch"`
	Seq   int `json:"seq"`
}

// TensorCheck is one parameter's comparison.
type TensorCheck struct {
	Name string
	// GradErr is the largest |grad - want|; GradTol its bound.
	GradErr, GradTol float64
	// WeightErr is the largest weight error where the gradient is
	// significant, WeightRestErr elsewhere; each with its bound.
	WeightErr, WeightTol         float64
	WeightRestErr, WeightRestTol float64
	Pass                         bool
}

// VerifyReport is the outcome of one Verify.
type VerifyReport struct {
	Dir, Engine, Precision string
	Tol                    Tolerances
	Loss, WantLoss         float64
	GradNorm, WantGradNorm float64
	LogitsErr, LogitsTol   float64
	// AuxLoss is the load-balancing loss, checked (at the loss tolerance)
	// when the golden gives WantAuxLoss.
	AuxLoss     float64
	WantAuxLoss *float64
	// LossOK, GradNormOK, LogitsOK and AuxOK are the whole-model comparisons.
	LossOK, GradNormOK, LogitsOK, AuxOK bool
	Tensors                             []TensorCheck
	Pass                                bool
}

// VerifyOptions select the engine under test.
type VerifyOptions struct {
	Engine    string // cpu, cuda or auto
	Precision string // fp32 or bf16
	// ForceSM80 makes the CUDA engine build its sm_80 path on a newer GPU.
	ForceSM80 bool
	// Tol overrides the precision's default tolerances when set.
	Tol *Tolerances
	// Log receives notices such as an "auto" fallback.
	Log func(string)
}

// golden is a loaded golden directory.
type golden struct {
	cfg      Config
	params   *Params
	batch    Batch
	logits   []float32
	grads    *Params
	after    *Params
	expected Expected
}

// goldenFiles are the files a golden directory holds.
var goldenFiles = []string{"config.json", "model.safetensors", "batch.safetensors", "grads.safetensors", "after_adamw_step.safetensors", "expected.json"}

func loadGolden(dir string) (*golden, error) {
	g := &golden{}
	for _, name := range goldenFiles {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return nil, &FormatError{Path: dir, Msg: fmt.Sprintf("golden directory has no %s (%v): it needs %s, as the reference's script writes them", name, errors.Unwrap(err), strings.Join(goldenFiles, ", "))}
		}
	}
	var err error
	if g.cfg, err = ReadConfig(filepath.Join(dir, "config.json")); err != nil {
		return nil, err
	}
	exPath := filepath.Join(dir, "expected.json")
	b, err := os.ReadFile(exPath)
	if err != nil {
		return nil, fmt.Errorf("golden directory %s: %w (it needs %s)", dir, err, strings.Join(goldenFiles, ", "))
	}
	if err := json.Unmarshal(b, &g.expected); err != nil {
		return nil, &FormatError{Path: exPath, Msg: "not valid JSON: " + err.Error()}
	}
	// A value left out would be compared as 0 (or train with lr 0): each
	// must be there.
	var top, adamw map[string]json.RawMessage
	_ = json.Unmarshal(b, &top)
	_ = json.Unmarshal(top["adamw"], &adamw)
	for _, k := range []string{"loss", "grad_norm_before_clip", "clip", "adamw"} {
		if _, ok := top[k]; !ok {
			return nil, &FormatError{Path: exPath, Msg: fmt.Sprintf("has no %q: it needs loss, grad_norm_before_clip, clip and adamw (lr, beta1, beta2, eps, weight_decay)", k)}
		}
	}
	for _, k := range []string{"lr", "beta1", "beta2", "eps", "weight_decay"} {
		if _, ok := adamw[k]; !ok {
			return nil, &FormatError{Path: exPath, Msg: fmt.Sprintf("has no adamw.%s: adamw needs lr, beta1, beta2, eps and weight_decay", k)}
		}
	}
	if g.params, err = LoadParams(filepath.Join(dir, "model.safetensors"), g.cfg); err != nil {
		return nil, err
	}
	if g.grads, err = LoadParams(filepath.Join(dir, "grads.safetensors"), g.cfg); err != nil {
		return nil, err
	}
	if g.after, err = LoadParams(filepath.Join(dir, "after_adamw_step.safetensors"), g.cfg); err != nil {
		return nil, err
	}
	bPath := filepath.Join(dir, "batch.safetensors")
	bf, err := ReadSafetensors(bPath)
	if err != nil {
		return nil, err
	}
	ids := bf.Tensor("input_ids")
	if ids == nil || len(ids.Shape) != 2 || ids.DType != I32 {
		return nil, &FormatError{Path: bPath, Msg: "needs input_ids, I32 of shape [batch, seq]"}
	}
	B, T := ids.Shape[0], ids.Shape[1]
	in, _ := ids.Int32s()
	for i, id := range in {
		if id < 0 || int(id) >= g.cfg.VocabSize {
			return nil, &FormatError{Path: bPath, Msg: fmt.Sprintf("input_ids holds %d at position %d, outside config.json's vocab_size %d: the batch is not this model's", id, i, g.cfg.VocabSize)}
		}
	}
	// The loss is taken on logits[:, :-1] against input_ids[:, 1:].
	tg := make([]int32, len(in))
	for bi := 0; bi < B; bi++ {
		for t := 0; t < T; t++ {
			if t+1 < T {
				tg[bi*T+t] = in[bi*T+t+1]
			} else {
				tg[bi*T+t] = -1
			}
		}
	}
	g.batch = Batch{B: B, T: T, Inputs: in, Targets: tg}
	lt := bf.Tensor("logits")
	if lt == nil {
		return nil, &FormatError{Path: bPath, Msg: fmt.Sprintf("needs logits, F32 of shape [%d, %d, %d], the reference's output for input_ids", B, T, g.cfg.VocabSize)}
	}
	if !slices.Equal(lt.Shape, []int{B, T, g.cfg.VocabSize}) {
		return nil, &ShapeError{Path: bPath, Tensor: "logits", Want: []int{B, T, g.cfg.VocabSize}, Got: lt.Shape}
	}
	if g.logits, err = lt.Float32s(); err != nil {
		return nil, &FormatError{Path: bPath, Msg: err.Error()}
	}
	return g, nil
}

// Verify runs one training step of the chosen engine on a golden directory
// (config.json, model.safetensors, batch.safetensors, grads.safetensors,
// after_adamw_step.safetensors, expected.json, as transformers wrote them)
// and compares loss, logits, gradients and the weights after AdamW with
// what transformers computed. The report says PASS only when every
// comparison is within its tolerance.
func Verify(ctx context.Context, dir string, o VerifyOptions) (*VerifyReport, error) {
	g, err := loadGolden(dir)
	if err != nil {
		return nil, err
	}
	if o.Precision == "" {
		o.Precision = "fp32"
	}
	tol, err := TolerancesFor(o.Precision)
	if err != nil {
		return nil, err
	}
	if o.Tol != nil {
		tol = *o.Tol
	}
	eng, err := NewEngine(o.Engine, g.cfg, Options{Precision: o.Precision, MaxBatch: g.batch.B, MaxSeq: g.batch.T, ForceSM80: o.ForceSM80, Log: o.Log})
	if err != nil {
		return nil, err
	}
	defer eng.Close()
	r := &VerifyReport{Dir: dir, Engine: eng.Name(), Precision: o.Precision, Tol: tol, WantLoss: g.expected.Loss, WantGradNorm: g.expected.GradNorm}

	if err := eng.SetParams(g.params); err != nil {
		return nil, err
	}
	logits, err := eng.Logits(g.batch)
	if err != nil {
		return nil, err
	}
	r.LogitsErr = maxAbsDiff(logits, g.logits)
	r.LogitsTol = tol.LogitsRel * maxAbs(g.logits)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := eng.ZeroGrad(); err != nil {
		return nil, err
	}
	if err := eng.ForwardBackward(g.batch, 1); err != nil {
		return nil, err
	}
	grads := NewParams(g.cfg)
	if err := eng.Grads(grads); err != nil {
		return nil, err
	}
	ex := g.expected
	opt := AdamW{LR: ex.AdamW.LR, Beta1: ex.AdamW.Beta1, Beta2: ex.AdamW.Beta2, Eps: ex.AdamW.Eps, WeightDecay: ex.AdamW.WeightDecay, Clip: ex.Clip}
	if err := eng.Step(opt); err != nil {
		return nil, err
	}
	m, err := eng.Metrics()
	if err != nil {
		return nil, err
	}
	r.Loss, r.GradNorm, r.AuxLoss = m.Loss, m.GradNorm, m.AuxLoss
	after := NewParams(g.cfg)
	if err := eng.Params(after); err != nil {
		return nil, err
	}

	r.LossOK = math.Abs(r.Loss-r.WantLoss) <= tol.LossRel*math.Abs(r.WantLoss)
	r.GradNormOK = math.Abs(r.GradNorm-r.WantGradNorm) <= tol.GradRel*math.Abs(r.WantGradNorm)
	r.LogitsOK = r.LogitsErr <= r.LogitsTol
	r.AuxOK = true
	if ex.AuxLoss != nil {
		r.WantAuxLoss = ex.AuxLoss
		r.AuxOK = math.Abs(r.AuxLoss-*ex.AuxLoss) <= tol.LossRel*math.Abs(*ex.AuxLoss)
	}
	r.Pass = r.LossOK && r.GradNormOK && r.LogitsOK && r.AuxOK
	for _, s := range g.cfg.Specs() {
		c := checkTensor(s.Name, grads.Tensor(s.Name), g.grads.Tensor(s.Name), after.Tensor(s.Name), g.after.Tensor(s.Name), tol, opt.LR)
		r.Pass = r.Pass && c.Pass
		r.Tensors = append(r.Tensors, c)
	}
	return r, nil
}

func checkTensor(name string, grad, wantGrad, w, wantW []float32, tol Tolerances, lr float64) TensorCheck {
	gmax := maxAbs(wantGrad)
	c := TensorCheck{Name: name, GradErr: maxAbsDiff(grad, wantGrad), GradTol: tol.GradRel * gmax, WeightTol: tol.WeightAbs, WeightRestTol: tol.WeightLRs * lr}
	for i := range w {
		d := math.Abs(float64(w[i]) - float64(wantW[i]))
		if math.Abs(float64(wantGrad[i])) > tol.Significant*gmax {
			c.WeightErr = math.Max(c.WeightErr, d)
		} else {
			c.WeightRestErr = math.Max(c.WeightRestErr, d)
		}
	}
	c.Pass = c.GradErr <= c.GradTol && c.WeightErr <= c.WeightTol && c.WeightRestErr <= c.WeightRestTol
	return c
}

// maxAbsDiff is the largest |a-b|; NaN anywhere makes it NaN, which fails
// every comparison.
func maxAbsDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		if math.IsNaN(d) {
			return math.NaN()
		}
		m = math.Max(m, d)
	}
	return m
}

func maxAbs(a []float32) float64 {
	var m float64
	for _, v := range a {
		m = math.Max(m, math.Abs(float64(v)))
	}
	return m
}

// Write prints the report: loss, gradient norm, logits, a per-tensor table
// of largest errors against their bounds, then PASS or FAIL.
func (r *VerifyReport) Write(w io.Writer) error {
	status := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAIL"
	}
	fmt.Fprintf(w, "golden %s, engine %s, precision %s\n", r.Dir, r.Engine, r.Precision)
	fmt.Fprintf(w, "loss       %.9g (want %.9g, rel err %.2e, tol %.0e) %s\n", r.Loss, r.WantLoss, relErr(r.Loss, r.WantLoss), r.Tol.LossRel, status(r.LossOK))
	if r.WantAuxLoss != nil {
		fmt.Fprintf(w, "aux loss   %.9g (want %.9g, rel err %.2e, tol %.0e) %s\n", r.AuxLoss, *r.WantAuxLoss, relErr(r.AuxLoss, *r.WantAuxLoss), r.Tol.LossRel, status(r.AuxOK))
	}
	fmt.Fprintf(w, "grad norm  %.9g (want %.9g, rel err %.2e, tol %.0e) %s\n", r.GradNorm, r.WantGradNorm, relErr(r.GradNorm, r.WantGradNorm), r.Tol.GradRel, status(r.GradNormOK))
	fmt.Fprintf(w, "logits     max err %.2e (tol %.2e) %s\n", r.LogitsErr, r.LogitsTol, status(r.LogitsOK))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tensor\tgrad err\ttol\tweight err\ttol\telsewhere\ttol\t\t")
	for _, c := range r.Tensors {
		fmt.Fprintf(tw, "%s\t%.2e\t%.2e\t%.2e\t%.0e\t%.2e\t%.0e\t%s\t\n", c.Name, c.GradErr, c.GradTol, c.WeightErr, c.WeightTol, c.WeightRestErr, c.WeightRestTol, status(c.Pass))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	_, err := fmt.Fprintln(w, verdict)
	return err
}

func relErr(got, want float64) float64 {
	if want == 0 {
		return math.Abs(got)
	}
	return math.Abs(got-want) / math.Abs(want)
}

// ErrVerifyFailed is returned (wrapped) by callers when a report fails.
var ErrVerifyFailed = errors.New("engine differs from the reference beyond tolerance")
