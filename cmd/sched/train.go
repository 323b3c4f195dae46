package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// trainFlags are the command-line overrides of a run configuration; a flag
// given on the command line wins over the --run-config file.
type trainFlags struct {
	runConfig, out, tokenizerFile, moe, gpus string
	moeCfg                                   *trainer.MoEConfig
	tokens                                   []string
	resume                                   bool
	rc                                       trainer.RunConfig
}

func newTrainCmd() *cobra.Command { return newTrainCmdFor(&trainFlags{}) }

// trainArgs refuses sched train's arguments: a run's name, which sched
// enqueue train takes, is answered with the two ways to train it.
func trainArgs(c *cobra.Command, args []string) error {
	if len(args) == 1 {
		if set, err := runs.Load(os.Getenv("KILN_RUNS")); err == nil && slices.Contains(set.Names(), args[0]) {
			return argsError{fmt.Errorf("sched train takes no run name: 'sched enqueue train %s' queues run %s for a worker; to train here and now, name the token stores with --tokens and the model with --model or --run-config (see 'sched train --help')", args[0], args[0])}
		}
	}
	return exactArgs(0, "no arguments")(c, args)
}

// newTrainCmdFor is newTrainCmd with its flags read into f, where a test
// can see them.
func newTrainCmdFor(f *trainFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "train",
		Short: "Train a model on token stores, here and now (without the queue)",
		Long: `train runs the training loop in this process: it mixes the token stores by
weight, logs a line every log_every steps (also to OUT/metrics.jsonl),
evaluates on the stores' held-out windows, and writes checkpoints that
transformers loads as is to OUT/step-NNNNNNN. Ctrl-C or SIGTERM writes a
checkpoint at the next step boundary; --resume continues from the last one.
Without --resume, an OUT that already holds checkpoints is refused rather
than overwritten. The tokenizer copied into each checkpoint is a
tokenizer.json given with --tokenizer-file, or the published one
--tokenizer names, or else the one the token stores were made by, found
under the name their manifests record ('sched tokenizers' lists those this
machine has).`,
		Example: `  sched train --model tiny --tokens data/code=0.7 --tokens data/web=0.3 --steps 200 --engine cpu
  sched train --run-config run.yaml --tokenizer mix-16384 --out runs/pilot --resume`,
		Args: trainArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runTrain(cmd, f) },
	}
	fl := c.Flags()
	fl.StringVar(&f.runConfig, "run-config", "", "YAML file of the run's settings (model, seq, batch, accumulate, lr, total_steps, mixture, ...: the keys of a KILN_RUNS entry, less from and segment); flags given win over it")
	fl.StringArrayVar(&f.tokens, "tokens", nil, "token store directory, optionally =WEIGHT (repeat to mix stores)")
	fl.StringVar(&f.out, "out", "runs/train", "run directory: checkpoints and metrics.jsonl")
	fl.StringVar(&f.tokenizerFile, "tokenizer-file", "", "tokenizer.json the stores were made with, copied into each checkpoint (or name a published one with --tokenizer)")
	fl.BoolVar(&f.resume, "resume", false, "continue from the latest checkpoint in --out")
	fl.StringVar(&f.moe, "moe", "", "Mixtral's mixture of experts in every layer: experts=N[,top_k=K,d_ff=F,aux_coef=C] (either engine; on CUDA at most 64 experts, top_k at most 8)")
	fl.StringVar(&f.rc.Model, "model", "", "model size: tiny, small or base (default tiny)")
	fl.StringVar(&f.rc.Engine, "engine", "", "cpu, cuda or auto (default auto)")
	fl.StringVar(&f.rc.Precision, "precision", "", "fp32 or bf16 (default bf16)")
	noEmpty(fl, "run-config", "a YAML run configuration", "the flags and their defaults")
	noEmpty(fl, "out", "a run directory", "runs/train")
	noEmpty(fl, "tokenizer-file", "a tokenizer.json", "the published tokenizer --tokenizer (KILN_TOKENIZER) names")
	noEmpty(fl, "model", "tiny, small or base", "the run configuration's, or tiny")
	noEmpty(fl, "precision", "fp32 or bf16", "the run configuration's, or bf16")
	fl.IntVar(&f.rc.Seq, "seq", 0, "positions per sequence (default 256)")
	fl.IntVar(&f.rc.Batch, "batch", 0, "sequences per micro-batch (default 8)")
	fl.IntVar(&f.rc.Accumulate, "accumulate", 0, "micro-batches per optimizer step (default 1)")
	fl.Float64Var(&f.rc.LR, "lr", 0, "peak learning rate (default 3e-4)")
	fl.IntVar(&f.rc.Warmup, "warmup", 0, "warmup steps")
	fl.IntVar(&f.rc.TotalSteps, "steps", 0, "optimizer steps of the whole run")
	fl.Int64Var(&f.rc.TotalTokens, "total-tokens", 0, "tokens of the whole run (when --steps is not given)")
	fl.IntVar(&f.rc.EvalEvery, "eval-every", 0, "evaluate every N steps (0: never)")
	fl.IntVar(&f.rc.CheckpointEvery, "checkpoint-every", 0, "checkpoint every N steps (0: only at the end)")
	fl.IntVar(&f.rc.LogEvery, "log-every", 0, "log every N steps (default 10)")
	fl.Uint64Var(&f.rc.Seed, "seed", 0, "seed of the initial weights and the data order")
	fl.StringVar(&f.gpus, "gpus", "", "GPUs of this host to train on data-parallel, a number or all (default 1); accumulate must be a multiple")
	return c
}

