package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/internal/shell"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
)

func init() {
	var limit int
	var presets bool
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "Say what happened to each training run and to each task that ended, failed or was interrupted, newest first",
		Long: `runs lists each training run with what became of it (training, queued,
interrupted and re-queued, waiting for its tokenizer or stores, retrying
after a failed attempt, worker lost, done, cancelled, failed with its
reason, stopped; and, read from object storage, each run Redis has no
record of, its data lost, with its newest checkpoint there), then the
tasks that ended or were set back, newest first: completed (an ingest
step that reached its --max-tokens or --max-disk says so), cancelled
(archived by 'sched cancel'), failed for good (archived, with the
reason), failed and waiting to retry, waiting for earlier work, and
interrupted by a worker's shutdown and re-queued.
A wait or an interruption uses no retry and is no failed attempt.

--presets lists the runs 'sched enqueue train' takes instead: the presets
and those of the file KILN_RUNS names, with their model, length, batch,
tokenizer and engine. It needs no Redis.`,
		Example: `  sched runs
  sched runs --limit 10
  KILN_RUNS=runs.yaml sched runs --presets`,
		Args: func(c *cobra.Command, args []string) error {
			if presets && len(args) == 1 {
				// --presets FILE names a file elsewhere (sched ingest's
				// dataset presets); runs files are KILN_RUNS's.
				return argsError{fmt.Errorf("sched runs --presets takes no file: it lists the presets and the runs of the file KILN_RUNS names; to list those of %s, run KILN_RUNS=%s sched runs --presets", args[0], shell.Quote(args[0]))}
			}
			return exactArgs(0, "no arguments")(c, args)
		},
		RunE: func(c *cobra.Command, args []string) error {
			if presets {
				if c.Flags().Changed("limit") {
					return badInput("--limit %d: it limits the tasks 'sched runs' lists; --presets lists every run that can be enqueued: drop --limit, or --presets", limit)
				}
				return printRunPresets(c.OutOrStdout())
			}
			if limit < 1 {
				return badInput("--limit %d: give a positive number", limit)
			}
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			q, _, err := openQueue(c.Context(), cfg)
			if err != nil {
				return err
			}
			defer q.Close()
			snap, err := q.Snapshot(c.Context())
			if err != nil {
				return err
			}
			states, err := scheduler.ReadRunStates(c.Context(), q.Redis())
			if err != nil {
				return err
			}
			// The runs Redis lost its record of are known by their
			// checkpoints alone; a store that does not answer leaves them
			// out, saying so, and the rest is printed all the same; one
			// that refuses the credentials too, and the command then says
			// which to check and exits 2.
			stored := readStoredRuns(c.Context(), cfg)
			printRuns(c.OutOrStdout(), snap, states, stored, limit)
			return keysRefused(stored.err)
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "list at most this many tasks")
	cmd.Flags().BoolVar(&presets, "presets", false, "list the runs that can be enqueued (the presets and KILN_RUNS's file) instead")
	rootCmd.AddCommand(cmd)
}

func printRuns(w io.Writer, snap *scheduler.Snapshot, states []scheduler.RunState, stored storedRuns, limit int) {
	fmt.Fprintln(w, "RUNS")
	printRunLines(w, runViews(states, snap), stored, snap.At, "no training runs")
	fmt.Fprintln(w, "\nTASKS")
	type event struct {
		at time.Time
		t  scheduler.TaskStatus
	}
	var evs []event
	for _, t := range snap.Tasks {
		switch {
		case t.Ended():
			evs = append(evs, event{t.Finished, t})
		case t.State == "retry":
			evs = append(evs, event{t.LastFailed, t})
		case setBack(t) != "":
			evs = append(evs, event{t.Progress.Updated, t})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.After(evs[j].at) })
	more := max(len(evs)-limit, 0)
	evs = evs[:len(evs)-more]
	if len(evs) == 0 {
		fmt.Fprintln(w, "no task has ended yet")
	}
	for _, e := range evs {
		fmt.Fprintf(w, "%s  %s\n", e.at.Local().Format("2006-01-02 15:04:05"), outcomeLine(e.t))
	}
	switch {
	case more == 1:
		fmt.Fprintf(w, "and 1 earlier task (--limit %d lists it)\n", limit+more)
	case more > 1:
		fmt.Fprintf(w, "and %d earlier tasks (--limit %d lists them)\n", more, limit+more)
	}
}

