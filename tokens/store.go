package tokens

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Store is a read-only, memory-mapped view of a store's committed tokens.
// Nothing is resident: the kernel pages in the windows that are read. It is
// safe for concurrent use, also while an appender extends the store (it
// never sees the appender's uncommitted bytes).
type Store struct {
	dir   string
	m     *Manifest
	data  []byte   // the mapping; nil when no token is committed
	ids16 []uint16 // data viewed as ids, one of the two is set
	ids32 []uint32
	vocab uint32
}

// sampledSpans and sampledSpan size the id check Open makes: 64 spans of
// 4096 ids, spread over the file, read 512 KiB of a uint16 store.
const (
	sampledSpans = 64
	sampledSpan  = 4096
)

// Open maps the committed tokens of the store in dir. It checks the manifest
// against the file's size and samples the ids against the vocabulary; every
// window read later is checked in full.
func Open(dir string) (*Store, error) {
	if !littleEndian() {
		return nil, fmt.Errorf("token store %s: this machine is big-endian and tokens.bin is little-endian; read it on an amd64 or arm64 machine", dir)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	width := int64(m.Dtype.Width())
	want := m.Tokens * width
	f, err := os.Open(filepath.Join(dir, TokensFile))
	if errors.Is(err, fs.ErrNotExist) && m.Tokens == 0 {
		// A store killed while it was being created: empty, not damaged.
		return &Store{dir: dir, m: m, vocab: uint32(m.Tokenizer.VocabSize)}, nil
	}
	if err != nil {
		return nil, fileDamage(dir, m, nil, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("token store %s: stat %s: %w", dir, f.Name(), err)
	}
	if err := fileDamage(dir, m, st, nil); err != nil {
		return nil, err
	}
	s := &Store{dir: dir, m: m, vocab: uint32(m.Tokenizer.VocabSize)}
	if m.Tokens > 0 {
		data, err := unix.Mmap(int(f.Fd()), 0, int(want), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("token store %s: mmap %d bytes of %s: %w", dir, want, f.Name(), err)
		}
		// Training reads scattered windows; read-ahead would fetch pages no
		// one asked for.
		_ = unix.Madvise(data, unix.MADV_RANDOM)
		s.data = data
		if width == 2 {
			s.ids16 = unsafe.Slice((*uint16)(unsafe.Pointer(&data[0])), m.Tokens)
		} else {
			s.ids32 = unsafe.Slice((*uint32)(unsafe.Pointer(&data[0])), m.Tokens)
		}
	}
	if err := s.sampleIDs(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// CheckFile says whether the store in dir, of manifest m, has the
// tokens.bin its manifest commits: a stat, no id read, so that a worker
// may look at every store often. A file missing or shorter than the
// committed tokens is damage (an *InputError whose Damage says how); a
// file that cannot be stat'ed for another reason (permissions) is an error
// that is no damage.
func CheckFile(dir string, m *Manifest) error {
	st, err := os.Stat(filepath.Join(dir, TokensFile))
	if errors.Is(err, fs.ErrNotExist) && m.Tokens == 0 {
		return nil
	}
	if err != nil {
		return fileDamage(dir, m, nil, err)
	}
	return fileDamage(dir, m, st, nil)
}

// fileDamage is what Open and CheckFile make of the store's tokens.bin:
// st its stat, or err why it could not be opened or stat'ed.
func fileDamage(dir string, m *Manifest, st os.FileInfo, err error) error {
	path := filepath.Join(dir, TokensFile)
	if err != nil {
		damage := "" // a file that will not open (permissions) is not damaged
		if errors.Is(err, fs.ErrNotExist) {
			damage = TokensFile + " is missing"
		}
		why := err
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			why = pe.Err // the path is said once already
		}
		return damagedf(damage, "token store %s: open %s: %v: the manifest commits %d tokens, so the file must exist; restore it or re-ingest the store", dir, path, why, m.Tokens)
	}
	if want := m.Tokens * int64(m.Dtype.Width()); st.Size() < want {
		return damagedf(fmt.Sprintf("%s is truncated (%d of %d bytes)", TokensFile, st.Size(), want),
			"token store %s: %s holds %d bytes, but the manifest commits %d tokens (%d bytes): the file was truncated outside kiln; restore it or re-ingest the store",
			dir, path, st.Size(), m.Tokens, want)
	}
	return nil
}

func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// Close unmaps the tokens. No window may be read afterwards.
func (s *Store) Close() error {
	if s.data == nil {
		return nil
	}
	err := unix.Munmap(s.data)
	s.data, s.ids16, s.ids32 = nil, nil, nil
	if err != nil {
		return fmt.Errorf("token store %s: munmap: %w", s.dir, err)
	}
	return nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Manifest returns the manifest the store was opened with.
func (s *Store) Manifest() Manifest {
	m := *s.m
	m.Shards = append([]Shard(nil), s.m.Shards...)
	m.Skipped = append([]Skipped(nil), s.m.Skipped...)
	return m
}

// Len is the number of committed tokens.
func (s *Store) Len() int64 { return s.m.Tokens }

// Windows is how many windows of seqLen+1 tokens the store holds. Windows
// are disjoint, laid end to end from token 0: window i is tokens
// [i*(seqLen+1), (i+1)*(seqLen+1)), seqLen inputs and the token after each.
// Disjoint windows keep a held-out window's tokens out of every training
// window, at the cost of 1 target in seqLen+1.
func (s *Store) Windows(seqLen int) int64 {
	if seqLen < 1 {
		return 0
	}
	return s.m.Tokens / int64(seqLen+1)
}

// Window copies window i of seqLen+1 tokens into dst[:seqLen+1], checking
// every id against the vocabulary.
func (s *Store) Window(i int64, seqLen int, dst []int32) error {
	w := int64(seqLen + 1)
	if seqLen < 1 || len(dst) < int(w) {
		return fmt.Errorf("token store %s: window of seq_len %d needs a buffer of %d ids, got %d", s.dir, seqLen, w, len(dst))
	}
	if i < 0 || i >= s.Windows(seqLen) {
		return fmt.Errorf("token store %s: window %d is outside the %d windows of seq_len %d", s.dir, i, s.Windows(seqLen), seqLen)
	}
	return s.read(i*w, dst[:w])
}

// read copies tokens [off, off+len(dst)) into dst.
func (s *Store) read(off int64, dst []int32) error {
	vocab := s.vocab
	if s.ids16 != nil {
		src := s.ids16[off : off+int64(len(dst))]
		// The check is folded into the copy: a max over the window costs
		// one compare per id and leaves the loop branch-free.
		var hi uint16
		for j, v := range src {
			dst[j] = int32(v)
			hi = max(hi, v)
		}
		if uint32(hi) >= vocab {
			return s.badID(off, len(dst))
		}
		return nil
	}
	src := s.ids32[off : off+int64(len(dst))]
	var hi uint32
	for j, v := range src {
		dst[j] = int32(v)
		hi = max(hi, v)
	}
	if hi >= vocab {
		return s.badID(off, len(dst))
	}
	return nil
}

// badID finds the first id past the vocabulary in [off, off+n) and names it.
func (s *Store) badID(off int64, n int) error {
	for p := off; p < off+int64(n); p++ {
		if id := s.at(p); id >= s.vocab {
			return damagedf(fmt.Sprintf("token %d is outside the vocabulary", p),
				"token store %s: token %d is id %d, outside the vocabulary of %d of tokenizer %s: the store holds ids of another tokenizer or is damaged; re-ingest it with the model's tokenizer",
				s.dir, p, id, s.vocab, s.m.Tokenizer.Name)
		}
	}
	return nil
}

func (s *Store) at(p int64) uint32 {
	if s.ids16 != nil {
		return uint32(s.ids16[p])
	}
	return s.ids32[p]
}

// sampleIDs checks evenly spread spans of ids against the vocabulary, so a
// store of a foreign tokenizer fails at Open rather than mid-run. A uint16
// store with a vocabulary of 65536 cannot hold a bad id and is not read.
func (s *Store) sampleIDs() error {
	n := s.m.Tokens
	if n == 0 || (s.ids16 != nil && s.vocab >= 1<<16) {
		return nil
	}
	buf := make([]int32, sampledSpan)
	for k := int64(0); k < sampledSpans; k++ {
		span := min(int64(sampledSpan), n)
		off := (n - span) * k / (sampledSpans - 1)
		if err := s.read(off, buf[:span]); err != nil {
			return err
		}
		if span == n {
			break
		}
	}
	return nil
}

// Verify reads every committed token: each id must be inside the vocabulary
// and each shard's bytes must hash to the digest recorded when it was
// appended. It takes seconds per GB and is meant for an operator's check,
// not for every Open.
func (s *Store) Verify(ctx context.Context) error {
	width := int64(s.m.Dtype.Width())
	const chunk = 1 << 20
	buf := make([]int32, chunk)
	for _, sh := range s.m.Shards {
		h := sha256.New()
		for off := sh.Offset; off < sh.Offset+sh.Tokens; off += chunk {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(chunk, sh.Offset+sh.Tokens-off)
			if err := s.read(off, buf[:n]); err != nil {
				return err
			}
			h.Write(s.data[off*width : (off+n)*width])
		}
		if sum := hex.EncodeToString(h.Sum(nil)); sum != sh.SHA256 {
			return inputErrorf("token store %s: shard %q (tokens %d to %d) hashes to sha256 %s, but %s was recorded: tokens.bin is damaged; re-ingest the store",
				s.dir, sh.ID, sh.Offset, sh.Offset+sh.Tokens, sum, sh.SHA256)
		}
	}
	return nil
}
