package tokens

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"unsafe"

	"go.uber.org/zap"
)

// ShardInfo names a shard to append. ID is the exactly-once key: an ID
// already in the manifest is never appended again. SHA256, when set, is the
// expected digest of the shard's token bytes; a mismatch refuses the append.
type ShardInfo struct {
	ID       string
	Source   string
	Revision string
	SHA256   string
	// Part, when set, is the part of the input the shard holds; the
	// exactly-once key is then the id and Part.From, and the part must
	// continue the parts of the input the store holds (from record 0 for
	// the first).
	Part Part
	// Skipped counts the documents left out of the input, one record per
	// reason (Count set; ID, Source and Revision are the shard's, From is
	// Part.From). The record of a part that starts past record 0 may
	// count none: that rest of the input was left out whole. They are
	// committed by the manifest that commits the shard, so that no crash
	// leaves the shard in and its count of what it left out lost.
	Skipped []Skipped
}

// AppendResult reports what Append did. Duplicate is true when the shard
// was already in the store and nothing was written; Shard is then the
// record made by the first append.
type AppendResult struct {
	Shard     Shard
	Duplicate bool
}

// Appender is the one writer of a store. It holds the store's lock from
// OpenAppender until Close.
type Appender struct {
	dir   string
	log   *zap.Logger
	lock  *storeLock
	f     *os.File // tokens.bin
	m     *Manifest
	index map[string]int // shard id -> position in m.Shards of its last part
	// bufs are the two read buffers: one is read into while the other's
	// chunk is hashed.
	bufs [2][]byte
	// broken is set when a manifest write failed part way: the state on
	// disk is then unknown, and only a fresh OpenAppender may continue.
	broken error
}

// appendChunk is the read size; 1 MiB keeps a write syscall per ~500k ids.
const appendChunk = 1 << 20

// writebackBytes is how much of a shard is written before its disk
// writeback is started, ahead of the commit's fsync.
const writebackBytes = 8 << 20

// OpenAppender locks the store in dir for writing, creating an empty store
// for tok when dir holds none. An existing store must have been created with
// the same tokenizer. log may be nil. A store another appender holds is a
// *LockedError at once.
func OpenAppender(ctx context.Context, dir string, tok Tokenizer, log *zap.Logger) (*Appender, error) {
	return OpenAppenderWaiting(ctx, dir, tok, log, LockWait{})
}

// OpenAppenderWaiting is OpenAppender that waits, as wait says, for a store
// another process holds, until ctx ends. One this process's own appender
// holds is a *LockedError at once: that appender is this process's to
// close.
func OpenAppenderWaiting(ctx context.Context, dir string, tok Tokenizer, log *zap.Logger, wait LockWait) (*Appender, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if err := tok.validate(); err != nil {
		return nil, &InputError{err: fmt.Errorf("open token store %s: %w", dir, err)}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create token store %s: %w", dir, err)
	}
	lock, err := lockStore(ctx, dir, wait)
	if err != nil {
		return nil, err
	}
	a, err := openLocked(dir, tok, log)
	if err != nil {
		lock.release()
		return nil, err
	}
	a.lock = lock
	return a, nil
}

