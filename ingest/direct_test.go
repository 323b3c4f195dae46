package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"

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
	if left := filesUnder(t, dataDir); len(left) != 0 {
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
	// --max-disk bounds the store's tokens.bin, as through the queue:
	// two-byte ids, room for two and a half files' tokens.
	opt.StoreDir, opt.MaxTokens = t.TempDir(), 0
	opt.MaxDisk = perFile*2*2 + perFile
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 2 || !strings.Contains(rep.Stopped, "--max-disk") {
		t.Fatalf("max disk: %+v %v", rep, err)
	}
	if st, err := os.Stat(filepath.Join(opt.StoreDir, "tokens.bin")); err != nil || st.Size() > opt.MaxDisk {
		t.Fatalf("tokens.bin: %v, %v; want at most --max-disk %d bytes", st, err, opt.MaxDisk)
	}
	// The refusal is kept beside the store, so a run again at the same
	// limit stops before it lists or reads a file, saying the store is
	// full, and appends nothing.
	mark := filepath.Join(opt.StoreDir, FullMarkFile)
	if b, err := os.ReadFile(mark); err != nil || !strings.Contains(string(b), fmt.Sprintf(`"max_disk":%d`, opt.MaxDisk)) {
		t.Fatalf("the store's full mark: %q, %v; want it full at --max-disk %d", b, err, opt.MaxDisk)
	}
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 0 || rep.Files != 0 || !strings.Contains(rep.Stopped, fmt.Sprintf("full at --max-disk %d", opt.MaxDisk)) {
		t.Fatalf("max disk again: %+v %v; want a stop before any file, naming the store full", rep, err)
	}
	// A mark that cannot be read only costs the work it saved: the run
	// finds the limit at its first append, appends nothing, and marks the
	// store again.
	os.WriteFile(mark, []byte("{not json"), 0o644)
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 0 || rep.Files != 5 || !strings.Contains(rep.Stopped, "--max-disk") {
		t.Fatalf("max disk, mark unreadable: %+v %v", rep, err)
	}
	if b, err := os.ReadFile(mark); err != nil || !strings.Contains(string(b), fmt.Sprintf(`"max_disk":%d`, opt.MaxDisk)) {
		t.Fatalf("the store's full mark after an unreadable one: %q, %v", b, err)
	}
	// A larger limit appends the rest and the mark goes.
	opt.MaxDisk = 0
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 3 || rep.Stopped != "" {
		t.Fatalf("no limit after a full store: %+v %v; want the other 3 appended", rep, err)
	}
	if _, err := os.Stat(mark); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the full mark after appends with no limit: %v; want it gone", err)
	}
}

// Progress is told of each file as it is settled; a cancelled ingest keeps
// the shards it appended whole, leaves no shard files behind, and a re-run
// appends the rest.
func TestDirectProgressCancelAndResume(t *testing.T) {
	dir := t.TempDir()
	for i := range 6 {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.txt", i)), []byte(fmt.Sprintf("file %d: %s", i, strings.Repeat("the quick brown fox ", 40))), 0o644)
	}
	p, err := LookupPreset(nil, "local:"+filepath.Join(dir, "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen []int
	dataDir := t.TempDir()
	opt := DirectOptions{Preset: p, Tokenizer: testTokenizer(t), TokenizerName: "t", StoreDir: t.TempDir(), DataDir: dataDir,
		Progress: func(r Report) {
			seen = append(seen, r.Appended)
			if r.Appended == 2 {
				cancel()
			}
		}}
	rep, err := Direct(ctx, opt)
	if !errors.Is(err, context.Canceled) || rep.Appended != 2 || !slices.Equal(seen, []int{1, 2}) {
		t.Fatalf("cancelled ingest: %+v, %v, progress %v; want context.Canceled after 2 appended, progress 1, 2", rep, err, seen)
	}
	m, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil || len(m.Shards) != 2 || m.Documents != 2 {
		t.Fatalf("after the cancel the store holds %+v, %v; want 2 whole shards", m, err)
	}
	if left := filesUnder(t, dataDir); len(left) != 0 {
		t.Fatalf("files left behind: %v", left)
	}
	opt.Progress = nil
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 4 || rep.Duplicates != 2 || rep.Documents != 4 {
		t.Fatalf("re-run: %+v, %v; want the other 4 appended", rep, err)
	}
}

// A direct ingest reads what its glob names: a link that leads out of the
// glob's directory is refused, naming the file and what to do.
func TestDirectRefusesALinkOutOfItsGlob(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte("the quick brown fox"), 0o644)
	os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("not for the store"), 0o644)
	if err := os.Symlink(filepath.Join(outside, "secret.txt"), filepath.Join(dir, "b.txt")); err != nil {
		t.Skip(err)
	}
	p, err := LookupPreset(nil, "local:"+filepath.Join(dir, "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	storeDir := t.TempDir()
	_, err = Direct(context.Background(), DirectOptions{Preset: p, Tokenizer: testTokenizer(t), TokenizerName: "t", StoreDir: storeDir, DataDir: t.TempDir()})
	var pe *PresetError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "b.txt") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("got %v; want a bad-input error naming b.txt and %s", err, dir)
	}
	if _, err := os.Stat(filepath.Join(storeDir, "tokens.bin")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the refused ingest wrote a store: %v", err)
	}
}

