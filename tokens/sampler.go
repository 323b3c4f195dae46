package tokens

import (
	"context"
	"fmt"
	"math"
)

// DefaultHoldOut holds out 1 window in 1000 for evaluation: 24k windows of
// a 25e9-token store at seq_len 1024, 0.1% of its tokens.
const DefaultHoldOut = 1000

// evalSalt keys the held-out hash. It is fixed, not derived from the run's
// seed, so that every run over a store evaluates on the same windows and
// none trains on another run's evaluation set.
const evalSalt = 0x6b696c6e2d657661 // "kiln-eva"

// Config selects how a Sampler cuts and orders windows. Zero values are
// resolved in withDefaults.
type Config struct {
	// SeqLen is the number of input positions; a window is SeqLen+1 tokens.
	SeqLen int
	// Seed orders the windows; the same seed gives the same sequence.
	Seed uint64
	// HoldOut keeps 1 window in HoldOut out of training, for evaluation.
	// 0 means DefaultHoldOut.
	HoldOut int
}

func (c Config) withDefaults() Config {
	if c.HoldOut == 0 {
		c.HoldOut = DefaultHoldOut
	}
	return c
}

func (c Config) validate() error {
	if c.SeqLen < 1 {
		return fmt.Errorf("seq_len must be at least 1, got %d", c.SeqLen)
	}
	if c.HoldOut < 2 {
		return fmt.Errorf("hold_out must be at least 2 (1 window in hold_out is held out), got %d", c.HoldOut)
	}
	return nil
}

// heldOut reports whether window w of any store is in the evaluation split.
func heldOut(w uint64, holdOut int) bool {
	return mix64(w^evalSalt)%uint64(holdOut) == 0
}

// FirstHeldOut is the index of the first window held out for evaluation
// when one window in holdOut is (DefaultHoldOut when 0): a store has a
// held-out window once it holds more windows than that. Which windows are
// held out depends on their index alone, so a store's count of tokens
// says whether it has one.
func FirstHeldOut(holdOut int) int64 {
	if holdOut <= 0 {
		holdOut = DefaultHoldOut
	}
	for w := uint64(0); ; w++ {
		if heldOut(w, holdOut) {
			return int64(w)
		}
	}
}

// HeldOutNeed is how many tokens a store needs to hold its first held-out
// window of seq+1 tokens, when one window in holdOut is (DefaultHoldOut
// when 0): fewer, and evaluation has none of it.
func HeldOutNeed(holdOut, seq int) int64 {
	return (FirstHeldOut(holdOut) + 1) * int64(seq+1)
}

// Source is one store in a mixture and its share of the windows.
type Source struct {
	Store  *Store
	Weight float64
}

// Cursor is where a Sampler stands: the configuration it was made with,
// the number of windows drawn, and a few integers per store. Passing it back
// to NewSampler resumes the exact sequence. It encodes to JSON for a
// checkpoint's trainer_state.json.
type Cursor struct {
	SeqLen  int           `json:"seq_len"`
	Seed    uint64        `json:"seed"`
	HoldOut int           `json:"hold_out"`
	Draws   int64         `json:"draws"`
	Stores  []StoreCursor `json:"stores"`
}

// StoreCursor is one store's place in its current epoch.
type StoreCursor struct {
	// Windows is the store's window count when the epoch began: a store that
	// grows during a run keeps its epoch's order, and the new windows join
	// at the next epoch.
	Windows int64 `json:"windows"`
	Epoch   int64 `json:"epoch"`
	// Pos is the next position in the epoch's permutation, held-out
	// windows included.
	Pos int64 `json:"pos"`
	// Taken counts the training windows this store has supplied.
	Taken int64 `json:"taken"`
}

// Sampler draws training windows from a weighted mixture of stores. It is
// not safe for concurrent use.
type Sampler struct {
	cfg     Config
	sources []Source
	weights []float64 // normalised to sum to 1
	cur     Cursor
	perms   []permutation
}

