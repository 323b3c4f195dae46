package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/internal/redismem"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/runs"
)

func init() {
	enq := &cobra.Command{
		Use:   "enqueue",
		Short: "Queue work: ingest a dataset, train a run, benchmark, train a tokenizer",
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return badInput("unknown work %q: use one of ingest, train, bench, tokenizer (see 'sched enqueue --help')", args[0])
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			return badInput("say what to enqueue: ingest, train, bench or tokenizer (see 'sched enqueue --help')")
		},
	}

	ingest := &cobra.Command{
		Use:   "ingest <dataset>",
		Short: "Plan the ingest of a dataset (ingest:plan); CPU workers then fetch and tokenize its files",
		Long: `Plan the ingest of a dataset (ingest:plan); CPU workers then fetch and tokenize its
files, and the append worker fills its token store.

The files are tokenized with the tokenizer --tokenizer names (KILN_TOKENIZER;
default mix-16384; 'sched tokenizers' lists them), which must exist or be
queued ('sched enqueue tokenizer': the files wait for it). A store holds one
tokenizer's ids, and a run reads the stores of its own tokenizer.
The dataset is a preset ('sched datasets' lists them, KILN_DATASETS adds
yours) or local:<glob>, files on the workers' disks under KILN_LOCAL_ROOTS.`,
		Args: exactArgs(1, "one dataset: a preset ('sched datasets' lists them) or local:<glob>"),
		Example: `  sched enqueue ingest the-stack-v2 --max-tokens 1.5B
  sched enqueue ingest the-stack-v2 --set language=Go,Rust --store code-go-rust
  sched enqueue ingest 'local:/data/repos/**/*.go' --store my-go --tokenizer mix-16384`,
	}
	var ingestStore string
	var ingestPlan planFlags
	ingest.Flags().StringVar(&ingestStore, "store", "", "token store name (default: the dataset's name; required for local:<glob>)")
	noEmpty(ingest.Flags(), "store", "a token store's name", "the dataset's name")
	ingestPlan.register(ingest.Flags())
	ingest.RunE = func(c *cobra.Command, args []string) error {
		return enqueueIngest(c, args[0], ingestStore, ingestPlan)
	}

	bench := &cobra.Command{
		Use:   "bench <sweep|model|run>",
		Short: "Queue a benchmark (bench:run) on the GPU worker",
		Long: `Queue a benchmark on the GPU worker; 'sched results bench' prints what it measured.

  sched enqueue bench sweep    the sweep's shapes (the pilot's step among them)
  sched enqueue bench small    one model preset, at --batch x --seq (32 x 1024)
  sched enqueue bench pilot    a run's own step: its model, engine, precision,
                               batch, sequence and accumulate, on its gpus,
                               which its 'tok/s vs bench' gate compares the
                               run with

Flags given override what the model's defaults or the run's settings say.`,
		Args: exactArgs(1, "one sweep, model or run name"),
		Example: `  sched enqueue bench sweep
  sched enqueue bench pilot
  sched enqueue bench base --batch 16 --seq 1024 --precision bf16`,
	}
	var br scheduler.BenchRun
	bench.Flags().StringVar(&br.Engine, "engine", "auto", "engine: cuda, cpu or auto (a run's bench: the run's engine unless given)")
	var isSweep bool
	bench.Flags().BoolVar(&isSweep, "sweep", false, "the name is the sweep (\"sweep\", the one there is), not a model or a run")
	var st benchStep
	var benchWarmup optionalInt
	bench.Flags().IntVar(&st.batch, "batch", 0, "micro-batch of a model's measurement (default 32, or the run's)")
	bench.Flags().IntVar(&st.seq, "seq", 0, "sequence length of a model's measurement (default 1024, or the run's)")
	bench.Flags().IntVar(&st.accumulate, "accumulate", 0, "micro-batches a step over all GPUs, as a run's accumulate (default one a GPU, or the run's)")
	bench.Flags().StringVar(&st.precision, "precision", "", "bf16 or fp32 (default bf16, or the run's)")
	noEmpty(bench.Flags(), "precision", "bf16 or fp32", "bf16, or the run's")
	bench.Flags().IntVar(&st.steps, "steps", 0, "timed steps (default: sched bench's 30)")
	bench.Flags().Var(&benchWarmup, "warmup", "untimed steps first (default: sched bench's 8)")
	bench.RunE = func(c *cobra.Command, args []string) error {
		cfg, err := loadConfig(c)
		if err != nil {
			return err
		}
		if err := checkName("benchmark", args[0]); err != nil {
			return err
		}
		sweep := isSweep || args[0] == "sweep"
		if isSweep && args[0] != "sweep" {
			return badInput("--sweep %q: the one sweep is \"sweep\": 'sched enqueue bench sweep'", args[0])
		}
		for _, f := range []struct {
			name string
			v    int
		}{{"batch", st.batch}, {"seq", st.seq}, {"steps", st.steps}, {"accumulate", st.accumulate}} {
			if c.Flags().Changed(f.name) && f.v == 0 {
				return badInput("--%s 0: give at least 1, or leave it out for the default", f.name)
			}
		}
		st.warmup = -1
		if benchWarmup.set {
			if benchWarmup.v < 0 {
				return badInput("--warmup %d: give 0 or more untimed steps, or leave it out for the default", benchWarmup.v)
			}
			st.warmup = benchWarmup.v
		}
		if sweep {
			br.Sweep = args[0]
		} else if br.Model = args[0]; !isModel(args[0]) {
			// A run's name: its own step, with what the flags change.
			run, err := benchedRun(args[0])
			if err != nil {
				return err
			}
			rc := run.RunConfig
			br.Model, st.moe = rc.Model, rc.MoE.String()
			if !c.Flags().Changed("engine") && rc.Engine != "" {
				br.Engine = rc.Engine
			}
			for _, f := range []struct {
				v    *int
				from int
			}{{&st.batch, rc.Batch}, {&st.seq, rc.Seq}, {&st.accumulate, rc.Accumulate}} {
				if *f.v == 0 {
					*f.v = f.from
				}
			}
			if st.precision == "" {
				st.precision = rc.Precision
			}
			// The worker measures on the GPUs the run trains on, which
			// are its own where it names them.
			if rc.GPUs != 0 {
				if model.CheckGPUs(br.Engine, int(rc.GPUs)) != nil {
					return badInput("--engine %s: run %s trains on gpus %s, which needs the cuda engine: give --engine cuda or auto, or leave --engine out for the run's", br.Engine, args[0], rc.GPUs)
				}
				br.GPUs = rc.GPUs.String()
			}
		}
		params, err := benchParams(sweep, st)
		if err != nil {
			return err
		}
		if br.Model != "" {
			if err := benchFits(br.Model, br.Engine, st.batch, st.seq); err != nil {
				return err
			}
		}
		br.Params = params
		return enqueueOne(c, cfg, br)
	}

	enq.AddCommand(ingest, newEnqueueTrainCmd(), bench, newEnqueueTokenizerCmd())
	rootCmd.AddCommand(enq)
}

