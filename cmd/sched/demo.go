package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/term"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/internal/disk"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
	"github.com/kiln-lm/kiln/worker"
)

// demoOptions configure runDemo; zero values take the defaults in
// withDefaults.
type demoOptions struct {
	// Dir holds everything the demo writes. Default <data-dir>/demo.
	Dir string
	// Files is the corpus glob. Default $GOROOT/src/*/*.go.
	Files string
	// Duration is the training time. Default 2m.
	Duration time.Duration
	// Engine is cuda, cpu or auto. Default auto.
	Engine string
	// TokenizerBytes bounds the text the tokenizer learns from; MaxTokens
	// the token store. Defaults 3 MB and 3M tokens: the whole standard
	// library's top-level packages are 11.7 MB, and two minutes of CPU
	// training reads well under a million tokens.
	TokenizerBytes int64
	MaxTokens      int64
	// MinSteps is the shortest run, whatever the duration. Default 40: the
	// loss needs that many to fall.
	MinSteps int
	// Quiet turns off the progress display (tests).
	Quiet bool
	Log   *zap.Logger
}

// demoFiles is the demo's corpus glob: the Go standard library's
// top-level packages under this machine's GOROOT (goRoot); "" where it
// has none.
func demoFiles() string {
	root := goRoot()
	if root == "" {
		return ""
	}
	return filepath.Join(root, "src", "*", "*.go")
}

