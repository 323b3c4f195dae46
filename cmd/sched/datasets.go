package main

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens"
)

func init() {
	var presetsFile, storesDir string
	cmd := &cobra.Command{
		Use:   "datasets",
		Short: "List dataset presets and the local token stores",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(c *cobra.Command, args []string) error {
			presets, err := ingest.Presets(presetsFile)
			if err != nil {
				return err
			}
			if storesDir == "" {
				cfg, err := loadConfig(c)
				if err != nil {
					return err
				}
				storesDir = filepath.Join(cfg.DataDir, "tokens")
			}
			// Read before anything is printed: a --stores that does not
			// read is an error, with no half of the listing before it.
			entries, err := os.ReadDir(storesDir)
			none := errors.Is(err, fs.ErrNotExist) && !c.Flags().Changed("stores") // the default place, not made yet
			if err != nil && !none {
				return badInput("--stores %s: %v", storesDir, err)
			}
			w := tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PRESET\tREPOSITORY\tREVISION\tFILES")
			for _, name := range slices.Sorted(maps.Keys(presets)) {
				p := presets[name]
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", name, p.Repo, p.Revision, strings.Join(p.Patterns(), " "))
			}
			fmt.Fprintln(w, "local:<glob>\t(local files)\t-\tparquet, jsonl[.gz|.zst], text")
			w.Flush()
			fmt.Fprintln(c.OutOrStdout())
			if none {
				fmt.Fprintf(c.OutOrStdout(), "no token stores in %s yet ('sched enqueue ingest <dataset>' fills one)\n", storesDir)
				return nil
			}
			w = tabwriter.NewWriter(c.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "STORE\tTOKENS\tSHARDS\tSIZE\tCOMMIT\tSKIPPED")
			for _, e := range entries {
				dir := filepath.Join(storesDir, e.Name())
				if !e.IsDir() {
					continue
				}
				m, err := tokens.ReadManifest(dir)
				if errors.Is(err, fs.ErrNotExist) {
					continue // not a store
				}
				if err != nil {
					why := strings.TrimPrefix(err.Error(), "token store "+dir+": ")
					fmt.Fprintf(w, "%s\tunreadable store: %s\n", e.Name(), scheduler.OneLine(why, 300))
					continue
				}
				var size int64
				if st, err := os.Stat(filepath.Join(dir, "tokens.bin")); err == nil {
					size = st.Size()
				}
				commits := map[string]bool{}
				for _, s := range m.Shards {
					commits[s.Revision] = true
				}
				skips := ingest.Skips{}
				for _, s := range m.Skipped {
					reason, _, _ := strings.Cut(s.Reason, ":")
					skips.Add(reason, max(s.Count, 1)) // a count is documents; none is one whole file
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\n", e.Name(), m.Tokens, len(m.Shards), humanBytes(size),
					strings.Join(slices.Sorted(maps.Keys(commits)), ","), skips)
			}
			return w.Flush()
		},
	}
	cmd.PersistentFlags().StringVar(&presetsFile, "presets", "", "YAML file of dataset presets (default $KILN_DATASETS)")
	cmd.Flags().StringVar(&storesDir, "stores", "", "directory whose subdirectories are token stores (default <data dir>/tokens)")

	check := &cobra.Command{
		Use:   "check <name>",
		Short: "Check a dataset before ingesting it: a preset's commit, files and columns on the hub, or a local:<glob>'s files and columns here",
		Args:  exactArgs(1, "one dataset"),
		RunE: func(c *cobra.Command, args []string) error {
			presets, err := ingest.Presets(presetsFile)
			if err != nil {
				return err
			}
			p, err := ingest.LookupPreset(presets, args[0])
			if err != nil {
				return err
			}
			var hc *hub.Client
			if p.Glob == "" {
				cfg, err := loadConfig(c)
				if err != nil {
					return err
				}
				if hc, err = hub.New(hubConfig(cfg)); err != nil {
					return err
				}
			}
			res, err := ingest.Check(c.Context(), p, hc)
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
				p.Name, where, res.Files, files, humanBytes(res.Bytes), res.Describe(p.Columns))
			return nil
		},
	}
	cmd.AddCommand(check)
	rootCmd.AddCommand(cmd)
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