// optionalInt is an int flag that may be left out, so that the worker's
// default applies: the help shows no default for it, where a sentinel
// such as -1 would read as one.
type optionalInt struct {
	v   int
	set bool
}

func (o *optionalInt) String() string {
	if !o.set {
		return ""
	}
	return strconv.Itoa(o.v)
}

func (o *optionalInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("%q is not a whole number", s)
	}
	o.v, o.set = n, true
	return nil
}

func (o *optionalInt) Type() string { return "int" }

// isModel reports whether name is a model preset.
func isModel(name string) bool {
	_, err := model.Preset(name)
	return err == nil
}

// benchedRun is the run `sched enqueue bench NAME` measures the step of,
// or bad input naming the models and runs there are.
func benchedRun(name string) (runs.Run, error) {
	set, err := loadRuns()
	if err != nil {
		return runs.Run{}, err
	}
	run, err := set.Get(name)
	if err != nil {
		if _, ok := set[name]; ok {
			return runs.Run{}, invalidRun(err)
		}
		return runs.Run{}, badInput("%q is neither a model (%s) nor a run (%s, or one in a runs file named by KILN_RUNS), nor sweep",
			name, strings.Join(slices.Sorted(maps.Keys(model.Presets)), ", "), strings.Join(set.Names(), ", "))
	}
	return run, nil
}

