package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/scheduler"
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
		Args:  exactArgs(1, "one dataset (a Hugging Face id like bigcode/the-stack-v2-dedup, or a path)"),
	}
	var ingestStore string
	var ingestPlan planFlags
	ingest.Flags().StringVar(&ingestStore, "store", "", "token store name (default: the dataset's name; required for local:<glob>)")
	ingestPlan.register(ingest.Flags())
	ingest.RunE = func(c *cobra.Command, args []string) error {
		return enqueueIngest(c, args[0], ingestStore, ingestPlan)
	}

	bench := &cobra.Command{
		Use:   "bench <sweep|model>",
		Short: "Queue a benchmark (bench:run) on the GPU worker",
		Args:  exactArgs(1, "one sweep or model name"),
	}
	var br scheduler.BenchRun
	bench.Flags().StringVar(&br.Engine, "engine", "auto", "engine: cuda, cpu or auto")
	var isSweep bool
	bench.Flags().BoolVar(&isSweep, "sweep", false, "the name is a sweep, not a model")
	var benchBatch, benchSeq, benchSteps, benchWarmup int
	bench.Flags().IntVar(&benchBatch, "batch", 0, "micro-batch of a model's measurement (default 32)")
	bench.Flags().IntVar(&benchSeq, "seq", 0, "sequence length of a model's measurement (default 1024)")
	bench.Flags().IntVar(&benchSteps, "steps", 0, "timed steps (0: sched bench's 30)")
	bench.Flags().IntVar(&benchWarmup, "warmup", -1, "untimed steps first (default: sched bench's 8)")
	bench.RunE = func(c *cobra.Command, args []string) error {
		cfg, err := loadConfig(c)
		if err != nil {
			return err
		}
		if err := checkName("benchmark", args[0]); err != nil {
			return err
		}
		if isSweep || args[0] == "sweep" {
			br.Sweep = args[0]
		} else {
			br.Model = args[0]
		}
		for _, f := range []struct {
			name string
			v    int
		}{{"batch", benchBatch}, {"seq", benchSeq}, {"steps", benchSteps}} {
			if c.Flags().Changed(f.name) && f.v == 0 {
				return badInput("--%s 0: give at least 1, or leave it out for the default", f.name)
			}
		}
		params, err := benchParams(isSweep || args[0] == "sweep", benchBatch, benchSeq, benchSteps, benchWarmup)
		if err != nil {
			return err
		}
		if br.Model != "" {
			if err := benchFits(br.Model, br.Engine, benchBatch, benchSeq); err != nil {
				return err
			}
		}
		br.Params = params
		return enqueueOne(c, cfg, br)
	}

	enq.AddCommand(ingest, newEnqueueTrainCmd(), bench, newEnqueueTokenizerCmd())
	rootCmd.AddCommand(enq)
}

// checkName rejects names that cannot be an object-store prefix element.
func checkName(what, name string) error {
	if name == "" || strings.ContainsAny(name, "/\\ \t\n") || name == "." || name == ".." {
		return badInput("%s name %q: use letters, digits, '-', '_' or '.' (no slashes or spaces)", what, name)
	}
	return nil
}

// enqueueOne queues a as a person asks for it (scheduler.Client.Again) and
// says what happened: queued, queued again in place of a finished or
// failed task, a waiting retry started now, or already queued (exit 0).
func enqueueOne(c *cobra.Command, cfg scheduler.Config, a scheduler.Args) error {
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
		// A run is one chain of segments: a run already training or queued
		// is not started a second time.
		live, err := q.LiveSegment(ctx, ts.Run)
		if err != nil {
			return err
		}
		if live != nil {
			fmt.Fprintf(c.OutOrStdout(), "run %s is already %s as %s; nothing queued ('sched status %s' follows it)\n", ts.Run, stateWord(live.State.String()), live.ID, live.ID)
			return nil
		}
	}
	s, err := q.Again(ctx, a)
	return printSubmitted(c.OutOrStdout(), a, s, err)
}

// printSubmitted says what Again did with a; a duplicate is reported, not
// an error.
func printSubmitted(w io.Writer, a scheduler.Args, s scheduler.Submitted, err error) error {
	var dup *scheduler.DuplicateError
	if errors.As(err, &dup) {
		fmt.Fprintf(w, "%s is already %s as %s; nothing queued\n", a.Kind(), stateWord(dup.State), dup.ID)
		return nil
	}
	if err != nil {
		return err
	}
	resumes := ""
	if a.Kind() == scheduler.KindTrainSegment {
		resumes = "; the run resumes from its last checkpoint"
	}
	switch s.Was {
	case "":
		fmt.Fprintf(w, "queued %s on %s\n", s.Info.ID, s.Info.Queue)
	case "retry":
		fmt.Fprintf(w, "%s was waiting to retry after %q; running it now%s\n", s.Info.ID, s.LastErr, resumes)
	case "archived":
		why := ""
		if s.LastErr != "" {
			why = fmt.Sprintf(" after %q", s.LastErr)
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

// benchParams maps enqueue bench's shape flags onto bench:run's params,
// leaving out what was not given so that the worker's defaults apply and
// the same measurement queued twice is one task.
func benchParams(sweep bool, batch, seq, steps, warmup int) (map[string]string, error) {
	if sweep && (batch != 0 || seq != 0) {
		return nil, badInput("--batch and --seq choose a model's shape; the sweep has its own shapes: drop them or name a model")
	}
	p := map[string]string{}
	for _, f := range []struct {
		name string
		v    int
	}{{"batch", batch}, {"seq", seq}, {"steps", steps}} {
		switch {
		case f.v < 0:
			return nil, badInput("--%s %d: give a positive number", f.name, f.v)
		case f.v > 0:
			p[f.name] = strconv.Itoa(f.v)
		}
	}
	if warmup >= 0 {
		p["warmup"] = strconv.Itoa(warmup)
	}
	if len(p) == 0 {
		return nil, nil
	}
	return p, nil
}
