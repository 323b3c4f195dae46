package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/sample"
	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/worker"
)

// defaultMixture is the seed plan's mixture for the long run: mostly code,
// with prose and mathematics so that neither falls apart into characters.
const defaultMixture = "the-stack-v2=0.7,fineweb-edu=0.2,proof-pile-2=0.1"

// defaultTokenizerVocab is --vocab's default, the pilot's vocabulary.
const defaultTokenizerVocab = 16384

// minSampleBytesPerID is the least text a tokenizer's sample holds per id
// asked: a unit left off (--sample 100) would train 257 ids under a name
// published for good. The smallest samples in use hold 64 (the tests'
// 1MB for 16384 ids) to 512 bytes an id (the README's CPU day).
const minSampleBytesPerID = 16

// minVocab is the 256 byte symbols, the end-of-text token and one merge;
// maxVocab the most ids a tokenizer may be asked for (a model's embedding
// of more would not be trained on the GPUs kiln serves).
const minVocab, maxVocab = 258, 1 << 24

// tokenizerRequest is what `sched enqueue tokenizer` was asked for.
type tokenizerRequest struct {
	name, sample, from, previous string
	presetsFile                  string
	vocab                        int
	seed                         uint64
}

// newEnqueueTokenizerCmd is `sched enqueue tokenizer`, added to the
// enqueue command by enqueue.go.
func newEnqueueTokenizerCmd() *cobra.Command {
	var r tokenizerRequest
	cmd := &cobra.Command{
		Use:   "tokenizer <name>",
		Short: "Sample a mixture of datasets (tokenizer:sample) and train a tokenizer on it (tokenizer:train)",
		Long: `Queues one tokenizer:sample task per dataset on the ingest queue. Each draws its
weight's part of --sample from files chosen by --seed across the dataset, and
keeps a held-out slice apart. The last to finish queues tokenizer:train on the
append queue, which trains the vocabulary, stores tokenizers/<name>/tokenizer.json
in object storage and the data directory, and writes report.md beside it:
vocabulary, special tokens and bytes per token on each dataset's held-out text,
next to the previous tokenizer's (--previous, default the configured one).

A tokenizer's name is never reused: token stores and checkpoints record its
sha256, so a new vocabulary needs a new name.`,
		Args: exactArgs(1, "one tokenizer name"),
		Example: `  sched enqueue tokenizer mix-16384
  sched enqueue tokenizer mix-4096 --vocab 4096 --sample 2MB
  sched enqueue tokenizer go-8192 --vocab 8192 --from 'the-stack-v2=0.8,local:/data/docs/*.md=0.2'`,
		RunE: func(c *cobra.Command, args []string) error {
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			r.name = args[0]
			if !c.Flags().Changed("previous") {
				r.previous = cfg.Tokenizer
			}
			return enqueueTokenizer(c, cfg, r)
		},
	}
	f := cmd.Flags()
	f.IntVar(&r.vocab, "vocab", defaultTokenizerVocab, "vocabulary size, special tokens and the 256 bytes included")
	f.StringVar(&r.sample, "sample", "2GB", "text to train on, over all datasets (e.g. 2GB, 500MB, 1GiB)")
	f.StringVar(&r.from, "from", defaultMixture, "datasets and weights: preset=weight,... or local:<glob>=weight")
	f.Uint64Var(&r.seed, "seed", 1, "chooses the files sampled and the held-out documents")
	f.StringVar(&r.previous, "previous", "", "tokenizer to compare with in the report (default: the configured tokenizer; empty for none)")
	f.StringVar(&r.presetsFile, "presets", "", "YAML file of dataset presets that add to or replace the built-in ones (default $KILN_DATASETS)")
	noEmpty(f, "presets", "a YAML file of dataset presets", "KILN_DATASETS's file, or the built-in presets alone where it is unset")
	return cmd
}

// sampleTasks checks a request and returns its sampling tasks; every
// mistake is bad input naming the flag.
func sampleTasks(r tokenizerRequest) ([]scheduler.TokenizerSample, error) {
	if err := catalog.CheckName(r.name); err != nil {
		return nil, badInput("%v", err)
	}
	if r.vocab < minVocab || r.vocab > maxVocab {
		return nil, badInput("--vocab %d: give a vocabulary of %d to %d ids (the 256 byte symbols, the end-of-text token and at least one merge; 16384 is the plan's)", r.vocab, minVocab, maxVocab)
	}
	total, err := sample.ParseSize(r.sample)
	if err != nil {
		return nil, badInput("--sample: %v", err)
	}
	// A --from that does not read is named before a --sample too small:
	// each is a mistake of its own flag.
	mix, err := sample.ParseMix(r.from)
	if err != nil {
		return nil, badInput("--from: %v", err)
	}
	if least := int64(r.vocab) * minSampleBytesPerID; total < least {
		return nil, badInput("--sample %s is too little text for %d ids: each merge is learnt from pairs seen many times over, and a tokenizer that falls short is published anyway, its name taken for good; give at least %s (%d bytes an id; the README's CPU day samples 2MB for 4096 ids, the plan 2GB for 16384)",
			r.sample, r.vocab, bytesize.Format(least), minSampleBytesPerID)
	}
	presets, err := ingest.Presets(r.presetsFile)
	if err != nil {
		return nil, err
	}
	resolved := make([]ingest.Preset, len(mix))
	for i, s := range mix {
		if resolved[i], err = ingest.LookupPreset(presets, s.Dataset); err != nil {
			return nil, badInput("--from: %v", err)
		}
		if err := checkQueuedGlob(resolved[i]); err != nil {
			return nil, badInput("--from: %v", err)
		}
		if b := sample.Budgets(mix, total)[i]; b <= 0 {
			return nil, badInput("--from: %s's weight %.4g of --sample %s is no bytes at all: raise --sample or the weight", s.Dataset, s.Weight, r.sample)
		}
	}
	if r.previous == r.name {
		r.previous = ""
	}
	tasks := worker.TokenizerSampleTasks(r.name, mix, total, r.vocab, r.seed, r.previous)
	for i := range tasks {
		// As resolved here, KILN_DATASETS included: the workers need no
		// copy of the file.
		tasks[i].Preset = ingest.Carried(resolved[i])
	}
	return tasks, nil
}

