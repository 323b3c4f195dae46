package ingest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
)

// A watch of the stores mends the status of a store that went (its
// directory or its manifest deleted) or whose directory was replaced
// since it last looked, also one made and deleted between two looks that
// an append told it of; a store that stays, or appears, is left alone,
// and after Stop nothing is mended.
func TestAWatchMendsTheStatusOfAStoreThatWent(t *testing.T) {
	ctx := context.Background()
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir()}
	tok := tokens.Tokenizer{Name: "t", SHA256: strings.Repeat("ab", 32), VocabSize: 300, EOS: 0}
	// fill makes store name hold files ids, as appends leave it: the
	// manifest and the status that says so.
	fill := func(name string, ids ...string) {
		t.Helper()
		a, err := tokens.OpenAppender(ctx, filepath.Join(p.StoresDir, name), tok, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		for _, id := range ids {
			if _, err := a.Append(ctx, tokens.ShardInfo{ID: id}, bytes.NewReader([]byte{1, 0, 0, 0})); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.publishStatus(ctx, name, a.Manifest(), Limits{}, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	done := func(name string) string {
		t.Helper()
		st, err := p.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(st.Done, ",")
	}
	check := func(w *StoresWatch, want ...string) {
		t.Helper()
		rs, err := w.Check(ctx)
		var got []string
		for _, r := range rs {
			got = append(got, r.Store)
		}
		if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("Check mended %v, %v; want %v", got, err, want)
		}
	}

	for _, name := range []string{"kept", "gone", "nomanifest", "replaced"} {
		fill(name, "a", "b")
	}
	w := p.WatchStores()
	fill("new", "a")
	check(w) // nothing went
	os.RemoveAll(filepath.Join(p.StoresDir, "gone"))
	os.Remove(filepath.Join(p.StoresDir, "nomanifest", tokens.ManifestFile))
	os.Rename(filepath.Join(p.StoresDir, "replaced"), filepath.Join(t.TempDir(), "old"))
	fill("replaced", "c")
	check(w, "gone", "nomanifest") // the other replaced one's append published its status
	for name, want := range map[string]string{"kept": "a,b", "gone": "", "nomanifest": "", "replaced": "c", "new": "a"} {
		if got := done(name); got != want {
			t.Errorf("store %s's status lists %q; want %q", name, got, want)
		}
	}

	// A store replaced by one whose status no append published.
	os.Rename(filepath.Join(p.StoresDir, "kept"), filepath.Join(t.TempDir(), "old"))
	a, err := tokens.OpenAppender(ctx, filepath.Join(p.StoresDir, "kept"), tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Append(ctx, tokens.ShardInfo{ID: "d"}, bytes.NewReader([]byte{1, 0, 0, 0}))
	a.Close()
	// A store made and deleted between two looks is known to the watch
	// only by an append's word.
	fill("brief", "a")
	os.RemoveAll(filepath.Join(p.StoresDir, "brief"))
	check(w, "kept")
	if got := done("kept"); got != "d" {
		t.Errorf("the store replaced has a status listing %q; want d", got)
	}
	fill("brief", "a")
	w.Saw("brief")
	os.RemoveAll(filepath.Join(p.StoresDir, "brief"))
	check(w, "brief")
	check(w)

	w.Stop()
	os.RemoveAll(filepath.Join(p.StoresDir, "new"))
	check(w)
	if got := done("new"); got != "a" {
		t.Errorf("a watch stopped mended a status: %q", got)
	}
}
