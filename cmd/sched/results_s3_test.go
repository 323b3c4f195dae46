package main

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
)

// sched's object store tries a request as often as the store's default:
// a throttled GET is sent again after a short back-off, and one the store
// keeps refusing is named in full: the store, the operation, the object
// and the server's status and code.
func TestResultsRideOutThrottling(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	f := srv.Faults(t)
	st, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	const key, summary = "results/pilot/summary.md", "# Run pilot\n"
	if err := st.Put(context.Background(), key, strings.NewReader(summary), int64(len(summary))); err != nil {
		t.Fatal(err)
	}
	env := []string{"KILN_S3_ENDPOINT=" + f.Endpoint, "KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey, "KILN_S3_BUCKET=kiln"}

	f.Add(testsvc.Fault{Method: "GET", Path: key, Action: testsvc.Status, Code: http.StatusServiceUnavailable, Count: 2})
	out, errOut, code := sched(t, env, "results", "pilot")
	if code != 0 || !strings.Contains(out, summary) {
		t.Fatalf("results after two SlowDowns: exit %d\n%s%s", code, out, errOut)
	}
	if n := f.Acted("GET /kiln/" + key); n != 2 {
		t.Fatalf("the proxy answered %d GETs with SlowDown, want 2", n)
	}

	f.Add(testsvc.Fault{Method: "GET", Path: key, Action: testsvc.Status, Code: http.StatusServiceUnavailable})
	_, errOut, code = sched(t, env, "results", "pilot")
	want := "s3 get http://" + f.Endpoint + "/kiln/" + key + ": 503 SlowDown: injected by the test"
	if code != 1 || !strings.Contains(errOut, want) {
		t.Fatalf("results while every GET is throttled: exit %d, %q; want exit 1 and %q", code, errOut, want)
	}
}
