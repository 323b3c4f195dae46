package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/scheduler"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "retry <task-id>",
		Short: "Run one task again: a failed, cancelled or finished one, or one waiting out its retry back-off",
		Example: `  sched retry train:segment:8258cc948f28b3fc7610
  sched retry ingest:plan:1857df92f79d3eda8763`,
		Long: `Run one task again from its stored payload. A failed or cancelled task
(archived) and a finished one are queued again under the same id; a task
waiting out its retry back-off runs now. A training segment resumes from its
run's last checkpoint (or starts the run, where it has none), once its run is
checked as 'sched enqueue train' checks it (its tokenizer exists or is being
made, its stores, its settings against its checkpoints): one that would fail
the same way again is refused, saying what to do first. A segment of a run that
is queued or training already, or done at its total steps, is left alone (a run
is one chain of segments; a longer run is 'sched enqueue train <run>' after its
total is raised). A task still queued or running is left as it is.

To redo a whole job, enqueue it again with the same command instead: that
also re-queues what failed in it.`,
		Args: exactArgs(1, "one task id (see 'sched status' or 'sched runs')"),
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			ctx := c.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			q, _, err := openQueue(ctx, cfg)
			if err != nil {
				return err
			}
			defer q.Close()
			if err := waitCancelStop(c, q, args[0], "running it again"); err != nil {
				return err
			}
			var said scheduler.Args = taskKind(args[0])
			// A task not found is said so by the retry below, where a
			// segment's run is not needed.
			ti, findErr := q.Find(ctx, args[0])
			if findErr == nil {
				if v, want, older := scheduler.OlderPayload(ti.Type, ti.Payload); older {
					// Its workers refuse it again at once: the retry
					// would say it queued work that no worker does.
					return badInput("task %s was queued by an older kiln (payload version %d; this build reads version %d), and a retry queues the same payload, which this build's workers refuse: "+
						"enqueue the work again with the sched enqueue command that queued it (an ingest queues only the files its store lacks; a run resumes from its checkpoint). "+
						"Where this build's own enqueue queued the work, a worker of an older build still serves a queue: upgrade every worker ('sched status' marks, under WORKERS, each of other task formats), then enqueue it again",
						ti.ID, v, want)
				}
			}
			var notes []string
			run := "" // the segment's run, which names it as the other views do
			if taskKind(args[0]).Kind() == scheduler.KindTrainSegment {
				if findErr != nil {
					return findErr
				}
				if a, err := scheduler.DecodeTask[scheduler.TrainSegment](ti.Payload); err == nil {
					run = a.Run
					if live, err := runIsLive(c, q, a.Run, ti.ID); live || err != nil {
						return err
					}
					seg, more, done, err := checkRetrySegment(ctx, c, cfg, q, a)
					if done || err != nil {
						return err
					}
					said, notes = seg, more
				}
			}
			s, err := q.Retry(ctx, args[0])
			if dup := (*scheduler.DuplicateError)(nil); run != "" && errors.As(err, &dup) {
				// The segment itself, queued or running (runIsLive lets
				// it through): said as 'sched enqueue train' says it.
				fmt.Fprintf(c.OutOrStdout(), "run %s is already %s as %s; nothing queued ('sched status %s' follows it)\n", run, taskWord(ctx, q, dup.ID, dup.State), dup.ID, dup.ID)
				return nil
			}
			if err != nil {
				// A run's name is not a task's: it says what to type.
				err = runNotTask(ctx, q, args[0], "retry", err)
			}
			if err := printSubmitted(c.OutOrStdout(), said, s, err); err != nil {
				return err
			}
			printNotes(c.OutOrStdout(), notes)
			return nil
		},
	})
}

// checkRetrySegment makes the checks 'sched enqueue train' makes (checkRun)
// of a, the segment to run again: a segment archived for a tokenizer that
// does not exist, say, would fail the same way again, where enqueue train
// says what to do first. As enqueue train, it says that a run done at its
// total steps, as its runs entry here gives it, is done (done true), and
// drops its archived segments past its end. It returns the segment as the
// line that says it queued reads it: from the checkpoint the run resumes
// from, or from 0 where it has none, where the line said "resumes from
// its last checkpoint" of a run that had none; and checkRun's notes.
func checkRetrySegment(ctx context.Context, c *cobra.Command, cfg scheduler.Config, q *scheduler.Client, a scheduler.TrainSegment) (seg scheduler.TrainSegment, notes []string, done bool, err error) {
	set, err := loadRuns()
	if err != nil {
		return seg, nil, false, err
	}
	run, err := getRun(set, a.Run)
	if err != nil {
		return seg, nil, false, err
	}
	// The segment's tokenizer, pinned by --tokenizer when it was
	// enqueued, else the run's, else the configured default, as the
	// worker picks it.
	tok := a.Tokenizer
	if tok == "" {
		tok = run.Tokenizer
	}
	if tok == "" {
		tok = cfg.Tokenizer
	}
	objects, err := openStore(ctx, cfg)
	if err != nil {
		return seg, nil, false, err
	}
	pos, notes, err := checkRun(ctx, trainCheck{cfg: cfg, q: q, objects: objects}, run, tok)
	if err != nil {
		return seg, nil, false, err
	}
	at, total := trainedTo(pos.st, pos.ok, pos.from), run.RunConfig.WithDefaults().TotalSteps
	if at >= total && (!pos.ok || pos.st.Done) {
		return seg, nil, true, sayDoneDropping(c, q, a.Run, at, total)
	}
	return scheduler.TrainSegment{Run: a.Run, FromStep: pos.from}, notes, false, nil
}

// taskKind is the kind a task id begins with, as printSubmitted names it.
type taskKind string

func (k taskKind) Kind() string {
	for i := len(k) - 1; i >= 0; i-- {
		if k[i] == ':' {
			return string(k[:i])
		}
	}
	return string(k)
}
