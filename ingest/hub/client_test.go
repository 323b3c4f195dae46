package hub_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

const repo = "owner/data"

func newHub(t *testing.T) *hubtest.Hub {
	t.Helper()
	h := hubtest.New()
	t.Cleanup(h.Close)
	return h
}

func newClient(t *testing.T, h *hubtest.Hub, token string) *hub.Client {
	t.Helper()
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL + "/", Token: token, MaxRetries: 4})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestResolveRevision(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "a.txt", []byte("a"), false)
	c := newClient(t, h, "")
	got, err := c.ResolveRevision(context.Background(), repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	if got != h.Commit {
		t.Fatalf("resolved %q, want %q", got, h.Commit)
	}
	_, err = c.ResolveRevision(context.Background(), repo, "no-such-branch")
	if err == nil || !strings.Contains(err.Error(), "no such revision") {
		t.Fatalf("unknown revision: got %v", err)
	}
	_, err = c.ResolveRevision(context.Background(), "owner/missing", "main")
	if err == nil || !strings.Contains(err.Error(), "owner/missing was not found") || !isBadInput(err) {
		t.Fatalf("unknown dataset: got %v", err)
	}
	_, err = c.ResolveRevision(context.Background(), "../etc", "main")
	if err == nil || !isBadInput(err) {
		t.Fatalf("malformed repo id: got %v", err)
	}
}

func TestListFollowsLinkPagination(t *testing.T) {
	h := newHub(t)
	h.PageSize = 2
	want := []string{"README.md", "data/Go/train-0.parquet", "data/Go/train-1.parquet", "data/Python/train-0.parquet", "other/x.jsonl"}
	for _, p := range want {
		h.Add(repo, p, []byte(p), strings.HasSuffix(p, ".parquet"))
	}
	c := newClient(t, h, "")
	files, err := c.List(context.Background(), repo, "main", "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, f.Path)
		if strings.HasSuffix(f.Path, ".parquet") && (f.LFS == nil || len(f.LFS.OID) != 64) {
			t.Errorf("%s: want an LFS sha256, got %+v", f.Path, f.LFS)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("listed %v, want %v", got, want)
	}
	pages := 0
	for _, r := range h.Requests() {
		if strings.Contains(r.Path, "/tree/") {
			pages++
		}
	}
	if pages < 4 { // 5 files + 4 directories at 2 per page
		t.Fatalf("listing took %d pages; pagination was not followed", pages)
	}

	sub, err := c.List(context.Background(), repo, "main", "data/Go")
	if err != nil {
		t.Fatal(err)
	}
	if len(sub) != 2 || sub[0].Path != "data/Go/train-0.parquet" {
		t.Fatalf("listing data/Go gave %+v", sub)
	}
}

// A listing whose pages link in a loop is refused, saying so, once a
// page's address comes again: it would otherwise never end.
func TestAListingThatLoopsIsRefused(t *testing.T) {
	h := newHub(t)
	h.PageSize = 2
	for _, p := range []string{"a.txt", "b.txt", "c.txt", "d.txt", "e.txt"} {
		h.Add(repo, p, []byte(p), false)
	}
	h.LoopPages = true
	c := newClient(t, h, "")
	_, err := c.List(context.Background(), repo, "main", "")
	if err == nil || !strings.Contains(err.Error(), "is one already read: its listing loops") {
		t.Fatalf("a listing that loops: %v; want it refused", err)
	}
	pages := 0
	for _, r := range h.Requests() {
		if strings.Contains(r.Path, "/tree/") {
			pages++
		}
	}
	// The first page's own address differs from the link back to it: it
	// is read twice, and the second page's link is the one found again.
	if pages != 4 {
		t.Fatalf("a loop of 3 pages read %d pages; want 4", pages)
	}
}

func TestDownloadRedirectsWithoutLeakingToken(t *testing.T) {
	h := newHub(t)
	h.Gated, h.Authorized = true, "secret-token"
	content := randomBytes(t, 100_000)
	h.Add(repo, "data/big.parquet", content, true)
	h.Add(repo, "small.json", []byte(`{"a":1}`), false)
	c := newClient(t, h, "secret-token")
	ctx := context.Background()
	files, err := c.List(ctx, repo, "main", "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range files {
		dst := filepath.Join(dir, filepath.Base(f.Path))
		if err := c.Download(ctx, repo, "main", f, dst); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(filepath.Join(dir, "big.parquet"))
	if !bytes.Equal(got, content) {
		t.Fatal("downloaded LFS content differs")
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "small.json")); string(got) != `{"a":1}` {
		t.Fatalf("small file: %q", got)
	}
	sawCDN := false
	for _, r := range h.Requests() {
		switch r.Host {
		case "cdn":
			sawCDN = true
			if r.Authorization != "" {
				t.Fatalf("the token was sent to the CDN: %+v", r)
			}
		case "hub":
			if r.Authorization != "Bearer secret-token" {
				t.Fatalf("the hub did not get the token: %+v", r)
			}
		}
	}
	if !sawCDN {
		t.Fatalf("the LFS file was not fetched from the CDN: %+v", h.Requests())
	}
}

func TestDownloadResumesWithRange(t *testing.T) {
	h := newHub(t)
	h.BreakOnce = true
	content := randomBytes(t, 300_000)
	h.Add(repo, "data/a.parquet", content, true)
	c := newClient(t, h, "")
	ctx := context.Background()
	dst := downloadWhole(ctx, t, c, content, "resumed download differs from the content")
	ranged := false
	for _, r := range h.Requests() {
		if r.Host == "cdn" && r.Range == fmt.Sprintf("bytes=%d-", len(content)/2) {
			ranged = true
		}
	}
	if !ranged {
		t.Fatalf("no Range request resumed the download from byte %d: %+v", len(content)/2, h.Requests())
	}
	if _, err := os.Stat(dst + ".part"); !os.IsNotExist(err) {
		t.Fatal("the .part file was left behind")
	}
}

func TestDownloadRestartsWhenRangeIgnored(t *testing.T) {
	h := newHub(t)
	h.BreakOnce, h.IgnoreRange = true, true
	content := randomBytes(t, 50_000)
	h.Add(repo, "a.parquet", content, true)
	c := newClient(t, h, "")
	files, err := c.List(context.Background(), repo, "main", "")
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "a")
	if err := c.Download(context.Background(), repo, "main", files[0], dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, content) {
		t.Fatal("content differs after a restart from zero")
	}
}

