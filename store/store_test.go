package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

func newS3(t *testing.T, s *testsvc.S3Server, retries int) *S3 {
	st, err := NewS3(S3Options{Endpoint: s.Endpoint, Bucket: "kiln", AccessKey: s.AccessKey, SecretKey: s.SecretKey, PartSize: 5 << 20, MaxRetries: retries})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestStores runs one suite against both implementations.
func TestStores(t *testing.T) {
	t.Parallel()
	stores := map[string]func(t *testing.T) Store{
		"local": func(t *testing.T) Store {
			l, err := NewLocal(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return l
		},
		"s3": func(t *testing.T) Store { return newS3(t, testsvc.S3(t), 0) },
	}
	for name, mk := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testStore(t, mk(t))
		})
	}
}

func testStore(t *testing.T, s Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if got, err := s.List(ctx, ""); err != nil || len(got) != 0 {
		t.Fatalf("empty store lists %v, %v", got, err)
	}
	if _, err := s.Stat(ctx, "results/none"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat of missing key: %v; want ErrNotFound", err)
	}
	if _, err := s.Get(ctx, "results/none"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of missing key: %v; want ErrNotFound", err)
	}
	small := []byte("hello")
	if err := s.Put(ctx, "results/r1/summary.md", bytes.NewReader(small), int64(len(small))); err != nil {
		t.Fatal(err)
	}
	// Unknown size, larger than two parts: the streaming multipart path.
	big := make([]byte, 11<<20+123)
	rand.Read(big)
	if err := s.Put(ctx, "tokens/d/shards/0001.bin", io.MultiReader(bytes.NewReader(big)), -1); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(ctx, "tokens/d/shards/0001.bin")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("round trip of %d bytes: got %d bytes, equal=%v, %v", len(big), len(got), bytes.Equal(got, big), err)
	}
	if fi, err := s.Stat(ctx, "tokens/d/shards/0001.bin"); err != nil || fi.Size != int64(len(big)) {
		t.Fatalf("Stat = %+v, %v", fi, err)
	}
	list, err := s.List(ctx, "tokens/")
	if err != nil || len(list) != 1 || list[0].Key != "tokens/d/shards/0001.bin" {
		t.Fatalf("List(tokens/) = %+v, %v", list, err)
	}
	if all, _ := s.List(ctx, ""); len(all) != 2 || all[0].Key != "results/r1/summary.md" {
		t.Fatalf("List() = %+v", all)
	}
	// A put whose reader fails leaves no object visible.
	err = s.Put(ctx, "results/r1/broken", io.MultiReader(bytes.NewReader(big[:6<<20]), failingReader{}), -1)
	if err == nil {
		t.Fatal("put from a failing reader succeeded")
	}
	if _, err := s.Stat(ctx, "results/r1/broken"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("failed put left an object: %v", err)
	}
	if all, _ := s.List(ctx, "results/"); len(all) != 1 {
		t.Fatalf("failed put visible in List: %+v", all)
	}
	if err := s.Delete(ctx, "results/r1/summary.md"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "results/r1/summary.md"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.Stat(ctx, "results/r1/summary.md"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted object still there: %v", err)
	}
	for _, bad := range []string{"", "/abs", "a/../b", "dir/"} {
		if err := s.Put(ctx, bad, strings.NewReader("x"), 1); err == nil {
			t.Errorf("Put(%q) accepted a bad key", bad)
		}
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("source went away") }

// blockingReader yields n bytes, then blocks until released.
type blockingReader struct {
	r       io.Reader
	reached chan struct{}
	release chan struct{}
	n       int
}

func (b *blockingReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		if b.reached != nil {
			close(b.reached)
			b.reached = nil
		}
		<-b.release
		return b.r.Read(p)
	}
	if len(p) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= n
	return n, err
}

