package ingest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/kiln-lm/kiln/tokens"
)

// A store fills up to its limit: the append whose shard would pass it
// takes the shard's leading whole documents that fit, and records in the
// manifest which of the file's records they came from (tokens.Part). A
// later ingest under a larger limit reads the file from the record after
// them. Records, not documents, name the place, because the documents of
// a file are not always the same twice: a Software Heritage blob missing
// one time may be there the next. Records are the file's rows or lines,
// which are fixed by its bytes (a hub file is read at its recorded
// commit and SHA-256, a local one is named by its content), so a file's
// rest is the same whatever happened to the documents before it, and its
// blobs already in the store are not fetched again.

// Layout places a shard's documents in its file, for an append that takes
// part of them: the documents are the file's records from From on, in
// order, less those Skips leaves out. The shard ends each document with
// the EOS id; EOSInside names the documents whose own text holds the EOS
// id too (a file that quotes the end-of-text token), so that a document's
// end is not taken for the end of the EOS ids' count.
type Layout struct {
	From int64 `json:"from,omitempty"`
	// To, when set, is the record after the shard's last document: the
	// shard stops short of the file's end (it was made for a store with
	// little room left), and the records from To on are not in it.
	To        int64       `json:"to,omitempty"`
	Skips     []SkipRun   `json:"skips,omitempty"`
	EOSInside []EOSInside `json:"eos_inside,omitempty"`
}

// SkipRun is N consecutive records of a file, from record At, left out
// for one reason.
type SkipRun struct {
	At     int64  `json:"at"`
	N      int64  `json:"n"`
	Reason string `json:"reason"`
}

// EOSInside is a document of a shard (its index there) whose ids hold N
// EOS ids before the one that ends it.
type EOSInside struct {
	Doc int64 `json:"doc"`
	N   int64 `json:"n"`
}

// skipLog records where a source left records out, as runs.
type skipLog []SkipRun

func (l *skipLog) add(at int64, reason string) {
	if n := len(*l); n > 0 {
		if last := &(*l)[n-1]; last.Reason == reason && last.At+last.N == at {
			last.N++
			return
		}
	}
	*l = append(*l, SkipRun{At: at, N: 1, Reason: reason})
}

// merge adds runs that come after l's.
func (l *skipLog) merge(runs []SkipRun) {
	for _, r := range runs {
		if n := len(*l); n > 0 {
			if last := &(*l)[n-1]; last.Reason == r.Reason && last.At+last.N == r.At {
				last.N += r.N
				continue
			}
		}
		*l = append(*l, r)
	}
}

// placed is a Source that knows which of its file's records it left out:
// the shard of such a source can be taken in part.
type placed interface {
	SkippedAt() []SkipRun
}

// endAfter ends the layout at the record after its document docs-1, the
// shard's last: the records left out after it are the next shard's.
func (l *Layout) endAfter(docs int64) {
	l.To = l.recordOf(docs-1) + 1
	runs := l.Skips[:0]
	for _, r := range l.Skips {
		if r.At < l.To {
			runs = append(runs, r)
		}
	}
	l.Skips = runs
}

// check refuses a layout that does not describe a shard of docs documents.
func (l *Layout) check(docs int64) error {
	if l.From < 0 || l.To != 0 && l.To <= l.From {
		return fmt.Errorf("it holds records %d up to %d", l.From, l.To)
	}
	at := l.From
	for _, r := range l.Skips {
		if r.At < at || r.N <= 0 || r.Reason == "" || l.To != 0 && r.At+r.N > l.To {
			return fmt.Errorf("its records left out (%d from %d for %q) are out of order, or none", r.N, r.At, r.Reason)
		}
		at = r.At + r.N
	}
	if l.To != 0 && docs > 0 && l.recordOf(docs-1) >= l.To {
		return fmt.Errorf("its %d documents run past its end at record %d", docs, l.To)
	}
	doc := int64(-1)
	for _, e := range l.EOSInside {
		if e.Doc <= doc || e.Doc >= docs || e.N <= 0 {
			return fmt.Errorf("its documents holding EOS (%d in document %d of %d) are out of order, or none", e.N, e.Doc, docs)
		}
		doc = e.Doc
	}
	return nil
}

// recordOf is the file's record that the shard's document doc (counted
// from 0) came from.
func (l *Layout) recordOf(doc int64) int64 {
	at := l.From
	for _, r := range l.Skips {
		before := r.At - at // documents between the last run and this one
		if doc < before {
			return at + doc
		}
		doc -= before
		at = r.At + r.N
	}
	return at + doc
}

// docsBefore is how many of the shard's documents came from the file's
// records before record rec.
func (l *Layout) docsBefore(rec int64) int64 {
	if rec <= l.From {
		return 0
	}
	n := rec - l.From
	for _, r := range l.Skips {
		if r.At >= rec {
			break
		}
		n -= min(r.At+r.N, rec) - r.At
	}
	return n
}

