package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens"
)

func init() {
	var presetsFile, storesDir, revision, columns string
	var set []string
	cmd := &cobra.Command{
		Use:   "datasets",
		Short: "List dataset presets and the token stores",
		Example: `  sched datasets
  KILN_DATASETS=my-presets.yaml sched datasets`,
		Long: `List dataset presets and the token stores: those of this data directory,
then those that only the worker serving append holds (compose's GPU worker,
whose disk is not this machine's), by the statuses it publishes in object
storage (their tokens, size and last update, or how they are damaged).

Each store's TOKENS and SIZE are what its manifest commits, the tokens a run
reads and the bytes they take (bytes an interrupted append left past them in
tokens.bin are not counted); SHARDS is the files appended, a file taken in
parts under --max-tokens counted once; COMMIT the dataset commits they came
from; SKIPPED the files and documents left out, by reason. A store that does
not open shows what is wrong in place of its counts.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(c *cobra.Command, args []string) error {
			presets, err := ingest.Presets(presetsFile)
			if err != nil {
				return err
			}
			given := c.Flags().Changed("stores")
			var cfg scheduler.Config
			if !given {
				if cfg, err = loadConfig(c); err != nil {
					return err
				}
				storesDir = filepath.Join(cfg.DataDir, "tokens")
			}
			// Read before anything is printed: a --stores that does not
			// read is an error, with no half of the listing before it.
			entries, err := os.ReadDir(storesDir)
			none := errors.Is(err, fs.ErrNotExist) && !given // the default place, not made yet
			if err != nil && !none && !given {
				// The user gave the data directory, not this path.
				return dataDirPathError(c, cfg.DataDir, "token stores' directory", storesDir, "--stores", err)
			}
			if err != nil && !none {
				return badInput("--stores %s: %v: name the directory whose subdirectories are token stores (default <data dir>/tokens)", storesDir, errors.Unwrap(err))
			}
			w := tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PRESET\tREPOSITORY\tREVISION\tFILES")
			for _, name := range slices.Sorted(maps.Keys(presets)) {
				p := presets[name]
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", name, p.Repo, p.Revision, strings.Join(p.Patterns(), " "))
			}
			fmt.Fprintln(w, "local:<glob>\t(local files)\t-\tparquet, jsonl[.gz|.zst], json[.gz|.zst] (JSON lines, or one array of objects, by its head), text[.gz|.zst]")
			w.Flush()
			fmt.Fprintln(c.OutOrStdout())
			out := c.OutOrStdout()
			if none {
				// The worker's stores, where it holds some, are the ones
				// there are: no hint to make one.
				var published bytes.Buffer
				listPublishedStores(c.Context(), &published, c.ErrOrStderr(), cfg, storesDir, nil)
				if published.Len() == 0 {
					fmt.Fprintf(out, "no token stores in %s yet ('sched enqueue ingest <dataset>' fills one)\n", storesDir)
					return nil
				}
				fmt.Fprintf(out, "no token stores in %s\n", storesDir)
				_, err := published.WriteTo(out)
				return err
			}
			here := map[string]bool{}
			if err := listLocalStores(out, storesDir, entries, here); err != nil {
				return err
			}
			if !given {
				listPublishedStores(c.Context(), out, c.ErrOrStderr(), cfg, storesDir, here)
			}
			return nil
		},
	}
	cmd.PersistentFlags().StringVar(&presetsFile, "presets", "", "YAML file of dataset presets (default $KILN_DATASETS)")
	noEmpty(cmd.PersistentFlags(), "presets", "a YAML file of dataset presets", "KILN_DATASETS's file, or the built-in presets alone where it is unset")
	cmd.Flags().StringVar(&storesDir, "stores", "", "directory whose subdirectories are token stores (default <data dir>/tokens)")
	noEmpty(cmd.Flags(), "stores", "a directory", "<data dir>/tokens")

	check := &cobra.Command{
		Use:   "check <name>",
		Short: "Check a dataset before ingesting it: a preset's commit, files and columns on the hub, or a local:<glob>'s files and columns here",
		Example: `  sched datasets check the-stack-v2 --set language=Go
  sched datasets check fineweb-edu --revision main
  sched datasets check 'local:/data/docs/*.jsonl' --columns text=body`,
		Args: exactArgs(1, "one dataset"),
		RunE: func(c *cobra.Command, args []string) error {
			p, _, err := resolvePreset(presetsFile, args[0], revision, set, columns)
			if err != nil {
				return err
			}
			var hc *hub.Client
			if p.Glob == "" {
				cfg, err := loadConfig(c)
				if err != nil {
					return err
				}
				// A person waits on the check: a Hub never reached (a
				// wrong HF_ENDPOINT, no network) is said at once.
				hcfg := hubConfig(cfg)
				hcfg.FailUnreached = true
				if hc, err = hub.New(hcfg); err != nil {
					return err
				}
			}
			// A hub that answers with errors (a 503, a rate limit), or
			// breaks a connection once it has answered, is tried again
			// for up to a minute: each wait is said, where it would be
			// silence.
			ctx := hub.WithRetryNotice(c.Context(), func(msg string) {
				if msg != "" {
					fmt.Fprintln(c.ErrOrStderr(), msg)
				}
			})
			res, err := ingest.Check(ctx, p, hc)
			if err != nil && revision != "" {
				err = ingest.RevisionGiven(err, "--revision", revision)
			}
			if err != nil {
				return err
			}
			where := p.Repo + " at commit " + res.Revision
			if p.Glob != "" {
				where = "local files"
			}
			files := "files"
			if res.Files == 1 {
				files = "file"
			}
			fmt.Fprintf(c.OutOrStdout(), "%s: %s: %d %s, %s; %s\n",
				p.Name, where, res.Files, files, bytesize.Format(res.Bytes), res.Describe(p.Columns))
			return nil
		},
	}
	check.Flags().StringArrayVar(&set, "set", nil, "preset variable, name=a,b (for example language=Python,Go), as 'sched enqueue ingest' takes it")
	check.Flags().StringVar(&columns, "columns", "", columnsUsage)
	check.Flags().StringVar(&revision, "revision", "", "a preset's dataset revision: a branch, tag or commit (default: the preset's)")
	noEmpty(check.Flags(), "columns", "key=name pairs such as text=content", "the dataset's columns")
	noEmpty(check.Flags(), "revision", "a branch, tag or commit", "the preset's")
	cmd.AddCommand(check)
	rootCmd.AddCommand(cmd)
}

// storeProblem says in one line why the store in dir did not open: how it is
// damaged and what to do, or the error of a store that is not damaged but
// does not read here (another release's manifest, permissions).
func storeProblem(dir string, err error) string {
	var ie *tokens.InputError
	if errors.As(err, &ie) && ie.Damage != "" {
		// An append refuses a damaged store too: it has to go before the
		// store can be ingested again. The worker that appends to it
		// notices the store gone while it runs (worker.Ingest.Stores)
		// and forgets its files, which the next ingest then plans again.
		return fmt.Sprintf("damaged: %s; delete %s, then re-ingest it if you still need it", ie.Damage, dir)
	}
	why := strings.TrimPrefix(err.Error(), "token store "+dir+": ")
	return "unreadable store: " + scheduler.OneLine(why, 300)
}

// listLocalStores writes the table of the token stores in storesDir, whose
// entries are given, and records their names in here.
func listLocalStores(out io.Writer, storesDir string, entries []os.DirEntry, here map[string]bool) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "STORE\tTOKENS\tSHARDS\tSIZE\tCOMMIT\tSKIPPED")
	for _, e := range entries {
		dir := filepath.Join(storesDir, e.Name())
		if !e.IsDir() {
			continue
		}
		// Open checks what sched train checks before it trains (the
		// manifest, tokens.bin's size against it, 64 spans of ids, not
		// every id), so a store listed with its tokens is one a run
		// can open.
		st, err := tokens.Open(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue // no manifest: not a store
		}
		here[e.Name()] = true
		if err != nil {
			// Every column filled keeps the table aligned; the
			// problem takes the last one, free text as SKIPPED is.
			// No manifest to trust: the file's size as it is.
			var size int64
			if fi, err := os.Stat(filepath.Join(dir, tokens.TokensFile)); err == nil {
				size = fi.Size()
			}
			fmt.Fprintf(w, "%s\t-\t-\t%s\t-\t%s\n", e.Name(), bytesize.Format(size), storeProblem(dir, err))
			continue
		}
		m := st.Manifest()
		st.Close()
		// What a run reads: the committed tokens, not the bytes an
		// interrupted append left past them in tokens.bin.
		size := m.Tokens * int64(m.Dtype.Width())
		commits := map[string]bool{}
		files := map[string]bool{} // a file taken in parts is one
		for _, s := range m.Shards {
			commits[s.Revision] = true
			files[s.ID] = true
		}
		skips := ingest.Skips{}
		for _, s := range m.Skipped {
			reason, _, _ := strings.Cut(s.Reason, ":")
			skips.Add(reason, max(s.Count, 1)) // a count is documents; none is one whole file
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\n", e.Name(), m.Tokens, len(files), bytesize.Format(size),
			strings.Join(slices.Sorted(maps.Keys(commits)), ","), skips)
	}
	return w.Flush()
}

// listPublishedStores writes, after the stores of this data directory,
// those that only the worker that serves append holds (compose's GPU
// worker, whose disk this shell does not see), by the statuses it
// publishes in object storage: their tokens and size, or how they are
// damaged. Where object storage is not configured here, or does not
// answer, it says so on errOut and lists none.
func listPublishedStores(ctx context.Context, out, errOut io.Writer, cfg scheduler.Config, storesDir string, here map[string]bool) {
	if cfg.S3Endpoint == "" {
		if _, err := os.Stat(cfg.LocalStoreDir()); err != nil {
			return // no object storage here: nothing was published to it
		}
	}
	objects, err := openStoreToList(ctx, cfg, errOut, "token stores' statuses")
	var names []string
	if err == nil {
		names, err = ingest.PublishedStores(ctx, objects)
	}
	if err != nil {
		fmt.Fprintf(errOut, "sched datasets: the token stores' statuses in object storage were not read (%v): only %s's stores are listed\n", redactErr(cfg, err), storesDir)
		return
	}
	names = slices.DeleteFunc(names, func(n string) bool { return here[n] })
	if len(names) == 0 {
		return
	}
	fmt.Fprintf(out, "\ntoken stores on the disk of the worker that serves append, not in %s (from their statuses in object storage):\n", storesDir)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "STORE\tTOKENS\tSIZE\tUPDATED")
	p := &ingest.Pipeline{Objects: objects}
	for _, name := range names {
		st, err := p.Status(ctx, name)
		switch {
		case err != nil:
			fmt.Fprintf(w, "%s\t-\t-\tstatus unread: %s\n", name, scheduler.OneLine(err.Error(), 200))
		case st.Damaged != "":
			fmt.Fprintf(w, "%s\t-\t-\tDAMAGED: %s\n", name, st.Damaged)
		case st.Tokens == 0:
			continue // cleared, or never appended to
		default:
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", name, st.Tokens, bytesize.Format(st.Bytes), st.Updated.UTC().Format(time.RFC3339))
		}
	}
	w.Flush()
}