func openLocked(dir string, tok Tokenizer, log *zap.Logger) (*Appender, error) {
	binPath := filepath.Join(dir, TokensFile)
	m, err := ReadManifest(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A tokens.bin without a manifest is someone's data that kiln cannot
		// account for; creating a store over it would truncate it.
		if st, serr := os.Stat(binPath); serr == nil && st.Size() > 0 {
			return nil, inputErrorf("token store %s has a %d-byte %s but no %s: refusing to overwrite it; restore the manifest or move %s away",
				dir, st.Size(), TokensFile, ManifestFile, TokensFile)
		}
		// tokens.bin first: a manifest is never visible without its file.
		f, err := os.OpenFile(binPath, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("create token store %s: %w", dir, err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("create token store %s: %w", dir, err)
		}
		m = newManifest(tok)
		if err := writeManifest(dir, m); err != nil {
			return nil, fmt.Errorf("create token store %s: %w", dir, err)
		}
		log.Info("created token store", zap.String("store", dir), zap.String("tokenizer", tok.Name),
			zap.Int("vocab", tok.VocabSize), zap.String("dtype", string(m.Dtype)))
	case err != nil:
		return nil, err
	default:
		have := m.Tokenizer
		if err := CheckWrittenWith(dir, have, tok); err != nil {
			return nil, err
		}
		if have.VocabSize != tok.VocabSize || have.EOS != tok.EOS {
			return nil, inputErrorf("token store %s records vocab_size %d and eos_id %d for tokenizer sha256 %s, but the caller says %d and %d: fix the tokenizer metadata",
				dir, have.VocabSize, have.EOS, tok.SHA256, tok.VocabSize, tok.EOS)
		}
	}
	f, err := os.OpenFile(binPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", binPath, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", binPath, err)
	}
	width := int64(m.Dtype.Width())
	if st.Size() < m.Tokens*width {
		f.Close()
		return nil, inputErrorf("token store %s: %s holds %d bytes but the manifest commits %d tokens (%d bytes): the file was truncated outside kiln; restore it or re-ingest the store",
			dir, binPath, st.Size(), m.Tokens, m.Tokens*width)
	}
	index := make(map[string]int, len(m.Shards))
	for i, s := range m.Shards {
		index[s.ID] = i
	}
	return &Appender{dir: dir, log: log, f: f, m: m, index: index, bufs: [2][]byte{make([]byte, appendChunk), make([]byte, appendChunk)}}, nil
}

// Manifest returns a copy of the committed manifest.
func (a *Appender) Manifest() Manifest {
	m := *a.m
	m.Shards = append([]Shard(nil), a.m.Shards...)
	m.Skipped = append([]Skipped(nil), a.m.Skipped...)
	return m
}

// Append adds the shard's ids, read from r as little-endian values of the
// store's dtype (the bytes tokens.bin holds), exactly once per info.ID. The
// shard must end with the EOS id so that shard boundaries are document
// boundaries. Every id is checked against the vocabulary before the shard
// is committed; on any error the store is left as it was. Bytes that do not
// hash to info.SHA256 are a *HashError, whichever check they fail first.
//
// The commit protocol survives SIGKILL at any point: tokens.bin is cut back
// to the committed count, the shard is written past it and fsynced, and only
// then is the manifest that counts it renamed into place. A crash before the
// rename leaves bytes that no reader looks at and the next append cuts off;
// a crash after it leaves the shard committed, and a retry is a no-op.
func (a *Appender) Append(ctx context.Context, info ShardInfo, r io.Reader) (AppendResult, error) {
	if res, done, err := a.begin(ctx, info); done || err != nil {
		return res, err
	}
	start := a.m.Tokens
	if err := a.cut(start); err != nil {
		return AppendResult{}, err
	}
	sh, err := a.write(ctx, info, r, start)
	if err != nil {
		// Tidy only: readers ignore the bytes and the next append cuts them.
		_ = a.cut(start)
		return AppendResult{}, err
	}
	return a.commit(sh, info.Skipped)
}

// CheckedShard is a shard's bytes with Append's checks already made (whole
// ids, all inside the vocabulary, EOS last, the SHA-256 the caller expects),
// so that AppendChecked holds the store only to write and commit them.
type CheckedShard struct {
	info ShardInfo
	tok  Tokenizer
	data []byte
	docs int64
	sum  string
}

