package tokens

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// newStore writes a store of the given shards and returns its directory.
func newStore(t *testing.T, tok Tokenizer, shards ...[]uint32) string {
	t.Helper()
	dir := t.TempDir()
	a, err := OpenAppender(context.Background(), dir, tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, ids := range shards {
		appendIDs(t, a, "s"+string(rune('a'+i)), ids)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// wantDamage checks the short phrase a listing shows for err's store, ""
// for a store that is not damaged.
func wantDamage(t *testing.T, err error, damage string) {
	t.Helper()
	var ie *InputError
	if !errors.As(err, &ie) {
		t.Errorf("%v is not an InputError", err)
	} else if ie.Damage != damage {
		t.Errorf("%v: damage %q, want %q", err, ie.Damage, damage)
	}
}

func wantInputError(t *testing.T, err error, mentions ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", mentions)
	}
	var ie *InputError
	if !errors.As(err, &ie) {
		t.Errorf("%v is not an InputError", err)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("error %q does not mention %q", err, m)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error spans lines: %q", err)
	}
}

func TestWindowsAreDisjointSpansOfSeqLenPlusOne(t *testing.T) {
	ids := make([]uint32, 23)
	for i := range ids {
		ids[i] = uint32(i + 1)
	}
	ids[22] = 0
	dir := newStore(t, testTok, ids)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Len() != 23 {
		t.Fatalf("Len = %d", s.Len())
	}
	// 23 tokens hold five windows of 4 (seq_len 3); the last 3 are unused.
	if got := s.Windows(3); got != 5 {
		t.Fatalf("Windows(3) = %d, want 5", got)
	}
	dst := make([]int32, 4)
	if err := s.Window(2, 3, dst); err != nil {
		t.Fatal(err)
	}
	if want := []int32{9, 10, 11, 12}; !slices.Equal(dst, want) {
		t.Fatalf("window 2 = %v, want %v", dst, want)
	}
	if err := s.Window(5, 3, dst); err == nil {
		t.Fatal("window 5 of 5 was read")
	}
	if err := s.Window(0, 3, dst[:3]); err == nil {
		t.Fatal("a buffer of seq_len ids was accepted")
	}
}

func TestOpenRejectsCorruptManifest(t *testing.T) {
	dir := newStore(t, testTok, shardIDs(1, 100, 1000, 0))
	path := filepath.Join(dir, ManifestFile)
	good, _ := os.ReadFile(path)

	os.WriteFile(path, good[:len(good)/2], 0o644)
	_, err := Open(dir)
	wantInputError(t, err, dir, "manifest.json is corrupt", "restore")
	wantDamage(t, err, "manifest.json does not parse")
	// The appender refuses too, rather than start a fresh store over it.
	_, err = OpenAppender(context.Background(), dir, testTok, nil)
	wantInputError(t, err, "corrupt")

	os.WriteFile(path, []byte(strings.Replace(string(good), `"tokens": 100`, `"tokens": 101`, 1)), 0o644)
	_, err = Open(dir)
	wantInputError(t, err, "inconsistent", "shards hold 100 tokens but 101 are committed")
	wantDamage(t, err, "manifest.json is inconsistent")

	os.WriteFile(path, []byte(strings.Replace(string(good), `"version": 1`, `"version": 9`, 1)), 0o644)
	_, err = Open(dir)
	wantInputError(t, err, "version 9 is not supported")
	wantDamage(t, err, "") // another release's store, not a damaged one

	os.Remove(path)
	_, err = Open(dir)
	wantInputError(t, err, "has no manifest.json", "sched enqueue ingest", "copy the store's folder from the machine that ingested it")

	// A file named as a store, and a store whose manifest is a directory.
	file := filepath.Join(t.TempDir(), "all.txt")
	os.WriteFile(file, []byte("text"), 0o644)
	_, err = Open(file)
	wantInputError(t, err, "token store "+file+" is not a token store's directory", "name a directory that an ingest filled")
	wantDamage(t, err, "")
	os.Mkdir(path, 0o755)
	_, err = Open(dir)
	wantInputError(t, err, "is not a token store's directory")
}

func TestOpenRejectsShortTokensFile(t *testing.T) {
	dir := newStore(t, testTok, shardIDs(1, 100, 1000, 0))
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(dir, m); err != nil {
		t.Fatalf("CheckFile of a whole store: %v", err)
	}
	os.Truncate(filepath.Join(dir, TokensFile), 150)
	_, err = Open(dir)
	wantInputError(t, err, dir, "holds 150 bytes", "commits 100 tokens (200 bytes)")
	wantDamage(t, err, "tokens.bin is truncated (150 of 200 bytes)")
	_, err = OpenAppender(context.Background(), dir, testTok, nil)
	wantInputError(t, err, "holds 150 bytes")
	// CheckFile finds what Open does, without reading an id.
	err = CheckFile(dir, m)
	wantInputError(t, err, dir, "holds 150 bytes", "commits 100 tokens (200 bytes)")
	wantDamage(t, err, "tokens.bin is truncated (150 of 200 bytes)")

	os.Remove(filepath.Join(dir, TokensFile))
	for _, err := range []error{CheckFile(dir, m), func() error { _, err := Open(dir); return err }()} {
		wantInputError(t, err, dir, "the manifest commits 100 tokens, so the file must exist")
		wantDamage(t, err, "tokens.bin is missing")
	}
	// A store that commits nothing needs no file.
	if err := CheckFile(dir, &Manifest{Dtype: m.Dtype}); err != nil {
		t.Errorf("CheckFile of a store that commits nothing: %v", err)
	}
}

// corruptID overwrites the uint16 id at token p, as a foreign tokenizer or
// a damaged disk would.
func corruptID(t *testing.T, dir string, p int64, id uint16) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, TokensFile), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(binary.LittleEndian.AppendUint16(nil, id), p*2); err != nil {
		t.Fatal(err)
	}
}