// skipsIn counts the records left out from record from up to, not
// including, to (0: to the file's end), by reason.
func (l *Layout) skipsIn(from, to int64) Skips {
	out := Skips{}
	if to == 0 {
		to = math.MaxInt64
	}
	for _, r := range l.Skips {
		lo, hi := max(r.At, from), min(r.At+r.N, to)
		if lo < hi {
			out.Add(r.Reason, hi-lo)
		}
	}
	return out
}

// eosIn is how many EOS ids the shard's document doc holds, the one that
// ends it included; i is where to look in l.EOSInside, moved on.
func (l *Layout) eosIn(doc int64, i *int) int64 {
	for *i < len(l.EOSInside) && l.EOSInside[*i].Doc < doc {
		*i++
	}
	if *i < len(l.EOSInside) && l.EOSInside[*i].Doc == doc {
		return 1 + l.EOSInside[*i].N
	}
	return 1
}

// shardCut is what an append takes of a shard: its documents from Lead
// on, Docs of them, which are its ids from Start up to End.
type shardCut struct {
	Lead, Docs int64
	Start, End int64
	// Next is the tokens of the first document after them; 0 when there
	// is none.
	Next int64
}

// findCut reads a shard, whose layout is l, and finds the documents an
// append takes: those after the first lead, as many whole ones as fit in
// room tokens. It reads the shard to its end, checking that the shard
// hashes to sum (a *tokens.HashError where it does not) and holds docs
// documents, so that a cut is never made in a shard other than the one
// the layout describes.
func findCut(r io.Reader, dtype tokens.Dtype, eos uint32, l *Layout, docs, lead, room int64, sum shardSum) (shardCut, error) {
	c := shardCut{Lead: lead}
	width := dtype.Width()
	h := sha256.New()
	tr := io.TeeReader(r, h)
	buf := make([]byte, 1<<20)
	var pos, doc, seen int64
	at := 0
	need := l.eosIn(0, &at)
	full := false // a document did not fit: the cut is made
	have := 0
	for {
		n, err := io.ReadFull(tr, buf[have:])
		have += n
		whole := have - have%width
		for i := 0; i < whole; i += width {
			pos++
			var v uint32
			if width == 2 {
				v = uint32(binary.LittleEndian.Uint16(buf[i:]))
			} else {
				v = binary.LittleEndian.Uint32(buf[i:])
			}
			if v != eos {
				continue
			}
			if seen++; seen < need {
				continue
			}
			// Document doc ends at pos.
			switch {
			case doc < lead:
				c.Start, c.End = pos, pos
			case full:
			case pos-c.Start <= room:
				c.End = pos
				c.Docs++
			default:
				full = true
				c.Next = pos - c.End
			}
			doc++
			seen = 0
			need = l.eosIn(doc, &at)
		}
		have = copy(buf, buf[whole:have])
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return c, err
		}
	}
	if have != 0 {
		return c, errors.New("it ends inside an id")
	}
	// Bytes changed on their way may make any of the checks after this
	// fail: the hash says first whether they are the shard that was made.
	if err := sum.check(h); err != nil {
		return c, err
	}
	switch {
	case seen != 0:
		return c, errors.New("its last document does not end with EOS")
	case doc != docs:
		return c, fmt.Errorf("it holds %d documents by its layout, not the %d its shard task counted", doc, docs)
	}
	return c, nil
}

// cutReader is the ids of a shard from Start to End, read from r, which
// holds the whole shard: it reads r to its end and fails, where it would
// say EOF, unless all of r hashes to sum (a *tokens.HashError), so that an
// append of the ids it gives commits nothing of a shard other than the
// one cut.
type cutReader struct {
	r        io.Reader
	h        hash.Hash
	pos, end int64 // bytes
	sum      shardSum
	done     bool
}

func newCutReader(r io.Reader, width int, c shardCut, sum shardSum) (*cutReader, error) {
	h := sha256.New()
	cr := &cutReader{r: io.TeeReader(r, h), h: h, end: c.End * int64(width), sum: sum}
	if _, err := io.CopyN(io.Discard, cr.r, c.Start*int64(width)); err != nil {
		return nil, fmt.Errorf("reading to the shard's part: %w", err)
	}
	cr.pos = c.Start * int64(width)
	return cr, nil
}

func (c *cutReader) Read(b []byte) (int, error) {
	if c.pos < c.end {
		n, err := c.r.Read(b[:min(int64(len(b)), c.end-c.pos)])
		c.pos += int64(n)
		if errors.Is(err, io.EOF) && c.pos < c.end {
			return n, io.ErrUnexpectedEOF
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return n, err
		}
		return n, nil
	}
	if !c.done {
		if _, err := io.Copy(io.Discard, c.r); err != nil {
			return 0, err
		}
		c.done = true
	}
	if err := c.sum.check(c.h); err != nil {
		return 0, err
	}
	return 0, io.EOF
}

