// Package sample draws raw text from datasets for training a tokenizer: a
// byte budget per dataset in proportion to its weight in the mixture, taken
// from files chosen by a seed and spread across the dataset (a tokenizer
// trained on the first files of the-stack-v2 would learn one language), with
// a held-out slice kept apart to measure the tokenizer on. Files are listed,
// downloaded and decoded by ingest's hub client and sources, exactly as an
// ingest reads them.
package sample

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
)

// Separator follows every document of a sample. It is the tokenizer's
// end-of-text special token, which training never splits or learns from,
// so no merge spans two documents.
const Separator = "<|endoftext|>"

// Options configure Draw. Zero values take the defaults noted.
type Options struct {
	// Preset is the dataset (ingest.LookupPreset's result).
	Preset ingest.Preset
	// Hub lists and downloads a hub dataset; nil for a local one.
	Hub *hub.Client
	// SWH fetches blob contents for presets that ship blob ids only.
	SWH *ingest.SWH
	// Bytes is the sample's size in bytes of document text (required).
	Bytes int64
	// HeldOutBytes is the size of the held-out text; documents for it are
	// chosen by a hash of their id, so they never enter the sample.
	// Default Bytes/50 (at least Bytes/5 up to 1 MiB, at most 8 MiB).
	HeldOutBytes int64
	// Seed chooses the files and the held-out documents.
	Seed uint64
	// Spread is the least number of files the budget is spread over when
	// the dataset has that many (default 16): no one file gives more than
	// its share, so one language or one crawl cannot fill the sample.
	Spread int
	// TempDir holds downloads while they are read (required for hub datasets).
	TempDir string
	// Logger receives the sample's warnings. Its lines name no dataset:
	// the caller's logger does (the worker's names its task's), and a
	// second "dataset" key in a JSON line is one some readers refuse.
	Logger *zap.Logger
}