func TestIDsPastTheVocabulary(t *testing.T) {
	// Sampled at Open: the first span is always read.
	dir := newStore(t, testTok, shardIDs(1, 100_000, 1000, 0))
	corruptID(t, dir, 17, 4000)
	_, err := Open(dir)
	wantInputError(t, err, dir, "token 17 is id 4000", "vocabulary of 1000", "re-ingest")

	// Between the samples: Open passes, the window that holds it fails.
	dir = newStore(t, testTok, shardIDs(1, 1_000_000, 1000, 0))
	const p = 500_000 + 11
	corruptID(t, dir, p, 1000)
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v (position %d should fall between the sampled spans)", err, p)
	}
	defer s.Close()
	dst := make([]int32, 1025)
	if err := s.Window(p/1025, 1024, dst); err == nil {
		t.Fatal("a window holding id 1000 was read")
	} else {
		wantInputError(t, err, "token 500011 is id 1000")
	}
	if err := s.Window(0, 1024, dst); err != nil {
		t.Fatalf("a clean window: %v", err)
	}
	wantInputError(t, s.Verify(context.Background()), "token 500011 is id 1000")
}

func TestVerifyFindsDamagedShard(t *testing.T) {
	dir := newStore(t, testTok, shardIDs(1, 100, 1000, 0), shardIDs(2, 100, 1000, 0))
	corruptID(t, dir, 150, 3) // a valid id, but not the one appended
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantInputError(t, s.Verify(context.Background()), `shard "sb"`, "tokens 100 to 200", "damaged")
}

func TestEmptyStoreOpens(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	a.Close()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Len() != 0 || s.Windows(8) != 0 {
		t.Fatalf("empty store: Len %d, Windows %d", s.Len(), s.Windows(8))
	}
}

func TestStoreKilledDuringCreation(t *testing.T) {
	// Both states a kill can leave: tokens.bin alone, and a manifest whose
	// empty tokens.bin is missing.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, TokensFile), nil, 0o644)
	a := openTestAppender(t, dir, testTok)
	a.Close()
	os.Remove(filepath.Join(dir, TokensFile))
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open of an empty store without tokens.bin: %v", err)
	}
	s.Close()
	b := openTestAppender(t, dir, testTok)
	appendIDs(t, b, "one", []uint32{7, 0})
	if got := readAll(t, dir); !slices.Equal(got, []int32{7, 0}) {
		t.Fatalf("store holds %v", got)
	}
}

func TestReaderKeepsItsViewWhileTheStoreGrows(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	one := shardIDs(1, 1000, 1000, 0)
	appendIDs(t, a, "one", one)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	appendIDs(t, a, "two", shardIDs(2, 5000, 1000, 0))
	if s.Len() != 1000 {
		t.Fatalf("an open store's Len went from 1000 to %d", s.Len())
	}
	dst := make([]int32, 100)
	if err := s.Window(9, 99, dst); err != nil {
		t.Fatal(err)
	}
	for j := range dst {
		if dst[j] != int32(one[900+j]) {
			t.Fatalf("window 9 token %d = %d, want %d", j, dst[j], one[900+j])
		}
	}
	if got := readAll(t, dir); len(got) != 6000 {
		t.Fatalf("a store opened after the append holds %d tokens, want 6000", len(got))
	}
}