// checkName rejects names that cannot be an object-store prefix element
// (store.CheckName's rule, the same for every kind of name).
func checkName(what, name string) error {
	if err := store.CheckName(what, name); err != nil {
		return badInput("%v", err)
	}
	return nil
}

// enqueueOne queues a as a person asks for it (scheduler.Client.Again) and
// says what happened: queued, queued again in place of a finished or
// failed task, a waiting retry started now, or already queued (exit 0).
func enqueueOne(c *cobra.Command, cfg scheduler.Config, a scheduler.Args) error {
	return enqueueFrom(c, cfg, a, "")
}

// enqueueFrom is enqueueOne whose "queued" line of a training segment
// says of the step it resumes from what where adds ("" for nothing): the
// step is the newest checkpoint the CLI can see, and the worker may hold a
// newer one.
func enqueueFrom(c *cobra.Command, cfg scheduler.Config, a scheduler.Args, where string) error {
	ctx := c.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	q, _, err := openQueue(ctx, cfg)
	if err != nil {
		return err
	}
	defer q.Close()
	if ts, ok := a.(scheduler.TrainSegment); ok {
		if live, err := runIsLive(c, q, ts.Run, ""); live || err != nil {
			return err
		}
	}
	s, err := q.Again(ctx, a)
	if ts, ok := a.(scheduler.TrainSegment); ok && where != "" && err == nil && s.Was == "" && ts.FromStep > 0 {
		fmt.Fprintf(c.OutOrStdout(), "queued %s on %s; the run resumes from its last checkpoint (step %d, %s)\n", s.Info.ID, s.Info.Queue, ts.FromStep, where)
		return nil
	}
	return printSubmitted(c.OutOrStdout(), a, s, err)
}

// runIsLive says (and prints) whether run has a segment queued or training
// other than the task except: a run is one chain of segments, and is not
// started a second time, by an enqueue or by a retry of an old segment.
func runIsLive(c *cobra.Command, q *scheduler.Client, run, except string) (bool, error) {
	ctx := c.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	live, err := q.LiveSegment(ctx, run)
	if err != nil || live == nil || live.ID == except {
		return false, err
	}
	fmt.Fprintf(c.OutOrStdout(), "run %s is already %s as %s; nothing queued ('sched status %s' follows it)\n", run, taskWord(ctx, q, live.ID, live.State.String()), live.ID, live.ID)
	return true, nil
}

// taskWord is how enqueue says the state of a task already queued, as
// status does (setBack): asynq's retry state holds a task whose attempt
// failed beside one set back by its worker's shutdown or to wait, which
// used no retry and which "waiting to retry" would misread.
func taskWord(ctx context.Context, q *scheduler.Client, id, state string) string {
	if ts, err := q.Task(ctx, id); err == nil {
		switch setBack(ts) {
		case "interrupted":
			return "queued again after its worker's shutdown (no retry used)"
		case "waiting":
			return "waiting (no retry used)"
		}
	}
	return stateWord(state)
}

