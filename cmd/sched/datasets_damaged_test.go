package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/internal/testsvc"
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
	if _, err := a.Append(context.Background(), tokens.ShardInfo{ID: "s", Revision: "r1"}, bytes.NewReader(storeIDs(n))); err != nil {
		t.Fatal(err)
	}
}

// storeIDs is n tokens of makeStore's tokenizer as a shard holds them:
// uint16 ids (a vocabulary of 300), every 10th an EOS, the last one too.
func storeIDs(n int) []byte {
	ids := make([]byte, 2*n)
	for i := range n {
		id := uint16(1 + i%299)
		if i%10 == 9 || i == n-1 {
			id = 0 // the EOS
		}
		binary.LittleEndian.PutUint16(ids[2*i:], id)
	}
	return ids
}

// A store's SIZE is what its manifest commits, the bytes a run reads, and
// not the bytes an append killed midway left past them in tokens.bin,
// which the listing counted; its SHARDS are its files, a file taken in
// two parts under --max-tokens counted once, where each part counted.
func TestDatasetsCountsWhatTheManifestCommits(t *testing.T) {
	t.Parallel()
	stores := t.TempDir()
	// An append killed after it wrote its tokens and before it committed
	// them leaves them past the committed ones.
	tail := filepath.Join(stores, "tail")
	makeStore(t, tail, 5000)
	f, err := os.OpenFile(filepath.Join(tail, tokens.TokensFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(storeIDs(2048)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, err := os.Stat(filepath.Join(tail, tokens.TokensFile)); err != nil || fi.Size() != 2*(5000+2048) {
		t.Fatalf("tokens.bin with an uncommitted tail: %v, %v", fi, err)
	}

	// File f in two parts, the first up to its record 10 and then the
	// rest, beside file g whole: two files in three shards.
	parts := filepath.Join(stores, "parts")
	tok := tokens.Tokenizer{Name: "t", SHA256: strings.Repeat("ab", 32), VocabSize: 300, EOS: 0}
	a, err := tokens.OpenAppender(context.Background(), parts, tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		info tokens.ShardInfo
		n    int
	}{
		{tokens.ShardInfo{ID: "f", Revision: "r1", Part: tokens.Part{From: 0, To: 10}}, 100},
		{tokens.ShardInfo{ID: "g", Revision: "r1"}, 300},
		{tokens.ShardInfo{ID: "f", Revision: "r1", Part: tokens.Part{From: 10}}, 600},
	} {
		if _, err := a.Append(context.Background(), s.info, bytes.NewReader(storeIDs(s.n))); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := sched(t, nil, "datasets", "--stores", stores)
	if code != 0 {
		t.Fatalf("datasets: exit %d\n%s%s", code, out, errOut)
	}
	for name, want := range map[string]string{
		"tail":  `tail +5000 +1 +9\.8 KiB +r1 `,  // 10000 bytes committed, not the 14096 in the file
		"parts": `parts +1000 +2 +2\.0 KiB +r1 `, // files f and g, 2000 bytes
	} {
		line := regexp.MustCompile(`(?m)^` + name + ` .*$`).FindString(out)
		if !regexp.MustCompile(`^` + want).MatchString(line) {
			t.Errorf("%s: %q; want a line matching %q\n%s", name, line, want, out)
		}
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
			regexp.QuoteMeta(c.damage+"; delete "+filepath.Join(stores, name)+", then re-ingest it") + ".*$"
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

// queuedStore is store code of a data directory, which the workers a test
// starts fill through the queues, over Redis and an S3 server, with the
// three documents of two local files.
type queuedStore struct {
	env    []string
	redis  *testsvc.RedisServer
	dir    string   // the store's directory
	ingest []string // the command that queues its ingest
}

func newQueuedStore(t *testing.T) *queuedStore {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "kiln")
	tokenizerTK(t, dir, data)
	src := sourceDir(t, dir, twoFiles)
	s := &queuedStore{redis: testsvc.StartRedis(t), dir: filepath.Join(data, "tokens", "code"),
		ingest: []string{"enqueue", "ingest", "local:" + filepath.Join(src, "*.jsonl"), "--store", "code", "--tokenizer", "tk"}}
	s3 := testsvc.S3(t)
	s.env = []string{"KILN_REDIS_URL=" + s.redis.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + src,
		"KILN_S3_ENDPOINT=" + s3.Endpoint, "KILN_S3_ACCESS_KEY=" + s3.AccessKey, "KILN_S3_SECRET_KEY=" + s3.SecretKey}
	return s
}

// fill queues the store's ingest and waits until the store holds both
// files and the queues are idle (the last append's task ended, so that
// the next ingest's appends are queued anew), for two minutes at most; a
// task archived ends the wait at once.
func (s *queuedStore) fill(t *testing.T) *tokens.Manifest {
	t.Helper()
	if out, errOut, code := sched(t, s.env, s.ingest...); code != 0 {
		t.Fatalf("%v: exit %d\n%s%s", s.ingest, code, out, errOut)
	}
	inspector := asynq.NewInspector(asynq.RedisClientOpt{Addr: s.redis.Addr})
	defer inspector.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		m, err := tokens.ReadManifest(s.dir)
		if err == nil && len(m.Shards) == 2 && s.idle(inspector) {
			if m.Documents != 3 || m.Tokens == 0 {
				t.Fatalf("the store holds %d documents and %d tokens, want the 3 documents of src/*.jsonl", m.Documents, m.Tokens)
			}
			return m
		}
		for _, q := range []string{"ingest", "append"} {
			if archived, _ := inspector.ListArchivedTasks(q); len(archived) > 0 {
				t.Fatalf("the worker archived %s: %s", archived[0].ID, archived[0].LastErr)
			}
		}
		if time.Now().After(deadline) {
			status, _, _ := sched(t, s.env, "status")
			t.Fatalf("the store was not filled in two minutes (%v)\n%s", err, status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// idle reports whether the ingest and append queues hold no task that is
// waiting, running or to be retried.
func (s *queuedStore) idle(inspector *asynq.Inspector) bool {
	for _, q := range []string{"ingest", "append"} {
		info, err := inspector.GetQueueInfo(q)
		if err != nil || info.Pending+info.Active+info.Scheduled+info.Retry > 0 {
			return false
		}
	}
	return true
}

// listing is the store's line in `sched datasets`.
func (s *queuedStore) listing(t *testing.T) string {
	t.Helper()
	out, errOut, code := sched(t, s.env, "datasets")
	if code != 0 {
		t.Fatalf("datasets: exit %d\n%s%s", code, out, errOut)
	}
	return regexp.MustCompile(`(?m)^code .*$`).FindString(out)
}

// A damaged store that is deleted is ingested again by the worker that
// appended it, still running: the listing names the damage and says to
// delete the store and ingest it again, where it said to restart that
// worker first, without which the ingest took every file of the deleted
// store for stored and queued none; the same ingest queued again now
// fills the store as before. Before it is deleted, the worker marks its
// status damaged, and the same ingest is refused at enqueue saying so,
// where it was queued and reported done.
func TestDamagedStoreDeletedIsIngestedAgainWithoutARestart(t *testing.T) {
	s := newQueuedStore(t)
	w := startWorker(t, s.env, "--queues", "ingest=1,append=1")
	first := s.fill(t)
	healthy := s.listing(t)
	want := "code +" + strconv.FormatInt(first.Tokens, 10) + " +2 +" + regexp.QuoteMeta(bytesize.Format(2*first.Tokens)) + " +local *$"
	if !regexp.MustCompile(want).MatchString(healthy) {
		t.Fatalf("the store filled is listed %q; want a line matching %q", healthy, want)
	}

	os.Truncate(filepath.Join(s.dir, tokens.TokensFile), 2)
	damaged := "damaged: tokens.bin is truncated (2 of " + strconv.FormatInt(2*first.Tokens, 10) + " bytes); delete " + s.dir + ", then re-ingest it if you still need it"
	if line := s.listing(t); !strings.HasSuffix(line, damaged) {
		t.Fatalf("the store damaged is listed %q; want it to end %q", line, damaged)
	}
	const marked = "token store is damaged: its status in object storage says so"
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(workerLog(t, w), marked) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker that appends did not log %q in two minutes after the store was cut\n%s", marked, workerLog(t, w))
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantBadInput(t, s.env, `^sched: token store code is damaged: tokens.bin is truncated \(2 of `+strconv.FormatInt(2*first.Tokens, 10)+` bytes\); delete `+regexp.QuoteMeta(s.dir)+` on .+, then re-ingest it if you still need it\n$`, s.ingest...)
	// sched status lists it, from the worker's word in Redis.
	shown := regexp.MustCompile(`(?m)^code  DAMAGED: tokens.bin is truncated \(2 of \d+ bytes\); delete ` + regexp.QuoteMeta(s.dir) + ` on .+, then re-ingest it if you still need it$`)
	s.waitStatus(t, "the damaged store listed", func(status string) bool { return shown.MatchString(status) })

	if err := os.RemoveAll(s.dir); err != nil {
		t.Fatal(err)
	}
	again := s.fill(t)
	if again.Tokens != first.Tokens || again.Documents != first.Documents {
		t.Fatalf("the store ingested again holds %d tokens and %d documents, want %d and %d as before", again.Tokens, again.Documents, first.Tokens, first.Documents)
	}
	if line := s.listing(t); line != healthy {
		t.Fatalf("the store ingested again is listed %q, want %q as before", line, healthy)
	}
	s.waitStatus(t, "no store listed damaged", func(status string) bool { return !strings.Contains(status, "DAMAGED") })
}

// waitStatus waits until `sched status` says what ok looks for, for two
// minutes at most.
func (s *queuedStore) waitStatus(t *testing.T, what string, ok func(status string) bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, errOut, code := sched(t, s.env, "status")
		if code != 0 {
			t.Fatalf("status: exit %d\n%s%s", code, out, errOut)
		}
		if ok(out) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sched status did not show %s in two minutes:\n%s", what, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Where the ingest is planned by another worker than the one that
// appends, the worker that appends notices a store deleted while it runs
// by itself, and says so in its log; the ingest queued then fills the
// store again. sched status, whose INGEST lines come from the tasks'
// history, says the store was deleted after the ingest it lists, where
// it went on saying "done" of a store no longer there.
func TestStoreDeletedIsNoticedByTheWorkerThatAppends(t *testing.T) {
	s := newQueuedStore(t)
	appender := startWorker(t, s.env, "--queues", "append=1")
	startWorker(t, s.env, "--queues", "ingest=1")
	first := s.fill(t)
	done := regexp.MustCompile(`(?m)^code \(local:.*\)  files 2/2 done  .*  done$`)
	s.waitStatus(t, "the ingest done", func(status string) bool { return done.MatchString(status) })
	if err := os.RemoveAll(s.dir); err != nil {
		t.Fatal(err)
	}
	const noticed = "token store changed on this disk while the worker ran (it went, was replaced,"
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(workerLog(t, appender), noticed) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker that appends did not log %q in two minutes after the store was deleted", noticed)
		}
		time.Sleep(100 * time.Millisecond)
	}
	gone := regexp.MustCompile(`(?m)^code \(local:.*\)  its store was deleted from the disk at \S+, after this ingest: enqueue the ingest again to fill it$`)
	s.waitStatus(t, "the store deleted", func(status string) bool { return gone.MatchString(status) && !done.MatchString(status) })
	if again := s.fill(t); again.Tokens != first.Tokens || again.Documents != first.Documents {
		t.Fatalf("the store ingested again holds %d tokens and %d documents, want %d and %d as before", again.Tokens, again.Documents, first.Tokens, first.Documents)
	}
	s.waitStatus(t, "the ingest done again", func(status string) bool { return done.MatchString(status) && !gone.MatchString(status) })
}

// Where the store's ingest is queued again the moment the store is
// deleted, before the worker that appends has looked at its disk, the
// plan on the other worker asks it to look first: the store is ingested
// whole again, where the plan read the deleted store's status and queued
// nothing.
func TestStoreDeletedAndIngestedAtOnceIsIngestedWhole(t *testing.T) {
	s := newQueuedStore(t)
	startWorker(t, s.env, "--queues", "append=1")
	startWorker(t, s.env, "--queues", "ingest=1")
	first := s.fill(t)
	if err := os.RemoveAll(s.dir); err != nil {
		t.Fatal(err)
	}
	if again := s.fill(t); again.Tokens != first.Tokens || again.Documents != first.Documents {
		t.Fatalf("the store ingested again holds %d tokens and %d documents, want %d and %d as before", again.Tokens, again.Documents, first.Tokens, first.Documents)
	}
}

// sched datasets on another machine than the worker that appends (the
// user's shell beside compose's GPU worker, whose disk it does not see)
// lists that worker's stores by the statuses it publishes, where it said
// there were no token stores yet; a store it found damaged is listed as
// such. On the worker's own data directory each store is listed once,
// from its manifest.
func TestDatasetsListsTheStoresOfTheWorkerThatAppends(t *testing.T) {
	s := newQueuedStore(t)
	startWorker(t, s.env, "--queues", "ingest=1,append=1")
	first := s.fill(t)
	laptop := append(append([]string(nil), s.env...), "KILN_DATA_DIR="+t.TempDir())
	datasets := func(env []string) string {
		t.Helper()
		out, errOut, code := sched(t, env, "datasets")
		if code != 0 || errOut != "" {
			t.Fatalf("datasets: exit %d\n%s%s", code, out, errOut)
		}
		return out
	}
	out := datasets(laptop)
	want := regexp.MustCompile(`(?m)^token stores on the disk of the worker that serves append, not in .*/tokens \(from their statuses in object storage\):\nSTORE +TOKENS +SIZE +UPDATED\ncode +` +
		strconv.FormatInt(first.Tokens, 10) + ` +` + regexp.QuoteMeta(bytesize.Format(2*first.Tokens)) + ` +\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`)
	if !strings.Contains(out, "no token stores in ") || strings.Contains(out, "fills one") || !want.MatchString(out) {
		t.Fatalf("sched datasets on another machine:\n%s\nwant the worker's store code listed by its status", out)
	}
	if out := datasets(s.env); strings.Contains(out, "worker that serves append") || strings.Count(out, "\ncode ") != 1 {
		t.Fatalf("sched datasets on the worker's data directory:\n%s\nwant store code listed once, from its manifest", out)
	}

	os.Truncate(filepath.Join(s.dir, tokens.TokensFile), 2)
	s.waitStatus(t, "the damaged store listed", func(status string) bool { return strings.Contains(status, "code  DAMAGED: ") })
	damaged := regexp.MustCompile(`(?m)^code +- +- +DAMAGED: tokens.bin is truncated \(2 of \d+ bytes\); delete ` + regexp.QuoteMeta(s.dir) + ` on .+, then re-ingest it if you still need it$`)
	if out := datasets(laptop); !damaged.MatchString(out) {
		t.Fatalf("sched datasets on another machine with the store damaged:\n%s", out)
	}
}

// A store deleted from the disk and then put back whole (a backup, or the
// store copied from another machine, as a run moved there needs) is read
// as its ingest left it once the worker that appends has found it again,
// here at its restart: sched status said it was deleted for good, and the
// ingest it advised queued nothing, every file being in the store.
func TestAStoreDeletedAndPutBackIsNotDeleted(t *testing.T) {
	s := newQueuedStore(t)
	appender := startWorker(t, s.env, "--queues", "append=1")
	startWorker(t, s.env, "--queues", "ingest=1")
	s.fill(t)
	done := regexp.MustCompile(`(?m)^code \(local:.*\)  files 2/2 done  .*  done$`)
	s.waitStatus(t, "the ingest done", func(status string) bool { return done.MatchString(status) })
	backup := filepath.Join(t.TempDir(), "code")
	if err := os.Rename(s.dir, backup); err != nil {
		t.Fatal(err)
	}
	gone := regexp.MustCompile(`(?m)^code \(local:.*\)  its store was deleted from the disk at `)
	s.waitStatus(t, "the store deleted", func(status string) bool { return gone.MatchString(status) })
	if err := appender.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = appender.Wait()
	if err := os.Rename(backup, s.dir); err != nil {
		t.Fatal(err)
	}
	startWorker(t, s.env, "--queues", "append=1")
	s.waitStatus(t, "the store put back read as its ingest left it", func(status string) bool { return done.MatchString(status) && !gone.MatchString(status) })
}
