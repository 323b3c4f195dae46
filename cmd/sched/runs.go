package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func init() {
	var limit int
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List finished tasks (completed, failed or cancelled), newest first",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(c *cobra.Command, args []string) error {
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
			runs, err := q.Runs(c.Context(), limit)
			if err != nil {
				return err
			}
			w := c.OutOrStdout()
			if len(runs) == 0 {
				fmt.Fprintln(w, "no finished tasks")
			}
			for _, r := range runs {
				fmt.Fprintf(w, "%s  ", r.Finished.Local().Format("2006-01-02 15:04:05"))
				printTask(w, r)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "show at most this many")
	rootCmd.AddCommand(cmd)
}
