package ingest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// changeLines are the documents of changedJSONL: a file over two copy
// chunks, so that a change after the first chunk is read changes what
// the rest of the read sees.
const changeLines = 2400

// changedJSONL is n JSON lines from line first, each about 1 KB.
func changedJSONL(first, n int) []byte {
	var b strings.Builder
	for i := first; i < first+n; i++ {
		fmt.Fprintf(&b, `{"text":"doc %05d: %s"}`+"\n", i, strings.Repeat("the quick brown fox ", 50))
	}
	return []byte(b.String())
}

// fileChange is a change made to a file on the disk while it is read for
// its shard: cut short at half its lines, or grown by a quarter more. The
// file is then settled: the cut one put back whole (the content its
// ingest was planned with), the grown one left grown (other content).
type fileChange struct {
	name string
	// make changes the file at path, whose content was planned.
	make func(t *testing.T, path string)
	// settle puts the file as it stays.
	settle func(t *testing.T, path string)
	// docs is how many documents the settled file holds.
	docs int64
	// planned: the settled file holds the content planned.
	planned bool
}

var fileChanges = []fileChange{
	{name: "cut short", planned: true, docs: changeLines,
		make: func(t *testing.T, path string) {
			if err := os.Truncate(path, int64(len(changedJSONL(0, changeLines/2)))); err != nil {
				t.Error(err)
			}
		},
		settle: func(t *testing.T, path string) {
			if err := os.WriteFile(path, changedJSONL(0, changeLines), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	{name: "grown", docs: changeLines + changeLines/4,
		make: func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if _, err := f.Write(changedJSONL(changeLines, changeLines/4)); err != nil {
				t.Error(err)
			}
		},
		settle: func(*testing.T, string) {}},
}

// stageNames says where each readStage is, for the subtests' names.
var stageNames = map[readStage]string{readCopying: "while it is copied", readCopied: "once its copy is checked"}

// changeAt is an onRead hook that makes c, once, to the file at path when
// its read reaches stage; changed says whether it has.
func changeAt(t *testing.T, stage readStage, path string, c fileChange) (hook func(readStage, string), changed func() bool) {
	var once sync.Once
	done := false
	hook = func(s readStage, p string) {
		if s == stage && p == path {
			once.Do(func() { c.make(t, path); done = true })
		}
	}
	changed = func() bool {
		once.Do(func() {}) // after a change made, and no change after it
		return done
	}
	return hook, changed
}

// checkChangedWhileRead checks that err is the file's change while it was
// read, which a later try may get past.
func checkChangedWhileRead(t *testing.T, err error, path string) {
	t.Helper()
	var changed *ChangedFileError
	if !errors.As(err, &changed) || changed.BadInput() {
		t.Fatalf("the read of %s, changed meanwhile: %v; want a ChangedFileError to try again", path, err)
	}
	for _, w := range []string{"local file " + path + " changed while it was read", "when planned", "run the ingest again once nothing writes to it"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error %q does not say %q", err, w)
		}
	}
}

// checkHeldWhole checks that the store in dir holds one shard, of docs
// documents, the file's content as it was settled.
func checkHeldWhole(t *testing.T, dir string, docs int64) {
	t.Helper()
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) != 1 || m.Documents != docs || !m.Input(m.Shards[0].ID).Whole {
		t.Fatalf("the store holds %d documents in %d shards (%+v); want the settled file's %d in one", m.Documents, len(m.Shards), m.Shards, docs)
	}
}

