package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/sample"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// Tokenizers handles tokenizer:sample and tokenizer:train with the
// dependencies it holds; give it to New in Params.Handlers.
type Tokenizers struct {
	// Objects holds the samples and the tokenizers (required): samples are
	// drawn on any ingest machine and trained on the append machine.
	Objects store.Store
	// DataDir is the local data directory (required): downloads while they
	// are sampled, and the catalog's copies under tokenizers/.
	DataDir string
	// Hub lists and downloads hub datasets. Default hub.New(hub.Environment()).
	Hub *hub.Client
	// SWH fetches blob contents for presets that ship blob ids only.
	// Default ingest.SWHFromEnv().
	SWH *ingest.SWH
	// Presets are the datasets known by name, for a task that carries no
	// preset: one queued by a sched older than the tasks that carry the
	// presets they name. Default ingest.Presets(""), the built-in ones and
	// KILN_DATASETS's file, read by each such task.
	Presets map[string]ingest.Preset
	// LocalRoots are the directories whose files a sample of a local
	// dataset (local:<glob>) may read, as ingest.Pipeline.LocalRoots: a
	// payload comes from whoever can write to Redis, so a glob reaching
	// outside them is refused before anything is read. None: no local
	// dataset is sampled.
	LocalRoots []string
	// Enqueue queues the training once every sample is drawn (required):
	// scheduler.Client.Enqueue.
	Enqueue func(ctx context.Context, a scheduler.Args) error
	// Log receives the handlers' logs. Default zap.NewNop().
	Log *zap.Logger
}

// resolve checks t's dependencies and returns a copy with its defaults.
func (t *Tokenizers) resolve() (*Tokenizers, error) {
	r := *t
	switch {
	case r.Objects == nil:
		return nil, &requiredError{"Objects", "samples and tokenizers live in the object store"}
	case r.DataDir == "":
		return nil, &requiredError{"DataDir", "downloads are sampled and tokenizers trained there"}
	case r.Enqueue == nil:
		return nil, &requiredError{"Enqueue", "the last sample drawn queues the training"}
	}
	if r.Log == nil {
		r.Log = zap.NewNop()
	}
	if r.Presets == nil {
		// The tasks carry the presets they name, as the command that
		// queued them read them, so a presets file this worker cannot
		// read fails only a task queued by an older sched, which carries
		// none: the worker starts, and says it here, where the file's
		// owner looks, rather than when such a task comes.
		if _, err := ingest.Presets(""); err != nil {
			r.Log.Warn("KILN_DATASETS is not read; the worker starts all the same, as every task queued by this build carries the presets it names, "+
				"and a tokenizer or ingest task queued by an older sched, which carries none, fails until the file is mended or KILN_DATASETS unset", zap.Error(err))
		}
	}
	if r.SWH == nil {
		r.SWH = ingest.SWHFromEnv()
	}
	if r.Hub == nil {
		// Its error names HF_ENDPOINT, the setting to mend.
		h, err := hub.New(hub.Environment())
		if err != nil {
			return nil, err
		}
		r.Hub = h
	}
	// A worker started after a kill removes what killed tasks left, even
	// if no tokenizer task comes again.
	if err := r.removeStaleTemp(sampleTemp, trainTemp); err != nil {
		return nil, fmt.Errorf("tokenizer tasks' temporary directories: %w", err)
	}
	return &r, nil
}

// tempDir is a kind of temporary directory that a tokenizer task makes
// under DataDir, held by its process (ingest.TempDir) so that the
// directories of killed tasks are told from those of live ones, which
// other workers sharing the data directory may be running.
type tempDir struct{ dir, pattern string }

var (
	// sampleTemp holds a sample's downloads and its text while it is
	// drawn: up to the sample's size (--sample).
	sampleTemp = tempDir{"tmp", "sample-*"}
	// trainTemp holds the samples a training reads: the whole sample.
	trainTemp = tempDir{".", "tokenizer-train-*"}
)

