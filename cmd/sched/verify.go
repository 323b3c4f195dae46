package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kiln-lm/kiln/model"
	"github.com/spf13/cobra"
)

// verifyFlags are the options of 'sched verify'. Zero tolerances mean the
// precision's defaults (model.FP32Tolerances, model.BF16Tolerances).
type verifyFlags struct {
	golden, engine, precision                string
	forceSM80                                bool
	lossRel, logitsRel, gradRel, significant float64
	weightAbs, weightLRs                     float64
}

func init() {
	var f verifyFlags
	cmd := &cobra.Command{
		Use:   "verify --golden DIR",
		Short: "Check one training step of an engine against transformers' golden values",
		Long: `verify loads a golden directory (config.json, model.safetensors,
batch.safetensors, grads.safetensors, after_adamw_step.safetensors,
expected.json, as written by transformers), runs one training step with the
AdamW settings of expected.json on the chosen engine, and prints the loss,
the gradient norm and each tensor's largest error against its tolerance.
A Mixtral golden (model_type mixtral, such as model/testdata/golden/moe)
runs the mixture-of-experts block, and its load-balancing loss (aux_loss
in expected.json) is checked at the loss tolerance beside the total loss.
It exits 1 when anything is beyond tolerance.

Default tolerances: fp32 - loss 1e-5 relative, logits and gradients 1e-4 of
their largest magnitude, weights after the step 1e-6 where the gradient
exceeds 1e-4 of its tensor's largest and 2 x lr elsewhere. bf16 - loss 5e-3,
logits and gradients 3e-2, weights 1e-5 where the gradient exceeds 3e-2 of
its tensor's largest and 2 x lr elsewhere. Each can be overridden by a flag.`,
		Example: `  sched verify --golden model/testdata/golden/tiny
  sched verify --golden model/testdata/golden/hd64 --engine cuda --precision bf16
  sched verify --golden model/testdata/golden/moe --engine cuda --force-sm80`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runVerify(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.golden, "golden", "", "golden directory (required), laid out like model/testdata/golden/tiny")
	fl.StringVar(&f.engine, "engine", "cpu", "engine to check: cpu, cuda or auto")
	fl.StringVar(&f.precision, "precision", "fp32", "precision to run and judge by: fp32 or bf16 (bf16 needs the cuda engine: the CPU engine computes in fp32 only)")
	fl.BoolVar(&f.forceSM80, "force-sm80", false, "CUDA engine: build and run the sm_80 (compute_80) kernels on a newer GPU")
	fl.Float64Var(&f.lossRel, "loss-rtol", 0, "loss tolerance, relative (0 = the precision's default)")
	fl.Float64Var(&f.logitsRel, "logits-rtol", 0, "logits tolerance, relative to the largest logit (0 = default)")
	fl.Float64Var(&f.gradRel, "grad-rtol", 0, "gradient tolerance, relative to each tensor's largest gradient (0 = default)")
	fl.Float64Var(&f.significant, "significant", 0, "fraction of a tensor's largest gradient above which a weight is held to --weight-atol (0 = default)")
	fl.Float64Var(&f.weightAbs, "weight-atol", 0, "weight tolerance after the step where the gradient is significant (0 = default)")
	fl.Float64Var(&f.weightLRs, "weight-lrs", 0, "weight tolerance elsewhere, in multiples of lr (0 = default)")
	rootCmd.AddCommand(cmd)
}

// runVerify runs the check and writes the report to out. A report beyond
// tolerance is an error wrapping model.ErrVerifyFailed (exit 1); a missing
// or malformed golden directory is bad input (exit 2).
func runVerify(ctx context.Context, out, errOut io.Writer, f verifyFlags) error {
	if f.golden == "" {
		return badInput("verify needs --golden DIR: a directory such as model/testdata/golden/tiny")
	}
	if st, err := os.Stat(f.golden); err != nil || !st.IsDir() {
		return badInput("--golden %s is not a directory: pass a golden directory holding config.json, model.safetensors, batch.safetensors, grads.safetensors, after_adamw_step.safetensors and expected.json", f.golden)
	}
	tol, err := model.TolerancesFor(f.precision)
	if err != nil {
		return badInput("--precision: %v", err)
	}
	for _, o := range []struct {
		flag string
		v    float64
		dst  *float64
	}{{"loss-rtol", f.lossRel, &tol.LossRel}, {"logits-rtol", f.logitsRel, &tol.LogitsRel}, {"grad-rtol", f.gradRel, &tol.GradRel},
		{"significant", f.significant, &tol.Significant}, {"weight-atol", f.weightAbs, &tol.WeightAbs}, {"weight-lrs", f.weightLRs, &tol.WeightLRs}} {
		if err := checkFinite(o.flag, o.v); err != nil {
			return err
		}
		if o.v < 0 {
			return badInput("--%s must not be negative, got %g", o.flag, o.v)
		}
		// A fraction of the largest gradient: at 1 or above no weight is
		// held to --weight-atol, and the check passes having made none.
		if o.flag == "significant" && o.v >= 1 {
			return badInput("--significant %g: give a fraction of a tensor's largest gradient below 1 (the default is %g), or at 1 or above no weight would be checked", o.v, tol.Significant)
		}
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if err := checkEngine(f.engine); err != nil {
		return err
	}
	if f.engine == "cpu" && f.forceSM80 {
		return badInput("--force-sm80 builds the CUDA engine's kernels: drop it, or verify --engine cuda")
	}
	// The CPU engine computes in fp32 only: its step judged by bf16's
	// looser tolerances would pass as a bf16 check that never happened.
	if f.engine == "cpu" && f.precision == "bf16" {
		return badInput("--precision bf16 on the cpu engine: the CPU engine computes in fp32 only, so a bf16 check needs --engine cuda (or verify --precision fp32 on the CPU)")
	}
	r, err := model.Verify(ctx, f.golden, model.VerifyOptions{
		Engine: f.engine, Precision: f.precision, ForceSM80: f.forceSM80, Tol: &tol,
		Log: func(s string) { fmt.Fprintln(errOut, s) },
	})
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return badInputError{onPath("verify", f.golden, err)}
		}
		return onPath("verify", f.golden, err)
	}
	// Engine auto finds out only as it starts that it has no GPU; the
	// CPU's fp32 step is then no bf16 check, whatever it scored.
	if r.Engine == "cpu" && r.Precision == "bf16" {
		return badInput("--precision bf16 with --engine auto: no CUDA engine started, and the CPU engine computes in fp32 only, so no bf16 check was made: verify --engine cuda on a machine with a GPU (or --precision fp32 on the CPU)")
	}
	if err := r.Write(out); err != nil {
		return err
	}
	if !r.Pass {
		return fmt.Errorf("verify %s on engine %s (%s): %w", f.golden, r.Engine, r.Precision, model.ErrVerifyFailed)
	}
	return nil
}
