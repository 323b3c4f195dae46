package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// killAfterCommitEnv makes TestHelperDirectKilledAfterCommit run a direct
// ingest of the local glob it names (store and data directories beside
// it) and SIGKILL itself as the store logs its first committed shard.
const killAfterCommitEnv = "KILN_TEST_KILL_AFTER_COMMIT"

func TestHelperDirectKilledAfterCommit(t *testing.T) {
	dir := os.Getenv(killAfterCommitEnv)
	if dir == "" {
		t.Skip("a helper process of TestAShardsSkippedDocumentsSurviveAKillAfterItsCommit")
	}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zapcore.DebugLevel)
	log := zap.New(zapcore.RegisterHooks(core, func(e zapcore.Entry) error {
		if e.Message == "appended shard" {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}))
	_, err := Direct(context.Background(), skipsDirect(t, dir, log))
	t.Fatalf("the ingest ended without committing a shard: %v", err)
}

// skipsDirect is the direct ingest of the files in dir/src into the store
// dir/store.
func skipsDirect(t testing.TB, dir string, log *zap.Logger) DirectOptions {
	glob := filepath.Join(dir, "src", "*.jsonl")
	return DirectOptions{Preset: Preset{Name: LocalPrefix + glob, Glob: glob, Columns: Columns{Text: "text"}}, Tokenizer: testTokenizer(t),
		TokenizerName: "test", StoreDir: filepath.Join(dir, "store"), DataDir: filepath.Join(dir, "data"), Logger: log}
}

// A direct ingest killed right after a shard's commit, and run again,
// leaves the store counting every document its files left out: the
// shard's count of them is committed with it, not after it, where a kill
// lost it for good (the run again takes the shard for done).
func TestAShardsSkippedDocumentsSurviveAKillAfterItsCommit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	const files = 3
	for f := range files {
		var b strings.Builder
		for d := range 20 {
			fmt.Fprintf(&b, `{"text":"file %d doc %d: func main() {}"}`+"\n", f, d)
		}
		b.WriteString(`{"text":""}` + "\n") // one empty document a file
		if err := os.WriteFile(filepath.Join(dir, "src", fmt.Sprintf("f%d.jsonl", f)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	child := exec.Command(os.Args[0], "-test.run=^TestHelperDirectKilledAfterCommit$")
	child.Env = append(os.Environ(), killAfterCommitEnv+"="+dir)
	out, err := child.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the ingest was not killed at its first commit: %v\n%s", err, out)
	}
	m, err := tokens.ReadManifest(filepath.Join(dir, "store"))
	if err != nil || len(m.Shards) != 1 {
		t.Fatalf("after the kill: %+v, %v", m, err)
	}

	rep, err := Direct(context.Background(), skipsDirect(t, dir, nil))
	if err != nil || rep.Appended != files-1 || rep.Duplicates != 1 {
		t.Fatalf("the ingest run again: %+v, %v", rep, err)
	}
	if m, err = tokens.ReadManifest(filepath.Join(dir, "store")); err != nil {
		t.Fatal(err)
	}
	counted := map[string]int64{}
	for _, s := range m.Skipped {
		counted[s.ID] += s.Count
	}
	for _, s := range m.Shards {
		if counted[s.ID] != 1 || m.Documents != files*20 {
			t.Errorf("shard %s (%s): %d documents left out recorded, want 1; skipped %+v", s.ID, s.Source, counted[s.ID], m.Skipped)
		}
	}
}

// A document with a word of megabytes (a run of spaces in generated text)
// is left out, counted as long-word, where merging it cost tens of bytes
// of memory a byte; the file's other documents go in as they are, and a
// document of a long but bounded word too.
func TestADocumentWithAWordOfMegabytesIsLeftOut(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	line := func(text string) string {
		b, _ := json.Marshal(map[string]string{"text": text})
		return string(b) + "\n"
	}
	huge := "x = 1\n" + strings.Repeat(" ", tokenizer.DefaultMaxWordBytes+1) + "\ny = 2\n"
	long := "x = 1\n" + strings.Repeat(" ", 64<<10) + "\ny = 2\n"
	body := line("package main") + line(huge) + line(long) + line("func f() {}")
	if err := os.WriteFile(filepath.Join(dir, "src", "f.jsonl"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	opt := skipsDirect(t, dir, nil)
	rep, err := Direct(context.Background(), opt)
	if err != nil || rep.Appended != 1 || rep.SkippedRecords[SkipLongWord] != 1 {
		t.Fatalf("an ingest of a file with a word of over 1 MiB: %+v, %v; want the file appended and one document left out as %s", rep, err, SkipLongWord)
	}
	st, err := tokens.Open(opt.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ids := make([]int32, st.Len())
	if err := st.Window(0, len(ids)-1, ids); err != nil {
		t.Fatal(err)
	}
	eos, _ := opt.Tokenizer.EOS()
	var want []int32
	for _, d := range []string{"package main", "", long, "func f() {}"} {
		for _, id := range append(opt.Tokenizer.Encode(d), eos) {
			want = append(want, int32(id))
		}
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("the store holds %d ids; want the 3 other documents' ids, the long one's EOS alone between them (%d)", len(ids), len(want))
	}
}

// A direct ingest reports a text file whose one document it skipped under
// that document's reason, too-large or invalid-utf8, and the store records
// it so; a JSON lines file of nothing but skipped lines is an empty-file.
func TestADirectIngestSkipsATextFileForItsDocumentsReason(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"a.txt":     "package main\n",
		"big.txt":   strings.Repeat("a", MaxTextFileBytes+1),
		"bin.txt":   "\xff\xfe\x00\x81\xc3\x28",
		"bad.jsonl": "{\"text\":\"\"}\n",
	} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opt := skipsDirect(t, dir, nil)
	glob := filepath.Join(src, "*")
	opt.Preset = Preset{Name: LocalPrefix + glob, Glob: glob, Columns: Columns{Text: "text"}}
	rep, err := Direct(context.Background(), opt)
	if err != nil || rep.Appended != 1 || rep.SkippedFiles.String() != "empty-file=1, invalid-utf8=1, too-large=1" || len(rep.SkippedRecords) != 0 {
		t.Fatalf("a direct ingest: %+v, %v; want a.txt appended and its other files skipped as empty-file=1, invalid-utf8=1, too-large=1", rep, err)
	}
	m, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]string{}
	for _, s := range m.Skipped {
		recorded[filepath.Base(s.Source)] = s.Reason
	}
	for name, want := range map[string]string{
		"big.txt":   "too-large: " + filepath.Join(src, "big.txt") + ": skipped (too-large): it is 67108865 bytes, over the 64 MiB",
		"bin.txt":   "invalid-utf8: " + filepath.Join(src, "bin.txt") + ": skipped (invalid-utf8): it is not UTF-8 text",
		"bad.jsonl": "empty-file: " + filepath.Join(src, "bad.jsonl") + ": skipped (empty-file): no usable documents (skipped: empty-document=1)",
	} {
		if !strings.HasPrefix(recorded[name], want) {
			t.Errorf("the store records %s as skipped for %q; want %q", name, recorded[name], want)
		}
	}
}