// goRoot is the Go installation whose sources the demo learns from: the
// one this binary knows (GOROOT, else the one that built it), where its
// sources are there, else the one the go command names; "" where there
// is none (a binary built with -trimpath, or copied to a machine without
// Go).
func goRoot() string {
	if r := runtime.GOROOT(); r != "" {
		if fi, err := os.Stat(filepath.Join(r, "src")); err == nil && fi.IsDir() {
			return r
		}
	}
	cmd := exec.Command("go", "env", "GOROOT")
	// Without the GOROOT found wanting above, which go would report too.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOROOT=") })
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// noGoRootError is the demo's refusal where it has no corpus: no --files
// and no Go installation.
func noGoRootError() error {
	return badInput("sched demo learns from the Go standard library's sources, and finds no Go installation here (GOROOT is unset or holds no src, this sched was built without one, and there is no go command): set GOROOT to a Go installation, or give --files a glob of text files")
}

// demoTokenizerRequest is the request that makes on the queue the demo's
// tokenizer as sched demo learns it in its own directory, from this
// machine's Go sources; "" for another name or vocabulary.
func demoTokenizerRequest(name string, vocab int) string {
	if name != demoTokenizer || vocab != demoVocab {
		return ""
	}
	return fmt.Sprintf(`sched enqueue tokenizer %s --vocab %d --from "local:%s=1" --sample 3MB`, name, vocab, demoFilesNamed())
}

// demoIngest is the ingest that fills on the queue the demo's store as
// sched demo fills it, with tokenizer tok; "" for another store.
func demoIngest(storeName, tok string) string {
	if storeName != demoStore {
		return ""
	}
	return fmt.Sprintf(`sched enqueue ingest "local:%s" --store %s --tokenizer %s --max-tokens 3M`, demoFilesNamed(), storeName, tok)
}

// demoFilesNamed is demoFiles for a command shown to the user: the glob
// under $GOROOT where this machine has no Go.
func demoFilesNamed() string { return cmp.Or(demoFiles(), "$GOROOT/src/*/*.go") }

func (o demoOptions) withDefaults() demoOptions {
	if o.Files == "" {
		o.Files = demoFiles()
	}
	if o.Duration == 0 {
		o.Duration = 2 * time.Minute
	}
	if o.Engine == "" {
		o.Engine = "auto"
	}
	if o.TokenizerBytes == 0 {
		o.TokenizerBytes = 3 << 20
	}
	if o.MaxTokens == 0 {
		o.MaxTokens = 3_000_000
	}
	if o.MinSteps == 0 {
		o.MinSteps = 40
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return o
}

// demoResult is what the demo prints, for tests to check.
type demoResult struct {
	Summary       results.Summary
	Figures       results.Figures
	PlotPath      string
	SummaryPath   string
	Sample        string
	TotalSteps    int
	CorpusTokens  int64
	TokenizerPath string
}

const (
	demoRun       = "demo"
	demoTokenizer = "go-4096"
	demoStore     = "go-stdlib"
	demoVocab     = 4096
	// Files in --dir: the tokenizer, and the corpus it was learned from.
	demoTokenizerFile = "tokenizer.json"
	demoCorpusFile    = "corpus.json"
)

func init() {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Train a small model on the Go standard library in one process: ingest, tokenizer, about two minutes of training, results",
		Long: `demo runs kiln's whole pipeline on a machine with only Go: an in-process
Redis-compatible server holds the queue, a local directory is the object
store, and an in-process worker trains. It ingests the Go standard library
(the sources under GOROOT), trains a byte-level BPE tokenizer of 4096 ids,
trains the tiny model (the demo run of 'sched runs --presets') for about
--duration on the CPU (on the GPU when one loads), and prints the results
table, the loss plot's path and a generated sample. Everything is written under --dir; a second run reuses the
tokenizer and the token store and trains afresh. A run with other --files
learns its own tokenizer and replaces the store and the run made with the
earlier one.`,
		Args: exactArgs(0, "no arguments"),
		Example: `  sched demo
  sched demo --duration 10m --engine cpu
  sched demo --files '/data/repos/**/*.go' --dir /tmp/my-demo`,
		RunE: func(c *cobra.Command, _ []string) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			if o.Dir == "" {
				o.Dir = filepath.Join(cfg.DataDir, "demo")
			}
			if o.Duration < 0 || o.Duration == 0 && c.Flags().Changed("duration") {
				return badInput("--duration %v: give a training time such as 2m", o.Duration)
			}
			switch o.Engine {
			case "auto", "cpu", "cuda":
			default:
				return badInput("--engine %q: give cuda, cpu or auto", o.Engine)
			}
			if err := checkCUDAEngine(o.Engine); err != nil {
				return err
			}
			log := logger(cfg)
			defer log.Sync()
			// The demo prints its own progress; the per-file ingest and
			// per-task worker lines (about two thousand) would bury it.
			// Warnings and errors still show.
			o.Log = log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
			o.Quiet = !term.IsTerminal(int(os.Stdout.Fd()))
			res, err := runDemo(c.Context(), c.OutOrStdout(), o)
			if err != nil {
				if c.Context().Err() != nil && errors.Is(err, context.Canceled) {
					return demoInterrupted(o.Dir, err)
				}
				return err
			}
			printDemo(c.OutOrStdout(), res)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Dir, "dir", "", "directory for the demo's files (default <data-dir>/demo)")
	cmd.Flags().StringVar(&o.Files, "files", "", "corpus glob (default $GOROOT/src/*/*.go)")
	noEmpty(cmd.Flags(), "dir", "a directory", "<data dir>/demo")
	noEmpty(cmd.Flags(), "files", "a glob of text files", "$GOROOT/src/*/*.go")
	cmd.Flags().DurationVar(&o.Duration, "duration", 2*time.Minute, "training time")
	cmd.Flags().StringVar(&o.Engine, "engine", "auto", "engine: cuda, cpu or auto")
	rootCmd.AddCommand(cmd)
}

// runDemo runs the pipeline and returns what it made.
func runDemo(ctx context.Context, out io.Writer, o demoOptions) (demoResult, error) {
	o = o.withDefaults()
	var res demoResult
	// Absolute, so that the paths printed at the end can be opened from
	// anywhere.
	if abs, err := filepath.Abs(o.Dir); err == nil {
		o.Dir = abs
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return res, badInput("--dir %s: %v: give a directory this user can create and write", o.Dir, errors.Unwrap(err))
	}
	if err := checkDemoOwns(o.Dir); err != nil {
		return res, err
	}
	if o.Files == "" {
		return res, noGoRootError()
	}
	files, err := filepath.Glob(o.Files)
	if err != nil {
		return res, badInput("--files %q is not a glob (%v): give a glob of text files, such as '$GOROOT/src/*/*.go'", o.Files, err)
	}
	if len(files) == 0 {
		return res, badInput("--files %q matches no files: give a glob of text files, such as '$GOROOT/src/*/*.go'", o.Files)
	}
	// A directory the glob matches holds files, and is not one: the
	// corpus is the files, as `sched datasets check local:` reads it.
	var dirs []string
	files = slices.DeleteFunc(files, func(f string) bool {
		st, err := os.Stat(f)
		if err == nil && st.IsDir() {
			dirs = append(dirs, f)
			return true
		}
		return false
	})
	if len(files) == 0 {
		which := dirs[0]
		if len(dirs) > 1 {
			which += fmt.Sprintf(" and %d more", len(dirs)-1)
		}
		return res, badInput("--files %q matches only directories (%s): name their files with a glob, such as '%s'", o.Files, which, filepath.Join(dirs[0], "*"))
	}
	sort.Strings(files)
	run, err := runs.Presets().Get(demoRun)
	if err != nil {
		return res, err
	}
	// The training keeps the run's min_free_disk free on --dir's disk and
	// fails without it: said here, before the tokenizer and the ingest
	// take their minute, and with what the demo lets one change.
	if free, err := disk.Free(o.Dir); err == nil && free < int64(run.MinFreeDisk) {
		return res, badInput("--dir %s: its disk has %s free, below the %s the demo's training keeps free (min_free_disk of the demo run): free space there, or give --dir a directory on a disk with more room",
			o.Dir, bytesize.Format(free), bytesize.Format(int64(run.MinFreeDisk)))
	}

	stage := func(format string, args ...any) { fmt.Fprintf(out, "==> "+format+"\n", args...) }

	stage("tokenizer: byte-level BPE, %d ids, learned from up to %s of %s", demoVocab, humanSize(o.TokenizerBytes), o.Files)
	tok, err := loadDemoTokenizer(ctx, out, o.Dir, o.Files, files, o.TokenizerBytes)
	if err != nil {
		return res, err
	}
	res.TokenizerPath = filepath.Join(o.Dir, demoTokenizerFile)
	switch {
	case tok.recorded:
		fmt.Fprintf(out, "    reusing %s, learned from these files by an earlier demo\n", res.TokenizerPath)
	case tok.reused:
		fmt.Fprintf(out, "    reusing %s, learned by an earlier demo\n", res.TokenizerPath)
	}
	// Created only now, so that a corpus refused above leaves nothing in
	// --dir but the directory itself.
	objects, err := store.NewLocal(filepath.Join(o.Dir, "objects"))
	if err != nil {
		return res, err
	}
	if err := keepDemoDir(ctx, out, o.Dir, objects, tok); err != nil {
		return res, err
	}

	stage("ingest: up to %.1fM tokens of %d files, in a seeded order, into the token store %s", float64(o.MaxTokens)/1e6, len(files), demoStore)
	preset, err := ingest.LookupPreset(nil, ingest.LocalPrefix+o.Files)
	if err != nil {
		return res, err
	}
	tokensDir := filepath.Join(o.Dir, "tokens")
	rep, err := ingest.Direct(ctx, ingest.DirectOptions{Preset: preset, Tokenizer: tok.Tokenizer, TokenizerName: demoTokenizer,
		StoreDir: filepath.Join(tokensDir, demoStore), DataDir: filepath.Join(o.Dir, "ingest"), Seed: 1,
		MaxTokens: o.MaxTokens, Logger: o.Log})
	if err != nil {
		return res, fmt.Errorf("demo ingest: %w", err)
	}
	if res.CorpusTokens, err = tokensLen(filepath.Join(tokensDir, demoStore)); err != nil {
		return res, fmt.Errorf("demo ingest: %w", err)
	}
	if rep.StoppedBeforePlan() {
		fmt.Fprintf(out, "    0 files appended this time: the store is full at its limit and holds %d tokens\n", res.CorpusTokens)
	} else {
		// A file the store records as skipped, by an earlier demo, holds
		// none of its text: it is counted as skipped, for the reason
		// recorded, as sched ingest --direct counts it, not as there.
		before := skipCount(rep.SkippedBefore)
		fmt.Fprintf(out, "    %d files appended this time, %d already there%s; the store holds %d tokens\n", rep.Appended, rep.Duplicates-before,
			sameContent(rep.Same), res.CorpusTokens)
		skipped := ingest.Skips{}
		skipped.Merge(rep.SkippedFiles)
		skipped.Merge(rep.SkippedBefore)
		if len(skipped) > 0 {
			fmt.Fprintf(out, "    skipped files: %s%s\n", skipped, skippedEarlier(before, true))
		}
	}

	run.Engine = o.Engine
	if err := checkEvalWindows(o.Files, len(files), res.CorpusTokens, run.RunConfig.WithDefaults().Seq); err != nil {
		return res, err
	}
	// Why engine auto chose the CPU, where it did, in the demo's words.
	say := func(line string) { fmt.Fprintf(out, "    %s\n", line) }
	stepTime, engineName, err := calibrate(ctx, run.RunConfig, say)
	if err != nil {
		return res, err
	}
	fitRun(&run, o.Duration, stepTime, o.MinSteps)
	res.TotalSteps = run.TotalSteps
	mc, err := run.ModelConfig()
	if err != nil {
		return res, err
	}
	stage("train: model %s (%.2fM parameters) on the %s engine, %d steps of %d tokens (about %v at %v a step)",
		run.Model, float64(mc.NumParams())/1e6, engineName, run.TotalSteps, run.TokensPerStep(),
		(time.Duration(run.TotalSteps) * stepTime).Round(time.Second), stepTime.Round(time.Millisecond))

	// A demo trains afresh each time; only its own run is cleared.
	runRoot := filepath.Join(o.Dir, "runs")
	if err := clearDemoRun(ctx, o.Dir, objects); err != nil {
		return res, err
	}

	wallClock, err := trainThroughQueue(ctx, out, o, run, objects, runRoot, tokensDir, tok.Tokenizer)
	if err != nil {
		return res, err
	}

	// The results as the queue left them in object storage.
	resultsDir := filepath.Join(o.Dir, "objects", "results", demoRun)
	f, err := os.Open(filepath.Join(resultsDir, results.MetricsFile))
	if err != nil {
		return res, fmt.Errorf("demo results: %w", err)
	}
	recs, err := results.ReadMetrics(f)
	f.Close()
	if err != nil {
		return res, err
	}
	res.Summary = results.Summary{Run: demoRun, Records: recs, TotalSteps: run.TotalSteps, WallClock: wallClock}
	res.Figures = res.Summary.Figures()
	res.PlotPath = filepath.Join(resultsDir, results.PlotFile)
	res.SummaryPath = filepath.Join(resultsDir, results.SummaryFile)
	md, err := os.ReadFile(res.SummaryPath)
	if err != nil {
		return res, fmt.Errorf("demo results: %w", err)
	}
	res.Sample = sampleFromSummary(string(md))
	return res, nil
}

// demoInterrupted is the error of a demo stopped by Ctrl-C or SIGTERM: what
// it was doing, and what is kept for the next run.
func demoInterrupted(dir string, err error) error {
	return interruptedError{fmt.Errorf("demo stopped (%w); what it finished is kept in %s (the tokenizer, the files ingested so far), and the same command again (its --dir and --files as given) reuses it and trains afresh", err, dir)}
}

// trainThroughQueue trains the run as a user's GPU worker would: an
// in-process Redis-compatible server, a worker serving the gpu queue, and
// one train:segment task queued.
func trainThroughQueue(ctx context.Context, out io.Writer, o demoOptions, run runs.Run, objects store.Store, runRoot, tokensDir string, tok *tokenizer.Tokenizer) (time.Duration, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		return 0, fmt.Errorf("demo: in-process Redis: %w", err)
	}
	defer mr.Close()
	opt := asynq.RedisClientOpt{Addr: mr.Addr()}
	client := scheduler.NewClient(opt)
	defer client.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	set := runs.Presets()
	set[demoRun] = run
	training := &worker.Training{
		Redis: rdb, Objects: objects, Runs: set, Dir: runRoot, TokensDir: tokensDir, Owner: "demo",
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := client.Enqueue(ctx, a); return err },
		Log:     o.Log,
	}
	// The demo's queue lives and dies with it: the worker's warnings about
	// its own tasks (an interrupted task re-queued) say nothing a user can
	// act on, and the demo reports what happened itself.
	w, err := worker.New(worker.Params{Redis: opt, Queues: map[string]int{scheduler.QueueGPU: 1}, Handlers: worker.Handlers{Training: training},
		Logger: o.Log.WithOptions(zap.IncreaseLevel(zap.ErrorLevel)),
		Name:   "demo", ShutdownGrace: 30 * time.Second, DelayedTaskCheckInterval: 500 * time.Millisecond})
	if err != nil {
		return 0, err
	}
	wctx, stopWorker := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() { werr <- w.Run(wctx) }()
	defer func() { stopWorker(); <-werr }()

	info, err := client.Enqueue(ctx, scheduler.TrainSegment{Run: demoRun, Engine: o.Engine})
	if err != nil {
		return 0, fmt.Errorf("demo: queue the training: %w", err)
	}
	var bar *progressbar.ProgressBar
	if !o.Quiet {
		bar = progressbar.NewOptions(run.TotalSteps, progressbar.OptionSetWriter(out), progressbar.OptionSetDescription("training"),
			progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(true), progressbar.OptionClearOnFinish())
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	lastLine := time.Now()
	reached := 0
	for {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("training interrupted at step %d of %d: %w", reached, run.TotalSteps, ctx.Err())
		case err := <-werr:
			werr <- err
			return 0, fmt.Errorf("demo: the worker stopped: %v", err)
		case <-tick.C:
		}
		st := rdb.HGetAll(ctx, scheduler.RunStateKey(demoRun)).Val()
		step, _ := strconv.Atoi(st["step"])
		reached = max(reached, step)
		// A step's loss is noisy at the demo's batch; the held-out loss,
		// measured every eval_every steps, is what shows the model learn.
		eval := ""
		if st["eval_loss"] != "" {
			eval = fmt.Sprintf(", eval loss %s at step %s", st["eval_loss"], st["eval_step"])
		}
		if bar != nil {
			bar.Describe(fmt.Sprintf("training, loss %s%s", st["loss"], eval))
			_ = bar.Set(step)
		} else if time.Since(lastLine) >= 15*time.Second && st["step"] != "" {
			fmt.Fprintf(out, "    step %s/%d loss %s%s, %s tok/s\n", st["step"], run.TotalSteps, st["loss"], eval, st["tok_per_s"])
			lastLine = time.Now()
		}
		// A segment that hits its time bound queues the next one, so the
		// run, not one task, is what the demo waits for.
		if st["done"] == "true" {
			if bar != nil {
				_ = bar.Finish()
			}
			wall, _ := strconv.ParseFloat(st["wall_s"], 64)
			return time.Duration(wall * float64(time.Second)), nil
		}
		if err := segmentFailure(ctx, client, info.ID); err != nil {
			return 0, err
		}
	}
}

