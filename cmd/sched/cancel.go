package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/scheduler"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "cancel <task-id>",
		Short: "Cancel a queued or running task (it is archived, not retried)",
		Example: `  sched cancel train:segment:8258cc948f28b3fc7610
  sched cancel ingest:plan:1857df92f79d3eda8763`,
		Args: exactArgs(1, "one task id (see 'sched status')"),
		RunE: func(c *cobra.Command, args []string) error {
			q, err := commandQueue(c)
			if err != nil {
				return err
			}
			defer q.Close()
			state, err := q.Cancel(c.Context(), args[0])
			w := c.OutOrStdout()
			var done *scheduler.FinishedError
			if errors.As(err, &done) {
				// It does not run, as asked: a script that cancels a task
				// which ended a moment before is not told it erred.
				fmt.Fprintln(w, done.Error())
				return nil
			}
			if err != nil {
				return runNotTask(c.Context(), q, args[0], "cancel", err)
			}
			switch state {
			case "withdrawn":
				// It was not running: no stop, and no checkpoint of one.
				fmt.Fprintf(w, "%s cancelled: archived while it waited to run; it will not run\n", args[0])
			case "cancelled":
				// asynq lets go of the task as soon as its context ends,
				// before its handler has stopped: what the stop saves is
				// not known yet.
				stops := "its worker stops it at its next safe point"
				if strings.HasPrefix(args[0], scheduler.KindTrainSegment+":") {
					stops = "its worker stops it at the end of the step under way, and the segment writes that step's checkpoint if the step ends within the worker's grace (KILN_SHUTDOWN_GRACE; else its process is killed, and the steps since its last checkpoint are lost)"
				}
				fmt.Fprintf(w, "%s cancelled: archived, and it will not run again; %s: 'sched status %s' says where it stopped\n", args[0], stops, args[0])
			case "cancelling":
				fmt.Fprintf(w, "%s cancelling: asked its worker to stop, and it has not stopped yet (a checkpoint still writing, or a worker that stopped answering); it is archived when it stops, or without running again when another worker takes it back from a dead one ('sched status' shows which)\n", args[0])
			default:
				fmt.Fprintf(w, "%s %s before the cancel reached it\n", args[0], state)
			}
			return nil
		},
	})
}

// waitCancelStop waits while task id, which sched cancel archived, still
// stops (scheduler.Client.Stopping), saying so once, with what follows,
// then: the same work queued again meanwhile ran beside it, and its
// handler's end, the cancel's, read as the new task's failure.
func waitCancelStop(c *cobra.Command, q *scheduler.Client, id, then string) error {
	ctx := c.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	_, err := q.WaitStopped(ctx, id, func(scheduler.TaskStatus) {
		fmt.Fprintf(c.OutOrStdout(), "%s was cancelled and is still stopping (its worker stops it at its next safe point; a training segment writes the checkpoint of the step it stops at): waiting for it to stop, then %s (Ctrl-C leaves it)\n", id, then)
	})
	return err
}
