package worker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/klauspost/compress/zstd"

	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// newLocalIngestEnv is an ingestEnv whose object store is the directory
// objects, as on a worker with no S3 endpoint (KILN_S3_ENDPOINT unset),
// with its tokenizer published there; it has no S3 server and no hub.
func newLocalIngestEnv(t *testing.T, objects string) *ingestEnv {
	e := &ingestEnv{env: newEnv(t)}
	var err error
	if e.objects, err = store.NewLocal(objects); err != nil {
		t.Fatal(err)
	}
	corpus := strings.Repeat("package main\nfunc main() { fmt.Println(\"hello, world\") }\nthe quick brown fox jumps over the lazy dog\n", 200)
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(corpus)}, tokenizer.TrainOptions{VocabSize: 320})
	if err != nil {
		t.Fatal(err)
	}
	if e.tok, err = tokenizer.Parse(b); err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.New(e.objects, t.TempDir()).Publish(context.Background(), ingestTokenizer, b); err != nil {
		t.Fatal(err)
	}
	return e
}

// A queued shard whose tokens fill the disk of a worker's local object
// store says how much of it had been written when the disk filled, and
// that its partial file is gone, as a direct ingest does: the room free
// after the store removed that file is the partial file's, where the
// message showed it alone and the disk looked nearly empty.
func TestAQueuedShardThatFillsALocalObjectStoreSaysHowMuchItHadWritten(t *testing.T) {
	const size = 128 << 10
	objects := testsvc.SmallDisk(t, size)
	e := newLocalIngestEnv(t, objects)
	root := t.TempDir()
	// Compressed, the file is a few KiB; its tokens are far more than the
	// disk holds.
	var b bytes.Buffer
	zw, _ := zstd.NewWriter(&b)
	for d := range 20000 {
		fmt.Fprintf(zw, `{"text":"doc %d: func main() { fmt.Println(\"hello, world\") }"}`+"\n", d)
	}
	zw.Close()
	if err := os.WriteFile(filepath.Join(root, "f.jsonl.zst"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	e.configureLocal(t.TempDir(), t.TempDir(), root)
	e.serve(map[string]int{scheduler.QueueIngest: 1})
	id := e.enqueue(scheduler.IngestPlan{Dataset: "local:" + filepath.Join(root, "*"), Store: ingestStore, Tokenizer: ingestTokenizer})
	e.waitFor(id, time.Minute, "completed", state("completed"))

	lastErr := e.failedShard(time.Minute)
	m := regexp.MustCompile(`no space left on the disk of (\S+) for the shard of \S+: the disk filled once at least (.+?) of it had been written, so it needs more room than that \(free there: (.+?), with its partial file since removed\)`).FindStringSubmatch(lastErr)
	if m == nil {
		t.Fatalf("a queued shard that fills its local object store: %q; want how much of it had been written, and that its partial file is removed", lastErr)
	}
	if !strings.HasPrefix(m[1], objects) {
		t.Errorf("the full disk is named %s; want the object store's, under %s", m[1], objects)
	}
	written, err := bytesize.Parse(m[2])
	if err != nil || written <= 0 || written > size {
		t.Fatalf("the shard had written %q (%d) of a %d KiB disk when it filled: %v", m[2], written, size>>10, err)
	}
	if free, err := bytesize.Parse(m[3]); err != nil || free > size {
		t.Fatalf("free there: %q (%d, %v)", m[3], free, err)
	}
}

// failedShard waits for the first ingest task that failed, to be retried
// or archived, and returns its error.
func (e *ingestEnv) failedShard(within time.Duration) string {
	e.t.Helper()
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		retry, _ := insp.ListRetryTasks(scheduler.QueueIngest)
		archived, _ := insp.ListArchivedTasks(scheduler.QueueIngest)
		for _, ti := range append(retry, archived...) {
			if ti.Type == (scheduler.IngestShard{}).Kind() && ti.LastErr != "" {
				return ti.LastErr
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("no shard task failed within %v", within)
	return ""
}
