package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// newS3Via is an S3 store that reaches srv through the fault proxy f.
func newS3Via(t *testing.T, srv *testsvc.S3Server, f *testsvc.S3Faults, retries int) *S3 {
	t.Helper()
	st, err := NewS3(S3Options{Endpoint: f.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PartSize: 5 << 20, MaxRetries: retries})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A put of known size is sent again after a 503 SlowDown, at once: one
// throttled request costs a short back-off, not the caller's wait for an
// outage. A body that can seek (a bytes.Reader, a file) is sent again from
// where the put found it, and one that cannot (a reader that hashes what
// it passes on) is read into memory first. A store that throttles every
// try fails the put, naming the store, the operation, the object and the
// server's answer (status and code), as an outage.
func TestS3PutIsRetriedAfterSlowDown(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	f := srv.Faults(t)
	s := newS3Via(t, srv, f, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	body := make([]byte, 100<<10)
	rand.Read(body)
	file := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(file, append([]byte("header"), body...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		open func() io.Reader
	}{
		{"a bytes.Reader", func() io.Reader {
			r := bytes.NewReader(append([]byte("header"), body...))
			r.Seek(6, io.SeekStart)
			return r
		}},
		{"a file", func() io.Reader {
			fh, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { fh.Close() })
			fh.Seek(6, io.SeekStart)
			return fh
		}},
		{"a reader that cannot seek", func() io.Reader { return io.TeeReader(bytes.NewReader(body), io.Discard) }},
	} {
		key := "results/r1/" + strings.ReplaceAll(c.name, " ", "-")
		f.Add(testsvc.Fault{Method: "PUT", Path: key, Action: testsvc.Status, Code: http.StatusServiceUnavailable, Count: 1})
		if err := s.Put(ctx, key, c.open(), int64(len(body))); err != nil {
			t.Fatalf("put from %s after one SlowDown: %v", c.name, err)
		}
		if n := f.Acted("PUT /kiln/" + key); n != 1 {
			t.Fatalf("put from %s: the proxy answered %d PUTs with SlowDown, want 1", c.name, n)
		}
		r, err := s.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("put from %s: read back %d bytes (equal %v), %v; want the body from where the put found it", c.name, len(got), bytes.Equal(got, body), err)
		}
	}

	const key = "results/r1/throttled"
	f.Add(testsvc.Fault{Method: "PUT", Path: key, Action: testsvc.Status, Code: http.StatusServiceUnavailable})
	err := s.Put(ctx, key, bytes.NewReader(body), int64(len(body)))
	if err == nil {
		t.Fatal("a put succeeded while every PUT was throttled")
	}
	if n := f.Acted("PUT /kiln/" + key); n != 5 {
		t.Errorf("the put was tried %d times, want the default 5", n)
	}
	msg := err.Error()
	for _, w := range []string{"put", "http://" + f.Endpoint + "/kiln/" + key, "503 SlowDown", "injected by the test"} {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not name %q", msg, w)
		}
	}
	if !Unreachable(err) {
		t.Errorf("Unreachable(%v) is false for a store that throttles", err)
	}
	if got := Outage(err); got != "put: 503 SlowDown: injected by the test" {
		t.Errorf("Outage(%v) = %q", err, got)
	}

	// A body read into memory must hold its size, as a request's must.
	for _, c := range []struct {
		name string
		r    io.Reader
		want string
	}{
		{"short", io.TeeReader(bytes.NewReader(body[:10]), io.Discard), "ended after 10 of its 11 bytes"},
		{"long", io.TeeReader(bytes.NewReader(body[:12]), io.Discard), "holds more than its 11 bytes"},
	} {
		err := s.Put(ctx, "results/r1/"+c.name, c.r, 11)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "results/r1/"+c.name) {
			t.Errorf("a %s body: %v; want the put refused saying it %s", c.name, err, c.want)
		}
		if _, err := s.Stat(ctx, "results/r1/"+c.name); !errors.Is(err, ErrNotFound) {
			t.Errorf("a %s body left an object: %v", c.name, err)
		}
	}
}

