package hub_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// noticesOf is ctx with a retry notice that counts the waits it is told of.
func noticesOf(ctx context.Context, waits *atomic.Int32) context.Context {
	return hub.WithRetryNotice(ctx, func(msg string) {
		if msg != "" {
			waits.Add(1)
		}
	})
}

// Where a person waits (FailUnreached), a Hub that refuses the first
// connection is given up on at once, naming HF_ENDPOINT, as the user's to
// fix: no wait is said, and no second attempt made.
func TestAHubNeverReachedIsGivenUpOnAtOnceWhereAPersonWaits(t *testing.T) {
	addr := refusingAddr(t)
	c, err := hub.New(hub.Config{Endpoint: "http://" + addr, MaxRetries: 1, MaxWait: time.Millisecond, FailUnreached: true})
	if err != nil {
		t.Fatal(err)
	}
	var waits atomic.Int32
	_, err = c.ResolveRevision(noticesOf(context.Background(), &waits), repo, "main")
	want := "connection refused: the Hub at HF_ENDPOINT http://" + addr + " is not reached from here; check this machine's network and proxy, or set HF_ENDPOINT to the Hub's address or a mirror's"
	if err == nil || !strings.Contains(err.Error(), want) || !isBadInput(err) {
		t.Fatalf("a Hub nothing listens for, where a person waits: %v; want bad input saying %q", err, want)
	}
	if n := waits.Load(); n != 0 {
		t.Errorf("a Hub nothing listens for was tried again %d times, where a person waits; want none", n)
	}

	// With HF_ENDPOINT unset, the default is named as such: every
	// connection goes to the refusing address here.
	dial := (&net.Dialer{}).DialContext
	refused := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return dial(ctx, network, addr)
	}}
	c, err = hub.New(hub.Config{HTTPClient: &http.Client{Transport: refused}, MaxRetries: 1, MaxWait: time.Millisecond, FailUnreached: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ResolveRevision(noticesOf(context.Background(), &waits), repo, "main")
	want = "connection refused: the Hub at " + hub.DefaultEndpoint + " (HF_ENDPOINT is unset) is not reached from here; check this machine's network and proxy, or set HF_ENDPOINT to a mirror of the Hub"
	if err == nil || !strings.Contains(err.Error(), want) || !isBadInput(err) || waits.Load() != 0 {
		t.Fatalf("the default Hub, not reached, where a person waits: %v (%d waits); want bad input saying %q at once", err, waits.Load(), want)
	}
}

// A worker's client (FailUnreached off) tries a Hub that refuses its
// connections again, as one that is down or restarting, and its error is
// not the user's to fix: the task is retried in turn.
func TestAHubNeverReachedIsTriedAgainByAWorker(t *testing.T) {
	addr := refusingAddr(t)
	c, err := hub.New(hub.Config{Endpoint: "http://" + addr, MaxRetries: 2, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var waits atomic.Int32
	_, err = c.ResolveRevision(noticesOf(context.Background(), &waits), repo, "main")
	if err == nil || isBadInput(err) || !strings.Contains(err.Error(), "(given up after 3 attempts at GET ") {
		t.Fatalf("a Hub nothing listens for, on a worker: %v; want it given up on after 3 attempts, not as bad input", err)
	}
	if n := waits.Load(); n != 2 {
		t.Errorf("a Hub nothing listens for was tried again %d times on a worker; want 2", n)
	}
}

// Once the Hub has answered, a refused connection is a passing failure
// (the Hub or a mirror restarting, a network that comes back) and is
// tried again, where a person waits too.
func TestAHubThatAnsweredIsTriedAgainWhenItRefuses(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "a.txt", []byte("a"), false)
	refusing := refusingAddr(t)
	var down atomic.Bool
	dial := (&net.Dialer{}).DialContext
	tr := &http.Transport{
		// Each request dials, so that the Hub going down is met at once.
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if down.Load() {
				addr = refusing
			}
			return dial(ctx, network, addr)
		},
	}
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL, HTTPClient: &http.Client{Transport: tr}, MaxRetries: 2, MaxWait: time.Millisecond, FailUnreached: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResolveRevision(context.Background(), repo, "main"); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	var waits atomic.Int32
	_, err = c.List(noticesOf(context.Background(), &waits), repo, "main", "")
	if err == nil || isBadInput(err) || !strings.Contains(err.Error(), "(given up after 3 attempts at GET ") {
		t.Fatalf("a Hub that answered, then refused: %v; want it tried again, not bad input", err)
	}
	if n := waits.Load(); n != 2 {
		t.Errorf("a Hub that answered, then refused, was tried again %d times; want 2", n)
	}
	down.Store(false)
	if _, err := c.List(context.Background(), repo, "main", ""); err != nil {
		t.Fatalf("the Hub back: %v", err)
	}
}

// An HF_ENDPOINT with a path too many (.../api) is answered 404 without
// the Hub's error code: the error names HF_ENDPOINT, as the user's to fix,
// and does not blame the dataset.
func TestAnEndpointThatIsNotTheHubsAPIIsNamed(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "a.txt", []byte("a"), false)
	endpoint := h.Server.URL + "/api"
	c, err := hub.New(hub.Config{Endpoint: endpoint + "/", MaxRetries: 1, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ResolveRevision(context.Background(), repo, "main")
	want := "answered 404 to GET " + endpoint + "/api/datasets/" + repo + "/revision/main, a request of the Hub's API, without the Hub's error code (X-Error-Code) that would name what is missing: HF_ENDPOINT " + endpoint + " may not be the Hub's address or a mirror's; set it to the base URL"
	var nf *hub.NotFoundError
	if err == nil || !strings.Contains(err.Error(), want) || !isBadInput(err) || errors.As(err, &nf) || strings.Contains(err.Error(), "not found in dataset") {
		t.Fatalf("an HF_ENDPOINT with /api: %v; want bad input saying %q", err, want)
	}
	// The same client's listing is answered so too: nothing of the Hub
	// has answered it yet.
	_, err = c.List(context.Background(), repo, "main", "")
	if err == nil || !strings.Contains(err.Error(), "HF_ENDPOINT "+endpoint+" may not be") || !isBadInput(err) {
		t.Fatalf("a listing at an HF_ENDPOINT with /api: %v; want HF_ENDPOINT named", err)
	}
}

// A mirror that passes on no error code is the Hub's API once it has
// answered as one: a directory it then does not find is that directory's
// 404 (a preset's value with no files), and a file's download it does not
// find, even as a client's first request, is that file's.
func TestAMirrorWithoutErrorCodesIsTheHubOnceItAnswered(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "data/a.txt", []byte("a"), false)
	h.Add(repo, "data/b.txt", []byte("b"), false)
	target, _ := url.Parse(h.Server.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(r *http.Response) error {
		r.Header.Del("X-Error-Code")
		r.Header.Del("X-Error-Message")
		return nil
	}
	mirror := httptest.NewServer(proxy)
	t.Cleanup(mirror.Close)
	newMirrorClient := func() *hub.Client {
		c, err := hub.New(hub.Config{Endpoint: mirror.URL, MaxRetries: 1, MaxWait: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	c := newMirrorClient()
	if _, err := c.ResolveRevision(context.Background(), repo, "main"); err != nil {
		t.Fatal(err)
	}
	_, err := c.List(context.Background(), repo, "main", "nosuchdir")
	var nf *hub.NotFoundError
	if !errors.As(err, &nf) || isBadInput(err) {
		t.Fatalf("a missing directory on a mirror that answered: %v; want its own 404", err)
	}

	files, err := c.List(context.Background(), repo, "main", "data")
	if err != nil || len(files) != 2 {
		t.Fatalf("list: %v, %v", files, err)
	}
	h.DeleteFile(repo, files[0].Path)
	err = newMirrorClient().Download(context.Background(), repo, "main", files[0], filepath.Join(t.TempDir(), "a.txt"))
	if !errors.As(err, &nf) || isBadInput(err) {
		t.Fatalf("a deleted file's download, a mirror's first request: %v; want its own 404", err)
	}
}
