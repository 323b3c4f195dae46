package main

import (
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

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/shell"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

func init() {
	var tokensDir string
	cmd := &cobra.Command{
		Use:   "tokenizers [name]",
		Short: "List the tokenizers known, their vocabulary, and the token stores and runs that use each; with a name, print its report",
		Example: `  sched tokenizers
  sched tokenizers mix-16384`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 1 {
				return badInput("sched tokenizers takes at most one tokenizer name (got %d arguments); see 'sched tokenizers --help'", len(args))
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			ctx := c.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			objects, err := openStoreToList(ctx, cfg, c.ErrOrStderr(), "tokenizers")
			if store.Unreachable(err) {
				// This machine's copies of the tokenizers serve while
				// object storage is out of service, as catalog.Resolve's
				// do: a published tokenizer's bytes never change.
				fmt.Fprintf(c.ErrOrStderr(), "object storage at %s does not answer (%s; check KILN_S3_ENDPOINT, http or https with KILN_S3_SECURE, and that it is running): listed from this machine's copies in %s only; the runs that use each, and tokenizers only object storage holds, show once it answers\n",
					s3Address(cfg), redactErr(cfg, errors.New(store.Outage(err))), filepath.Join(cfg.DataDir, "tokenizers"))
				objects, err = nil, nil
			}
			if err != nil {
				return err
			}
			cat := catalog.New(objects, cfg.DataDir)
			if len(args) == 1 {
				return printTokenizerReport(ctx, c.OutOrStdout(), cat, args[0])
			}
			if !c.Flags().Changed("tokens-dir") {
				tokensDir = filepath.Join(cfg.DataDir, "tokens")
				// Not made yet is no store yet; anything else that keeps
				// it from reading is the data directory's to fix, which is
				// what the user gave.
				if _, err := os.ReadDir(tokensDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return dataDirPathError(c, cfg.DataDir, "token stores' directory", tokensDir, "--tokens-dir", err)
				}
			} else if st, err := os.Stat(tokensDir); err != nil || !st.IsDir() {
				// The default may not exist yet (no store made); a
				// directory named by hand that is not there is a typo.
				return badInput("--tokens-dir %s: not a directory: give the directory that holds the token stores (default <data dir>/tokens)", tokensDir)
			}
			// The stores of the worker that serves append, on a disk
			// that is not this machine's, by their statuses in object
			// storage, as 'sched datasets' lists them: only a --tokens-dir
			// named by hand is read alone.
			published := !c.Flags().Changed("tokens-dir")
			return listTokenizers(ctx, c.OutOrStdout(), c.ErrOrStderr(), cat, tokensDir, cfg.Tokenizer, published)
		},
	}
	cmd.Flags().StringVar(&tokensDir, "tokens-dir", "", "directory of the token stores (default <data dir>/tokens)")
	noEmpty(cmd.Flags(), "tokens-dir", "a directory", "<data dir>/tokens")
	rootCmd.AddCommand(cmd)
}

// listTokenizers prints one line per tokenizer, and then any store made
// by a tokenizer the catalog does not hold, so that it is noticed. With
// published, a store's user is also read from the statuses the worker
// that serves append publishes in object storage, so that a tokenizer
// reads as used from any machine, not only from the one whose disk holds
// its stores; a status that does not read is said on errOut.
func listTokenizers(ctx context.Context, w, errOut io.Writer, cat *catalog.Catalog, tokensDir, configured string, published bool) error {
	entries, err := cat.List(ctx)
	if err != nil {
		return err
	}
	u, err := cat.Usage(ctx, tokensDir)
	if err != nil {
		return err
	}
	if published && cat.Objects != nil {
		if err := publishedUsage(ctx, cat.Objects, u.Stores); err != nil {
			fmt.Fprintf(errOut, "sched tokenizers: the token stores' statuses in object storage were not read (%v): STORES lists only %s's stores\n", err, tokensDir)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVOCAB\tSHA256\tSTORES\tRUNS")
	known := map[string]bool{}
	for _, e := range entries {
		if e.Unreadable != "" {
			fmt.Fprintf(tw, "%s\tunreadable: %s\t\t\t\n", e.Name, scheduler.OneLine(e.Unreadable, 300))
			continue
		}
		known[e.SHA256] = true
		name := e.Name
		if name == configured {
			name += " (default)"
		}
		runs := joinOrDash(u.Runs[e.SHA256])
		if cat.Objects == nil {
			runs = "?" // the runs' checkpoints are in object storage, which does not answer
		}
		fmt.Fprintf(tw, "%s\t%d\t%.12s\t%s\t%s\n", name, e.VocabSize, e.SHA256, joinOrDash(u.Stores[e.SHA256]), runs)
	}
	if len(entries) == 0 {
		fmt.Fprintf(tw, "(none: train one with 'sched enqueue tokenizer NAME', or here with 'mkdir -p %s && sched tokenizer train --in TEXT --out %s')\n",
			shell.Quote(filepath.Join(cat.Dir, "NAME")), shell.Quote(filepath.Join(cat.Dir, "NAME", catalog.FileName)))
	}
	for _, sha := range slices.Sorted(maps.Keys(u.Stores)) {
		if !known[sha] {
			fmt.Fprintf(tw, "(unknown)\t-\t%.12s\t%s\t%s\n", sha, joinOrDash(u.Stores[sha]), joinOrDash(u.Runs[sha]))
		}
	}
	for _, sha := range slices.Sorted(maps.Keys(u.Runs)) {
		if !known[sha] && u.Stores[sha] == nil {
			fmt.Fprintf(tw, "(unknown)\t-\t%.12s\t-\t%s\n", sha, joinOrDash(u.Runs[sha]))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, msg := range u.Unreadable {
		fmt.Fprintf(w, "unreadable store: %s\n", msg)
	}
	return nil
}

func joinOrDash(ss []string) string {
	if len(ss) == 0 {
		return "-"
	}
	return strings.Join(ss, ",")
}

func printTokenizerReport(ctx context.Context, w io.Writer, cat *catalog.Catalog, name string) error {
	e, _, err := cat.Resolve(ctx, name)
	if nf := (*catalog.NotFoundError)(nil); errors.As(err, &nf) {
		nf.Argument = true
	}
	if err != nil {
		return err
	}
	r, ok, err := cat.GetReport(ctx, name)
	if err != nil {
		return err
	}
	if !ok {
		fmt.Fprintf(w, "# Tokenizer %s\n\n- vocabulary: %d ids\n- sha256: %s\n- special tokens: %q\n\n(no report: it was not trained by 'sched enqueue tokenizer', or it was put back from a run's checkpoint, which holds no copy of the report)\n",
			e.Name, e.VocabSize, e.SHA256, e.Special)
		return nil
	}
	_, err = io.WriteString(w, r.Markdown())
	return err
}

// publishedUsage adds to stores (the store names by tokenizer hash) the
// stores whose statuses in object storage record the tokenizer that wrote
// them, those of this disk already listed left as they are.
func publishedUsage(ctx context.Context, objects store.Store, stores map[string][]string) error {
	names, err := ingest.PublishedStores(ctx, objects)
	if err != nil {
		return err
	}
	listed := map[string]bool{}
	for _, ns := range stores {
		for _, n := range ns {
			listed[n] = true
		}
	}
	p := &ingest.Pipeline{Objects: objects}
	added := map[string]bool{}
	for _, name := range names {
		if listed[name] {
			continue
		}
		st, err := p.Status(ctx, name)
		if err != nil {
			return err
		}
		if sha := st.Tokenizer.SHA256; sha != "" && st.Tokens > 0 {
			stores[sha] = append(stores[sha], name)
			added[sha] = true
		}
	}
	for sha := range added {
		slices.Sort(stores[sha])
	}
	return nil
}
