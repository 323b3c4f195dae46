package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// Mixture is the Data of a run over token stores: training windows from a
// tokens.Sampler mixing the stores by weight, evaluation windows from each
// store's held-out split.
type Mixture struct {
	stores  []*tokens.Store
	names   []string // the entries' store paths, for messages
	sources []tokens.Source
	cfg     tokens.Config
	sampler *tokens.Sampler
	evals   []*tokens.EvalSet
	// evalCache holds the held-out windows drawn so far, so that Eval(i)
	// returns the same windows at every evaluation.
	evalCache [][]int32
	evalReal  int // windows in evalCache read from the stores, not repeated
	// byStore are each store's own held-out windows, for its own loss:
	// drawn by evaluation sets of their own, so that the mixed cache's
	// windows stay what they were.
	byStore []storeEval
}

// storeEval is one store's held-out windows drawn so far.
type storeEval struct {
	set   *tokens.EvalSet
	cache [][]int32
	done  bool // the store has no more held-out windows
}

// OpenMixture opens the stores of entries for windows of seq+1 ids. A store
// whose tokenizer has a larger vocabulary than the model, or that is
// shorter than one window, is refused with an error naming it.
func OpenMixture(entries []MixtureEntry, mc model.Config, seq int, seed uint64) (*Mixture, error) {
	m := &Mixture{cfg: tokens.Config{SeqLen: seq, Seed: seed}}
	for _, e := range entries {
		st, err := tokens.Open(e.Store)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.stores = append(m.stores, st)
		m.names = append(m.names, e.Store)
		tk := st.Manifest().Tokenizer
		if tk.VocabSize > mc.VocabSize {
			m.Close()
			return nil, badInput(fmt.Errorf("token store %s was written with tokenizer %s of %d ids, more than the model's vocab_size %d: train a model whose vocabulary holds them, or re-ingest the store with a tokenizer of at most %d ids",
				e.Store, tk.Name, tk.VocabSize, mc.VocabSize, mc.VocabSize))
		}
		m.sources = append(m.sources, tokens.Source{Store: st, Weight: e.Weight})
		// Stores made by two tokenizers give ids that mean different text.
		if err := catalog.CheckStores([]catalog.Store{{Store: entries[0].Store, Tokenizer: m.stores[0].Manifest().Tokenizer}, {Store: e.Store, Tokenizer: tk}}); err != nil {
			m.Close()
			return nil, err
		}
		ev, err := tokens.NewEvalSet(st, m.cfg)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.evals = append(m.evals, ev)
	}
	var err error
	if m.sampler, err = tokens.NewSampler(m.sources, m.cfg, nil); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Stores returns each store's path and the tokenizer its manifest
// records, so that a caller can check them against the run's tokenizer.
func (m *Mixture) Stores() []catalog.Store {
	out := make([]catalog.Store, len(m.stores))
	for i, st := range m.stores {
		out[i] = catalog.Store{Store: m.names[i], Tokenizer: st.Manifest().Tokenizer}
	}
	return out
}

// Next draws b training windows.
func (m *Mixture) Next(ctx context.Context, b, t int) (model.Batch, error) {
	if t != m.cfg.SeqLen {
		return model.Batch{}, fmt.Errorf("mixture opened for seq %d, asked for %d", m.cfg.SeqLen, t)
	}
	w := make([]int32, b*(t+1))
	for i := 0; i < b; i++ {
		if _, _, err := m.sampler.Next(ctx, w[i*(t+1):(i+1)*(t+1)]); err != nil {
			return model.Batch{}, err
		}
	}
	return windowsToBatch(w, b, t), nil
}

// Eval returns held-out batch i: windows taken from the stores in turn.
func (m *Mixture) Eval(ctx context.Context, i, b, t int) (model.Batch, error) {
	need := (i + 1) * b
	for len(m.evalCache) < need {
		got := false
		for _, ev := range m.evals {
			if len(m.evalCache) == need {
				break
			}
			w := make([]int32, t+1)
			_, ok, err := ev.Next(ctx, w)
			if err != nil {
				return model.Batch{}, err
			}
			if ok {
				m.evalCache = append(m.evalCache, w)
				m.evalReal++
				got = true
			}
		}
		if !got {
			if len(m.evalCache) == 0 {
				return model.Batch{}, badInput(errors.New("the token stores hold no held-out window (1 window in 1000 is held out): ingest more data, or set eval_every 0 (sched train: --eval-every 0)"))
			}
			// Small stores: score the held-out windows again rather than
			// fewer of them, so that every evaluation has the same size.
			m.evalCache = append(m.evalCache, m.evalCache[len(m.evalCache)%m.evalReal])
		}
	}
	w := make([]int32, 0, b*(t+1))
	for _, win := range m.evalCache[i*b : need] {
		w = append(w, win...)
	}
	return windowsToBatch(w, b, t), nil
}

// Cursor is the sampler's position as JSON.
func (m *Mixture) Cursor() (json.RawMessage, error) {
	return json.Marshal(m.sampler.Cursor())
}

// Seek resumes the sampler from a cursor that Cursor returned.
func (m *Mixture) Seek(c json.RawMessage) error {
	var cur tokens.Cursor
	if err := json.Unmarshal(c, &cur); err != nil {
		return badInput(fmt.Errorf("data cursor is not a token sampler cursor: %w", err))
	}
	s, err := tokens.NewSampler(m.sources, m.cfg, &cur)
	if err != nil {
		return err
	}
	m.sampler = s
	return nil
}

// EvalStores names the stores, for their own evaluation losses: each
// store's directory name, or its path where two names are alike.
func (m *Mixture) EvalStores() []string {
	out := make([]string, len(m.names))
	seen := map[string]int{}
	for i, n := range m.names {
		out[i] = filepath.Base(n)
		seen[out[i]]++
	}
	for i, n := range m.names {
		if seen[out[i]] > 1 {
			out[i] = n
		}
	}
	return out
}

// ShortStore is a store of a mixture that holds no held-out window: too
// few tokens for the first window that evaluation holds out.
type ShortStore struct {
	// Name is the store's name as EvalStores gives it.
	Name string
	// Tokens is what the store holds, Need what it needs for one held-out
	// window at the mixture's sequence length.
	Tokens, Need int64
}

// WithoutHeldOut lists the stores that hold no held-out window at the
// mixture's sequence length, in the mixture's order: evaluation leaves
// them out. Which windows are held out depends on their index alone
// (tokens.FirstHeldOut), so a store's count of tokens says it; which ones
// are is not changed for a small store, as that would change the data
// order of the runs over it and break their exact resumes.
func (m *Mixture) WithoutHeldOut() []ShortStore {
	need := tokens.HeldOutNeed(m.cfg.HoldOut, m.cfg.SeqLen)
	names := m.EvalStores()
	var out []ShortStore
	for i, st := range m.stores {
		if st.Len() < need {
			out = append(out, ShortStore{Name: names[i], Tokens: st.Len(), Need: need})
		}
	}
	return out
}

// EvalStore returns held-out batch i of store s alone: the same windows at
// every evaluation, repeated when the store holds fewer than asked. ok is
// false when the store holds no held-out window.
func (m *Mixture) EvalStore(ctx context.Context, s, i, b, t int) (model.Batch, bool, error) {
	if m.byStore == nil {
		m.byStore = make([]storeEval, len(m.stores))
	}
	e := &m.byStore[s]
	if e.set == nil {
		set, err := tokens.NewEvalSet(m.stores[s], m.cfg)
		if err != nil {
			return model.Batch{}, false, err
		}
		e.set = set
	}
	need := (i + 1) * b
	for len(e.cache) < need && !e.done {
		w := make([]int32, t+1)
		_, ok, err := e.set.Next(ctx, w)
		if err != nil {
			return model.Batch{}, false, err
		}
		if !ok {
			e.done = true
			break
		}
		e.cache = append(e.cache, w)
	}
	if len(e.cache) == 0 {
		return model.Batch{}, false, nil
	}
	w := make([]int32, 0, b*(t+1))
	for k := i * b; k < need; k++ {
		w = append(w, e.cache[k%len(e.cache)]...)
	}
	return windowsToBatch(w, b, t), true, nil
}

// Close unmaps the stores.
func (m *Mixture) Close() error {
	var errs []error
	for _, st := range m.stores {
		errs = append(errs, st.Close())
	}
	m.stores = nil
	return errors.Join(errs...)
}
