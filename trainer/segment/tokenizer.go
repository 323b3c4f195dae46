package segment

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
)

// TokenizerCopy is the tokenizer.json a checkpoint of a run holds, read
// whole and checked against the SHA-256 the checkpoint's
// trainer_state.json records for it: the bytes the run trains with.
type TokenizerCopy struct {
	// Name is what the run called its tokenizer (trainer.State's
	// TokenizerName).
	Name string
	// Step is the checkpoint's; From the copy read (an object's key, or a
	// file on this machine).
	Step int
	From string
	// SHA256 is the hash the checkpoint records, which Data has.
	SHA256 string
	Data   []byte
}

// checkpointTokenizer reads the copy of run's tokenizer that its newest
// checkpoint holds, in object storage (obj, nil for none), else in
// localRoot ("" for none), this machine's checkpoints of the run. A copy
// that is not the one its checkpoint records (damaged, or deleted) is
// passed over for an older checkpoint's, which must record the tokenizer
// the newest one that could be read records. has says whether the run has
// a checkpoint at all, either place; ok whether one held a copy to take.
// A checkpoint that records no tokenizer (a run given none) has no copy.
func checkpointTokenizer(ctx context.Context, obj Objects, run, localRoot string) (c TokenizerCopy, has, ok bool, err error) {
	// The run's tokenizer as the newest checkpoint read records it.
	var want *trainer.State
	take := func(st trainer.State, from string, data []byte) bool {
		if want == nil {
			want = &st
		}
		if st.TokenizerName != want.TokenizerName || !strings.EqualFold(st.Files[trainer.TokenizerFile].SHA256, want.Files[trainer.TokenizerFile].SHA256) {
			return false
		}
		c, ok = copyOf(st, from, data)
		return ok
	}
	if obj != nil {
		steps, err := RemoteSteps(ctx, obj, run)
		if err != nil {
			return c, false, false, err
		}
		has = len(steps) > 0
		for i := len(steps) - 1; i >= 0; i-- {
			st, sound, err := StoredState(ctx, obj, run, steps[i])
			if err != nil {
				return c, has, false, err
			}
			if !sound {
				continue
			}
			key := checkpointKey(run, steps[i]) + trainer.TokenizerFile
			data, err := readCopy(ctx, obj, key, st)
			switch {
			case errors.Is(err, store.ErrNotFound):
				data = nil
			case err != nil:
				return c, has, false, err
			}
			if take(st, key, data) {
				return c, has, true, nil
			}
		}
	}
	if localRoot == "" {
		return c, has, false, nil
	}
	dirs, err := trainer.StepDirs(localRoot)
	if err != nil {
		return c, has, false, err
	}
	has = has || len(dirs) > 0
	for _, dir := range dirs {
		st, err := trainer.CheckCheckpoint(dir)
		if err != nil {
			continue
		}
		p := filepath.Join(dir, trainer.TokenizerFile)
		data, _ := os.ReadFile(p)
		if take(st, p, data) {
			return c, has, true, nil
		}
	}
	return c, has, false, nil
}

// CheckpointTokenizer is the copy of run's tokenizer that its newest
// checkpoint in object storage holds, checked as PutBackTokenizer checks
// it; ok is false where no checkpoint of the run holds one. Another run
// that names the tokenizer, deleted, can be given it back from here.
func CheckpointTokenizer(ctx context.Context, obj Objects, run string) (c TokenizerCopy, ok bool, err error) {
	c, _, ok, err = checkpointTokenizer(ctx, obj, run, "")
	return c, ok, err
}

// readCopy reads key, the tokenizer.json of the checkpoint whose state is
// st, whole: no more than the size st records for it, and one byte more to
// tell one larger.
func readCopy(ctx context.Context, obj Objects, key string, st trainer.State) ([]byte, error) {
	r, err := obj.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, st.Files[trainer.TokenizerFile].Size+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return b, nil
}

// copyOf is data, read from from, as the tokenizer.json of the checkpoint
// whose state is st, where it is the one st records.
func copyOf(st trainer.State, from string, data []byte) (TokenizerCopy, bool) {
	f, ok := st.Files[trainer.TokenizerFile]
	if !ok || f.Size == 0 {
		return TokenizerCopy{}, false
	}
	sum := sha256.Sum256(data)
	if int64(len(data)) != f.Size || !strings.EqualFold(hex.EncodeToString(sum[:]), f.SHA256) {
		return TokenizerCopy{}, false
	}
	return TokenizerCopy{Name: st.TokenizerName, Step: st.Step, From: from, SHA256: strings.ToLower(f.SHA256), Data: data}, true
}