// checkNotHeld checks that the store in dir holds nothing.
func checkNotHeld(t *testing.T, dir string) {
	t.Helper()
	m, err := tokens.ReadManifest(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if m.Documents != 0 || len(m.Shards) != 0 || len(m.Skipped) != 0 {
		t.Fatalf("the store holds %d documents in %d shards and %d skipped files of a file changed while it was read; want none", m.Documents, len(m.Shards), len(m.Skipped))
	}
}

// A local file cut short or grown while an ingest through the queue reads
// it is not stored: before, its shard held the bytes read under the id of
// the content planned, so that a file cut short stored half its documents
// for good (the intact file, ingested again, was "already in the store")
// and a grown one stored its documents twice (once under the old id, once
// under the new). The shard fails to be tried again, its object never
// made; a retry of the file put back reads it whole, and of the file left
// grown says to plan it again, which reads it whole.
func TestALocalFileChangedWhileQueuedShardReadsItIsNotStored(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	for _, stage := range []readStage{readCopying, readCopied} {
		for i, c := range fileChanges {
			t.Run(c.name+" "+stageNames[stage], func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				dir := t.TempDir()
				path := filepath.Join(dir, "big.jsonl")
				if err := os.WriteFile(path, changedJSONL(0, changeLines), 0o644); err != nil {
					t.Fatal(err)
				}
				storeName := fmt.Sprintf("s%d-%d", stage, i)
				hook, changed := changeAt(t, stage, path, c)
				p := &Pipeline{Objects: objects, DataDir: filepath.Join(dir, "data"), StoresDir: filepath.Join(dir, "stores"), LocalRoots: []string{dir},
					Tokenizer: func(context.Context, string) (*tokenizer.Tokenizer, error) { return tok, nil }, onRead: hook}
				plan := func() ShardJob {
					t.Helper()
					res, err := p.Plan(ctx, PlanJob{Dataset: "local:" + filepath.Join(dir, "*.jsonl"), Store: storeName, Tokenizer: "t"})
					if err != nil || len(res.Shards) != 1 {
						t.Fatalf("plan: %+v, %v; want one shard", res, err)
					}
					return res.Shards[0]
				}
				job := plan()
				_, _, err := p.Shard(ctx, job, nil)
				if !changed() {
					t.Fatal("the file was not changed while it was read")
				}
				checkChangedWhileRead(t, err, path)
				if list, err := objects.List(ctx, ShardPrefix(storeName)); err != nil || len(list) != 0 {
					t.Fatalf("shard objects after the read of a changed file: %v, %v; want none", list, err)
				}
				if left, _ := os.ReadDir(filepath.Join(p.DataDir, "raw", storeName)); len(left) != 0 {
					t.Fatalf("the copy of the file is left in the data directory: %v", left)
				}

				c.settle(t, path)
				out, _, err := p.Shard(ctx, job, nil)
				if !c.planned {
					// The plan names the content before the change: the
					// task's retries cannot read the file, and say to plan
					// it again.
					var e *ChangedFileError
					if !errors.As(err, &e) || !e.BadInput() || !strings.Contains(err.Error(), "changed since its ingest was planned") ||
						!strings.Contains(err.Error(), "run the ingest again (sched enqueue ingest, or sched ingest --direct), which plans the file as it is now") {
						t.Fatalf("a retry of the shard of the file left grown: %v; want bad input saying to plan it again", err)
					}
					out, _, err = p.Shard(ctx, plan(), nil)
				}
				if err != nil {
					t.Fatalf("the shard of the settled file: %v", err)
				}
				if _, err := p.Append(ctx, out, nil); err != nil {
					t.Fatal(err)
				}
				checkHeldWhole(t, filepath.Join(p.StoresDir, storeName), c.docs)
			})
		}
	}
}

// A direct ingest of a local file cut short or grown while it is read
// stops saying so, and stores nothing of it: before, it stored the bytes
// read under the id of the content planned. Run again once the file is
// settled, it stores the file whole.
func TestALocalFileChangedWhileADirectIngestReadsItIsNotStored(t *testing.T) {
	t.Parallel()
	tok := testTokenizer(t)
	for _, stage := range []readStage{readCopying, readCopied} {
		for _, c := range fileChanges {
			t.Run(c.name+" "+stageNames[stage], func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				dir := t.TempDir()
				path := filepath.Join(dir, "big.jsonl")
				if err := os.WriteFile(path, changedJSONL(0, changeLines), 0o644); err != nil {
					t.Fatal(err)
				}
				p, err := LookupPreset(nil, "local:"+filepath.Join(dir, "*.jsonl"))
				if err != nil {
					t.Fatal(err)
				}
				storeDir := filepath.Join(t.TempDir(), "s")
				hook, changed := changeAt(t, stage, path, c)
				opt := DirectOptions{Preset: p, Tokenizer: tok, TokenizerName: "t", StoreDir: storeDir, DataDir: t.TempDir(), onRead: hook}
				_, err = Direct(ctx, opt)
				if !changed() {
					t.Fatal("the file was not changed while it was read")
				}
				checkChangedWhileRead(t, err, path)
				checkNotHeld(t, storeDir)

				c.settle(t, path)
				rep, err := Direct(ctx, opt)
				if err != nil || rep.Appended != 1 || rep.Documents != c.docs {
					t.Fatalf("the ingest again of the settled file: %+v, %v; want it appended, %d documents", rep, err, c.docs)
				}
				checkHeldWhole(t, storeDir, c.docs)
			})
		}
	}
}