func init() { rootCmd.AddCommand(newTrainCmd()) }

func runTrain(cmd *cobra.Command, f *trainFlags) error {
	rc, err := trainRunConfig(cmd, f)
	if err != nil {
		return err
	}
	if rc.TotalSteps <= 0 && rc.TotalTokens <= 0 {
		// Validate would name the run file's keys, and there may be no
		// run file: say which flags give the length.
		return badInput("train needs the run's length: give --steps N or --total-tokens N (total_steps or total_tokens in a --run-config file); the learning rate's cosine decay ends there")
	}
	rc = rc.WithDefaults()
	if err := rc.Validate(); err != nil {
		if f.runConfig != "" {
			// The flags are checked by name above: what is left came from
			// the file (or the defaults, which are valid).
			return badInputError{fmt.Errorf("run config %s: %w", f.runConfig, err)}
		}
		return err
	}
	if !f.resume {
		// A run under way resumes as it began.
		if err := rc.CheckWarmup(); err != nil {
			if f.runConfig != "" && !cmd.Flags().Changed("warmup") && !cmd.Flags().Changed("steps") && !cmd.Flags().Changed("total-tokens") {
				return badInputError{fmt.Errorf("run config %s: %w", f.runConfig, err)}
			}
			return err
		}
	}
	mc, err := rc.ModelConfig()
	if err != nil {
		return err
	}
	// A path given to --tokenizer is refused naming --tokenizer-file, before
	// the configuration reads it as a tokenizer's name.
	if err := checkTokenizerFlag(cmd); err != nil {
		return err
	}
	cfg, err := loadConfig(cmd)
	if err != nil {
		return err
	}
	// Before the data is opened and a word is logged: a refused --out is
	// one line.
	if err := trainer.CheckRunDir(f.out, f.resume); err != nil {
		return err
	}
	tok, tokName, err := trainTokenizer(cmd, cfg, f.tokenizerFile)
	if err != nil {
		return err
	}
	data, err := trainer.OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
	if err != nil {
		return storeNamedAsAPath(cfg, rc.Mixture, err)
	}
	if tok != nil {
		t, err := tokenizer.Parse(tok)
		if err != nil {
			data.Close()
			return badInput("tokenizer %s: %v", tokName, err)
		}
		uses := catalog.Entry{Name: tokName, SHA256: t.SHA256(), VocabSize: t.VocabSize()}
		for _, s := range data.Stores() {
			if err := catalog.CheckUses(s, uses); err != nil {
				data.Close()
				return err
			}
		}
	}
	out := cmd.OutOrStdout()
	log := newLogger(cmd.ErrOrStderr(), cfg.LogFormat)
	defer log.Sync()
	if tok == nil {
		var why string
		if tok, tokName, why = storesTokenizer(cmd.Context(), cfg, data.Stores()); tok != nil {
			log.Info("checkpoints carry the tokenizer the token stores were made by", zap.String("tokenizer", tokName))
		} else {
			log.Warn("no --tokenizer-file or --tokenizer, and " + why + ": checkpoints will hold no tokenizer.json; name it with --tokenizer NAME or --tokenizer-file FILE")
		}
	}
	// from is the step this call began at, known once it trains one: the
	// Step hook reports every step, where Metrics reports only the logged
	// ones (a run shorter than log_every logs none).
	began, from := time.Now(), -1
	res, err := trainer.Run(cmd.Context(), trainer.Config{Run: rc, Out: f.out, Resume: f.resume, Data: data, Tokenizer: tok, TokenizerName: tokName, Log: log},
		trainer.Hooks{
			Step: func(step, _ int) {
				if from < 0 {
					from = step - 1
				}
			},
			Metrics: func(m trainer.Metrics) { printMetrics(out, m, rc.TotalSteps) },
			// Each checkpoint brings the event files up to its step, so that
			// a process killed later leaves its steps up to there in them.
			// The first step's hook set from before any checkpoint began.
			Checkpoint: func(_ context.Context, _ string, step int) error {
				if _, err := writeRunEvents(f.out, from, step, began); err != nil {
					log.Warn("TensorBoard event file", zap.Error(err))
				}
				return nil
			},
		})
	trained := from >= 0
	if trained && res.Precision != "" && res.Precision != rc.Precision {
		// The checkpoint's run_config says what was asked; its weights
		// were computed so.
		asked := fmt.Sprintf("not the %s asked", rc.Precision)
		if !cmd.Flags().Changed("precision") && f.runConfig == "" {
			asked = fmt.Sprintf("not the default %s", rc.Precision)
		}
		fmt.Fprintf(out, "trained in %s, %s: the CPU engine computes in fp32 only (--engine cuda on a GPU trains in bf16)\n", res.Precision, asked)
	}
	if err == nil && !trained && res.Step >= rc.TotalSteps {
		fmt.Fprintf(out, "the run is at step %d of its %d already: nothing to train (a longer run needs --steps or --total-tokens raised)\n", res.Step, rc.TotalSteps)
	}
	// The steps after the last checkpoint (a checkpoint that failed to
	// write) are trained again by a resume: they are not the run's.
	kept, _ := trainer.DirStep(filepath.Base(res.Checkpoint))
	switch {
	case res.Checkpoint == "" || res.Step == 0:
	case kept < res.Step:
		fmt.Fprintf(out, "step %d reached, but the last checkpoint is %s (step %d): --resume continues from it, training the steps after it again\n", res.Step, res.Checkpoint, kept)
	default:
		fmt.Fprintf(out, "step %d, %d tokens; checkpoint %s\n", res.Step, res.Tokens, res.Checkpoint)
	}
	if trained && res.Checkpoint != "" && kept > from {
		switch name, eerr := writeRunEvents(f.out, from, kept, began); {
		case eerr != nil:
			log.Warn("TensorBoard event file", zap.Error(eerr))
		case name == "":
			fmt.Fprintf(out, "no TensorBoard event file: none of steps %d to %d was logged (log_every %d; --log-every sets it)\n", from+1, kept, rc.LogEvery)
		default:
			fmt.Fprintf(out, "TensorBoard: tensorboard --logdir %s\n", filepath.Join(f.out, results.TensorBoardDir))
		}
	}
	if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
		return trainStopped(context.Cause(cmd.Context()), res, rc.TotalSteps)
	}
	var busy *trainer.RunDirBusyError
	if errors.As(err, &busy) {
		// Started twice into one --out: the user's to choose.
		return badInputError{err}
	}
	return err
}