// PutBackTokenizer publishes again the tokenizer run trains with, under
// its name, from the copy its newest checkpoint holds (in object storage,
// else in localRoot, this machine's checkpoints of the run; "" for none),
// where the catalog holds nothing by that name any more, as gone (Resolve's
// answer) says: deleted from object storage, and from this machine's disk.
// A name, once published, always means the same bytes, and those are the
// checkpoint's copy, checked against the SHA-256 the checkpoint records
// for it; a tokenizer trained again under the name would be another, which
// the run refuses (its checkpoints were trained with the first) and which
// a published name never gives way to. The copy's name must be name: one
// a checkpoint records under another name is not put back. A run with no
// checkpoint, not begun, returns gone: it takes whatever tokenizer is
// made under the name. One whose checkpoints hold no copy to put back
// returns a *TokenizerGoneError, saying what to do by hand.
func PutBackTokenizer(ctx context.Context, obj Objects, dataDir, run, localRoot string, gone *catalog.NotFoundError) (catalog.Entry, TokenizerCopy, error) {
	c, has, ok, err := checkpointTokenizer(ctx, obj, run, localRoot)
	switch {
	case err != nil:
		return catalog.Entry{}, c, fmt.Errorf("tokenizer %s is gone: read the copy of it in run %s's checkpoints: %w", gone.Name, run, err)
	case !has:
		return catalog.Entry{}, c, gone
	case !ok:
		return catalog.Entry{}, c, &TokenizerGoneError{Run: run, Gone: gone}
	case c.Name != gone.Name:
		return catalog.Entry{}, c, &TokenizerGoneError{Run: run, Gone: gone, Other: c}
	}
	e, err := catalog.New(obj, dataDir).Publish(ctx, gone.Name, c.Data)
	if err != nil {
		return catalog.Entry{}, c, fmt.Errorf("put back tokenizer %s from %s: %w", gone.Name, c.From, err)
	}
	return e, c, nil
}

// RestoreTokenizer puts back tokenizer gone.Name, which run trains with
// and the catalog holds no more (gone, Resolve's answer), and says what it
// did: from the copy the run's own newest checkpoint holds
// (PutBackTokenizer), or, for a run not begun, from another run's where
// token stores and runs record the name (FindDeletedTokenizer). A name
// nothing records returns gone: a tokenizer not made yet.
func RestoreTokenizer(ctx context.Context, obj Objects, dataDir, run, localRoot string, gone *catalog.NotFoundError) (catalog.Entry, string, error) {
	e, c, err := PutBackTokenizer(ctx, obj, dataDir, run, localRoot, gone)
	switch {
	case err == nil:
		return e, fmt.Sprintf("tokenizer %s was in neither object storage nor this machine's data directory: put back from %s, the copy run %s's checkpoint of step %d holds (sha256 %.12s, as that checkpoint records it)",
			gone.Name, c.From, run, c.Step, c.SHA256), nil
	case !errors.Is(err, gone):
		return e, "", err
	}
	d, used, err := FindDeletedTokenizer(ctx, obj, dataDir, gone.Name)
	switch {
	case err != nil:
		return catalog.Entry{}, "", err
	case !used:
		return catalog.Entry{}, "", gone
	}
	return d.PutBack(ctx, obj, dataDir, "run "+run)
}

// TokenizerGoneError is the tokenizer of a run with checkpoints that the
// catalog holds no more, and that no checkpoint could put back: none held
// a copy that matches what it records (each damaged), and it says how to
// put it back by hand; or the newest one that does records another name
// for it (Other), or none, and it says to give the run that one.
type TokenizerGoneError struct {
	Run  string
	Gone *catalog.NotFoundError
	// Other is the copy whose checkpoint records another name; none
	// where no copy matched.
	Other TokenizerCopy
}

func (e *TokenizerGoneError) Error() string {
	known := "none"
	if len(e.Gone.Known) > 0 {
		known = strings.Join(e.Gone.Known, ", ")
	}
	here := "this machine's data directory"
	if e.Gone.Local != "" {
		here = "this machine's " + filepath.Dir(filepath.Dir(e.Gone.Local))
	}
	if e.Other.Data != nil {
		// Not the run's tokenizer by its checkpoints' word: the name is
		// not given the bytes of another.
		was := fmt.Sprintf("tokenizer %s", e.Other.Name)
		if e.Other.Name == "" {
			was = "a tokenizer they record no name for"
		}
		return fmt.Sprintf("tokenizer %q is in neither object storage nor %s (known: %s), and run %s's checkpoints were trained with %s (sha256 %.12s, a copy at %s), which is not put back under another name: "+
			"give the run the tokenizer it was trained with (tokenizer: in its runs entry), then 'sched enqueue train %s', or train with another as a new run, under another run name",
			e.Gone.Name, here, known, e.Run, was, e.Other.SHA256, e.Other.From, e.Run)
	}
	return fmt.Sprintf("tokenizer %q, which run %s trained with, is in neither object storage nor %s (known: %s), and no checkpoint of the run holds a copy of it that matches the sha256 the checkpoint records, to put back: "+
		"put back %s, and beside it its %s ('sha256sum %s > %s'), from a copy of the one the run trained with "+
		"(each of its checkpoints held one, as %s, and so does the disk of the worker that trained it), then 'sched enqueue train %s'; "+
		"a tokenizer trained again under this name is another, which the run refuses and which never gives way to this one",
		e.Gone.Name, e.Run, here, known,
		catalog.Key(e.Gone.Name), catalog.SumsFile, catalog.FileName, catalog.SumsFile,
		CheckpointPrefix(e.Run)+"step-NNNNNNN/"+trainer.TokenizerFile, e.Run)
}

// BadInput marks it as a person's to mend: no retry puts the tokenizer
// back.
func (e *TokenizerGoneError) BadInput() bool { return true }