// CheckShard makes Append's checks on data, a shard for the store in dir
// (named in messages only) whose tokenizer is tok; the errors are Append's.
// It holds nothing: the checks of one shard run while another is appended.
// The result keeps data, which must not change until it is appended.
func CheckShard(dir string, info ShardInfo, tok Tokenizer, data []byte) (*CheckedShard, error) {
	if err := tok.validate(); err != nil {
		return nil, &InputError{err: fmt.Errorf("check shard %q for token store %s: %w", info.ID, dir, err)}
	}
	sum := sha256.Sum256(data)
	c := &CheckedShard{info: info, tok: tok, data: data, sum: hex.EncodeToString(sum[:])}
	// Bytes changed on their way here may fail any check below: the hash
	// says whether they are the shard that was made, as Append's does.
	if info.SHA256 != "" && info.SHA256 != c.sum {
		return nil, errHash(dir, info, c.sum)
	}
	dtype := DtypeFor(tok.VocabSize)
	width := dtype.Width()
	if left := len(data) % width; left != 0 {
		return nil, errPartialID(dir, info, width, dtype, left)
	}
	if len(data) > 0 {
		ids := data
		if uintptr(unsafe.Pointer(unsafe.SliceData(ids)))%8 != 0 {
			ids = slices.Clone(ids) // scanIDs reads ids in place, aligned
		}
		d, last, bad := scanIDs(ids, width, uint64(tok.VocabSize), tok.EOS)
		if bad >= 0 {
			return nil, errBadID(dir, info, tok, int64(bad), idAt(ids, width, bad))
		}
		if last != tok.EOS {
			return nil, errNoEOS(dir, info, last, tok.EOS)
		}
		c.docs = d
	}
	return c, nil
}

// AppendChecked is Append of a shard CheckShard has checked, for a store of
// the same tokenizer: the same exactly-once rule and commit protocol, with
// only the write, the fsync and the manifest left to do.
func (a *Appender) AppendChecked(ctx context.Context, c *CheckedShard) (AppendResult, error) {
	if res, done, err := a.begin(ctx, c.info); done || err != nil {
		return res, err
	}
	if have := a.m.Tokenizer; c.tok.SHA256 != have.SHA256 || c.tok.VocabSize != have.VocabSize || c.tok.EOS != have.EOS {
		return AppendResult{}, inputErrorf("append shard %q to token store %s: it was checked for tokenizer sha256 %s (vocab %d, eos %d), and the store holds %s's ids (sha256 %s, vocab %d, eos %d): check it for this store",
			c.info.ID, a.dir, c.tok.SHA256, c.tok.VocabSize, c.tok.EOS, have.Name, have.SHA256, have.VocabSize, have.EOS)
	}
	width := int64(a.m.Dtype.Width())
	start := a.m.Tokens
	if err := a.cut(start); err != nil {
		return AppendResult{}, err
	}
	// Written a writeback's worth at a time, each piece's disk writeback
	// started before the next is written, as a streamed shard is.
	for off := 0; off < len(c.data); off += writebackBytes {
		piece := c.data[off:min(off+writebackBytes, len(c.data))]
		at := start*width + int64(off)
		if _, err := a.f.WriteAt(piece, at); err != nil {
			_ = a.cut(start)
			return AppendResult{}, fmt.Errorf("token store %s: write shard %q: %w", a.dir, c.info.ID, err)
		}
		startWriteback(a.f, at, int64(len(piece)))
	}
	return a.commit(Shard{ID: c.info.ID, Source: c.info.Source, Revision: c.info.Revision, SHA256: c.sum, Documents: c.docs,
		Tokens: int64(len(c.data)) / width, Offset: start, Part: c.info.Part}, c.info.Skipped)
}

