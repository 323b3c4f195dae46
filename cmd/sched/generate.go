package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// generateFlags are the options of 'sched generate'.
type generateFlags struct {
	run, checkpoint, prompt, engine string
	maxTokens, topK                 int
	temperature                     float64
	seed                            uint64
	// pulled says the checkpoint is --run's, whose files the pull
	// already checked against their hashes.
	pulled bool
}

func init() {
	var f generateFlags
	cmd := &cobra.Command{
		Use:   "generate (--run NAME | --checkpoint DIR) --prompt TEXT",
		Short: "Continue a prompt with a trained checkpoint",
		Long: `generate loads a checkpoint (config.json, model.safetensors and
tokenizer.json, as training writes them or transformers saves them), encodes
the prompt with the checkpoint's own tokenizer and prints it followed by up to --max-tokens generated tokens,
stopping early at the end-of-text token. --temperature 0 picks the most
likely token each time; above 0, tokens are drawn from the softmax of the
logits divided by the temperature, among the --top-k most likely (0 = all),
from a stream fixed by --seed.

--run NAME takes the run's latest complete checkpoint in object storage
(checkpoints/NAME/step-NNNNNNN/ with its completion marker) and copies it to
<data dir>/checkpoints/NAME/ first; --checkpoint DIR reads a local
directory.`,
		Example: `  sched generate --run pilot --prompt 'func main() {'
  sched generate --run pilot --prompt 'def fib(n):' --temperature 0.8 --top-k 40 --seed 7
  sched generate --checkpoint runs/pilot/step-0004000 --prompt 'package main' --max-tokens 200`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Before --run's checkpoint is pulled: a mistake in a flag
			// should not wait for a download to be told.
			if cmd.Flags().Changed("prompt") && f.prompt == "" {
				return badInput(`--prompt "" is empty: give the text to continue, one character or more`)
			}
			if err := f.check(); err != nil {
				return err
			}
			if f.run != "" {
				dir, err := pullLatestCheckpoint(cmd, f.run)
				if err != nil {
					return err
				}
				f.checkpoint, f.pulled = dir, true
			}
			return runGenerate(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.run, "run", "", "a run whose latest complete checkpoint in object storage to generate from")
	fl.StringVar(&f.checkpoint, "checkpoint", "", "a local checkpoint directory to generate from")
	fl.StringVar(&f.prompt, "prompt", "", "text to continue (required)")
	fl.StringVar(&f.engine, "engine", "cpu", "engine: cpu, cuda or auto")
	fl.IntVar(&f.maxTokens, "max-tokens", 64, "largest number of tokens to generate")
	fl.Float64Var(&f.temperature, "temperature", 0, "sampling temperature; 0 = greedy")
	fl.IntVar(&f.topK, "top-k", 0, "with --temperature above 0, sample among the k most likely tokens; 0 = all")
	fl.Uint64Var(&f.seed, "seed", 0, "random seed for sampling")
	rootCmd.AddCommand(cmd)
}

// check refuses flags that no checkpoint could make right, before one is
// read or pulled.
func (f generateFlags) check() error {
	switch {
	case f.run != "" && f.checkpoint != "":
		return badInput("give --run NAME (its latest checkpoint in object storage) or --checkpoint DIR (a local directory), not both")
	case f.run == "" && f.checkpoint == "":
		return badInput("generate needs --run NAME (a run's latest checkpoint in object storage) or --checkpoint DIR (a directory with config.json, model.safetensors and tokenizer.json)")
	case f.prompt == "":
		return badInput("generate needs --prompt TEXT")
	case f.maxTokens < 1:
		return badInput("--max-tokens %d: give at least 1 token to generate, or leave it out for the default 64", f.maxTokens)
	case f.temperature < 0 || math.IsNaN(f.temperature) || math.IsInf(f.temperature, 0):
		return badInput("--temperature must be a finite number, not negative, got %g", f.temperature)
	case f.topK < 0:
		return badInput("--top-k must not be negative, got %d", f.topK)
	case f.topK > 0 && f.temperature == 0:
		// Greedy decoding takes the most likely token whatever k is: the
		// k would be dropped without a word.
		return badInput("--top-k %d has no effect with --temperature 0, which picks the most likely token each time: set --temperature above 0 (1 samples from the model's own distribution) to sample among the top %d, or leave --top-k out", f.topK, f.topK)
	}
	return checkEngine(f.engine)
}

// runGenerate writes the prompt and its continuation to out; f has passed
// check, and f.checkpoint names a directory (--run's, once pulled).
func runGenerate(ctx context.Context, out, errOut io.Writer, f generateFlags) error {
	fi, err := os.Stat(f.checkpoint)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return badInput("--checkpoint %s does not exist: give a checkpoint's directory (it holds config.json, model.safetensors and tokenizer.json), or --run NAME for a run's newest checkpoint in object storage", f.checkpoint)
	case err == nil && !fi.IsDir():
		return badInput("--checkpoint %s is a file: give the checkpoint's directory (it holds config.json, model.safetensors and tokenizer.json)", f.checkpoint)
	}
	if _, err := os.Stat(filepath.Join(f.checkpoint, "config.json")); errors.Is(err, os.ErrNotExist) {
		// A run's directory, as training writes it, holds its checkpoints.
		steps, _ := trainer.StepDirs(f.checkpoint)
		if len(steps) == 1 {
			return badInput("--checkpoint %s is a run's directory of 1 checkpoint: give the checkpoint, %s, or --run %s for the run's newest complete checkpoint in object storage",
				f.checkpoint, steps[0], filepath.Base(filepath.Clean(f.checkpoint)))
		}
		if len(steps) > 1 {
			return badInput("--checkpoint %s is a run's directory of %d checkpoints: give one of them, such as %s (the newest), or --run %s for the run's newest complete checkpoint in object storage",
				f.checkpoint, len(steps), steps[0], filepath.Base(filepath.Clean(f.checkpoint)))
		}
	}
	if !f.pulled {
		if err := verifyCheckpoint(f.checkpoint); err != nil {
			return err
		}
	}
	params, err := model.LoadCheckpoint(f.checkpoint)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return badInput("checkpoint %s: %v (a checkpoint directory holds config.json, model.safetensors and tokenizer.json)", f.checkpoint, err)
		}
		return onPath("load checkpoint", f.checkpoint, err)
	}
	if name, at, bad := params.NonFinite(); bad {
		return badInput("checkpoint %s: model.safetensors holds a NaN or an infinity (%s, value %d): its training had diverged by then, and it would generate noise; use an earlier checkpoint", f.checkpoint, name, at)
	}
	cfg := params.Config
	tokPath := filepath.Join(f.checkpoint, "tokenizer.json")
	tok, err := tokenizer.Load(tokPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return badInput("checkpoint %s has no tokenizer.json: copy the tokenizer the model was trained with into it", f.checkpoint)
		}
		return onPath("load checkpoint", f.checkpoint, err)
	}
	if tok.VocabSize() > cfg.VocabSize {
		return badInput("%s has %d tokens but the model's vocab_size is %d: the tokenizer does not belong to this checkpoint", tokPath, tok.VocabSize(), cfg.VocabSize)
	}
	// The model would be given the prompt without them, and the output
	// would show them as if it had not.
	for _, b := range tok.DroppedBytes() {
		if i := strings.IndexByte(f.prompt, b); i >= 0 {
			return badInput("--prompt holds byte %#02x (at byte %d), for which %s has no symbol and no unk_token: it would be dropped from what the model reads; leave it out of the prompt, or use a tokenizer whose vocabulary holds all 256 bytes", b, i, tokPath)
		}
	}
	ids := tok.Encode(f.prompt)
	if len(ids) == 0 {
		return badInput("--prompt %q encodes to no tokens", f.prompt)
	}
	// Lowering --max-tokens is advice only where the prompt leaves room
	// for a token: at 1 it cannot be lowered, and the prompt is what to cut.
	n := len(ids)
	if n >= cfg.MaxPositions {
		alone := "exceeds"
		if n == cfg.MaxPositions {
			alone = "fills"
		}
		todo := fmt.Sprintf("shorten the prompt to at most %d tokens (the %d positions less --max-tokens %d)", cfg.MaxPositions-f.maxTokens, cfg.MaxPositions, f.maxTokens)
		if f.maxTokens >= cfg.MaxPositions {
			todo = fmt.Sprintf("shorten the prompt, and lower --max-tokens %d: the two together must fit in %d", f.maxTokens, cfg.MaxPositions)
		}
		return badInput("--prompt is %d tokens, which alone %s the model's %d positions (max_position_embeddings), leaving none to generate into: %s",
			n, alone, cfg.MaxPositions, todo)
	}
	if n+f.maxTokens > cfg.MaxPositions {
		return badInput("--prompt (%d tokens) plus --max-tokens %d exceeds the model's %d positions (max_position_embeddings): lower --max-tokens to %d or less, or shorten the prompt",
			n, f.maxTokens, cfg.MaxPositions, cfg.MaxPositions-n)
	}
	prompt := make([]int32, len(ids))
	for i, id := range ids {
		prompt[i] = int32(id)
	}
	stop := int32(-1)
	if eos, ok := tok.EOS(); ok {
		stop = int32(eos)
	} else if cfg.EOSTokenID >= 0 && cfg.EOSTokenID < tok.VocabSize() {
		stop = int32(cfg.EOSTokenID)
	}
	eng, err := model.NewEngine(f.engine, cfg, model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: len(prompt) + f.maxTokens,
		Purpose: model.PurposeGenerate, Log: func(s string) { fmt.Fprintln(errOut, s) }})
	if err != nil {
		return err
	}
	defer eng.Close()
	if err := eng.SetParams(params); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	gen, err := eng.Generate(ctx, prompt, f.maxTokens, stop, model.Sampling{Temperature: f.temperature, TopK: f.topK, Seed: f.seed, Vocab: tok.VocabSize()})
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	text := make([]uint32, 0, len(gen))
	for _, id := range gen {
		if id == stop {
			break
		}
		text = append(text, uint32(id))
	}
	cont, err := tok.Decode(text)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	_, err = fmt.Fprintln(out, f.prompt+cont)
	return err
}

