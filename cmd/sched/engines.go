package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/kernels"
)

// The CUDA engine's settings (KILN_CUDA_*, KILN_KERNEL_CACHE) are read
// once, before any command starts, so that a mistyped one exits 2 at once
// instead of failing a run or a worker's first task; every engine the
// command starts then uses them.
func init() {
	rootCmd.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		// Before anything the command reads: a flag given empty would
		// mean its default unnoticed.
		if err := refuseGivenEmpty(cmd, args); err != nil {
			return err
		}
		o, err := kernels.ParseOptions(os.Getenv)
		if err != nil {
			return err
		}
		kernels.Configure(o)
		return nil
	}
}
