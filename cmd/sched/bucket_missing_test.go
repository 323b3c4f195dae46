package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
)

// A command that only reads from object storage (results, results
// --tensorboard, results bench, generate --run) and finds the bucket
// absent says so, naming the bucket, the server and KILN_S3_BUCKET, with
// exit 2, and creates nothing: a mistyped bucket was read as one without
// results or checkpoints yet, and the user told to wait for the run's
// first checkpoint or to train it again.
func TestReadingCommandsNameAMissingBucket(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	st, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	const summary = "# Run pilot\n"
	if err := st.Put(context.Background(), "results/pilot/summary.md", strings.NewReader(summary), int64(len(summary))); err != nil {
		t.Fatal(err)
	}
	s3 := []string{"KILN_S3_ENDPOINT=" + srv.Endpoint, "KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey}
	if out, errOut, code := sched(t, append(s3, "KILN_S3_BUCKET=kiln"), "results", "pilot"); code != 0 || !strings.Contains(out, summary) {
		t.Fatalf("results pilot from bucket kiln: exit %d\n%s%s", code, out, errOut)
	}

	typo := append(s3, "KILN_S3_BUCKET=kiln2")
	tb := filepath.Join(t.TempDir(), "tb")
	fix := ": check KILN_S3_BUCKET (--s3-bucket); kiln creates it at the first write"
	at := "bucket kiln2 does not exist at http://" + srv.Endpoint + ", so it holds no "
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{typo, []string{"results", "pilot"}, at + "results of run pilot" + fix},
		{typo, []string{"results", "pilot", "--tensorboard", tb}, at + "TensorBoard event files of run pilot" + fix},
		{typo, []string{"results", "bench"}, at + "bench results" + fix},
		{typo, []string{"generate", "--run", "pilot", "--prompt", "func", "--engine", "cpu"}, at + "checkpoint of run pilot" + fix},
		// The flag names the bucket as the variable does.
		{s3, []string{"results", "pilot", "--s3-bucket", "kiln2"}, at + "results of run pilot" + fix},
	} {
		wantRefused(t, c.env, c.want, c.args...)
	}
	if _, err := os.Stat(filepath.Join(srv.Dir, "kiln2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a command that only reads created the bucket kiln2: %v", err)
	}
	if _, err := os.Stat(tb); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("results --tensorboard made %s for a bucket that does not exist: %v", tb, err)
	}
}

// The bucket is created on first use all the same: on a fresh setup
// `sched results bench` is refused as the bucket does not exist yet,
// `sched enqueue bench` queues without it, and the worker's first write
// (the bench's row) creates it, after which the results read.
func TestAWorkerCreatesTheBucketAReadFoundMissing(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json", "KILN_S3_ENDPOINT=" + srv.Endpoint,
		"KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey, "KILN_S3_BUCKET=fresh"}
	bucketDir := filepath.Join(srv.Dir, "fresh")

	wantRefused(t, env, "bucket fresh does not exist at http://"+srv.Endpoint+", so it holds no bench results: check KILN_S3_BUCKET", "results", "bench")
	out, errOut, code := sched(t, env, "enqueue", "bench", "tiny", "--engine", "cpu", "--batch", "1", "--seq", "16", "--steps", "2", "--warmup", "0")
	m := regexp.MustCompile(`queued (bench:run:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue bench with no bucket yet: exit %d, %q %q", code, out, errOut)
	}
	if _, err := os.Stat(bucketDir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the bucket exists before any write: %v", err)
	}
	startWorker(t, env, "--queues", "gpu=1")
	waitStatus(t, env, m[1], regexp.MustCompile(`^`+m[1]+`\s+completed\s+100\.0%`), time.Minute)
	if fi, err := os.Stat(bucketDir); err != nil || !fi.IsDir() {
		t.Fatalf("the worker's first write did not create the bucket: %v", err)
	}
	out, errOut, code = sched(t, env, "results", "bench")
	if code != 0 || !strings.Contains(out, "tiny") {
		t.Fatalf("results bench once the worker wrote its row: exit %d\n%s%s", code, out, errOut)
	}
}

// A command that lists what object storage holds beside this machine's
// copies (tokenizers, datasets) and finds the bucket absent lists what it
// has, and a note says that the bucket does not exist, naming it and
// KILN_S3_BUCKET: a mistyped bucket listed no tokenizer and no store on
// the worker's disk, as if none had been made. It creates nothing.
func TestListingCommandsNoteAMissingBucket(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	env := []string{"KILN_S3_ENDPOINT=" + srv.Endpoint, "KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey,
		"KILN_S3_BUCKET=kiln2", "KILN_DATA_DIR=" + t.TempDir()}
	for _, c := range []struct {
		args []string
		what string
	}{
		{[]string{"tokenizers"}, "tokenizers"},
		{[]string{"datasets"}, "token stores' statuses"},
	} {
		out, errOut, code := sched(t, env, c.args...)
		want := "note: bucket kiln2 does not exist at http://" + srv.Endpoint + ", so no " + c.what +
			" are listed from it (kiln creates it at the first write): if the workers write to another bucket, check KILN_S3_BUCKET (--s3-bucket)\n"
		if code != 0 || !strings.Contains(errOut, want) {
			t.Errorf("sched %s with bucket kiln2 absent: exit %d, stdout %q, stderr %q; want exit 0 and the note\n%q", c.args[0], code, out, errOut, want)
		}
	}
	if _, err := os.Stat(filepath.Join(srv.Dir, "kiln2")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a command that only lists created the bucket kiln2: %v", err)
	}
	// The bucket there, no note.
	st, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln2", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(context.Background(), "x", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"tokenizers"}, {"datasets"}} {
		if out, errOut, code := sched(t, env, args...); code != 0 || strings.Contains(errOut, "does not exist") {
			t.Errorf("sched %s with bucket kiln2 there: exit %d, stdout %q, stderr %q; want no note", args[0], code, out, errOut)
		}
	}
}