func (o Options) withDefaults() Options {
	if o.HeldOutBytes == 0 {
		// A fiftieth of a large sample (8 MiB at most) measures bytes per
		// token to three digits; a small sample holds out up to a fifth,
		// so that its report has text to measure at all.
		o.HeldOutBytes = min(max(o.Bytes/50, min(o.Bytes/5, 1<<20)), 8<<20)
	}
	if o.Spread <= 0 {
		o.Spread = 16
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Stats is what a Draw read.
type Stats struct {
	Revision string `json:"revision"`
	// Files were read (some only in part); Listed is the dataset's file count.
	Files  int `json:"files"`
	Listed int `json:"listed"`
	// Documents and Bytes went to the sample (the last document may be cut
	// to fit the budget); HeldOut* to the held-out text.
	Documents        int64 `json:"documents"`
	Bytes            int64 `json:"bytes"`
	HeldOutDocuments int64 `json:"held_out_documents"`
	HeldOutBytes     int64 `json:"held_out_bytes"`
	// Skipped counts documents and files left out, by reason.
	Skipped ingest.Skips `json:"skipped,omitempty"`
	// Short is set when the dataset ran out before the budget.
	Short bool `json:"short,omitempty"`
}

// Draw writes up to opt.Bytes of document text to sample, each document
// followed by Separator, and the held-out documents to heldOut as JSON
// lines ({"text": ...}). Files are read in the seeded order of ingest.Plan;
// each gives at most an even share of what is still missing, so the sample
// spans at least opt.Spread files. The same seed draws the same sample.
func Draw(ctx context.Context, opt Options, sample, heldOut io.Writer) (Stats, error) {
	opt = opt.withDefaults()
	st := Stats{Skipped: ingest.Skips{}}
	if opt.Bytes <= 0 {
		return st, fmt.Errorf("sample of %s: the byte budget is %d; give a positive size", opt.Preset.Name, opt.Bytes)
	}
	plan, err := ingest.Plan(ctx, opt.Preset, opt.Hub, opt.Seed)
	if err != nil {
		return st, err
	}
	st.Revision, st.Listed = plan.Revision, len(plan.Files)
	w := &writer{opt: opt, st: &st, sample: bufio.NewWriterSize(sample, 1<<20), held: bufio.NewWriterSize(heldOut, 1<<20)}
	// Of the documents, this fraction (by hash) is held out until the
	// held-out budget is met; the rest are sampled.
	w.heldFrac = float64(opt.HeldOutBytes) / float64(opt.Bytes+opt.HeldOutBytes)
	for i, f := range plan.Files {
		if st.Bytes >= opt.Bytes {
			break
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		// What is missing is shared evenly by the files still to be read
		// of the Spread (all the rest once Spread files gave their share),
		// so a short file's shortfall moves on to the next ones.
		left := int64(len(plan.Files) - i)
		w.fileCap = ceilDiv(opt.Bytes-st.Bytes, max(1, min(left, int64(opt.Spread-st.Files))))
		err := w.readFile(ctx, plan.Revision, f)
		if moved := revisionGone(opt.Preset, err); moved != nil {
			return st, moved
		}
		if reason := ingest.SkipReason(err); reason != "" {
			opt.Logger.Warn("sample: file skipped", zap.String("file", f.Path), zap.String("reason", reason), zap.Error(err))
			st.Skipped.Add(reason, 1)
			continue
		}
		if err != nil {
			return st, err
		}
		st.Files++
	}
	if err := w.sample.Flush(); err != nil {
		return st, fmt.Errorf("sample of %s: write: %w", opt.Preset.Name, err)
	}
	if err := w.held.Flush(); err != nil {
		return st, fmt.Errorf("sample of %s: write held-out text: %w", opt.Preset.Name, err)
	}
	st.Short = st.Bytes < opt.Bytes
	if st.Short {
		opt.Logger.Warn("sample: the dataset ran out before the budget", zap.Int64("bytes", st.Bytes), zap.Int64("budget", opt.Bytes), zap.Int("files", st.Files))
	}
	return st, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// RevisionGoneError is a commit of a hub dataset that a sample was planned
// at and a force-push replaced before the sample read its files (404
// RevisionNotFound at a download). Where the preset's revision names that
// commit, the user changes it (BadInput); where it names a branch, the
// sample drawn again is planned at the branch's new commit, so the error
// is the task's to try again.
type RevisionGoneError struct {
	Dataset string // the preset's name
	Pinned  bool   // the preset's revision names the commit
	Err     *hub.RevisionNotFoundError
}

func (e *RevisionGoneError) Error() string {
	if e.Pinned {
		return fmt.Sprintf("sample of %s: commit %s of dataset %s, which the preset's revision names, is gone from the hub (RevisionNotFound: a force-push replaced it): set the preset's revision to a commit the dataset has, or to a branch, then run sched enqueue tokenizer again",
			e.Dataset, e.Err.Commit, e.Err.Repo)
	}
	return fmt.Sprintf("sample of %s: commit %s of dataset %s, which the sample was planned at, is gone from the hub (RevisionNotFound: a force-push replaced it): the sample is drawn again, at the commit the preset's revision names now",
		e.Dataset, e.Err.Commit, e.Err.Repo)
}

func (e *RevisionGoneError) Unwrap() error  { return e.Err }
func (e *RevisionGoneError) BadInput() bool { return e.Pinned }

// revisionGone is err as a RevisionGoneError where it is the Hub's
// RevisionNotFound to a download at the commit the sample was planned at;
// nil otherwise.
func revisionGone(p ingest.Preset, err error) error {
	var gone *hub.RevisionNotFoundError
	if !errors.As(err, &gone) || gone.Commit == "" {
		return nil
	}
	return &RevisionGoneError{Dataset: p.Name, Pinned: ingest.NamesCommit(p.Revision, gone.Commit), Err: gone}
}

type writer struct {
	opt          Options
	st           *Stats
	sample, held *bufio.Writer
	heldFrac     float64
	fileCap      int64
}

// errFileDone ends one file's reading once it gave its share.
var errFileDone = errors.New("file share taken")

func (w *writer) readFile(ctx context.Context, rev string, f hub.File) error {
	local := f.Path
	if w.opt.Preset.Repo != "" {
		if w.opt.Hub == nil {
			return fmt.Errorf("dataset %s is on the hub (%s) but no hub client was given", w.opt.Preset.Name, w.opt.Preset.Repo)
		}
		dst, err := ingest.SafeJoin(filepath.Join(w.opt.TempDir, "raw"), f.Path)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := w.opt.Hub.Download(ctx, w.opt.Preset.Repo, rev, f, dst); err != nil {
			return err
		}
		defer os.Remove(dst)
		local = dst
	}
	src, err := ingest.Open(ctx, local, ingest.OpenOptions{Name: f.Path, Columns: w.opt.Preset.Columns, SWH: w.opt.SWH})
	if err != nil {
		return err
	}
	defer src.Close()
	var took int64
	err = ingest.Drain(ctx, src, func(d ingest.Document) error {
		// Held out: the documents the seeded hash picks, until the budget
		// is met; and the second document read if the hash picked neither
		// of the first two, so that a small sample's report has text to
		// measure (with 30 documents and a sixth held out, the hash alone
		// picks none about one time in 240).
		if w.st.HeldOutBytes < w.opt.HeldOutBytes && (w.heldOut(d.ID) || w.st.HeldOutDocuments == 0 && w.st.Documents == 1) {
			return w.writeHeld(d.Text)
		}
		text := d.Text
		if over := w.st.Bytes + int64(len(text)) - w.opt.Bytes; over > 0 {
			text = cutUTF8(text, len(text)-int(over))
		}
		if _, err := w.sample.WriteString(text); err != nil {
			return fmt.Errorf("sample of %s: write: %w", w.opt.Preset.Name, err)
		}
		if _, err := w.sample.WriteString(Separator); err != nil {
			return fmt.Errorf("sample of %s: write: %w", w.opt.Preset.Name, err)
		}
		w.st.Documents++
		w.st.Bytes += int64(len(text))
		took += int64(len(text))
		if took >= w.fileCap || w.st.Bytes >= w.opt.Bytes {
			return errFileDone
		}
		return nil
	})
	w.st.Skipped.Merge(src.Skipped())
	if errors.Is(err, errFileDone) {
		return nil
	}
	return err
}

// heldOut decides by a seeded hash of the document's id, so the same
// documents are held out on every run and on every worker.
func (w *writer) heldOut(id string) bool {
	h := fnv.New64a()
	h.Write([]byte(strconv.FormatUint(w.opt.Seed, 10) + "\x00held\x00" + id))
	return float64(mix64(h.Sum64())>>11)/float64(1<<53) < w.heldFrac
}

type heldLine struct {
	Text string `json:"text"`
}

func (w *writer) writeHeld(text string) error {
	b, err := json.Marshal(heldLine{text})
	if err != nil {
		return err
	}
	if _, err := w.held.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("sample of %s: write held-out text: %w", w.opt.Preset.Name, err)
	}
	w.st.HeldOutDocuments++
	w.st.HeldOutBytes += int64(len(text))
	return nil
}

// cutUTF8 returns s's first n bytes, less a trailing partial character.
func cutUTF8(s string, n int) string {
	s = s[:n]
	for len(s) > 0 {
		if r, size := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// ReadHeldOut reads the held-out documents Draw wrote.
func ReadHeldOut(r io.Reader) ([]string, error) {
	var out []string
	dec := json.NewDecoder(r)
	for {
		var l heldLine
		err := dec.Decode(&l)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("held-out text, document %d: %w", len(out)+1, err)
		}
		out = append(out, l.Text)
	}
}

// mix64 is splitmix64's finalizer. FNV-1a alone leaves the top bits of ids
// that differ only at the end ("file#17", "file#18") nearly equal, which
// held out no document of a JSON lines file at all; the finalizer spreads
// every input bit over every output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
