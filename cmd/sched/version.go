package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/worker"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func init() {
	// The build a worker publishes, which sched status compares with its
	// own, is the one this command prints.
	worker.Version = version
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print sched's version and build",
		Args:  exactArgs(0, "no arguments"),
		Run: func(c *cobra.Command, args []string) {
			fmt.Fprintf(c.OutOrStdout(), "sched %s\n", worker.ThisBuild())
		},
	})
}