func TestDownloadRejectsWrongChecksum(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "a.parquet", []byte("the real content"), true)
	c := newClient(t, h, "")
	files, err := c.List(context.Background(), repo, "main", "")
	if err != nil {
		t.Fatal(err)
	}
	f := files[0]
	f.LFS.OID = strings.Repeat("0", 64)
	dst := filepath.Join(t.TempDir(), "a")
	err = c.Download(context.Background(), repo, "main", f, dst)
	if err == nil || !strings.Contains(err.Error(), "sha256 mismatch") {
		t.Fatalf("want a sha256 mismatch, got %v", err)
	}
	for _, p := range []string{dst, dst + ".part"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s was left after a failed verification", p)
		}
	}
	f = files[0]
	f.LFS = nil
	f.Size = 3
	f.OID = ""
	err = c.Download(context.Background(), repo, "main", f, dst)
	if err == nil || !strings.Contains(err.Error(), "got") {
		t.Fatalf("want a size mismatch, got %v", err)
	}
}

func TestGatedDatasetNamesThePage(t *testing.T) {
	h := newHub(t)
	h.Gated, h.Authorized = true, "good"
	h.Add(repo, "a.txt", []byte("a"), false)
	ctx := context.Background()

	_, err := newClient(t, h, "").List(ctx, repo, "main", "")
	if !hub.IsGated(err) || !isBadInput(err) {
		t.Fatalf("no token: want a gated error, got %v", err)
	}
	page := h.Server.URL + "/datasets/" + repo
	if !strings.Contains(err.Error(), page) || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Fatalf("the error should name %s and HF_TOKEN: %v", page, err)
	}

	_, err = newClient(t, h, "other").ResolveRevision(ctx, repo, "main")
	if !hub.IsGated(err) || !strings.Contains(err.Error(), "authorized list") || !strings.Contains(err.Error(), page) {
		t.Fatalf("unauthorized token: want a gated error naming %s, got %v", page, err)
	}
}

