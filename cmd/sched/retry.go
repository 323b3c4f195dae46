package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer/runs"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "retry <task-id>",
		Short: "Run one task again: a failed, cancelled or finished one, or one waiting out its retry back-off",
		Long: `Run one task again from its stored payload. A failed or cancelled task
(archived) and a finished one are queued again under the same id; a task
waiting out its retry back-off runs now. A training segment resumes from its
run's last checkpoint; one of a run that is queued or training already, or
done at its total steps, is left alone (a run is one chain of segments; a
longer run is 'sched enqueue train <run>' after its total is raised). A task still queued or running
is left as it is.

To redo a whole job, enqueue it again with the same command instead: that
also re-queues what failed in it.`,
		Args: exactArgs(1, "one task id (see 'sched status' or 'sched runs')"),
		RunE: func(c *cobra.Command, args []string) error {
			q, err := commandQueue(c)
			if err != nil {
				return err
			}
			defer q.Close()
			if taskKind(args[0]).Kind() == scheduler.KindTrainSegment {
				ti, err := q.Find(c.Context(), args[0])
				if err != nil {
					return err
				}
				if a, err := scheduler.DecodeTask[scheduler.TrainSegment](ti.Payload); err == nil {
					if live, err := runIsLive(c, q, a.Run, ti.ID); live || err != nil {
						return err
					}
					// As enqueue train: a run done at its total steps, as
					// the runs entry here gives it (its state's where the
					// entry is not here), has nothing for a segment to
					// train, and an extension past its end that failed is
					// dropped.
					st, ok, err := scheduler.ReadRunState(c.Context(), q.Redis(), a.Run)
					if err != nil {
						return err
					}
					total := st.Total
					if set, err := runs.Load(os.Getenv("KILN_RUNS")); err == nil {
						if r, err := set.Get(a.Run); err == nil {
							total = r.RunConfig.WithDefaults().TotalSteps
						}
					}
					if ok && st.Done && st.Step >= total {
						return sayDoneDropping(c, q, a.Run, st.Step, total)
					}
				}
			}
			s, err := q.Retry(c.Context(), args[0])
			return printSubmitted(c.OutOrStdout(), taskKind(args[0]), s, err)
		},
	})
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
