package testsvc

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Each fault acts on the requests its rule matches, as many as its Count,
// and every other request reaches versitygw unchanged.
func TestS3FaultsActOnTheRequestsTheyMatch(t *testing.T) {
	t.Parallel()
	s := S3(t)
	f := s.Faults(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := minio.New(f.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MakeBucket(ctx, "bkt", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte("0123456789"), 100)
	for _, k := range []string{"a/x", "b/x"} {
		if _, err := c.PutObject(ctx, "bkt", k, bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(key string) ([]byte, error) {
		o, err := c.GetObject(ctx, "bkt", key, minio.GetObjectOptions{})
		if err != nil {
			return nil, err
		}
		defer o.Close()
		return io.ReadAll(o)
	}

	f.Add(Fault{Method: "GET", Path: "a/x", Action: Flip, At: 3, Count: 1})
	got, err := get("a/x")
	if err != nil || len(got) != len(body) || got[3] != body[3]^1 || !bytes.Equal(got[4:], body[4:]) {
		t.Fatalf("flipped GET: %q, %v; want the body with byte 3 changed", got, err)
	}
	if got, err := get("a/x"); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("GET after the rule is spent: %q, %v; want the body", got, err)
	}
	if got, err := get("b/x"); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("GET of another key: %q, %v", got, err)
	}

	f.Add(Fault{Method: "GET", Path: "b/x", Action: Truncate, Count: 1})
	if got, err := get("b/x"); err == nil {
		t.Fatalf("truncated GET read %d bytes and no error", len(got))
	}

	f.Add(Fault{Method: "PUT", Path: "a/", Action: Status, Code: http.StatusServiceUnavailable, Count: 1})
	_, err = c.PutObject(ctx, "bkt", "a/y", bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{})
	if code := minio.ToErrorResponse(err).Code; code != "SlowDown" {
		t.Fatalf("PUT under a 503 rule: %v (code %q), want SlowDown", err, code)
	}

	held := f.Add(Fault{Method: "GET", Path: "b/x", Action: Hold, Count: 1})
	done := make(chan error, 1)
	go func() {
		got, err := get("b/x")
		if err == nil && !bytes.Equal(got, body) {
			err = io.ErrUnexpectedEOF
		}
		done <- err
	}()
	<-held.Held
	close(held.Release)
	if err := <-done; err != nil {
		t.Fatalf("held GET once released: %v", err)
	}
	if n := f.Acted("GET /bkt/b/x"); n != 2 {
		t.Fatalf("Acted(GET b/x) = %d, want 2 (the truncation and the hold)", n)
	}

	// An answer held: the server stored the object, and the PUT has not
	// returned until the answer is let through.
	direct, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	answer := f.Add(Fault{Method: "PUT", Path: "a/z", Action: HoldAnswer, Count: 1})
	put := make(chan error, 1)
	go func() {
		_, err := c.PutObject(ctx, "bkt", "a/z", bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{})
		put <- err
	}()
	<-answer.Held
	if info, err := direct.StatObject(ctx, "bkt", "a/z", minio.StatObjectOptions{}); err != nil || info.Size != int64(len(body)) {
		t.Fatalf("object of a PUT whose answer is held: %+v, %v; want it stored", info, err)
	}
	select {
	case err := <-put:
		t.Fatalf("PUT whose answer is held returned: %v", err)
	default:
	}
	close(answer.Release)
	if err := <-put; err != nil {
		t.Fatalf("PUT whose answer is let through: %v", err)
	}
}