// trainStopped is the error of a run stopped by Ctrl-C or SIGTERM (exit
// code 130): where it stopped and how to go on. err is the stop's cause
// (the signal, as sched bench and sched tokenize name it), not the
// context's "context canceled".
func trainStopped(err error, res trainer.Result, total int) error {
	if res.Checkpoint == "" {
		return interruptedError{fmt.Errorf("training stopped (%w) before its first step ended: nothing was kept", err)}
	}
	return interruptedError{fmt.Errorf("training stopped (%w) at step %d of %d, checkpoint %s: the same command with --resume continues from it", err, res.Step, total, res.Checkpoint)}
}

// writeRunEvents brings the TensorBoard event files of run directory dir
// up to its metrics.jsonl at step to, the checkpoint this call, begun at
// began after step from, has reached: this call's file holds its lines up
// to there, and each earlier file its lines up to where the next file
// begins (steps trained again after a resume from an older checkpoint are
// in the later file alone; a call killed after a checkpoint and before its
// file was written has its steps in the file before it, and the first
// call's, where none is before it, in a file of its own:
// results.FirstStretch). A file that begins at or after from holds only
// steps this call trained again: it is removed. It returns this call's
// file's name under dir, "" when none of its steps was logged.
func writeRunEvents(dir string, from, to int, began time.Time) (string, error) {
	mf, err := os.Open(filepath.Join(dir, trainer.MetricsFile))
	if err != nil {
		return "", err
	}
	recs, err := results.ReadMetrics(mf)
	mf.Close()
	if err != nil {
		return "", err
	}
	name, err := results.WriteEventFile(dir, recs, from, to, began)
	if err != nil {
		return "", err
	}
	tb := filepath.Join(dir, results.TensorBoardDir)
	entries, err := os.ReadDir(tb)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("event files: %w", err)
	}
	host, _ := os.Hostname()
	files := []results.EventFile{{Name: results.EventFileName(began, host, from), Began: began, From: from}}
	for _, e := range entries {
		if b, _, first, ok := results.ParseEventFileName(e.Name()); ok && e.Type().IsRegular() && e.Name() != files[0].Name {
			files = append(files, results.EventFile{Name: e.Name(), Began: b, From: first})
		}
	}
	if f, ok := results.FirstStretch(files, recs); ok {
		files = append(files, f)
	}
	for _, f := range files[1:] {
		path := filepath.Join(tb, f.Name)
		var buf bytes.Buffer
		n := 0
		if f.From < from {
			if n, err = results.WriteEventStretch(&buf, recs, f.From, results.StretchEnd(files, f, to), f.Began); err != nil {
				return "", err
			}
		}
		if n == 0 {
			if err := os.Remove(path); err != nil {
				return "", fmt.Errorf("event files: %w", err)
			}
			continue
		}
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, buf.Bytes()) {
			continue
		}
		if err := os.MkdirAll(tb, 0o755); err != nil {
			return "", fmt.Errorf("event files: %w", err)
		}
		if err := os.WriteFile(path+".tmp", buf.Bytes(), 0o644); err != nil {
			return "", fmt.Errorf("event files: %w", err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return "", fmt.Errorf("event files: %w", err)
		}
	}
	return name, nil
}