func TestGlobRoot(t *testing.T) {
	for glob, want := range map[string]string{"/a/b/*.go": "/a/b", "/a/b/f*.go": "/a/b", "/a/*/c/*.go": "/a", "*.txt": ".", "d/[ab].txt": "d", "/a/b.txt": "/a/b.txt", "/a/{b,c}/*.go": "/a", "/a/**/*.go": "/a"} {
		if got := globRoot(glob); got != want {
			t.Errorf("globRoot(%q) = %q, want %q", glob, got, want)
		}
	}
}

func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var left []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	return left
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

// directIngestEnv makes TestHelperDirectIngest run a direct ingest: the
// variable holds the glob, the store directory and the data directory,
// one a line.
const directIngestEnv = "KILN_TEST_DIRECT_INGEST"

// TestHelperDirectIngest is a direct ingest of
// TestDirectRemovesWhatAKilledRunLeft: after its first append it prints
// "appended" and waits for its stdin to close, then ingests the rest.
func TestHelperDirectIngest(t *testing.T) {
	args := strings.Split(os.Getenv(directIngestEnv), "\n")
	if len(args) != 3 {
		t.Skip("a helper process of TestDirectRemovesWhatAKilledRunLeft")
	}
	p, err := LookupPreset(nil, LocalPrefix+args[0])
	if err != nil {
		t.Fatal(err)
	}
	first := true
	_, err = Direct(context.Background(), DirectOptions{Preset: p, Tokenizer: testTokenizer(t), TokenizerName: "t", StoreDir: args[1], DataDir: args[2],
		Progress: func(Report) {
			if first {
				first = false
				os.Stdout.WriteString("appended\n")
				io.Copy(io.Discard, os.Stdin)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
}

// A direct ingest killed by SIGKILL leaves its .shards-* directory, and
// the next run on the data directory removes it; a run alive beside it
// keeps its own, finishes into its store, and then removes it.
func TestDirectRemovesWhatAKilledRunLeft(t *testing.T) {
	src, dataDir := t.TempDir(), t.TempDir()
	for i := range 4 {
		os.WriteFile(filepath.Join(src, fmt.Sprintf("f%d.txt", i)), []byte(fmt.Sprintf("file %d: %s", i, strings.Repeat("the quick brown fox ", 40))), 0o644)
	}
	glob := filepath.Join(src, "*.txt")
	shardDirs := func() []string {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(dataDir, shardsPattern))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	run := func(store string) string { return directIngestEnv + "=" + glob + "\n" + store + "\n" + dataDir }

	killed := testsvc.StartChild(t, "TestHelperDirectIngest", run(filepath.Join(t.TempDir(), "killed")))
	killed.Kill(t)
	left := shardDirs()
	if len(left) != 1 {
		t.Fatalf("after the kill: %v; want the killed run's directory", left)
	}
	liveStore := filepath.Join(t.TempDir(), "live")
	live := testsvc.StartChild(t, "TestHelperDirectIngest", run(liveStore))
	var liveDir []string
	for _, d := range shardDirs() {
		if d != left[0] {
			liveDir = append(liveDir, d)
		}
	}
	if len(liveDir) != 1 {
		t.Fatalf("beside the killed run's %s: %v; want the live run's directory", left[0], shardDirs())
	}

	p, err := LookupPreset(nil, LocalPrefix+glob)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Direct(context.Background(), DirectOptions{Preset: p, Tokenizer: testTokenizer(t), TokenizerName: "t",
		StoreDir: filepath.Join(t.TempDir(), "next"), DataDir: dataDir})
	if err != nil || rep.Appended != 4 {
		t.Fatalf("the next run: %+v, %v", rep, err)
	}
	if got := shardDirs(); !slices.Equal(got, liveDir) {
		t.Fatalf("after the next run: %v; want only the live run's %v", got, liveDir)
	}

	live.Release(t)
	if got := shardDirs(); len(got) != 0 {
		t.Fatalf("after the live run ended: %v; want none", got)
	}
	if m, err := tokens.ReadManifest(liveStore); err != nil || len(m.Shards) != 4 {
		t.Fatalf("the live run's store: %+v, %v; want its 4 files", m, err)
	}
}

// A direct ingest into a store another process appends to stops before it
// downloads a file, naming the holder, instead of downloading and
// tokenizing its first files for an append that is refused; once the
// store is free it runs.
func TestADirectIngestIntoAHeldStoreStopsBeforeDownloading(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tok := testTokenizer(t)
	p, h := newCorpus(t, nil)
	for f := range 3 {
		h.Add(corpusRepo, fmt.Sprintf("data/part-%d.parquet", f), parquetBytes(t, []textRow{{Text: fmt.Sprintf("file %d: func main() {}", f)}}), true)
	}
	opt := DirectOptions{Preset: p.Presets["corpus"], Hub: p.Hub, Tokenizer: tok, TokenizerName: "test",
		StoreDir: filepath.Join(t.TempDir(), "code"), DataDir: t.TempDir(), Seed: 3, MaxFiles: 1}
	if _, err := Direct(ctx, opt); err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.EOS()
	other, err := tokens.OpenAppender(ctx, opt.StoreDir, tokens.Tokenizer{Name: "test", SHA256: tok.SHA256(), VocabSize: tok.VocabSize(), EOS: eos}, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := len(h.Requests())
	opt.MaxFiles = 0
	var locked *tokens.LockedError
	if _, err := Direct(ctx, opt); !errors.As(err, &locked) || locked.PID != os.Getpid() {
		t.Fatalf("a direct ingest into a store another appender holds: %v; want it locked by pid %d", err, os.Getpid())
	}
	for _, r := range h.Requests()[before:] {
		if strings.Contains(r.Path, "/resolve/") || r.Host == "cdn" {
			t.Fatalf("the refused ingest downloaded %s", r.Path)
		}
	}
	other.Close()
	rep, err := Direct(ctx, opt)
	if err != nil || rep.Appended != 2 || rep.Duplicates != 1 {
		t.Fatalf("the ingest once the store is free: %+v, %v", rep, err)
	}
}

// "**" in a local glob matches any number of directories, none included,
// as a user who names a source tree so expects; a link to a directory is
// not followed there, so that a link back up ends the walk.
func TestPlanOfALocalGlobWalksDirectoriesWithTwoStars(t *testing.T) {
	dir := t.TempDir()
	var want []string
	for _, f := range []string{"top.go", "a/one.go", "a/b/two.go", "a/b/c/three.go", "a/b/notes.txt"} {
		p := filepath.Join(dir, filepath.FromSlash(f))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("package x\n"), 0o644)
		if strings.HasSuffix(f, ".go") {
			want = append(want, p)
		}
	}
	if err := os.Symlink(dir, filepath.Join(dir, "a", "b", "up")); err != nil {
		t.Fatal(err)
	}
	p, err := LookupPreset(nil, "local:"+filepath.Join(dir, "**", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	planned, err := Plan(context.Background(), p, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range planned.Files {
		got = append(got, f.Path)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s planned %v, want %v", p.Glob, got, want)
	}
}

// A var value that matches no file (language=Golang where the dataset's
// directory is Go) is refused, naming it: the plan of the other values
// alone would leave that part out of the store for good without a word.
// The values that do match plan as before, and the check says the same.
func TestPlanRefusesAVarValueThatMatchesNoFile(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	const repo = "owner/stack"
	for _, lang := range []string{"Python", "Go"} {
		for f := range 2 {
			h.Add(repo, fmt.Sprintf("data/%s/train-%d.parquet", lang, f), parquetBytes(t, []textRow{{Text: lang + " code"}}), true)
		}
	}
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	base := Preset{Name: "stack", Repo: repo, Revision: "main", Include: []string{"data/{language}/*.parquet"},
		Vars: map[string][]string{"language": {"*"}}, Columns: Columns{Text: "text"}}
	ctx := context.Background()
	for _, c := range []struct {
		values []string
		files  int
		miss   string
	}{
		{[]string{"Python", "Go"}, 4, ""},
		{[]string{"*"}, 4, ""},
		{[]string{"Python", "Golang"}, 0, "language=Golang matched no file (data/Golang/*.parquet; the other values match 2)"},
		{[]string{"Rust", "Go", "Pyton"}, 0, "language=Rust, language=Pyton matched no file (data/Rust/*.parquet, data/Pyton/*.parquet; the other values match 2)"},
		// A value alone is named too, not blamed on the preset.
		{[]string{"Golang"}, 0, "language=Golang matched no file (data/Golang/*.parquet): check the spelling against " + h.Server.URL + "/datasets/" + repo + "/tree/"},
	} {
		p, err := base.WithVars(map[string][]string{"language": c.values})
		if err != nil {
			t.Fatal(err)
		}
		planned, err := Plan(ctx, p, hc, 0)
		_, cerr := Check(ctx, p, hc)
		var pe *PresetError
		switch {
		case c.miss == "" && (err != nil || len(planned.Files) != c.files):
			t.Errorf("language=%v: planned %d files, %v; want %d", c.values, len(planned.Files), err, c.files)
		case c.miss != "" && (!errors.As(err, &pe) || !strings.Contains(err.Error(), c.miss) || !strings.Contains(err.Error(), "/datasets/"+repo+"/tree/")):
			t.Errorf("language=%v: %v; want a preset error saying %q and where the files are", c.values, err, c.miss)
		case (err == nil) != (cerr == nil):
			t.Errorf("language=%v: the plan says %v, the check %v", c.values, err, cerr)
		}
	}
}

// Files ingested with a column they do not have are recorded as skipped
// (missing-column), and an ingest with the right column takes them into
// the same store, which then records none of them as skipped. Before, the
// store held them as done: the second ingest took nothing, and the store
// stayed empty until it was deleted.
func TestFilesSkippedForTheirColumnAreTakenWithTheRightOne(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	const repo = "owner/code"
	for f := range 3 {
		h.Add(repo, fmt.Sprintf("data/part-%d.parquet", f), parquetBytes(t, []textRow{{Text: fmt.Sprintf("file %d", f)}}), true)
	}
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	storeDir := t.TempDir()
	opt := DirectOptions{Preset: Preset{Name: "code", Repo: repo, Revision: "main", Include: []string{"data/*"}, Columns: Columns{Text: "content"}},
		Hub: hc, Tokenizer: testTokenizer(t), TokenizerName: "test", StoreDir: storeDir, DataDir: t.TempDir(), Seed: 1}
	rep, err := Direct(context.Background(), opt)
	if err != nil || rep.Appended != 0 || rep.SkippedFiles.String() != (Skips{SkipMissingColumn: 3}).String() {
		t.Fatalf("ingest of column content: %+v, %v; want its 3 files skipped for the column", rep, err)
	}
	opt.Preset.Columns.Text = "text"
	rep, err = Direct(context.Background(), opt)
	if err != nil || rep.Appended != 3 {
		t.Fatalf("ingest of column text into the same store: %+v, %v; want its 3 files appended", rep, err)
	}
	m, err := tokens.ReadManifest(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) != 3 || len(m.Skipped) != 0 {
		t.Errorf("the store holds %d files and records %+v as skipped; want 3 and none", len(m.Shards), m.Skipped)
	}
}
