package store

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// A store whose keys the server stops knowing (rotated or revoked while it
// runs) is told so on a stat, a get and a check, as on every other request:
// versitygw answers a HEAD signed with an access key it does not know with
// a bare 404, which must not read as the object, or the bucket, missing (an
// append would be archived as its shard gone, a plan would find no store).
// A 404 is confirmed by a listing, whose answer names the refusal; an
// object found costs no listing, and a missing one is still ErrNotFound.
func TestS3RefusedKeysAreNotTakenForAMissingObject(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	f := srv.Faults(t)
	// Passes every listing on at once, counting it.
	passed := make(chan struct{})
	close(passed)
	f.Add(testsvc.Fault{Method: http.MethodGet, Query: "list-type=2", Action: testsvc.Hold, Release: passed})
	s := newS3Via(t, srv, f, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const key, missing = "tokens/code/shards/a.tokens", "tokens/code/shards/b.tokens"
	if err := s.Put(ctx, key, strings.NewReader("tokens"), 6); err != nil {
		t.Fatal(err)
	}

	if _, err := s.Stat(ctx, key); err != nil {
		t.Fatalf("stat of %s: %v", key, err)
	}
	if got := readObject(t, s, key); got != "tokens" {
		t.Fatalf("get of %s read %q", key, got)
	}
	if n := f.Acted(""); n != 0 {
		t.Fatalf("a stat and a get of an object there sent %d listings; want none", n)
	}
	for name, op := range map[string]func() error{
		"stat": func() error { _, err := s.Stat(ctx, missing); return err },
		"get":  func() error { _, err := s.Get(ctx, missing); return err },
	} {
		if err := op(); !errors.Is(err, ErrNotFound) || KeysRefused(err) != "" {
			t.Errorf("%s of a missing object with the server's keys: %v; want ErrNotFound", name, err)
		}
	}
	if n := f.Acted(""); n != 2 {
		t.Errorf("a stat and a get of a missing object sent %d listings; want one each", n)
	}

	restartWithKeys(t, srv, "otheraccess", "othersecret0123456789")
	for name, op := range map[string]func() error{
		"stat":  func() error { _, err := s.Stat(ctx, key); return err },
		"get":   func() error { _, err := s.Get(ctx, key); return err },
		"check": func() error { _, err := s.Check(ctx); return err },
		// Answered with a body: no confirming needed, nor taken for the
		// object already gone.
		"list":   func() error { _, err := s.List(ctx, "tokens/"); return err },
		"delete": func() error { return s.Delete(ctx, key) },
	} {
		err := op()
		var se *S3Error
		if KeysRefused(err) != "XAdminUserNotFound" || errors.Is(err, ErrNotFound) || !errors.As(err, &se) || !se.BadInput() ||
			!strings.Contains(err.Error(), "check KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY") {
			t.Errorf("%s once the server no longer knows the store's access key: %v; want its refusal of the keys, not the object missing", name, err)
		}
	}

	// The server's new keys read the same objects: what was refused was
	// the keys alone.
	renewed, err := NewS3(S3Options{Endpoint: f.Endpoint, Bucket: "kiln", AccessKey: "otheraccess", SecretKey: "othersecret0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	if got := readObject(t, renewed, key); got != "tokens" {
		t.Fatalf("get of %s with the new keys read %q", key, got)
	}
	if _, err := renewed.Stat(ctx, missing); !errors.Is(err, ErrNotFound) || KeysRefused(err) != "" {
		t.Errorf("stat of a missing object with the new keys: %v; want ErrNotFound", err)
	}
}

func readObject(t *testing.T, s Store, key string) string {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get of %s: %v", key, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read of %s: %v", key, err)
	}
	return string(b)
}

// restartWithKeys stops srv and starts versitygw again on its port and its
// directory, taking only the keys access and secret: a rotation of the
// server's keys. A store made before it keeps its keys and what it learnt
// of the bucket (its region, asked once), so its next requests go to the
// server as they are, signed with an access key the server does not know.
func restartWithKeys(t *testing.T, srv *testsvc.S3Server, access, secret string) {
	t.Helper()
	srv.Stop()
	srv.StartWithKeys(access, secret)
}
