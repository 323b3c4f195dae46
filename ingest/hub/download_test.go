package hub_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// A CDN connection that stays open with nothing on it is given up on, and
// the download resumes with a Range request from the byte it had: the file
// is whole, and the task says why it waited.
func TestDownloadResumesAfterAStall(t *testing.T) {
	h := newHub(t)
	h.StallOnce = true
	content := randomBytes(t, 300_000)
	h.Add(repo, "data/a.parquet", content, true)
	// Short, so that the test waits little; a busy machine that is slower
	// than this between two reads only resumes once more.
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 4, StallTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notes []string
	ctx := hub.WithRetryNotice(context.Background(), func(msg string) {
		mu.Lock()
		notes = append(notes, msg)
		mu.Unlock()
	})
	downloadWhole(ctx, t, c, content, "the download resumed after a stall differs from the content")
	ranged := false
	for _, r := range h.Requests() {
		if r.Host == "cdn" && strings.HasPrefix(r.Range, "bytes=") && r.Range != "bytes=0-" {
			ranged = true
		}
	}
	if !ranged {
		t.Fatalf("no Range request resumed the stalled download: %+v", h.Requests())
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(notes, "\n"), "stalled") {
		t.Fatalf("the task was not told of the stall: %q", notes)
	}
}

// A body that ends before the size the tree lists, with no error (a proxy
// that dropped the Content-Length, then closed the connection), is resumed
// from where it ended, not thrown away and failed.
func TestDownloadResumesABodyThatEndsEarly(t *testing.T) {
	h := newHub(t)
	h.EndEarlyOnce = true
	content := randomBytes(t, 300_000)
	h.Add(repo, "data/a.parquet", content, true)
	c := newClient(t, h, "")
	ctx := context.Background()
	downloadWhole(ctx, t, c, content, "the download resumed after a short body differs from the content")
	ranged := false
	for _, r := range h.Requests() {
		if r.Host == "cdn" && r.Range == fmt.Sprintf("bytes=%d-", len(content)/2) {
			ranged = true
		}
	}
	if !ranged {
		t.Fatalf("no Range request resumed the download from byte %d: %+v", len(content)/2, h.Requests())
	}
}

// A connection cut at the same byte each time is resumed from there while
// the server honours Range; one that ignores Range sends the file from its
// start each time and never gets further, and the download gives up after
// MaxRetries such breaks, naming the file, instead of starting over for good.
func TestDownloadCutEachTimeStopsWhereItGetsNoFurther(t *testing.T) {
	h := newHub(t)
	content := randomBytes(t, 100_000)
	h.Add(repo, "a.parquet", content, true)
	h.CutAfter = 30_000
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 4, MaxWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	files, err := c.List(ctx, repo, "main", "")
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "a.parquet")
	if err := c.Download(ctx, repo, "main", files[0], dst); err != nil {
		t.Fatalf("a download cut every 30000 bytes, resumed with Range: %v", err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, content) {
		t.Fatal("the download resumed at each cut differs from the content")
	}

	h.SetIgnoreRange(true)
	dst = filepath.Join(t.TempDir(), "b.parquet")
	err = c.Download(ctx, repo, "main", files[0], dst)
	if err == nil || !strings.Contains(err.Error(), "a.parquet") || !strings.Contains(err.Error(), "30000") {
		t.Fatalf("a server that ignores Range and cuts each answer at byte 30000: %v; want an error naming the file and the byte", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatalf("a download that gave up left %s", dst)
	}
}

// The Hub answers an anonymous request for a dataset it does not have, or
// holds privately, with 401 RepoNotFound: that says the dataset was not
// found, naming its page, and that a private one needs HF_TOKEN; not only
// that the dataset needs a token, which sent a mistyped name after a
// token. With a token, the 404 says the dataset was not found.
func TestUnknownDatasetSaysNotFoundWithOrWithoutToken(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "a.txt", []byte("a"), false)
	for _, token := range []string{"", "hf_token"} {
		c := newClient(t, h, token)
		_, err := c.List(context.Background(), "owner/mistyped", "main", "")
		var bad interface{ BadInput() bool }
		if err == nil || !errors.As(err, &bad) || !bad.BadInput() {
			t.Fatalf("token %q: an unknown dataset: %v; want bad input", token, err)
		}
		for _, want := range []string{"owner/mistyped was not found", h.Server.URL + "/datasets/owner/mistyped"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("token %q: an unknown dataset says %q; want %q", token, err, want)
			}
		}
		if hint := strings.Contains(err.Error(), "HF_TOKEN"); hint != (token == "") {
			t.Fatalf("token %q: an unknown dataset says %q; HF_TOKEN named: %v", token, err, hint)
		}
	}
}

