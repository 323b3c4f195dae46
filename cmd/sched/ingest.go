package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
	"github.com/kiln-lm/kiln/worker"
)

// planFlags shape an ingest plan; `sched ingest` and `sched enqueue ingest`
// share them, so both check a plan the same way before it is queued.
type planFlags struct {
	presetsFile, revision string
	set                   []string
	columns               string
	maxTokens, maxDisk    string
	maxFiles              int
	seed                  uint64
}

func (p *planFlags) register(f *pflag.FlagSet) {
	f.StringVar(&p.presetsFile, "presets", "", "YAML file of dataset presets that add to or replace the built-in ones (default $KILN_DATASETS)")
	f.StringVar(&p.revision, "revision", "", "a preset's dataset revision: a branch, tag or commit (default: the preset's; a local dataset has none)")
	f.StringArrayVar(&p.set, "set", nil, "preset variable, name=a,b (for example language=Python,Go)")
	f.StringVar(&p.columns, "columns", "", columnsUsage)
	f.StringVar(&p.maxTokens, "max-tokens", "", "fill the store up to this many tokens, the last file in part (25B, 500M)")
	f.StringVar(&p.maxDisk, "max-disk", "", "stop before the store's tokens.bin passes this size (50G = 50 x 2^30 bytes, 50GB = 50 x 10^9)")
	f.IntVar(&p.maxFiles, "max-files", 0, "read at most this many files of the seeded order (0: all)")
	f.Uint64Var(&p.seed, "seed", 0, "seed of the file order")
	noEmpty(f, "presets", "a YAML file of dataset presets", "KILN_DATASETS's file, or the built-in presets alone where it is unset")
	noEmpty(f, "revision", "a branch, tag or commit", "the preset's")
	noEmpty(f, "columns", "key=name pairs such as text=content", "the dataset's columns")
	noEmpty(f, "max-tokens", "a number of tokens such as 500M", "no limit")
	noEmpty(f, "max-disk", "a size such as 50G", "no limit")
}

