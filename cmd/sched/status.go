package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer/segment"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "status [task-id]",
		Short: "Show queues with their sizes, running tasks with their progress and training runs, or one task",
		Args:  cobra.MaximumNArgs(1),
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
			w := c.OutOrStdout()
			if len(args) == 1 {
				ts, err := q.Task(c.Context(), args[0])
				if err != nil {
					return err
				}
				printTask(w, ts)
				return nil
			}
			qs, err := q.Status(c.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%-8s %6s %8s %7s %6s %9s %9s\n", "QUEUE", "SIZE", "PENDING", "ACTIVE", "RETRY", "ARCHIVED", "COMPLETED")
			for _, s := range qs {
				paused := ""
				if s.Paused {
					paused = " (paused)"
				}
				fmt.Fprintf(w, "%-8s %6d %8d %7d %6d %9d %9d%s\n", s.Name, s.Size, s.Pending, s.Active, s.Retry, s.Archived, s.Completed, paused)
			}
			fmt.Fprintln(w)
			running := 0
			for _, s := range qs {
				for _, ts := range s.Running {
					printTask(w, ts)
					running++
				}
			}
			if running == 0 {
				fmt.Fprintln(w, "no running tasks")
			}
			rs, err := segment.ReadRunStates(c.Context(), q.Redis())
			if err != nil {
				return err
			}
			fmt.Fprintln(w)
			if len(rs) == 0 {
				fmt.Fprintln(w, "no training runs (start one with 'sched enqueue train <run>')")
			}
			for _, r := range rs {
				fmt.Fprintln(w, r.String())
			}
			return nil
		},
	})
}

// printTask writes one line: id, state, and the progress fields known.
func printTask(w io.Writer, ts scheduler.TaskStatus) {
	parts := []string{ts.ID, ts.State}
	if ts.HasProgress {
		p := ts.Progress
		if p.Fraction >= 0 {
			parts = append(parts, fmt.Sprintf("%.1f%%", 100*p.Fraction))
		}
		if p.Rate > 0 {
			parts = append(parts, fmt.Sprintf("%.4g %s", p.Rate, p.Unit))
		}
		if p.ETA > 0 {
			parts = append(parts, "ETA "+p.ETA.Round(time.Second).String())
		}
		if p.Message != "" {
			parts = append(parts, fmt.Sprintf("%q", p.Message))
		}
		if p.Worker != "" {
			parts = append(parts, "on "+p.Worker)
		}
	}
	if ts.LastErr != "" && ts.State != "completed" {
		parts = append(parts, "last error: "+ts.LastErr)
	}
	fmt.Fprintln(w, strings.Join(parts, "  "))
}