func TestS3UnreachableDuringPut(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	s := newS3(t, srv, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.Put(ctx, "results/first", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 12<<20)
	rand.Read(body)
	br := &blockingReader{r: bytes.NewReader(body), n: 7 << 20, reached: make(chan struct{}), release: make(chan struct{})}
	reached := br.reached // the reader clears it
	errc := make(chan error, 1)
	go func() { errc <- s.Put(ctx, "checkpoints/run/step-0000100/model.safetensors", br, -1) }()
	<-reached // one part is uploaded and the second is being read
	srv.Stop()
	close(br.release)
	err := <-errc
	if err == nil {
		t.Fatal("put succeeded while the server was down")
	}
	msg := err.Error()
	if !strings.Contains(msg, srv.Endpoint) || !strings.Contains(msg, "checkpoints/run/step-0000100/model.safetensors") || strings.Contains(msg, "\n") {
		t.Fatalf("error %q must name the endpoint %s and the object, on one line", msg, srv.Endpoint)
	}
	var se *S3Error
	if !errors.As(err, &se) || se.BadInput() {
		t.Fatalf("an unreachable server is not bad input: %#v", err)
	}
	if !Unreachable(err) {
		t.Errorf("Unreachable(%v) is false for a server that is down", err)
	}
	if _, err := s.List(ctx, "checkpoints/"); !Unreachable(fmt.Errorf("list: %w", err)) {
		t.Errorf("Unreachable of a listing while the server is down (%v) is false", err)
	} else if got := Outage(err); got != "list: connect: connection refused" {
		t.Errorf("Outage of a listing while the server is down: %q; want the operation and the refusal", got)
	}
	cctx, stop := context.WithCancel(ctx)
	stop()
	if _, err := s.List(cctx, "checkpoints/"); err == nil || Unreachable(err) {
		t.Errorf("a cancelled listing's error %v reads as the server unreachable", err)
	}
	srv.Start()
	if _, err := s.Stat(ctx, "checkpoints/run/step-0000100/model.safetensors"); !errors.Is(err, ErrNotFound) || Unreachable(err) {
		t.Fatalf("interrupted put left a visible object, or a missing one reads as the server unreachable: %v", err)
	}
	if err := s.Put(ctx, "checkpoints/run/step-0000100/model.safetensors", bytes.NewReader(body), -1); err != nil {
		t.Fatalf("put after the server came back: %v", err)
	}
	fi, err := s.Stat(ctx, "checkpoints/run/step-0000100/model.safetensors")
	if err != nil || fi.Size != int64(len(body)) {
		t.Fatalf("after retry: %+v, %v", fi, err)
	}
}

// A wrong secret key, and an access key the server does not know (which
// versitygw answers with a 404 of its own code), are the user's to fix,
// named as such: the latter read as the object store not reached, "check
// the endpoint".
func TestS3WrongCredentialsIsBadInput(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	for _, c := range []struct{ what, access, secret string }{
		{"a wrong secret", srv.AccessKey, "wrong-secret"},
		{"an unknown access key", "no-such-key", srv.SecretKey},
	} {
		s, err := NewS3(S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: c.access, SecretKey: c.secret})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for name, op := range map[string]func() error{
			"put":   func() error { return s.Put(ctx, "results/x", strings.NewReader("x"), 1) },
			"check": func() error { _, err := s.Check(ctx); return err },
			"get":   func() error { _, err := s.Get(ctx, "results/x"); return err },
		} {
			err := op()
			var se *S3Error
			if !errors.As(err, &se) || !se.BadInput() || !strings.Contains(err.Error(), "check KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY") || !strings.Contains(err.Error(), srv.Endpoint) {
				t.Errorf("%s with %s: %v; want bad input naming the endpoint and the keys", name, c.what, err)
			}
			if Unreachable(err) || errors.Is(err, ErrNotFound) {
				t.Errorf("%s with %s: %v reads as the server unreachable or the object not found", name, c.what, err)
			}
		}
		if _, err := s.Check(ctx); strings.Contains(fmtErr(err), "wrong-secret") {
			t.Error("error shows the secret")
		}
	}
}

