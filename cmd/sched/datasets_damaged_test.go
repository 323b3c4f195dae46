package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/tokens"
)

// makeStore appends n tokens (every 10th an EOS, the last one too) as one
// shard to a new token store in dir, as an ingest leaves it.
func makeStore(t *testing.T, dir string, n int) {
	t.Helper()
	tok := tokens.Tokenizer{Name: "t", SHA256: strings.Repeat("ab", 32), VocabSize: 300, EOS: 0}
	a, err := tokens.OpenAppender(context.Background(), dir, tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ids := make([]byte, 2*n) // uint16 ids: a vocabulary of 300
	for i := range n {
		id := uint16(1 + i%299)
		if i%10 == 9 || i == n-1 {
			id = uint16(tok.EOS)
		}
		binary.LittleEndian.PutUint16(ids[2*i:], id)
	}
	if _, err := a.Append(context.Background(), tokens.ShardInfo{ID: "s", Revision: "r1"}, bytes.NewReader(ids)); err != nil {
		t.Fatal(err)
	}
}

// A store damaged outside kiln is listed as damaged, saying how in a few
// words and what to do, where it used to show its manifest's token count
// as if sched train could read it; the healthy store beside it reads as
// before, and the listing still exits 0.
func TestDatasetsShowsADamagedStoreAsSuch(t *testing.T) {
	t.Parallel()
	stores := t.TempDir()
	for _, name := range []string{"good", "cut", "garbled", "lost", "newer"} {
		makeStore(t, filepath.Join(stores, name), 5000)
	}
	out, errOut, code := sched(t, nil, "datasets", "--stores", stores)
	if code != 0 || !regexp.MustCompile(`(?m)^cut +5000 +1 +9\.8 KiB +r1 `).MatchString(out) {
		t.Fatalf("healthy stores: code %d\n%s\n%s", code, out, errOut)
	}
	healthy := regexp.MustCompile(`(?m)^good .*$`).FindString(out)

	os.Truncate(filepath.Join(stores, "cut", tokens.TokensFile), 1000)
	os.WriteFile(filepath.Join(stores, "garbled", tokens.ManifestFile), []byte("not json"), 0o644)
	os.Remove(filepath.Join(stores, "lost", tokens.TokensFile))
	newer := filepath.Join(stores, "newer", tokens.ManifestFile)
	m, _ := os.ReadFile(newer)
	os.WriteFile(newer, bytes.Replace(m, []byte(`"version": 1`), []byte(`"version": 9`), 1), 0o644)
	out, errOut, code = sched(t, nil, "datasets", "--stores", stores)
	if code != 0 || errOut != "" {
		t.Fatalf("a listing with damaged stores: code %d, stderr %q; want 0 and nothing", code, errOut)
	}
	for name, c := range map[string]struct{ size, damage string }{
		"cut":     {"1000 B", "tokens.bin is truncated (1000 of 10000 bytes)"},
		"garbled": {"9.8 KiB", "manifest.json does not parse"},
		"lost":    {"0 B", "tokens.bin is missing"},
	} {
		// No tokens, shards or commit to trust; the file's real size.
		want := "(?m)^" + name + " +- +- +" + c.size + " +- +damaged: " +
			regexp.QuoteMeta(c.damage+"; delete "+filepath.Join(stores, name)+", restart the worker that appends to it (at its start it records what its disk holds), then re-ingest it") + ".*$"
		line := regexp.MustCompile(`(?m)^` + name + ` .*$`).FindString(out)
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("%s: %q; want a line matching %q\n%s", name, line, want, out)
		}
	}
	// Another release's manifest is not damage: deleting the store would be
	// the wrong advice, and the error says which release reads it.
	if !regexp.MustCompile(`(?m)^newer +- +- +9\.8 KiB +- +unreadable store: .*version 9 is not supported.*use the kiln release that wrote the store`).MatchString(out) {
		t.Errorf("a store of another manifest version:\n%s", out)
	}
	if got := regexp.MustCompile(`(?m)^good .*$`).FindString(out); got != healthy || !strings.HasPrefix(out, "PRESET") {
		t.Errorf("the healthy store reads %q beside damaged ones, %q alone\n%s", got, healthy, out)
	}
}