// segmentFailure reports a training segment that failed: retried (the
// worker would wait out a back-off) or archived.
func segmentFailure(ctx context.Context, client *scheduler.Client, first string) error {
	if ts, err := client.Task(ctx, first); err == nil && (ts.State == "archived" || ts.State == "retry") {
		return fmt.Errorf("demo: training failed: %s", taskReason(ts.LastErr))
	}
	qs, err := client.Status(ctx)
	if err != nil {
		return nil
	}
	for _, q := range qs {
		if q.Name == scheduler.QueueGPU && (q.Archived > 0 || q.Retry > 0) {
			msg := "see the log above"
			if rs, err := client.Runs(ctx, 10); err == nil {
				for _, r := range rs {
					if r.State == "archived" && r.LastErr != "" {
						msg = taskReason(r.LastErr)
						break
					}
				}
			}
			return fmt.Errorf("demo: training failed: %s", msg)
		}
	}
	return nil
}

// taskReason is a failed task's error without the "(skip retry for the
// task)" that tells asynq not to retry it: the demo's user never sees the
// queue, only that the training failed and why.
func taskReason(lastErr string) string {
	return strings.ReplaceAll(lastErr, " ("+asynq.SkipRetry.Error()+")", "")
}

// demoTok is the tokenizer a demo trains with, and how it came to be.
type demoTok struct {
	*tokenizer.Tokenizer
	JSON []byte
	// reused is true for the tokenizer an earlier demo in --dir learned
	// from the same --files; false for one learned by this demo, which
	// replaces what --dir holds.
	reused bool
	// recorded is true when corpus.json names corpus.
	recorded bool
	// corpus is the absolute --files glob it was learned from.
	corpus string
}

