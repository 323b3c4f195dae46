package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/term"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/worker"
)

func init() {
	var queues string
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a worker serving the given queues until SIGTERM (then drain and re-queue)",
		Long: `worker serves the queues --queues names, each with its number of tasks at
once: ingest (download and tokenize files into object storage), append (fill
the token stores on this machine's disk), gpu (training segments and
benchmarks). Several workers may serve ingest from any machine; append is
served from the one machine whose data directory holds the token stores,
and a worker of another data directory told to serve it is refused.

On SIGTERM (or Ctrl-C) it takes no new task and gives those in flight
--shutdown-grace to stop: a training segment writes the checkpoint of its
step and is re-queued, using no retry (docs/operations.md, "How a run
survives"); a second signal ends it at once. Training segments and
benchmarks each run in a child process, so that a crash there fails that
task alone.`,
		Example: `  sched worker --queues ingest=2,append=1,gpu=1
  sched worker --queues ingest=4
  KILN_GPUS=2 sched worker --queues gpu=1`,
		Args: exactArgs(0, "no arguments (queues go in --queues)"),
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			qs, err := worker.ParseQueues(queues)
			if err != nil {
				return badInput("--queues %q: %v", queues, err)
			}
			if qs[scheduler.QueueGPU] > 0 {
				// Each segment reads the runs file; one it cannot read
				// would archive them all, so it is refused where it is set.
				if _, err := runs.Load(os.Getenv("KILN_RUNS")); err != nil {
					return badInput("KILN_RUNS: %v; mend it, then start the worker again", err)
				}
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
			var claim *worker.AppendClaim
			if qs[scheduler.QueueAppend] > 0 {
				// Before anything touches the stores: they live on the
				// disk of the worker that appends them, and this worker's
				// start makes their statuses say what its disk holds,
				// which on a second disk would clear every status
				// (worker.ClaimAppend says more).
				claim, err = worker.ClaimAppend(c.Context(), worker.AppendClaimParams{Redis: q.Redis(), DataDir: cfg.DataDir, Logger: log})
				if err != nil {
					return err
				}
				defer claim.Close()
			}
			var lease func() time.Time
			if claim != nil {
				lease = claim.Until
			}
			hs, err := workerHandlers(c.Context(), cfg, qs, q, log, lease)
			if err != nil {
				return err
			}
			if hs.Ingest != nil && hs.Ingest.Stores != nil {
				go hs.Ingest.WatchStores(c.Context(), worker.DefaultWatchStoresEvery, log)
				go func() {
					for {
						select {
						case <-claim.Lost():
							// A worker that lost the append queue to
							// another disk no longer speaks for the stores.
							hs.Ingest.Stores.Stop()
							return
						case <-claim.Remade():
							// Another disk's worker may have held it in the
							// gap and published what its disk holds.
							hs.Ingest.Stores.ReconcileLater()
						case <-c.Context().Done():
							return
						}
					}
				}()
			}
			var iso *worker.Isolation
			if hs.Training != nil {
				logGPU(log, hs.Training.RequireGPU, hs.Training.GPUs)
			}
			if qs[scheduler.QueueGPU] > 0 {
				// Training and benchmarks run in a child process each, the
				// device's context with them, so that a fatal fault of one
				// (out of memory, a CUDA fault) ends neither this worker nor
				// the appends it serves.
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("sched worker: find this program to run gpu tasks in: %w", err)
				}
				iso = &worker.Isolation{Queues: []string{scheduler.QueueGPU}, Command: append([]string{exe}, taskArgs...), Env: configEnv(cfg)}
			}
			w, err := worker.New(worker.Params{Redis: opt, Queues: qs, Handlers: hs, Isolate: iso, ShutdownGrace: cfg.ShutdownGrace, Logger: log, AppendClaim: claim, Redact: cfg.Redact})
			if err != nil {
				return err
			}
			if cfg.MetricsAddr != "" {
				mctx, stop := context.WithCancel(c.Context())
				defer stop()
				addr, err := worker.ServeMetrics(mctx, cfg.MetricsAddr, worker.NewMetrics(q, opt, log))
				if err != nil {
					return badInput("KILN_METRICS_ADDR (--metrics-addr) %s: %v", cfg.MetricsAddr, err)
				}
				log.Info("metrics endpoint", zap.String("url", "http://"+addr+"/metrics"))
			}
			return w.Run(c.Context())
		},
	}
	cmd.Flags().StringVar(&queues, "queues", "ingest=4", "queues and concurrency, e.g. ingest=4,append=2,gpu=1, a queue without =N serving one task at a time (two appends: one reads its shard while the other commits; append from one machine only, the one whose disk holds the token stores)")
	rootCmd.AddCommand(cmd)
	rootCmd.AddCommand(&cobra.Command{
		Use:    taskCommand,
		Hidden: true,
		Short:  "Run one gpu task handed over on standard input by sched worker, which starts this",
		Args:   exactArgs(0, "no arguments: sched worker starts this command and hands it the task"),
		RunE: func(c *cobra.Command, _ []string) error {
			outcome, err := outcomePipe()
			if err != nil {
				return err
			}
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			opt, err := cfg.RedisOpt()
			if err != nil {
				return badInput("KILN_REDIS_URL %s: %v", cfg.Masked().RedisURL, redactErr(cfg, err))
			}
			log := logger(cfg)
			q := scheduler.NewClient(opt)
			code := worker.ServeTask(c.Context(), worker.TaskParams{Redis: opt, Logger: log, Outcome: outcome,
				Open: func(ctx context.Context) (worker.Handlers, error) {
					objects, err := openStore(ctx, cfg)
					var down error
					if store.Unreachable(err) {
						// A segment trains on through an outage of object
						// storage from the checkpoint on this disk, where
						// it can; it finds out which it can.
						log.Warn("object storage does not answer; the task goes on without it where it can", zap.Error(err))
						down = err
						objects, err = openStoreUnchecked(cfg)
					}
					if err != nil {
						return worker.Handlers{}, err
					}
					hs, err := handlersWith(cfg, map[string]int{scheduler.QueueGPU: 1}, q, log, objects)
					if err == nil && down != nil && hs.Training != nil {
						hs.Training.ObjectsDown = down
					}
					return hs, err
				}})
			q.Close()
			_ = log.Sync()
			os.Exit(code)
			return nil
		},
	})
}