// begin refuses an append to a store whose manifest write failed or without
// a shard id, and answers one whose shard (or part) is already in: done,
// with the first append's record, unless its SHA-256 differs. A part must
// continue the parts of its input the store holds, so that no record of
// the input is appended twice and none is passed over.
func (a *Appender) begin(ctx context.Context, info ShardInfo) (res AppendResult, done bool, err error) {
	if a.broken != nil {
		return res, false, fmt.Errorf("token store %s: an earlier manifest write failed (%v): reopen the store before appending", a.dir, a.broken)
	}
	if info.ID == "" {
		return res, false, inputErrorf("append to token store %s: the shard id is empty: pass the ingest task's shard id", a.dir)
	}
	if p := info.Part; p.From < 0 || p.To < 0 || p.To != 0 && p.To <= p.From {
		return res, false, inputErrorf("append shard %q to token store %s: records %s are no part of an input: a part starts at a record and ends after it, or at the input's end (to 0)", info.ID, a.dir, p)
	}
	for _, s := range info.Skipped {
		if s.ID != info.ID || s.Count < 0 || s.Count == 0 && info.Part.From == 0 || s.From != info.Part.From {
			return res, false, inputErrorf("append shard %q to token store %s: its record of documents left out (id %q, reason %q, count %d, from %d) must name the shard and its part's first record (%d) and count at least one document, or none for the rest of an input",
				info.ID, a.dir, s.ID, s.Reason, s.Count, s.From, info.Part.From)
		}
		if err := checkSkip(a.dir, s); err != nil {
			return res, false, err
		}
	}
	i, ok := a.index[info.ID]
	if !ok {
		if info.Part.From != 0 {
			return res, false, inputErrorf("append shard %q to token store %s: it holds records %s of its input, and the store holds none of the records before: append the input from record 0",
				info.ID, a.dir, info.Part)
		}
		return res, false, ctx.Err()
	}
	if have, ok := a.m.part(info.ID, info.Part); ok {
		if have.Part != info.Part {
			return res, false, inputErrorf("append shard %q to token store %s: the store holds its input's records %s, and this append holds records %s: a retry holds the same part",
				info.ID, a.dir, have.Part, info.Part)
		}
		if info.SHA256 != "" && info.SHA256 != have.SHA256 {
			return res, false, inputErrorf("append to token store %s: shard %q was appended with sha256 %s, and this append carries %s: give a changed shard a new id",
				a.dir, info.ID, have.SHA256, info.SHA256)
		}
		a.log.Info("shard already appended", zap.String("store", a.dir), zap.String("shard", info.ID), zap.Int64("tokens", have.Tokens))
		return AppendResult{Shard: have, Duplicate: true}, true, nil
	}
	switch last := a.m.Shards[i]; {
	case last.Part.To == 0:
		return res, false, inputErrorf("append shard %q to token store %s: the store holds all of its input already, and this append would add records %s of it again",
			info.ID, a.dir, partName(info.Part))
	case info.Part.IsZero() || info.Part.From != last.Part.To:
		return res, false, inputErrorf("append shard %q to token store %s: the store holds its input's records up to %d, and this append holds records %s: append the part from record %d",
			info.ID, a.dir, last.Part.To, partName(info.Part), last.Part.To)
	}
	return res, false, ctx.Err()
}

// partName names p for a message, the whole input included.
func partName(p Part) string {
	if p.IsZero() {
		return "from 0 to the end"
	}
	return p.String()
}

// part finds the shard that holds the input id whole (p zero) or the part
// of it that starts where p does.
func (m *Manifest) part(id string, p Part) (Shard, bool) {
	for _, s := range m.Shards {
		if s.ID == id && s.Part.IsZero() == p.IsZero() && s.Part.From == p.From {
			return s, true
		}
	}
	return Shard{}, false
}

// cut cuts tokens.bin back to start committed tokens.
func (a *Appender) cut(start int64) error {
	if err := a.f.Truncate(start * int64(a.m.Dtype.Width())); err != nil {
		return fmt.Errorf("token store %s: cut %s back to %d committed tokens: %w", a.dir, TokensFile, start, err)
	}
	return nil
}