// NewSampler mixes sources by weight. cur is nil for a new run, or the
// Cursor of a stopped one to resume it.
func NewSampler(sources []Source, cfg Config, cur *Cursor) (*Sampler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, &InputError{err: fmt.Errorf("token sampler: %w", err)}
	}
	if len(sources) == 0 {
		return nil, inputErrorf("token sampler: no token store given: pass at least one --tokens STORE[=weight]")
	}
	var total float64
	for _, src := range sources {
		if !(src.Weight > 0) || math.IsInf(src.Weight, 0) {
			return nil, inputErrorf("token sampler: store %s has weight %v: weights must be positive and finite", src.Store.Dir(), src.Weight)
		}
		total += src.Weight
	}
	first := sources[0].Store.m.Tokenizer
	s := &Sampler{cfg: cfg, sources: sources, weights: make([]float64, len(sources)), perms: make([]permutation, len(sources))}
	for i, src := range sources {
		st := src.Store
		s.weights[i] = src.Weight / total
		if tk := st.m.Tokenizer; tk.SHA256 != first.SHA256 {
			return nil, inputErrorf("token sampler: store %s was written with tokenizer %s (sha256 %s) and store %s with %s (sha256 %s): a run must use one tokenizer; re-ingest one of them",
				sources[0].Store.Dir(), first.Name, first.SHA256, st.Dir(), tk.Name, tk.SHA256)
		}
		if err := checkTrainable(st, cfg); err != nil {
			return nil, err
		}
	}
	if cur == nil {
		s.cur = Cursor{SeqLen: cfg.SeqLen, Seed: cfg.Seed, HoldOut: cfg.HoldOut, Stores: make([]StoreCursor, len(sources))}
		for i, src := range sources {
			s.cur.Stores[i].Windows = src.Store.Windows(cfg.SeqLen)
		}
	} else {
		if err := s.checkCursor(cur); err != nil {
			return nil, err
		}
		s.cur = *cur
		s.cur.Stores = append([]StoreCursor(nil), cur.Stores...)
	}
	for i := range sources {
		s.perms[i] = s.epochPermutation(i, s.cur.Stores[i])
	}
	return s, nil
}

// checkTrainable rejects a store with no training window for cfg.
func checkTrainable(st *Store, cfg Config) error {
	n := st.Windows(cfg.SeqLen)
	if n == 0 {
		return inputErrorf("token store %s holds %d tokens, fewer than one window of seq_len+1 = %d tokens: ingest more data into it or lower seq_len",
			st.Dir(), st.Len(), cfg.SeqLen+1)
	}
	for w := int64(0); w < n; w++ {
		if !heldOut(uint64(w), cfg.HoldOut) {
			return nil
		}
	}
	return inputErrorf("token store %s: all %d of its windows of seq_len+1 = %d tokens are held out for evaluation: ingest more data into it or raise hold_out",
		st.Dir(), n, cfg.SeqLen+1)
}

// cursorNotARuns is the end of the message for a cursor no sampler writes.
const cursorNotARuns = "the checkpoint's trainer_state.json was damaged or edited: set that checkpoint aside (rename its directory to step-NNNNNNN.damaged) and resume, which takes the one before it"

