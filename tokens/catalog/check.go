package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/kiln-lm/kiln/tokens"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Store is a token store's name and the tokenizer its manifest records.
type Store struct {
	Store     string
	Tokenizer tokens.Tokenizer
}

// StoreOf reads the tokenizer recorded in the manifest of the store at dir.
func StoreOf(dir string) (Store, error) {
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		return Store{}, err
	}
	return Store{Store: dir, Tokenizer: m.Tokenizer}, nil
}

// MismatchError is work that would mix ids of two tokenizers: training on
// stores made by different tokenizers, or with a tokenizer other than the
// one that made a store. Its ids would mean different text, so the model
// would learn noise.
type MismatchError struct {
	// A and B name what disagrees ("token store tokens/code",
	// "the run's tokenizer") and the tokenizers they name.
	A, B       string
	TokA, TokB tokens.Tokenizer
	Fix        string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s was made by tokenizer %s (sha256 %s) but %s by tokenizer %s (sha256 %s): their ids mean different text; %s",
		e.A, label(e.TokA), e.TokA.SHA256, e.B, label(e.TokB), e.TokB.SHA256, e.Fix)
}
func (e *MismatchError) BadInput() bool { return true }

func label(t tokens.Tokenizer) string {
	if t.Name == "" {
		return "(unnamed)"
	}
	return t.Name
}

// CheckStores refuses a set of token stores made by more than one
// tokenizer: the first store's tokenizer is compared with each other's by
// SHA-256 (names can repeat across different files), and the first store
// that differs is named beside it.
func CheckStores(stores []Store) error {
	for _, s := range stores[min(1, len(stores)):] {
		if s.Tokenizer.SHA256 != stores[0].Tokenizer.SHA256 {
			return &MismatchError{
				A: "token store " + stores[0].Store, B: "token store " + s.Store,
				TokA: stores[0].Tokenizer, TokB: s.Tokenizer,
				Fix: "train on stores made by one tokenizer (re-ingest the others with it)",
			}
		}
	}
	return nil
}

// CheckUses refuses a store made by another tokenizer than want, the one
// a run or an ingest names (--tokenizer).
func CheckUses(s Store, want Entry) error {
	if s.Tokenizer.SHA256 == want.SHA256 {
		return nil
	}
	// The store's tokenizer may be known here by its name, or only as a
	// file: the fix names both ways to give it.
	return &MismatchError{
		A: "token store " + s.Store, B: "this work's ids are made",
		TokA: s.Tokenizer, TokB: tokens.Tokenizer{Name: want.Name, SHA256: want.SHA256, VocabSize: want.VocabSize, EOS: want.EOS},
		Fix: fmt.Sprintf("give the store's tokenizer (--tokenizer %s where it is published, or --tokenizer-file with its tokenizer.json), or use a store made by %s", label(s.Tokenizer), want.Name),
	}
}

// StoreTokenizer is the manifest record of e, for a new store.
func (e Entry) StoreTokenizer() tokens.Tokenizer {
	return tokens.Tokenizer{Name: e.Name, SHA256: e.SHA256, VocabSize: e.VocabSize, EOS: e.EOS}
}
