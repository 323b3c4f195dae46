package tokens

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// File names inside a store directory.
const (
	ManifestFile = "manifest.json"
	TokensFile   = "tokens.bin"
	lockFile     = "lock"
	manifestTemp = "manifest.json.tmp"
)

// IsStoreFile reports whether name is one of the files a store directory
// holds, its manifest's temporary copy and lock included.
func IsStoreFile(name string) bool {
	switch name {
	case ManifestFile, TokensFile, lockFile, manifestTemp:
		return true
	}
	return false
}

// Format identifies a manifest; Version is bumped on any change a reader of
// the previous version would misread.
const (
	Format  = "kiln.tokens"
	Version = 1
)

// Dtype names the on-disk width of one id.
type Dtype string

const (
	Uint16 Dtype = "uint16"
	Uint32 Dtype = "uint32"
)

// DtypeFor returns the narrowest dtype that holds every id below vocab:
// uint16 halves the file (50e9 tokens: 100 GB instead of 200 GB).
func DtypeFor(vocab int) Dtype {
	if vocab <= 1<<16 {
		return Uint16
	}
	return Uint32
}

// Width is the size of one id in bytes, or 0 for an unknown dtype.
func (d Dtype) Width() int {
	switch d {
	case Uint16:
		return 2
	case Uint32:
		return 4
	}
	return 0
}

// Tokenizer identifies the tokenizer every id in a store came from. Two
// tokenizers with one vocabulary size still assign different ids, so a store
// is tied to the SHA-256 of the tokenizer.json that wrote it.
type Tokenizer struct {
	Name      string `json:"name"`
	SHA256    string `json:"sha256"`
	VocabSize int    `json:"vocab_size"`
	EOS       uint32 `json:"eos_id"`
}

// CheckWrittenWith refuses to add tok's ids to store, whose ids were
// written with tokenizer have: the same id would mean different text in
// one store. A zero have (a store not yet written) takes any tokenizer.
func CheckWrittenWith(store string, have, tok Tokenizer) error {
	if have.SHA256 == "" || have.SHA256 == tok.SHA256 {
		return nil
	}
	return inputErrorf("token store %s was written with tokenizer %s (sha256 %s), not %s (sha256 %s): its ids would mean different text; ingest into a new store, or with tokenizer %s",
		store, have.Name, have.SHA256, tok.Name, tok.SHA256, have.Name)
}

func (t Tokenizer) validate() error {
	switch {
	case t.SHA256 == "":
		return errors.New("tokenizer sha256 is empty: pass the SHA-256 of the tokenizer.json that produced the ids")
	case t.VocabSize <= 0:
		return fmt.Errorf("tokenizer vocab_size must be positive, got %d", t.VocabSize)
	case t.VocabSize > 1<<32-1:
		return fmt.Errorf("tokenizer vocab_size %d does not fit a uint32 id", t.VocabSize)
	case int64(t.EOS) >= int64(t.VocabSize):
		return fmt.Errorf("tokenizer eos_id %d is outside the vocabulary of %d", t.EOS, t.VocabSize)
	}
	return nil
}

// Shard is one appended input, recorded in the manifest in append order.
type Shard struct {
	ID        string `json:"id"`
	Source    string `json:"source,omitempty"`
	Revision  string `json:"revision,omitempty"`
	SHA256    string `json:"sha256"` // of the shard's token bytes as stored in tokens.bin
	Documents int64  `json:"documents"`
	Tokens    int64  `json:"tokens"`
	Offset    int64  `json:"offset"` // first token's index in tokens.bin
}

// Skipped is an input that ingest decided not to append, and why. With
// Count zero the whole input was left out; with Count set, ID names an
// input (appended or not) from which Count documents were left out for
// Reason, so that a store accounts for every document it did not take.
type Skipped struct {
	ID       string `json:"id"`
	Source   string `json:"source,omitempty"`
	Revision string `json:"revision,omitempty"`
	Reason   string `json:"reason"`
	Count    int64  `json:"count,omitempty"`
}

// Manifest describes a store. Only the first Tokens ids of tokens.bin are
// committed; anything past them is the remains of an interrupted append.
type Manifest struct {
	Format    string    `json:"format"`
	Version   int       `json:"version"`
	Dtype     Dtype     `json:"dtype"`
	Tokenizer Tokenizer `json:"tokenizer"`
	Tokens    int64     `json:"tokens"`
	Documents int64     `json:"documents"`
	Shards    []Shard   `json:"shards"`
	Skipped   []Skipped `json:"skipped"`
}

