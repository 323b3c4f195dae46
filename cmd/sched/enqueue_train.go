package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// newEnqueueTrainCmd is `sched enqueue train`, added to the enqueue
// command by enqueue.go.
func newEnqueueTrainCmd() *cobra.Command {
	var engine string
	cmd := &cobra.Command{
		Use:   "train <run>",
		Short: "Queue a run's training (train:segment) for the GPU worker, or resume a stopped one",
		Long: `Queues the first training segment of a run; each segment queues the next until the
run is done. A run is a name in the run presets ('sched runs --presets' lists them:
pilot, pilot-cpu, long, demo) or in your own YAML file named by KILN_RUNS, on this machine
and on the GPU worker; the run says the model, the data mixture, the tokenizer and
the schedule.

Before anything is queued the run is checked: its settings, its tokenizer (made, or
being made by 'sched enqueue tokenizer'), the tokenizer's vocabulary against the
model's, and each token store of its mixture (filled, or being filled by 'sched
enqueue ingest', with at least one held-out window for evaluation). A run whose
tokenizer or stores are still being made waits for them on the worker.

Enqueuing a run that was cancelled, stopped or failed resumes it from its last
checkpoint; a run already queued or training is left alone.`,
		Args: exactArgs(1, "one run name"),
	}
	cmd.Flags().StringVar(&engine, "engine", "", "engine: cuda, cpu or auto (default: the run's)")
	cmd.RunE = func(c *cobra.Command, args []string) error {
		cfg, err := loadConfig(c)
		if err != nil {
			return err
		}
		if err := checkName("run", args[0]); err != nil {
			return err
		}
		switch engine {
		case "", "auto", "cuda", "cpu":
		default:
			return badInput("--engine %q: use cuda, cpu or auto", engine)
		}
		set, err := runs.Load(os.Getenv("KILN_RUNS"))
		if err != nil {
			return badInput("KILN_RUNS: %v", err)
		}
		run, err := set.Get(args[0])
		if err != nil {
			return err
		}
		// A run names the tokenizer its stores were made with, and that
		// wins over the configured default; only an explicit --tokenizer
		// overrides it (and the worker then checks the stores against it).
		ts := scheduler.TrainSegment{Run: args[0], Engine: engine}
		tok := run.Tokenizer
		if c.Flags().Changed("tokenizer") || tok == "" {
			ts.Tokenizer, tok = cfg.Tokenizer, cfg.Tokenizer
		}
		ctx := c.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		objects, err := openStore(ctx, cfg)
		if err != nil {
			return err
		}
		q, _, err := openQueue(ctx, cfg)
		if err != nil {
			return err
		}
		defer q.Close()
		if err := checkRun(ctx, trainCheck{cfg: cfg, q: q, objects: objects}, run, tok); err != nil {
			return err
		}
		// A run that has checkpointed resumes from its newest checkpoint
		// (the worker finds it); the segment says so, which also gives it
		// its own task id rather than the first segment's, long finished.
		st, ok, err := scheduler.ReadRunState(ctx, q.Redis(), ts.Run)
		if err != nil {
			return err
		}
		if ok && st.Checkpoint > 0 {
			ts.FromStep = int64(st.Checkpoint)
		} else {
			// Redis lost the run's state (its data lost, or another
			// Redis): object storage still says where the run is.
			steps, err := segment.RemoteSteps(ctx, objects, ts.Run)
			if err != nil {
				return err
			}
			if len(steps) > 0 {
				ts.FromStep = int64(steps[len(steps)-1])
			}
		}
		return enqueueOne(c, cfg, ts)
	}
	return cmd
}

// trainCheck is what checkRun reads: the queue (work under way), the
// object store (tokenizers, store status) and the local data directory.
type trainCheck struct {
	cfg     scheduler.Config
	q       *scheduler.Client
	objects store.Store
}