func (s *Sampler) checkCursor(cur *Cursor) error {
	switch {
	case cur.SeqLen < 1 || len(cur.Stores) == 0:
		// A cursor of zeros (null, or cut from the file) is no run's:
		// not a run's other settings.
		return inputErrorf("token sampler: the run's cursor is not one a run writes (seq_len %d, %d stores): %s", cur.SeqLen, len(cur.Stores), cursorNotARuns)
	case cur.SeqLen != s.cfg.SeqLen || cur.Seed != s.cfg.Seed || cur.HoldOut != s.cfg.HoldOut:
		return inputErrorf("token sampler: the run's cursor was made with seq_len %d, seed %d, hold_out %d, but this run asks for %d, %d, %d: resume with the run's own settings (a queued run: its runs entry as it was), or start another run",
			cur.SeqLen, cur.Seed, cur.HoldOut, s.cfg.SeqLen, s.cfg.Seed, s.cfg.HoldOut)
	case len(cur.Stores) != len(s.sources):
		return inputErrorf("token sampler: the run's cursor covers %d stores, but %d are given: resume with the run's stores, in the same order",
			len(cur.Stores), len(s.sources))
	}
	for i, sc := range cur.Stores {
		have := s.sources[i].Store.Windows(s.cfg.SeqLen)
		switch {
		case sc.Windows < 1 || sc.Pos < 0 || sc.Pos > sc.Windows || sc.Epoch < 0 || sc.Taken < 0:
			// No sampler writes these: the checkpoint's state was damaged
			// or edited.
			return inputErrorf("token sampler: the run's cursor for store %s is not one a run writes (position %d of %d windows, epoch %d, %d taken): %s",
				s.sources[i].Store.Dir(), sc.Pos, sc.Windows, sc.Epoch, sc.Taken, cursorNotARuns)
		case sc.Windows > have:
			return inputErrorf("token sampler: store %s holds %d windows, but the run's cursor records %d (epoch %d, position %d): it is not the store the run trained on; pass that store",
				s.sources[i].Store.Dir(), have, sc.Windows, sc.Epoch, sc.Pos)
		}
	}
	return nil
}

// epochPermutation orders store i's windows for its current epoch. The key
// depends on the seed, the store's place in the mixture and the epoch, so
// every epoch of every store has its own order.
func (s *Sampler) epochPermutation(i int, sc StoreCursor) permutation {
	key := mix64(s.cfg.Seed ^ mix64(uint64(i)+1) ^ mix64(uint64(sc.Epoch)<<32|0xe90c))
	return newPermutation(uint64(sc.Windows), key)
}

// Cursor returns the sampler's position; it shares nothing with the sampler.
func (s *Sampler) Cursor() Cursor {
	c := s.cur
	c.Stores = append([]StoreCursor(nil), s.cur.Stores...)
	return c
}

// SeqLen is the number of input positions; Next fills SeqLen+1 tokens.
func (s *Sampler) SeqLen() int { return s.cfg.SeqLen }

// Next copies the next training window into dst[:SeqLen+1] and returns the
// index of the store it came from and the window's index in that store.
// The store is the one furthest behind its weight (lowest index on a tie),
// so after k draws store i has supplied w_i*k windows to within one.
func (s *Sampler) Next(ctx context.Context, dst []int32) (store int, window int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	best, window, sc, perm := s.pick()
	// The cursor moves only once the window is read, so a failed read
	// (an id past the vocabulary) leaves it where it was.
	if err := s.sources[best].Store.Window(window, s.cfg.SeqLen, dst); err != nil {
		return 0, 0, err
	}
	s.commit(best, sc, perm)
	return best, window, nil
}

// pick chooses the next training window without moving the cursor: the
// store furthest behind its weight, the window, and that store's cursor
// and permutation as they stand once the window is taken.
func (s *Sampler) pick() (best int, window int64, sc StoreCursor, perm permutation) {
	k := float64(s.cur.Draws + 1)
	bestDeficit := math.Inf(-1)
	for i, w := range s.weights {
		if d := w*k - float64(s.cur.Stores[i].Taken); d > bestDeficit {
			best, bestDeficit = i, d
		}
	}
	sc = s.cur.Stores[best]
	perm = s.perms[best]
	for {
		if sc.Pos == sc.Windows {
			sc = StoreCursor{Windows: s.sources[best].Store.Windows(s.cfg.SeqLen), Epoch: sc.Epoch + 1, Taken: sc.Taken}
			perm = s.epochPermutation(best, sc)
		}
		window = int64(perm.at(uint64(sc.Pos)))
		sc.Pos++
		if !heldOut(uint64(window), s.cfg.HoldOut) {
			return best, window, sc, perm
		}
	}
}

