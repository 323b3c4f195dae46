package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

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
