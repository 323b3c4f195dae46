package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// An upload whose writer failed while S3 was down (so that its abort
// failed too) is an orphan; the start-up sweep aborts it once S3 is back,
// by id, and leaves alone a live writer's upload that was active after the
// cutoff, which then completes whole.
func TestAbortStaleUploadsDropsOrphansOnly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := testsvc.S3(t)
	s := newS3(t, srv, 1)
	part := make([]byte, 5<<20+1) // one full part goes up, one byte waits
	rand.Read(part)

	// The orphan: a part is in, then the server goes away and the abort
	// cannot reach it.
	const orphanKey = "checkpoints/run/step-0000100/model.safetensors"
	ow := s.newWriter(ctx, orphanKey, false)
	if _, err := ow.Write(part); err != nil {
		t.Fatal(err)
	}
	if err := ow.wait(); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := ow.Abort(errors.New("the trainer failed")); err == nil {
		t.Fatal("the abort reached a stopped server")
	}
	srv.Start()
	ups, err := s.Uploads(ctx, "checkpoints/")
	if err != nil || len(ups) != 1 || ups[0].Key != orphanKey || ups[0].Parts != 1 {
		t.Fatalf("unfinished uploads after the failed abort: %+v, %v; want the orphan with its part", ups, err)
	}
	orphan := ups[0]

	// The live writer starts after the orphan's last activity, by a
	// second at least: the server's times may have a second's resolution.
	for !time.Now().After(orphan.LastActive.Add(1100 * time.Millisecond)) {
		time.Sleep(20 * time.Millisecond)
	}
	const liveKey = "tokens/code/shards/live.tokens"
	lw := NewUnsignedWriter(ctx, s, liveKey)
	if _, err := lw.Write(part); err != nil {
		t.Fatal(err)
	}
	if err := lw.(*s3Writer).wait(); err != nil {
		t.Fatal(err)
	}

	cutoff := orphan.LastActive.Add(500 * time.Millisecond)
	aborted, err := AbortStaleUploads(ctx, s, cutoff)
	if err != nil || len(aborted) != 1 || aborted[0].ID != orphan.ID {
		t.Fatalf("aborted %+v, %v; want the orphan %s alone", aborted, err, orphan.ID)
	}
	var left []string
	for _, p := range Prefixes {
		ups, err := s.Uploads(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range ups {
			left = append(left, u.Key)
		}
	}
	if !slices.Equal(left, []string{liveKey}) {
		t.Fatalf("unfinished uploads after the sweep: %q; want only the live %s", left, liveKey)
	}

	// The live writer goes on and completes; a second sweep finds nothing.
	if _, err := lw.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	if err := lw.Close(); err != nil {
		t.Fatalf("the live upload broke: %v", err)
	}
	if got := readAll(t, s, liveKey); !bytes.Equal(got, append(slices.Clip(part), "tail"...)) {
		t.Fatalf("the live object holds %d bytes, want %d", len(got), len(part)+4)
	}
	if _, err := s.Stat(ctx, orphanKey); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the orphan's object: %v; want none", err)
	}
	if aborted, err := AbortStaleUploads(ctx, s, time.Now().Add(time.Hour)); err != nil || len(aborted) != 0 {
		t.Fatalf("second sweep: %+v, %v; want nothing left to abort", aborted, err)
	}

	local, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if aborted, err := AbortStaleUploads(ctx, local, time.Now()); err != nil || aborted != nil {
		t.Fatalf("local store: %+v, %v", aborted, err)
	}
}

// An endpoint written with credentials in it does not print them.
func TestS3ErrorsHideEndpointCredentials(t *testing.T) {
	t.Parallel()
	_, err := NewS3(S3Options{Endpoint: "admin:s3cret@localhost:9000", Bucket: "kiln", AccessKey: "a", SecretKey: "b"})
	if err != nil && strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error shows the password: %v", err)
	}
	s, err := NewS3(S3Options{Endpoint: "localhost:1", Bucket: "kiln", AccessKey: "a", SecretKey: "b", MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.o.Endpoint = "admin:s3cret@localhost:1"
	if u := s.String(); strings.Contains(u, "s3cret") || !strings.HasSuffix(u, "localhost:1/kiln") {
		t.Fatalf("url %q", u)
	}
}

// localPutEnv makes TestHelperLocalPut put an object into the local store
// in the directory it names, and hang once its first bytes are written.
const localPutEnv = "KILN_TEST_LOCAL_PUT"

const killedPutKey = "checkpoints/run/step-0000100/model.safetensors"

// TestHelperLocalPut is the process of TestAbortStaleUploadsRemovesAKilledLocalPut
// killed mid-put: it says "put" once a chunk is in the object's temporary
// file, and waits to be killed.
func TestHelperLocalPut(t *testing.T) {
	dir := os.Getenv(localPutEnv)
	if dir == "" {
		t.Skip("a helper process of TestAbortStaleUploadsRemovesAKilledLocalPut")
	}
	l, err := NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Fatal(l.Put(context.Background(), killedPutKey, &hangingReader{}, -1))
}

// hangingReader gives a chunk of bytes, and at the next read (the chunk
// is written) says so on stdout and never returns.
type hangingReader struct{ given bool }

func (r *hangingReader) Read(p []byte) (int, error) {
	if !r.given {
		r.given = true
		return copy(p, bytes.Repeat([]byte("w"), len(p))), nil
	}
	os.Stdout.WriteString("put\n")
	select {}
}

// A process killed mid-put into the local directory store leaves the
// object's temporary file, which no List shows: the sweep every worker
// runs removes it once idle since before the cutoff, with the directory
// it was alone in, and leaves a live put's, which then completes.
func TestAbortStaleUploadsRemovesAKilledLocalPut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	testsvc.StartChild(t, "TestHelperLocalPut", localPutEnv+"="+dir).Kill(t)
	orphans, err := filepath.Glob(filepath.Join(dir, filepath.FromSlash(killedPutKey)+".*"))
	if err != nil || len(orphans) != 1 {
		t.Fatalf("the killed put left %q (%v); want its temporary file", orphans, err)
	}
	l, err := NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	const liveKey = "tokens/code/shards/live.tokens"
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- l.Put(ctx, liveKey, pr, -1) }()
	if _, err := pw.Write([]byte("live ")); err != nil { // read by the put: its file exists
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * StaleUploadAge)
	if err := os.Chtimes(orphans[0], old, old); err != nil {
		t.Fatal(err)
	}

	removed, err := AbortStaleUploads(ctx, l, time.Now().Add(-StaleUploadAge))
	if err != nil || len(removed) != 1 || removed[0].Key != killedPutKey || removed[0].ID != filepath.Base(orphans[0]) {
		t.Fatalf("removed %+v, %v; want the killed put of %s alone", removed, err, killedPutKey)
	}
	if _, err := os.Stat(filepath.Dir(orphans[0])); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the killed put's directory is still there: %v", err)
	}
	if _, err := pw.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := <-done; err != nil {
		t.Fatalf("the live put broke: %v", err)
	}
	if got := readAll(t, l, liveKey); string(got) != "live tail" {
		t.Fatalf("the live object holds %q", got)
	}
	if removed, err := AbortStaleUploads(ctx, l, time.Now().Add(time.Hour)); err != nil || len(removed) != 0 {
		t.Fatalf("second sweep: %+v, %v; want nothing left", removed, err)
	}
}