// commit makes the shard written past the committed tokens durable, then
// the manifest that counts it and the documents it left out (skips).
func (a *Appender) commit(sh Shard, skips []Skipped) (AppendResult, error) {
	if err := a.f.Sync(); err != nil {
		return AppendResult{}, fmt.Errorf("token store %s: sync %s: %w", a.dir, TokensFile, err)
	}
	next := a.Manifest()
	// The input recorded as skipped whole before (read with other
	// columns) is the store's now: its record goes.
	next.Skipped = slices.DeleteFunc(next.Skipped, func(s Skipped) bool { return s.ID == sh.ID && s.Count == 0 && s.From == 0 })
	next.Shards = append(next.Shards, sh)
	next.Tokens += sh.Tokens
	next.Documents += sh.Documents
	for _, s := range skips {
		if !next.hasSkip(s) {
			next.Skipped = append(next.Skipped, s)
		}
	}
	if err := writeManifest(a.dir, &next); err != nil {
		a.broken = err
		return AppendResult{}, fmt.Errorf("token store %s: commit shard %q: %w", a.dir, sh.ID, err)
	}
	a.m = &next
	a.index[sh.ID] = len(next.Shards) - 1
	a.log.Info("appended shard", zap.String("store", a.dir), zap.String("shard", sh.ID),
		zap.Int64("tokens", sh.Tokens), zap.Int64("documents", sh.Documents), zap.Int64("committed", next.Tokens))
	return AppendResult{Shard: sh}, nil
}