// demoCorpus is what corpus.json records beside the demo's tokenizer: the
// glob it was learned from, so that a demo over other files learns its own
// instead of tokenizing them with, and adding them to a store of, another
// corpus's.
type demoCorpus struct {
	Files string `json:"files"`
}

// loadDemoTokenizer returns the tokenizer of --dir when an earlier demo
// learned it from the same --files, and otherwise learns one, saying why
// on out. A learned tokenizer is refused unless it has all demoVocab ids,
// before anything is written: a smaller one is what a too small corpus
// gives, and the demo's model and messages are of demoVocab ids.
func loadDemoTokenizer(ctx context.Context, out io.Writer, dir, glob string, files []string, budget int64) (demoTok, error) {
	corpus, err := filepath.Abs(glob)
	if err != nil {
		corpus = glob
	}
	tok := demoTok{corpus: corpus}
	path := filepath.Join(dir, demoTokenizerFile)
	if b, err := os.ReadFile(path); err == nil {
		t, err := tokenizer.Parse(b)
		have, cerr := readDemoCorpus(dir)
		why := ""
		switch {
		case err != nil:
			why = fmt.Sprintf("%s does not load (%v)", path, err)
		case t.VocabSize() != demoVocab:
			why = fmt.Sprintf("%s has %d ids, not %d", path, t.VocabSize(), demoVocab)
		case errors.Is(cerr, fs.ErrNotExist):
			// A demo of an earlier release wrote no corpus.json: its
			// tokenizer is reused, as it was then, and recorded as
			// learned from these files.
		case cerr != nil:
			why = fmt.Sprintf("what it was learned from is unknown (%v)", cerr)
		case have.Files != corpus:
			why = fmt.Sprintf("%s was learned from %s, not %s", path, have.Files, corpus)
		default:
			tok.recorded = true
		}
		if why == "" {
			tok.Tokenizer, tok.JSON, tok.reused = t, b, true
			return tok, nil
		}
		fmt.Fprintf(out, "    learning a new tokenizer: %s\n", why)
	}
	// Files spread over the whole corpus, not its first directories.
	order := rand.New(rand.NewPCG(1, 1)).Perm(len(files))
	var inputs []io.Reader
	var used int64
	for _, i := range order {
		if used >= budget {
			break
		}
		b, err := os.ReadFile(files[i])
		if err != nil {
			continue
		}
		inputs = append(inputs, bytes.NewReader(b))
		used += int64(len(b))
	}
	if used == 0 {
		return tok, badInput("the %d file(s) the corpus glob matches hold no text (or cannot be read): give --files a glob of text files, such as '$GOROOT/src/*/*.go'", len(files))
	}
	b, err := tokenizer.Train(ctx, inputs, tokenizer.TrainOptions{VocabSize: demoVocab})
	if err != nil {
		return tok, fmt.Errorf("demo tokenizer: %w", err)
	}
	t, err := tokenizer.Parse(b)
	if err != nil {
		return tok, fmt.Errorf("demo tokenizer: %w", err)
	}
	if t.VocabSize() < demoVocab {
		return tok, badInput("--files %q: its %d file(s), %s of text, are too little to learn a tokenizer of %d ids from (they gave %d): give --files a glob of more or larger text files, or leave it out to use the Go standard library",
			glob, len(inputs), humanSize(used), demoVocab, t.VocabSize())
	}
	tok.Tokenizer, tok.JSON = t, b
	return tok, nil
}