// Every reader reads the copy: a file of each format changed once its
// copy is checked is not stored, and stored whole once put back. Before,
// a parquet or compressed file cut short was recorded as skipped, corrupt,
// under the id of its intact content, which then never went in.
func TestEveryFormatOfALocalFileChangedWhileReadIsNotStored(t *testing.T) {
	t.Parallel()
	tok := testTokenizer(t)
	var rows []textRow
	for i := range 60 {
		rows = append(rows, textRow{Text: fmt.Sprintf("row %d: the quick brown fox", i)})
	}
	pq := filepath.Join(t.TempDir(), "a.parquet")
	writeParquet(t, pq, rows, 20)
	pqBytes, err := os.ReadFile(pq)
	if err != nil {
		t.Fatal(err)
	}
	var array strings.Builder
	array.WriteString("[\n")
	for i := range 40 {
		if i > 0 {
			array.WriteString(",\n")
		}
		fmt.Fprintf(&array, `  {"text": "element %d: the quick brown fox"}`, i)
	}
	array.WriteString("\n]\n")
	for _, f := range []struct {
		name string
		data []byte
		docs int64
	}{
		{"a.parquet", pqBytes, 60},
		{"a.jsonl.zst", zstJSONL("zst", 300, 0), 300},
		{"a.json", []byte(array.String()), 40},
		{"a.txt", []byte(strings.Repeat("func main() { fmt.Println(\"hello, world\") }\n", 200)), 1},
	} {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			dir := t.TempDir()
			path := filepath.Join(dir, f.name)
			if err := os.WriteFile(path, f.data, 0o644); err != nil {
				t.Fatal(err)
			}
			cut := fileChange{name: "cut short", make: func(t *testing.T, path string) {
				if err := os.Truncate(path, int64(len(f.data)/2)); err != nil {
					t.Error(err)
				}
			}}
			p, err := LookupPreset(nil, "local:"+path)
			if err != nil {
				t.Fatal(err)
			}
			storeDir := filepath.Join(t.TempDir(), "s")
			hook, changed := changeAt(t, readCopied, path, cut)
			opt := DirectOptions{Preset: p, Tokenizer: tok, TokenizerName: "t", StoreDir: storeDir, DataDir: t.TempDir(), onRead: hook}
			_, err = Direct(ctx, opt)
			if !changed() {
				t.Fatal("the file was not changed while it was read")
			}
			checkChangedWhileRead(t, err, path)
			checkNotHeld(t, storeDir)

			if err := os.WriteFile(path, f.data, 0o644); err != nil {
				t.Fatal(err)
			}
			rep, err := Direct(ctx, opt)
			if err != nil || rep.Appended != 1 || rep.Documents != f.docs {
				t.Fatalf("the ingest again of the file put back: %+v, %v; want it appended, %d documents", rep, err, f.docs)
			}
			checkHeldWhole(t, storeDir, f.docs)
		})
	}
}

// A local file larger than the room left on its data directory's disk,
// which its copy needs, stops the ingest naming that directory, the file
// and what to do, and stores nothing of it.
func TestAFullDiskUnderALocalFilesCopySaysWhatToDo(t *testing.T) {
	t.Parallel()
	disk := testsvc.SmallDisk(t, 64<<10)
	dir := t.TempDir()
	path := filepath.Join(dir, "big.jsonl")
	if err := os.WriteFile(path, changedJSONL(0, 200), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := LookupPreset(nil, "local:"+path)
	if err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(t.TempDir(), "s")
	_, err = Direct(context.Background(), DirectOptions{Preset: p, Tokenizer: testTokenizer(t), TokenizerName: "t", StoreDir: storeDir, DataDir: disk})
	if err == nil {
		t.Fatal("an ingest whose file's copy fills its disk went through")
	}
	for _, w := range []string{"no space left on the disk of " + disk, fmt.Sprintf("for a copy of the %d bytes of %s, which its shard is read from", len(changedJSONL(0, 200)), path),
		"(free there: ", "run the ingest again"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error %q does not say %q", err, w)
		}
	}
	checkNotHeld(t, storeDir)
}