// A dataset the Hub no longer has when a file listed at a commit is
// downloaded (deleted, renamed or made private since: 404 RepoNotFound to
// a token) is the user's to fix, asked for once and said in one line that
// names the dataset, the commit, what became of it, its page and
// HF_TOKEN; a file alone gone (404 EntryNotFound) is no word on the
// dataset.
func TestADatasetGoneSinceItsListingSaysSo(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "data/a.parquet", randomBytes(t, 1000), true)
	h.Add(repo, "data/b.parquet", randomBytes(t, 1000), false)
	c := newClient(t, h, "hf_token")
	ctx := context.Background()
	commit, err := c.ResolveRevision(ctx, repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	files, err := c.List(ctx, repo, commit, "data")
	if err != nil || len(files) != 2 || files[1].Path != "data/b.parquet" {
		t.Fatalf("the listing: %+v, %v", files, err)
	}
	var gone *hub.RepoNotFoundError
	h.DeleteFile(repo, "data/b.parquet")
	err = c.Download(ctx, repo, commit, files[1], filepath.Join(t.TempDir(), "b.parquet"))
	var nf *hub.NotFoundError
	if !errors.As(err, &nf) || errors.As(err, &gone) || isBadInput(err) {
		t.Fatalf("a file deleted since the listing: %v; want its own 404, no word on the dataset", err)
	}

	h.Delete(repo)
	before := len(h.Requests())
	err = c.Download(ctx, repo, commit, files[0], filepath.Join(t.TempDir(), "a.parquet"))
	if !errors.As(err, &gone) || gone.Repo != repo || !isBadInput(err) {
		t.Fatalf("a dataset deleted since the listing: %v; want the user's to fix", err)
	}
	for _, w := range []string{"downloading data/a.parquet: dataset " + repo + " is no longer found", "(404 RepoNotFound), where commit " + commit + " was planned",
		"deleted, renamed or made private", h.Server.URL + "/datasets/" + repo, "HF_TOKEN"} {
		if !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("a dataset deleted since the listing says %q; want one line with %q", err, w)
		}
	}
	if n := len(h.Requests()) - before; n != 1 {
		t.Fatalf("the download asked %d times; want once", n)
	}
}

// A partial file that an earlier attempt left of another version of the
// file (the ingest planned again at a newer commit, which changed it) does
// not verify once resumed: the file is downloaded again from its start in
// the same call, where the attempt failed on the mismatch and removed it
// for the next attempt to download it all again.
func TestDownloadOfAPartialFileOfAnotherVersionStartsOver(t *testing.T) {
	h := newHub(t)
	old, now := randomBytes(t, 100_000), randomBytes(t, 100_000)
	h.Add(repo, "data/a.parquet", now, true)
	c := newClient(t, h, "")
	ctx := context.Background()
	files, err := c.List(ctx, repo, "main", "data")
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "a.parquet")
	if err := os.WriteFile(dst+".part", old[:60_000], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Download(ctx, repo, "main", files[0], dst); err != nil {
		t.Fatalf("a partial file of another version: %v", err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, now) {
		t.Fatal("the download differs from the file the tree lists")
	}
	if _, err := os.Stat(dst + ".part"); !os.IsNotExist(err) {
		t.Fatal("the .part file was left behind")
	}
}

// A 503 that says when to come back (Retry-After) is waited out that long,
// as a 429 is, and the task says so; not after a backoff that gives up
// before the Hub is back. Once answered, the task is told the wait is
// over.
func TestUnavailableHubIsWaitedOutAsItAsks(t *testing.T) {
	h := newHub(t)
	h.Unavailable, h.RetryAfter = 1, 1
	h.Add(repo, "a.txt", []byte("a"), false)
	c := newClient(t, h, "")
	var notes []string
	ctx := hub.SayRetries(context.Background(), "resolving", func(msg string) { notes = append(notes, msg) })
	if _, err := c.ResolveRevision(ctx, repo, "main"); err != nil {
		t.Fatal(err)
	}
	if len(notes) != 2 || !regexp.MustCompile(`^resolving: .* answered 503 Service Unavailable; trying again in 1s`).MatchString(notes[0]) || notes[1] != "resolving" {
		t.Fatalf("the task was told %q; want one wait of the 1s the Hub asked, then what it does", notes)
	}
}

// downloadWhole lists the test repository's data folder, downloads its
// first file, and fails t with msg unless the bytes are content. It
// returns the downloaded file's path.
func downloadWhole(ctx context.Context, t *testing.T, c *hub.Client, content []byte, msg string) string {
	t.Helper()
	files, err := c.List(ctx, repo, "main", "data")
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "a.parquet")
	if err := c.Download(ctx, repo, "main", files[0], dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, content) {
		t.Fatal(msg)
	}
	return dst
}

// A commit that a force-push replaced after a file was listed at it (404
// RevisionNotFound at the download) is the user's to fix, asked for once,
// typed with the commit so that the plan's other shards can be ended
// before theirs, and said in one line that names the file, the commit and
// that the ingest is to be run again.
func TestACommitGoneSinceItsListingSaysSo(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "data/a.parquet", randomBytes(t, 1000), true)
	c := newClient(t, h, "hf_token")
	ctx := context.Background()
	commit, err := c.ResolveRevision(ctx, repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	files, err := c.List(ctx, repo, commit, "data")
	if err != nil || len(files) != 1 {
		t.Fatalf("the listing: %+v, %v", files, err)
	}
	h.ForcePush()
	before := len(h.Requests())
	err = c.Download(ctx, repo, commit, files[0], filepath.Join(t.TempDir(), "a.parquet"))
	var gone *hub.RevisionNotFoundError
	if !errors.As(err, &gone) || gone.Repo != repo || gone.Commit != commit || !isBadInput(err) {
		t.Fatalf("a commit replaced since the listing: %v; want it named, the user's to fix", err)
	}
	for _, w := range []string{"downloading data/a.parquet: commit " + commit + " of dataset " + repo, "a force-push replaced it", "run the ingest again"} {
		if !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("a commit replaced since the listing says %q; want one line with %q", err, w)
		}
	}
	if n := len(h.Requests()) - before; n != 1 {
		t.Fatalf("the download asked %d times; want once", n)
	}
}