// commit moves the cursor past the window pick chose.
func (s *Sampler) commit(best int, sc StoreCursor, perm permutation) {
	sc.Taken++
	s.cur.Stores[best] = sc
	s.perms[best] = perm
	s.cur.Draws++
}

// Share is one device's part of the training stream when a run trains on
// several: rank Rank of Ranks, 0 <= Rank < Ranks. Share{0, 1} is the whole
// stream.
type Share struct{ Rank, Ranks int }

func (sh Share) validate() error {
	if sh.Ranks < 1 || sh.Rank < 0 || sh.Rank >= sh.Ranks {
		return fmt.Errorf("token sampler: share %d of %d: the rank must lie in [0, %d) and there must be at least one rank", sh.Rank, sh.Ranks, sh.Ranks)
	}
	return nil
}

// WindowRef names a window: its store's index in the mixture and its
// index in that store.
type WindowRef struct {
	Store  int
	Window int64
}

// NextShare draws one round of the stream, sh.Ranks blocks of n windows
// each (n = len(dst)/(SeqLen+1)), and copies block sh.Rank into dst,
// returning its windows; the other blocks are passed over without being
// read. The stream is the one Next draws: rank r's block is windows r*n to
// r*n+n-1 of the round, so the blocks of the ranks, in rank order, are the
// round as one sampler drawing Ranks*n windows sees it.
//
// Every rank's sampler ends the round at that one sampler's cursor. The
// cursor is therefore the run's, not a rank's: a run checkpointed on N
// devices resumes on any other number with the same windows in the same
// order. A failed read leaves the cursor at the round's start.
func (s *Sampler) NextShare(ctx context.Context, dst []int32, sh Share) ([]WindowRef, error) {
	if err := sh.validate(); err != nil {
		return nil, err
	}
	w := s.cfg.SeqLen + 1
	if len(dst) == 0 || len(dst)%w != 0 {
		return nil, fmt.Errorf("token sampler: a share's buffer of %d ids is not a whole number of windows of seq_len+1 = %d ids", len(dst), w)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := len(dst) / w
	start, perms := s.Cursor(), append([]permutation(nil), s.perms...)
	refs := make([]WindowRef, 0, n)
	for i := 0; i < sh.Ranks*n; i++ {
		best, window, sc, perm := s.pick()
		if mine := i - sh.Rank*n; mine >= 0 && mine < n {
			if err := s.sources[best].Store.Window(window, s.cfg.SeqLen, dst[mine*w:(mine+1)*w]); err != nil {
				s.cur, s.perms = start, perms
				return nil, err
			}
			refs = append(refs, WindowRef{Store: best, Window: window})
		}
		s.commit(best, sc, perm)
	}
	return refs, nil
}

// EvalSet walks a store's held-out windows in index order. Its windows are
// exactly those a Sampler with the same SeqLen and HoldOut never returns.
type EvalSet struct {
	store *Store
	cfg   Config
	next  int64
}

// NewEvalSet returns the evaluation windows of store under cfg (its Seed
// plays no part).
func NewEvalSet(store *Store, cfg Config) (*EvalSet, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, &InputError{err: fmt.Errorf("evaluation set of %s: %w", store.Dir(), err)}
	}
	return &EvalSet{store: store, cfg: cfg}, nil
}

// Next copies the next held-out window into dst[:SeqLen+1]; ok is false
// once the store has no more. Reset starts again from the first.
func (e *EvalSet) Next(ctx context.Context, dst []int32) (window int64, ok bool, err error) {
	n := e.store.Windows(e.cfg.SeqLen)
	for ; e.next < n; e.next++ {
		if e.next%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, false, err
			}
		}
		if heldOut(uint64(e.next), e.cfg.HoldOut) {
			w := e.next
			if err := e.store.Window(w, e.cfg.SeqLen, dst); err != nil {
				return 0, false, err
			}
			e.next++
			return w, true, nil
		}
	}
	return 0, false, nil
}

// Reset rewinds the set to its first window, so that every evaluation of a
// run scores the same windows.
func (e *EvalSet) Reset() { e.next = 0 }
