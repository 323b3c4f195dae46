package segment

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// DeletedTokenizer is what still records a tokenizer name that the
// catalog holds no more: the token stores it made (their statuses in
// object storage, and this machine's manifests) and the runs whose newest
// checkpoint holds a copy of it under the name. A name with users existed
// and was deleted; one trained again under it would be another tokenizer,
// which every one of them refuses and which a published name never gives
// way to.
type DeletedTokenizer struct {
	Name   string
	Stores []string
	Runs   []string
	// SHA256s are the hashes its users record for it: one, unless the
	// name was once deleted and made again.
	SHA256s []string
	// Copy is a checkpoint's copy of it, checked against the hash that
	// checkpoint records (Data nil: none).
	Copy TokenizerCopy
}

// FindDeletedTokenizer reads who records tokenizer name, which the catalog
// does not hold; used is false where nothing does (a tokenizer not made
// yet).
func FindDeletedTokenizer(ctx context.Context, objects store.Store, dataDir, name string) (d DeletedTokenizer, used bool, err error) {
	d.Name = name
	shas := map[string]bool{}
	stores := map[string]bool{}
	if objects != nil {
		names, err := ingest.PublishedStores(ctx, objects)
		if err != nil {
			return d, false, err
		}
		p := &ingest.Pipeline{Objects: objects}
		for _, s := range names {
			st, err := p.Status(ctx, s)
			if err != nil {
				return d, false, err
			}
			if st.Tokenizer.Name == name && st.Tokenizer.SHA256 != "" {
				stores[s] = true
				shas[strings.ToLower(st.Tokenizer.SHA256)] = true
			}
		}
	}
	// This machine's stores, whose statuses a worker that serves no
	// append does not publish.
	tokensDir := filepath.Join(dataDir, "tokens")
	dirs, err := os.ReadDir(tokensDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return d, false, fmt.Errorf("list token stores in %s: %w", tokensDir, err)
	}
	for _, e := range dirs {
		dir := filepath.Join(tokensDir, e.Name())
		if _, err := os.Stat(filepath.Join(dir, tokens.ManifestFile)); err != nil {
			continue
		}
		m, err := tokens.ReadManifest(dir)
		if err != nil || m.Tokenizer.Name != name || m.Tokenizer.SHA256 == "" {
			continue // a damaged store is the store's to mend, said where it is used
		}
		stores[e.Name()] = true
		shas[strings.ToLower(m.Tokenizer.SHA256)] = true
	}
	d.Stores = slices.Sorted(maps.Keys(stores))
	if objects != nil {
		infos, err := objects.List(ctx, "checkpoints/")
		if err != nil {
			return d, false, fmt.Errorf("list checkpoints/: %w", err)
		}
		runs := map[string]bool{}
		for _, in := range infos {
			if parts := strings.Split(in.Key, "/"); len(parts) > 2 {
				runs[parts[1]] = true
			}
		}
		for _, run := range slices.Sorted(maps.Keys(runs)) {
			c, ok, err := CheckpointTokenizer(ctx, objects, run)
			if err != nil {
				return d, false, err
			}
			if !ok || c.Name != name {
				continue
			}
			d.Runs = append(d.Runs, run)
			shas[c.SHA256] = true
			if d.Copy.Data == nil {
				d.Copy = c
			}
		}
	}
	d.SHA256s = slices.Sorted(maps.Keys(shas))
	return d, len(d.Stores)+len(d.Runs) > 0, nil
}

// users names a few of those that use it.
func (d DeletedTokenizer) users() string {
	var parts []string
	if len(d.Stores) > 0 {
		parts = append(parts, "token stores "+firstFew(d.Stores))
	}
	if len(d.Runs) > 0 {
		parts = append(parts, "runs "+firstFew(d.Runs))
	}
	return strings.Join(parts, " and ")
}

func firstFew(names []string) string {
	const few = 4
	if len(names) <= few {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:few], ", "), len(names)-few)
}

// PutBack publishes the tokenizer again from the checkpoint's copy where
// that is sound: every user records the one hash the copy has. It returns
// the note to print, and an error that says what to do by hand where it
// cannot: the old name's bytes, never a tokenizer trained again.
func (d DeletedTokenizer) PutBack(ctx context.Context, objects store.Store, dataDir, who string) (catalog.Entry, string, error) {
	if d.Copy.Data != nil && len(d.SHA256s) == 1 && d.SHA256s[0] == d.Copy.SHA256 {
		e, err := catalog.New(objects, dataDir).Publish(ctx, d.Name, d.Copy.Data)
		if err != nil {
			return catalog.Entry{}, "", fmt.Errorf("put back tokenizer %s from %s: %w", d.Name, d.Copy.From, err)
		}
		said := fmt.Sprintf("tokenizer %s was deleted from object storage and this machine's data directory, but %s use it (sha256 %.12s): put back from %s, the copy run %s's checkpoint of step %d holds",
			d.Name, d.users(), d.Copy.SHA256, d.Copy.From, d.Runs[0], d.Copy.Step)
		return e, said, nil
	}
	hashes := make([]string, len(d.SHA256s))
	for i, s := range d.SHA256s {
		hashes[i] = fmt.Sprintf("%.12s", s)
	}
	from := "from a copy of it with that sha256 (each checkpoint of a run trained with it holds one, as " + CheckpointPrefix("<run>") + "step-NNNNNNN/tokenizer.json, and so does the disk of the worker that made the stores)"
	if d.Copy.Data != nil && len(d.SHA256s) == 1 {
		from = fmt.Sprintf("from %s (sha256 %.12s, as run %s's checkpoint of step %d records it)", d.Copy.From, d.Copy.SHA256, d.Runs[0], d.Copy.Step)
	}
	return catalog.Entry{}, "", &DeletedTokenizerError{fmt.Sprintf("%s uses tokenizer %s, which existed and was deleted from object storage and this machine's data directory: %s were made with it (sha256 %s): "+
		"put back %s, and beside it its %s ('sha256sum %s > %s'), %s, then run this again; "+
		"a tokenizer trained again under this name is another, which they refuse and which never gives way to this one",
		who, d.Name, d.users(), strings.Join(hashes, " or "),
		catalog.Key(d.Name), catalog.SumsFile, catalog.FileName, catalog.SumsFile, from)}
}

// DeletedTokenizerError is a tokenizer that stores or runs record and the
// catalog holds no more, which no checkpoint's copy could put back: it
// says how to put it back by hand. It is a person's to mend.
type DeletedTokenizerError struct{ msg string }

func (e *DeletedTokenizerError) Error() string { return e.msg }

// BadInput marks it as a person's to mend: no retry puts the tokenizer
// back.
func (e *DeletedTokenizerError) BadInput() bool { return true }