// A token the Hub refuses for a reason other than the dataset's gate is
// the user's to fix, asked for once and said in one line that names the
// dataset, HF_TOKEN, what the token lacks and the dataset's page: a
// fine-grained token without the permission to read gated datasets (403,
// without the GatedRepo code), and a revoked one (401, with RepoNotFound
// to a download, which is no word on the dataset).
func TestATokenTheHubRefusesIsTheUsersToFix(t *testing.T) {
	h := newHub(t)
	h.Gated, h.PublicListing, h.Authorized = true, true, "hf_fine"
	h.FineGrained, h.Revoked = "hf_fine", "hf_revoked"
	h.Add(repo, "a.parquet", randomBytes(t, 1000), true)
	ctx := context.Background()
	files, err := newClient(t, h, "").List(ctx, repo, "main", "")
	if err != nil || len(files) != 1 {
		t.Fatalf("the listing of a gated dataset: %v, %v", files, err)
	}
	page, tokens := h.Server.URL+"/datasets/"+repo, h.Server.URL+"/settings/tokens"
	check := func(what string, err error, status int, want ...string) {
		t.Helper()
		var a *hub.AccessError
		if !errors.As(err, &a) || a.Status != status || !isBadInput(err) || hub.IsGated(err) {
			t.Fatalf("%s: %v; want the user's to fix, a %d", what, err, status)
		}
		msg := err.Error()
		for _, w := range append([]string{repo, "HF_TOKEN", page}, want...) {
			if !strings.Contains(msg, w) {
				t.Fatalf("%s says %q; want %q in it", what, msg, w)
			}
		}
		if strings.Contains(msg, "\n") || strings.Contains(msg, "not found") {
			t.Fatalf("%s says %q; want one line, and no word of a dataset not found", what, msg)
		}
	}
	for _, c := range []struct {
		token  string
		status int
		want   []string
	}{
		{"hf_fine", http.StatusForbidden, []string{"403: Please enable access to public gated repositories", `"Read access to contents of all public gated repos you can access"`, tokens}},
		{"hf_revoked", http.StatusUnauthorized, []string{"401: Invalid credentials in Authorization header", "invalid or expired", tokens}},
	} {
		cl := newClient(t, h, c.token)
		before := len(h.Requests())
		err := cl.Download(ctx, repo, "main", files[0], filepath.Join(t.TempDir(), "a.parquet"))
		check("a download with "+c.token, err, c.status, c.want...)
		if n := len(h.Requests()) - before; n != 1 {
			t.Fatalf("a download with %s asked %d times; want once", c.token, n)
		}
	}
	_, err = newClient(t, h, "hf_revoked").List(ctx, repo, "main", "")
	check("a listing with hf_revoked", err, http.StatusUnauthorized, "invalid or expired")
}

