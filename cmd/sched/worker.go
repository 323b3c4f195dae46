package main

import (
	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/worker"
)

func init() {
	var queues string
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker serving the given queues until SIGTERM (then drain and re-queue)",
		Args:  exactArgs(0, "no arguments (queues go in --queues)"),
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			qs, err := worker.ParseQueues(queues)
			if err != nil {
				return badInput("--queues %q: %v", queues, err)
			}
			q, opt, err := openQueue(c.Context(), cfg)
			if err != nil {
				return err
			}
			q.Close()
			log := logger(cfg)
			defer log.Sync()
			if qs["ingest"] > 0 || qs["append"] > 0 {
				release, err := configureIngestWorker(c.Context(), cfg, opt, log)
				if err != nil {
					return err
				}
				defer release()
			}
			w, err := worker.New(worker.Params{Redis: opt, Queues: qs, ShutdownGrace: cfg.ShutdownGrace, Logger: log})
			if err != nil {
				return err
			}
			return w.Run(c.Context())
		},
	}
	cmd.Flags().StringVar(&queues, "queues", "ingest=4", "queues and concurrency, e.g. ingest=4,append=1,gpu=1")
	rootCmd.AddCommand(cmd)
}
