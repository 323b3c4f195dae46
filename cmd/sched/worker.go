package main

import (
	"context"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
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
			// The client stays open while the worker runs: a training
			// segment queues the next one through it.
			q, opt, err := openQueue(c.Context(), cfg)
			if err != nil {
				return err
			}
			defer q.Close()
			log := logger(cfg)
			defer log.Sync()
			hs, err := workerHandlers(c.Context(), cfg, qs, q, log)
			if err != nil {
				return err
			}
			w, err := worker.New(worker.Params{Redis: opt, Queues: qs, Handlers: hs, ShutdownGrace: cfg.ShutdownGrace, Logger: log})
			if err != nil {
				return err
			}
			return w.Run(c.Context())
		},
	}
	cmd.Flags().StringVar(&queues, "queues", "ingest=4", "queues and concurrency, e.g. ingest=4,append=1,gpu=1")
	rootCmd.AddCommand(cmd)
}

// benchRow measures one bench:run shape with the routine behind `sched
// bench`, at its step counts unless the payload gave others.
func benchRow(ctx context.Context, b worker.BenchSpec, logf func(string)) (results.BenchRow, error) {
	c, err := b.Shape.Config()
	if err != nil {
		return results.BenchRow{}, err
	}
	o := trainer.BenchOptions{Model: c, Engine: b.Engine, Batch: b.Shape.Batch, Seq: b.Shape.Seq, Steps: 30, Warmup: 8, Log: logf}
	if o.Engine == "" {
		o.Engine = "auto"
	}
	if b.Steps > 0 {
		o.Steps = b.Steps
	}
	if b.Warmup >= 0 {
		o.Warmup = b.Warmup
	}
	r, err := trainer.Bench(ctx, o)
	if err != nil {
		return results.BenchRow{}, err
	}
	return results.Row(b.Shape.Model, c, o.Batch, o.Seq, r), nil
}

// workerHandlers makes the product handlers of the queues this process
// serves, with what they need opened once: the object store, the dataset
// sources, and q, the queue client through which a task queues the next.
func workerHandlers(ctx context.Context, cfg scheduler.Config, qs map[string]int, q *scheduler.Client, log *zap.Logger) (worker.Handlers, error) {
	var hs worker.Handlers
	cpu := qs[scheduler.QueueIngest] > 0 || qs[scheduler.QueueAppend] > 0
	gpu := qs[scheduler.QueueGPU] > 0
	if !cpu && !gpu {
		return hs, nil
	}
	objects, err := openStore(ctx, cfg)
	if err != nil {
		return hs, err
	}
	worker.AbortStaleUploads(ctx, objects, store.StaleUploadAge, log)
	enqueue := func(ctx context.Context, a scheduler.Args) error { _, err := q.Enqueue(ctx, a); return err }
	// tokenizer:sample runs on the ingest queue and tokenizer:train on
	// append, so either one needs the tokenizer handlers too.
	if cpu {
		h, swh, err := openSources(cfg, log)
		if err != nil {
			return hs, err
		}
		hs.Ingest = &worker.Ingest{
			Pipeline: ingest.Pipeline{Objects: objects, Hub: h, SWH: swh, DataDir: filepath.Join(cfg.DataDir, "ingest"),
				StoresDir: filepath.Join(cfg.DataDir, "tokens"), LocalRoots: cfg.LocalRoots, Logger: log},
			Tokenizers: catalog.New(objects, cfg.DataDir),
			Enqueue:    enqueue,
			Queue:      q,
		}
		hs.Tokenizers = &worker.Tokenizers{Objects: objects, DataDir: cfg.DataDir, Hub: h, SWH: swh, LocalRoots: cfg.LocalRoots, Log: log, Enqueue: enqueue}
	}
	if gpu {
		hs.Training = &worker.Training{
			Redis: q.Redis(), Objects: objects, Enqueue: enqueue, Queue: q,
			Dir:         filepath.Join(cfg.DataDir, "runs"),
			TokensDir:   filepath.Join(cfg.DataDir, "tokens"),
			UploadGrace: cfg.ShutdownGrace * 3 / 4,
			Log:         log,
			Bench: func(ctx context.Context, b worker.BenchSpec) (results.BenchRow, error) {
				return benchRow(ctx, b, func(msg string) { log.Info(msg) })
			},
		}
	}
	return hs, nil
}