// checkDemoOwns refuses a --dir holding a tokenizer.json or corpus.json
// that no demo wrote (a model's directory, say): the demo owns its
// directory, and would replace them. The demo's are told by its corpus.json
// beside them, or, from a release that wrote none, by its object store.
func checkDemoOwns(dir string) error {
	var held []string
	for _, name := range []string{demoTokenizerFile, demoCorpusFile} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			held = append(held, name)
		}
	}
	if len(held) == 0 {
		return nil
	}
	if c, err := readDemoCorpus(dir); err == nil && c.Files != "" {
		return nil
	}
	if st, err := os.Stat(filepath.Join(dir, "objects")); err == nil && st.IsDir() {
		return nil
	}
	return badInput("--dir %s holds %s that no sched demo wrote: the demo replaces what its directory holds, so give it a new or empty directory (--dir), or move %s elsewhere",
		dir, strings.Join(held, " and "), strings.Join(held, " and "))
}

func readDemoCorpus(dir string) (demoCorpus, error) {
	var c demoCorpus
	b, err := os.ReadFile(filepath.Join(dir, demoCorpusFile))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", filepath.Join(dir, demoCorpusFile), err)
	}
	return c, nil
}

// keepDemoDir makes what --dir holds agree with tok before the demo adds
// to it. The demo owns its --dir, and everything in it derives from its
// tokenizer: the token store records the tokenizer's SHA-256 and refuses
// ids of another, the published tokenizers/go-4096 and its local copy must
// be the same bytes, and the demo run's checkpoints hold the tokenizer. So
// a new tokenizer replaces all of them, and a reused one replaces any that
// another tokenizer made (a directory left so by an earlier release). The
// stale parts go first and the new tokenizer after them, and every part is
// checked against the tokenizer.json, so that a demo stopped in between
// leaves a directory the next one still puts right.
func keepDemoDir(ctx context.Context, out io.Writer, dir string, objects store.Store, tok demoTok) error {
	storeDir := filepath.Join(dir, "tokens", demoStore)
	why := ""
	if !tok.reused {
		if _, err := os.Stat(storeDir); err == nil {
			why = "they were made with the earlier tokenizer"
		}
	} else {
		switch m, err := tokens.ReadManifest(storeDir); {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			why = fmt.Sprintf("the store does not open (%v)", err)
		case m.Tokenizer.SHA256 != tok.SHA256():
			why = fmt.Sprintf("they were made with another tokenizer than %s", filepath.Join(dir, demoTokenizerFile))
		}
	}
	if why != "" {
		fmt.Fprintf(out, "    replacing the token store %s and the earlier demo's run: %s\n", demoStore, why)
		if err := os.RemoveAll(storeDir); err != nil {
			return fmt.Errorf("demo: remove the token store of the earlier tokenizer: %w", err)
		}
		if err := clearDemoRun(ctx, dir, objects); err != nil {
			return err
		}
	}
	// The local copy that a worker's tokenizer catalog made of the
	// published tokenizer: a copy that differs from it is refused.
	local := filepath.Join(dir, "tokenizers", demoTokenizer, catalog.FileName)
	if b, err := os.ReadFile(local); err == nil && !bytes.Equal(b, tok.JSON) {
		if err := os.Remove(local); err != nil {
			return fmt.Errorf("demo: remove the copy of the earlier tokenizer: %w", err)
		}
	}
	if !tok.reused {
		if err := os.WriteFile(filepath.Join(dir, demoTokenizerFile), tok.JSON, 0o644); err != nil {
			return fmt.Errorf("demo tokenizer: %w", err)
		}
	}
	if !tok.recorded {
		b, err := json.Marshal(demoCorpus{Files: tok.corpus})
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, demoCorpusFile), append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("demo tokenizer: %w", err)
		}
	}
	return objects.Put(ctx, catalog.Key(demoTokenizer), bytes.NewReader(tok.JSON), int64(len(tok.JSON)))
}

