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
//
// Version 2 adds shards that hold part of their input (Shard.Part). A
// reader of version 1 would take such a shard for its whole input, and an
// ingest of that build would never take the rest of it (or, its id being
// recorded twice once the rest is in, refuse the store as damaged); so a
// manifest is written as version 2 only while it records a part, and a
// store of whole inputs stays version 1, which every build reads.
const (
	Format  = "kiln.tokens"
	Version = 2
	// wholeVersion is the version of a manifest without parts.
	wholeVersion = 1
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

// Shard is one appended input, or one part of it, recorded in the
// manifest in append order.
type Shard struct {
	ID        string `json:"id"`
	Source    string `json:"source,omitempty"`
	Revision  string `json:"revision,omitempty"`
	SHA256    string `json:"sha256"` // of the shard's token bytes as stored in tokens.bin
	Documents int64  `json:"documents"`
	Tokens    int64  `json:"tokens"`
	Offset    int64  `json:"offset"` // first token's index in tokens.bin
	// Part is zero for a shard that holds its whole input, and otherwise
	// says which part of the input it holds (an append that reached a
	// limit took the input's leading documents, and a later one the rest).
	Part Part `json:"part,omitzero"`
}

// Part is a stretch of an input's records: From up to, not including, To,
// where To 0 is the input's end. A record is the input's own unit (ingest
// counts a file's rows or lines, those it left out included), so a part is
// named by where it lies in the input rather than by the documents read,
// which another reading of the input could give otherwise (a Software
// Heritage blob missing one time and present the next).
//
// The parts of one input are recorded under its id, in order, end to end
// from record 0: no record is in two of them, and none between them is
// missing. The input is whole in the store once its last part runs to
// its end (To 0).
type Part struct {
	From int64 `json:"from"`
	To   int64 `json:"to,omitempty"`
}

// IsZero reports whether p is no part: the whole input.
func (p Part) IsZero() bool { return p == Part{} }

func (p Part) String() string {
	if p.To == 0 {
		return fmt.Sprintf("from %d to the end", p.From)
	}
	return fmt.Sprintf("%d up to %d", p.From, p.To)
}

// Input is what a store holds of one input: nothing, all of it (Whole), or
// its leading part, whose records end at Next.
type Input struct {
	Shards            int // the shards that hold it: one, or one a part
	Documents, Tokens int64
	// Next is the record the rest of the input starts at (0 for one the
	// store holds none of).
	Next  int64
	Whole bool
}

// Partial reports whether the store holds part of the input and not the
// rest.
func (in Input) Partial() bool { return in.Shards > 0 && !in.Whole }

// Input says what m holds of the input id.
func (m *Manifest) Input(id string) Input {
	var in Input
	for _, s := range m.Shards {
		if s.ID != id {
			continue
		}
		in.Shards++
		in.Documents += s.Documents
		in.Tokens += s.Tokens
		in.Next, in.Whole = s.Part.To, s.Part.To == 0
	}
	return in
}

// Skipped is an input that ingest decided not to append, and why. With
// Count zero the whole input was left out; with Count set, ID names an
// input (appended or not) from which Count documents were left out for
// Reason, so that a store accounts for every document it did not take.
//
// From is the first record of the part of the input (Shard.Part.From)
// whose documents left out Count counts; each part of an input counts its
// own. With From set and Count zero, the input from record From on was
// left out: the rest of an input the store holds part of, which could not
// be read.
type Skipped struct {
	ID       string `json:"id"`
	Source   string `json:"source,omitempty"`
	Revision string `json:"revision,omitempty"`
	Reason   string `json:"reason"`
	Count    int64  `json:"count,omitempty"`
	From     int64  `json:"from,omitempty"`
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

// version is the version m is written as: 2 while it records a part of an
// input, which a reader of version 1 would misread, and 1 otherwise.
func (m *Manifest) version() int {
	for _, s := range m.Shards {
		if !s.Part.IsZero() {
			return Version
		}
	}
	return wholeVersion
}

// validate checks the manifest's own consistency: shards laid end to end
// from offset 0, summing to the committed count, each input recorded once,
// whole or in parts laid end to end from its first record.
func (m *Manifest) validate() error {
	if m.Format != Format {
		return fmt.Errorf("format is %q, want %q: this is not a kiln token store manifest", m.Format, Format)
	}
	if m.Version < wholeVersion || m.Version > Version {
		return fmt.Errorf("version %d is not supported (this build reads versions %d to %d): use the kiln release that wrote the store", m.Version, wholeVersion, Version)
	}
	if err := m.Tokenizer.validate(); err != nil {
		return err
	}
	if want := DtypeFor(m.Tokenizer.VocabSize); m.Dtype != want {
		return fmt.Errorf("dtype is %q but a vocabulary of %d is stored as %q", m.Dtype, m.Tokenizer.VocabSize, want)
	}
	var off, docs int64
	// next is, for each input seen, the record its next part must start
	// at; done once it is whole.
	next := make(map[string]int64, len(m.Shards))
	const done = -1
	for i, s := range m.Shards {
		at, seen := next[s.ID]
		switch {
		case s.ID == "":
			return fmt.Errorf("shard %d has an empty id", i)
		case seen && at == done && s.Part.IsZero():
			return fmt.Errorf("shard %q is recorded twice", s.ID)
		case seen && at == done:
			return fmt.Errorf("shard %q holds records %s of an input the store holds whole already", s.ID, s.Part)
		case s.Part.IsZero() && seen:
			return fmt.Errorf("shard %q is recorded whole after a part of it", s.ID)
		case !s.Part.IsZero() && s.Part.From != at:
			return fmt.Errorf("shard %q holds records %s, but the parts of it before end at record %d", s.ID, s.Part, at)
		case s.Part.To != 0 && s.Part.To <= s.Part.From:
			return fmt.Errorf("shard %q holds records %s: a part ends after it starts", s.ID, s.Part)
		case s.Offset != off:
			return fmt.Errorf("shard %q starts at token %d, but the shards before it end at %d", s.ID, s.Offset, off)
		case s.Tokens < 0 || s.Documents < 0:
			return fmt.Errorf("shard %q has a negative count", s.ID)
		}
		next[s.ID] = done
		if s.Part.To != 0 {
			next[s.ID] = s.Part.To
		}
		off += s.Tokens
		docs += s.Documents
	}
	if m.Version < m.version() {
		return fmt.Errorf("version %d records parts of inputs, which need version %d", m.Version, m.version())
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
			return nil, &InputError{err: &NoStoreError{Dir: dir, Err: err}}
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
		if m.Format != Format || m.Version < wholeVersion || m.Version > Version {
			damage = "" // another release's manifest, not a damaged one: that release reads it
		}
		return nil, damagedf(damage, "token store %s: %s is inconsistent: %v; restore it from a backup or re-ingest the store", dir, path, err)
	}
	return &m, nil
}

// NoStoreError is a token store whose directory holds no manifest: no
// ingest filled it on this machine, or its folder was not copied here from
// the machine that ingested it. ReadManifest returns it inside an
// InputError, so that a caller that knows what the store was opened for (a
// run's segment) can add what to do once it is there.
type NoStoreError struct {
	Dir string
	Err error // reading the manifest's, which wraps fs.ErrNotExist
	// Stored is the tokens the store's status in object storage records,
	// set by a caller that read it: the store was ingested on another
	// worker's disk, and an ingest here is the wrong way to get it.
	Stored int64
	// Appender names the worker that appends, whose disk holds the stores
	// ("host h, data directory d (pid n)"), and Here this worker ("host h,
	// data directory d"), set by a caller that found the two disks differ.
	Appender, Here string
}

// Error says where the store is and, as its last clause (the part a
// failure's one-line view keeps), what to do: an ingest here only where
// nothing says the store was ingested elsewhere.
func (e *NoStoreError) Error() string {
	if e.Stored <= 0 && e.Appender == "" {
		return fmt.Sprintf("token store %s has no %s: ingest into it first (sched enqueue ingest), or, on a worker that took over a run, copy the store's folder from the machine that ingested it",
			e.Dir, ManifestFile)
	}
	here := "this worker's disk"
	if e.Here != "" {
		here += " (" + e.Here + ")"
	}
	there := "another worker's disk"
	if e.Appender != "" {
		there = "the disk of the worker that appends (" + e.Appender + ")"
	}
	held := "the stores are on " + there
	if e.Stored > 0 {
		held = fmt.Sprintf("its status in object storage says it holds %d tokens, ingested on %s", e.Stored, there)
	}
	return fmt.Sprintf("token store %s is not on %s, which has no %s for it: %s; train on a GPU worker of that disk, or copy the store's folder here",
		e.Dir, here, ManifestFile, held)
}

func (e *NoStoreError) Unwrap() error { return e.Err }

// writeManifest replaces dir's manifest atomically: a reader, or a process
// started after a crash, sees either the old manifest or the new one.
func writeManifest(dir string, m *Manifest) error {
	m.Version = m.version()
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