func enqueueTokenizer(c *cobra.Command, cfg scheduler.Config, r tokenizerRequest) error {
	ctx := c.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	tasks, err := sampleTasks(r)
	if err != nil {
		return err
	}
	objects, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	// Refused here, before hours of sampling, rather than by the training.
	cat := catalog.New(objects, cfg.DataDir)
	names, err := cat.Names(ctx)
	if err != nil {
		return err
	}
	for _, n := range names {
		if n == r.name {
			e, _, err := cat.Resolve(ctx, n)
			if err != nil {
				return err
			}
			// The same request again, once it is done, is done: as a
			// run at its total steps, it says so and is left alone.
			if same, err := madeByRequest(ctx, cat, tasks[0]); err != nil {
				return err
			} else if same {
				fmt.Fprintf(c.OutOrStdout(), "tokenizer %q already exists, made by this same request (%d ids, sha256 %s); nothing queued ('sched tokenizers %s' prints its report)\n", n, e.VocabSize, e.SHA256, n)
				return nil
			}
			return badInput("tokenizer %q already exists (%d ids, sha256 %s), made by another request (datasets, sample, seed or vocabulary) or by hand: a published tokenizer is never replaced, because the stores and checkpoints made with it would change meaning; choose another name", n, e.VocabSize, e.SHA256)
		}
	}

	q, _, err := openQueue(ctx, cfg)
	if err != nil {
		return err
	}
	defer q.Close()
	// A comparison asked for by name needs that tokenizer, made or being
	// made (the configured default may not exist yet: then the report has
	// none).
	if c.Flags().Changed("previous") && r.previous != "" && r.previous != r.name && !slices.Contains(names, r.previous) {
		live, err := q.LiveTokenizer(ctx, r.previous)
		if err != nil {
			return err
		}
		if live == nil {
			return badInput("--previous %q: no tokenizer of that name to compare with (known: %s); name one 'sched tokenizers' lists, or leave --previous empty", r.previous, joinOrDash(names))
		}
	}
	// A tokenizer of this name being made by another request (other
	// datasets, size, seed or vocabulary) would be published first, and
	// this one's work thrown away: refused. The same request again is
	// "already queued", its samples' or, once they are drawn, its
	// training's.
	out := c.OutOrStdout()
	if live, err := q.LiveTokenizer(ctx, r.name); err != nil {
		return err
	} else if live != nil {
		if id, err := scheduler.TaskID(worker.TokenizerTrainTask(tasks[0])); err == nil && id == live.ID {
			fmt.Fprintf(out, "tokenizer %s: its samples are drawn, and tokenizer:train is already %s as %s; nothing queued ('sched status %s' follows it); the tokenizer lands at %s\n",
				r.name, stateWord(live.State.String()), live.ID, live.ID, catalog.Key(r.name))
			return nil
		}
		ours := false
		for _, t := range tasks {
			if id, err := scheduler.TaskID(t); err == nil && id == live.ID {
				ours = true
			}
		}
		if !ours {
			return badInput("tokenizer %q is being made by another request (%s, %s): wait for it ('sched status'), or cancel it ('sched cancel %s') first, or choose another name",
				r.name, live.ID, live.State, live.ID)
		}
	}
	for _, t := range tasks {
		fmt.Fprintf(out, "%s, %d bytes: ", t.Dataset, t.Bytes)
		sub, err := q.Again(ctx, t)
		if err := printSubmitted(out, t, sub, err); err != nil {
			return err
		}
	}
	var ds []string
	for _, t := range tasks {
		ds = append(ds, t.Dataset)
	}
	fmt.Fprintf(out, "tokenizer:train is queued once %s are sampled; the tokenizer lands at %s and its report at %s\n",
		strings.Join(ds, ", "), catalog.Key(r.name), catalog.ReportMarkdownKey(r.name))
	return nil
}

// madeByRequest says whether the published tokenizer of s's name was
// trained on the sample s's request draws (its report says so), at the
// vocabulary it asks for. One published without a report (by hand, or a
// training that stopped between the two) is not known to be.
func madeByRequest(ctx context.Context, cat *catalog.Catalog, s scheduler.TokenizerSample) (bool, error) {
	rep, ok, err := cat.GetReport(ctx, s.Name)
	if err != nil || !ok {
		return false, err
	}
	asked := rep.VocabSize
	if rep.Asked > 0 {
		asked = rep.Asked
	}
	return rep.Sample == worker.TokenizerTrainTask(s).Sample && asked == s.VocabSize, nil
}
