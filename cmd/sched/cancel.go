package main

import (
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
		Args:  exactArgs(1, "one task id (see 'sched status')"),
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
				kept := ""
				if strings.HasPrefix(args[0], scheduler.KindTrainSegment+":") {
					kept = " (the segment keeps the checkpoint of its stop step)"
				}
				fmt.Fprintf(w, "%s cancelled: stopped and archived; it will not run again%s\n", args[0], kept)
			case "cancelling":
				fmt.Fprintf(w, "%s cancelling: asked its worker to stop, and it has not stopped yet (a checkpoint still writing, or a worker that stopped answering); it is archived when it stops, or without running again when another worker takes it back from a dead one ('sched status' shows which)\n", args[0])
			default:
				fmt.Fprintf(w, "%s %s before the cancel reached it\n", args[0], state)
			}
			return nil
		},
	})
}