// clearDemoRun removes the demo run's local directory, checkpoints and
// results.
func clearDemoRun(ctx context.Context, dir string, objects store.Store) error {
	if err := os.RemoveAll(segment.RunDir(filepath.Join(dir, "runs"), demoRun)); err != nil {
		return err
	}
	for _, prefix := range []string{segment.CheckpointPrefix(demoRun), segment.ResultsPrefix(demoRun)} {
		objs, err := objects.List(ctx, prefix)
		if err != nil {
			return err
		}
		for _, ob := range objs {
			if err := objects.Delete(ctx, ob.Key); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkEvalWindows refuses a token store too short for the demo's loss to
// be measured on: the held-out windows begin at a fixed window index (the
// 3616th, of seq+1 tokens), and a store without one fails the training at
// its first evaluation with advice for 'sched train' that the demo cannot
// take.
func checkEvalWindows(glob string, files int, have int64, seq int) error {
	need := tokens.HeldOutNeed(0, seq)
	if have >= need {
		return nil
	}
	return badInput("--files %q: its %d file(s) gave the token store %d tokens, too few to measure the model's loss on (1 window of %d tokens in %d is held out for that, the first of them ending at token %d): give --files a glob of more or larger text files, or leave it out to use the Go standard library",
		glob, files, have, seq+1, tokens.DefaultHoldOut, need)
}

// calibrate times optimizer steps of the run's shape, so that the demo
// can choose a step count that ends near its duration and the cosine
// schedule runs to its floor. say gets the engine's notices (why auto chose the CPU).
func calibrate(ctx context.Context, rc trainer.RunConfig, say func(string)) (time.Duration, string, error) {
	rc = rc.WithDefaults()
	mc, err := rc.ModelConfig()
	if err != nil {
		return 0, "", err
	}
	eng, err := model.NewEngine(rc.Engine, mc, model.Options{Precision: rc.Precision, MaxBatch: rc.Batch, MaxSeq: rc.Seq, Log: say})
	if err != nil {
		return 0, "", err
	}
	defer eng.Close()
	if err := eng.SetParams(model.InitParams(mc, 1)); err != nil {
		return 0, "", err
	}
	n := rc.Batch * rc.Seq
	b := model.Batch{B: rc.Batch, T: rc.Seq, Inputs: make([]int32, n), Targets: make([]int32, n)}
	for i := range b.Inputs {
		b.Inputs[i], b.Targets[i] = int32(i*7%mc.VocabSize), int32(i*13%mc.VocabSize)
	}
	step := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := eng.ZeroGrad(); err != nil {
			return err
		}
		if err := eng.ForwardBackward(b, 1); err != nil {
			return err
		}
		if err := eng.Step(model.AdamW{LR: 1e-4, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}); err != nil {
			return err
		}
		_, err := eng.Metrics()
		return err
	}
	if err := step(); err != nil { // allocation, compilation
		return 0, "", err
	}
	// The median of several steps: on a shared machine one step can take
	// twice as long as the next (another build starting), and two steps
	// timed together once sized a run to 500 steps that trained for 50 s of
	// the demo's two minutes.
	var times []time.Duration
	for begin := time.Now(); len(times) < 2 || len(times) < 9 && time.Since(begin) < 3*time.Second; {
		start := time.Now()
		if err := step(); err != nil {
			return 0, "", err
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	// The first steps of a fresh engine run slower than the run's steps
	// later on (40-50 ms against 30-33 at tiny 4 x 64 on a 2-core VM, as
	// the heap settles), which about pays for evaluation and checkpoints:
	// calibrated at 38 ms with a quarter added for those, the run's steps
	// took 28.5 ms, and it trained 90 s of its 120.
	return times[len(times)/2], eng.Name(), nil
}

// fitRun sizes the demo run to d at stepTime per step, at least minSteps,
// with evaluations on about 10 points of the curve (each costs about one
// and a third steps), warmup a tenth of the run, and a segment bound of
// twice d, or of the run's steps where minSteps makes it longer, in case
// the machine slows down. The step count is a multiple of
// the evaluation interval so that the final evaluation, the one the demo's
// loss drop is measured at, is of the final weights.
func fitRun(r *runs.Run, d, stepTime time.Duration, minSteps int) {
	steps := max(int(d/max(stepTime, time.Millisecond)), minSteps)
	r.EvalEvery = max(steps/10, 1)
	// At least ten intervals fit, so rounding down drops at most nine
	// steps; minSteps rounds up.
	steps = max(steps/r.EvalEvery, (minSteps+r.EvalEvery-1)/r.EvalEvery) * r.EvalEvery
	r.TotalSteps, r.TotalTokens = steps, 0
	r.Warmup = min(r.Warmup, max(steps/10, 1))
	r.LogEvery = max(min(r.LogEvery, steps/40), 1)
	r.CheckpointEvery = max(steps/4, 1)
	r.Segment.MaxSteps = 0
	r.Segment.MaxDuration = 2 * max(d, time.Duration(steps)*stepTime)
}

// sampleFromSummary returns the fenced sample of summary.md.
func sampleFromSummary(md string) string {
	_, rest, ok := strings.Cut(md, "## Sample\n\n```\n")
	if !ok {
		return ""
	}
	s, _, _ := strings.Cut(rest, "\n```\n")
	return s
}

func printDemo(w io.Writer, r demoResult) {
	fmt.Fprintf(w, "\n==> results of run %s\n\n%s\n", demoRun, r.Summary.Table())
	f := r.Figures
	if f.HaveEval && f.FirstEvalLoss > 0 {
		fmt.Fprintf(w, "eval loss fell from %.3f to %.3f (%.0f%% lower)\n", f.FirstEvalLoss, f.FinalEvalLoss, 100*(1-f.FinalEvalLoss/f.FirstEvalLoss))
	}
	fmt.Fprintf(w, "loss curve: %s\nsummary:    %s\n", r.PlotPath, r.SummaryPath)
	if r.Sample != "" {
		fmt.Fprintf(w, "\n==> a sample from the final checkpoint\n\n%s\n", r.Sample)
	}
}

func tokensLen(dir string) (int64, error) {
	st, err := tokens.Open(dir)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	return st.Len(), nil
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d KB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