// checkRunConfigFlag refuses a run's YAML given to the global --config,
// which is kiln's own configuration file: it would be read as that (or
// not at all) and the run would train with the defaults.
func checkRunConfigFlag(cmd *cobra.Command) error {
	path, given := flagValue(cmd, "config")
	if !given {
		return nil
	}
	if _, err := trainer.LoadRunConfig(path); err == nil {
		return badInput("--config %s: --config is kiln's configuration file; give a run's YAML as --run-config %s", path, path)
	}
	return nil
}

// trainTokenizer is the tokenizer.json copied into checkpoints: the file
// --tokenizer-file names, or the published tokenizer --tokenizer names
// when given on the command line, or none; name is the file or the
// tokenizer's name.
func trainTokenizer(cmd *cobra.Command, cfg scheduler.Config, file string) (data []byte, name string, err error) {
	name, named := flagValue(cmd, "tokenizer")
	switch {
	case file != "" && named:
		return nil, "", badInput("give --tokenizer NAME (a published tokenizer) or --tokenizer-file FILE, not both")
	case file != "":
		if data, err = os.ReadFile(file); err != nil {
			return nil, "", badInput("--tokenizer-file: %v", err)
		}
		return data, file, nil
	case !named:
		return nil, "", nil
	}
	_, data, err = catalogTokenizer(cmd.Context(), cfg, name)
	return data, name, err
}

// catalogTokenizer is tokenizer name of this machine's catalog (the data
// directory, then object storage) and its tokenizer.json.
func catalogTokenizer(ctx context.Context, cfg scheduler.Config, name string) (catalog.Entry, []byte, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	objects, err := openStore(ctx, cfg)
	if err != nil {
		return catalog.Entry{}, nil, err
	}
	entry, _, err := catalog.New(objects, cfg.DataDir).Resolve(ctx, name)
	if err != nil {
		return catalog.Entry{}, nil, err
	}
	data, err := os.ReadFile(entry.Path)
	if err != nil {
		return catalog.Entry{}, nil, fmt.Errorf("tokenizer %s: %w", name, err)
	}
	return entry, data, nil
}