// checkRun refuses, as bad input naming the command to run first, a run
// that could never train: invalid settings, a tokenizer that neither
// exists nor is being made, a vocabulary larger than the model's, a store
// that is neither filled nor being filled, or one too small to hold out an
// evaluation window.
func checkRun(ctx context.Context, tc trainCheck, run runs.Run, tok string) error {
	rc := run.RunConfig.WithDefaults()
	if err := rc.Validate(); err != nil {
		return badInput("run %s: %v", run.Name, err)
	}
	mc, err := rc.ModelConfig()
	if err != nil {
		return badInput("run %s: %v", run.Name, err)
	}
	// The GPU worker's device is unknown here: refuse what no card kiln
	// supports could hold (the worker sizes it against its own device).
	engine := rc.Engine
	if engine == "auto" {
		engine = "cuda"
	}
	plan := model.MemoryPlan{Config: mc, Engine: engine, Precision: rc.Precision, Batch: rc.Batch, Seq: rc.Seq, Purpose: model.PurposeTrain}
	if err := model.CheckMemory(plan, model.LargestGPU, "the largest card kiln supports (an H200, 141 GB)"); err != nil {
		return badInput("run %s: %v (set batch, seq and accumulate in the run)", run.Name, err)
	}
	if err := checkRunTokenizer(ctx, tc, run.Name, tok, rc.Model, mc); err != nil {
		return err
	}
	// Evaluation needs one held-out window in any of the stores. Which
	// windows are held out depends on their index alone: a store has one
	// once it holds the first of them.
	first := tokens.FirstHeldOut(0)
	need := (first + 1) * int64(rc.Seq+1)
	var most int64
	filling := false
	for _, m := range rc.Mixture {
		held, live, err := checkRunStore(ctx, tc, run.Name, m.Store)
		if err != nil {
			return err
		}
		most, filling = max(most, held), filling || live
	}
	if rc.EvalEvery > 0 && rc.EvalBatches > 0 && !filling && most < need {
		return badInput("run %s: its token stores hold at most %d tokens, too few for one evaluation window (about 1 window of %d tokens in %d is held out, the first of them at window %d, so a store needs %d tokens): ingest more, or set eval_every: 0 in the run",
			run.Name, most, rc.Seq+1, tokens.DefaultHoldOut, first, need)
	}
	return nil
}

func checkRunTokenizer(ctx context.Context, tc trainCheck, run, name, modelName string, mc model.Config) error {
	if name == "" {
		return badInput("run %s names no tokenizer: set tokenizer: in its runs entry, or pass --tokenizer NAME", run)
	}
	entry, _, err := catalog.New(tc.objects, tc.cfg.DataDir).Resolve(ctx, name)
	var nf *catalog.NotFoundError
	switch {
	case errors.As(err, &nf):
		live, lerr := tc.q.LiveTokenizer(ctx, name)
		if lerr != nil {
			return lerr
		}
		if live == nil {
			return badInput("run %s trains with tokenizer %s, which does not exist yet: make it first with 'sched enqueue tokenizer %s' ('sched tokenizers' lists the existing ones)", run, name, name)
		}
		return nil // the worker waits for it
	case err != nil:
		return err
	}
	if entry.VocabSize > mc.VocabSize {
		return badInput("run %s: tokenizer %s has %d ids but the %s model's vocab_size is %d: use a tokenizer of at most %d ids, or a model with a larger vocab_size",
			run, name, entry.VocabSize, modelName, mc.VocabSize, mc.VocabSize)
	}
	return nil
}

// checkRunStore refuses a store of the run that holds nothing and that no
// ingest is filling; it returns the tokens the store holds, and whether an
// ingest is filling it.
func checkRunStore(ctx context.Context, tc trainCheck, run, name string) (held int64, filling bool, err error) {
	if filepath.IsAbs(name) {
		m, err := tokens.ReadManifest(name)
		if err != nil {
			return 0, false, badInput("run %s trains on the token store at %s: %v", run, name, err)
		}
		held = m.Tokens
	} else {
		st, err := (&ingest.Pipeline{Objects: tc.objects}).Status(ctx, name)
		if err != nil {
			return 0, false, err
		}
		held = st.Tokens
		// A store filled in this process's data directory without the
		// queue (sched ingest --direct) publishes no status.
		if m, err := tokens.ReadManifest(filepath.Join(tc.cfg.DataDir, "tokens", name)); err == nil && m.Tokens > held {
			held = m.Tokens
		}
		live, err := tc.q.LiveIngest(ctx, name)
		if err != nil {
			return 0, false, err
		}
		if live > 0 {
			return held, true, nil // the worker waits for the ingest
		}
	}
	if held == 0 {
		first := "sched enqueue ingest " + name
		if presets, err := ingest.Presets(""); err != nil || presets[name].Name == "" {
			first = "sched enqueue ingest <dataset> --store " + name
		}
		return 0, false, badInput("run %s trains on token store %s, which holds no tokens and which no ingest is filling: run '%s' first ('sched status' shows an ingest that failed)", run, name, first)
	}
	return held, false, nil
}