// Check says whether the bucket exists, without creating it: a missing
// bucket is no error (the first put creates it), but the caller learns of
// it, as a mistyped KILN_S3_BUCKET is created the same way.
func TestS3CheckSaysWhetherTheBucketExists(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	s, err := NewS3(S3Options{Endpoint: srv.Endpoint, Bucket: "kiln-typo", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if ok, err := s.Check(ctx); ok || err != nil {
		t.Fatalf("Check before the first put: %v, %v; want false and no error", ok, err)
	}
	if _, err := os.Stat(filepath.Join(srv.Dir, "kiln-typo")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Check created the bucket: %v", err)
	}
	if err := s.Put(ctx, "results/x", strings.NewReader("x"), 1); err != nil {
		t.Fatalf("the first put, which creates the bucket: %v", err)
	}
	if ok, err := s.Check(ctx); !ok || err != nil {
		t.Fatalf("Check after the first put: %v, %v; want true", ok, err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// PutUnsigned sends every request's body as UNSIGNED-PAYLOAD, where Put
// signs it, and the object reads back the same; seen through a proxy in
// front of a real S3 server.
func TestPutUnsignedLeavesTheBodyUnsigned(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := testsvc.S3(t)
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string // X-Amz-Content-Sha256 of each object PUT (parts included)
	proxy := httputil.NewSingleHostReverseProxy(target)
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.Contains(strings.Trim(r.URL.Path, "/"), "/") {
			mu.Lock()
			seen = append(seen, r.Header.Get("X-Amz-Content-Sha256"))
			mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	defer ps.Close()
	s, err := NewS3(S3Options{Endpoint: strings.TrimPrefix(ps.URL, "http://"), Bucket: "kiln", AccessKey: srv.AccessKey,
		SecretKey: srv.SecretKey, PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	local, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 11<<20+5)
	rand.Read(big)
	for _, c := range []struct {
		name     string
		put      func(ctx context.Context, key string, r io.Reader, size int64) error
		size     int64
		wantSign string
	}{
		{"unsigned, known size", func(ctx context.Context, k string, r io.Reader, n int64) error { return PutUnsigned(ctx, s, k, r, n) }, int64(len(big)), "UNSIGNED-PAYLOAD"},
		{"unsigned, unknown size", func(ctx context.Context, k string, r io.Reader, n int64) error { return PutUnsigned(ctx, s, k, r, n) }, -1, "UNSIGNED-PAYLOAD"},
		{"signed", s.Put, -1, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"},
		{"local", func(ctx context.Context, k string, r io.Reader, n int64) error {
			return PutUnsigned(ctx, local, k, r, n)
		}, -1, ""},
	} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		key := "tokens/d/shards/" + strings.ReplaceAll(c.name, " ", "_")
		if err := c.put(ctx, key, bytes.NewReader(big), c.size); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var st Store = s
		if c.name == "local" {
			st = local
		}
		rc, err := st.Get(ctx, key)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, big) {
			t.Fatalf("%s: read back %d of %d bytes, equal=%v, %v", c.name, len(got), len(big), bytes.Equal(got, big), err)
		}
		mu.Lock()
		headers := slices.Clone(seen)
		mu.Unlock()
		if c.wantSign == "" {
			continue
		}
		if len(headers) < 3 { // 11 MiB in 5 MiB parts
			t.Fatalf("%s: %d object PUTs seen through the proxy: %q", c.name, len(headers), headers)
		}
		for _, h := range headers {
			if h != c.wantSign {
				t.Fatalf("%s: PUTs carried X-Amz-Content-Sha256 %q; want %s on every one", c.name, headers, c.wantSign)
			}
		}
	}
}

// The local store keeps no directory that only deleted objects made, as S3
// keeps none: a pruned checkpoint leaves no empty step directory behind.
// A put into a directory that a delete empties at the same moment still
// lands.
func TestLocalDeleteLeavesNoEmptyDirectories(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root := t.TempDir()
	l, err := NewLocal(root)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string) {
		t.Helper()
		if err := l.Put(ctx, key, strings.NewReader("x"), 1); err != nil {
			t.Fatal(err)
		}
	}
	put("checkpoints/r/step-1/a")
	put("checkpoints/r/step-2/b")
	if err := l.Delete(ctx, "checkpoints/r/step-1/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "checkpoints", "r", "step-1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("step-1's directory after its last object went: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "checkpoints", "r", "step-2", "b")); err != nil {
		t.Errorf("step-2's object: %v", err)
	}
	if err := l.Delete(ctx, "checkpoints/r/step-2/b"); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(root); err != nil || len(entries) != 0 {
		t.Errorf("the store's root after every object went: %v %v", entries, err)
	}
	// putDelete puts an object and deletes it, from any goroutine.
	putDelete := func(key string) bool {
		if err := l.Put(ctx, key, strings.NewReader("x"), 1); err != nil {
			t.Errorf("put %s: %v", key, err)
			return false
		}
		if err := l.Delete(ctx, key); err != nil {
			t.Errorf("delete %s: %v", key, err)
			return false
		}
		return true
	}
	// Lists of one prefix while objects come and go under another (their
	// directories made and removed): no list fails, none misses the
	// prefix's objects.
	put("checkpoints/r/step-3/a")
	stop := make(chan struct{})
	var churn sync.WaitGroup
	churn.Add(1)
	go func() {
		defer churn.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if !putDelete(fmt.Sprintf("tokens/s/%d/shard", i%7)) {
				return
			}
		}
	}()
	for range 300 {
		for _, prefix := range []string{"checkpoints/r/", ""} {
			got, err := l.List(ctx, prefix)
			if err != nil || !slices.ContainsFunc(got, func(i Info) bool { return i.Key == "checkpoints/r/step-3/a" }) {
				t.Errorf("list %q while objects come and go elsewhere: %v, %v", prefix, got, err)
				break
			}
		}
	}
	close(stop)
	churn.Wait()
	// Puts and deletes in one directory at once: every put lands.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if !putDelete(fmt.Sprintf("d/e/k%d-%d", w, i)) {
					return
				}
			}
		}()
	}
	wg.Wait()
}

// One rule for every name a person gives kiln (runs, tokenizers, token
// stores): a single directory and object-key element of plain characters.
func TestCheckNameIsOneRuleForEveryName(t *testing.T) {
	for _, ok := range []string{"pilot", "mix-16384", "code_v2.1", "A", "7b-run", "x-", strings.Repeat("a", MaxNameBytes)} {
		if err := CheckName("run", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", ".hidden", "a/b", `a\b`, "my run", "tab\t", "new\nline", "run:1", "caf\u00e9", "a*b", "\x1b[31m",
		// A leading '-' reads as an option in the commands kiln's hints print
		// (mkdir -p .../tokenizers/-x); names start with a letter or digit.
		"-x", "--store", "-", "_x"} {
		err := CheckName("tokenizer", bad)
		if err == nil || !strings.Contains(err.Error(), "tokenizer name") || !strings.Contains(err.Error(), "use letters, digits") ||
			!strings.Contains(err.Error(), "starting with a letter or digit") {
			t.Errorf("%q: %v; want it refused with the rule", bad, err)
		}
	}
	if err := CheckName("token store", strings.Repeat("a", MaxNameBytes+1)); err == nil || !strings.Contains(err.Error(), "at most 100") {
		t.Errorf("a long name: %v", err)
	}
}