// storesTokenizer is the tokenizer.json of the tokenizer the stores were
// made by, found by the name their manifests record in this machine's
// catalog (the data directory, then object storage) and only when its
// SHA-256 is theirs: checkpoints then carry it with no flag given. Else
// nil, and why not.
func storesTokenizer(ctx context.Context, cfg scheduler.Config, stores []catalog.Store) (data []byte, name, why string) {
	if len(stores) == 0 {
		return nil, "", "no token store"
	}
	want := stores[0].Tokenizer
	for _, s := range stores[1:] {
		if s.Tokenizer.SHA256 != want.SHA256 {
			return nil, "", "the token stores were made by different tokenizers"
		}
	}
	entry, data, err := catalogTokenizer(ctx, cfg, want.Name)
	var nf *catalog.NotFoundError
	switch {
	case errors.As(err, &nf):
		return nil, "", fmt.Sprintf("the stores' tokenizer %s is in neither %s nor object storage", want.Name, nf.Local)
	case err != nil:
		return nil, "", fmt.Sprintf("the stores' tokenizer %s is not found here (%v)", want.Name, err)
	case entry.SHA256 != want.SHA256:
		return nil, "", fmt.Sprintf("the tokenizer named %s here is not the one the stores were made by (sha256 %.12s, theirs %.12s)", want.Name, entry.SHA256, want.SHA256)
	}
	return data, want.Name, ""
}

// checkTrainFlags refuses, by flag name, sizes given as zero (which the run
// configuration would read as "absent" and default), negative step counts
// (which Validate would name by their run file's keys) and a learning rate
// that is not a finite positive number.
func checkTrainFlags(cmd *cobra.Command, f *trainFlags) error {
	fl := cmd.Flags()
	for _, s := range []struct {
		name string
		v    int
	}{{"batch", f.rc.Batch}, {"seq", f.rc.Seq}, {"accumulate", f.rc.Accumulate}, {"log-every", f.rc.LogEvery}} {
		if fl.Changed(s.name) && s.v < 1 {
			return badInput("--%s %d: give at least 1, or leave it out for the default", s.name, s.v)
		}
	}
	for _, s := range []struct {
		name string
		v    int
	}{{"warmup", f.rc.Warmup}, {"eval-every", f.rc.EvalEvery}, {"checkpoint-every", f.rc.CheckpointEvery}} {
		if fl.Changed(s.name) && s.v < 0 {
			return badInput("--%s %d: give 0 or more steps", s.name, s.v)
		}
	}
	if fl.Changed("steps") && f.rc.TotalSteps < 1 {
		return badInput("--steps %d: give the run's optimizer steps, at least 1", f.rc.TotalSteps)
	}
	if fl.Changed("total-tokens") && f.rc.TotalTokens < 1 {
		return badInput("--total-tokens %d: give the run's tokens, at least one step's", f.rc.TotalTokens)
	}
	if fl.Changed("steps") && fl.Changed("total-tokens") {
		return badInput("--steps %d and --total-tokens %d both give the run's length: give one of them", f.rc.TotalSteps, f.rc.TotalTokens)
	}
	if fl.Changed("lr") {
		if err := checkFinite("lr", f.rc.LR); err != nil {
			return err
		}
		if f.rc.LR <= 0 {
			return badInput("--lr %g: give a positive learning rate", f.rc.LR)
		}
	}
	if fl.Changed("moe") {
		m, err := trainer.ParseMoE(f.moe)
		if err != nil {
			return err
		}
		f.moeCfg = m
	}
	if fl.Changed("gpus") {
		g, err := trainer.ParseGPUsOf("--gpus", f.gpus)
		if err != nil {
			return err
		}
		f.rc.GPUs = g
	}
	// By flag, as sched bench names them: the run configuration's own
	// check names its YAML keys (model:, precision:).
	if fl.Changed("model") {
		if _, err := model.Preset(f.rc.Model); err != nil {
			return badInput("--model: %v", err)
		}
	}
	if fl.Changed("precision") && f.rc.Precision != "fp32" && f.rc.Precision != "bf16" {
		return badInput("--precision: unknown precision %q: choose fp32 or bf16", f.rc.Precision)
	}
	if fl.Changed("engine") {
		return checkEngine(f.rc.Engine)
	}
	return nil
}