// verifyCheckpoint refuses, as bad input, a checkpoint training wrote
// whose files no longer match the sizes and SHA-256 hashes its
// trainer_state.json lists (trainer.VerifyWeights, as a resume checks
// them): the weights or the tokenizer were altered or cut short since, and
// what they generate would not be the run's. The optimizer's file, which
// sampling does not read, may be gone. A directory without a
// trainer_state.json (as transformers saves one), or with one of another
// format than kiln's, has no hashes to check.
func verifyCheckpoint(dir string) error {
	if !trainer.HoldsCheckpoint(dir) {
		return nil
	}
	if _, err := trainer.VerifyWeights(dir); errors.Is(err, trainer.ErrDamaged) {
		return badInput("%w", err)
	}
	return nil
}

// pullLatestCheckpoint copies what sampling reads of run's latest complete
// checkpoint from object storage to <data dir>/checkpoints/<run>/step-NNNNNNN
// (segment.PullNewestWeights: a whole copy there is taken as it is, the
// older ones removed) and returns that directory. A checkpoint whose upload
// never finished (no completion marker) is passed over, and so, with a
// line on stderr, is one whose files do not match their hashes.
func pullLatestCheckpoint(cmd *cobra.Command, run string) (string, error) {
	if err := checkName("run", run); err != nil {
		return "", err
	}
	cfg, err := loadConfig(cmd)
	if err != nil {
		return "", err
	}
	ctx := cmd.Context()
	objects, err := openStoreToRead(ctx, cfg, "checkpoint of run "+run)
	if err != nil {
		return "", err
	}
	damaged := 0
	dir, step, err := segment.PullNewestWeights(ctx, objects, run, filepath.Join(cfg.DataDir, "checkpoints", run), func(step int, err error) {
		damaged++
		fmt.Fprintf(cmd.ErrOrStderr(), "run %s: step %d in object storage did not download intact, passed over: %v\n", run, step, err)
	})
	if err != nil {
		return "", redactErr(cfg, err)
	}
	switch {
	case dir == "" && damaged > 0:
		return "", badInput("run %s: no complete checkpoint in object storage (%s) downloaded intact, as the lines above say: where the downloads differed from one another, something between here and the store changes them, and the stored copies may be intact: mend that and try again; otherwise training it on ('sched enqueue train %s') writes new ones from an intact local checkpoint on the worker's disk, if it has one; or give a local checkpoint with --checkpoint DIR",
			run, segment.CheckpointPrefix(run), run)
	case dir == "":
		// A name no run has is a typo, which training would refuse too.
		if err := checkRunKnown(run, "checkpoint in object storage"); err != nil {
			return "", err
		}
		return "", badInput("run %s has no complete checkpoint in object storage (%s) yet: a run uploads one every checkpoint_every steps of its training ('sched runs' says where it is; 'sched enqueue train %s' trains it), or give a local checkpoint with --checkpoint DIR",
			run, segment.CheckpointPrefix(run), run)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "run %s: step %d, from %s%s\n", run, step, segment.CheckpointPrefix(run), filepath.Base(dir))
	return dir, nil
}