// write streams r into tokens.bin from token index start, validating ids.
func (a *Appender) write(ctx context.Context, info ShardInfo, r io.Reader, start int64) (Shard, error) {
	width := a.m.Dtype.Width()
	vocab := uint64(a.m.Tokenizer.VocabSize)
	eos := a.m.Tokenizer.EOS
	// The SHA-256 runs on a goroutine of its own, a chunk behind the reads,
	// checks and writes, so that it overlaps with them: it was a quarter of
	// the append's CPU. It covers every byte written, and the shard is
	// committed only once it is taken and matches.
	h := sha256.New()
	free := make(chan []byte, len(a.bufs))
	free <- a.bufs[1]
	toHash := make(chan []byte, 1)
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		for b := range toHash {
			h.Write(b)
			free <- b[:cap(b)]
		}
	}()
	stopHash := sync.OnceFunc(func() { close(toHash); <-hashed })
	defer stopHash()
	// refuse returns err, a check the shard failed, unless the shard's
	// bytes are not those it was made with: bytes changed on their way
	// here may fail any check, and are a HashError (which a retry reads
	// again), not bad input. unhashed is what was read and not hashed; the
	// rest of r is read to end the hash.
	refuse := func(err error, unhashed []byte) (Shard, error) {
		if info.SHA256 == "" {
			return Shard{}, err
		}
		stopHash()
		h.Write(unhashed)
		if _, rerr := io.Copy(h, r); rerr != nil {
			return Shard{}, fmt.Errorf("token store %s: read shard %q: %w", a.dir, info.ID, rerr)
		}
		if sum := hex.EncodeToString(h.Sum(nil)); sum != info.SHA256 {
			return Shard{}, errHash(a.dir, info, sum)
		}
		return Shard{}, err
	}

	buf := a.bufs[0]
	var n, docs int64
	var last uint32
	have := 0         // bytes in buf not yet written: a partial id carried over
	var flushed int64 // ids handed to startWriteback
	for {
		if err := ctx.Err(); err != nil {
			return Shard{}, err
		}
		// The buffer is filled whole: a shard's body from object storage
		// comes a few tens of KiB a read, and handing each read to the hash
		// goroutine and back cost a third of the append's speed
		// (BenchmarkAppend/64KiB-reads: 430-440 MB/s, 600-630 filled).
		k, rerr := io.ReadFull(r, buf[have:])
		if rerr == io.ErrUnexpectedEOF {
			rerr = io.EOF
		}
		have += k
		whole := have - have%width
		chunk := buf[:whole]
		if whole > 0 {
			d, l, bad := scanIDs(chunk, width, vocab, eos)
			if bad >= 0 {
				return refuse(errBadID(a.dir, info, a.m.Tokenizer, n+int64(bad), idAt(chunk, width, bad)), buf[:have])
			}
			docs += d
			last = l
			if _, err := a.f.WriteAt(chunk, (start+n)*int64(width)); err != nil {
				return Shard{}, fmt.Errorf("token store %s: write shard %q: %w", a.dir, info.ID, err)
			}
			n += int64(whole / width)
			toHash <- chunk
			next := <-free
			have = copy(next, buf[whole:have])
			buf = next
			if (n-flushed)*int64(width) >= writebackBytes {
				startWriteback(a.f, (start+flushed)*int64(width), (n-flushed)*int64(width))
				flushed = n
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return Shard{}, fmt.Errorf("token store %s: read shard %q: %w", a.dir, info.ID, rerr)
		}
	}
	stopHash()
	if have != 0 {
		return refuse(errPartialID(a.dir, info, width, a.m.Dtype, have), buf[:have])
	}
	if n > 0 && last != eos {
		return refuse(errNoEOS(a.dir, info, last, eos), nil)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if info.SHA256 != "" && info.SHA256 != sum {
		return Shard{}, errHash(a.dir, info, sum)
	}
	return Shard{ID: info.ID, Source: info.Source, Revision: info.Revision, SHA256: sum, Documents: docs, Tokens: n, Offset: start, Part: info.Part}, nil
}

// The errors of a shard that fails Append's checks, whether it streams in or
// was checked beforehand (CheckShard).

func errBadID(dir string, info ShardInfo, tok Tokenizer, at int64, id uint32) error {
	return inputErrorf("append shard %q to token store %s: token %d of the shard is id %d, outside the vocabulary of %d: tokenize it with the store's tokenizer (%s)",
		info.ID, dir, at, id, tok.VocabSize, tok.Name)
}

func errPartialID(dir string, info ShardInfo, width int, dtype Dtype, left int) error {
	return inputErrorf("append shard %q to token store %s: the shard's length is not a whole number of %d-byte %s ids (%d bytes left over): the shard file is truncated or was written for another dtype",
		info.ID, dir, width, dtype, left)
}

func errNoEOS(dir string, info ShardInfo, last, eos uint32) error {
	return inputErrorf("append shard %q to token store %s: the shard ends with id %d, not the EOS id %d: end every document, the last one included, with EOS",
		info.ID, dir, last, eos)
}

func errHash(dir string, info ShardInfo, sum string) error {
	return &HashError{Dir: dir, ShardID: info.ID, Got: sum, Want: info.SHA256}
}

// HashError is a shard whose tokens, as they were read, hash to another
// SHA-256 than the one the shard was made with. Unlike Append's other
// refusals it is no input error, which a retry would meet again: a shard
// read from object storage may have changed on the way (a middlebox, a
// faulty NIC), and an append task's next try downloads it again, while
// the object in the store may be intact. Only where every try sees a
// mismatch does the shard object itself differ from what was made.
type HashError struct {
	Dir, ShardID string
	// Got is the SHA-256 of the tokens read, Want the one expected.
	Got, Want string
}

func (e *HashError) Error() string {
	return fmt.Sprintf("append shard %q to token store %s: its tokens as read hash to sha256 %s, not the %s it was made with: they changed on their way here, or the stored shard differs from what was made; an append task's next try reads it again, and where every try says so, run the ingest again, which makes the shard again",
		e.ShardID, e.Dir, e.Got, e.Want)
}

// Skip records an input that will not be appended, and why, so that ingest
// can report what it left out. Recording an id twice is a no-op; an id that
// was appended cannot be skipped. A record with Count set counts documents
// left out of an input instead: it may name an appended id, and is a no-op
// when that id already has a record for the same reason, so that a retried
// append does not count its documents twice.
func (a *Appender) Skip(ctx context.Context, s Skipped) error {
	if a.broken != nil {
		return fmt.Errorf("token store %s: an earlier manifest write failed (%v): reopen the store", a.dir, a.broken)
	}
	if err := checkSkip(a.dir, s); err != nil {
		return err
	}
	if _, ok := a.index[s.ID]; ok && s.Count == 0 {
		return inputErrorf("token store %s: shard %q is already appended and cannot be recorded as skipped", a.dir, s.ID)
	}
	if i, ok := a.index[s.ID]; !ok && s.From != 0 || ok && !a.m.hasPartFrom(s.ID, s.From, i) {
		return inputErrorf("token store %s: documents left out of %q from record %d: the store holds no part of it from there", a.dir, s.ID, s.From)
	}
	if a.m.hasSkip(s) {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	next := a.Manifest()
	next.Skipped = append(next.Skipped, s)
	if err := writeManifest(a.dir, &next); err != nil {
		a.broken = err
		return fmt.Errorf("token store %s: record skipped %q: %w", a.dir, s.ID, err)
	}
	a.m = &next
	a.log.Info("skipped input", zap.String("store", a.dir), zap.String("id", s.ID), zap.String("reason", s.Reason))
	return nil
}

// checkSkip refuses a record of a skipped input without an id or a
// reason, or with a negative count.
func checkSkip(dir string, s Skipped) error {
	if s.ID == "" || s.Reason == "" || s.Count < 0 {
		return inputErrorf("token store %s: a skipped input needs an id, a reason and a count that is not negative (got id %q, reason %q, count %d)", dir, s.ID, s.Reason, s.Count)
	}
	return nil
}

// hasSkip reports whether m records s already: the whole input's skip
// (Count zero) once per id, a count of documents once per id, part and
// reason.
func (m *Manifest) hasSkip(s Skipped) bool {
	for _, have := range m.Skipped {
		if have.ID == s.ID && (have.Count == 0) == (s.Count == 0) && (s.Count == 0 || have.Reason == s.Reason && have.From == s.From) {
			return true
		}
	}
	return false
}

// hasPartFrom reports whether the input id, whose last shard is m.Shards[last],
// has a part (or the whole) that starts at record from.
func (m *Manifest) hasPartFrom(id string, from int64, last int) bool {
	if m.Shards[last].Part.IsZero() {
		return from == 0
	}
	for _, s := range m.Shards[:last+1] {
		if s.ID == id && s.Part.From == from {
			return true
		}
	}
	return false
}

// Close releases the store's lock.
func (a *Appender) Close() error {
	err := a.f.Close()
	if lerr := a.lock.release(); err == nil {
		err = lerr
	}
	return err
}

// Encode appends ids to dst as little-endian values of dtype d: the bytes
// Append expects and tokens.bin holds. It runs on every token a shard writer
// produces, so the room is made once and, where the machine's byte order is
// the file's and the ids land aligned (always in a buffer of whole ids), they
// are stored in place rather than one bounds-checked put at a time.
func Encode(dst []byte, d Dtype, ids []uint32) []byte {
	w := d.Width()
	n := len(dst)
	dst = slices.Grow(dst, w*len(ids))[:n+w*len(ids)]
	out := dst[n:]
	inPlace := nativeLittle && uintptr(unsafe.Pointer(unsafe.SliceData(out)))%uintptr(w) == 0
	switch {
	case d == Uint16 && inPlace:
		u := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(out))), len(ids))
		for i, id := range ids {
			u[i] = uint16(id)
		}
	case d == Uint16:
		for i, id := range ids {
			binary.LittleEndian.PutUint16(out[2*i:], uint16(id))
		}
	case inPlace:
		copy(unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(out))), len(ids)), ids)
	default:
		for i, id := range ids {
			binary.LittleEndian.PutUint32(out[4*i:], id)
		}
	}
	return dst
}
