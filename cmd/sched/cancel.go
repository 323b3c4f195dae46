package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "cancel <task-id>",
		Short: "Cancel a queued or running task (it is archived, not retried)",
		Args:  exactArgs(1, "one task id (see 'sched status')"),
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			q, _, err := openQueue(c.Context(), cfg)
			if err != nil {
				return err
			}
			defer q.Close()
			state, err := q.Cancel(c.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "%s %s\n", args[0], state)
			return nil
		},
	})
}