// printSubmitted says what Again did with a; a duplicate is reported, not
// an error.
func printSubmitted(w io.Writer, a scheduler.Args, s scheduler.Submitted, err error) error {
	var dup *scheduler.DuplicateError
	if errors.As(err, &dup) {
		fmt.Fprintf(w, "%s is already %s as %s; nothing queued\n", a.Kind(), stateWord(dup.State), dup.ID)
		return nil
	}
	if errors.As(err, new(*redismem.FullError)) {
		return fmt.Errorf("%w; %s was not queued: run this again once Redis takes writes", err, a.Kind())
	}
	if err != nil {
		return err
	}
	resumes := ""
	ts, isSegment := a.(scheduler.TrainSegment)
	switch {
	case isSegment && ts.FromStep == 0:
		// sched enqueue train found no checkpoint of the run.
		resumes = "; the run starts at step 0, having no checkpoint"
	case a.Kind() == scheduler.KindTrainSegment:
		resumes = "; the run resumes from its last checkpoint"
	}
	switch {
	case s.Was == "" && ts.FromStep > 0:
		fmt.Fprintf(w, "queued %s on %s%s (step %d)\n", s.Info.ID, s.Info.Queue, resumes, ts.FromStep)
	case s.Was == "":
		fmt.Fprintf(w, "queued %s on %s\n", s.Info.ID, s.Info.Queue)
	case s.Was == "retry" && s.Reported == "interrupted":
		// Set back by its worker's shutdown, as status says (setBack):
		// no attempt failed, and "waiting to retry" would say one did.
		fmt.Fprintf(w, "%s was queued again after its worker's shutdown (no retry used); running it now%s\n", s.Info.ID, resumes)
	case s.Was == "retry" && s.Reported == "waiting":
		fmt.Fprintf(w, "%s was waiting (no retry used): %q; running it now%s\n", s.Info.ID, keepRemedy(errorLine(s.LastErr, taskErrRunes), 200, s.Info.ID), resumes)
	case s.Was == "retry":
		fmt.Fprintf(w, "%s was waiting to retry after %q; running it now%s\n", s.Info.ID, keepRemedy(errorLine(s.LastErr, taskErrRunes), 200, s.Info.ID), resumes)
	case s.Was == "archived" && s.Cancelled:
		fmt.Fprintf(w, "queued %s on %s again (it had been cancelled by sched cancel)%s\n", s.Info.ID, s.Info.Queue, resumes)
	case s.Was == "archived":
		why := ""
		if s.LastErr != "" {
			why = fmt.Sprintf(" after %q", keepRemedy(errorLine(s.LastErr, taskErrRunes), 200, s.Info.ID))
		}
		fmt.Fprintf(w, "queued %s on %s again (it had stopped%s)%s\n", s.Info.ID, s.Info.Queue, why, resumes)
	default:
		fmt.Fprintf(w, "queued %s on %s again (it had %s)%s\n", s.Info.ID, s.Info.Queue, s.Was, resumes)
	}
	return nil
}

// stateWord is asynq's task state as a person says it.
func stateWord(state string) string {
	switch state {
	case "active":
		return "running"
	case "pending", "scheduled":
		return "queued"
	case "retry":
		return "waiting to retry"
	case "":
		return "queued"
	}
	return state
}

// benchStep is what enqueue bench's flags (or a run's settings) say of
// the step to measure: 0, -1 for warmup and "" leave it to the worker.
type benchStep struct {
	batch, seq, accumulate, steps, warmup int
	precision, moe                        string
}

// benchParams maps a benchStep onto bench:run's params, leaving out what
// was not given so that the worker's defaults apply and the same
// measurement queued twice is one task.
func benchParams(sweep bool, st benchStep) (map[string]string, error) {
	if sweep && (st.batch != 0 || st.seq != 0 || st.accumulate != 0 || st.precision != "") {
		return nil, badInput("--batch, --seq, --accumulate and --precision choose a model's step; the sweep has its own shapes: drop them or name a model or run")
	}
	switch st.precision {
	case "", "bf16", "fp32":
	default:
		return nil, badInput("--precision %q: use bf16 or fp32", st.precision)
	}
	p := map[string]string{}
	for _, f := range []struct {
		name string
		v    int
	}{{"batch", st.batch}, {"seq", st.seq}, {"accumulate", st.accumulate}, {"steps", st.steps}} {
		switch {
		case f.v < 0:
			return nil, badInput("--%s %d: give a positive number", f.name, f.v)
		case f.v > 0:
			p[f.name] = strconv.Itoa(f.v)
		}
	}
	if st.warmup >= 0 {
		p["warmup"] = strconv.Itoa(st.warmup)
	}
	for k, v := range map[string]string{"precision": st.precision, "moe": st.moe} {
		if v != "" {
			p[k] = v
		}
	}
	if len(p) == 0 {
		return nil, nil
	}
	return p, nil
}