// taskCommand is the hidden command a worker runs each gpu task in.
const taskCommand = "worker-task"

// outcomeFile is descriptor 3 as outcomePipe found it.
var outcomeFile *os.File

// outcomePipe is the pipe on file descriptor 3 that the worker starting
// taskCommand hands it for the task's outcome. Where there is none, the
// command was typed by hand: it is refused at once, where it waited for a
// task on its standard input or failed writing its outcome ("bad file
// descriptor").
func outcomePipe() (*os.File, error) {
	f := os.NewFile(3, "outcome")
	// Held for the life of the process: a File no longer referenced is
	// closed when collected, and a descriptor 3 that is not the worker's
	// pipe is whatever this process opened there.
	outcomeFile = f
	if st, err := f.Stat(); err == nil && st.Mode()&os.ModeNamedPipe != 0 {
		return f, nil
	}
	return nil, badInput("sched %s is started by 'sched worker', which hands it one gpu task on its standard input and takes the outcome on a pipe: it is not to be run by hand; to serve gpu tasks, run 'sched worker --queues gpu=1'", taskCommand)
}

// taskArgs are the task process's arguments. It reads no config file: its
// configuration is the worker's, resolved, in its environment (configEnv).
// A file would come after the defaults and before that environment, where
// a setting the worker resolved empty (the local store, metrics off) reads
// as unset: the worker's --config, or an explicit empty flag, would lose
// to $KILN_CONFIG's or the XDG file's value in the child.
var taskArgs = []string{"--config=", taskCommand}

// configEnv is cfg as the environment of a task's process, so that it
// resolves the worker's configuration whatever flags or file gave it. The
// log format is the worker's own resolved one: the child's output is a
// pipe, which "auto" would read as JSON under a terminal's console.
func configEnv(cfg scheduler.Config) []string {
	if cfg.LogFormat == "auto" {
		cfg.LogFormat = "json"
		if term.IsTerminal(int(os.Stderr.Fd())) {
			cfg.LogFormat = "console"
		}
	}
	var env []string
	for _, s := range settings {
		env = append(env, s.env+"="+s.get(&cfg))
	}
	return env
}

