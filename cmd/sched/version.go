package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print sched's version and build",
		Args:  exactArgs(0, "no arguments"),
		Run: func(c *cobra.Command, args []string) {
			rev, goVersion := "unknown", "unknown"
			if bi, ok := debug.ReadBuildInfo(); ok {
				goVersion = bi.GoVersion
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						rev = s.Value
					}
				}
			}
			fmt.Fprintf(c.OutOrStdout(), "sched %s (commit %s, %s)\n", version, rev, goVersion)
		},
	})
}