func init() {
	var (
		direct                       bool
		storeName, storeDir, tokFile string
		pf                           planFlags
	)
	cmd := &cobra.Command{
		Use:   "ingest <dataset> [--store NAME] [--direct [--store-dir DIR] [--tokenizer-file FILE]]",
		Short: "Ingest a dataset into a token store: through the queue, or in this process with --direct",
		Long: `ingest lists the dataset's files in a seeded order, downloads each, tokenizes
it on all cores and appends it exactly once to a token store; a re-run adds
only what is missing. <dataset> is a preset (see 'sched datasets') or
local:<glob>. The store is <data dir>/tokens/<store>, --store naming it
(default: the dataset's name), and the tokenizer is the one --tokenizer
names (default KILN_TOKENIZER; 'sched tokenizers' lists them).

Without --direct it queues an ingest:plan: ingest workers (sched worker
--queues ingest=N) tokenize the files into object storage and the append
worker (--queues append=2) fills the store. With --direct the same plan,
shard and append steps run here (a few files tokenizing at once, appended
in the plan's order), and two more flags apply: --store-dir DIR fills the store in DIR instead, and
--tokenizer-file FILE tokenizes with a tokenizer.json that need not be
published. Each download is removed once tokenized: a worker downloads into
<data dir>/ingest/raw/<store>/, --direct into a directory of its own,
<data dir>/.shards-*, removed when it ends.`,
		Args: exactArgs(1, "one dataset"),
		Example: `  sched ingest the-stack-v2 --max-tokens 1.5B
  sched ingest 'local:/data/repos/**/*.go' --store my-go --direct
  sched ingest fineweb-edu --direct --store-dir /scratch/web --tokenizer-file tokenizer.json --max-files 10`,
		RunE: func(c *cobra.Command, args []string) error {
			if err := checkTokenizerFlag(c); err != nil {
				return err
			}
			if err := checkStoreFlag(storeName); err != nil {
				return err
			}
			if !direct {
				for name, v := range map[string]string{"store-dir": storeDir, "tokenizer-file": tokFile} {
					if v != "" {
						return badInput("--%s is for --direct: through the queue the store is <data dir>/tokens/NAME on the append worker (--store NAME) and the tokenizer a published one (--tokenizer NAME; 'sched tokenizers' lists them)", name)
					}
				}
				return enqueueIngest(c, args[0], storeName, pf)
			}
			return ingestDirect(c, args[0], storeName, storeDir, tokFile, pf)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&direct, "direct", false, "run the pipeline in this process, without the queue")
	f.StringVar(&storeName, "store", "", "token store name: <data dir>/tokens/NAME (default: the dataset's name; required for local:<glob>)")
	f.StringVar(&storeDir, "store-dir", "", "with --direct: the token store's directory, instead of --store NAME")
	f.StringVar(&tokFile, "tokenizer-file", "", "with --direct: a tokenizer.json to tokenize with, instead of the tokenizer --tokenizer names")
	noEmpty(f, "store", "a token store's name", "the dataset's name")
	noEmpty(f, "store-dir", "a directory", "<data dir>/tokens/<store>")
	noEmpty(f, "tokenizer-file", "a tokenizer.json", "the published tokenizer --tokenizer (KILN_TOKENIZER) names")
	pf.register(f)
	rootCmd.AddCommand(cmd)
}

// checkStoreFlag refuses a directory given to --store, which names a store.
func checkStoreFlag(name string) error {
	if strings.ContainsAny(name, `/\`) {
		return badInput("--store %s: --store takes a token store's name; give a directory as --store-dir %s (with --direct)", name, name)
	}
	return nil
}

// ingestDirect runs an ingest in this process (ingest.Direct: the queue's
// plan, shard and append steps) and prints what it did.
func ingestDirect(c *cobra.Command, dataset, storeName, storeDir, tokFile string, pf planFlags) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	p, _, limTokens, limDisk, err := pf.check(dataset)
	if err != nil {
		return err
	}
	switch {
	case storeDir != "" && storeName != "":
		return badInput("give --store NAME (the store <data dir>/tokens/NAME) or --store-dir DIR, not both")
	case storeDir != "":
		if st, err := os.Stat(storeDir); err == nil && !st.IsDir() {
			return badInput("--store-dir %s is a file, not a directory; name the token store's directory (made when missing)", storeDir)
		}
		if other := notOfAStore(storeDir); other != "" {
			return badInput("--store-dir %s holds %s and no token store (%s): a store is made in a new or empty directory, so give one", storeDir, other, tokens.ManifestFile)
		}
	case storeDir == "":
		if storeName == "" {
			if p.Glob != "" {
				return badInput("a local dataset needs --store NAME, the token store <data dir>/tokens/NAME to fill (or --store-dir DIR)")
			}
			storeName = p.Name
		}
		if err := ingest.CheckStoreName(storeName); err != nil {
			return err
		}
		storeDir = filepath.Join(cfg.DataDir, "tokens", storeName)
	}
	tok, tokLabel, err := loadTokenizerFor(c, tokFile)
	if err != nil {
		return err
	}
	tokName := cfg.Tokenizer
	if tokFile != "" {
		tokName = strings.TrimSuffix(filepath.Base(tokFile), ".json")
	}
	if err := requireEOS(tokLabel, tok); err != nil {
		return err
	}
	log := newLogger(c.ErrOrStderr(), cfg.LogFormat)
	defer log.Sync()
	opt := ingest.DirectOptions{Preset: p, Tokenizer: tok, TokenizerName: tokName, StoreDir: storeDir, DataDir: cfg.DataDir,
		Seed: pf.seed, Revision: pf.revision, MaxFiles: pf.maxFiles, MaxTokens: limTokens, MaxDisk: limDisk, Logger: log}
	if p.Glob == "" {
		if opt.Hub, opt.SWH, err = openSources(cfg, log, true); err != nil {
			return err
		}
	}
	_, statErr := os.Stat(filepath.Join(storeDir, tokens.ManifestFile))
	newStore := statErr != nil
	_, statErr = os.Stat(storeDir)
	dirExisted := statErr == nil
	rep, err := ingest.Direct(c.Context(), opt)
	if err != nil {
		if c.Context().Err() != nil {
			// Ctrl-C or SIGTERM: each file's append is whole or not in.
			if _, serr := os.Stat(filepath.Join(storeDir, tokens.ManifestFile)); newStore && serr != nil {
				return interruptedError{fmt.Errorf("ingest stopped (%w) before its first append: nothing was written to %s, and the same command again starts it", err, storeDir)}
			}
			return interruptedError{fmt.Errorf("ingest stopped (%w); the files appended to %s so far are kept, and the same command again goes on with the rest", err, storeDir)}
		}
		return err
	}
	out := c.OutOrStdout()
	if rep.StoppedBeforePlan() {
		fmt.Fprintln(out, rep.Stopped)
		return nil
	}
	appended := fmt.Sprintf("%d appended", rep.Appended)
	if rep.Partial > 0 {
		// The file at which the store reached its limit: its leading
		// documents are in, its rest waits for a larger limit.
		appended += fmt.Sprintf(" and %d in part", rep.Partial)
	}
	// A local dataset has no revision: its files are read as they are.
	at := " at " + rep.Revision
	if p.Glob != "" {
		at = ""
	}
	// A file the store records as skipped, by an earlier run, holds none
	// of its text: it is counted as skipped, for the reason recorded, as
	// the run that read it counted it, not as in the store.
	before := skipCount(rep.SkippedBefore)
	inStore := rep.Duplicates - before
	skipped := ingest.Skips{}
	skipped.Merge(rep.SkippedFiles)
	skipped.Merge(rep.SkippedBefore)
	fmt.Fprintf(out, "%s%s: %d files, %s (%d documents, %d tokens), %d already in the store%s\n",
		p.Name, at, rep.Files, appended, rep.Documents, rep.Tokens, inStore, sameContent(rep.Same))
	if len(skipped) > 0 {
		fmt.Fprintf(out, "skipped files: %s%s\n", skipped, skippedEarlier(before, p.Glob != ""))
	}
	if len(rep.SkippedRecords) > 0 {
		fmt.Fprintf(out, "skipped documents: %s\n", rep.SkippedRecords)
	}
	if n := len(rep.NotRegular); n > 0 {
		more := ""
		if n > 1 {
			more = fmt.Sprintf(", and %d more", n-1)
		}
		fmt.Fprintf(out, "passed over: %d of the glob's matches, not regular files (%s%s): only regular files are read\n", n, rep.NotRegular[0], more)
	}
	if rep.Stopped != "" {
		fmt.Fprintln(out, rep.Stopped)
	}
	// Nothing of the dataset in the store, and files skipped (by this run,
	// or recorded so by an earlier one; the rest their copies: the same
	// content under another name): an ingest of no text, whether or not
	// the store holds other files' tokens.
	if rep.Files > 0 && rep.Appended == 0 && inStore == 0 && rep.Stopped == "" && len(skipped) > 0 {
		if newStore {
			// Refused, it leaves nothing: no store that sched datasets
			// would list, bound to this tokenizer, holding no token.
			dropEmptyStore(storeDir, dirExisted, log)
		}
		first := cmp.Or(rep.FirstSkipped, rep.FirstSkippedBefore)
		if len(rep.SkippedFiles) == 0 {
			if err := skippedBefore(p.Name, rep.Files, skipped, first, storeDir); err != nil {
				return err
			}
		}
		earlier := ""
		if before > 0 {
			earlier = fmt.Sprintf(", %d of them recorded so in the store by an earlier run", before)
		}
		return badInput("%s: none of its %d files holds text to ingest (skipped: %s%s; the first: %s): give files of UTF-8 text, JSON lines or Parquet, and --columns text=<name> where their text is in another column or field than %q%s",
			p.Name, rep.Files, skipped, earlier, first, cmp.Or(p.Columns.Text, "text"), emptyStoreHint(storeDir))
	}
	return nil
}

// skipCount is the number of skips s counts, of every reason.
func skipCount(s ingest.Skips) int {
	n := 0
	for _, c := range s {
		n += int(c)
	}
	return n
}

// skippedEarlier is the clause a report adds to its skipped files for the
// n of them that the store records as skipped by an earlier run, which
// this one passed over unread, or "". local: the dataset's files are
// local, which are read again once they change (their id is their
// content).
func skippedEarlier(n int, local bool) string {
	if n == 0 {
		return ""
	}
	s := fmt.Sprintf(" (%d of them recorded as skipped in the store by an earlier run, which this one passed over", n)
	if local {
		s += ": a local file is read again once it changes"
	}
	return s + ")"
}

// dropEmptyStore removes the store at dir, which this run made and left
// holding no token: the directory where the run made it, its files where
// the directory was there before (empty, as a new store's must be).
func dropEmptyStore(dir string, dirExisted bool, log *zap.Logger) {
	if m, err := tokens.ReadManifest(dir); err != nil || m.Tokens > 0 {
		return
	}
	var err error
	if !dirExisted {
		err = os.RemoveAll(dir)
	} else if entries, rerr := os.ReadDir(dir); rerr != nil {
		err = rerr
	} else {
		for _, e := range entries {
			if n := e.Name(); isStoreDirFile(n) {
				err = errors.Join(err, os.RemoveAll(filepath.Join(dir, n)))
			}
		}
	}
	if err != nil {
		log.Warn("the empty token store this ingest made is not removed", zap.String("dir", dir), zap.Error(err))
	}
}

// skippedBefore refuses, as an ingest of no text, a run that appended
// none of the dataset's files to a store that holds no tokens at all,
// every file it skipped (skips, the first for why first) recorded there
// as skipped by an earlier run: the store holds nothing else, and is to
// be deleted before the files, fixed, are ingested again. It returns nil
// where the store holds tokens.
func skippedBefore(dataset string, files int, skips ingest.Skips, first, storeDir string) error {
	if m, err := tokens.ReadManifest(storeDir); err != nil || m.Tokens > 0 {
		return nil
	}
	return badInput("%s: none of its %d files holds text to ingest: token store %s holds no tokens and records its files as skipped by an earlier run (%s; the first: %s): fix them, or the columns read (--columns), and delete the store (rm -r %s), which holds nothing else, before you ingest them again (a changed local file is read again, an unchanged one stays skipped in this store)",
		dataset, files, storeDir, skips, first, storeDir)
}

// emptyStoreHint is what an ingest that appended nothing says of its
// store where the store holds no tokens: its files are recorded there as
// skipped, and the same files ingested again with other --columns would be
// passed over, so the store, which holds nothing else, is to be deleted
// first. Empty where the store holds tokens or has no manifest.
func emptyStoreHint(storeDir string) string {
	m, err := tokens.ReadManifest(storeDir)
	if err != nil || m.Tokens > 0 || !slices.ContainsFunc(m.Skipped, ingest.SkipHeld) {
		// Files without the column read (missing-column) are read
		// again by the next ingest, with the --columns it gives.
		return ""
	}
	return fmt.Sprintf("; token store %s now holds no tokens, only these files recorded as skipped, which an ingest into it passes over: delete it (rm -r %s) before you ingest them again", storeDir, storeDir)
}

// check resolves the dataset's preset with its variables and parses the
// limits, so that a mistake exits 2 before anything is queued or read.
func (pf planFlags) check(dataset string) (p ingest.Preset, vars map[string][]string, maxTokens, maxDisk int64, err error) {
	if maxTokens, err = parseCount(pf.maxTokens); err != nil {
		return p, nil, 0, 0, badInput("--max-tokens %q: %v (for example 25B)", pf.maxTokens, err)
	}
	if maxDisk, err = parseBytes(pf.maxDisk); err != nil {
		return p, nil, 0, 0, badInput("--max-disk: %v", err)
	}
	// Left out, a limit is none; written as 0 it would read as none too,
	// which is not what a 0 says.
	for _, z := range []struct {
		flag, v string
		n       int64
	}{{"max-tokens", pf.maxTokens, maxTokens}, {"max-disk", pf.maxDisk, maxDisk}} {
		if z.v != "" && z.n == 0 {
			return p, nil, 0, 0, badInput("--%s %s: give a positive limit, or leave it out for none", z.flag, z.v)
		}
	}
	if pf.maxFiles < 0 {
		return p, nil, 0, 0, badInput("--max-files %d: give how many files of the seeded order to read, or 0 for all", pf.maxFiles)
	}
	if p, vars, err = resolvePreset(pf.presetsFile, dataset, pf.revision, pf.set, pf.columns); err != nil {
		return p, nil, 0, 0, err
	}
	return p, vars, maxTokens, maxDisk, nil
}

// columnsUsage is --columns' help, for every command that takes it.
const columnsUsage = "the columns (parquet) or fields (JSON lines) to read in place of the dataset's, key=name of text, id, blob and encoding (for example text=content; a local dataset reads text alone by default)"

// resolvePreset is the dataset's preset (from presetsFile, or
// KILN_DATASETS, over the built-in ones) at revision (the preset's when
// empty) with the --set variables in set put in, reading the --columns
// of columns.
func resolvePreset(presetsFile, dataset, revision string, set []string, columns string) (p ingest.Preset, vars map[string][]string, err error) {
	presets, err := ingest.Presets(presetsFile)
	if err != nil {
		return p, nil, err
	}
	if p, err = ingest.LookupPreset(presets, dataset); err != nil {
		return p, nil, err
	}
	// Its files are read as they are now, whatever --revision says: given,
	// it would be dropped without a word.
	if p.Glob != "" && revision != "" {
		return p, nil, badInput("--revision %s: a local dataset (%s) has no revision, its files are read as they are: leave --revision out", revision, dataset)
	}
	if revision != "" {
		p.Revision = revision
	}
	if vars, err = parseSet(set); err != nil {
		return p, nil, err
	}
	if p, err = p.WithVars(vars); err != nil {
		return p, nil, err
	}
	if p, err = p.WithColumns(columns); err != nil {
		return p, nil, err
	}
	return p, vars, nil
}

// enqueueIngest checks the dataset, store name and limits here, where a
// mistake exits 2 at once, and queues the ingest:plan.
func enqueueIngest(c *cobra.Command, dataset, storeName string, pf planFlags) error {
	cfg, err := loadConfig(c)
	if err != nil {
		return err
	}
	p, vars, limTokens, limDisk, err := pf.check(dataset)
	if err != nil {
		return err
	}
	if err := checkQueuedGlob(p); err != nil {
		return badInput("%v", err)
	}
	if storeName == "" {
		if p.Glob != "" {
			return badInput("a local dataset needs --store NAME, the token store to fill")
		}
		storeName = p.Name
	}
	if err := ingest.CheckStoreName(storeName); err != nil {
		return err
	}
	if err := checkIngestTokenizer(c.Context(), c.OutOrStdout(), cfg, storeName); err != nil {
		return err
	}
	// The plan carries the preset as resolved here, --presets and
	// KILN_DATASETS included: the workers need no copy of the file.
	return enqueueOne(c, cfg, scheduler.IngestPlan{Dataset: dataset, Revision: pf.revision, Store: storeName, Tokenizer: cfg.Tokenizer, Vars: vars,
		Seed: pf.seed, MaxFiles: pf.maxFiles, Limits: ingest.Limits{MaxTokens: limTokens, MaxDisk: limDisk}, Preset: ingest.Carried(p)})
}

// checkQueuedGlob refuses a local dataset of a queued task whose glob is
// relative: the worker resolves it in its own working directory, which is
// not this command's and may be on another machine. An absolute glob is
// left to the worker, which alone sees its files.
func checkQueuedGlob(p ingest.Preset) error {
	if p.Glob == "" || filepath.IsAbs(p.Glob) {
		return nil
	}
	example := p.Glob
	if abs, err := filepath.Abs(p.Glob); err == nil {
		example = abs
	}
	return fmt.Errorf("dataset %s: a worker resolves a relative glob in its own working directory, not in this one: give the absolute path as the worker sees it, such as %s%s where it shares this machine's files",
		p.Name, ingest.LocalPrefix, example)
}

// checkIngestTokenizer refuses an ingest whose tokenizer neither exists nor
// is being made (the plan on the worker waits for one being made), and one
// into a store that another tokenizer wrote. A tokenizer that token stores
// or runs record, deleted, is put back from a run's checkpoint where that
// is sound (the note is written to out), else the error says how: never
// made again, which would make another.
func checkIngestTokenizer(ctx context.Context, out io.Writer, cfg scheduler.Config, storeName string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	objects, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	q, _, err := openQueue(ctx, cfg)
	if err != nil {
		return err
	}
	defer q.Close()
	entry, _, err := catalog.New(objects, cfg.DataDir).Resolve(ctx, cfg.Tokenizer)
	var nf *catalog.NotFoundError
	if errors.As(err, &nf) {
		d, used, derr := segment.FindDeletedTokenizer(ctx, objects, cfg.DataDir, cfg.Tokenizer)
		if derr != nil {
			return derr
		}
		if used {
			var said string
			if entry, said, err = d.PutBack(ctx, objects, cfg.DataDir, "the ingest"); err != nil {
				return err
			}
			fmt.Fprintln(out, "note: "+said)
		}
	}
	if err == nil {
		status, err := storeStatus(ctx, objects, q.Redis(), storeName)
		if err != nil {
			return err
		}
		if err := status.CheckDamaged(storeName); err != nil {
			return err
		}
		return tokens.CheckWrittenWith(storeName, status.Tokenizer, tokens.Tokenizer{Name: entry.Name, SHA256: entry.SHA256})
	}
	if !errors.As(err, &nf) {
		return err
	}
	live, err := q.LiveTokenizer(ctx, cfg.Tokenizer)
	if err != nil || live != nil {
		return err
	}
	request, why := tokenizerCommand(cfg.Tokenizer)
	return badInput("the ingest would tokenize with tokenizer %s, which does not exist yet: make it first with '%s'%s, or name an existing one with --tokenizer ('sched tokenizers' lists them)", cfg.Tokenizer, request, why)
}

// storeStatus reads the status of token store name. One that says the
// store is damaged is read again once the worker that holds the stores
// has looked at them (worker.AskForALook, through rdb), so that a store
// deleted or put back a moment ago, as its damage says to do, is not
// refused for what it was.
func storeStatus(ctx context.Context, objects store.Store, rdb redis.UniversalClient, name string) (ingest.StoreStatus, error) {
	p := &ingest.Pipeline{Objects: objects}
	st, err := p.Status(ctx, name)
	if err != nil || st.Damaged == "" {
		return st, err
	}
	if err := worker.AskForALook(ctx, rdb); err != nil {
		return st, nil // the status as it was: the refusal names the store
	}
	return p.Status(ctx, name)
}

// tokenizerCommand is the command that makes tokenizer name as the runs
// that train with it need it (the presets and KILN_RUNS's file): with their
// model's vocabulary, which a tokenizer published under the name with
// another could never give them. why says whose it is; empty where no run
// names the tokenizer, or its runs' models differ.
func tokenizerCommand(name string) (request, why string) {
	request = tokenizerFor(name, defaultTokenizerVocab)
	set, err := runs.Load(os.Getenv("KILN_RUNS"))
	if err != nil {
		return request, ""
	}
	vocab, by := 0, ""
	for _, r := range set.Names() {
		run, err := set.Get(r)
		if err != nil || run.Tokenizer != name {
			continue
		}
		mc, err := run.WithDefaults().ModelConfig()
		if err != nil || vocab != 0 && mc.VocabSize != vocab {
			return request, ""
		}
		vocab, by = mc.VocabSize, r
	}
	if vocab == 0 || vocab == defaultTokenizerVocab {
		return request, ""
	}
	return tokenizerFor(name, vocab), fmt.Sprintf(" (the vocabulary of the model of run %s, which trains with it)", by)
}

// tokenizerFor is the command that makes tokenizer name of vocab ids: a
// tokenizer of more ids than a model's vocabulary would be refused once
// made, and its name, once published, is never made again.
func tokenizerFor(name string, vocab int) string {
	if demo := demoTokenizerRequest(name, vocab); demo != "" {
		return demo
	}
	request := "sched enqueue tokenizer " + name
	if vocab != defaultTokenizerVocab {
		request += fmt.Sprintf(" --vocab %d", vocab)
	}
	return request
}

// hubConfig is the Hugging Face Hub client's settings: the environment's
// endpoint (HF_ENDPOINT) and the configuration's token, which has read
// HF_TOKEN (or its older name) below --hf-token and over the file's
// hf_token; a flag given empty is no token, whatever the environment says.
// The client's messages name what gave the token: the flag or the file as
// loadConfig recorded it, else the variable hub.Environment read.
func hubConfig(cfg scheduler.Config) hub.Config {
	hc := hub.Environment()
	if cfg.HFTokenFrom.Name != "" {
		hc.TokenFrom = cfg.HFTokenFrom
	} else if hc.Token != cfg.HFToken {
		// A token no variable holds, from no source recorded: named
		// HF_TOKEN, as where none is said.
		hc.TokenFrom = hub.TokenSource{}
	}
	hc.Token = cfg.HFToken
	return hc
}

// openSources makes the clients that datasets are read through: the
// Hugging Face Hub (HF_ENDPOINT; HF_TOKEN or --hf-token) and Software
// Heritage (KILN_SWH_ENDPOINT, AWS_* credentials when set). atTerminal
// is a command a person waits on (sched ingest --direct), which is told at
// once of a Hub never reached (hub.Config.FailUnreached), where a worker
// waits it out.
func openSources(cfg scheduler.Config, log *zap.Logger, atTerminal bool) (*hub.Client, *ingest.SWH, error) {
	hc := hubConfig(cfg)
	hc.Logger = log
	hc.FailUnreached = atTerminal
	h, err := hub.New(hc)
	if err != nil {
		return nil, nil, err
	}
	swh := ingest.SWHFromEnv()
	swh.Logger = log
	return h, swh, nil
}

// parseSet reads --set name=a,b flags.
func parseSet(set []string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, s := range set {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" || v == "" {
			return nil, badInput("--set %q: want name=value[,value...], for example language=Python,Go", s)
		}
		out[k] = strings.Split(v, ",")
	}
	return out, nil
}

// notOfAStore names a file in dir that no token store holds, where dir
// holds no store yet (no manifest.json), or returns "": a directory of
// other files (a published tokenizer's, a checkpoint) is no place to make
// one.
func notOfAStore(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, tokens.ManifestFile)); err == nil {
		return ""
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if n := e.Name(); !isStoreDirFile(n) {
			return n
		}
	}
	return ""
}

// isStoreDirFile says whether name is a file a token store's directory
// holds: the store's own (a first append leaves some before its manifest)
// and the mark a direct ingest keeps beside them.
func isStoreDirFile(name string) bool {
	return tokens.IsStoreFile(name) || strings.HasPrefix(name, ingest.FullMarkFile)
}

// parseCount reads a token count: "25B" (billions), "500M", "1.5K", or a
// plain number. "" is 0 (no limit).
func parseCount(s string) (int64, error) {
	return parseScaled(strings.ToUpper(strings.TrimSpace(s)), map[byte]float64{'K': 1e3, 'M': 1e6, 'B': 1e9, 'G': 1e9, 'T': 1e12})
}

// parseBytes reads a size as every size kiln reads (internal/bytesize):
// "50G" or "50GiB" (50 x 2^30), "50GB" (50 x 10^9), "512M", or a plain
// number of bytes. "" is 0 (no limit).
func parseBytes(s string) (int64, error) {
	if strings.TrimSpace(s) == "" {
		return 0, nil
	}
	return bytesize.Parse(s)
}

func parseScaled(s string, units map[byte]float64) (int64, error) {
	if s == "" {
		return 0, nil
	}
	mult := 1.0
	if m, ok := units[s[len(s)-1]]; ok {
		mult, s = m, s[:len(s)-1]
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) {
		return 0, fmt.Errorf("not a number with an optional unit")
	}
	if v < 0 {
		return 0, fmt.Errorf("negative: give a positive limit, or leave it out for none")
	}
	// 2^63 and above (infinity among them) would wrap negative: no limit.
	x := v * mult
	if x >= math.MaxInt64 {
		return 0, fmt.Errorf("too large: at most 9.2E18")
	}
	// In decimal, exactly: 1.1K is 1100 whatever 1.1 x 1000 rounds to in
	// binary. The range check above keeps the exponent small.
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return 0, fmt.Errorf("not a number with an optional unit")
	}
	if r.Mul(r, new(big.Rat).SetFloat64(mult)); !r.IsInt() {
		return 0, fmt.Errorf("not a whole number (%s)", r.FloatString(4))
	}
	return r.Num().Int64(), nil
}

// sameContent is the clause a report adds for the files whose content
// another file of the dataset already has (one shard holds it), or "".
func sameContent(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d with the same content as another file", n)
}