// benchRow measures one bench:run shape with the routine behind `sched
// bench`, at its step counts unless the payload gave others.
func benchRow(ctx context.Context, b worker.BenchSpec, logf func(string)) (results.BenchRow, error) {
	c, err := b.Shape.Config()
	if err != nil {
		return results.BenchRow{}, err
	}
	o := trainer.BenchOptions{Model: c, Engine: b.Engine, Precision: b.Shape.Precision, Batch: b.Shape.Batch, Seq: b.Shape.Seq,
		Accumulate: b.Shape.Accumulate, Steps: 30, Warmup: 8, GPUs: b.GPUs, Log: logf}
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
// lease, on a worker that serves append, is its claim's Until: the writes
// that speak for the stores on its disk (their statuses, mended at the
// start and by the watch, and the appends') stop once it has passed.
func workerHandlers(ctx context.Context, cfg scheduler.Config, qs map[string]int, q *scheduler.Client, log *zap.Logger, lease func() time.Time) (worker.Handlers, error) {
	var hs worker.Handlers
	cpu := qs[scheduler.QueueIngest] > 0 || qs[scheduler.QueueAppend] > 0
	gpu := qs[scheduler.QueueGPU] > 0
	if !cpu && !gpu {
		return hs, nil
	}
	objects, err := openStore(ctx, cfg)
	reachable := err == nil
	if store.Unreachable(err) {
		// A worker restarted during an outage of object storage serves
		// anyway: a segment trains on from the checkpoint on this disk,
		// and any task that needs the store waits for it (sched status
		// says so). Wrong credentials or a bad endpoint still stop it.
		log.Warn("object storage does not answer; the worker starts, and its tasks wait for the store where they need it", zap.Error(err))
		objects, err = openStoreUnchecked(cfg)
	} else if err == nil {
		worker.AbortStaleUploads(ctx, objects, store.StaleUploadAge, log)
	}
	if err != nil {
		return hs, err
	}
	go worker.SweepStaleUploads(ctx, objects, store.StaleUploadAge, store.StaleUploadAge, log)
	hs, err = handlersWith(cfg, qs, q, log, objects)
	if err == nil && qs[scheduler.QueueAppend] > 0 {
		// The stores live on this worker's disk: their statuses must say
		// what it holds (a lost disk, a backup put back), and go on
		// saying it while the worker runs (a store deleted). The watch
		// looks first, so that a store deleted while the statuses are
		// mended is noticed too.
		hs.Ingest.Pipeline.Lease = lease
		hs.Ingest.Stores = hs.Ingest.Pipeline.WatchStores()
		if reachable {
			hs.Ingest.ReconcileStores(ctx, log)
		} else {
			// Once object storage answers: the watch's looks.
			hs.Ingest.Stores.ReconcileLater()
		}
	}
	return hs, err
}

// handlersWith makes the handlers of queues qs on objects.
func handlersWith(cfg scheduler.Config, qs map[string]int, q *scheduler.Client, log *zap.Logger, objects store.Store) (worker.Handlers, error) {
	var hs worker.Handlers
	cpu := qs[scheduler.QueueIngest] > 0 || qs[scheduler.QueueAppend] > 0
	gpu := qs[scheduler.QueueGPU] > 0
	enqueue := func(ctx context.Context, a scheduler.Args) error { _, err := q.Enqueue(ctx, a); return err }
	// tokenizer:sample runs on the ingest queue and tokenizer:train on
	// append, so either one needs the tokenizer handlers too.
	if cpu {
		h, swh, err := openSources(cfg, log, false)
		if err != nil {
			return hs, err
		}
		hs.Ingest = &worker.Ingest{
			Pipeline: ingest.Pipeline{Objects: objects, Hub: h, SWH: swh, DataDir: filepath.Join(cfg.DataDir, "ingest"),
				StoresDir: filepath.Join(cfg.DataDir, "tokens"), LocalRoots: cfg.LocalRoots, Logger: log},
			Tokenizers: catalog.New(objects, cfg.DataDir),
			Enqueue:    func(ctx context.Context, a scheduler.Args) error { _, err := q.Again(ctx, a); return err },
			Queue:      q,
			Redis:      q.Redis(),
		}
		hs.Tokenizers = &worker.Tokenizers{Objects: objects, DataDir: cfg.DataDir, Hub: h, SWH: swh, LocalRoots: cfg.LocalRoots, Log: log, Enqueue: enqueue}
	}
	if gpu {
		gpus, err := workerGPUs(os.Getenv("KILN_GPUS"))
		if err != nil {
			return hs, err
		}
		requireGPU, err := envBool("KILN_REQUIRE_GPU")
		if err != nil {
			return hs, err
		}
		hs.Training = &worker.Training{
			GPUs: gpus, RequireGPU: requireGPU,
			Redis: q.Redis(), Objects: objects, Enqueue: enqueue, Queue: q,
			Dir:         filepath.Join(cfg.DataDir, "runs"),
			TokensDir:   filepath.Join(cfg.DataDir, "tokens"),
			UploadGrace: cfg.ShutdownGrace * 3 / 4,
			Log:         log,
			Bench: func(ctx context.Context, b worker.BenchSpec) (results.BenchRow, error) {
				return benchRow(ctx, b, func(msg string) { log.Info(msg) })
			},
			NoGPU: noGPUHere,
		}
	}
	return hs, nil
}

// envBool reads a yes-or-no setting of the environment, in the words
// every on/off setting takes (parseSwitch): unset or empty is no.
func envBool(name string) (bool, error) {
	v := os.Getenv(name)
	if v == "" {
		return false, nil
	}
	b, err := parseSwitch(v)
	if err != nil {
		return false, badInput("%s %v, or leave it unset", name, err)
	}
	return b, nil
}

// workerGPUs reads KILN_GPUS, the GPUs compose reserves for the GPU
// worker: a run that names no gpus trains on that many. Unset, one.
func workerGPUs(v string) (trainer.GPUCount, error) {
	if v == "" {
		return 0, nil
	}
	return trainer.ParseGPUsOf("KILN_GPUS", v)
}
