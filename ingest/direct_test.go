package ingest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

type textRow struct {
	Text string `parquet:"text"`
}

func testTokenizer(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	corpus := strings.Repeat("func main() { fmt.Println(\"hello, world\") }\nthe quick brown fox\n", 200)
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(corpus)}, tokenizer.TrainOptions{VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func parquetBytes(t *testing.T, rows []textRow) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "x.parquet")
	writeParquet(t, p, rows, 3)
	b, _ := os.ReadFile(p)
	return b
}

func TestDirectIngestFromHub(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	h.BreakOnce = true
	h.RateLimited = 2
	const repo = "owner/corpus"
	var want []string
	for f := range 4 {
		var rows []textRow
		for d := range 5 {
			text := fmt.Sprintf("file %d doc %d: the quick brown fox", f, d)
			rows = append(rows, textRow{Text: text})
			want = append(want, text)
		}
		rows = append(rows, textRow{Text: "bad \xff utf8"})
		h.Add(repo, fmt.Sprintf("data/part-%d.parquet", f), parquetBytes(t, rows), true)
	}
	good := parquetBytes(t, []textRow{{Text: "x"}})
	h.Add(repo, "data/corrupt.parquet", append([]byte("not parquet at all"), good[len(good)-8:]...), true)
	h.Add(repo, "data/empty.parquet", nil, false)
	var z bytes.Buffer
	zw, _ := zstd.NewWriter(&z)
	for i := range 500 {
		fmt.Fprintf(zw, `{"text":"line %d of a file that will be cut short"}`+"\n", i)
	}
	zw.Close()
	h.Add(repo, "data/truncated.jsonl.zst", z.Bytes()[:z.Len()/2], true)
	h.Add(repo, "data/x/../../../escape.parquet", good, false)

	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	preset := Preset{Name: "test", Repo: repo, Revision: "main", Include: []string{"data/*", "data/*/*/*/*/*"}, Columns: Columns{Text: "text"}}
	storeDir, dataDir := t.TempDir(), t.TempDir()
	opt := DirectOptions{Preset: preset, Hub: hc, Tokenizer: testTokenizer(t), TokenizerName: "test", StoreDir: storeDir, DataDir: dataDir, Seed: 7}
	rep, err := Direct(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Appended != 4 || rep.Revision != h.Commit {
		t.Fatalf("report: %+v", rep)
	}
	wantSkips := Skips{SkipCorruptFile: 2, SkipEmptyFile: 1, SkipUnsafePath: 1}
	if rep.SkippedFiles.String() != wantSkips.String() || rep.SkippedRecords[SkipInvalidUTF8] != 4 {
		t.Fatalf("skipped files %v (want %v), records %v", rep.SkippedFiles, wantSkips, rep.SkippedRecords)
	}

	m, err := tokens.ReadManifest(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) != 4 || m.Documents != 20 {
		t.Fatalf("manifest: %d shards, %d documents", len(m.Shards), m.Documents)
	}
	for _, s := range m.Shards {
		if s.Revision != h.Commit {
			t.Fatalf("shard %s records revision %q, want the resolved commit", s.ID, s.Revision)
		}
	}
	reasons := map[string]bool{}
	for _, s := range m.Skipped {
		reasons[strings.SplitN(s.Reason, ":", 2)[0]] = true
	}
	for _, r := range []string{SkipCorruptFile, SkipEmptyFile, SkipUnsafePath, SkipInvalidUTF8} {
		if !reasons[r] {
			t.Errorf("the manifest does not record %s: %+v", r, m.Skipped)
		}
	}

	// The store decodes back to the documents, each followed by EOS.
	st, err := tokens.Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got := decodeStore(t, opt.Tokenizer, storeDir, m)
	for _, w := range want {
		if !strings.Contains(got, w+"\x00EOS") {
			t.Fatalf("the store lacks %q", w)
		}
	}
	if strings.Contains(got, "../") || strings.Contains(got, "bad ") {
		t.Fatal("skipped content reached the store")
	}

	// Nothing is left in the data directory, and a re-run appends nothing.
	var left []string
	filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("files left behind: %v", left)
	}
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 0 || rep.Duplicates != rep.Files {
		t.Fatalf("re-run: %+v, %v", rep, err)
	}
	if m2, _ := tokens.ReadManifest(storeDir); m2.Tokens != m.Tokens {
		t.Fatalf("re-run changed the store: %d tokens, was %d", m2.Tokens, m.Tokens)
	}
}

func TestDirectStopsAtMaxTokens(t *testing.T) {
	dir := t.TempDir()
	for i := range 5 {
		// Files of one size, each its own content: one shard each.
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.txt", i)), []byte(strings.Repeat("the quick brown fox ", 50)+strings.Repeat("x", i+1)+strings.Repeat("y", 5-i)), 0o644)
	}
	p, err := LookupPreset(nil, "local:"+filepath.Join(dir, "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	opt := DirectOptions{Preset: p, Tokenizer: testTokenizer(t), TokenizerName: "t", StoreDir: t.TempDir(), DataDir: t.TempDir()}
	rep, err := Direct(context.Background(), opt)
	if err != nil || rep.Appended != 5 {
		t.Fatalf("%+v %v", rep, err)
	}
	perFile := rep.Tokens / 5
	opt.StoreDir = t.TempDir()
	opt.MaxTokens = perFile*2 + perFile/2
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 2 || !strings.Contains(rep.Stopped, "--max-tokens") {
		t.Fatalf("max tokens: %+v %v", rep, err)
	}
	opt.StoreDir, opt.MaxTokens = t.TempDir(), 0
	opt.MaxDisk = perFile*2*3 - 1 // two-byte ids: one shard, its file and its copy fit; a second does not
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 1 || !strings.Contains(rep.Stopped, "--max-disk") {
		t.Fatalf("max disk: %+v %v", rep, err)
	}
}

func TestSafeJoin(t *testing.T) {
	for _, p := range []string{"../x", "a/../../x", "/etc/passwd", "..", ""} {
		if _, err := SafeJoin("/data", p); SkipReason(err) != SkipUnsafePath {
			t.Errorf("%q: want unsafe-path, got %v", p, err)
		}
	}
	if got, err := SafeJoin("/data", "a/b/../c.parquet"); err != nil || got != "/data/a/c.parquet" {
		t.Errorf("got %q %v", got, err)
	}
}

// decodeStore renders the committed tokens with EOS shown as "\x00EOS".
func decodeStore(t *testing.T, tok *tokenizer.Tokenizer, dir string, m *tokens.Manifest) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "tokens.bin"))
	if err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.EOS()
	var out strings.Builder
	var ids []uint32
	for i := int64(0); i < m.Tokens; i++ {
		id := uint32(b[2*i]) | uint32(b[2*i+1])<<8
		if id == eos {
			s, err := tok.Decode(ids)
			if err != nil {
				t.Fatal(err)
			}
			out.WriteString(s + "\x00EOS")
			ids = ids[:0]
			continue
		}
		ids = append(ids, id)
	}
	return out.String()
}