// refusal is err, what the append of the ids c gave returned, unless the
// append refused them (a *tokens.InputError: an id outside the
// vocabulary) and the shard's bytes are not the ones it was made with:
// bytes changed on their way may fail the append's checks before the hash
// is known, so the rest of the shard is read, and where it hashes to
// another SHA-256 that HashError, which a read again mends, is returned
// instead of bad input.
func (c *cutReader) refusal(err error) error {
	if !errors.As(err, new(*tokens.InputError)) {
		return err
	}
	if _, rerr := io.Copy(io.Discard, c); rerr != nil {
		return rerr
	}
	return err
}

// shardSum is the SHA-256 a shard was made with (want), and the shard and
// store (dir) that a HashError of bytes hashing to another names.
type shardSum struct{ dir, id, want string }

// check is the HashError of a shard whose bytes h hashed, unless they
// hash to s.want.
func (s shardSum) check(h hash.Hash) error {
	if got := hex.EncodeToString(h.Sum(nil)); got != s.want {
		return &tokens.HashError{Dir: s.dir, ShardID: s.id, Got: got, Want: s.want}
	}
	return nil
}

// cutData is the ids of an in-memory shard from Start to End.
func cutData(data []byte, width int, c shardCut) []byte {
	return data[c.Start*int64(width) : c.End*int64(width)]
}

// room is how many more tokens a store of tokens committed ids of width
// bytes takes under l: no more than math.MaxInt64 when l has no limit.
func (l Limits) room(committed int64, width int) int64 {
	room := int64(math.MaxInt64)
	if l.MaxTokens > 0 {
		room = min(room, l.MaxTokens-committed)
	}
	if l.MaxDisk > 0 {
		room = min(room, l.MaxDisk/int64(width)-committed)
	}
	return max(room, 0)
}

// passed are the limits of l that next more tokens, after committed,
// would pass.
func (l Limits) passed(committed, next int64, width int) Limits {
	var out Limits
	if l.MaxTokens > 0 && committed+next > l.MaxTokens {
		out.MaxTokens = l.MaxTokens
	}
	if l.MaxDisk > 0 && (committed+next)*int64(width) > l.MaxDisk {
		out.MaxDisk = l.MaxDisk
	}
	return out
}

// limitsText names limits as their flags: "--max-tokens 300000". (Not a
// String method: the jobs embed Limits, and would print as their limits.)
func limitsText(l Limits) string {
	var out []string
	if l.MaxTokens > 0 {
		out = append(out, fmt.Sprintf("--max-tokens %d", l.MaxTokens))
	}
	if l.MaxDisk > 0 {
		out = append(out, fmt.Sprintf("--max-disk %d", l.MaxDisk))
	}
	return strings.Join(out, " and ")
}

// PartialFile is a file a store holds part of: an append took its leading
// documents and reached a limit.
type PartialFile struct {
	ID string `json:"id"`
	// Next is the file's record its rest starts at.
	Next      int64 `json:"next"`
	Documents int64 `json:"documents"`
	Tokens    int64 `json:"tokens"`
}

// SkipHeld reports whether a store that records s holds its file as done:
// a file left out whole for what its bytes are (corrupt, empty, too large,
// not UTF-8), which an ingest again passes over. A file left out for the
// column or field the ingest read (missing-column; empty-file whose
// documents had no text there, empty-document) is read again by the next
// ingest: one with the right --columns takes it, where it found its store
// full of files recorded as skipped and took none.
func SkipHeld(s tokens.Skipped) bool {
	reason, why, _ := strings.Cut(s.Reason, ":")
	forColumn := reason == SkipMissingColumn || reason == SkipEmptyFile && strings.Contains(why, SkipEmptyDocument+"=")
	return s.Count == 0 && !forColumn
}

// storeFiles are the ids of the files m holds whole (appended, or
// recorded as skipped whole, SkipHeld), and those it holds part of, each
// sorted.
func storeFiles(m tokens.Manifest) (done []string, partial []PartialFile) {
	done = make([]string, 0, len(m.Shards)+len(m.Skipped))
	parts := map[string]*PartialFile{}
	for _, s := range m.Shards {
		if s.Part.IsZero() {
			done = append(done, s.ID)
			continue
		}
		pf := parts[s.ID]
		if pf == nil {
			pf = &PartialFile{ID: s.ID}
			parts[s.ID] = pf
		}
		pf.Documents += s.Documents
		pf.Tokens += s.Tokens
		pf.Next = s.Part.To
	}
	for _, pf := range parts {
		if pf.Next == 0 {
			done = append(done, pf.ID)
		} else {
			partial = append(partial, *pf)
		}
	}
	for _, s := range m.Skipped {
		if SkipHeld(s) {
			done = append(done, s.ID)
		}
	}
	slices.Sort(done)
	slices.SortFunc(partial, func(a, b PartialFile) int { return strings.Compare(a.ID, b.ID) })
	return slices.Compact(done), partial
}