// outcomeLine is a task that ended or was set back: id, its state as
// status says it (stateShown: a task set back reads what set it back, not
// asynq's "retry"), what happened in words, what it worked on, and its
// last message.
func outcomeLine(t scheduler.TaskStatus) string {
	parts := []string{t.ID, stateShown(t)}
	switch {
	case t.State == "completed" && t.HasProgress && t.Progress.State == "stopped":
		parts = append(parts, "stopped at its ingest's limit, as planned (not a failure)")
	case t.State == "completed":
		parts = append(parts, "done")
	case t.State == "archived" && t.Cancelled:
		// Where it stopped and what runs it again: a training segment's
		// run resumes from its checkpoint, nothing redone.
		parts = append(parts, cancelledNote(t, time.Now(), 320))
	case t.State == "archived":
		attempts := "1 attempt"
		if t.Retried > 0 {
			attempts = fmt.Sprintf("%d attempts", t.Retried+1)
		}
		parts = append(parts, fmt.Sprintf("failed for good after %s: %s%s", attempts, failureErr(t, 200), spentNote(t)))
	case setBack(t) == "interrupted":
		// After its state word: "interrupted  by a worker's shutdown ...".
		if scheduler.ProcessEndedAtStop(t.Progress.Message) {
			// Whole: which step it had reached, and the checkpoint it
			// resumes from.
			parts = append(parts, "by a worker's shutdown: "+scheduler.OneLine(strings.TrimPrefix(t.Progress.Message, scheduler.InterruptedBy+": "), 320)+"; re-queued (no retry used)")
			break
		}
		parts = append(parts, "by a worker's shutdown and re-queued (no retry used)")
	case setBack(t) == "waiting":
		when := "queued to look again"
		if t.State == "retry" {
			when = "looks again at " + t.NextRun.Local().Format("15:04:05")
		}
		parts = append(parts, fmt.Sprintf("%s; %s (no retry used)", keepRemedy(errorLine(t.Progress.Message, taskErrRunes), 240, t.ID), when))
	case t.State == "retry" && t.Retried == 0:
		// Set back without a failure, its worker's report of why lost.
		parts = append(parts, "re-queued (no retry used): "+failureErr(t, 200))
	case t.State == "retry":
		parts = append(parts, fmt.Sprintf("failed (attempt %d of %d), retries at %s: %s", t.Retried, t.MaxRetry+1,
			t.NextRun.Local().Format("15:04:05"), failureErr(t, 200)))
	}
	if s := scheduler.Subject(t.Kind, t.Payload); s != "" {
		parts = append(parts, s)
	}
	if t.HasProgress && t.Progress.Message != "" && t.State == "completed" {
		parts = append(parts, fmt.Sprintf("%q", t.Progress.Message))
	}
	return strings.Join(parts, "  ")
}

// modelLabel is rc's model as a line of runs shows it: its preset, and
// with a mixture of experts "+moe" with its experts and top k
// ("tiny+moe 4x2"), or a run differing only in its moe: would read as the
// dense one.
func modelLabel(rc trainer.RunConfig) string {
	if rc.MoE == nil {
		return rc.Model
	}
	m := rc.WithDefaults().MoE
	return fmt.Sprintf("%s+moe %dx%d", rc.Model, m.Experts, m.TopK)
}

// printRunPresets lists the runs there are (the embedded presets with
// KILN_RUNS's file applied, where it is set): each run's model (with its
// experts, modelLabel), length in tokens and
// steps, tokens a step (micro-batch x sequence x accumulation), tokenizer,
// engine and description.
func printRunPresets(w io.Writer) error {
	set, err := loadRuns()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tMODEL\tLENGTH\tSTEP\tTOKENIZER\tENGINE\tDESCRIPTION")
	for _, name := range set.Names() {
		r, err := set.Get(name)
		if err != nil {
			fmt.Fprintf(tw, "%s\t\t\t\t\t\tinvalid: %s\n", name, scheduler.OneLine(err.Error(), 160))
			continue
		}
		desc := scheduler.OneLine(r.Description, 100)
		if err := r.CheckWarmup(); err != nil {
			// Valid for a run under way, which resumes as it began.
			desc = "a new run of it is refused: " + scheduler.OneLine(err.Error(), 160)
		}
		per := int64(r.Batch) * int64(r.Seq) * int64(max(r.Accumulate, 1))
		length := fmt.Sprintf("%s (%d steps)", formatCount(int64(r.TotalSteps)*per, "tok"), r.TotalSteps)
		step := fmt.Sprintf("%dx%dx%d", r.Batch, r.Seq, max(r.Accumulate, 1))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, modelLabel(r.RunConfig), length, step, r.Tokenizer, r.Engine, desc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nstart one with 'sched enqueue train <run>'; add or change runs in a YAML file named by KILN_RUNS")
	return nil
}
