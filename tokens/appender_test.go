package tokens

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var testTok = Tokenizer{Name: "test-1000", SHA256: strings.Repeat("ab", 32), VocabSize: 1000, EOS: 0}

// shardIDs returns a deterministic shard: documents of random ids in
// [1, vocab), each ended by eos. The same (seed, n) always gives the same ids.
func shardIDs(seed uint64, n int, vocab, eos uint32) []uint32 {
	r := rand.New(rand.NewPCG(seed, 7))
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = 1 + r.Uint32N(vocab-1)
		if r.IntN(50) == 0 {
			ids[i] = eos
		}
	}
	if n > 0 {
		ids[n-1] = eos
	}
	return ids
}

func openTestAppender(t *testing.T, dir string, tok Tokenizer) *Appender {
	t.Helper()
	a, err := OpenAppender(context.Background(), dir, tok, nil)
	if err != nil {
		t.Fatalf("OpenAppender: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func appendIDs(t *testing.T, a *Appender, id string, ids []uint32) AppendResult {
	t.Helper()
	res, err := a.Append(context.Background(), ShardInfo{ID: id, Source: "src/" + id, Revision: "rev1"}, bytes.NewReader(Encode(nil, a.m.Dtype, ids)))
	if err != nil {
		t.Fatalf("Append %s: %v", id, err)
	}
	return res
}

func readAll(t *testing.T, dir string) []int32 {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	out := make([]int32, s.Len())
	if err := s.read(0, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestAppendIsExactlyOnce(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	one := shardIDs(1, 500, 1000, 0)
	two := shardIDs(2, 300, 1000, 0)

	r1 := appendIDs(t, a, "one", one)
	if r1.Duplicate || r1.Shard.Offset != 0 || r1.Shard.Tokens != 500 {
		t.Fatalf("first append = %+v", r1)
	}
	again := appendIDs(t, a, "one", shardIDs(99, 800, 1000, 0))
	if !again.Duplicate || again.Shard != r1.Shard {
		t.Fatalf("second append of shard one = %+v, want a duplicate of %+v", again, r1.Shard)
	}
	r2 := appendIDs(t, a, "two", two)
	if r2.Shard.Offset != 500 {
		t.Fatalf("shard two offset = %d, want 500", r2.Shard.Offset)
	}
	a.Close()

	// A new appender (a retried task in another process) also sees it.
	b := openTestAppender(t, dir, testTok)
	if res := appendIDs(t, b, "two", two); !res.Duplicate {
		t.Fatalf("append of shard two after reopen was not a duplicate: %+v", res)
	}
	m := b.Manifest()
	if m.Tokens != 800 || len(m.Shards) != 2 {
		t.Fatalf("manifest: %d tokens, %d shards; want 800 and 2", m.Tokens, len(m.Shards))
	}
	var docs int64
	for _, id := range append(append([]uint32{}, one...), two...) {
		if id == 0 {
			docs++
		}
	}
	if m.Documents != docs {
		t.Fatalf("documents = %d, want %d", m.Documents, docs)
	}
	got := readAll(t, dir)
	for i, id := range append(one, two...) {
		if got[i] != int32(id) {
			t.Fatalf("token %d = %d, want %d", i, got[i], id)
		}
	}
	s, _ := Open(dir)
	defer s.Close()
	if err := s.Verify(context.Background()); err != nil {
		t.Fatalf("Verify: %v", err)
	}
}

func TestAppendTruncatesUncommittedTail(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	one := shardIDs(1, 100, 1000, 0)
	appendIDs(t, a, "one", one)
	a.Close()
	// The remains of an append killed before its manifest was renamed.
	f, err := os.OpenFile(filepath.Join(dir, TokensFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(bytes.Repeat([]byte{0xff}, 777))
	f.Close()
	if got := readAll(t, dir); len(got) != 100 {
		t.Fatalf("reader sees %d tokens, want the 100 committed", len(got))
	}
	b := openTestAppender(t, dir, testTok)
	two := shardIDs(2, 50, 1000, 0)
	appendIDs(t, b, "two", two)
	got := readAll(t, dir)
	want := append(one, two...)
	if len(got) != len(want) {
		t.Fatalf("%d tokens, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != int32(want[i]) {
			t.Fatalf("token %d = %d, want %d", i, got[i], want[i])
		}
	}
	st, _ := os.Stat(filepath.Join(dir, TokensFile))
	if st.Size() != 150*2 {
		t.Fatalf("tokens.bin is %d bytes, want %d", st.Size(), 300)
	}
}

func TestUint32StoreAboveVocab65536(t *testing.T) {
	dir := t.TempDir()
	tok := Tokenizer{Name: "big", SHA256: "ff", VocabSize: 100000, EOS: 99999}
	a := openTestAppender(t, dir, tok)
	ids := []uint32{70000, 5, 99998, 99999}
	appendIDs(t, a, "s", ids)
	if a.Manifest().Dtype != Uint32 {
		t.Fatalf("dtype = %s, want uint32", a.Manifest().Dtype)
	}
	got := readAll(t, dir)
	for i := range ids {
		if got[i] != int32(ids[i]) {
			t.Fatalf("token %d = %d, want %d", i, got[i], ids[i])
		}
	}
}

// An id outside the vocabulary is found wherever it sits, also past the
// appender's first read, and the error names its position in the shard; the
// document count and the final EOS check hold in both widths.
func TestAppendFindsAnIDPastTheVocabularyAnywhere(t *testing.T) {
	for _, tok := range []Tokenizer{testTok, {Name: "big", SHA256: "ff", VocabSize: 100000, EOS: 99999}} {
		dtype := DtypeFor(tok.VocabSize)
		n := 3*appendChunk/dtype.Width() + 7 // several reads, the last one partial
		ids := shardIDs(9, n, uint32(tok.VocabSize), uint32(tok.EOS))
		for _, at := range []int{0, appendChunk/dtype.Width() + 3, n - 2} {
			a := openTestAppender(t, t.TempDir(), tok)
			bad := slices.Clone(ids)
			bad[at] = uint32(tok.VocabSize) + 5
			_, err := a.Append(context.Background(), ShardInfo{ID: "x"}, bytes.NewReader(Encode(nil, dtype, bad)))
			want := fmt.Sprintf("token %d of the shard is id %d, outside the vocabulary of %d", at, tok.VocabSize+5, tok.VocabSize)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("%s store, bad id at %d of %d: error %v, want one saying %q", dtype, at, n, err, want)
			}
		}
		a := openTestAppender(t, t.TempDir(), tok)
		res, err := a.Append(context.Background(), ShardInfo{ID: "ok"}, bytes.NewReader(Encode(nil, dtype, ids)))
		if err != nil {
			t.Fatalf("%s store: %v", dtype, err)
		}
		var docs int64
		for _, id := range ids {
			if id == uint32(tok.EOS) {
				docs++
			}
		}
		if res.Shard.Documents != docs || res.Shard.Tokens != int64(n) {
			t.Fatalf("%s store: %d documents, %d tokens; want %d and %d", dtype, res.Shard.Documents, res.Shard.Tokens, docs, n)
		}
	}
}

// Encode writes the file's little-endian bytes whether it stores the ids in
// place (aligned, after four bytes) or one at a time (after three).
func TestEncodeIsLittleEndian(t *testing.T) {
	ids := []uint32{0, 1, 255, 256, 65535, 65536, 1 << 20, 1<<32 - 1}
	for _, d := range []Dtype{Uint16, Uint32} {
		in := ids
		if d == Uint16 {
			in = ids[:5]
		}
		for _, prefix := range [][]byte{{9, 9, 9, 9}, {9, 9, 9}} {
			want := append([]byte(nil), prefix...)
			for _, id := range in {
				if d == Uint16 {
					want = binary.LittleEndian.AppendUint16(want, uint16(id))
				} else {
					want = binary.LittleEndian.AppendUint32(want, id)
				}
			}
			if got := Encode(append([]byte(nil), prefix...), d, in); !bytes.Equal(got, want) {
				t.Fatalf("dtype %v after %d bytes: %v, want %v", d, len(prefix), got, want)
			}
		}
	}
}

func TestAppendRejectsBadInputAndKeepsTheStore(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	good := shardIDs(1, 64, 1000, 0)
	appendIDs(t, a, "good", good)
	before, _ := os.ReadFile(filepath.Join(dir, ManifestFile))

	cases := []struct {
		name  string
		info  ShardInfo
		bytes []byte
		want  []string
	}{
		{"id past vocab", ShardInfo{ID: "x"}, Encode(nil, Uint16, []uint32{5, 1000, 0}), []string{`"x"`, "id 1000", "vocabulary of 1000", "token 1"}},
		{"no final eos", ShardInfo{ID: "x"}, Encode(nil, Uint16, []uint32{5, 6}), []string{`"x"`, "EOS id 0"}},
		{"odd bytes", ShardInfo{ID: "x"}, append(Encode(nil, Uint16, []uint32{5, 0}), 1), []string{"whole number", "1 bytes left over"}},
		{"empty id", ShardInfo{}, Encode(nil, Uint16, []uint32{0}), []string{"shard id is empty"}},
		{"changed duplicate", ShardInfo{ID: "good", SHA256: "00"}, Encode(nil, Uint16, []uint32{0}), []string{`"good"`, "new id"}},
	}
	for _, c := range cases {
		_, err := a.Append(context.Background(), c.info, bytes.NewReader(c.bytes))
		if err == nil {
			t.Fatalf("%s: Append succeeded", c.name)
		}
		var ie *InputError
		if !errors.As(err, &ie) {
			t.Errorf("%s: %v is not an InputError", c.name, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error spans lines: %q", c.name, err)
		}
		// The same shard checked beforehand fails with the same error,
		// from CheckShard or from AppendChecked; a changed duplicate fails
		// its hash first, since CheckShard does not see the store.
		checked, cerr := CheckShard(dir, c.info, testTok, c.bytes)
		if cerr == nil {
			_, cerr = a.AppendChecked(context.Background(), checked)
		}
		var he *HashError
		if c.name == "changed duplicate" {
			if !errors.As(cerr, &he) {
				t.Errorf("%s: checked beforehand: %v, want a HashError", c.name, cerr)
			}
		} else if cerr == nil || cerr.Error() != err.Error() {
			t.Errorf("%s: checked beforehand the error is %v, Append's %v", c.name, cerr, err)
		}
	}
	after, _ := os.ReadFile(filepath.Join(dir, ManifestFile))
	if !bytes.Equal(before, after) {
		t.Fatal("a rejected append changed the manifest")
	}
	if got := readAll(t, dir); len(got) != len(good) {
		t.Fatalf("store holds %d tokens after rejected appends, want %d", len(got), len(good))
	}
	st, _ := os.Stat(filepath.Join(dir, TokensFile))
	if st.Size() != int64(2*len(good)) {
		t.Fatalf("tokens.bin is %d bytes, want the committed %d", st.Size(), 2*len(good))
	}
}

func TestAppendHonoursCancellation(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := a.Append(ctx, ShardInfo{ID: "x"}, bytes.NewReader(Encode(nil, Uint16, []uint32{0})))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Append with a cancelled context = %v", err)
	}
	if a.Manifest().Tokens != 0 {
		t.Fatal("a cancelled append committed tokens")
	}
}

func TestForeignTokenizerIsRefused(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	a.Close()
	other := testTok
	other.Name, other.SHA256 = "other", strings.Repeat("cd", 32)
	_, err := OpenAppender(context.Background(), dir, other, nil)
	if err == nil {
		t.Fatal("OpenAppender with another tokenizer succeeded")
	}
	for _, w := range []string{testTok.SHA256, other.SHA256, "test-1000", "other", "new store"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %q", err, w)
		}
	}
	sameSHA := testTok
	sameSHA.VocabSize = 2000
	if _, err := OpenAppender(context.Background(), dir, sameSHA, nil); err == nil || !strings.Contains(err.Error(), "vocab_size 1000") {
		t.Fatalf("OpenAppender with another vocabulary size = %v", err)
	}
	bad := testTok
	bad.EOS = 1000
	if _, err := OpenAppender(context.Background(), t.TempDir(), bad, nil); err == nil || !strings.Contains(err.Error(), "eos_id 1000") {
		t.Fatalf("OpenAppender with eos outside the vocabulary = %v", err)
	}
}

func TestSecondAppenderIsLockedOut(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	_, err := OpenAppender(context.Background(), dir, testTok, nil)
	var le *LockedError
	if !errors.As(err, &le) {
		t.Fatalf("second OpenAppender = %v, want a LockedError", err)
	}
	if le.PID != os.Getpid() || !strings.Contains(err.Error(), "locked by pid") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("lock error %q (pid %d) should name %s and pid %d", err, le.PID, dir, os.Getpid())
	}
	a.Close()
	b, err := OpenAppender(context.Background(), dir, testTok, nil)
	if err != nil {
		t.Fatalf("OpenAppender after Close: %v", err)
	}
	b.Close()
}

func TestSkipIsRecorded(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	appendIDs(t, a, "kept", []uint32{0})
	ctx := context.Background()
	s := Skipped{ID: "big.parquet", Source: "hf://x", Reason: "file exceeds 2 GB"}
	if err := a.Skip(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := a.Skip(ctx, s); err != nil {
		t.Fatalf("second Skip: %v", err)
	}
	if err := a.Skip(ctx, Skipped{ID: "kept", Reason: "x"}); err == nil {
		t.Fatal("skipping an appended shard succeeded")
	}
	if err := a.Skip(ctx, Skipped{ID: "y"}); err == nil || !strings.Contains(err.Error(), "reason") {
		t.Fatalf("Skip without a reason = %v", err)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Skipped) != 1 || m.Skipped[0] != s {
		t.Fatalf("skipped = %+v, want [%+v]", m.Skipped, s)
	}
	// The JSON names are part of the format.
	var raw map[string]any
	b, _ := os.ReadFile(filepath.Join(dir, ManifestFile))
	json.Unmarshal(b, &raw)
	for _, k := range []string{"format", "version", "dtype", "tokenizer", "tokens", "documents", "shards", "skipped"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("manifest.json has no %q", k)
		}
	}
}

func TestOrphanTokensFileIsNotOverwritten(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, TokensFile), []byte{1, 2, 3, 4}, 0o644)
	_, err := OpenAppender(context.Background(), dir, testTok, nil)
	if err == nil || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Fatalf("OpenAppender over an orphan tokens.bin = %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, TokensFile)); len(b) != 4 {
		t.Fatal("the orphan tokens.bin was changed")
	}
}

// A shard checked beforehand (CheckShard, AppendChecked) goes into the store
// exactly as Append puts it: the same records, the same bytes, once; a
// shard checked for another tokenizer is refused and changes nothing.
func TestAppendCheckedIsAppend(t *testing.T) {
	ctx := context.Background()
	streamed, checkedDir := t.TempDir(), t.TempDir()
	a, b := openTestAppender(t, streamed, testTok), openTestAppender(t, checkedDir, testTok)
	for i, n := range []int{1, 700, 5000, 100000} {
		id := fmt.Sprintf("shard-%d", i)
		data := Encode(nil, Uint16, shardIDs(uint64(i), n, 1000, 0))
		info := ShardInfo{ID: id, Source: "src/" + id, Revision: "rev1"}
		if _, err := a.Append(ctx, info, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		// Bytes at an odd address, as a slice of a larger buffer can be.
		odd := append([]byte{0}, data...)[1:]
		c, err := CheckShard(checkedDir, info, testTok, odd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.AppendChecked(ctx, c); err != nil {
			t.Fatal(err)
		}
		again, err := b.AppendChecked(ctx, c)
		if err != nil || !again.Duplicate {
			t.Fatalf("a second AppendChecked of %s: %+v, %v; want a duplicate", id, again, err)
		}
	}
	if !slices.Equal(a.Manifest().Shards, b.Manifest().Shards) || a.Manifest().Tokens != b.Manifest().Tokens ||
		a.Manifest().Documents != b.Manifest().Documents {
		t.Fatalf("checked beforehand the manifest differs:\n%+v\n%+v", b.Manifest(), a.Manifest())
	}
	x, _ := os.ReadFile(filepath.Join(streamed, TokensFile))
	y, _ := os.ReadFile(filepath.Join(checkedDir, TokensFile))
	if !bytes.Equal(x, y) {
		t.Fatal("checked beforehand tokens.bin differs")
	}

	other := testTok
	other.Name, other.SHA256 = "other", strings.Repeat("cd", 32)
	c, err := CheckShard(checkedDir, ShardInfo{ID: "foreign"}, other, Encode(nil, Uint16, []uint32{5, 0}))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(filepath.Join(checkedDir, ManifestFile))
	if _, err := b.AppendChecked(ctx, c); err == nil || !strings.Contains(err.Error(), "check it for this store") {
		t.Fatalf("a shard checked for another tokenizer: %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(checkedDir, ManifestFile))
	z, _ := os.ReadFile(filepath.Join(checkedDir, TokensFile))
	if !bytes.Equal(before, after) || !bytes.Equal(y, z) {
		t.Fatal("a refused AppendChecked changed the store")
	}
}

// Every file a store's directory holds after appends is one IsStoreFile
// names, and a file of another's is not.
func TestIsStoreFileNamesWhatAStoreHolds(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	appendIDs(t, a, "s1", shardIDs(1, 100, uint32(testTok.VocabSize), testTok.EOS))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !IsStoreFile(e.Name()) {
			t.Errorf("a store holds %s, which IsStoreFile does not name", e.Name())
		}
	}
	for _, other := range []string{"tokenizer.json", "trainer_state.json", "src"} {
		if IsStoreFile(other) {
			t.Errorf("IsStoreFile(%q) is true", other)
		}
	}
}