// A CDN's 403 is to a signed URL that expired on its way, and says nothing
// of HF_TOKEN: it is no refusal of the user's, and the next attempt,
// which resolves a fresh URL, downloads the file.
func TestACDNRefusalIsNotTheUsersToFix(t *testing.T) {
	h := newHub(t)
	h.CDNForbidden = 1
	content := randomBytes(t, 1000)
	h.Add(repo, "a.parquet", content, true)
	c := newClient(t, h, "hf_token")
	ctx := context.Background()
	files, err := c.List(ctx, repo, "main", "")
	if err != nil || len(files) != 1 {
		t.Fatalf("list: %v, %v", files, err)
	}
	dst := filepath.Join(t.TempDir(), "a.parquet")
	err = c.Download(ctx, repo, "main", files[0], dst)
	var a *hub.AccessError
	if err == nil || isBadInput(err) || errors.As(err, &a) || strings.Contains(err.Error(), "HF_TOKEN") {
		t.Fatalf("the CDN's 403: %v; want an error to try again, not the user's", err)
	}
	if err := c.Download(ctx, repo, "main", files[0], dst); err != nil {
		t.Fatalf("the download after the CDN's 403: %v", err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, content) {
		t.Fatal("the download after the CDN's 403 differs from the content")
	}
}

func TestRateLimitIsWaitedOut(t *testing.T) {
	h := newHub(t)
	h.RateLimited = 3
	h.Add(repo, "a.txt", []byte("a"), false)
	c := newClient(t, h, "")
	start := time.Now()
	sha, err := c.ResolveRevision(context.Background(), repo, "main")
	if err != nil || sha != h.Commit {
		t.Fatalf("after 429s: %q, %v", sha, err)
	}
	n := 0
	for _, r := range h.Requests() {
		if r.Status == http.StatusTooManyRequests {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("saw %d answers of 429, want 3", n)
	}
	if time.Since(start) < 100*time.Millisecond {
		t.Fatal("the client did not wait between rate-limited attempts")
	}

	h.SetRateLimited(100)
	_, err = c.ResolveRevision(context.Background(), repo, "main")
	if err == nil || !strings.Contains(err.Error(), "429") {
		t.Fatalf("endless 429: want an error after the retries, got %v", err)
	}
}

// A Hub that keeps failing is given up on with the cause first, so that a
// listing that cuts the reason to one line keeps it; the URL follows.
func TestServerErrorsAreGivenUpOnCauseFirst(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "data/a.txt", []byte("some text"), false)
	h.SetBeforeResolve(func(context.Context, string, string) error { return errors.New("down for maintenance") })
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL + "/", MaxRetries: 2, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	files, err := c.List(context.Background(), repo, "main", "data")
	if err != nil || len(files) != 1 {
		t.Fatalf("list: %v, %v", files, err)
	}
	err = c.Download(context.Background(), repo, "main", files[0], filepath.Join(t.TempDir(), "a.txt"))
	if err == nil || !strings.Contains(err.Error(), "503 Service Unavailable (given up after 3 attempts at GET ") {
		t.Fatalf("download from a failing Hub: %v; want the 503 before the URL", err)
	}
	// A Hub that answers, if with errors, is reached: no network advice.
	if strings.Contains(err.Error(), "HF_ENDPOINT") {
		t.Fatalf("a Hub that answers 503: %v; want an error without the network advice", err)
	}
}

// A Hub that is not reached at all (nothing listens at its address) is
// given up on saying what to check: the network, or HF_ENDPOINT (one that
// answers with errors is not: TestServerErrorsAreGivenUpOnCauseFirst).
func TestAHubNotReachedSaysToCheckTheNetworkOrHFEndpoint(t *testing.T) {
	addr := refusingAddr(t)
	c, err := hub.New(hub.Config{Endpoint: "http://" + addr, MaxRetries: 1, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.List(context.Background(), repo, "main", "")
	if err == nil || !strings.Contains(err.Error(), addr+" is not reached from here; check this machine's network and proxy, or set HF_ENDPOINT") {
		t.Fatalf("a Hub nothing listens for: %v; want the address and what to check", err)
	}
}

// A download the Hub sends on to a CDN this machine does not reach names
// the CDN, not the Hub, which answered.
func TestACDNNotReachedIsNamedNotTheHub(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "big.bin", []byte("stored in LFS"), true)
	cdn := refusingAddr(t)
	h.CDN.URL = "http://" + cdn
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 1, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	files, err := c.List(context.Background(), repo, "main", "")
	if err != nil || len(files) != 1 {
		t.Fatalf("list: %v, %v", files, err)
	}
	err = c.Download(context.Background(), repo, "main", files[0], filepath.Join(t.TempDir(), "big.bin"))
	if err == nil || !strings.Contains(err.Error(), "the Hub sent the download on to "+cdn+", which is not reached from here") || strings.Contains(err.Error(), "HF_ENDPOINT") {
		t.Fatalf("a CDN nothing listens for: %v; want the CDN named", err)
	}
}

// refusingAddr is a loopback address that refuses every connection: a
// socket bound to it that does not listen holds the port, so that no other
// process can take it while the test runs.
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

func TestContextCancelsRateLimitWait(t *testing.T) {
	h := newHub(t)
	h.RateLimited = 1000
	h.Add(repo, "a.txt", []byte("a"), false)
	c := newClient(t, h, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := c.List(ctx, repo, "main", "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want the context's error, got %v", err)
	}
}

func TestReadRange(t *testing.T) {
	h := newHub(t)
	content := randomBytes(t, 10_000)
	h.Add(repo, "a.parquet", content, true)
	c := newClient(t, h, "")
	got, err := c.ReadRange(context.Background(), repo, "main", "a.parquet", 9_000, 1_000)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content[9_000:]) {
		t.Fatal("range content differs")
	}
}

func TestEnvironment(t *testing.T) {
	t.Setenv("HF_ENDPOINT", "http://mirror.example:8080//")
	t.Setenv("HF_TOKEN", "tok")
	cfg := hub.Environment()
	if cfg.Endpoint != "http://mirror.example:8080" || cfg.Token != "tok" {
		t.Fatalf("environment read as %+v", cfg)
	}
	_, err := hub.New(hub.Config{Endpoint: "mirror.example"})
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "HF_ENDPOINT") {
		t.Fatalf("a bad endpoint: got %v", err)
	}
}

func isBadInput(err error) bool {
	var b interface{ BadInput() bool }
	return errors.As(err, &b) && b.BadInput()
}

// A mirror or proxy at HF_ENDPOINT may echo the request in its refusal,
// the Authorization header included: the token is masked in the error,
// which the worker logs and sched status shows, and the rest of what the
// server said is kept.
func TestARefusalThatEchoesTheTokenDoesNotCarryIt(t *testing.T) {
	const token = "hf_SECRETtoken123"
	for _, header := range []bool{false, true} {
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			said := "echo: " + r.Header.Get("Authorization")
			if header {
				w.Header().Set("X-Error-Message", said)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":%q}`, said)
		}))
		c, err := hub.New(hub.Config{Endpoint: proxy.URL, Token: token, MaxRetries: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.List(context.Background(), repo, "main", "")
		proxy.Close()
		if err == nil || strings.Contains(err.Error(), token) || !strings.Contains(err.Error(), "401: echo: Bearer xxxxx") {
			t.Fatalf("a refusal echoing the token (in X-Error-Message: %v): %v; want it said, the token masked", header, err)
		}
	}
}