func newManifest(tok Tokenizer) *Manifest {
	return &Manifest{
		Format: Format, Version: Version, Dtype: DtypeFor(tok.VocabSize),
		Tokenizer: tok, Shards: []Shard{}, Skipped: []Skipped{},
	}
}

// validate checks the manifest's own consistency: shards laid end to end
// from offset 0, summing to the committed count, each id recorded once.
func (m *Manifest) validate() error {
	if m.Format != Format {
		return fmt.Errorf("format is %q, want %q: this is not a kiln token store manifest", m.Format, Format)
	}
	if m.Version != Version {
		return fmt.Errorf("version %d is not supported (this build reads version %d): use the kiln release that wrote the store", m.Version, Version)
	}
	if err := m.Tokenizer.validate(); err != nil {
		return err
	}
	if want := DtypeFor(m.Tokenizer.VocabSize); m.Dtype != want {
		return fmt.Errorf("dtype is %q but a vocabulary of %d is stored as %q", m.Dtype, m.Tokenizer.VocabSize, want)
	}
	var off, docs int64
	seen := make(map[string]bool, len(m.Shards))
	for i, s := range m.Shards {
		switch {
		case s.ID == "":
			return fmt.Errorf("shard %d has an empty id", i)
		case seen[s.ID]:
			return fmt.Errorf("shard %q is recorded twice", s.ID)
		case s.Offset != off:
			return fmt.Errorf("shard %q starts at token %d, but the shards before it end at %d", s.ID, s.Offset, off)
		case s.Tokens < 0 || s.Documents < 0:
			return fmt.Errorf("shard %q has a negative count", s.ID)
		}
		seen[s.ID] = true
		off += s.Tokens
		docs += s.Documents
	}
	if off != m.Tokens {
		return fmt.Errorf("shards hold %d tokens but %d are committed", off, m.Tokens)
	}
	if docs != m.Documents {
		return fmt.Errorf("shards hold %d documents but the manifest counts %d", docs, m.Documents)
	}
	return nil
}

// ReadManifest reads and validates dir's manifest. A missing manifest wraps
// fs.ErrNotExist.
func ReadManifest(dir string) (*Manifest, error) {
	path := filepath.Join(dir, ManifestFile)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, inputErrorf("token store %s has no %s: ingest into it first (sched enqueue ingest), or, on a worker that took over a run, copy the store's folder from the machine that ingested it: %w", dir, ManifestFile, err)
		}
		if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EISDIR) {
			return nil, inputErrorf("token store %s is not a token store's directory (%v): name a directory that an ingest filled, which holds %s and %s", dir, err, ManifestFile, TokensFile)
		}
		return nil, fmt.Errorf("token store %s: read manifest: %w", dir, err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, damagedf(ManifestFile+" does not parse", "token store %s: %s is corrupt (%v): it is only ever replaced by rename, so it was damaged outside kiln; restore it from a backup or re-ingest the store", dir, path, err)
	}
	if err := m.validate(); err != nil {
		damage := ManifestFile + " is inconsistent"
		if m.Format != Format || m.Version != Version {
			damage = "" // another release's manifest, not a damaged one: that release reads it
		}
		return nil, damagedf(damage, "token store %s: %s is inconsistent: %v; restore it from a backup or re-ingest the store", dir, path, err)
	}
	return &m, nil
}

// writeManifest replaces dir's manifest atomically: a reader, or a process
// started after a crash, sees either the old manifest or the new one.
func writeManifest(dir string, m *Manifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	tmp := filepath.Join(dir, manifestTemp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("write manifest %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync manifest %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close manifest %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ManifestFile)); err != nil {
		return fmt.Errorf("rename manifest into place: %w", err)
	}
	// The rename is durable only once the directory entry is on disk.
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// InputError marks an error caused by the caller's input or data (a
// corrupt manifest, a foreign tokenizer, an id past the vocabulary), as
// opposed to a failure of the machine. The CLI exits 2 on it.
type InputError struct {
	err error
	// Damage is set when the store's own files are damaged: a short phrase
	// ("tokens.bin is truncated") for a listing that shows each store on
	// one line, where Error is the whole story.
	Damage string
}

func (e *InputError) Error() string  { return e.err.Error() }
func (e *InputError) Unwrap() error  { return e.err }
func (e *InputError) BadInput() bool { return true }

func inputErrorf(format string, args ...any) error {
	return &InputError{err: fmt.Errorf(format, args...)}
}

// damagedf is inputErrorf for a store whose files are damaged, damage
// saying how in a few words ("" for an input error that is no damage).
func damagedf(damage, format string, args ...any) error {
	return &InputError{err: fmt.Errorf(format, args...), Damage: damage}
}