// trainRunConfig is the run configuration train trains, before defaults:
// the --run-config file's, with the flags given on the command line over
// it.
func trainRunConfig(cmd *cobra.Command, f *trainFlags) (trainer.RunConfig, error) {
	var rc trainer.RunConfig
	if err := checkRunConfigFlag(cmd); err != nil {
		return rc, err
	}
	if f.runConfig != "" {
		var err error
		if rc, err = trainer.LoadRunConfig(f.runConfig); err != nil {
			return rc, err
		}
	}
	if err := checkTrainFlags(cmd, f); err != nil {
		return rc, err
	}
	mergeFlags(cmd, &rc, f)
	if err := parseTokensFlags(&rc, f.tokens); err != nil {
		return rc, err
	}
	return rc, nil
}

// mergeFlags copies the flags given on the command line over rc.
func mergeFlags(cmd *cobra.Command, rc *trainer.RunConfig, f *trainFlags) {
	fl := cmd.Flags()
	set := func(name string, apply func()) {
		if fl.Changed(name) {
			apply()
		}
	}
	set("model", func() { rc.Model = f.rc.Model })
	set("engine", func() { rc.Engine = f.rc.Engine })
	set("precision", func() { rc.Precision = f.rc.Precision })
	set("seq", func() { rc.Seq = f.rc.Seq })
	set("batch", func() { rc.Batch = f.rc.Batch })
	set("accumulate", func() { rc.Accumulate = f.rc.Accumulate })
	set("lr", func() { rc.LR = f.rc.LR })
	set("warmup", func() { rc.Warmup = f.rc.Warmup })
	// --steps and --total-tokens give the run's length two ways: either
	// replaces the file's length however the file wrote it, or the file's
	// total_steps would win over --total-tokens (RunConfig.WithDefaults).
	set("steps", func() { rc.TotalSteps, rc.TotalTokens = f.rc.TotalSteps, 0 })
	set("total-tokens", func() { rc.TotalSteps, rc.TotalTokens = 0, f.rc.TotalTokens })
	set("eval-every", func() { rc.EvalEvery = f.rc.EvalEvery })
	set("checkpoint-every", func() { rc.CheckpointEvery = f.rc.CheckpointEvery })
	set("log-every", func() { rc.LogEvery = f.rc.LogEvery })
	set("seed", func() { rc.Seed = f.rc.Seed })
	set("moe", func() { rc.MoE = f.moeCfg })
	set("gpus", func() { rc.GPUs = f.rc.GPUs })
}

// storeNamedAsAPath adds to err, an open of the mixture's stores that
// found one missing, the store of that name in the data directory, where
// the name (a store's, as a run of the queue names it) was read as a path
// from here.
func storeNamedAsAPath(cfg scheduler.Config, mixture []trainer.MixtureEntry, err error) error {
	var no *tokens.NoStoreError
	if !errors.As(err, &no) || cfg.DataDir == "" {
		return err
	}
	for _, e := range mixture {
		if filepath.Clean(e.Store) != filepath.Clean(no.Dir) || strings.ContainsRune(e.Store, filepath.Separator) {
			continue
		}
		named := filepath.Join(cfg.DataDir, "tokens", e.Store)
		if _, serr := tokens.ReadManifest(named); serr == nil {
			return badInput("token store %s: %s here has no %s; the token store of that name in the data directory is %s: give its path (--tokens takes a store's directory)",
				e.Store, no.Dir, tokens.ManifestFile, named)
		}
	}
	return err
}

// parseTokensFlags is applied before validation so that a malformed
// --tokens is reported by name.
func parseTokensFlags(rc *trainer.RunConfig, flags []string) error {
	if len(flags) == 0 {
		return nil
	}
	rc.Mixture = nil
	for _, s := range flags {
		e, err := trainer.ParseMixtureEntry(s)
		if err != nil {
			return err
		}
		rc.Mixture = append(rc.Mixture, e)
	}
	return nil
}

func printMetrics(w io.Writer, m trainer.Metrics, total int) {
	line := fmt.Sprintf("step %d/%d  loss %.4f  ppl %.2f  lr %.2e  grad %.3f  %.0f tok/s", m.Step, total, m.LossOr(0), math.Exp(m.LossOr(0)), m.LR, m.GradNorm, m.TokPerSec)
	if m.MFU != nil {
		line += fmt.Sprintf("  mfu %.1f%%", 100**m.MFU)
	}
	if m.EvalLoss != nil {
		line += fmt.Sprintf("  eval %.4f (ppl %.2f)", *m.EvalLoss, math.Exp(*m.EvalLoss))
	}
	fmt.Fprintln(w, line)
}