// A body whose connection drops mid-way goes on from where it stopped,
// with a GET of the rest of the same object: before, each cut was an
// outage that held the task 30 s. One cut every time is, once the store's
// tries are spent, an unexpected EOF that reads as the store not
// answering, never a whole body.
func TestS3GetCutShortIsUnreachable(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	f := srv.Faults(t)
	s := newS3Via(t, srv, f, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := make([]byte, 1<<20)
	rand.Read(body)
	const key = "checkpoints/r1/step-0000350/optimizer.safetensors"
	if err := s.Put(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	read := func() ([]byte, error) {
		r, err := s.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return io.ReadAll(r)
	}

	f.Add(testsvc.Fault{Method: "GET", Path: key, Action: testsvc.Truncate, Count: 2})
	if got, err := read(); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("a body cut twice: %d bytes, %v; want the whole object, its rest asked for again", len(got), err)
	}
	if n := f.Acted("GET /kiln/" + key); n != 2 {
		t.Fatalf("%d GETs cut, want 2", n)
	}

	f.Add(testsvc.Fault{Method: "GET", Path: key, Action: testsvc.Truncate})
	got, err := read()
	if err == nil {
		t.Fatalf("a body cut short at every GET read %d of %d bytes and no error", len(got), len(body))
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || !Unreachable(err) {
		t.Errorf("a body cut short: %v (Unreachable %v); want an unexpected EOF that reads as the store not answering", err, Unreachable(err))
	}
	if msg := err.Error(); !strings.Contains(msg, "get http://"+f.Endpoint+"/kiln/"+key) {
		t.Errorf("error %q does not name the operation and the object", msg)
	}
	if n := f.Acted("GET /kiln/" + key); n != 2+5 {
		t.Errorf("%d GETs cut, want 2 and then the 5 tries of one body", n)
	}
	f.Clear()

	// An object replaced while its body is read is not spliced with its
	// successor: the rest is asked for of the same ETag, which the store
	// no longer has.
	f.Add(testsvc.Fault{Method: "GET", Path: key, Action: testsvc.Truncate, Count: 1})
	r, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1024)
	if _, err := io.ReadFull(r, first); err != nil {
		t.Fatal(err)
	}
	other := bytes.Repeat([]byte{7}, len(body))
	if err := s.Put(ctx, key, bytes.NewReader(other), int64(len(other))); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r)
	r.Close()
	if err == nil || bytes.Contains(rest, []byte{7, 7, 7, 7}) {
		t.Fatalf("a body whose object was replaced as it was cut: %d more bytes, %v; want an error and none of the new object", len(rest), err)
	}
	if err := s.Put(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}

	f.Add(testsvc.Fault{Method: "GET", Path: key, Action: testsvc.Status, Code: http.StatusServiceUnavailable})
	_, err = read()
	if err == nil || !Unreachable(err) || !strings.Contains(err.Error(), "get http://"+f.Endpoint+"/kiln/"+key+": 503 SlowDown: injected by the test") {
		t.Fatalf("a GET answered 503 SlowDown: %v; want it named, as the store not answering", err)
	}
}

// An object replaced between a Get's stat and its GET, before a byte of
// it was read, is read whole in its new version: a store's status.json,
// rewritten at every append, is read by tasks while it changes, and a
// 412 there failed the task that read it. Replaced after its first bytes
// were read, it still fails (above): the two are never spliced.
func TestS3GetOfAnObjectReplacedBeforeItsFirstByteReadsTheNewOne(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	f := srv.Faults(t)
	s := newS3Via(t, srv, f, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const key = "tokens/code/status.json"
	if err := s.Put(ctx, key, strings.NewReader(`{"tokens":1}`), -1); err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, replaces := range []int{1, 3} {
		var versions []string
		rules := make([]*testsvc.Fault, replaces)
		for i := range rules {
			rules[i] = f.Add(testsvc.Fault{Method: "GET", Path: key, Action: testsvc.Hold, Count: 1,
				Release: make(chan struct{}), Held: make(chan struct{})})
		}
		type read struct {
			b   []byte
			err error
		}
		done := make(chan read, 1)
		go func() {
			r, err := s.Get(ctx, key)
			if err != nil {
				done <- read{err: err}
				return
			}
			defer r.Close()
			b, err := io.ReadAll(r)
			done <- read{b, err}
		}()
		// Each held GET asks for the version its stat saw; the object is
		// replaced before the store answers it.
		for i, rule := range rules {
			<-rule.Held
			v := fmt.Sprintf(`{"tokens":%d}`, 100*replaces+i)
			versions = append(versions, v)
			if err := s.Put(ctx, key, strings.NewReader(v), -1); err != nil {
				t.Fatal(err)
			}
			close(rule.Release)
		}
		got := <-done
		if want := versions[len(versions)-1]; got.err != nil || string(got.b) != want {
			t.Fatalf("a get whose object was replaced %d time(s) before its GET was answered: %q, %v; want %q, its newest version", replaces, got.b, got.err, want)
		}
		held += replaces
		if n := f.Acted("GET /kiln/" + key); n != held {
			t.Fatalf("%d GETs held, want %d", n, held)
		}
	}
}
