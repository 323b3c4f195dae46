package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
	"github.com/kiln-lm/kiln/worker"
)

// BenchResultsKey is where bench:run appends its rows, one JSON object per
// line (results.BenchRow), and where `sched results bench` reads them.
const BenchResultsKey = worker.BenchKey

func init() {
	var tbDir string
	cmd := &cobra.Command{
		Use:   "results <run|bench>",
		Short: "Print a run's results (summary, gates, plot location) or the bench sweep table",
		Long: `results prints what training left in object storage: for a run,
results/<run>/summary.md (the results table, the pilot's gates with their
numbers and verdicts, the configuration, a sample) and where loss.svg is;
for "bench", the sweep table from results/bench/ (tok/s, peak memory, MFU,
and whether the GPU was idle).

--tensorboard DIR downloads the run's TensorBoard event files (one per
training segment) into DIR/<run>/, for 'tensorboard --logdir DIR', and
removes those of an earlier download that object storage no longer holds.`,
		Example: `  sched results pilot
  sched results pilot --tensorboard tb && tensorboard --logdir tb
  sched results bench`,
		Args: exactArgs(1, "a run name or bench"),
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			if err := checkName("run", args[0]); err != nil {
				return err
			}
			what := "results of run " + args[0]
			switch {
			case args[0] == "bench":
				what = "bench results"
			case tbDir != "":
				what = "TensorBoard event files of run " + args[0]
			}
			st, err := openStoreToRead(c.Context(), cfg, what)
			if err != nil {
				return err
			}
			if args[0] == "bench" {
				if tbDir != "" {
					return badInput("--tensorboard %s: the bench sweep has no TensorBoard files; give a run's name ('sched results <run> --tensorboard %s')", tbDir, tbDir)
				}
				return printBench(c.Context(), c.OutOrStdout(), st)
			}
			if c.Flags().Changed("tensorboard") && strings.TrimSpace(tbDir) == "" {
				return badInput("--tensorboard is given empty: give a directory to download the event files into, such as tb")
			}
			if tbDir != "" {
				return downloadEvents(c.Context(), c.OutOrStdout(), st, args[0], tbDir)
			}
			return printRunResults(c.Context(), c.OutOrStdout(), cfg, st, args[0])
		},
	}
	cmd.Flags().StringVar(&tbDir, "tensorboard", "", "download the run's TensorBoard event files into DIR/<run>/")
	rootCmd.AddCommand(cmd)
}

// downloadEvents copies results/<run>/tensorboard/ into dir/<run>/, and
// removes the event files there that it no longer holds.
func downloadEvents(ctx context.Context, w io.Writer, st store.Store, run, dir string) error {
	prefix := segment.ResultsPrefix(run) + results.TensorBoardDir + "/"
	objs, err := st.List(ctx, prefix)
	if err != nil {
		return fmt.Errorf("list %s: %w", prefix, err)
	}
	if len(objs) == 0 {
		if err := checkRunKnown(run, "TensorBoard event files"); err != nil {
			return err
		}
		return badInput("run %q has no TensorBoard event files yet (%s is empty): they appear with the run's first checkpoint; see 'sched status'", run, prefix)
	}
	out := filepath.Join(dir, run)
	// A checkpoint's or a token store's files are kiln's alone, as for
	// `sched tokenize`'s output.
	for _, m := range managedDirs {
		if d, ok := holding(filepath.Join(out, "event file"), m.is); ok {
			return badInput("--tensorboard %s is in a %s's directory, %s, whose files only %s writes: give a directory of its own, such as tb", dir, m.what, d, m.writer)
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		// Where in the path it failed: a file in the way of dir/<run>
		// is not dir itself.
		at, move := dir, ""
		var pe *fs.PathError
		if errors.As(err, &pe) && filepath.Clean(pe.Path) != filepath.Clean(dir) {
			at, move = dir+": "+pe.Path, ", or move "+pe.Path
		}
		return badInput("--tensorboard %s: %v: give a directory this user can write (it is made if absent), such as tb%s", at, errors.Unwrap(err), move)
	}
	held := map[string]bool{}
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, prefix)
		if name == "" || strings.Contains(name, "/") {
			continue
		}
		if err := getFile(ctx, st, o.Key, filepath.Join(out, name)); err != nil {
			return err
		}
		held[name] = true
	}
	// An event file of an earlier download that object storage no longer
	// holds was removed there: its steps were trained again, and are in
	// another file.
	entries, err := os.ReadDir(out)
	if err != nil {
		return fmt.Errorf("--tensorboard %s: %w", dir, err)
	}
	for _, e := range entries {
		if _, _, _, ok := results.ParseEventFileName(e.Name()); ok && e.Type().IsRegular() && !held[e.Name()] {
			if err := os.Remove(filepath.Join(out, e.Name())); err != nil {
				return fmt.Errorf("--tensorboard %s: %w", dir, err)
			}
		}
	}
	_, err = fmt.Fprintf(w, "%d event files of run %s in %s: tensorboard --logdir %s\n", len(objs), run, out, dir)
	return err
}

// getFile copies one object to path, whole or not at all.
func getFile(ctx context.Context, st store.Store, key, path string) error {
	r, err := st.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("get %s: %w", key, err)
	}
	defer r.Close()
	if err := writeOutput(path, func(w io.Writer) error { _, err := io.Copy(w, r); return err }); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func printRunResults(ctx context.Context, w io.Writer, cfg scheduler.Config, st store.Store, run string) error {
	key := segment.ResultsPrefix(run) + results.SummaryFile
	r, err := st.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		if err := checkRunKnown(run, "results"); err != nil {
			return err
		}
		return badInput("no results for run %q yet (%s is absent): results appear with the run's first checkpoint; see 'sched status'", run, key)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	defer r.Close()
	if _, err := io.Copy(w, r); err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	plot := segment.ResultsPrefix(run) + results.PlotFile
	where := plot + " in bucket " + cfg.S3Bucket + " (the MinIO console shows it)"
	if cfg.S3Endpoint == "" {
		where = filepath.Join(cfg.LocalStoreDir(), filepath.FromSlash(plot))
	}
	_, err = fmt.Fprintf(w, "\nloss curve: %s\n", where)
	return err
}

func printBench(ctx context.Context, w io.Writer, st store.Store) error {
	r, err := st.Get(ctx, BenchResultsKey)
	if errors.Is(err, store.ErrNotFound) {
		return badInput("no bench results yet (%s is absent): run 'sched enqueue bench sweep' and a GPU worker", BenchResultsKey)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", BenchResultsKey, err)
	}
	defer r.Close()
	rows, err := results.ReadBench(r)
	if err != nil {
		return fmt.Errorf("%s: %w", BenchResultsKey, err)
	}
	_, err = io.WriteString(w, results.BenchTable(rows))
	return err
}

// checkRunKnown refuses, for what (results, event files) of run in object
// storage that has none, a run no preset and no KILN_RUNS file names: it
// is a name mistyped, not a run without them yet.
func checkRunKnown(run, what string) error {
	if set, err := runs.Load(os.Getenv("KILN_RUNS")); err == nil && !slices.Contains(set.Names(), run) {
		return badInput("no %s for run %q: no run of that name is known here (%s, or one in a runs file named by KILN_RUNS, as the GPU worker's)", what, run, strings.Join(set.Names(), ", "))
	}
	return nil
}