// mkdirTemp makes a temporary directory of kind k held by this process,
// once it has removed those of k that killed tasks left.
func (t *Tokenizers) mkdirTemp(k tempDir) (*ingest.TempDir, error) {
	if err := t.removeStaleTemp(k); err != nil {
		return nil, err
	}
	dir := filepath.Join(t.DataDir, k.dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return ingest.MkdirTemp(dir, k.pattern)
}

// removeTemp removes a task's temporary directory. One that cannot be
// removed is left unheld, so the next task or worker start tries again
// and fails with the error: the task's own outcome stands.
func (t *Tokenizers) removeTemp(d *ingest.TempDir) {
	if err := d.Remove(); err != nil {
		t.Log.Warn("temporary directory not removed; the next tokenizer task or worker start removes it", zap.String("dir", d.Path), zap.Error(err))
	}
}

// removeStaleTemp removes the temporary directories of kinds ks that no
// live process holds.
func (t *Tokenizers) removeStaleTemp(ks ...tempDir) error {
	var errs []error
	for _, k := range ks {
		removed, err := ingest.RemoveStaleTemp(filepath.Join(t.DataDir, k.dir), k.pattern)
		for _, d := range removed {
			t.Log.Info("removed the temporary directory of a killed tokenizer task", zap.String("dir", d))
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func shares(m []scheduler.TokenizerShare) []sample.Share {
	out := make([]sample.Share, len(m))
	for i, s := range m {
		out[i] = sample.Share{Dataset: s.Dataset, Weight: s.Weight}
	}
	return out
}

// sample draws one dataset's part of a tokenizer's sample into
// object storage; the task that finds every part drawn queues the training.
func (t *Tokenizers) sample(ctx context.Context, a scheduler.TokenizerSample) error {
	const kind = scheduler.KindTokenizerSample
	if err := checkSamplePayload(a); err != nil {
		return permanent(kind, err)
	}
	log := t.Log.With(zap.String("tokenizer", a.Name), zap.String("dataset", a.Dataset))
	prefix := sample.Prefix(a.Name, shares(a.Mixture), a.Seed, a.TotalBytes)
	key := sample.SampleKey(prefix, a.Dataset)
	if _, err := t.Objects.Stat(ctx, key); err == nil {
		log.Info("sample already drawn", zap.String("object", key))
	} else if !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%s: %w", kind, err)
	} else if err := drawSample(ctx, t, a, prefix, log); err != nil {
		return permanent(kind, err)
	}
	return queueTrainingWhenSampled(ctx, t, a, prefix)
}

func checkSamplePayload(a scheduler.TokenizerSample) error {
	if err := catalog.CheckName(a.Name); err != nil {
		return err
	}
	if a.Dataset == "" || a.Bytes <= 0 || len(a.Mixture) == 0 {
		return &scheduler.PayloadError{Kind: a.Kind(), Msg: "no dataset, size or mixture: enqueue it with 'sched enqueue tokenizer'"}
	}
	return nil
}

func drawSample(ctx context.Context, t *Tokenizers, a scheduler.TokenizerSample, prefix string, log *zap.Logger) error {
	presets := t.Presets
	if presets == nil && a.Preset == nil && !strings.HasPrefix(a.Dataset, ingest.LocalPrefix) {
		// Queued by an older sched: the dataset is looked up here.
		p, err := ingest.Presets("")
		if err != nil {
			return fmt.Errorf("KILN_DATASETS on this worker: %w; this task, queued by an older sched, carries no preset of dataset %s and is looked up there: "+
				"mend the file or unset KILN_DATASETS and retry it ('sched retry'), or queue it again with 'sched enqueue tokenizer', which carries the presets", err, a.Dataset)
		}
		presets = p
	}
	preset, err := ingest.ResolvePreset(presets, a.Dataset, a.Preset)
	if err != nil {
		return err
	}
	if err := checkLocalRoots(ctx, t.LocalRoots, preset, a.Seed); err != nil {
		return err
	}
	tmp, err := t.mkdirTemp(sampleTemp)
	if err != nil {
		return err
	}
	defer t.removeTemp(tmp)
	text, err := os.Create(filepath.Join(tmp.Path, "sample.txt"))
	if err != nil {
		return err
	}
	defer text.Close()
	held, err := os.Create(filepath.Join(tmp.Path, "heldout.jsonl"))
	if err != nil {
		return err
	}
	defer held.Close()
	rep := Progress(ctx)
	msg := fmt.Sprintf("sampling %d bytes of %s for tokenizer %s", a.Bytes, a.Dataset, a.Name)
	rep.Message(ctx, msg)
	st, err := sample.Draw(hub.SayRetries(ctx, msg, func(msg string) { rep.Message(ctx, msg) }), sample.Options{Preset: preset, Hub: t.Hub, SWH: t.SWH, Bytes: a.Bytes, Seed: a.Seed, TempDir: tmp.Path, Logger: log}, text, held)
	if err != nil {
		return err
	}
	if st.Bytes == 0 {
		return &ingest.PresetError{Err: fmt.Errorf("dataset %s gave no text to sample (files %d, skipped %s): check its preset's columns", a.Dataset, st.Listed, st.Skipped)}
	}
	// The held-out text goes first: the sample object is what marks this
	// dataset done, so it must be the last thing written.
	if err := putFile(ctx, t.Objects, sample.HeldOutKey(prefix, a.Dataset), held); err != nil {
		return err
	}
	if err := putFile(ctx, t.Objects, sample.SampleKey(prefix, a.Dataset), text); err != nil {
		return err
	}
	log.Info("sample drawn", zap.Int64("bytes", st.Bytes), zap.Int64("documents", st.Documents), zap.Int("files", st.Files),
		zap.Int64("held_out_bytes", st.HeldOutBytes), zap.Bool("short", st.Short), zap.String("revision", st.Revision))
	rep.Message(ctx, fmt.Sprintf("sampled %d bytes of %s from %d files", st.Bytes, a.Dataset, st.Files))
	return nil
}

// checkLocalRoots refuses a local dataset with a file outside roots, before
// any is read, as an ingest plan does.
func checkLocalRoots(ctx context.Context, roots []string, preset ingest.Preset, seed uint64) error {
	if preset.Glob == "" {
		return nil
	}
	listed, err := ingest.Plan(ctx, preset, nil, seed)
	if err != nil {
		return err
	}
	for _, f := range listed.Files {
		if err := ingest.CheckLocalPath(roots, f.Path); err != nil {
			return err
		}
	}
	return nil
}

func putFile(ctx context.Context, obj store.Store, key string, f *os.File) error {
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := obj.Put(ctx, key, f, size); err != nil {
		return fmt.Errorf("store %s: %w", key, err)
	}
	return nil
}

// queueTrainingWhenSampled queues the training once every dataset's sample
// is in object storage. Each sampling task checks after writing its own, so
// the last to finish sees them all; two finishing at once both queue the
// same task id, and the second is a duplicate.
func queueTrainingWhenSampled(ctx context.Context, t *Tokenizers, a scheduler.TokenizerSample, prefix string) error {
	for _, s := range a.Mixture {
		_, err := t.Objects.Stat(ctx, sample.SampleKey(prefix, s.Dataset))
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", a.Kind(), err)
		}
	}
	err := t.Enqueue(ctx, TokenizerTrainTask(a))
	var dup *scheduler.DuplicateError
	if err != nil && !errors.As(err, &dup) {
		return fmt.Errorf("%s: queue the training of tokenizer %s: %w", a.Kind(), a.Name, err)
	}
	return nil
}

// train trains on the samples, publishes tokenizers/<name>/
// tokenizer.json, and writes the report beside it.
func (t *Tokenizers) train(ctx context.Context, a scheduler.TokenizerTrain) error {
	const kind = scheduler.KindTokenizerTrain
	if err := catalog.CheckName(a.Name); err != nil {
		return permanent(kind, err)
	}
	if a.Sample == "" || len(a.Mixture) == 0 {
		return permanent(kind, &scheduler.PayloadError{Kind: kind, Msg: "no sample or mixture: enqueue it with 'sched enqueue tokenizer'"})
	}
	log := t.Log.With(zap.String("tokenizer", a.Name))
	cat := catalog.New(t.Objects, t.DataDir)
	done, err := alreadyTrained(ctx, cat, a)
	if err != nil || done {
		return err
	}
	tmp, err := t.mkdirTemp(trainTemp)
	if err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	defer t.removeTemp(tmp)
	var inputs []io.Reader
	for i, s := range a.Mixture {
		f, err := fetchFile(ctx, t.Objects, sample.SampleKey(a.Sample, s.Dataset), filepath.Join(tmp.Path, fmt.Sprintf("sample-%d.txt", i)))
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		defer f.Close()
		inputs = append(inputs, f)
	}
	rep := Progress(ctx)
	data, err := tokenizer.Train(ctx, inputs, tokenizer.TrainOptions{
		VocabSize: a.VocabSize, SpecialTokens: []string{sample.Separator}, Logger: log,
		Progress: func(stage string, done, total int64) {
			frac := -1.0
			if total > 0 {
				frac = float64(done) / float64(total)
			}
			rep.Report(ctx, frac, 0, "", fmt.Sprintf("tokenizer %s: %s %d/%d", a.Name, stage, done, total))
		},
	})
	if err != nil {
		return permanent(kind, err)
	}
	entry, err := cat.Publish(ctx, a.Name, data)
	if err != nil {
		return permanent(kind, err)
	}
	tok, err := tokenizer.Parse(data)
	if err != nil {
		return permanent(kind, err)
	}
	report, err := measure(ctx, t, cat, a, entry, tok, log)
	if err != nil {
		return fmt.Errorf("%s: report of tokenizer %s: %w", kind, a.Name, err)
	}
	// The task's last message is what `sched runs` keeps of it: a
	// tokenizer of fewer ids than asked says so there, not only in its
	// report.
	last := fmt.Sprintf("tokenizer %s: %d ids, sha256 %.12s", a.Name, entry.VocabSize, entry.SHA256)
	if a.VocabSize > entry.VocabSize {
		report.Asked = a.VocabSize
		short := tokenizer.Shortfall(entry.VocabSize, a.VocabSize, 0)
		last += "; " + short
		log.Warn("tokenizer trained with fewer ids than asked", zap.String("why", short))
	}
	if err := cat.PutReport(ctx, report); err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	log.Info("tokenizer trained", zap.Int("vocab", entry.VocabSize), zap.String("sha256", entry.SHA256))
	rep.Message(ctx, last)
	return nil
}

// alreadyTrained is true when a retried task finds its own work done. A
// tokenizer of that name trained on other text is refused before hours of
// training, not after.
func alreadyTrained(ctx context.Context, cat *catalog.Catalog, a scheduler.TokenizerTrain) (bool, error) {
	names, err := cat.Names(ctx)
	if err != nil {
		return false, err
	}
	found := false
	for _, n := range names {
		found = found || n == a.Name
	}
	if !found {
		return false, nil
	}
	r, ok, err := cat.GetReport(ctx, a.Name)
	switch {
	case err != nil:
		return false, err
	case ok && r.Sample == a.Sample:
		return true, nil
	case ok:
		return false, permanent(a.Kind(), &nameTakenError{name: a.Name, sha: r.SHA256, sample: r.Sample})
	}
	// Published without its report (a crash between the two): training
	// again gives the same bytes, which Publish accepts.
	return false, nil
}

func fetchFile(ctx context.Context, obj store.Store, key, dst string) (*os.File, error) {
	r, err := obj.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer r.Close()
	f, err := os.Create(dst)
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func measure(ctx context.Context, t *Tokenizers, cat *catalog.Catalog, a scheduler.TokenizerTrain, e catalog.Entry, tok *tokenizer.Tokenizer, log *zap.Logger) (catalog.Report, error) {
	var held []catalog.HeldOut
	for _, s := range a.Mixture {
		r, err := t.Objects.Get(ctx, sample.HeldOutKey(a.Sample, s.Dataset))
		if err != nil {
			return catalog.Report{}, fmt.Errorf("get held-out text of %s: %w", s.Dataset, err)
		}
		docs, err := sample.ReadHeldOut(r)
		r.Close()
		if err != nil {
			return catalog.Report{}, fmt.Errorf("held-out text of %s: %w", s.Dataset, err)
		}
		held = append(held, catalog.HeldOut{Source: s.Dataset, Docs: docs})
	}
	var prev *catalog.Entry
	var prevTok *tokenizer.Tokenizer
	if a.Previous != "" && a.Previous != a.Name {
		pe, pt, err := cat.Resolve(ctx, a.Previous)
		var nf *catalog.NotFoundError
		switch {
		case errors.As(err, &nf):
			log.Info("no previous tokenizer to compare with", zap.String("previous", a.Previous))
		case err != nil:
			return catalog.Report{}, err
		default:
			prev, prevTok = &pe, pt
		}
	}
	r, err := catalog.Measure(ctx, e, tok, prev, prevTok, held)
	r.Sample = a.Sample
	return r, err
}

// nameTakenError is a training under the name of a tokenizer trained on
// other text.
type nameTakenError struct{ name, sha, sample string }

func (e *nameTakenError) Error() string {
	return fmt.Sprintf("tokenizer %q already exists (sha256 %s, trained on %s): a published tokenizer is never replaced, because the stores and checkpoints made with it would change meaning; enqueue the new one under another name",
		e.name, e.sha, e.sample)
}
func (e *nameTakenError) BadInput() bool { return true }

// TokenizerSampleTasks are the sampling tasks of a new tokenizer: one per
// dataset of the mixture, each drawing its weight's part of total bytes.
func TokenizerSampleTasks(name string, mix []sample.Share, total int64, vocab int, seed uint64, previous string) []scheduler.TokenizerSample {
	m := make([]scheduler.TokenizerShare, len(mix))
	for i, s := range mix {
		m[i] = scheduler.TokenizerShare{Dataset: s.Dataset, Weight: s.Weight}
	}
	budgets := sample.Budgets(mix, total)
	out := make([]scheduler.TokenizerSample, len(mix))
	for i, s := range mix {
		out[i] = scheduler.TokenizerSample{Name: name, Dataset: s.Dataset, Bytes: budgets[i], Mixture: m, TotalBytes: total,
			Seed: seed, VocabSize: vocab, Previous: previous}
	}
	return out
}

// TokenizerTrainTask is the training task that the sampling tasks of the
// same arguments queue once every sample is drawn.
func TokenizerTrainTask(s scheduler.TokenizerSample) scheduler.TokenizerTrain {
	return scheduler.TokenizerTrain{Name: s.Name, VocabSize: s.VocabSize, Sample: sample.Prefix(s.Name, shares(s.Mixture), s.Seed, s.TotalBytes),
		Mixture: s.Mixture, Previous: s.Previous}
}
